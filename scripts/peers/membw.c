/* The memory rates a shared-memory allreduce is bound by on this machine, one core: copying
 * (memcpy) and reducing (float a[i] += b[i]) buffers of BYTES each, best of REPS passes.
 * Usage: membw BYTES REPS. Prints "copy_GBps reduce_GBps", where a byte counts once per byte
 * of the destination (a reduce of S bytes reads 2S and writes S). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s BYTES REPS\n", argv[0]);
        return 2;
    }
    size_t bytes = strtoull(argv[1], 0, 10);
    int reps = atoi(argv[2]);
    size_t n = bytes / sizeof(float);
    float *a = malloc(bytes), *b = malloc(bytes);
    if (!a || !b) return 1;
    for (size_t i = 0; i < n; i++) { a[i] = 1.0f; b[i] = (float)i; }
    double copy = 1e30, red = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        memcpy(a, b, bytes);
        double t1 = now();
        for (size_t i = 0; i < n; i++) a[i] += b[i];
        double t2 = now();
        if (t1 - t0 < copy) copy = t1 - t0;
        if (t2 - t1 < red) red = t2 - t1;
    }
    /* Keep the reduction from being optimised away. */
    if (a[n / 2] == -1.0f) puts("");
    printf("%.3f %.3f\n", bytes / copy / 1e9, bytes / red / 1e9);
    return 0;
}
