// The "oxccl" torch.distributed backend in C++: a c10d::Backend whose operations are calls into
// libccl through its C ABI (ccl.h). See backend.cpp for how operations run and complete, and
// docs/torch.md for what each torch call does.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ccl.h"

namespace oxccl_torch {

// Loads the library's functions from `path` (the libccl.so the Python package loaded, so both
// share one library and its communicator handles). Idempotent for the same path.
void loadLibrary(const std::string& path);

// The communicator of one group, shared by the backend, its works and its deferred sends and
// receives: a work may outlive the backend that made it, and must then fail, not crash.
struct CommState {
  std::mutex m;
  cclComm_t comm = nullptr;
  std::string gone;  // "aborted" or "shut down" once the communicator is freed
  int rank = 0;
  int size = 0;

  // The communicator for an operation named `op`, or an invalid-usage error naming why none.
  cclComm_t live(const char* op);
};

class CclWork;

// Completes works nobody waits for on their own thread (those asked for a Future, or waited on
// with a timeout): one thread per group, started with the first such work. The library finishes
// one communicator's operations in issue order, so taking works in that order never waits
// behind a later one.
class Completer : public std::enable_shared_from_this<Completer> {
 public:
  void put(c10::intrusive_ptr<CclWork> work);
  // Completes the queued works, then ends the thread; after `timeout` the thread is left to
  // finish on its own (the communicator's deadline ends every wait it could be in).
  void stop(std::chrono::milliseconds timeout);

 private:
  void loop();
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<c10::intrusive_ptr<CclWork>> queue_;
  bool running_ = false;
  bool stopping_ = false;
};

// What a work runs to complete: waits for the library's requests, then copies results into the
// caller's tensors. Throws the operation's error.
using Drive = std::function<void()>;

class CclWork : public c10d::Work {
 public:
  // A work that is already complete (a blocking call that ran inline).
  CclWork(int rank, c10d::OpType type, uint64_t seq, const char* name,
          std::vector<at::Tensor> result);
  // A work completed by running `drive` once, on whichever thread gets to it first. In-flight
  // works (the library writes into their buffers) are completed when dropped unwaited.
  CclWork(int rank, c10d::OpType type, uint64_t seq, const char* name, Drive drive,
          std::vector<at::Tensor> result, std::shared_ptr<Completer> completer, bool inFlight);
  ~CclWork() override;

  bool isCompleted() override;
  bool isSuccess() const override;
  bool wait(std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  // A Future of the WorkResult (SUCCESS, TIMEOUT, COMM_ERROR) that never holds an error.
  c10::intrusive_ptr<c10::ivalue::Future> getFutureResult() override;
  std::vector<at::Tensor> result() override;
  uint64_t getSequencenumber() const override;
  // The rank a receive's data came from (what `dist.recv` without a source returns).
  int sourceRank() const override;
  void setSource(std::function<int()> source) { source_ = std::move(source); }

 private:
  friend class Completer;
  bool claim();
  void complete();

  enum : int { kPending, kClaimed, kDone };
  std::atomic<int> state_;
  const char* name_;
  uint64_t seq_;
  Drive drive_;
  std::vector<at::Tensor> result_;
  std::shared_ptr<Completer> completer_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  bool inFlight_;
  std::function<int()> source_;
};

// The peer of a receive from any source (`dist.recv` without `src`).
constexpr int kAnySource = -1;

// One isend or irecv, recorded until its group runs: the contiguous bytes, and the tag that
// travels with the data (8 bytes in the same group), so that a receive whose tag differs from
// the message's fails instead of taking the wrong data.
struct Transfer {
  bool send;
  at::Tensor tensor;  // the caller's
  at::Tensor buf;     // contiguous: the caller's, or a stand-in copied back after a receive
  int peer;  // kAnySource until a receive from any source finds its sender
  int tag;
  at::Tensor tagbuf;
  bool done = false;
  std::exception_ptr error;
};

// torch's isend/irecv, which return at once, over the library's sends and receives, which run
// as groups (NCCL's model). Recorded transfers run together as one library group when one of
// them is waited on, before any other operation of the process group (which keeps the order of
// operations between two ranks the same on both), at the end of a coalesced block, and before a
// second send to (or receive from) the same peer is recorded. With at most one transfer per
// peer and direction in a group, groups match between ranks however each side batched them.
// A receive from any source runs alone, after the transfers recorded before it: its peer is
// known only once the library has found a send to take (cclProbe).
class P2P {
 public:
  explicit P2P(std::shared_ptr<CommState> state) : state_(std::move(state)) {}
  std::shared_ptr<Transfer> post(bool send, const at::Tensor& tensor, int peer, int tag);
  void wait(const std::shared_ptr<Transfer>& t);
  void flush();
  void cancel(const std::string& why);
  bool pending();

