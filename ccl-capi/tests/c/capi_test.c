/*
 * Calls libccl through include/ccl.h, as a C program would.
 *
 *   capi_test procs N     N rank processes (fork): every collective in and out of place for every
 *                         type and operator, groups, non-blocking calls, split, registered
 *                         memory, abort, and every argument error (NULL pointers, bad counts and
 *                         enums, use after destroy, double free, deregistration in flight)
 *   capi_test threads N   N ranks as threads of one process, one communicator each
 *   capi_test abort 2     cclCommAbort from one thread ends a collective blocked on another
 *
 * Exits 0 when every check passed; prints the failed checks and "N passed, N failed".
 * Run with CCL_SOCKET_IFNAME==lo so everything stays on loopback.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ccl.h"

static int g_rank = -1;
static int g_passed, g_failed;

#define CHECK(cond, ...)                                        \
  do {                                                          \
    if (cond) {                                                 \
      g_passed++;                                               \
    } else {                                                    \
      g_failed++;                                               \
      fprintf(stderr, "rank %d: %s:%d: ", g_rank, __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                             \
      fprintf(stderr, "\n");                                    \
    }                                                           \
  } while (0)

#define OK(call)                                                                       \
  do {                                                                                 \
    cclResult_t r_ = (call);                                                           \
    CHECK(r_ == cclSuccess, "%s -> %d (%s)", #call, (int)r_, cclGetLastError(NULL)); \
  } while (0)

/* The call fails with `code` and the thread's last error contains `needle`. */
#define FAILS(call, code, needle)                                                        \
  do {                                                                                   \
    cclResult_t r_ = (call);                                                             \
    const char* m_ = cclGetLastError(NULL);                                              \
    CHECK(r_ == (code) && m_ != NULL && strstr(m_, (needle)) != NULL,                    \
          "%s -> %d, want %d; message \"%s\" should contain \"%s\"", #call, (int)r_,      \
          (int)(code), m_ ? m_ : "(null)", (needle));                                    \
  } while (0)

/* ---- element access for every type ---- */

static size_t tsize(cclDataType_t t) {
  switch (t) {
    case cclInt8: case cclUint8: return 1;
    case cclFloat16: case cclBfloat16: return 2;
    case cclInt32: case cclUint32: case cclFloat32: return 4;
    default: return 8;
  }
}

static uint16_t f2h(float f) { /* exact for the small integers used here */
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000;
  if ((x & 0x7fffffff) == 0) return (uint16_t)sign;
  int32_t e = (int32_t)((x >> 23) & 0xff) - 127 + 15;
  return (uint16_t)(sign | ((uint32_t)e << 10) | ((x & 0x7fffff) >> 13));
}

static float h2f(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, x;
  if (e == 0 && m == 0) x = sign;
  else x = sign | ((e - 15 + 127) << 23) | (m << 13);
  float f;
  memcpy(&f, &x, 4);
  return f;
}

static void put(void* b, cclDataType_t t, size_t i, double v) {
  switch (t) {
    case cclInt8: ((int8_t*)b)[i] = (int8_t)v; break;
    case cclUint8: ((uint8_t*)b)[i] = (uint8_t)v; break;
    case cclInt32: ((int32_t*)b)[i] = (int32_t)v; break;
    case cclUint32: ((uint32_t*)b)[i] = (uint32_t)v; break;
    case cclInt64: ((int64_t*)b)[i] = (int64_t)v; break;
    case cclUint64: ((uint64_t*)b)[i] = (uint64_t)v; break;
    case cclFloat16: ((uint16_t*)b)[i] = f2h((float)v); break;
    case cclFloat32: ((float*)b)[i] = (float)v; break;
    case cclFloat64: ((double*)b)[i] = v; break;
    case cclBfloat16: {
      float f = (float)v;
      uint32_t x;
      memcpy(&x, &f, 4);
      ((uint16_t*)b)[i] = (uint16_t)(x >> 16);
      break;
    }
    default: break;
  }
}

static double get(const void* b, cclDataType_t t, size_t i) {
  switch (t) {
    case cclInt8: return ((const int8_t*)b)[i];
    case cclUint8: return ((const uint8_t*)b)[i];
    case cclInt32: return ((const int32_t*)b)[i];
    case cclUint32: return ((const uint32_t*)b)[i];
    case cclInt64: return (double)((const int64_t*)b)[i];
    case cclUint64: return (double)((const uint64_t*)b)[i];
    case cclFloat16: return h2f(((const uint16_t*)b)[i]);
    case cclFloat32: return ((const float*)b)[i];
    case cclFloat64: return ((const double*)b)[i];
    case cclBfloat16: {
      uint32_t x = (uint32_t)((const uint16_t*)b)[i] << 16;
      float f;
      memcpy(&f, &x, 4);
      return f;
    }
    default: return 0;
  }
}

static int is_float(cclDataType_t t) {
  return t == cclFloat16 || t == cclFloat32 || t == cclFloat64 || t == cclBfloat16;
}

/* Rank r's element i: r + 1 + i % 3 (small, exact in every type). */
static double contrib(int r, size_t i) { return r + 1 + (double)(i % 3); }

static double expect(cclRedOp_t op, cclDataType_t t, int n, size_t i) {
  double acc = contrib(0, i);
  for (int r = 1; r < n; r++) {
    double x = contrib(r, i);
    switch (op) {
      case cclSum: case cclAvg: acc += x; break;
      case cclProd: acc *= x; break;
      case cclMax: acc = x > acc ? x : acc; break;
      case cclMin: acc = x < acc ? x : acc; break;
      case cclBAnd: acc = (double)((long long)acc & (long long)x); break;
      case cclBOr: acc = (double)((long long)acc | (long long)x); break;
      case cclBXor: acc = (double)((long long)acc ^ (long long)x); break;
      default: break;
    }
  }
  if (op == cclAvg) acc = is_float(t) ? acc / n : (double)(long long)(acc / n);
  return acc;
}

static int close_enough(double got, double want, cclDataType_t t) {
  double tol = (t == cclFloat16 || t == cclBfloat16) ? 0.01 : 1e-6;
  double d = got - want;
  if (d < 0) d = -d;
  return d <= tol * (want < 0 ? -want : want);
}

static void fill(void* b, cclDataType_t t, size_t count, int r) {
  for (size_t i = 0; i < count; i++) put(b, t, i, contrib(r, i));
}

/* ---- collectives ---- */

