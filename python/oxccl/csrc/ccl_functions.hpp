// Every function of the C ABI (ccl.h), for X-macros: generated from ccl-capi's exports by
// `CCL_ABI_WRITE=1 cargo test -p ccl-capi --lib abi`; do not edit.
#pragma once

#define CCL_FUNCTIONS(X) \
  X(cclGetVersion) \
  X(cclGetErrorString) \
  X(cclGetLastError) \
  X(cclGetUniqueId) \
  X(cclCommInitRank) \
  X(cclCommInitRankConfig) \
  X(cclCommInitFromEnv) \
  X(cclCommSplit) \
  X(cclCommRevoke) \
  X(cclCommGetFailedRanks) \
  X(cclCommShrink) \
  X(cclCommGrow) \
  X(cclCommDestroy) \
  X(cclCommAbort) \
  X(cclCommGetAsyncError) \
  X(cclCommCount) \
  X(cclCommUserRank) \
  X(cclMemAlloc) \
  X(cclCommMemAlloc) \
  X(cclMemFree) \
  X(cclCommRegister) \
  X(cclCommDeregister) \
  X(cclAllReduce) \
  X(cclBroadcast) \
  X(cclReduce) \
  X(cclAllGather) \
  X(cclReduceScatter) \
  X(cclAlltoAll) \
  X(cclGather) \
  X(cclScatter) \
  X(cclAllGatherV) \
  X(cclReduceScatterV) \
  X(cclAlltoAllV) \
  X(cclBarrier) \
  X(cclSend) \
  X(cclRecv) \
  X(cclGroupStart) \
  X(cclGroupEnd) \
  X(cclProbe) \
  X(cclAllReduceAsync) \
  X(cclBroadcastAsync) \
  X(cclReduceAsync) \
  X(cclAllGatherAsync) \
  X(cclReduceScatterAsync) \
  X(cclAlltoAllAsync) \
  X(cclGatherAsync) \
  X(cclScatterAsync) \
  X(cclAllGatherVAsync) \
  X(cclReduceScatterVAsync) \
  X(cclAlltoAllVAsync) \
  X(cclBarrierAsync) \
  X(cclTest) \
  X(cclWait)