 private:
  void flushLocked();
  // Runs transfers [first, last) of `batch` as one library group and settles each.
  void runGroup(std::vector<std::shared_ptr<Transfer>>& batch, size_t first, size_t last);
  std::shared_ptr<CommState> state_;
  std::recursive_mutex m_;
  std::vector<std::shared_ptr<Transfer>> batch_;
  std::set<std::pair<bool, int>> peers_;
};

class ProcessGroupOxccl : public c10d::Backend {
 public:
  // Joins the group's communicator through its store; with `enableReconfigure`, joins none
  // and waits for reconfigure() (torch's init_process_group(..., enable_reconfigure=True)).
  ProcessGroupOxccl(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                    std::chrono::milliseconds timeout, bool enableReconfigure = false);
  // A group over a communicator made by a split of another group's.
  ProcessGroupOxccl(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                  std::chrono::milliseconds timeout, cclComm_t comm);
  ~ProcessGroupOxccl() override;

  const std::string getBackendName() const override { return "oxccl"; }
  c10::intrusive_ptr<Options> getBackendOptions() override;
  bool supportsCoalescing() const override { return true; }
  bool supportsSplitting() const override { return true; }
  // torch's split_group: every rank of this group calls it with the ranks (of this group) of
  // its new group, or of the first one when it joins none; one cclCommSplit for all of them.
  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store>& store,
                                          const std::vector<int>& ranks,
                                          const c10::intrusive_ptr<Options>& opts) override;
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;
  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return seq_; }
  void setTimeout(std::chrono::milliseconds timeout) override;
  void abort() override;

#ifdef C10D_BACKEND_HAS_RECONFIGURE
  // torch's dist.shrink_group: one cclCommShrink among the survivors, which excludes
  // `ranksToExclude` (of this group) and any rank that dies meanwhile. SHRINK_ABORT revokes this
  // group's communicator first, so that operations blocked on it end at once.
  bool supportsShrinking() const override { return true; }
  c10::intrusive_ptr<c10d::Backend> shrink(
      const std::vector<int64_t>& ranksToExclude, int shrinkFlags,
      const c10::intrusive_ptr<Options>& optsOverride) override;

  // torch's dist._reconfigure: a handle is a unique id made in this process (its rendezvous
  // root listens here); reconfigure() joins the communicator of the first handle (of the list,
  // or of the set in sorted order) as the rank of this process's handle among them, checks that
  // every member passed the same uuid, and replaces this group's communicator with it.
  bool supportsReconfigure() const override { return true; }
  c10d::ReconfigureHandle get_reconfigure_handle() const override;
  c10::intrusive_ptr<c10d::Work> reconfigure(const c10d::ReconfigureOptions& opts) override;
#endif

#ifdef C10D_BACKEND_HAS_HOOKS
  // Run, in registration order, by abort() (and so by SHRINK_ABORT and torch's abort of a
  // group) before the communicator is torn down; a hook that throws is logged and skipped.
  bool supportsAbortHooks() const override { return true; }
  void registerAbortHook(int64_t hookId, c10d::AbortHook hook) override;
  void unregisterAbortHook(int64_t hookId) override;
#endif
  void shutdown() override;

  // The communicator's handle (cclComm_t as an integer; 0 once freed), for the Python package's
  // revoke and shrink.
  uintptr_t commHandle();

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                  const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> all_gather_single(at::Tensor& output, at::Tensor& input,
                                                   const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputLists, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> all_gather_single_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather_single(at::Tensor& output, at::Tensor& input,
                                               const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_single(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_single_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> all_to_all_single(at::Tensor& output, at::Tensor& input,
                                                   std::vector<int64_t>& outputSplits,
                                                   std::vector<int64_t>& inputSplits,
                                                   const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors,
                                               int tag) override;

 private:
  // One library call of an operation: issues it (non-blocking when `async`), returning the
  // request to wait for, or nullptr when it ran to completion.
  using Call = std::function<cclRequest_t(cclComm_t comm, bool async)>;

  // Issues an operation made of library calls and returns its work: inline when `async` is
  // false, else non-blocking, completed by waiting for the requests and then running `finish`
  // (copies into the caller's tensors).
  c10::intrusive_ptr<c10d::Work> run(const char* name, c10d::OpType type, bool async,
                                     std::vector<Call> calls, std::function<void()> finish,
                                     std::vector<at::Tensor> result);
  c10::intrusive_ptr<c10d::Work> done(const char* name, c10d::OpType type,
                                      std::vector<at::Tensor> result);
  c10::intrusive_ptr<c10d::Work> p2p(bool send, std::vector<at::Tensor>& tensors, int peer,
                                     int tag);
  c10::intrusive_ptr<c10d::Work> record(c10::intrusive_ptr<c10d::Work> work);
  [[noreturn]] void fail(const char* name, cclResult_t r);
  void release(const char* why, bool abort);

  std::shared_ptr<CommState> state_;
  std::shared_ptr<Completer> completer_;
  std::shared_ptr<P2P> p2p_;
  c10::intrusive_ptr<c10d::Store> store_;
  std::chrono::milliseconds timeout_;
  uint64_t seq_ = 0;
  uint64_t monitored_ = 0;
  uint64_t shrinks_ = 0;
  bool coalescing_ = false;
  std::vector<c10::intrusive_ptr<c10d::Work>> coalesced_;
  // This process's reconfigure handle until a reconfigure uses it ("" before the first ask).
  mutable std::mutex handleM_;
  mutable std::string handle_;
  std::mutex hooksM_;
  std::vector<std::pair<int64_t, std::function<void()>>> abortHooks_;
  void runAbortHooks();
};

}  // namespace oxccl_torch
