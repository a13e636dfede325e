/* An MPI ping-pong and allreduce with checked results, for crates/roce-cli/tests/mpi.rs (issue #16): Open MPI over
 * PML ucx on rocev2. Built with mpicc by the test.
 *
 *   mpirun -np N pingpong_allreduce [ITERS [SIZE]]
 *
 * Each rank first prints its network namespace and device address (rocev2 run's ROCEV2_IBV_IP), so the test can
 * check where every rank ran.
 * Ping-pong: rank 0 and rank N-1 (in the test, two processes on two hosts) exchange SIZE-byte messages ITERS times;
 * every message carries a pattern derived from (iteration, byte index), the receiver checks every byte and sends
 * back the pattern of the next step. Rank 0 prints the half round-trip time in microseconds.
 * Allreduce: MPI_SUM over MPI_LONG vectors of 1, 100, 4096 and 262144 elements (eager and rendezvous sizes), three
 * rounds each; element i of rank r is r * COUNT + i + round, so every sum is known in closed form and every rank
 * checks every element; then one MPI_DOUBLE (the sum of the ranks' numbers).
 * Rank 0 prints a "pingpong ok=yes|no" and an "allreduce ok=yes|no" line; the exit status is 0 only when every
 * check passed on every rank (an MPI_Allreduce of the failure counts decides). */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static unsigned char pattern(long iter, long i) { return (unsigned char)((iter * 131 + i * 7 + (i >> 8)) & 0xff); }

static long check_bytes(const unsigned char *buf, long size, long iter, int rank, const char *what) {
    for (long i = 0; i < size; i++) {
        if (buf[i] != pattern(iter, i)) {
            fprintf(stderr, "rank %d: %s iteration %ld byte %ld is %u, expected %u\n", rank, what, iter, i, buf[i],
                    pattern(iter, i));
            return 1;
        }
    }
    return 0;
}

static void fill(unsigned char *buf, long size, long iter) {
    for (long i = 0; i < size; i++)
        buf[i] = pattern(iter, i);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    long iters = argc > 1 ? atol(argv[1]) : 1000;
    long msg = argc > 2 ? atol(argv[2]) : 4096;
    char host[MPI_MAX_PROCESSOR_NAME];
    int hostlen;
    MPI_Get_processor_name(host, &hostlen);
    /* Where this rank runs: its network namespace and the device address `rocev2 run` gave it. */
    char netns[64] = "?";
    ssize_t nl = readlink("/proc/self/ns/net", netns, sizeof netns - 1);
    netns[nl > 0 ? nl : 0] = '\0';
    const char *ip = getenv("ROCEV2_IBV_IP");
    printf("rank %d of %d on %s netns %s device address %s\n", rank, size, host, nl > 0 ? netns : "?",
           ip ? ip : "unset");
    fflush(stdout);
    long failures = 0;
    if (size < 2 || iters < 1 || msg < 1) {
        fprintf(stderr, "rank %d: need at least 2 ranks, ITERS >= 1 and SIZE >= 1\n", rank);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }

    /* Ping-pong between rank 0 and the last rank. */
    unsigned char *buf = malloc((size_t)msg);
    if (buf == NULL)
        MPI_Abort(MPI_COMM_WORLD, 2);
    int peer = rank == 0 ? size - 1 : 0;
    double half_rtt_us = 0;
    if (rank == 0 || rank == size - 1) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (long it = 0; it < iters; it++) {
            if (rank == 0) {
                fill(buf, msg, 2 * it);
                MPI_Send(buf, (int)msg, MPI_BYTE, peer, 1, MPI_COMM_WORLD);
                memset(buf, 0, (size_t)msg);
                MPI_Recv(buf, (int)msg, MPI_BYTE, peer, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                failures += check_bytes(buf, msg, 2 * it + 1, rank, "pong");
            } else {
                memset(buf, 0, (size_t)msg);
                MPI_Recv(buf, (int)msg, MPI_BYTE, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                failures += check_bytes(buf, msg, 2 * it, rank, "ping");
                fill(buf, msg, 2 * it + 1);
                MPI_Send(buf, (int)msg, MPI_BYTE, peer, 2, MPI_COMM_WORLD);
            }
        }
        half_rtt_us = (MPI_Wtime() - t0) * 1e6 / (2.0 * (double)iters);
        if (rank == 0)
            printf("pingpong ok=%s ranks 0<->%d iterations %ld size %ld half_rtt_us %.2f\n",
                   failures ? "no" : "yes", peer, iters, msg, half_rtt_us);
    } else {
        MPI_Barrier(MPI_COMM_WORLD);
    }
    free(buf);

    /* Allreduce: eager-sized and rendezvous-sized vectors, a few rounds each. */
    static const long counts[] = {1, 100, 4096, 262144};
    long checked = 0;
    for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
        long n = counts[c];
        long *in = malloc((size_t)n * sizeof(long)), *out = malloc((size_t)n * sizeof(long));
        if (in == NULL || out == NULL)
            MPI_Abort(MPI_COMM_WORLD, 2);
        for (long round = 0; round < 3; round++) {
            for (long i = 0; i < n; i++) {
                in[i] = (long)rank * n + i + round;
                out[i] = -1;
            }
            MPI_Allreduce(in, out, (int)n, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
            /* sum over r of (r*n + i + round) = n*size*(size-1)/2 + size*(i + round) */
            for (long i = 0; i < n; i++) {
                long want = n * (long)size * (size - 1) / 2 + (long)size * (i + round);
                if (out[i] != want) {
                    if (failures < 10)
                        fprintf(stderr, "rank %d: allreduce count %ld round %ld element %ld is %ld, expected %ld\n",
                                rank, n, round, i, out[i], want);
                    failures++;
                }
            }
            checked += n;
        }
        free(in);
        free(out);
    }
    double mine = (double)rank, sum = -1;
    MPI_Allreduce(&mine, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    if (sum != (double)size * (size - 1) / 2) {
        fprintf(stderr, "rank %d: double allreduce %f, expected %f\n", rank, sum, (double)size * (size - 1) / 2);
        failures++;
    }
    printf("rank %d checked %ld allreduce elements, %ld failures\n", rank, checked, failures);
    fflush(stdout);

    long all_failures = -1;
    MPI_Allreduce(&failures, &all_failures, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0)
        printf("allreduce ok=%s ranks %d elements %ld failures %ld\n", all_failures ? "no" : "yes", size, checked,
               all_failures);
    MPI_Finalize();
    return all_failures == 0 ? 0 : 1;
}
