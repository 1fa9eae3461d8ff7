/*
 * ccl.h: the C interface of ccl, a collective-communication library for host memory.
 *
 * Shaped like NCCL's nccl.h, so code written for NCCL ports by renaming (nccl -> ccl, NCCL ->
 * CCL) and dropping the CUDA stream argument: buffers are ordinary host memory and blocking
 * calls return when the operation is complete on this rank. Link with -lccl (libccl.so or
 * libccl.a; the static library also needs -lpthread -ldl -lm, which C libraries since glibc
 * 2.34 hold themselves; no verbs library: the verbs transport opens libibverbs at run time).
 *
 * Every function checks its arguments and never lets a failure cross into the caller: NULL
 * pointers where a pointer is needed, counts whose buffers would not fit the address space,
 * values outside the enums, unknown, destroyed or forged communicator and request handles, and
 * any internal failure come back as a result code, with a message from cclGetLastError().
 * Pointers that are not NULL must point to memory of the documented size; that cannot be
 * checked.
 *
 * Threads: every function may be called from any thread. A communicator may be used by several
 * threads; its operations run in the order they were issued on this rank, and every rank must
 * issue the same collectives in the same order (as with NCCL and MPI).
 *
 * This file is generated from ccl-capi's exports by
 * `CCL_ABI_WRITE=1 cargo test -p ccl-capi --lib abi`; do not edit.
 */
#ifndef CCL_H_
#define CCL_H_

#include <limits.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CCL_MAJOR 0
#define CCL_MINOR 1
#define CCL_PATCH 0

/* NCCL's encoding: cclGetVersion() reports CCL_VERSION_CODE. */
#define CCL_VERSION(X, Y, Z) ((X) * 10000 + (Y) * 100 + (Z))

#define CCL_VERSION_CODE CCL_VERSION(CCL_MAJOR, CCL_MINOR, CCL_PATCH)

/* A communicator: an opaque handle, NULL when there is none. */
typedef struct cclComm* cclComm_t;

/* A non-blocking operation in flight: an opaque handle, finished by cclWait or
 * cclTest. */
typedef struct cclRequest* cclRequest_t;

/* Settings of one communicator, for cclCommInitRankConfig (NCCL's ncclConfig_t shape).
 * Declare it as `cclConfig_t config = CCL_CONFIG_INITIALIZER;` and set the fields wanted: a
 * field left at CCL_CONFIG_UNDEF_INT takes its CCL_* variable, or its default. size, magic
 * and version let the library tell which fields the caller's header had; do not change
 * them. */
typedef struct cclConfig {
  size_t size;
  unsigned int magic;
  unsigned int version;
  /* Milliseconds any wait of the communicator may go without progress before it fails
   * with cclTimeout, as CCL_TIMEOUT (which is in seconds) does for the others. */
  int timeoutMs;
} cclConfig_t;

#define CCL_CONFIG_MAGIC 0xcc1c0f16
#define CCL_CONFIG_UNDEF_INT INT_MIN
#define CCL_CONFIG_INITIALIZER { sizeof(cclConfig_t), CCL_CONFIG_MAGIC, CCL_VERSION_CODE, CCL_CONFIG_UNDEF_INT }

/* cclCommSplit color of a rank that joins no new communicator. */
#define CCL_SPLIT_NOCOLOR -1

#define CCL_UNIQUE_ID_BYTES 128

/* The token every rank of a communicator passes to cclCommInitRank. */
typedef struct {
  char internal[CCL_UNIQUE_ID_BYTES];
} cclUniqueId;

