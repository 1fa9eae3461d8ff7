/* Times MPI_Allreduce (float sum, out of place) the way ccl-bench times allreduce: per size,
 * WARMUP untimed calls, a barrier, ITERS timed calls; the time is the maximum over ranks;
 * busbw = bytes / time * 2(n-1)/n with GB = 1e9 bytes. Every size is checked once.
 * Usage: mpi_allreduce MIN_BYTES MAX_BYTES FACTOR ITERS WARMUP
 * Prints one line per size: "bytes time_us busbw_GBps check". */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    if (argc != 6) {
        if (rank == 0) fprintf(stderr, "usage: %s MIN MAX FACTOR ITERS WARMUP\n", argv[0]);
        MPI_Finalize();
        return 2;
    }
    size_t min = strtoull(argv[1], 0, 10), max = strtoull(argv[2], 0, 10);
    int factor = atoi(argv[3]), iters = atoi(argv[4]), warmup = atoi(argv[5]);
    float *send = malloc(max), *recv = malloc(max);
    if (!send || !recv) MPI_Abort(MPI_COMM_WORLD, 1);
    for (size_t bytes = min; bytes <= max; bytes *= factor) {
        int count = (int)(bytes / sizeof(float));
        for (int i = 0; i < count; i++) send[i] = (float)(rank + 1);
        for (int i = 0; i < warmup; i++)
            MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int i = 0; i < iters; i++)
            MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        double t = (MPI_Wtime() - t0) / iters, tmax;
        MPI_Reduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        int ok = 1;
        float want = (float)n * (n + 1) / 2;
        for (int i = 0; i < count; i++) ok &= recv[i] == want;
        int all_ok;
        MPI_Reduce(&ok, &all_ok, 1, MPI_INT, MPI_LAND, 0, MPI_COMM_WORLD);
        if (rank == 0)
            printf("%zu %.3f %.4f %s\n", bytes, tmax * 1e6,
                   tmax > 0 ? bytes / tmax / 1e9 * 2.0 * (n - 1) / n : 0.0, all_ok ? "ok" : "WRONG");
        fflush(stdout);
        if (factor <= 1) break;
    }
    free(send);
    free(recv);
    MPI_Finalize();
    return 0;
}