static void test_allreduce(cclComm_t comm, int rank, int n) {
  const size_t count = 1001;
  for (int t = 0; t < cclNumTypes; t++) {
    size_t sz = tsize((cclDataType_t)t);
    char* send = malloc(count * sz);
    char* recv = malloc(count * sz);
    for (int op = 0; op < cclNumOps; op++) {
      int bitwise = op == cclBAnd || op == cclBOr || op == cclBXor;
      if (bitwise && is_float((cclDataType_t)t)) {
        FAILS(cclAllReduce(send, recv, count, (cclDataType_t)t, (cclRedOp_t)op, comm),
              cclInvalidArgument, "integer types only");
        continue;
      }
      for (int inplace = 0; inplace < 2; inplace++) {
        fill(send, (cclDataType_t)t, count, rank);
        memset(recv, 0xee, count * sz);
        const void* s = inplace ? recv : send;
        if (inplace) fill(recv, (cclDataType_t)t, count, rank);
        OK(cclAllReduce(s, recv, count, (cclDataType_t)t, (cclRedOp_t)op, comm));
        size_t bad = 0;
        for (size_t i = 0; i < count; i++) {
          double want = expect((cclRedOp_t)op, (cclDataType_t)t, n, i);
          if (!close_enough(get(recv, (cclDataType_t)t, i), want, (cclDataType_t)t)) bad++;
        }
        CHECK(bad == 0, "allreduce type %d op %d in-place %d: %zu wrong (element 0: %g, want %g)",
              t, op, inplace, bad, get(recv, (cclDataType_t)t, 0),
              expect((cclRedOp_t)op, (cclDataType_t)t, n, 0));
      }
    }
    free(send);
    free(recv);
  }
}

static void test_rooted(cclComm_t comm, int rank, int n) {
  const size_t count = 777;
  float* send = malloc(count * 4);
  float* recv = malloc(count * 4);
  for (int root = 0; root < n; root++) {
    /* Broadcast out of place; non-roots pass a NULL sendbuff. */
    fill(send, cclFloat, count, rank);
    memset(recv, 0, count * 4);
    OK(cclBroadcast(rank == root ? send : NULL, recv, count, cclFloat, root, comm));
    size_t bad = 0;
    for (size_t i = 0; i < count; i++) bad += recv[i] != contrib(root, i);
    CHECK(bad == 0, "broadcast root %d: %zu wrong", root, bad);
    /* In place. */
    fill(recv, cclFloat, count, rank);
    OK(cclBroadcast(recv, recv, count, cclFloat, root, comm));
    bad = 0;
    for (size_t i = 0; i < count; i++) bad += recv[i] != contrib(root, i);
    CHECK(bad == 0, "broadcast in place root %d: %zu wrong", root, bad);

    /* Reduce out of place; non-roots pass a NULL recvbuff. */
    fill(send, cclFloat, count, rank);
    for (size_t i = 0; i < count; i++) recv[i] = -1;
    OK(cclReduce(send, rank == root ? recv : NULL, count, cclFloat, cclSum, root, comm));
    bad = 0;
    for (size_t i = 0; i < count; i++) {
      double want = rank == root ? expect(cclSum, cclFloat, n, i) : -1;
      bad += recv[i] != want;
    }
    CHECK(bad == 0, "reduce root %d: %zu wrong", root, bad);
    /* In place: only the root's buffer changes. */
    fill(recv, cclFloat, count, rank);
    OK(cclReduce(recv, recv, count, cclFloat, cclMax, root, comm));
    bad = 0;
    for (size_t i = 0; i < count; i++) {
      double want = rank == root ? expect(cclMax, cclFloat, n, i) : contrib(rank, i);
      bad += recv[i] != want;
    }
    CHECK(bad == 0, "reduce in place root %d: %zu wrong", root, bad);
  }
  free(send);
  free(recv);
}

static void test_gather_scatter(cclComm_t comm, int rank, int n) {
  const size_t count = 513; /* per rank */
  int64_t* send = malloc(count * n * 8);
  int64_t* recv = malloc(count * n * 8);

  /* Allgather: block r holds rank r's data. */
  for (size_t i = 0; i < count; i++) send[i] = rank * 100000 + (int64_t)i;
  OK(cclAllGather(send, recv, count, cclInt64, comm));
  size_t bad = 0;
  for (int r = 0; r < n; r++)
    for (size_t i = 0; i < count; i++) bad += recv[r * count + i] != r * 100000 + (int64_t)i;
  CHECK(bad == 0, "allgather: %zu wrong", bad);
  /* In place: the input sits at block `rank` of the output. */
  memset(recv, 0, count * n * 8);
  for (size_t i = 0; i < count; i++) recv[rank * count + i] = rank * 100000 + (int64_t)i;
  OK(cclAllGather(recv + rank * count, recv, count, cclInt64, comm));
  bad = 0;
  for (int r = 0; r < n; r++)
    for (size_t i = 0; i < count; i++) bad += recv[r * count + i] != r * 100000 + (int64_t)i;
  CHECK(bad == 0, "allgather in place: %zu wrong", bad);

  /* Reduce-scatter: rank r gets the sum of everyone's block r. Element j of block b on rank q
   * is q + b + j, so the sum is n*(n-1)/2 + n*(b + j). */
  for (int b = 0; b < n; b++)
    for (size_t j = 0; j < count; j++) send[b * count + j] = rank + b + (int64_t)j;
  OK(cclReduceScatter(send, recv, count, cclInt64, cclSum, comm));
  bad = 0;
  for (size_t j = 0; j < count; j++) bad += recv[j] != n * (n - 1) / 2 + n * (rank + (int64_t)j);
  CHECK(bad == 0, "reduce-scatter: %zu wrong", bad);
  /* In place: the result lands at block `rank` of the input. */
  for (int b = 0; b < n; b++)
    for (size_t j = 0; j < count; j++) send[b * count + j] = rank + b + (int64_t)j;
  OK(cclReduceScatter(send, send + rank * count, count, cclInt64, cclSum, comm));
  bad = 0;
  for (size_t j = 0; j < count; j++)
    bad += send[rank * count + j] != n * (n - 1) / 2 + n * (rank + (int64_t)j);
  CHECK(bad == 0, "reduce-scatter in place: %zu wrong", bad);

  /* Alltoall: block k of my send goes to block `rank` of rank k. */
  for (int k = 0; k < n; k++)
    for (size_t j = 0; j < count; j++) send[k * count + j] = rank * 1000000 + k * 1000 + (int64_t)j;
  OK(cclAlltoAll(send, recv, count, cclInt64, comm));
  bad = 0;
  for (int k = 0; k < n; k++)
    for (size_t j = 0; j < count; j++) bad += recv[k * count + j] != k * 1000000 + rank * 1000 + (int64_t)j;
  CHECK(bad == 0, "alltoall: %zu wrong", bad);
  memcpy(recv, send, count * n * 8);
  OK(cclAlltoAll(recv, recv, count, cclInt64, comm));
  bad = 0;
  for (int k = 0; k < n; k++)
    for (size_t j = 0; j < count; j++) bad += recv[k * count + j] != k * 1000000 + rank * 1000 + (int64_t)j;
  CHECK(bad == 0, "alltoall in place: %zu wrong", bad);

  OK(cclBarrier(comm));
  free(send);
  free(recv);
}

/* Gather and scatter at every root, and the collectives with a count per rank: counts with
 * zeros, blocks out of rank order, in place, in a group, non-blocking, bad arguments. */
