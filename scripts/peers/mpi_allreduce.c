/* Times MPI_Allreduce (sum, out of place) the way ccl-bench times allreduce: per size,
 * WARMUP untimed calls, a barrier, ITERS timed calls; the time is the maximum over ranks;
 * busbw = bytes / time * 2(n-1)/n with GB = 1e9 bytes. Every size is checked once.
 * Usage: mpi_allreduce MIN_BYTES MAX_BYTES FACTOR ITERS WARMUP [float|bf16]
 * bf16 uses the MPI's own MPIX_BFLOAT16 where its mpi.h has one; otherwise what an MPI user has
 * to write: a commutative MPI_Op over a 2-byte contiguous type that adds in float and rounds to
 * nearest even, as bf16 arithmetic does.
 * Prints one line per size: "bytes time_us busbw_GBps check"; rank 0 also names the library
 * and the bf16 path on stderr, so that a script can tell which MPI it really ran. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static float from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* keep NaN quiet */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

#ifndef MPIX_BFLOAT16
static void bf16_sum(void *in, void *inout, int *len, MPI_Datatype *type) {
    (void)type;
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++) b[i] = to_bf16(from_bf16(a[i]) + from_bf16(b[i]));
}
#endif

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    const char *dtype = argc == 7 ? argv[6] : "float";
    int bf16 = strcmp(dtype, "bf16") == 0;
    if ((argc != 6 && argc != 7) || (!bf16 && strcmp(dtype, "float") != 0)) {
        if (rank == 0) fprintf(stderr, "usage: %s MIN MAX FACTOR ITERS WARMUP [float|bf16]\n", argv[0]);
        MPI_Finalize();
        return 2;
    }
    size_t min = strtoull(argv[1], 0, 10), max = strtoull(argv[2], 0, 10);
    int factor = atoi(argv[3]), iters = atoi(argv[4]), warmup = atoi(argv[5]);
    size_t esize = bf16 ? 2 : 4;
    MPI_Datatype type = MPI_FLOAT;
    MPI_Op op = MPI_SUM;
    const char *how = "MPI_FLOAT";
    if (bf16) {
#ifdef MPIX_BFLOAT16
        type = MPIX_BFLOAT16;
        how = "MPIX_BFLOAT16 + MPI_SUM";
#else
        MPI_Type_contiguous(2, MPI_BYTE, &type);
        MPI_Type_commit(&type);
        MPI_Op_create(bf16_sum, 1, &op);
        how = "user MPI_Op over 2-byte type (float sum, round to nearest even)";
#endif
    }
    if (rank == 0) {
        char lib[MPI_MAX_LIBRARY_VERSION_STRING];
        int len;
        MPI_Get_library_version(lib, &len);
        lib[strcspn(lib, "\n")] = 0;
        fprintf(stderr, "mpi_allreduce: library: %s; %s: %s\n", lib, dtype, how);
    }
    void *send = malloc(max), *recv = malloc(max);
    if (!send || !recv) MPI_Abort(MPI_COMM_WORLD, 1);
    /* Small integers: exact in bf16 too, so every partial sum and the result are exact. */
    float mine = (float)(rank + 1), want = (float)n * (n + 1) / 2;
    for (size_t bytes = min; bytes <= max; bytes *= factor) {
        int count = (int)(bytes / esize);
        for (int i = 0; i < count; i++) {
            if (bf16) ((uint16_t *)send)[i] = to_bf16(mine);
            else ((float *)send)[i] = mine;
        }
        for (int i = 0; i < warmup; i++)
            MPI_Allreduce(send, recv, count, type, op, MPI_COMM_WORLD);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int i = 0; i < iters; i++)
            MPI_Allreduce(send, recv, count, type, op, MPI_COMM_WORLD);
        double t = (MPI_Wtime() - t0) / iters, tmax;
        MPI_Reduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        int ok = 1;
        for (int i = 0; i < count; i++)
            ok &= (bf16 ? from_bf16(((uint16_t *)recv)[i]) : ((float *)recv)[i]) == want;
        int all_ok;
        MPI_Reduce(&ok, &all_ok, 1, MPI_INT, MPI_LAND, 0, MPI_COMM_WORLD);
        if (rank == 0)
            printf("%zu %.3f %.4f %s\n", bytes, tmax * 1e6,
                   tmax > 0 ? bytes / tmax / 1e9 * 2.0 * (n - 1) / n : 0.0, all_ok ? "ok" : "WRONG");
        fflush(stdout);
        if (factor <= 1) break;
    }
    if (op != MPI_SUM) {
        MPI_Op_free(&op);
        MPI_Type_free(&type);
    }
    free(send);
    free(recv);
    MPI_Finalize();
    return 0;
}