/* Result codes, numbered as NCCL's ncclResult_t (1, NCCL's CUDA error, is not used). */
typedef enum {
  cclSuccess = 0,
  /* an operating-system call failed (socket, memory, thread) */
  cclSystemError = 2,
  /* a bug in ccl */
  cclInternalError = 3,
  /* a value passed was out of range, NULL or malformed */
  cclInvalidArgument = 4,
  /* the call is not allowed now (destroyed handle, failed or aborted communicator, group
   * misuse) */
  cclInvalidUsage = 5,
  /* a peer failed, closed its connection or broke the protocol */
  cclRemoteError = 6,
  /* reserved (NCCL's non-blocking initialization) */
  cclInProgress = 7,
  /* a wait passed its deadline (CCL_TIMEOUT without progress) */
  cclTimeout = 8,
  /* the communicator was revoked (cclCommRevoke, or a shrink): shrink it */
  cclRevoked = 9,
  cclNumResults = 10
} cclResult_t;


/* Element types, numbered as NCCL's ncclDataType_t. Taken as a plain int, so that any value
 * can be checked. */
typedef enum {
  cclInt8 = 0,
  cclChar = 0,
  cclUint8 = 1,
  cclInt32 = 2,
  cclInt = 2,
  cclUint32 = 3,
  cclInt64 = 4,
  cclUint64 = 5,
  cclFloat16 = 6,
  cclHalf = 6,
  cclFloat32 = 7,
  cclFloat = 7,
  cclFloat64 = 8,
  cclDouble = 8,
  cclBfloat16 = 9,
  cclNumTypes = 10
} cclDataType_t;


/* Reduction operators, numbered as NCCL's ncclRedOp_t; the bitwise ones, which NCCL lacks,
 * follow. Integer sum and product wrap; avg is the sum divided by the number of ranks
 * (integers truncate toward zero). Bitwise and, or and exclusive or are defined for the
 * integer types only: with a float type they are cclInvalidArgument. */
typedef enum {
  cclSum = 0,
  cclProd = 1,
  cclMax = 2,
  cclMin = 3,
  cclAvg = 4,
  cclBAnd = 5,
  cclBOr = 6,
  cclBXor = 7,
  cclNumOps = 8
} cclRedOp_t;


/* ---- Library and errors ---------------------------------------------------------------- */

/* Writes CCL_VERSION_CODE of the library (which may differ from this header's). */
cclResult_t cclGetVersion(int* version);

/* A static description of a result code. */
const char* cclGetErrorString(cclResult_t result);

/* The message of the last failed call on this thread, naming the function and what was wrong
 * (for instance "cclAllReduce: invalid argument: datatype 42 is not a cclDataType_t"); "" if
 * none failed yet. Successful calls leave it alone. The string stays valid until the next
 * failing call on this thread. comm is ignored and may be NULL (NCCL's signature). */
const char* cclGetLastError(cclComm_t comm);

/* ---- Communicators --------------------------------------------------------------------- */

/* Creates a unique id and starts its rendezvous in this process. After set-up the rendezvous
 * stays on as the job's monitor (failure notices, culprits of hangs, shrink), so this process
 * should outlive the communicator's ranks. The root listens on CCL_SOCKET_IFNAME (default: the
 * first non-loopback interface; CCL_SOCKET_IFNAME="=lo" keeps a job on one host on loopback).
 * Pass the id to every rank. */
cclResult_t cclGetUniqueId(cclUniqueId* uniqueId);

/* Joins the communicator of commId as rank of nranks; blocks until every rank has joined
 * (or CCL_TIMEOUT passes). Settings come from CCL_* environment variables. */
cclResult_t cclCommInitRank(cclComm_t* comm, int nranks, cclUniqueId commId, int rank);

/* cclCommInitRank with the settings of config (see cclConfig_t) on top of the CCL_* variables;
 * config may be NULL. A config with a wrong size or magic, or a timeoutMs that is not
 * positive, is cclInvalidArgument. */
cclResult_t cclCommInitRankConfig(cclComm_t* comm, int nranks, cclUniqueId commId, int rank,
                                  cclConfig_t* config);

/* Joins the job described by launcher variables (torchrun, mpirun, srun or CCL_RANK,
 * CCL_WORLD_SIZE and CCL_UNIQUE_ID / CCL_COMM_ID / MASTER_ADDR). */