static void test_vcolls(cclComm_t comm, int rank, int n) {
  const size_t count = 301;
  int32_t* send = malloc(count * n * 4);
  int32_t* recv = malloc(count * n * 4);
  size_t bad;
  for (int root = 0; root < n; root++) {
    /* Gather: non-roots pass a NULL recvbuff. */
    for (size_t i = 0; i < count; i++) send[i] = rank * 1000 + (int32_t)i;
    memset(recv, 0, count * n * 4);
    OK(cclGather(send, rank == root ? recv : NULL, count, cclInt32, root, comm));
    bad = 0;
    if (rank == root)
      for (int r = 0; r < n; r++)
        for (size_t i = 0; i < count; i++) bad += recv[r * count + i] != r * 1000 + (int32_t)i;
    CHECK(bad == 0, "gather root %d: %zu wrong", root, bad);
    /* In place on the root: its input already sits at block `root`. */
    if (rank == root) {
      memset(recv, 0, count * n * 4);
      for (size_t i = 0; i < count; i++) recv[root * count + i] = root * 1000 + (int32_t)i;
      OK(cclGather(recv + root * count, recv, count, cclInt32, root, comm));
      bad = 0;
      for (int r = 0; r < n; r++)
        for (size_t i = 0; i < count; i++) bad += recv[r * count + i] != r * 1000 + (int32_t)i;
      CHECK(bad == 0, "gather in place root %d: %zu wrong", root, bad);
    } else {
      OK(cclGather(send, NULL, count, cclInt32, root, comm));
    }
    /* Scatter: non-roots pass a NULL sendbuff; block k goes to rank k. */
    for (int r = 0; r < n; r++)
      for (size_t i = 0; i < count; i++) send[r * count + i] = root * 7 + r * 1000 + (int32_t)i;
    memset(recv, 0, count * 4);
    OK(cclScatter(rank == root ? send : NULL, recv, count, cclInt32, root, comm));
    bad = 0;
    for (size_t i = 0; i < count; i++) bad += recv[i] != root * 7 + rank * 1000 + (int32_t)i;
    CHECK(bad == 0, "scatter root %d: %zu wrong", root, bad);
  }

  /* Allgatherv: rank k contributes (k % 3) * 2 elements, placed in reverse rank order with a
   * gap of one element that must stay untouched. */
  size_t counts[64] = {0}, displs[64] = {0}, total = 0, off = 1;
  for (int k = 0; k < n; k++) counts[k] = (size_t)(k % 3) * 2;
  for (int k = n - 1; k >= 0; k--) {
    displs[k] = off;
    off += counts[k] + 1;
  }
  for (int k = 0; k < n; k++) total += counts[k];
  for (size_t i = 0; i < counts[rank]; i++) send[i] = rank * 100 + (int32_t)i;
  for (size_t i = 0; i < off; i++) recv[i] = -1;
  OK(cclAllGatherV(send, recv, counts, displs, cclInt32, comm));
  bad = 0;
  for (int k = 0; k < n; k++)
    for (size_t i = 0; i < counts[k]; i++) bad += recv[displs[k] + i] != k * 100 + (int32_t)i;
  bad += recv[0] != -1;
  CHECK(bad == 0, "allgatherv: %zu wrong", bad);
  /* In place, packed (displs NULL), inside a group. */
  size_t mine = 0;
  for (int k = 0; k < rank; k++) mine += counts[k];
  for (size_t i = 0; i < total; i++) recv[i] = -1;
  for (size_t i = 0; i < counts[rank]; i++) recv[mine + i] = rank * 100 + (int32_t)i;
  OK(cclGroupStart());
  OK(cclAllGatherV(recv + mine, recv, counts, NULL, cclInt32, comm));
  OK(cclGroupEnd());
  bad = 0;
  for (int k = 0, o = 0; k < n; o += (int)counts[k], k++)
    for (size_t i = 0; i < counts[k]; i++) bad += recv[o + i] != k * 100 + (int32_t)i;
  CHECK(bad == 0, "allgatherv in place in a group: %zu wrong", bad);

  /* Reduce-scatterv: element j of every rank's input is rank + j; rank r gets counts[r]
   * elements of the sum, starting at `mine`. */
  for (size_t j = 0; j < total; j++) send[j] = rank + (int32_t)j;
  OK(cclReduceScatterV(send, recv, counts, cclInt32, cclSum, comm));
  bad = 0;
  for (size_t i = 0; i < counts[rank]; i++)
    bad += recv[i] != n * (n - 1) / 2 + n * (int32_t)(mine + i);
  CHECK(bad == 0, "reduce-scatterv: %zu wrong", bad);
  OK(cclReduceScatterV(send, send + mine, counts, cclInt32, cclMax, comm));
  bad = 0;
  for (size_t i = 0; i < counts[rank]; i++) bad += send[mine + i] != n - 1 + (int32_t)(mine + i);
  CHECK(bad == 0, "reduce-scatterv in place: %zu wrong", bad);

  /* Alltoallv: rank a sends rank b (a + b) % 3 elements of value a * 100 + b; send blocks in
   * reverse order, receive blocks packed. Non-blocking. */
  size_t sc[64] = {0}, sd[64] = {0}, rc[64] = {0}, so = 0, ro = 0;
  for (int k = n - 1; k >= 0; k--) {
    sc[k] = (size_t)((rank + k) % 3);
    sd[k] = so;
    so += sc[k];
  }
  for (int k = 0; k < n; k++) {
    rc[k] = (size_t)((rank + k) % 3);
    ro += rc[k];
  }
  for (int k = 0; k < n; k++)
    for (size_t i = 0; i < sc[k]; i++) send[sd[k] + i] = rank * 100 + k;
  cclRequest_t req = NULL;
  OK(cclAlltoAllVAsync(send, sc, sd, recv, rc, NULL, cclInt32, comm, &req));
  OK(cclWait(req));
  bad = 0;
  for (int k = 0, o = 0; k < n; o += (int)rc[k], k++)
    for (size_t i = 0; i < rc[k]; i++) bad += recv[o + i] != k * 100 + rank;
  CHECK(bad == 0, "alltoallv: %zu wrong (of %zu)", bad, ro);
  /* In place: the counts are symmetric, so the receive blocks are also the send blocks. */
  for (int k = 0, o = 0; k < n; o += (int)rc[k], k++)
    for (size_t i = 0; i < rc[k]; i++) recv[o + i] = rank * 100 + k;
  OK(cclAlltoAllV(recv, NULL, NULL, recv, rc, NULL, cclInt32, comm));
  bad = 0;
  for (int k = 0, o = 0; k < n; o += (int)rc[k], k++)
    for (size_t i = 0; i < rc[k]; i++) bad += recv[o + i] != k * 100 + rank;
  CHECK(bad == 0, "alltoallv in place: %zu wrong", bad);

  /* Bad arguments name what is wrong and leave the communicator usable. */
  FAILS(cclGather(send, recv, 4, cclInt32, n, comm), cclInvalidArgument, "root");
  FAILS(cclScatter(send, recv, 4, cclInt32, -1, comm), cclInvalidArgument, "root -1");
  FAILS(cclAllGatherV(send, recv, NULL, NULL, cclInt32, comm), cclInvalidArgument,
        "recvcounts is NULL");
  FAILS(cclReduceScatterV(send, recv, counts, cclFloat, cclBAnd, comm), cclInvalidArgument,
        "integer types only");
  FAILS(cclAlltoAllV(send, NULL, NULL, recv, rc, NULL, cclInt32, comm), cclInvalidArgument,
        "sendcounts is NULL");
  if (n > 1) {
    displs[0] = displs[n - 1];
    counts[0] = counts[n - 1] = 2;
    FAILS(cclAllGatherV(send, recv, counts, displs, cclInt32, comm), cclInvalidArgument,
          "overlap");
  }
  OK(cclBarrier(comm));
  free(send);
  free(recv);
}

