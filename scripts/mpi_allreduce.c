/* MPI_Allreduce timing with a correctness check (float sum), for comparing ccl with an MPI
 * over the same SoftRoCE device (scripts/bench-rxe.sh --mpi).
 *   mpi_allreduce MIN_BYTES MAX_BYTES ITERS
 * Prints one line per size (doubling): bytes avg_us busbw_MB/s (busbw = algbw x 2(n-1)/n, MB =
 * 1e6 bytes, as nccl-tests and ccl-bench count). Exit status 1 on a wrong result. */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    size_t lo = argc > 1 ? strtoull(argv[1], NULL, 0) : 65536;
    size_t hi = argc > 2 ? strtoull(argv[2], NULL, 0) : (64u << 20);
    int iters = argc > 3 ? atoi(argv[3]) : 5;
    float *in = malloc(hi), *out = malloc(hi);
    int bad = 0;
    for (size_t bytes = lo; bytes <= hi; bytes *= 2) {
        size_t n = bytes / sizeof(float);
        for (size_t i = 0; i < n; i++) in[i] = (float)(rank + 1) + (float)(i % 7);
        MPI_Allreduce(in, out, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int it = 0; it < iters; it++)
            MPI_Allreduce(in, out, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        double dt = (MPI_Wtime() - t0) / iters, maxdt;
        MPI_Reduce(&dt, &maxdt, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        for (size_t i = 0; i < n; i++) {
            float want = (float)(size * (size + 1) / 2) + (float)size * (float)(i % 7);
            if (fabsf(out[i] - want) > 1e-3f) { bad++; break; }
        }
        if (rank == 0)
            printf("%zu %.1f %.2f\n", bytes, maxdt * 1e6, bytes / maxdt / 1e6 * 2.0 * (size - 1) / size);
    }
    int allbad;
    MPI_Allreduce(&bad, &allbad, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0 && allbad) printf("# MPI result check FAILED\n");
    free(in);
    free(out);
    MPI_Finalize();
    return allbad ? 1 : 0;
}