cclResult_t cclCommInitFromEnv(cclComm_t* comm);

/* Collective over comm: ranks with the same color form a new communicator, ordered by key then
 * by their rank in comm. A rank passing CCL_SPLIT_NOCOLOR takes part and gets *newcomm = NULL.
 * config must be NULL: the new communicator has comm's settings. */
cclResult_t cclCommSplit(cclComm_t comm, int color, int key, cclComm_t* newcomm,
                         cclConfig_t* config);

/* Revokes comm on every rank: pending and later operations fail with cclRevoked, here at once
 * and on the other ranks within milliseconds. revokeFlags must be 0. */
cclResult_t cclCommRevoke(cclComm_t comm, int revokeFlags);

/* The ranks the job's rendezvous has reported failed or dead so far, in rank order: the first
 * min(count, maxRanks) go to ranks; *count is how many there are. */
cclResult_t cclCommGetFailedRanks(cclComm_t comm, int* ranks, int maxRanks, int* count);

/* The survivors of comm: every rank still alive that calls it within CCL_TIMEOUT, minus the
 * ranks in excludeRanksList (the union over callers), numbered densely in their old order. A
 * rank dying during the shrink is left out by a further round. An excluded caller gets
 * cclRevoked. Revokes comm everywhere. config must be NULL, shrinkFlags 0. Needs the process
 * that made the unique id (it decides who survives) to be alive. */
cclResult_t cclCommShrink(cclComm_t comm, const int* excludeRanksList, int excludeRanksCount,
                          cclComm_t* newcomm, cclConfig_t* config, int shrinkFlags);

/* A communicator of nRanks: the ranks of comm keep their ranks (they pass comm and rank -1,
 * and config NULL); new processes pass comm NULL and their rank (>= comm's size). Every party
 * passes the same uniqueId, made with cclGetUniqueId by one rank of comm. */
cclResult_t cclCommGrow(cclComm_t comm, int nRanks, const cclUniqueId* uniqueId, int rank,
                        cclComm_t* newcomm, cclConfig_t* config);

/* Finishes the operations already issued on comm, then frees it. The handle is invalid
 * afterwards: later calls with it return cclInvalidUsage. */
cclResult_t cclCommDestroy(cclComm_t comm);

/* Fails comm at once, ending every wait on it (also on other threads), then frees it. */
cclResult_t cclCommAbort(cclComm_t comm);

/* The error comm has failed with (sticky: every later operation returns it), or cclSuccess. */
cclResult_t cclCommGetAsyncError(cclComm_t comm, cclResult_t* asyncError);

/* Number of ranks of comm. */
cclResult_t cclCommCount(cclComm_t comm, int* count);

/* This process's rank in comm. */
cclResult_t cclCommUserRank(cclComm_t comm, int* rank);

/* ---- Registered memory (NCCL's ncclMemAlloc / ncclCommRegister) ------------------------
 *
 * Collectives whose buffers lie in memory registered with their communicator send
 * straight from it where the transport can (verbs: RDMA writes from it instead of
 * a copy into staging buffers); on other transports registration changes nothing.
 * Registered bytes count toward CCL_REG_MAX_BYTES. Memory must stay allocated
 * until it is deregistered.
 */

/* Allocates size bytes (page aligned, zeroed, huge pages when the system has them) into *ptr,
 * for registration. size 0 is cclInvalidArgument. */
cclResult_t cclMemAlloc(void** ptr, size_t size);

/* Allocates size bytes registered with comm into *ptr (zeroed, page aligned; no
 * cclCommRegister needed). On a host whose ranks share memory it comes from comm's shared
 * arena (CCL_SHM_ARENA_BYTES), which the host's other ranks map: an allreduce whose buffers
 * lie in such memory on every rank of the host reads and writes them in place. size 0 is
 * cclInvalidArgument; beyond the arena or the host's memory, cclInvalidUsage. Free it with
 * cclMemFree (also after comm is destroyed), never while an operation uses it. */