static void test_p2p_and_groups(cclComm_t comm, int rank, int n) {
  /* Everyone sends 4 MiB right and receives from the left: one exchange in a group. */
  const size_t count = 1 << 20;
  int32_t* out = malloc(count * 4);
  int32_t* in = malloc(count * 4);
  for (size_t i = 0; i < count; i++) out[i] = rank * 7 + (int32_t)(i % 1000);
  int right = (rank + 1) % n, left = (rank + n - 1) % n;
  OK(cclGroupStart());
  OK(cclSend(out, count, cclInt32, right, comm));
  OK(cclRecv(in, count, cclInt32, left, comm));
  OK(cclGroupEnd());
  size_t bad = 0;
  for (size_t i = 0; i < count; i++) bad += in[i] != left * 7 + (int32_t)(i % 1000);
  CHECK(bad == 0, "group send/recv ring: %zu wrong", bad);

  /* Outside a group: rank 0 sends to rank 1. */
  if (n > 1 && rank == 0) OK(cclSend(out, 1000, cclInt32, 1, comm));
  if (n > 1 && rank == 1) {
    OK(cclRecv(in, 1000, cclInt32, 0, comm));
    CHECK(in[999] == 999 % 1000, "send/recv: got %d", in[999]);
  }

  /* From any source: every other rank sends its rank to rank 0, which takes them in the
   * order they come, each once. */
  if (rank != 0) {
    int32_t me = rank;
    OK(cclSend(&me, 1, cclInt32, 0, comm));
  } else {
    int seen = 0;
    for (int k = 1; k < n; k++) {
      int from = -1;
      size_t bytes = 0;
      int32_t got = -1;
      OK(cclProbe(&from, &bytes, comm));
      CHECK(from > 0 && from < n && bytes == 4, "cclProbe: peer %d, %zu bytes", from, bytes);
      if (from <= 0 || from >= n) break;
      OK(cclRecv(&got, 1, cclInt32, from, comm));
      CHECK(got == from, "any source: rank %d sent %d", from, (int)got);
      seen |= 1 << from;
    }
    CHECK(n > 31 || seen == (int)(((1u << n) - 1) & ~1u), "any source: senders seen %#x", seen);
  }
  OK(cclGroupStart());
  FAILS(cclProbe(&left, NULL, comm), cclInvalidUsage, "inside a group");
  OK(cclGroupEnd());
  FAILS(cclProbe(NULL, NULL, comm), cclInvalidArgument, "peer is NULL");

  /* Collectives in a (nested) group run at the outermost end. */
  double a[4], b[4];
  for (int i = 0; i < 4; i++) a[i] = b[i] = rank + 1;
  OK(cclGroupStart());
  OK(cclGroupStart());
  OK(cclAllReduce(a, a, 4, cclDouble, cclSum, comm));
  OK(cclGroupEnd());
  CHECK(a[0] == rank + 1, "allreduce in a group ran before the outermost cclGroupEnd");
  OK(cclAllReduce(b, b, 4, cclDouble, cclMax, comm));
  OK(cclGroupEnd());
  CHECK(a[3] == n * (n + 1) / 2.0 && b[3] == n, "grouped allreduces: %g %g", a[3], b[3]);
  free(out);
  free(in);
}

static void test_nonblocking(cclComm_t comm, int rank, int n) {
  const size_t count = 1 << 18;
  float* x = malloc(count * 4);
  float* g = malloc(count * n * 4);
  for (size_t i = 0; i < count; i++) x[i] = (float)(rank + 1);
  cclRequest_t r1 = NULL, r2 = NULL, r3 = NULL;
  OK(cclAllReduceAsync(x, x, count, cclFloat, cclSum, comm, &r1));
  OK(cclAllGatherAsync(&x[0], g, 1, cclFloat, comm, &r2)); /* issued after r1: sees its result */
  OK(cclBarrierAsync(comm, &r3));
  CHECK(r1 != NULL && r2 != NULL && r3 != NULL, "requests are NULL");
  int done = 0, spins = 0;
  while (!done && spins < 10000000) {
    cclResult_t r = cclTest(r1, &done);
    CHECK(r == cclSuccess, "cclTest -> %d (%s)", (int)r, cclGetLastError(NULL));
    if (r != cclSuccess) break;
    spins++;
  }
  CHECK(done == 1, "cclTest never reported done");
  CHECK(x[count - 1] == n * (n + 1) / 2.0f, "async allreduce: %g", x[count - 1]);
  OK(cclWait(r2));
  for (int r = 0; r < n; r++) CHECK(g[r] == n * (n + 1) / 2.0f, "async allgather[%d] = %g", r, g[r]);
  OK(cclWait(r3));
  /* A finished request is gone. */
  FAILS(cclWait(r1), cclInvalidUsage, "already completed");
  FAILS(cclTest(r2, &done), cclInvalidUsage, "already completed");
  free(x);
  free(g);
}

/* cclMemAlloc/cclCommRegister: collectives on registered memory, and every misuse of it. */
static void test_registration(cclComm_t comm, int rank, int n) {
  const size_t count = 1 << 18, bytes = count * sizeof(float);
  void* mem = NULL;
  void* h = NULL;
  void* h2 = NULL;
  void* h3 = NULL;
  OK(cclMemAlloc(&mem, bytes));
  CHECK(mem != NULL && (uintptr_t)mem % 4096 == 0, "cclMemAlloc gave %p", mem);
  if (mem == NULL) return;
  float* x = mem;
  for (size_t i = 0; i < count; i++) x[i] = (float)(rank + 1);
  OK(cclCommRegister(comm, mem, bytes, &h));
  CHECK(h != NULL, "registration handle is NULL");
  /* Plain memory registers too (NCCL allows any). */
  float* plain = malloc(bytes);
  for (size_t i = 0; i < count; i++) plain[i] = 0.0f;
  OK(cclCommRegister(comm, plain, bytes, &h2));
  OK(cclAllReduce(x, plain, count, cclFloat, cclSum, comm));
  OK(cclAllReduce(x, x, count, cclFloat, cclSum, comm));
  CHECK(x[0] == n * (n + 1) / 2.0f && x[count - 1] == n * (n + 1) / 2.0f, "registered allreduce: %g",
        x[count - 1]);
  CHECK(plain[count - 1] == n * (n + 1) / 2.0f, "into registered malloc memory: %g", plain[count - 1]);

  /* Deregistering memory a pending operation uses fails, and the registration stays. The other
   * ranks join the operation a second after the barrier, so it is still pending on rank 0. */
  OK(cclBarrier(comm));
  cclRequest_t req = NULL;
  if (rank != 0) sleep(1);
  OK(cclAllReduceAsync(x, x, count, cclFloat, cclSum, comm, &req));
  if (rank == 0) {
    int done = 1;
    OK(cclTest(req, &done));
    CHECK(done == 0, "the operation finished before the other ranks joined it");
    FAILS(cclCommDeregister(comm, h), cclInvalidUsage, "in flight");
    /* Freeing registered memory fails too. */
    FAILS(cclMemFree(mem), cclInvalidUsage, "still registered");
  }
  OK(cclWait(req));
  CHECK(x[count - 1] == n * (float)(n * (n + 1) / 2), "allreduce after the refused deregister: %g",
        x[count - 1]);

  /* Handles: foreign, NULL, another communicator's kind, twice. */
  FAILS(cclCommDeregister(comm, NULL), cclInvalidArgument, "NULL");
  FAILS(cclCommDeregister(comm, (void*)(uintptr_t)0x4242), cclInvalidArgument, "never made");
  FAILS(cclCommDeregister(comm, (void*)comm), cclInvalidArgument, "communicator handle");
  FAILS(cclCommRegister(comm, NULL, 64, &h3), cclInvalidArgument, "buff is NULL");
  FAILS(cclCommRegister(comm, mem, 0, &h3), cclInvalidArgument, "size is 0");
  FAILS(cclCommRegister(comm, mem, 64, NULL), cclInvalidArgument, "handle is NULL");
  FAILS(cclMemAlloc(NULL, 64), cclInvalidArgument, "ptr is NULL");
  FAILS(cclMemAlloc(&h3, 0), cclInvalidArgument, "size is 0");
  OK(cclCommDeregister(comm, h));
  FAILS(cclCommDeregister(comm, h), cclInvalidUsage, "deregistered");

  /* Frees: foreign pointers and double frees. No rank allocates between the barriers, so a freed
   * address cannot be handed out again (to another thread in threads mode) meanwhile. */
  OK(cclBarrier(comm));
  FAILS(cclMemFree(NULL), cclInvalidArgument, "NULL");
  FAILS(cclMemFree(plain), cclInvalidArgument, "not allocated by cclMemAlloc");
  FAILS(cclMemFree((char*)mem + 64), cclInvalidArgument, "inside the allocation");
  OK(cclMemFree(mem));
  FAILS(cclMemFree(mem), cclInvalidUsage, "already freed");
  OK(cclBarrier(comm));
  OK(cclCommDeregister(comm, h2));
  free(plain);
}

