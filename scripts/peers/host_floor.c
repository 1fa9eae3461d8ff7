/* The floor of a one-shot allreduce in host memory between two processes on two CPUs: what
 * ccl's `shm` algorithm does per call (copy the input into my slot, post a counter, wait for the
 * other's post, reduce both slots into the output; slot halves in turn), with nothing else.
 * The time per call against ccl-bench's shows what the library's own path costs.
 * Usage: host_floor BYTES ITERS MODE
 *   MODE 0: the output is a copy of the other slot, then my slot is reduced into it (SSE)
 *   MODE 1: one pass, out = slot0 + slot1 (SSE, what the baseline x86-64 build vectorizes to)
 *   MODE 2: one pass with AVX2
 *   MODE 3: one pass, scalar (few lines of the other CPU's cache in flight at once)
 *   MODE 4: as 2, but the post is a release store of the count (no locked add), as ccl's is
 *   MODE 5: as 4, with the count stored right after the data (in the line of its last bytes)
 *           and waited for there: ccl's mark for small one-shot operations
 * Build: gcc -O2 -mavx2 -o host_floor host_floor.c. Prints "BYTES MODE us_per_call". */
#define _GNU_SOURCE
#include <immintrin.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SLOT (2 << 20)
typedef struct {
    _Alignas(64) _Atomic unsigned long posted;
    char pad[56];
} flag;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s BYTES ITERS MODE\n", argv[0]);
        return 2;
    }
    size_t bytes = strtoull(argv[1], 0, 10) / 32 * 32;
    int iters = atoi(argv[2]), mode = atoi(argv[3]);
    if (bytes == 0 || bytes > SLOT / 2) return 2;
    char *m = mmap(0, 4096 + 2 * SLOT, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (m == MAP_FAILED) return 1;
    flag *f = (flag *)m;
    char *data = m + 4096;
    int me = fork() == 0;
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(me, &s);
    sched_setaffinity(0, sizeof s, &s);
    size_t n = bytes / 4;
    float *in = aligned_alloc(64, bytes), *out = aligned_alloc(64, bytes);
    for (size_t i = 0; i < n; i++) in[i] = me + 1;
    unsigned long posts = 0;
    double t0 = 0;
    for (int it = -2000; it < iters; it++) {
        if (it == 0) t0 = now();
        size_t h = (posts % 2) * (SLOT / 2);
        float *mine = (float *)(data + me * SLOT + h), *other = (float *)(data + (1 - me) * SLOT + h);
        memcpy(mine, in, bytes);
        /* Mode 5's counters lie right after each rank's data, in its slot's half. */
        _Atomic unsigned long *post = &f[me].posted, *seen = &f[1 - me].posted;
        if (mode == 5) {
            post = (_Atomic unsigned long *)((char *)mine + bytes);
            seen = (_Atomic unsigned long *)((char *)other + bytes);
        }
        posts++;
        if (mode >= 4)
            atomic_store_explicit(post, posts, memory_order_release);
        else
            atomic_fetch_add(post, 1);
        while (atomic_load_explicit(seen, memory_order_acquire) < posts) _mm_pause();
        float *a = me ? other : mine, *b = me ? mine : other;
        if (mode == 0) {
            memcpy(out, other, bytes);
            for (size_t i = 0; i < n; i += 4)
                _mm_storeu_ps(out + i, _mm_add_ps(_mm_loadu_ps(out + i), _mm_loadu_ps(mine + i)));
        } else if (mode == 1) {
            for (size_t i = 0; i < n; i += 4)
                _mm_storeu_ps(out + i, _mm_add_ps(_mm_loadu_ps(a + i), _mm_loadu_ps(b + i)));
        } else if (mode == 2 || mode >= 4) {
            for (size_t i = 0; i < n; i += 8)
                _mm256_storeu_ps(out + i, _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
        } else {
            for (volatile size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
        }
    }
    double t = (now() - t0) / iters;
    if (me == 0) {
        wait(0);
        printf("%zu %d %.3f\n", bytes, mode, t * 1e6);
    }
    return 0;
}