cclResult_t cclCommMemAlloc(cclComm_t comm, void** ptr, size_t size);

/* Frees memory from cclMemAlloc or cclCommMemAlloc. A pointer neither returned (or not its
 * start) is cclInvalidArgument; a double free, or memory still registered with a communicator,
 * is cclInvalidUsage. */
cclResult_t cclMemFree(void* ptr);

/* Registers size bytes at buff (any caller memory, not only cclMemAlloc's) with comm; *handle
 * identifies the registration. */
cclResult_t cclCommRegister(cclComm_t comm, void* buff, size_t size, void** handle);

/* Ends a registration (also after comm was destroyed). A handle that is not a live
 * registration of comm is an error; so is memory an operation in flight on comm uses (a
 * non-blocking call not yet completed by cclWait/cclTest, or a running one): cclInvalidUsage,
 * and the registration stays. */
cclResult_t cclCommDeregister(cclComm_t comm, void* handle);

/* ---- Collectives -----------------------------------------------------------------------
 *
 * Counts are in elements, as in NCCL. In place when sendbuff == recvbuff, except:
 * allgather is in place when sendbuff == recvbuff + rank * sendcount * size,
 * reduce-scatter when recvbuff == sendbuff + rank * recvcount * size. Any other
 * overlap of the send and receive buffers is cclInvalidArgument. Buffers may be
 * NULL when their size is 0.
 */

/* recvbuff[i] = op over ranks of sendbuff[i], count elements, on every rank. */
cclResult_t cclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                         cclDataType_t datatype, cclRedOp_t op, cclComm_t comm);

/* Copies count elements from root's sendbuff to every rank's recvbuff (sendbuff is read on
 * root only; other ranks may pass NULL). */
cclResult_t cclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                         cclDataType_t datatype, int root, cclComm_t comm);

/* Reduces every rank's sendbuff into root's recvbuff (recvbuff is written on root only; other
 * ranks may pass NULL). */
cclResult_t cclReduce(const void* sendbuff, void* recvbuff, size_t count, cclDataType_t datatype,
                      cclRedOp_t op, int root, cclComm_t comm);

/* recvbuff (nranks * sendcount elements) receives every rank's sendbuff, in rank order. */
cclResult_t cclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                         cclDataType_t datatype, cclComm_t comm);

/* Rank r's recvbuff (recvcount elements) receives the reduction of block r of every rank's
 * sendbuff (nranks * recvcount elements). */
cclResult_t cclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                             cclDataType_t datatype, cclRedOp_t op, cclComm_t comm);

/* Block k (count elements) of sendbuff goes to block rank of rank k's recvbuff; both buffers
 * hold nranks * count elements. */
cclResult_t cclAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                        cclDataType_t datatype, cclComm_t comm);

/* Gathers count elements of every rank's sendbuff into root's recvbuff (nranks * count
 * elements, in rank order), as NCCL 2.28's ncclGather. recvbuff is written on root only (other
 * ranks may pass NULL). In place on root when sendbuff == recvbuff + root * count * size. */
cclResult_t cclGather(const void* sendbuff, void* recvbuff, size_t count, cclDataType_t datatype,
                      int root, cclComm_t comm);

/* Block k (count elements) of root's sendbuff (nranks * count elements) goes to rank k's
 * recvbuff, as NCCL 2.28's ncclScatter. sendbuff is read on root only (other ranks may pass
 * NULL). In place on root when recvbuff == sendbuff + root * count * size. */
cclResult_t cclScatter(const void* sendbuff, void* recvbuff, size_t count, cclDataType_t datatype,
                       int root, cclComm_t comm);

