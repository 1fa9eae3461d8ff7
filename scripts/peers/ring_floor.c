/* The floor of a large 2-rank allreduce on plain (private) buffers between two processes on two
 * CPUs: what ccl's ring does over a shared-memory connection (each rank copies the half the
 * other reduces into a ring, reduces the half it owns straight out of the other's ring into its
 * output, then passes that result back the same way), with nothing else: pieces of PIECE bytes,
 * 8 of them in flight each way, one counter per direction and phase. The time per call against
 * ccl-bench's shows what the library's own path costs; the modes are the ways tried to make the
 * hand-over between the CPUs cheaper, and a ninth that uses the kernel instead of a ring.
 * Usage: ring_floor BYTES ITERS PIECE MODE
 *   MODE 0: plain: memcpy into the ring, AVX2 reduce out of it, memcpy of the result out
 *   MODE 1: fused: the reduce writes the result to the output and into the return ring at once
 *   MODE 2: as 0, the producer demotes every line it wrote to the shared cache (CLDEMOTE)
 *   MODE 3: as 0, the producer writes the ring with non-temporal stores
 *   MODE 4: as 0, the producer writes every line back (CLWB), keeping it
 *   MODE 5: as 0, the consumer flushes every line it read (CLFLUSHOPT)
 *   MODE 6: as 0, the consumer demotes every line it read (CLDEMOTE)
 *   MODE 7: cross-memory attach, as Open MPI's vader does: process_vm_readv of the other's input
 *           half into a PIECE-byte scratch, reduced with mine into my output; after a barrier,
 *           process_vm_readv of the other's result half straight into my output
 * Build: gcc -O2 -mavx2 -mcldemote -mclwb -mclflushopt -o ring_floor ring_floor.c
 * (CLDEMOTE is a no-op hint where the CPU lacks it). Prints "BYTES PIECE MODE us_per_call" and
 * checks every element of the result. */
#define _GNU_SOURCE
#include <immintrin.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SLOTS 8
typedef struct {
    _Alignas(128) _Atomic long v;
    char pad[120];
} counter;
/* dir[phase][to]: phase 0 carries inputs to be reduced, phase 1 results; `to` is the consumer. */
typedef struct {
    counter head, tail;
} dir;
typedef struct {
    dir d[2][2];
    counter bar[2];
    float *in[2], *out[2];
    pid_t pid[2];
} shared;