/* cclCommMemAlloc: memory registered with comm (from its shared arena on one host, where an
 * allreduce on it reads every rank's buffer in place), odd counts, in and out of place. */
static void test_comm_mem(cclComm_t comm, int rank, int n) {
  const size_t count = (1 << 20) + 3, bytes = count * sizeof(float);
  void* a = NULL;
  void* b = NULL;
  OK(cclCommMemAlloc(comm, &a, bytes));
  OK(cclCommMemAlloc(comm, &b, bytes));
  if (a == NULL || b == NULL) return;
  CHECK((uintptr_t)a % 4096 == 0, "cclCommMemAlloc gave %p", a);
  float* x = a;
  float* y = b;
  CHECK(x[count - 1] == 0.0f, "cclCommMemAlloc memory is not zeroed");
  for (size_t i = 0; i < count; i++) x[i] = (float)(rank + 1 + (int)(i % 3));
  OK(cclAllReduce(x, y, count, cclFloat, cclSum, comm));
  OK(cclAllReduce(x, x, count, cclFloat, cclMax, comm));
  float sum = n * (n + 1) / 2.0f;
  CHECK(y[0] == sum && y[count - 1] == sum + n * (float)((count - 1) % 3), "shared allreduce: %g",
        y[count - 1]);
  CHECK(x[1] == (float)(n + 1), "shared in-place max: %g", x[1]);
  FAILS(cclCommMemAlloc(comm, NULL, 64), cclInvalidArgument, "ptr is NULL");
  FAILS(cclCommMemAlloc(comm, &a, 0), cclInvalidArgument, "size is 0");
  OK(cclBarrier(comm));
  OK(cclMemFree(x));
  OK(cclMemFree(y));
  FAILS(cclMemFree(y), cclInvalidUsage, "already freed");
  OK(cclBarrier(comm));
}

static void test_split(cclComm_t comm, int rank, int n) {
  /* Even and odd ranks, in reverse order by key; the last rank of 3+ joins nothing. */
  int color = (n > 2 && rank == n - 1) ? CCL_SPLIT_NOCOLOR : rank % 2;
  cclComm_t sub = (cclComm_t)0x1;
  OK(cclCommSplit(comm, color, -rank, &sub, NULL));
  if (color == CCL_SPLIT_NOCOLOR) {
    CHECK(sub == NULL, "CCL_SPLIT_NOCOLOR gave a communicator");
    return;
  }
  int members = 0, my_pos = 0;
  for (int r = 0; r < n; r++) {
    int c = (n > 2 && r == n - 1) ? -1 : r % 2;
    if (c == color) {
      members++;
      if (r > rank) my_pos++; /* key -r: higher ranks first */
    }
  }
  int cnt = -1, me = -1;
  OK(cclCommCount(sub, &cnt));
  OK(cclCommUserRank(sub, &me));
  CHECK(cnt == members && me == my_pos, "split: count %d rank %d, want %d %d", cnt, me, members,
        my_pos);
  int v = rank, sum = 0;
  OK(cclAllReduce(&v, &sum, 1, cclInt, cclSum, sub));
  int want = 0;
  for (int r = 0; r < n; r++)
    if (!(n > 2 && r == n - 1) && r % 2 == color) want += r;
  CHECK(sum == want, "split allreduce: %d, want %d", sum, want);
  OK(cclCommDestroy(sub));
}

/* ---- argument errors: none may crash, each names what was wrong ---- */