/* ---- Collectives with a count per rank (MPI's v-forms) ---------------------------------
 *
 * Counts and displacements are arrays of nranks size_t, in elements; a NULL
 * displacement array places the blocks back to back in rank order. Buffers must
 * hold every block (exactly, when packed). Every rank passes the counts MPI's
 * forms take; ranks whose counts disagree get cclInvalidUsage naming the peer
 * (every pair of ranks compares them), never a hang.
 */

/* Rank k's sendbuff (recvcounts[k] elements) lands at displs[k] of every rank's recvbuff.
 * recvcounts (and displs) are the same on every rank. In place when
 * sendbuff == recvbuff + displs[rank] * size. */
cclResult_t cclAllGatherV(const void* sendbuff, void* recvbuff, const size_t* recvcounts,
                          const size_t* displs, cclDataType_t datatype, cclComm_t comm);

/* sendbuff holds recvcounts[k] elements for each rank k, back to back; rank r's recvbuff
 * (recvcounts[r] elements) receives the reduction of every rank's block r. recvcounts is the
 * same on every rank. In place when recvbuff == sendbuff + (recvcounts[0] + ... +
 * recvcounts[rank-1]) * size: the result lands in this rank's block of sendbuff. */
cclResult_t cclReduceScatterV(const void* sendbuff, void* recvbuff, const size_t* recvcounts,
                              cclDataType_t datatype, cclRedOp_t op, cclComm_t comm);

/* sendcounts[k] elements at sdispls[k] of sendbuff go to rank k; recvcounts[k] elements from
 * rank k land at rdispls[k] of recvbuff. Rank k's recvcounts[rank] must equal this rank's
 * sendcounts[k]. In place when sendbuff == recvbuff: the receive blocks are also what is sent,
 * and sendcounts and sdispls are ignored (may be NULL). */
cclResult_t cclAlltoAllV(const void* sendbuff, const size_t* sendcounts, const size_t* sdispls,
                         void* recvbuff, const size_t* recvcounts, const size_t* rdispls,
                         cclDataType_t datatype, cclComm_t comm);

/* Returns once every rank of comm has called it. */
cclResult_t cclBarrier(cclComm_t comm);

/* ---- Point to point and groups ---------------------------------------------------------
 *
 * Between cclGroupStart and cclGroupEnd (on this thread; groups nest) operations
 * are recorded and run together at the outermost cclGroupEnd: all sends and
 * receives of a group on a communicator run as one exchange, so patterns such as
 * "send right, receive left" cannot deadlock; collectives recorded in a group run
 * first, in order. Buffers must stay valid until cclGroupEnd returns. Arguments
 * are checked when an operation is recorded; failures of the exchange come from
 * cclGroupEnd. Sends and receives with the same peer match in order, and a receive
 * must have the byte length of its send.
 */

/* Sends `count` elements to `peer` (recorded when inside a group). */
cclResult_t cclSend(const void* sendbuff, size_t count, cclDataType_t datatype, int peer,
                    cclComm_t comm);

/* Receives `count` elements from `peer` (recorded when inside a group). */
cclResult_t cclRecv(void* recvbuff, size_t count, cclDataType_t datatype, int peer,
                    cclComm_t comm);

/* Starts (or nests) a group on this thread. */
cclResult_t cclGroupStart(void);

/* Ends a group; the outermost end runs what was recorded. */
cclResult_t cclGroupEnd(void);

/* Receiving from any source (MPI_ANY_SOURCE): waits until some peer's next operation toward
 * this rank is a send (alone or in a group) and stores that peer in *peer and the bytes it
 * sends here in *bytes (bytes may be NULL); lowest rank first when several wait. Nothing is
 * received: cclRecv (or a group) naming *peer receives it next. Peers whose next operation
 * here is a collective are passed over. Not inside a group (cclInvalidUsage). After the
 * communicator's timeout with no send it fails with cclTimeout, naming what each peer
 * announced instead, and the communicator stays usable. */
cclResult_t cclProbe(int* peer, size_t* bytes, cclComm_t comm);

