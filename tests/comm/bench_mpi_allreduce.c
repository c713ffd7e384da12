/* bench_mpi_allreduce.c — Open MPI's own MPI_Allreduce (f32, sum), timed like bench_comm /
 * `loom bench comm`: for each size from --min to --max bytes (doubling), the time per
 * operation (us, the slowest rank's mean), algbw = size/time and busbw = algbw*2(n-1)/n.
 * The baseline for scripts/bench-comm; run under mpirun:
 *   mpirun -np N bench_mpi_allreduce [--min BYTES] [--max BYTES] [--iters K]
 * What not: not a test, not loom's mpi plugin (which reduces in rank order, see mpi.c).
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int me = 0, n = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    size_t lo = 1024, hi = 64u << 20;
    int iters = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--min") == 0) lo = strtoull(argv[i + 1], NULL, 10);
        else if (strcmp(argv[i], "--max") == 0) hi = strtoull(argv[i + 1], NULL, 10);
        else if (strcmp(argv[i], "--iters") == 0) iters = atoi(argv[i + 1]);
    }
    if (lo < 4) lo = 4;
    float *send = malloc(hi), *recv = malloc(hi);
    if (!send || !recv) MPI_Abort(MPI_COMM_WORLD, 1);
    for (size_t i = 0; i < hi / 4; i++) send[i] = (float)((i * 7 + (size_t)me) % 13) * 0.25f;
    if (me == 0) {
        printf("# Open MPI MPI_Allreduce, %d ranks, f32 sum, time = slowest rank's mean\n", n);
        printf("%12s %12s %10s %8s %8s\n", "size(B)", "count", "time(us)", "algbw", "busbw");
        printf("%12s %12s %10s %8s %8s\n", "", "(elements)", "", "(GB/s)", "(GB/s)");
    }
    for (size_t bytes = lo; bytes <= hi; bytes *= 2) {
        int count = (int)(bytes / 4);
        int k = iters > 0 ? iters : (int)(256.0 * (1 << 20) / (double)bytes);
        if (k < 5) k = 5;
        if (k > 200) k = 200;
        for (int w = 0; w < 3; w++)
            MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int it = 0; it < k; it++)
            MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        double t = (MPI_Wtime() - t0) / k, tmax = 0;
        MPI_Reduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        if (me == 0) {
            double alg = (double)bytes / tmax / 1e9;
            printf("%12zu %12d %10.1f %8.2f %8.2f\n", bytes, count, tmax * 1e6, alg,
                   alg * 2.0 * (n - 1) / n);
            fflush(stdout);
        }
    }
    free(send), free(recv);
    MPI_Finalize();
    return 0;
}