static void test_errors(cclComm_t comm, int rank, int n) {
  float buf[64] = {0}, buf2[64] = {0};
  int v = 0;
  cclComm_t forged = (cclComm_t)(uintptr_t)0x1234;
  cclResult_t res;

  CHECK(strcmp(cclGetErrorString(cclSuccess), "no error") == 0, "error string of success");
  CHECK(strstr(cclGetErrorString((cclResult_t)12345), "unknown") != NULL, "unknown code");
  for (int c = 0; c < cclNumResults; c++) CHECK(cclGetErrorString((cclResult_t)c) != NULL, "NULL string");
  CHECK(cclGetLastError(NULL) != NULL && cclGetLastError(forged) != NULL, "cclGetLastError NULL");

  FAILS(cclGetVersion(NULL), cclInvalidArgument, "version is NULL");
  FAILS(cclGetUniqueId(NULL), cclInvalidArgument, "uniqueId is NULL");
  FAILS(cclCommCount(comm, NULL), cclInvalidArgument, "count is NULL");
  FAILS(cclCommUserRank(comm, NULL), cclInvalidArgument, "rank is NULL");
  FAILS(cclCommGetAsyncError(comm, NULL), cclInvalidArgument, "asyncError is NULL");
  FAILS(cclCommCount(NULL, &v), cclInvalidArgument, "NULL");
  FAILS(cclCommCount(forged, &v), cclInvalidArgument, "never made");
  FAILS(cclAllReduce(buf, buf2, 4, cclFloat, cclSum, NULL), cclInvalidArgument, "NULL");
  FAILS(cclAllReduce(buf, buf2, 4, cclFloat, cclSum, forged), cclInvalidArgument, "never made");
  FAILS(cclCommDestroy(forged), cclInvalidArgument, "never made");

  cclUniqueId zero;
  memset(&zero, 0, sizeof zero);
  cclComm_t c2;
  FAILS(cclCommInitRank(NULL, 2, zero, 0), cclInvalidArgument, "comm is NULL");
  FAILS(cclCommInitRank(&c2, 0, zero, 0), cclInvalidArgument, "nranks is 0");
  FAILS(cclCommInitRank(&c2, 2, zero, 2), cclInvalidArgument, "rank 2 is out of range");
  FAILS(cclCommInitRank(&c2, 2, zero, -1), cclInvalidArgument, "rank -1");
  FAILS(cclCommInitRank(&c2, 2, zero, 0), cclInvalidArgument, "malformed unique id");
  FAILS(cclCommInitFromEnv(NULL), cclInvalidArgument, "comm is NULL");
  cclConfig_t cfg = CCL_CONFIG_INITIALIZER;
  CHECK(cfg.size == sizeof(cclConfig_t) && cfg.timeoutMs == CCL_CONFIG_UNDEF_INT, "initializer");
  cfg.timeoutMs = 0;
  FAILS(cclCommInitRankConfig(&c2, 1, zero, 0, &cfg), cclInvalidArgument, "timeoutMs is 0");
  cfg.timeoutMs = 1000;
  cfg.magic = 7;
  FAILS(cclCommInitRankConfig(&c2, 1, zero, 0, &cfg), cclInvalidArgument, "CCL_CONFIG_INITIALIZER");
  cfg.magic = CCL_CONFIG_MAGIC;
  cfg.size = 3;
  FAILS(cclCommInitRankConfig(&c2, 1, zero, 0, &cfg), cclInvalidArgument, "config->size is 3");
  cfg.size = sizeof(cclConfig_t);
  FAILS(cclCommInitRankConfig(&c2, 1, zero, 0, &cfg), cclInvalidArgument, "malformed unique id");
  FAILS(cclCommInitRankConfig(NULL, 1, zero, 0, &cfg), cclInvalidArgument, "comm is NULL");

  /* Bad enums, counts, roots, peers, buffers. */
  FAILS(cclAllReduce(buf, buf2, 4, (cclDataType_t)42, cclSum, comm), cclInvalidArgument, "datatype 42");
  FAILS(cclAllReduce(buf, buf2, 4, (cclDataType_t)-3, cclSum, comm), cclInvalidArgument, "datatype -3");
  FAILS(cclAllReduce(buf, buf2, 4, cclFloat, (cclRedOp_t)99, comm), cclInvalidArgument, "op 99");
  FAILS(cclReduceScatter(buf, buf2, 1, cclFloat, (cclRedOp_t)-1, comm), cclInvalidArgument, "op -1");
  FAILS(cclAllReduce(NULL, buf2, 4, cclFloat, cclSum, comm), cclInvalidArgument, "sendbuff is NULL");
  FAILS(cclAllReduce(buf, NULL, 4, cclFloat, cclSum, comm), cclInvalidArgument, "recvbuff is NULL");
  FAILS(cclAllReduce(NULL, NULL, 4, cclFloat, cclSum, comm), cclInvalidArgument,
        "sendbuff and recvbuff are NULL");
  FAILS(cclReduce(NULL, NULL, 4, cclFloat, cclSum, 0, comm), cclInvalidArgument, "are NULL");
  FAILS(cclAllReduce(buf, buf2, SIZE_MAX, cclFloat, cclSum, comm), cclInvalidArgument, "larger than any buffer");
  if (n > 1) FAILS(cclAllGather(buf, buf2, SIZE_MAX / 2 + 1, cclInt8, comm), cclInvalidArgument, "overflow");
  FAILS(cclAllReduce((void*)(uintptr_t)(UINTPTR_MAX - 8), buf2, 4, cclFloat, cclSum, comm),
        cclInvalidArgument, "end of the address space");
  FAILS(cclBroadcast(buf, buf2, 4, cclFloat, n, comm), cclInvalidArgument, "root");
  FAILS(cclReduce(buf, buf2, 4, cclFloat, cclSum, -1, comm), cclInvalidArgument, "root -1");
  FAILS(cclSend(buf, 4, cclFloat, n, comm), cclInvalidArgument, "peer");
  FAILS(cclRecv(buf, 4, cclFloat, -2, comm), cclInvalidArgument, "peer -2");
  FAILS(cclRecv(NULL, 4, cclFloat, 0, comm), cclInvalidArgument, "recvbuff is NULL");
  FAILS(cclSend(buf, 4, (cclDataType_t)10, 0, comm), cclInvalidArgument, "datatype 10");
  /* Overlaps other than NCCL's in-place forms. */
  FAILS(cclAllReduce(buf, buf + 1, 8, cclFloat, cclSum, comm), cclInvalidArgument, "overlap");
  if (n > 1) {
    FAILS(cclAllGather(buf + ((rank + 1) % n) * 2, buf, 2, cclFloat, comm), cclInvalidArgument,
          "in-place form");
    FAILS(cclReduceScatter(buf, buf + ((rank + 1) % n) * 2, 2, cclFloat, cclSum, comm),
          cclInvalidArgument, "recvbuff == sendbuff + rank");
  }
  /* Split, groups, requests. */
  cclComm_t sub;
  FAILS(cclCommSplit(comm, 0, 0, NULL, NULL), cclInvalidArgument, "newcomm is NULL");
  FAILS(cclCommSplit(comm, -5, 0, &sub, NULL), cclInvalidArgument, "color -5");
  FAILS(cclCommSplit(comm, 0, 0, &sub, (cclConfig_t*)buf), cclInvalidArgument, "config must be NULL");
  /* Revoke, shrink and grow: argument checks before anything happens. */
  int ex[2] = {n + 3, -1};
  FAILS(cclCommRevoke(comm, 1), cclInvalidArgument, "revokeFlags is 1");
  FAILS(cclCommShrink(comm, ex, 1, NULL, NULL, 0), cclInvalidArgument, "newcomm is NULL");
  FAILS(cclCommShrink(comm, ex, -1, &sub, NULL, 0), cclInvalidArgument, "excludeRanksCount is -1");
  FAILS(cclCommShrink(comm, NULL, 1, &sub, NULL, 0), cclInvalidArgument, "excludeRanksList is NULL");
  FAILS(cclCommShrink(comm, ex + 1, 1, &sub, NULL, 0), cclInvalidArgument, "holds rank -1");
  FAILS(cclCommShrink(comm, ex, 1, &sub, NULL, 0), cclInvalidArgument, "not a rank of this communicator");
  FAILS(cclCommShrink(comm, &rank, 1, &sub, NULL, 0), cclInvalidArgument, "excludes itself");
  FAILS(cclCommShrink(comm, NULL, 0, &sub, NULL, 2), cclInvalidArgument, "shrinkFlags is 2");
  FAILS(cclCommGrow(comm, n + 1, NULL, -1, &sub, NULL), cclInvalidArgument, "uniqueId is NULL");
  FAILS(cclCommGrow(comm, n + 1, &zero, 5, &sub, NULL), cclInvalidArgument, "pass -1");
  int failed[4], nfailed = -1;
  OK(cclCommGetFailedRanks(comm, failed, 4, &nfailed));
  CHECK(nfailed == 0, "%d failed ranks in a healthy job", nfailed);
  FAILS(cclCommGetFailedRanks(comm, NULL, 4, &nfailed), cclInvalidArgument, "ranks is NULL");
  FAILS(cclGroupEnd(), cclInvalidUsage, "without a matching cclGroupStart");
  cclRequest_t req = (cclRequest_t)0x1;
  OK(cclGroupStart());
  FAILS(cclAllReduceAsync(buf, buf, 4, cclFloat, cclSum, comm, &req), cclInvalidUsage, "group");
  CHECK(req == NULL, "a failed call left *request set");
  OK(cclGroupEnd()); /* empty */
  FAILS(cclAllReduceAsync(buf, buf, 4, cclFloat, cclSum, comm, NULL), cclInvalidArgument, "request is NULL");
  FAILS(cclWait(NULL), cclInvalidArgument, "NULL");
  FAILS(cclWait((cclRequest_t)comm), cclInvalidArgument, "communicator handle, not a request");
  FAILS(cclCommCount((cclComm_t)(uintptr_t)0xcc1e0000000001ull, &v), cclInvalidArgument,
        "request handle, not a communicator");
  FAILS(cclTest(NULL, &v), cclInvalidArgument, "NULL");
  FAILS(cclTest((cclRequest_t)(uintptr_t)0xdead, NULL), cclInvalidArgument, "done is NULL");

  /* Count 0 is a no-op that needs no buffers. */
  OK(cclAllReduce(NULL, NULL, 0, cclFloat, cclSum, comm));
  OK(cclAllGather(NULL, NULL, 0, cclFloat, comm));

  /* Argument errors do not fail the communicator. */
  res = (cclResult_t)-1;
  OK(cclCommGetAsyncError(comm, &res));
  CHECK(res == cclSuccess, "async error after argument errors: %d", (int)res);
  for (int i = 0; i < 4; i++) buf[i] = 1;
  OK(cclAllReduce(buf, buf2, 4, cclFloat, cclSum, comm));
  CHECK(buf2[0] == n, "allreduce after argument errors: %g", buf2[0]);
}