/* ---- Non-blocking collectives ----------------------------------------------------------
 *
 * Same arguments as the blocking forms plus request, which receives a handle. The
 * operation runs in the background, in issue order with every other operation on
 * comm. THE BUFFERS MUST STAY VALID AND UNTOUCHED until cclWait returns or cclTest
 * reports done. Argument errors are returned at once (and *request is NULL);
 * failures of the operation come from cclWait or cclTest. Not allowed inside a
 * group.
 */

/* Non-blocking allreduce. */
cclResult_t cclAllReduceAsync(const void* sendbuff, void* recvbuff, size_t count,
                              cclDataType_t datatype, cclRedOp_t op, cclComm_t comm,
                              cclRequest_t* request);

/* Non-blocking broadcast. */
cclResult_t cclBroadcastAsync(const void* sendbuff, void* recvbuff, size_t count,
                              cclDataType_t datatype, int root, cclComm_t comm,
                              cclRequest_t* request);

/* Non-blocking reduce. */
cclResult_t cclReduceAsync(const void* sendbuff, void* recvbuff, size_t count,
                           cclDataType_t datatype, cclRedOp_t op, int root, cclComm_t comm,
                           cclRequest_t* request);

/* Non-blocking allgather. */
cclResult_t cclAllGatherAsync(const void* sendbuff, void* recvbuff, size_t sendcount,
                              cclDataType_t datatype, cclComm_t comm, cclRequest_t* request);

/* Non-blocking reduce-scatter. */
cclResult_t cclReduceScatterAsync(const void* sendbuff, void* recvbuff, size_t recvcount,
                                  cclDataType_t datatype, cclRedOp_t op, cclComm_t comm,
                                  cclRequest_t* request);

/* Non-blocking alltoall. */
cclResult_t cclAlltoAllAsync(const void* sendbuff, void* recvbuff, size_t count,
                             cclDataType_t datatype, cclComm_t comm, cclRequest_t* request);

/* Non-blocking gather. */
cclResult_t cclGatherAsync(const void* sendbuff, void* recvbuff, size_t count,
                           cclDataType_t datatype, int root, cclComm_t comm,
                           cclRequest_t* request);

/* Non-blocking scatter. */
cclResult_t cclScatterAsync(const void* sendbuff, void* recvbuff, size_t count,
                            cclDataType_t datatype, int root, cclComm_t comm,
                            cclRequest_t* request);

/* Non-blocking allgatherv. */
cclResult_t cclAllGatherVAsync(const void* sendbuff, void* recvbuff, const size_t* recvcounts,
                               const size_t* displs, cclDataType_t datatype, cclComm_t comm,
                               cclRequest_t* request);

/* Non-blocking reduce-scatterv. */
cclResult_t cclReduceScatterVAsync(const void* sendbuff, void* recvbuff, const size_t* recvcounts,
                                   cclDataType_t datatype, cclRedOp_t op, cclComm_t comm,
                                   cclRequest_t* request);

/* Non-blocking alltoallv. */
cclResult_t cclAlltoAllVAsync(const void* sendbuff, const size_t* sendcounts,
                              const size_t* sdispls, void* recvbuff, const size_t* recvcounts,
                              const size_t* rdispls, cclDataType_t datatype, cclComm_t comm,
                              cclRequest_t* request);

/* Non-blocking barrier. */
cclResult_t cclBarrierAsync(cclComm_t comm, cclRequest_t* request);

/* Sets *done to 1 if the operation has finished, else 0. When done, the request is released
 * (the handle becomes invalid) and the operation's result is returned. */
cclResult_t cclTest(cclRequest_t request, int* done);

/* Waits for the operation, releases the request and returns the operation's result. Every
 * wait ends: operations fail at their deadline (CCL_TIMEOUT without progress) or on abort. */
cclResult_t cclWait(cclRequest_t request);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* CCL_H_ */