static int mode;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec * 1e-3;
}
static void lines(void *p, size_t bytes, int op) {
    for (char *c = p; c < (char *)p + bytes; c += 64) {
        if (op == 2 || op == 6) _cldemote(c);
        if (op == 4) _mm_clwb(c);
        if (op == 5) _mm_clflushopt(c);
    }
}
static void produce(float *dst, const float *src, size_t n) {
    if (mode == 3) {
        size_t i = 0;
        for (; i + 8 <= n; i += 8) _mm256_stream_ps(dst + i, _mm256_loadu_ps(src + i));
        for (; i < n; i++) dst[i] = src[i];
        _mm_sfence();
    } else {
        memcpy(dst, src, n * 4);
    }
    if (mode == 2 || mode == 4) lines(dst, n * 4, mode);
}
static void consumed(float *slot, size_t n) {
    if (mode == 5 || mode == 6) lines(slot, n * 4, mode);
}
static void reduce(float *o, float *o2, const float *a, const float *b, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i));
        _mm256_storeu_ps(o + i, x);
        if (o2) _mm256_storeu_ps(o2 + i, x);
    }
    for (; i < n; i++) {
        o[i] = a[i] + b[i];
        if (o2) o2[i] = o[i];
    }
}
static long load(counter *c) { return atomic_load_explicit(&c->v, memory_order_acquire); }
static void store(counter *c, long v) { atomic_store_explicit(&c->v, v, memory_order_release); }
static int has_room(dir *d) {
    return atomic_load_explicit(&d->head.v, memory_order_relaxed) - load(&d->tail) < SLOTS;
}
static void barrier(shared *sh, int r, long k) {
    store(&sh->bar[r], k);
    while (load(&sh->bar[1 - r]) < k) {
    }
}
static void readv_exact(pid_t pid, void *dst, const void *src, size_t bytes) {
    struct iovec l = {dst, bytes}, rv = {(void *)src, bytes};
    if (process_vm_readv(pid, &l, 1, &rv, 1, 0) != (ssize_t)bytes) {
        perror("process_vm_readv");
        exit(1);
    }
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s BYTES ITERS PIECE MODE\n", argv[0]);
        return 2;
    }
    size_t n = strtoull(argv[1], 0, 10) / 4, piece = strtoull(argv[3], 0, 10) / 4;
    int iters = atoi(argv[2]);
    mode = atoi(argv[4]);
    if (n < 2 || piece == 0 || iters < 1 || mode < 0 || mode > 7) {
        fprintf(stderr, "ring_floor: BYTES >= 8, PIECE >= 4, ITERS >= 1, MODE 0-7\n");
        return 2;
    }
    size_t slot = piece * 4;
    shared *sh = mmap(0, sizeof(shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    char *rings = mmap(0, 4 * SLOTS * slot, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED || rings == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    memset(rings, 0, 4 * SLOTS * slot);
    pid_t child = fork();
    int r = child != 0 ? 0 : 1, p = 1 - r;
    cpu_set_t cs;
    CPU_ZERO(&cs);
    CPU_SET(r, &cs);
    sched_setaffinity(0, sizeof cs, &cs);
    float *in = aligned_alloc(4096, (n * 4 + 4095) / 4096 * 4096);
    float *out = aligned_alloc(4096, (n * 4 + 4095) / 4096 * 4096);
    float *scratch = aligned_alloc(4096, (slot + 4095) / 4096 * 4096);
    for (size_t i = 0; i < n; i++) in[i] = r + 1 + (i % 7);
    memset(out, 0, n * 4);
    sh->in[r] = in, sh->out[r] = out, sh->pid[r] = getpid();
    long bar = 0;
    barrier(sh, r, ++bar);
    /* Rank 0 owns the first half, rank 1 the second. */
    size_t h = n / 2, mine = r * h, mine_len = r ? n - h : h, theirs = p * h,
           theirs_len = p ? n - h : h;
#define AT(ph, to, k) ((float *)(rings + (((ph) * 2 + (to)) * SLOTS + (k) % SLOTS) * slot))
    long sent[2] = {0, 0}, got[2] = {0, 0};
    double t0 = 0;
    for (int it = 0; it < iters + 3; it++) {
        if (it == 3) t0 = now();
        if (mode == 7) {
            for (size_t o = 0; o < mine_len; o += piece) {
                size_t m = mine_len - o < piece ? mine_len - o : piece;
                readv_exact(sh->pid[p], scratch, sh->in[p] + mine + o, m * 4);
                reduce(out + mine + o, 0, in + mine + o, scratch, m);
            }
            barrier(sh, r, ++bar);
            readv_exact(sh->pid[p], out + theirs, sh->out[p] + theirs, theirs_len * 4);
            barrier(sh, r, ++bar);
            continue;
        }
        size_t nsend = (theirs_len + piece - 1) / piece, nrecv = (mine_len + piece - 1) / piece;
        size_t rs_sent = 0, rs_got = 0, ag_sent = 0, ag_got = 0;
        while (rs_sent < nsend || rs_got < nrecv || ag_got < nsend || ag_sent < nrecv) {
            if (rs_sent < nsend && has_room(&sh->d[0][p])) {
                size_t o = rs_sent * piece, m = theirs_len - o < piece ? theirs_len - o : piece;
                long k = sent[0]++;
                produce(AT(0, p, k), in + theirs + o, m);
                store(&sh->d[0][p].head, k + 1);
                rs_sent++;
            }
            if (rs_got < nrecv && load(&sh->d[0][r].head) > got[0] &&
                (mode != 1 || has_room(&sh->d[1][p]))) {
                size_t o = rs_got * piece, m = mine_len - o < piece ? mine_len - o : piece;
                long k = got[0]++;
                if (mode == 1) {
                    long j = sent[1]++;
                    reduce(out + mine + o, AT(1, p, j), AT(0, r, k), in + mine + o, m);
                    store(&sh->d[1][p].head, j + 1);
                    ag_sent++;
                } else {
                    reduce(out + mine + o, 0, AT(0, r, k), in + mine + o, m);
                }
                consumed(AT(0, r, k), m);
                store(&sh->d[0][r].tail, k + 1);
                rs_got++;
            }
            if (mode != 1 && ag_sent < rs_got && has_room(&sh->d[1][p])) {
                size_t o = ag_sent * piece, m = mine_len - o < piece ? mine_len - o : piece;
                long k = sent[1]++;
                produce(AT(1, p, k), out + mine + o, m);
                store(&sh->d[1][p].head, k + 1);
                ag_sent++;
            }
            if (ag_got < nsend && load(&sh->d[1][r].head) > got[1]) {
                size_t o = ag_got * piece, m = theirs_len - o < piece ? theirs_len - o : piece;
                long k = got[1]++;
                memcpy(out + theirs + o, AT(1, r, k), m * 4);
                consumed(AT(1, r, k), m);
                store(&sh->d[1][r].tail, k + 1);
                ag_got++;
            }
        }
    }
    double t = (now() - t0) / iters;
    for (size_t i = 0; i < n; i++) {
        float want = (1 + i % 7) + (2 + i % 7);
        if (out[i] != want) {
            fprintf(stderr, "rank %d: wrong value at %zu: %f, not %f\n", r, i, out[i], want);
            return 1;
        }
    }
    if (r == 0) {
        int st = 0;
        waitpid(child, &st, 0);
        printf("%zu %zu %d %.1f\n", n * 4, slot, mode, t);
        return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
    }
    return 0;
}