/* Every rank but the last allreduces on a communicator the last rank aborts: they fail with a
 * readable error instead of hanging, and the communicator reports it. */
static void test_abort(cclComm_t comm, int rank, int n) {
  if (n < 2) return;
  cclComm_t c2 = NULL;
  OK(cclCommSplit(comm, 0, rank, &c2, NULL));
  if (rank == n - 1) {
    OK(cclCommAbort(c2));
    FAILS(cclBarrier(c2), cclInvalidUsage, "destroyed");
  } else {
    float x[16] = {0};
    cclResult_t r = cclAllReduce(x, x, 16, cclFloat, cclSum, c2);
    const char* m = cclGetLastError(NULL);
    CHECK(r == cclRemoteError || r == cclSystemError || r == cclTimeout,
          "allreduce with an aborted peer -> %d (%s)", (int)r, m);
    CHECK(strstr(m, "cclAllReduce") != NULL && strstr(m, "peer") != NULL,
          "message should name the call and the peer: %s", m);
    cclResult_t a = cclSuccess;
    OK(cclCommGetAsyncError(c2, &a));
    CHECK(a == r, "async error %d, call returned %d", (int)a, (int)r);
    FAILS(cclBarrier(c2), r, "");
    OK(cclCommDestroy(c2));
  }
  OK(cclBarrier(comm)); /* the parent communicator is unaffected */
}

static void test_destroy(cclComm_t comm) {
  float x[4] = {0};
  int v;
  OK(cclCommDestroy(comm));
  FAILS(cclAllReduce(x, x, 4, cclFloat, cclSum, comm), cclInvalidUsage, "was destroyed");
  FAILS(cclCommCount(comm, &v), cclInvalidUsage, "was destroyed");
  FAILS(cclCommDestroy(comm), cclInvalidUsage, "was destroyed");
  FAILS(cclCommAbort(comm), cclInvalidUsage, "was destroyed");
  FAILS(cclSend(x, 4, cclFloat, 0, comm), cclInvalidUsage, "was destroyed");
}

static int run_rank(int rank, int n, cclUniqueId id) {
  g_rank = rank;
  int version = 0;
  OK(cclGetVersion(&version));
  CHECK(version == CCL_VERSION_CODE, "version %d, header %d", version, CCL_VERSION_CODE);
  cclComm_t comm = NULL;
  OK(cclCommInitRank(&comm, n, id, rank));
  if (comm == NULL) return 1;
  int cnt = -1, me = -1;
  OK(cclCommCount(comm, &cnt));
  OK(cclCommUserRank(comm, &me));
  CHECK(cnt == n && me == rank, "count %d rank %d", cnt, me);
  test_allreduce(comm, rank, n);
  test_rooted(comm, rank, n);
  test_gather_scatter(comm, rank, n);
  test_vcolls(comm, rank, n);
  test_p2p_and_groups(comm, rank, n);
  test_nonblocking(comm, rank, n);
  test_registration(comm, rank, n);
  test_comm_mem(comm, rank, n);
  test_split(comm, rank, n);
  test_errors(comm, rank, n);
  test_abort(comm, rank, n);
  test_destroy(comm);
  printf("rank %d: %d passed, %d failed\n", rank, g_passed, g_failed);
  fflush(stdout);
  return g_failed == 0 ? 0 : 1;
}

/* ---- processes ---- */

static int procs(int n) {
  int fds[64][2];
  pid_t pids[64];
  for (int r = 0; r < n; r++)
    if (pipe(fds[r]) != 0) return 2;
  for (int r = 0; r < n; r++) {
    pids[r] = fork();
    if (pids[r] < 0) return 2;
    if (pids[r] == 0) {
      alarm(300); /* a hang fails the test instead of stalling it */
      cclUniqueId id;
      if (r == 0) {
        /* Rank 0 makes the id and hands it to the others, as MPI_Bcast would. */
        if (cclGetUniqueId(&id) != cclSuccess) {
          fprintf(stderr, "cclGetUniqueId: %s\n", cclGetLastError(NULL));
          _exit(1);
        }
        for (int k = 1; k < n; k++)
          if (write(fds[k][1], &id, sizeof id) != (ssize_t)sizeof id) _exit(2);
      } else if (read(fds[r][0], &id, sizeof id) != (ssize_t)sizeof id) {
        _exit(2);
      }
      _exit(run_rank(r, n, id));
    }
  }
  int failed = 0;
  for (int r = 0; r < n; r++) {
    int st = 0;
    waitpid(pids[r], &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      fprintf(stderr, "rank %d exited with status %#x\n", r, st);
      failed++;
    }
  }
  printf("%d passed, %d failed\n", n - failed, failed);
  return failed == 0 ? 0 : 1;
}

/* ---- threads ---- */

struct targ {
  int rank, n, failed;
  cclUniqueId id;
};

static void* thread_rank(void* p) {
  struct targ* a = p;
  cclComm_t comm = NULL;
  a->failed = 1;
  if (cclCommInitRank(&comm, a->n, a->id, a->rank) != cclSuccess) {
    fprintf(stderr, "thread %d: %s\n", a->rank, cclGetLastError(NULL));
    return NULL;
  }
  int bad = 0;
  double x[1000];
  for (int i = 0; i < 1000; i++) x[i] = a->rank + i;
  bad += cclAllReduce(x, x, 1000, cclDouble, cclSum, comm) != cclSuccess;
  for (int i = 0; i < 1000; i++) bad += x[i] != a->n * (a->n - 1) / 2.0 + (double)a->n * i;
  /* Groups are per thread: each thread's group holds its own rank's operations. */
  int right = (a->rank + 1) % a->n, left = (a->rank + a->n - 1) % a->n, out = a->rank, in = -1;
  bad += cclGroupStart() != cclSuccess;
  bad += cclSend(&out, 1, cclInt, right, comm) != cclSuccess;
  bad += cclRecv(&in, 1, cclInt, left, comm) != cclSuccess;
  bad += cclGroupEnd() != cclSuccess;
  bad += in != left;
  /* Last errors are per thread too. */
  cclCommCount(comm, NULL);
  bad += strstr(cclGetLastError(NULL), "cclCommCount") == NULL;
  bad += cclCommDestroy(comm) != cclSuccess;
  if (bad) fprintf(stderr, "thread %d: %d checks failed (%s)\n", a->rank, bad, cclGetLastError(NULL));
  a->failed = bad != 0;
  return NULL;
}

static int threads(int n) {
  struct targ a[64];
  pthread_t t[64];
  cclUniqueId id;
  if (cclGetUniqueId(&id) != cclSuccess) {
    fprintf(stderr, "cclGetUniqueId: %s\n", cclGetLastError(NULL));
    return 1;
  }
  for (int r = 0; r < n; r++) {
    a[r].rank = r;
    a[r].n = n;
    a[r].id = id;
    pthread_create(&t[r], NULL, thread_rank, &a[r]);
  }
  int failed = 0;
  for (int r = 0; r < n; r++) {
    pthread_join(t[r], NULL);
    failed += a[r].failed;
  }
  printf("%d passed, %d failed\n", n - failed, failed);
  return failed == 0 ? 0 : 1;
}

/* ---- abort from another thread ---- */

struct aarg {
  int rank;
  cclUniqueId id;
  cclComm_t comm;
  cclResult_t res;
  char msg[512];
};

static void* abort_rank(void* p) {
  struct aarg* a = p;
  cclComm_t comm = NULL;
  a->res = cclCommInitRank(&comm, 2, a->id, a->rank);
  __atomic_store_n(&a->comm, comm, __ATOMIC_RELEASE);
  if (a->res != cclSuccess || a->rank == 1) return NULL;
  /* Rank 1 never joins this allreduce: only an abort can end it. */
  float x[256] = {0};
  a->res = cclAllReduce(x, x, 256, cclFloat, cclSum, a->comm);
  snprintf(a->msg, sizeof a->msg, "%s", cclGetLastError(NULL));
  return NULL;
}

/* A collective blocked on one thread ends at once when another thread aborts its
 * communicator, with an error saying so; the handle is gone afterwards. */
static int aborts(void) {
  g_rank = 0;
  struct aarg a[2];
  pthread_t t[2];
  cclUniqueId id;
  OK(cclGetUniqueId(&id));
  for (int r = 0; r < 2; r++) {
    memset(&a[r], 0, sizeof a[r]);
    a[r].rank = r;
    a[r].id = id;
    pthread_create(&t[r], NULL, abort_rank, &a[r]);
  }
  pthread_join(t[1], NULL);
  OK(a[1].res);
  /* Rank 0 is initialized, then enters the allreduce. */
  while (__atomic_load_n(&a[0].comm, __ATOMIC_ACQUIRE) == NULL) usleep(1000);
  usleep(300 * 1000);
  OK(cclCommAbort(a[0].comm));
  pthread_join(t[0], NULL);
  CHECK(a[0].res == cclInvalidUsage && strstr(a[0].msg, "abort") != NULL,
        "allreduce during abort -> %d (%s)", (int)a[0].res, a[0].msg);
  float x[4] = {0};
  FAILS(cclAllReduce(x, x, 4, cclFloat, cclSum, a[0].comm), cclInvalidUsage, "destroyed");
  OK(cclCommDestroy(a[1].comm));
  printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}

/* ---- a communicator's own timeout ---- */

struct targ2 {
  int rank;
  cclUniqueId id;
  cclComm_t comm;
  cclResult_t res;
  double seconds;
  char msg[512];
  pthread_barrier_t* done;
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void* timeout_rank(void* p) {
  struct targ2* a = p;
  cclConfig_t cfg = CCL_CONFIG_INITIALIZER;
  cfg.timeoutMs = 700;
  a->res = cclCommInitRankConfig(&a->comm, 2, a->id, a->rank, &cfg);
  if (a->res == cclSuccess && a->rank == 0) {
    /* Rank 1 never joins: the barrier ends at the config's deadline, not CCL_TIMEOUT's. */
    double t0 = now_s();
    a->res = cclBarrier(a->comm);
    a->seconds = now_s() - t0;
    snprintf(a->msg, sizeof a->msg, "%s", cclGetLastError(NULL));
  }
  pthread_barrier_wait(a->done); /* rank 1 stays connected until rank 0 has timed out */
  if (a->comm != NULL) cclCommDestroy(a->comm);
  return NULL;
}

/* cclCommInitRankConfig's timeoutMs is the communicator's deadline (the test runs with a long
 * CCL_TIMEOUT, so only the config can make the barrier end early). */
static int timeouts(void) {
  g_rank = 0;
  struct targ2 a[2];
  pthread_t t[2];
  pthread_barrier_t done;
  pthread_barrier_init(&done, NULL, 2);
  cclUniqueId id;
  OK(cclGetUniqueId(&id));
  for (int r = 0; r < 2; r++) {
    memset(&a[r], 0, sizeof a[r]);
    a[r].rank = r;
    a[r].id = id;
    a[r].done = &done;
    pthread_create(&t[r], NULL, timeout_rank, &a[r]);
  }
  for (int r = 0; r < 2; r++) pthread_join(t[r], NULL);
  pthread_barrier_destroy(&done);
  CHECK(a[0].res == cclTimeout && strstr(a[0].msg, "timeout") != NULL &&
            strstr(a[0].msg, "peer 1") != NULL,
        "lone barrier -> %d (%s)", (int)a[0].res, a[0].msg);
  /* Generous on a loaded machine; CCL_TIMEOUT (set by the test) is far longer. */
  CHECK(a[0].seconds >= 0.6 && a[0].seconds < 60, "timed out after %.2f s", a[0].seconds);
  printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}

int main(int argc, char** argv) {
  if (argc != 3 || atoi(argv[2]) < 1 || atoi(argv[2]) > 64) {
    fprintf(stderr, "usage: %s procs|threads|abort|timeout N (1..64)\n", argv[0]);
    return 2;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  int n = atoi(argv[2]);
  if (strcmp(argv[1], "procs") == 0) return procs(n);
  if (strcmp(argv[1], "threads") == 0) return threads(n);
  if (strcmp(argv[1], "abort") == 0) {
    alarm(120);
    return aborts();
  }
  if (strcmp(argv[1], "timeout") == 0) {
    alarm(120);
    return timeouts();
  }
  fprintf(stderr, "unknown mode %s\n", argv[1]);
  return 2;
}
