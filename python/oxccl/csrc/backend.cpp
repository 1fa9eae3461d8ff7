// The "oxccl" torch.distributed backend in C++ (see backend.hpp).
//
// How an operation runs:
// - A blocking call (asyncOp false: `dist.all_reduce(t)`) calls the library's blocking form on
//   the caller's thread and returns a completed work.
// - Otherwise the library's non-blocking form is issued and the work holds its requests.
//   `wait()` on the waiting thread waits for them itself (no thread hop); `get_future()` and
//   `wait(timeout)` hand the work to the group's completion thread, which completes the Future
//   (DDP's communication hooks chain on it).
// - Tensors the library cannot take as they are (not contiguous, bool, complex, lists) go
//   through contiguous stand-ins that the work copies back after the library is done.
// - isend/irecv are recorded and run as one library group (class P2P).

#include "backend.hpp"
#include "ccl_functions.hpp"

#include <dlfcn.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/extension.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <numeric>

namespace oxccl_torch {
namespace {

// The library's functions, looked up in the libccl.so the Python package loaded (not linked:
// CCL_LIBRARY may name another build, and the package's Communicator must see the same
// handles as this backend).
struct Api {
#define CCL_FIELD(f) decltype(&::f) f = nullptr;
  CCL_FUNCTIONS(CCL_FIELD)
#undef CCL_FIELD
};
Api g;
std::mutex g_load;
std::string g_path;

std::string lastError(cclResult_t r) {
  const char* m = g.cclGetLastError(nullptr);
  if (m != nullptr && *m != '\0') return m;
  const char* s = g.cclGetErrorString(r);
  return s != nullptr ? s : "unknown error";
}

// The error of a failed library call: the library's message, naming the operation and rank.
[[noreturn]] void raise(const char* op, int rank, cclResult_t r) {
  TORCH_CHECK(false, "oxccl ", op, " failed on rank ", rank, ": ", lastError(r));
}

inline void check(cclResult_t r, const char* op, int rank) {
  if (r != cclSuccess) raise(op, rank, r);
}

[[noreturn]] void invalid(const char* op, const std::string& what) {
  TORCH_CHECK(false, "invalid argument: ", op, ": ", what);
}

// Waits for every request (each must be released, also after a failure) and raises the first
// failure.
void waitAll(const std::vector<cclRequest_t>& reqs, const char* op, int rank) {
  cclResult_t first = cclSuccess;
  std::string msg;
  for (auto* r : reqs) {
    cclResult_t x = g.cclWait(r);
    if (x != cclSuccess && first == cclSuccess) {
      first = x;
      msg = lastError(x);
    }
  }
  TORCH_CHECK(first == cclSuccess, "oxccl ", op, " failed on rank ", rank, ": ", msg);
}

// Issues through a non-blocking library call: the request, or in blocking mode (`async` false)
// nothing, once the call has finished.
cclRequest_t settle(cclRequest_t q, bool async, const char* op, int rank) {
  if (async) return q;
  waitAll({q}, op, rank);
  return nullptr;
}

size_t nbytes(const at::Tensor& t) { return static_cast<size_t>(t.numel()) * t.element_size(); }

// A contiguous tensor's memory as a 1-D byte tensor (no copy; `t` must stay alive).
at::Tensor bytesOf(const at::Tensor& t) {
  return at::from_blob(t.data_ptr(), {static_cast<int64_t>(nbytes(t))},
                       at::TensorOptions().dtype(at::kByte));
}

// Copies bytes (a 1-D byte tensor) into `dst`, whatever its layout and alignment.
void fromBytes(const at::Tensor& dst, const at::Tensor& src) {
  if (dst.numel() == 0) return;
  if (dst.is_contiguous()) {
    bytesOf(dst).copy_(src);
    return;
  }
  auto tmp = at::empty(dst.sizes(), dst.options());
  bytesOf(tmp).copy_(src);
  dst.copy_(tmp);
}

// An output tensor and the contiguous buffer the library writes in its place.
struct Out {
  at::Tensor t, c;
  explicit Out(const at::Tensor& x) : t(x), c(x.is_contiguous() ? x : x.contiguous()) {}
};

// What finishes an operation whose outputs may be stand-ins (nullptr when none is).
std::function<void()> copyBack(std::vector<Out> outs) {
  std::vector<Out> copies;
  for (auto& o : outs)
    if (!o.c.is_same(o.t)) copies.push_back(o);
  if (copies.empty()) return nullptr;
  return [copies = std::move(copies)] {
    for (auto& o : copies) o.t.copy_(o.c);
  };
}

bool nativeType(at::ScalarType s, cclDataType_t* out) {
  switch (s) {
    case at::kChar: *out = cclInt8; return true;
    case at::kByte: *out = cclUint8; return true;
    case at::kInt: *out = cclInt32; return true;
    case at::kUInt32: *out = cclUint32; return true;
    case at::kLong: *out = cclInt64; return true;
    case at::kUInt64: *out = cclUint64; return true;
    case at::kHalf: *out = cclFloat16; return true;
    case at::kFloat: *out = cclFloat32; return true;
    case at::kDouble: *out = cclFloat64; return true;
    case at::kBFloat16: *out = cclBfloat16; return true;
    default: return false;
  }
}

const char* opName(cclRedOp_t op) {
  static const char* names[] = {"SUM", "PROD", "MAX", "MIN", "AVG", "BAND", "BOR", "BXOR"};
  return op >= 0 && op < cclNumOps ? names[op] : "?";
}

// A torch reduce op as the library's, and the PREMUL_SUM factor (NCCL's ncclRedOpCreatePreMulSum
// does the same: a scalar multiply, then a sum).
struct Reduction {
  cclRedOp_t op;
  bool scaled = false;
  double factor = 1.0;
};

bool nativeOp(c10d::ReduceOp::RedOpType t, cclRedOp_t* out) {
  using R = c10d::ReduceOp;
  switch (t) {
    case R::SUM: *out = cclSum; return true;
    case R::PRODUCT: *out = cclProd; return true;
    case R::MIN: *out = cclMin; return true;
    case R::MAX: *out = cclMax; return true;
    case R::AVG: *out = cclAvg; return true;
    case R::BAND: *out = cclBAnd; return true;
    case R::BOR: *out = cclBOr; return true;
    case R::BXOR: *out = cclBXor; return true;
    default: return false;
  }
}

Reduction reduction(const char* name, const c10d::ReduceOp& r) {
  Reduction out{cclSum};
  if (r.op_ == c10d::ReduceOp::PREMUL_SUM) {
    auto* s = dynamic_cast<c10d::PreMulSumSupplement*>(r.supplement_.get());
    TORCH_CHECK(s != nullptr, "invalid argument: ", name, ": PREMUL_SUM without a factor");
    out.scaled = true;
    out.factor = s->tensor_factor.defined() ? s->tensor_factor.item<double>() : s->double_factor;
    return out;
  }
  if (!nativeOp(r.op_, &out.op))
    invalid(name, c10::str("reduce op ", static_cast<int>(r.op_), " is not supported by ccl"));
  return out;
}

// A contiguous tensor as a buffer the library reduces: booleans travel as uint8 (torch sums
// booleans as a logical or and multiplies them as an and), complex numbers as pairs of reals.
struct Reducible {
  at::Tensor buf;
  size_t count;
  cclDataType_t dt;
  cclRedOp_t op;
};

Reducible reducible(const char* name, const at::Tensor& t, cclRedOp_t op) {
  if (t.scalar_type() == at::kBool) {
    cclRedOp_t m;
    switch (op) {
      case cclSum: case cclMax: m = cclMax; break;
      case cclProd: case cclMin: m = cclMin; break;
      case cclBAnd: case cclBOr: case cclBXor: m = op; break;
      default: invalid(name, c10::str("reduce op ", opName(op), " on a bool tensor"));
    }
    return {t.view(at::kByte), static_cast<size_t>(t.numel()), cclUint8, m};
  }
  if (t.is_complex()) {
    if (op != cclSum && op != cclAvg)
      invalid(name, c10::str("complex tensors reduce with sum or avg only, not ", opName(op)));
    auto r = at::view_as_real(t);
    cclDataType_t dt;
    TORCH_CHECK(nativeType(r.scalar_type(), &dt), "invalid argument: ", name,
                ": complex tensors of dtype ", t.scalar_type(), " cannot be reduced by ccl");
    return {r, static_cast<size_t>(r.numel()), dt, op};
  }
  cclDataType_t dt;
  if (!nativeType(t.scalar_type(), &dt))
    invalid(name, c10::str("tensors of dtype ", t.scalar_type(),
                           " cannot be reduced by ccl (supported: int8, uint8, int32, uint32, "
                           "int64, uint64, float16, bfloat16, float32, float64, bool, complex)"));
  return {t, static_cast<size_t>(t.numel()), dt, op};
}

// Byte counts and displacements of tensors packed back to back.
std::vector<size_t> sizesOf(const std::vector<at::Tensor>& ts) {
  std::vector<size_t> out;
  out.reserve(ts.size());
  for (auto& t : ts) out.push_back(nbytes(t));
  return out;
}

std::vector<size_t> displsOf(const std::vector<size_t>& sizes) {
  std::vector<size_t> d(sizes.size());
  size_t off = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    d[i] = off;
    off += sizes[i];
  }
  return d;
}

// The tensors' bytes back to back in one new buffer.
at::Tensor pack(const std::vector<at::Tensor>& ts) {
  auto sizes = sizesOf(ts);
  auto flat = at::empty({static_cast<int64_t>(std::accumulate(sizes.begin(), sizes.end(),
                                                              size_t{0}))},
                        at::kByte);
  size_t off = 0;
  for (size_t i = 0; i < ts.size(); ++i) {
    if (sizes[i] == 0) continue;
    auto c = ts[i].contiguous();
    flat.slice(0, off, off + sizes[i]).copy_(bytesOf(c));
    off += sizes[i];
  }
  return flat;
}

// Copies the blocks of `flat` (tensor i's bytes at displs[i]) into the tensors.
void unpack(const at::Tensor& flat, const std::vector<at::Tensor>& ts,
            const std::vector<size_t>& displs) {
  for (size_t i = 0; i < ts.size(); ++i) {
    size_t n = nbytes(ts[i]);
    if (n) fromBytes(ts[i], flat.slice(0, displs[i], displs[i] + n));
  }
}

}  // namespace

void loadLibrary(const std::string& path) {
  std::lock_guard<std::mutex> l(g_load);
  if (g_path == path) return;
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
  TORCH_CHECK(h != nullptr, "oxccl: cannot load ", path, ": ", dlerror());
  Api a;
#define CCL_LOOKUP(f)                                                   \
  a.f = reinterpret_cast<decltype(&::f)>(dlsym(h, #f));                 \
  TORCH_CHECK(a.f != nullptr, "oxccl: ", path, " has no ", #f,            \
              " (a library older than the torch backend built with it)");
  CCL_FUNCTIONS(CCL_LOOKUP)
#undef CCL_LOOKUP
  g = a;
  g_path = path;
}

cclComm_t CommState::live(const char* op) {
  std::lock_guard<std::mutex> l(m);
  if (comm != nullptr) return comm;
  TORCH_CHECK(false, "invalid usage: ccl ", op, ": the process group was ", gone);
}

// ---- Completer ---------------------------------------------------------------------------

void Completer::put(c10::intrusive_ptr<CclWork> work) {
  std::lock_guard<std::mutex> l(m_);
  queue_.push_back(std::move(work));
  if (!running_) {
    running_ = true;
    stopping_ = false;
    // Detached, holding the completer: a stop that gives up waiting leaves it to finish alone.
    std::thread([self = shared_from_this()] { self->loop(); }).detach();
  }
  cv_.notify_all();
}

void Completer::loop() {
  std::unique_lock<std::mutex> l(m_);
  for (;;) {
    cv_.wait(l, [&] { return !queue_.empty() || stopping_; });
    if (queue_.empty()) {
      running_ = false;
      cv_.notify_all();
      return;
    }
    auto w = std::move(queue_.front());
    queue_.pop_front();
    l.unlock();
    w->complete();
    w.reset();
    l.lock();
  }
}

void Completer::stop(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> l(m_);
  if (!running_) return;
  stopping_ = true;
  cv_.notify_all();
  cv_.wait_for(l, timeout, [&] { return !running_; });
}

// ---- CclWork -------------------------------------------------------------------------------

CclWork::CclWork(int rank, c10d::OpType type, uint64_t seq, const char* name,
                 std::vector<at::Tensor> result)
    : c10d::Work(rank, type),
      state_(kDone),
      name_(name),
      seq_(seq),
      result_(std::move(result)),
      inFlight_(false) {
  completed_ = true;
}

CclWork::CclWork(int rank, c10d::OpType type, uint64_t seq, const char* name, Drive drive,
                 std::vector<at::Tensor> result, std::shared_ptr<Completer> completer,
                 bool inFlight)
    : c10d::Work(rank, type),
      state_(kPending),
      name_(name),
      seq_(seq),
      drive_(std::move(drive)),
      result_(std::move(result)),
      completer_(std::move(completer)),
      inFlight_(inFlight) {}

CclWork::~CclWork() {
  // The library may still be writing into the buffers this work keeps alive: a work over
  // library requests dropped unwaited finishes first. A recorded send or receive stays
  // recorded (P2P keeps its tensor).
  if (inFlight_ && claim()) {
    try {
      complete();
    } catch (...) {  // NOLINT: never throw from a destructor
    }
  }
}

bool CclWork::claim() {
  int expected = kPending;
  return state_.compare_exchange_strong(expected, kClaimed);
}

void CclWork::complete() {
  std::exception_ptr err;
  try {
    drive_();
  } catch (...) {
    err = std::current_exception();
  }
  c10::intrusive_ptr<c10::ivalue::Future> fut;
  {
    std::lock_guard<std::mutex> l(mutex_);
    drive_ = nullptr;
    exception_ = err;
    completed_ = true;
    state_.store(kDone);
    fut = future_;
  }
  cv_.notify_all();
  if (fut) {
    if (err)
      fut->setError(err);
    else
      fut->markCompleted(c10::IValue(result_));
  }
}

bool CclWork::isCompleted() { return state_.load() == kDone; }

bool CclWork::isSuccess() const {
  std::lock_guard<std::mutex> l(mutex_);
  return completed_ && !exception_;
}

bool CclWork::wait(std::chrono::milliseconds timeout) {
  if (state_.load() != kDone) {
    if (timeout.count() <= 0) {
      if (claim()) {
        complete();
      } else {
        // Another thread completes it; the library's deadline bounds how long it can take.
        std::unique_lock<std::mutex> l(mutex_);
        cv_.wait(l, [&] { return completed_; });
      }
    } else {
      if (claim()) completer_->put(c10::intrusive_ptr<CclWork>::reclaim_copy(this));
      std::unique_lock<std::mutex> l(mutex_);
      TORCH_CHECK(cv_.wait_for(l, timeout, [&] { return completed_; }), "oxccl ", name_,
                  ": Timed out waiting ", timeout.count(),
                  "ms for the operation to complete (it goes on; the group's timeout ends it)");
    }
  }
  // torch registers works of collectives issued inside allow_inflight_collective_as_graph_input
  // (keyed by their tensors); the backend's wait takes them out again.
  if (c10d::allow_inflight_collective_as_graph_input())
    c10d::unregister_work(c10::intrusive_ptr<CclWork>::unsafe_reclaim_from_nonowning(this));
  std::lock_guard<std::mutex> l(mutex_);
  if (exception_) std::rethrow_exception(exception_);
  return true;
}

c10::intrusive_ptr<c10::ivalue::Future> CclWork::getFuture() {
  bool markNow = false, handOff = false;
  c10::intrusive_ptr<c10::ivalue::Future> fut;
  std::exception_ptr err;
  {
    std::lock_guard<std::mutex> l(mutex_);
    if (!future_) {
      future_ = c10::make_intrusive<c10::ivalue::Future>(
          c10::ListType::create(c10::TensorType::get()));
      if (state_.load() == kDone) {
        markNow = true;
        err = exception_;
      } else {
        handOff = claim();
      }
    }
    fut = future_;
  }
  if (markNow) {
    if (err)
      fut->setError(err);
    else
      fut->markCompleted(c10::IValue(result_));
  } else if (handOff) {
    completer_->put(c10::intrusive_ptr<CclWork>::reclaim_copy(this));
  }
  return fut;
}

c10::intrusive_ptr<c10::ivalue::Future> CclWork::getFutureResult() {
  auto out = c10::make_intrusive<c10::ivalue::Future>(c10::IntType::get());
  getFuture()->addCallback([out](c10::ivalue::Future& f) {
    auto r = c10d::WorkResult::SUCCESS;
    if (f.hasError()) {
      // The library's timeouts say so in their message ("... timeout (rank 0, peer 1) ...").
      r = f.tryRetrieveErrorMessage().find("timeout") != std::string::npos
              ? c10d::WorkResult::TIMEOUT
              : c10d::WorkResult::COMM_ERROR;
    }
    out->markCompleted(c10::IValue(static_cast<int64_t>(r)));
  });
  return out;
}

std::vector<at::Tensor> CclWork::result() {
  wait();
  return result_;
}

uint64_t CclWork::getSequencenumber() const { return seq_; }

int CclWork::sourceRank() const {
  TORCH_CHECK(source_, "sourceRank(): ", name_, " is not a receive");
  TORCH_CHECK(state_.load() == kDone, "sourceRank(): the receive has not completed; wait first");
  return source_();
}

// ---- P2P -----------------------------------------------------------------------------------

std::shared_ptr<Transfer> P2P::post(bool send, const at::Tensor& tensor, int peer, int tag) {
  const char* kind = send ? "send" : "recv";
  const bool any = !send && peer == kAnySource;
  TORCH_CHECK(any || (peer >= 0 && peer < state_->size), "invalid argument: ", kind, ": peer ",
              peer, " is out of range for ", state_->size, " ranks");
  auto t = std::make_shared<Transfer>();
  t->send = send;
  t->tensor = tensor;
  t->buf = tensor.is_contiguous() ? tensor : tensor.contiguous();
  t->peer = peer;
  t->tag = tag;
  t->tagbuf = at::full({1}, send ? static_cast<int64_t>(tag) : int64_t{-1}, at::kLong);
  std::lock_guard<std::recursive_mutex> l(m_);
  state_->live(kind);
  if (any) {
    // What follows belongs to the next group: it may repeat any peer.
    batch_.push_back(t);
    peers_.clear();
    return t;
  }
  if (peers_.count({send, peer})) flushLocked();
  batch_.push_back(t);
  peers_.insert({send, peer});
  return t;
}

void P2P::wait(const std::shared_ptr<Transfer>& t) {
  {
    std::lock_guard<std::recursive_mutex> l(m_);
    if (!t->done) flushLocked();
  }
  if (t->error) std::rethrow_exception(t->error);
}

bool P2P::pending() {
  std::lock_guard<std::recursive_mutex> l(m_);
  return !batch_.empty();
}

void P2P::flush() {
  std::lock_guard<std::recursive_mutex> l(m_);
  if (!batch_.empty()) flushLocked();
}

void P2P::cancel(const std::string& why) {
  std::lock_guard<std::recursive_mutex> l(m_);
  auto batch = std::move(batch_);
  batch_.clear();
  peers_.clear();
  for (auto& t : batch) {
    try {
      TORCH_CHECK(false, "invalid usage: ", t->send ? "send" : "recv", " with rank ", t->peer,
                  " never ran: the process group was ", why, " before it was waited on");
    } catch (...) {
      t->error = std::current_exception();
    }
    t->done = true;
  }
}

void P2P::flushLocked() {
  auto batch = std::move(batch_);
  batch_.clear();
  peers_.clear();
  // Groups between the receives from any source, in the order they were recorded.
  size_t first = 0;
  for (size_t i = 0; i <= batch.size(); ++i) {
    if (i < batch.size() && batch[i]->peer != kAnySource) continue;
    if (first < i) runGroup(batch, first, i);
    if (i < batch.size()) runGroup(batch, i, i + 1);
    first = i + 1;
  }
}

void P2P::runGroup(std::vector<std::shared_ptr<Transfer>>& batch, size_t first, size_t last) {
  std::exception_ptr err;
  try {
    cclComm_t c = state_->live("send/recv");
    // A receive from any source (alone in its group) takes the send the library finds.
    if (auto& head = *batch[first]; head.peer == kAnySource) {
      int peer = -1;
      size_t bytes = 0;
      check(g.cclProbe(&peer, &bytes, c), "recv from any source", state_->rank);
      head.peer = peer;
    }
    check(g.cclGroupStart(), "send/recv", state_->rank);
    // Every recorded call is followed by the group's end, also after a failed one: the
    // group belongs to this thread and must not stay open.
    cclResult_t failed = cclSuccess;
    std::string msg;
    auto note = [&](cclResult_t r) {
      if (r != cclSuccess && failed == cclSuccess) {
        failed = r;
        msg = lastError(r);
      }
    };
    for (size_t i = first; i < last; ++i) {
      auto& t = *batch[i];
      if (t.send) {
        note(g.cclSend(t.buf.data_ptr(), nbytes(t.buf), cclUint8, t.peer, c));
        note(g.cclSend(t.tagbuf.data_ptr(), 8, cclUint8, t.peer, c));
      } else {
        note(g.cclRecv(t.buf.data_ptr(), nbytes(t.buf), cclUint8, t.peer, c));
        note(g.cclRecv(t.tagbuf.data_ptr(), 8, cclUint8, t.peer, c));
      }
    }
    note(g.cclGroupEnd());
    TORCH_CHECK(failed == cclSuccess, "oxccl send/recv failed on rank ", state_->rank, ": ", msg);
  } catch (...) {
    err = std::current_exception();
  }
  for (size_t i = first; i < last; ++i) {
    auto& t = *batch[i];
    if (err) {
      t.error = err;
    } else if (!t.send) {
      int64_t got = t.tagbuf.item<int64_t>();
      if (got != t.tag) {
        try {
          TORCH_CHECK(false, "invalid argument: recv from rank ", t.peer, " with tag ", t.tag,
                      " got the message sent with tag ", got,
                      ": ccl matches the messages between two ranks in the order they are "
                      "posted, so the n-th send's tag must be the n-th receive's");
        } catch (...) {
          t.error = std::current_exception();
        }
      } else if (!t.buf.is_same(t.tensor)) {
        t.tensor.copy_(t.buf);
      }
    }
    t.done = true;
  }
}

// ---- ProcessGroupOxccl: lifetime -------------------------------------------------------------

namespace {

// Joins a new communicator: rank 0 makes the unique id and puts it in the group's store, so
// whatever rendezvous torch uses carries the library's too. The group's timeout becomes the
// communicator's deadline: every operation of the group fails when it goes that long without
// progress.
cclComm_t joinComm(c10d::Store& store, int rank, int size, std::chrono::milliseconds timeout) {
  TORCH_CHECK(!g_path.empty(), "oxccl: the torch backend's library is not loaded");
  static const std::string kUidKey = "oxccl/unique_id";
  cclUniqueId uid;
  if (rank == 0) {
    check(g.cclGetUniqueId(&uid), "init", rank);
    store.set(kUidKey, std::vector<uint8_t>(uid.internal, uid.internal + sizeof uid.internal));
  } else {
    auto v = store.get(kUidKey);
    TORCH_CHECK(v.size() == sizeof uid.internal, "oxccl: the store's unique id has ", v.size(),
                " bytes, not ", sizeof uid.internal, " (another backend wrote ", kUidKey, "?)");
    std::memcpy(uid.internal, v.data(), v.size());
  }
  cclConfig_t cfg = CCL_CONFIG_INITIALIZER;
  cfg.timeoutMs = static_cast<int>(std::clamp<int64_t>(timeout.count(), 1, INT_MAX));
  cclComm_t comm = nullptr;
  check(g.cclCommInitRankConfig(&comm, size, uid, rank, &cfg), "init", rank);
  return comm;
}

}  // namespace

ProcessGroupOxccl::ProcessGroupOxccl(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                     int size, std::chrono::milliseconds timeout,
                                     bool enableReconfigure)
    : ProcessGroupOxccl(store, rank, size, timeout,
                        enableReconfigure ? nullptr : joinComm(*store, rank, size, timeout)) {
  if (enableReconfigure)
    state_->gone = "made with enable_reconfigure=True and has no communicator until "
                   "dist._reconfigure";
}

ProcessGroupOxccl::ProcessGroupOxccl(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                 int size, std::chrono::milliseconds timeout, cclComm_t comm)
    : c10d::Backend(rank, size),
      state_(std::make_shared<CommState>()),
      completer_(std::make_shared<Completer>()),
      p2p_(std::make_shared<P2P>(state_)),
      store_(store),
      timeout_(timeout) {
  state_->comm = comm;
  state_->rank = rank;
  state_->size = size;
}

c10::intrusive_ptr<c10d::Backend> ProcessGroupOxccl::split(
    const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
    const c10::intrusive_ptr<Options>& opts) {
  auto it = std::find(ranks.begin(), ranks.end(), getRank());
  const bool member = it != ranks.end();
  // Members of one new group share its smallest rank as the color; their order in `ranks`
  // is their order in it.
  const int color = member ? *std::min_element(ranks.begin(), ranks.end()) : CCL_SPLIT_NOCOLOR;
  const int key = member ? static_cast<int>(it - ranks.begin()) : 0;
  cclComm_t comm = state_->live("split");
  p2p_->flush();
  cclComm_t child = nullptr;
  check(g.cclCommSplit(comm, color, key, &child, nullptr), "split", rank_);
  if (!member || child == nullptr) return nullptr;
  auto timeout = opts ? opts->timeout : timeout_;
  return c10::make_intrusive<ProcessGroupOxccl>(store, key, static_cast<int>(ranks.size()),
                                              timeout, child);
}

ProcessGroupOxccl::~ProcessGroupOxccl() {
  try {
    release("shut down", false);
  } catch (...) {  // NOLINT: never throw from a destructor
  }
}

void ProcessGroupOxccl::release(const char* why, bool abort) {
  p2p_->cancel(why);
  cclComm_t c;
  {
    std::lock_guard<std::mutex> l(state_->m);
    c = state_->comm;
    state_->comm = nullptr;
    if (state_->gone.empty()) state_->gone = why;
  }
  if (c != nullptr) {
    if (abort)
      g.cclCommAbort(c);
    else
      g.cclCommDestroy(c);
  }
  completer_->stop(abort ? std::chrono::milliseconds(60000) : timeout_);
}

void ProcessGroupOxccl::abort() {
  runAbortHooks();
  release("aborted", true);
}

void ProcessGroupOxccl::runAbortHooks() {
  std::vector<std::pair<int64_t, std::function<void()>>> hooks;
  {
    std::lock_guard<std::mutex> l(hooksM_);
    hooks = abortHooks_;
  }
  for (auto& [id, hook] : hooks) {
    try {
      hook();
    } catch (const std::exception& e) {
      TORCH_WARN("oxccl: abort hook ", id, " failed: ", e.what());
    }
  }
}

#ifdef C10D_BACKEND_HAS_HOOKS
void ProcessGroupOxccl::registerAbortHook(int64_t hookId, c10d::AbortHook hook) {
  std::lock_guard<std::mutex> l(hooksM_);
  for (auto& h : abortHooks_)
    if (h.first == hookId) {
      h.second = std::move(hook);
      return;
    }
  abortHooks_.emplace_back(hookId, std::move(hook));
}

void ProcessGroupOxccl::unregisterAbortHook(int64_t hookId) {
  std::lock_guard<std::mutex> l(hooksM_);
  abortHooks_.erase(std::remove_if(abortHooks_.begin(), abortHooks_.end(),
                                   [&](const auto& h) { return h.first == hookId; }),
                    abortHooks_.end());
}
#endif

#ifdef C10D_BACKEND_HAS_RECONFIGURE
namespace {
constexpr const char* kHandlePrefix = "oxccl-uid:";

std::string handleOf(const cclUniqueId& uid) {
  static const char* hex = "0123456789abcdef";
  std::string s = kHandlePrefix;
  for (unsigned char c : uid.internal) {
    s += hex[c >> 4];
    s += hex[c & 15];
  }
  return s;
}

cclUniqueId uidOf(const std::string& handle) {
  cclUniqueId uid;
  const size_t n = std::strlen(kHandlePrefix);
  TORCH_CHECK(handle.size() == n + 2 * sizeof uid.internal && handle.compare(0, n, kHandlePrefix) == 0,
              "invalid argument: reconfigure: \"", handle.substr(0, 40),
              "\" is not a reconfigure handle of the oxccl backend");
  auto nibble = [&](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    TORCH_CHECK(false, "invalid argument: reconfigure: handle has a non-hex character '", c, "'");
  };
  for (size_t i = 0; i < sizeof uid.internal; ++i)
    uid.internal[i] = static_cast<char>(nibble(handle[n + 2 * i]) * 16 + nibble(handle[n + 2 * i + 1]));
  return uid;
}
}  // namespace

c10::intrusive_ptr<c10d::Backend> ProcessGroupOxccl::shrink(
    const std::vector<int64_t>& ranksToExclude, int shrinkFlags,
    const c10::intrusive_ptr<Options>& optsOverride) {
  cclComm_t comm = state_->live("shrink");
  std::vector<int> exclude;
  for (auto r : ranksToExclude) {
    TORCH_CHECK(r >= 0 && r < size_, "invalid argument: shrink: rank ", r, " is not a rank of this ",
                size_, "-rank group");
    exclude.push_back(static_cast<int>(r));
  }
  if (shrinkFlags & 1) {  // SHRINK_ABORT: end what is pending here and on every rank now
    runAbortHooks();
    p2p_->cancel("revoked by a shrink (SHRINK_ABORT)");
    g.cclCommRevoke(comm, 0);  // already revoked or failed: the shrink below says why, if at all
  } else {
    p2p_->cancel("ended by a shrink");
  }
  cclComm_t child = nullptr;
  check(g.cclCommShrink(comm, exclude.data(), static_cast<int>(exclude.size()), &child, nullptr, 0),
        "shrink", rank_);
  int rank = 0, size = 0;
  // The survivors are numbered densely in their old order; the library knows which survived.
  check(g.cclCommUserRank(child, &rank), "shrink", rank_);
  check(g.cclCommCount(child, &size), "shrink", rank_);
  auto timeout = optsOverride ? optsOverride->timeout : timeout_;
  // The survivors share this group's store; the keys of the new group's own store use (its
  // monitored barriers) start again from 1, so they go under a prefix of their own.
  auto store = c10::make_intrusive<c10d::PrefixStore>(c10::str("oxccl/shrunk", ++shrinks_), store_);
  return c10::make_intrusive<ProcessGroupOxccl>(store, rank, size, timeout, child);
}

c10d::ReconfigureHandle ProcessGroupOxccl::get_reconfigure_handle() const {
  std::lock_guard<std::mutex> l(handleM_);
  if (handle_.empty()) {
    TORCH_CHECK(!g_path.empty(), "oxccl: the torch backend's library is not loaded");
    cclUniqueId uid;
    check(g.cclGetUniqueId(&uid), "get_reconfigure_handle", rank_);
    handle_ = handleOf(uid);
  }
  return handle_;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupOxccl::reconfigure(const c10d::ReconfigureOptions& opts) {
  std::vector<std::string> handles;
  if (auto* v = std::get_if<std::vector<c10d::ReconfigureHandle>>(&opts.handles)) {
    handles = *v;
  } else {
    auto& set = std::get<std::unordered_set<c10d::ReconfigureHandle>>(opts.handles);
    handles.assign(set.begin(), set.end());
    std::sort(handles.begin(), handles.end());
  }
  TORCH_CHECK(!handles.empty(), "invalid argument: reconfigure: no handles");
  for (const auto& h : handles) (void)uidOf(h);  // every one well formed, before anything runs
  const std::string mine = get_reconfigure_handle();
  auto it = std::find(handles.begin(), handles.end(), mine);
  TORCH_CHECK(it != handles.end(), "invalid argument: reconfigure: this process's handle is not "
              "among the ", handles.size(), " handles (each member passes every member's "
              "dist._get_reconfigure_handle(), its own included)");
  TORCH_CHECK(std::count(handles.begin(), handles.end(), mine) == 1,
              "invalid argument: reconfigure: this process's handle appears twice");
  const int rank = static_cast<int>(it - handles.begin());
  const int size = static_cast<int>(handles.size());
  const cclUniqueId uid = uidOf(handles[0]);
  auto timeout = opts.timeout.value_or(timeout_);
  cclConfig_t cfg = CCL_CONFIG_INITIALIZER;
  cfg.timeoutMs = static_cast<int>(std::clamp<int64_t>(timeout.count(), 1, INT_MAX));
  cclComm_t comm = nullptr;
  {
    // torch calls this without the GIL (as every backend call).
    cclResult_t init = g.cclCommInitRankConfig(&comm, size, uid, rank, &cfg);
    {
      // The first handle's rendezvous has served (or failed) this attempt: every member asks
      // for a new handle before the next one.
      std::lock_guard<std::mutex> l(handleM_);
      handle_.clear();
    }
    check(init, "reconfigure", rank);
    // Every member must mean the same reconfiguration: the largest uuid and the largest negated
    // one are this rank's own only when all agree.
    int64_t both[2] = {opts.uuid, -opts.uuid};
    cclResult_t r = g.cclAllReduce(both, both, 2, cclInt64, cclMax, comm);
    if (r != cclSuccess) {
      std::string msg = lastError(r);
      g.cclCommAbort(comm);
      TORCH_CHECK(false, "oxccl reconfigure failed on rank ", rank, ": ", msg);
    }
    if (both[0] != opts.uuid || -both[1] != opts.uuid) {
      g.cclCommDestroy(comm);
      TORCH_CHECK(false, "invalid argument: reconfigure: the members passed different uuids (",
                  opts.uuid, " here; others between ", -both[1], " and ", both[0], ")");
    }
  }
  p2p_->cancel("replaced by a reconfigure");
  cclComm_t old;
  {
    std::lock_guard<std::mutex> l(state_->m);
    old = state_->comm;
    state_->comm = comm;
    state_->rank = rank;
    state_->size = size;
    state_->gone.clear();
  }
  if (old != nullptr) g.cclCommAbort(old);
  rank_ = rank;
  size_ = size;
  seq_ = 0;
  return done("reconfigure", c10d::OpType::UNKNOWN, {});
}
#endif

void ProcessGroupOxccl::shutdown() { release("shut down", false); }

uintptr_t ProcessGroupOxccl::commHandle() {
  std::lock_guard<std::mutex> l(state_->m);
  return reinterpret_cast<uintptr_t>(state_->comm);
}

c10::intrusive_ptr<c10d::Backend::Options> ProcessGroupOxccl::getBackendOptions() {
  return c10::make_intrusive<Options>("oxccl", timeout_);
}

void ProcessGroupOxccl::setTimeout(std::chrono::milliseconds timeout) {
  // The communicator's deadline is fixed when it connects; a new one applies to what this
  // backend waits for itself (monitored barriers).
  timeout_ = timeout;
}

[[noreturn]] void ProcessGroupOxccl::fail(const char* name, cclResult_t r) { raise(name, rank_, r); }

// ---- The one path every operation takes ----------------------------------------------------

c10::intrusive_ptr<c10d::Work> ProcessGroupOxccl::done(const char* name, c10d::OpType type,
                                                     std::vector<at::Tensor> result) {
  return record(c10::make_intrusive<CclWork>(rank_, type, seq_, name, std::move(result)));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupOxccl::record(c10::intrusive_ptr<c10d::Work> work) {
  if (coalescing_) coalesced_.push_back(work);
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupOxccl::run(const char* name, c10d::OpType type,
                                                    bool async, std::vector<Call> calls,
                                                    std::function<void()> finish,
                                                    std::vector<at::Tensor> result) {
  cclComm_t comm = state_->live(name);
  p2p_->flush();
  ++seq_;
  if (!async && !coalescing_) {
    for (auto& c : calls) c(comm, false);
    if (finish) finish();
    return done(name, type, std::move(result));
  }
  std::vector<cclRequest_t> reqs;
  try {
    for (auto& c : calls)
      if (auto* r = c(comm, true)) reqs.push_back(r);
  } catch (...) {
    // Calls already issued use the buffers: they finish before the error goes up.
    try {
      waitAll(reqs, name, rank_);
    } catch (...) {  // NOLINT: the first error is the one reported
    }
    throw;
  }
  // The calls keep their buffers (stand-ins, packed copies) alive until the work is done.
  Drive drive = [reqs = std::move(reqs), calls = std::move(calls), finish = std::move(finish),
                 name, rank = rank_] {
    waitAll(reqs, name, rank);
    if (finish) finish();
  };
  return record(c10::make_intrusive<CclWork>(rank_, type, seq_, name, std::move(drive),
                                             std::move(result), completer_, true));
}

void ProcessGroupOxccl::startCoalescing() {
  TORCH_CHECK(!coalescing_, "invalid usage: ccl: startCoalescing while already coalescing");
  coalescing_ = true;
  coalesced_.clear();
}

c10::intrusive_ptr<c10d::Work> ProcessGroupOxccl::endCoalescing() {
  TORCH_CHECK(coalescing_, "invalid usage: ccl: endCoalescing without startCoalescing");
  coalescing_ = false;
  auto works = std::move(coalesced_);
  coalesced_.clear();
  // The block's sends and receives run as one group now, not when first waited on.
  std::exception_ptr early;
  try {
    p2p_->flush();
  } catch (...) {
    early = std::current_exception();
  }
  std::vector<at::Tensor> result;
  Drive drive = [works, early] {
    if (early) std::rethrow_exception(early);
    for (auto& w : works) w->wait();
  };
  return c10::make_intrusive<CclWork>(rank_, c10d::OpType::COALESCED, seq_, "coalesced",
                                      std::move(drive), std::move(result), completer_, true);
}

// ---- Reductions ----------------------------------------------------------------------------

c10::intrusive_ptr<c10d::Work> ProcessGroupOxccl::allreduce(std::vector<at::Tensor>& tensors,
                                                          const c10d::AllreduceOptions& opts) {
  // The common case without the general path's bookkeeping: one contiguous tensor of a type
  // the library reduces natively, an op it has.
  cclDataType_t dt;
  cclRedOp_t op;
  if (tensors.size() == 1 && tensors[0].layout() == at::kStrided && tensors[0].is_contiguous() &&
      nativeType(tensors[0].scalar_type(), &dt) && nativeOp(opts.reduceOp.op_, &op)) {
    auto& t = tensors[0];
    cclComm_t comm = state_->live("allreduce");
    if (p2p_->pending()) p2p_->flush();
    ++seq_;
    void* p = t.data_ptr();
    size_t n = static_cast<size_t>(t.numel());
    if (!opts.asyncOp && !coalescing_) {
      check(g.cclAllReduce(p, p, n, dt, op, comm), "allreduce", rank_);
      return done("allreduce", c10d::OpType::ALLREDUCE, tensors);
    }
    cclRequest_t req = nullptr;
    check(g.cclAllReduceAsync(p, p, n, dt, op, comm, &req), "allreduce", rank_);
    Drive drive = [req, rank = rank_] { waitAll({req}, "allreduce", rank); };
    return record(c10::make_intrusive<CclWork>(rank_, c10d::OpType::ALLREDUCE, seq_,
                                               "allreduce", std::move(drive), tensors,
                                               completer_, true));
  }
  for (auto& t : tensors)
    if (t.is_sparse()) return allreduce_sparse(tensors, opts);
  auto red = reduction("allreduce", opts.reduceOp);
  std::vector<Call> calls;
  std::vector<Out> outs;
  for (auto& t : tensors) {
    Out o(t);
    auto r = reducible("allreduce", o.c, red.op);
    if (red.scaled) r.buf.mul_(red.factor);
    calls.push_back([r, rank = rank_](cclComm_t c, bool async) -> cclRequest_t {
      void* p = r.buf.data_ptr();
      if (!async) {
        check(g.cclAllReduce(p, p, r.count, r.dt, r.op, c), "allreduce", rank);
        return nullptr;
      }
      cclRequest_t q = nullptr;
      check(g.cclAllReduceAsync(p, p, r.count, r.dt, r.op, c, &q), "allreduce", rank);
      return q;
    });
    outs.push_back(o);
  }
  return run("allreduce", c10d::OpType::ALLREDUCE, opts.asyncOp, std::move(calls),
             copyBack(std::move(outs)), tensors);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupOxccl::allreduce_sparse(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  // Sum of sparse COO tensors: every rank's indices and values gathered, then summed
  // (coalesced) in rank order on every rank, so all ranks get the same tensor.
  auto red = reduction("allreduce", opts.reduceOp);
  TORCH_CHECK_NOT_IMPLEMENTED(tensors.size() == 1 && red.op == cclSum && !red.scaled,
                              "oxccl backend: allreduce: sparse tensors reduce one at a time, "
                              "with sum only");
  cclComm_t comm = state_->live("allreduce");
  p2p_->flush();
  ++seq_;
  auto& t = tensors[0];
  auto s = t.coalesce();
  auto idx = s._indices().contiguous();
  auto val = s._values().contiguous();
  auto nnz = at::full({1}, idx.size(1), at::kLong);
  auto counts = at::empty({getSize()}, at::kLong);
  check(g.cclAllGather(nnz.data_ptr(), counts.data_ptr(), 8, cclUint8, comm), "allreduce",
        rank_);
  const int64_t sparseDims = idx.size(0);
  const size_t rowBytes = val.size(0) ? nbytes(val) / val.size(0) : 0;
  std::vector<size_t> idxBytes, valBytes;
  int64_t total = 0;
  for (int r = 0; r < getSize(); ++r) {
    int64_t k = counts[r].item<int64_t>();
    idxBytes.push_back(static_cast<size_t>(k * sparseDims) * idx.element_size());
    valBytes.push_back(static_cast<size_t>(k) * rowBytes);
    total += k;
  }
  auto gather = [&](const at::Tensor& src, const std::vector<size_t>& sizes) {
    auto displs = displsOf(sizes);
    auto flat = at::empty({static_cast<int64_t>(displs.back() + sizes.back())}, at::kByte);
    cclRequest_t q = nullptr;
    check(g.cclAllGatherVAsync(src.data_ptr(), flat.data_ptr(), sizes.data(), displs.data(),
                               cclUint8, comm, &q),
          "allreduce", rank_);
    waitAll({q}, "allreduce", rank_);
    return flat;
  };
  auto idxFlat = gather(idx, idxBytes);
  auto valFlat = gather(val, valBytes);
  // Rank r's indices are a (sparseDims x k_r) block: side by side they make the whole.
  std::vector<at::Tensor> blocks;
  size_t off = 0;
  for (int r = 0; r < getSize(); ++r) {
    int64_t k = counts[r].item<int64_t>();
    blocks.push_back(idxFlat.slice(0, off, off + idxBytes[r]).view(idx.scalar_type())
                         .view({sparseDims, k}));
    off += idxBytes[r];
  }
  auto valShape = val.sizes().vec();
  valShape[0] = total;
  auto vals = valFlat.view(val.scalar_type()).view(valShape);
  auto sum = at::sparse_coo_tensor(at::cat(blocks, 1), vals, s.sizes()).coalesce();
  t.copy_(sum);
  return done("allreduce", c10d::OpType::ALLREDUCE, tensors);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupOxccl::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  auto red = reduction("allreduce_coalesced", opts.reduceOp);
  if (tensors.empty()) return done("allreduce_coalesced", c10d::OpType::ALLREDUCE, {});
  for (auto& t : tensors)
    if (t.scalar_type() != tensors[0].scalar_type())
      invalid("allreduce_coalesced", "the tensors have different dtypes");
  // One library call for all of them: flattened into one buffer, copied back after.
  std::vector<at::Tensor> flats;
  for (auto& t : tensors) flats.push_back(t.reshape(-1));
  auto flat = at::cat(flats);
  auto r = reducible("allreduce_coalesced", flat, red.op);
  if (red.scaled) r.buf.mul_(red.factor);
  Call call = [r, rank = rank_](cclComm_t c, bool async) -> cclRequest_t {
    void* p = r.buf.data_ptr();
    if (!async) {
      check(g.cclAllReduce(p, p, r.count, r.dt, r.op, c), "allreduce_coalesced", rank);
      return nullptr;
    }
    cclRequest_t q = nullptr;
    check(g.cclAllReduceAsync(p, p, r.count, r.dt, r.op, c, &q), "allreduce_coalesced", rank);
    return q;
  };
  auto finish = [tensors, flat] {
    int64_t off = 0;
    for (auto& t : tensors) {
      int64_t n = t.numel();
      t.copy_(flat.slice(0, off, off + n).view(t.sizes()));
      off += n;
    }
  };
  return run("allreduce_coalesced", c10d::OpType::ALLREDUCE_COALESCED, opts.asyncOp, {call},
             finish, tensors);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupOxccl::reduce(std::vector<at::Tensor>& tensors,
                                                       const c10d::ReduceOptions& opts) {
  auto red = reduction("reduce", opts.reduceOp);
  int root = static_cast<int>(opts.rootRank);
  std::vector<Call> calls;
  std::vector<Out> outs;
  for (auto& t : tensors) {
    Out o(t);
    auto r = reducible("reduce", o.c, red.op);
    // Scaled into a copy: ranks other than the root keep their tensor.
    at::Tensor src = red.scaled ? r.buf * red.factor : r.buf;
    calls.push_back([r, src, root, rank = rank_](cclComm_t c, bool async) -> cclRequest_t {
      void* p = r.buf.data_ptr();
      const void* s = src.data_ptr();
      if (!async) {
        check(g.cclReduce(s, p, r.count, r.dt, r.op, root, c), "reduce", rank);
        return nullptr;
      }
      cclRequest_t q = nullptr;
      check(g.cclReduceAsync(s, p, r.count, r.dt, r.op, root, c, &q), "reduce", rank);
      return q;
    });
    outs.push_back(o);
  }
  return run("reduce", c10d::OpType::REDUCE, opts.asyncOp, std::move(calls),
             copyBack(std::move(outs)), tensors);
}


namespace {

// One reduce-scatter: `in` (contiguous, every rank's blocks back to back) into `out`
// (contiguous), `counts[k]` elements of the reduced type for rank k.
Reducible scaledInput(const char* name, at::Tensor in, const Reduction& red) {
  auto r = reducible(name, in, red.op);
  if (red.scaled) r.buf = r.buf * red.factor;  // a copy: the caller's input stays as it was
  return r;
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupOxccl::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  const char* name = "reduce_scatter";
  auto red = reduction(name, opts.reduceOp);
  if (outputs.size() != inputs.size())
    invalid(name, c10::str(outputs.size(), " outputs and ", inputs.size(), " input lists"));
  std::vector<Call> calls;
  std::vector<Out> outs;
  for (size_t i = 0; i < outputs.size(); ++i) {
    auto& ins = inputs[i];
    if (static_cast<int>(ins.size()) != getSize())
      invalid(name, c10::str(ins.size(), " inputs for ", getSize(), " ranks"));
    for (auto& x : ins)
      if (x.scalar_type() != outputs[i].scalar_type())
        invalid(name, "the inputs' dtype differs from the output's");
    // torch lets the inputs of a list differ in size (input k is rank k's block), which the
    // library's v-form takes; complex numbers count as two reals.
    const size_t per = outputs[i].is_complex() ? 2 : 1;
    std::vector<size_t> counts;
    std::vector<at::Tensor> flats;
    for (auto& x : ins) {
      counts.push_back(static_cast<size_t>(x.numel()) * per);
      flats.push_back(x.reshape(-1));
    }
    if (ins[getRank()].numel() != outputs[i].numel())
      invalid(name, c10::str("the output has ", outputs[i].numel(), " elements, input ",
                             getRank(), " (this rank's block) has ", ins[getRank()].numel()));
    Out o(outputs[i]);
    auto rin = reducible(name, at::cat(flats), red.op);  // a new tensor: scaled in place
    if (red.scaled) rin.buf.mul_(red.factor);
    auto rout = reducible(name, o.c, red.op);
    calls.push_back([rin, rout, counts, rank = rank_](cclComm_t c, bool async) {
      cclRequest_t q = nullptr;
      check(g.cclReduceScatterVAsync(rin.buf.data_ptr(), rout.buf.data_ptr(), counts.data(),
                                     rin.dt, rin.op, c, &q),
            "reduce_scatter", rank);
      return settle(q, async, "reduce_scatter", rank);
    });
    outs.push_back(o);
  }
  return run(name, c10d::OpType::REDUCE_SCATTER, opts.asyncOp, std::move(calls),
             copyBack(std::move(outs)), outputs);
}

namespace {

// The library call of one reduce-scatter of a tensor (`in`: size x `out`).
std::function<cclRequest_t(cclComm_t, bool)> reduceScatterCall(const char* name, int size,
                                                               int rank, const at::Tensor& out,
                                                               const at::Tensor& in,
                                                               const Reduction& red) {
  if (nbytes(in) != static_cast<size_t>(size) * nbytes(out) ||
      in.scalar_type() != out.scalar_type())
    invalid(name, c10::str("the input has ", in.numel(), " elements of ", in.scalar_type(), ", ",
                           size, " ranks x ", out.numel(), " of ", out.scalar_type(), " need ",
                           size * out.numel()));
  auto rin = scaledInput(name, in.contiguous(), red);
  auto rout = reducible(name, out, red.op);
  return [rin, rout, name, rank](cclComm_t c, bool async) {
    cclRequest_t q = nullptr;
    check(g.cclReduceScatterAsync(rin.buf.data_ptr(), rout.buf.data_ptr(), rout.count, rin.dt,
                                  rin.op, c, &q),
          name, rank);
    return settle(q, async, name, rank);
  };
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupOxccl::reduce_scatter_single(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  const char* name = "reduce_scatter_tensor";
  auto red = reduction(name, opts.reduceOp);
  Out o(output);
  auto call = reduceScatterCall(name, getSize(), rank_, o.c, input, red);
  return run(name, c10d::OpType::_REDUCE_SCATTER_BASE, opts.asyncOp, {call}, copyBack({o}),
             {output});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupOxccl::reduce_scatter_single_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  const char* name = "reduce_scatter_tensor_coalesced";
  auto red = reduction(name, opts.reduceOp);
  if (outputs.size() != inputs.size())
    invalid(name, c10::str(outputs.size(), " outputs and ", inputs.size(), " inputs"));
  std::vector<Call> calls;
  std::vector<Out> outs;
  for (size_t i = 0; i < outputs.size(); ++i) {
    Out o(outputs[i]);
    calls.push_back(reduceScatterCall(name, getSize(), rank_, o.c, inputs[i], red));
    outs.push_back(o);
  }
  return run(name, c10d::OpType::COALESCED, opts.asyncOp, std::move(calls),
             copyBack(std::move(outs)), outputs);
}

// ---- Data movement -------------------------------------------------------------------------

c10::intrusive_ptr<c10d::Work> ProcessGroupOxccl::broadcast(std::vector<at::Tensor>& tensors,
                                                          const c10d::BroadcastOptions& opts) {
  int root = static_cast<int>(opts.rootRank);
  std::vector<Call> calls;
  std::vector<Out> outs;
  for (auto& t : tensors) {
    Out o(t);
    at::Tensor b = o.c;
    calls.push_back([b, root, rank = rank_](cclComm_t c, bool async) -> cclRequest_t {
      void* p = b.data_ptr();
      if (!async) {
        check(g.cclBroadcast(p, p, nbytes(b), cclUint8, root, c), "broadcast", rank);
        return nullptr;
      }
      cclRequest_t q = nullptr;
      check(g.cclBroadcastAsync(p, p, nbytes(b), cclUint8, root, c, &q), "broadcast", rank);
      return q;
    });
    outs.push_back(o);
  }
  return run("broadcast", c10d::OpType::BROADCAST, opts.asyncOp, std::move(calls),
             copyBack(std::move(outs)), tensors);
}

namespace {

// All-gather of `src` into `flat` (size x src's bytes).
std::function<cclRequest_t(cclComm_t, bool)> allGatherCall(const char* name, int rank,
                                                           at::Tensor src, at::Tensor flat) {
  return [src, flat, name, rank](cclComm_t c, bool async) -> cclRequest_t {
    if (!async) {
      check(g.cclAllGather(src.data_ptr(), flat.data_ptr(), nbytes(src), cclUint8, c), name,
            rank);
      return nullptr;
    }
    cclRequest_t q = nullptr;
    check(g.cclAllGatherAsync(src.data_ptr(), flat.data_ptr(), nbytes(src), cclUint8, c, &q),
          name, rank);
    return q;
  };
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupOxccl::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  const char* name = "allgather";
  if (outputs.size() != inputs.size())
    invalid(name, c10::str(outputs.size(), " output lists and ", inputs.size(), " inputs"));
  std::vector<Call> calls;
  std::vector<std::function<void()>> finishes;
  for (size_t i = 0; i < inputs.size(); ++i) {
    auto outs = outputs[i];
    if (static_cast<int>(outs.size()) != getSize())
      invalid(name, c10::str(outs.size(), " outputs for ", getSize(), " ranks"));
    auto src = inputs[i].contiguous();
    auto sizes = sizesOf(outs);
    auto displs = displsOf(sizes);
    auto flat = at::empty({static_cast<int64_t>(displs.back() + sizes.back())}, at::kByte);
    bool even = std::all_of(sizes.begin(), sizes.end(), [&](size_t s) { return s == nbytes(src); });
    if (even) {
      calls.push_back(allGatherCall(name, rank_, src, flat));
    } else {
      // Per-rank sizes: the library's v-form.
      calls.push_back([src, flat, sizes, displs, rank = rank_](cclComm_t c, bool async) {
        cclRequest_t q = nullptr;
        check(g.cclAllGatherVAsync(src.data_ptr(), flat.data_ptr(), sizes.data(), displs.data(),
                                   cclUint8, c, &q),
              "allgather", rank);
        return settle(q, async, "allgather", rank);
      });
    }
    finishes.push_back([flat, outs, displs] { unpack(flat, outs, displs); });
  }
  auto finish = [finishes] {
    for (auto& f : finishes) f();
  };
  std::vector<at::Tensor> result;
  for (auto& l : outputs) result.insert(result.end(), l.begin(), l.end());
  return run(name, c10d::OpType::ALLGATHER, opts.asyncOp, std::move(calls), finish,
             std::move(result));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupOxccl::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputLists, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  // c10d's layout: outputLists[r][j] receives input j of rank r. One library call: the
  // inputs' bytes back to back, gathered, then copied out.
  const char* name = "allgather_coalesced";
  if (static_cast<int>(outputLists.size()) != getSize())
    invalid(name, c10::str(outputLists.size(), " output lists for ", getSize(), " ranks"));
  auto sizes = sizesOf(inputs);
  for (size_t r = 0; r < outputLists.size(); ++r)
    if (sizesOf(outputLists[r]) != sizes)
      invalid(name, c10::str("output list ", r, " does not match the inputs' sizes"));
  std::vector<at::Tensor> result;
  for (auto& l : outputLists) result.insert(result.end(), l.begin(), l.end());
  if (inputs.empty()) return done(name, c10d::OpType::ALLGATHER_COALESCED, result);
  auto src = pack(inputs);
  auto flat = at::empty({getSize() * src.numel()}, at::kByte);
  auto finish = [outputLists, flat, sizes, total = nbytes(src)] {
    for (size_t r = 0; r < outputLists.size(); ++r) {
      auto displs = displsOf(sizes);
      for (auto& d : displs) d += r * total;
      unpack(flat, outputLists[r], displs);
    }
  };
  return run(name, c10d::OpType::ALLGATHER_COALESCED, opts.asyncOp,
             {allGatherCall(name, rank_, src, flat)}, finish, std::move(result));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupOxccl::all_gather_single(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  std::vector<at::Tensor> outs{output}, ins{input};
  return all_gather_single_coalesced(outs, ins, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupOxccl::all_gather_single_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  const char* name = outputs.size() == 1 ? "all_gather_into_tensor"
                                         : "all_gather_into_tensor_coalesced";
  if (outputs.size() != inputs.size())
    invalid(name, c10::str(outputs.size(), " outputs and ", inputs.size(), " inputs"));
  std::vector<Call> calls;
  std::vector<Out> outs;
  for (size_t i = 0; i < outputs.size(); ++i) {
    Out o(outputs[i]);
    auto src = inputs[i].contiguous();
    if (nbytes(o.c) != static_cast<size_t>(getSize()) * nbytes(src))
      invalid(name, c10::str("the output has ", outputs[i].numel(), " elements, ", getSize(),
                             " ranks x ", inputs[i].numel(), " need ",
                             getSize() * inputs[i].numel()));
    calls.push_back(allGatherCall(name, rank_, src, o.c));
    outs.push_back(o);
  }
  return run(name, outputs.size() == 1 ? c10d::OpType::_ALLGATHER_BASE : c10d::OpType::COALESCED,
             opts.asyncOp, std::move(calls), copyBack(std::move(outs)), outputs);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupOxccl::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  const char* name = "gather";
  int root = static_cast<int>(opts.rootRank);
  if (inputs.size() != 1) invalid(name, c10::str(inputs.size(), " input tensors, ccl takes one"));
  auto src = inputs[0].contiguous();
  const size_t k = nbytes(src);
  at::Tensor flat;
  std::vector<at::Tensor> outs;
  if (getRank() == root) {
    if (outputs.size() != 1 || static_cast<int>(outputs[0].size()) != getSize())
      invalid(name, c10::str("the root needs one list of ", getSize(), " outputs"));
    outs = outputs[0];
    flat = at::empty({static_cast<int64_t>(k * getSize())}, at::kByte);
  }
  Call call = [src, flat, root, rank = rank_](cclComm_t c, bool async) {
    cclRequest_t q = nullptr;
    check(g.cclGatherAsync(src.data_ptr(), flat.defined() ? flat.data_ptr() : nullptr,
                           nbytes(src), cclUint8, root, c, &q),
          "gather", rank);
    return settle(q, async, "gather", rank);
  };
  std::function<void()> finish;
  if (flat.defined()) {
    // Checked after the collective, which every rank has then completed: nobody waits on a
    // root that refused.
    finish = [outs, flat, k] {
      for (auto& o : outs)
        TORCH_CHECK_VALUE(nbytes(o) == k, "gather: every output must have the input's ", k,
                          " bytes, got ", nbytes(o));
      std::vector<size_t> displs;
      for (size_t r = 0; r < outs.size(); ++r) displs.push_back(r * k);
      unpack(flat, outs, displs);
    };
  }
  return run(name, c10d::OpType::GATHER, opts.asyncOp, {call}, finish, outs);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupOxccl::gather_single(at::Tensor& output,
                                                              at::Tensor& input,
                                                              const c10d::GatherOptions& opts) {
  // gather_into_tensor: every rank's input into the root's one output, in rank order.
  const char* name = "gather_into_tensor";
  int root = static_cast<int>(opts.rootRank);
  auto src = input.contiguous();
  std::vector<Out> outs;
  at::Tensor dst;
  if (getRank() == root) {
    if (nbytes(output) != static_cast<size_t>(getSize()) * nbytes(src))
      invalid(name, c10::str("the output has ", output.numel(), " elements, ", getSize(),
                             " ranks x ", input.numel(), " need ", getSize() * input.numel()));
    outs.emplace_back(output);
    dst = outs.back().c;
  }
  Call call = [src, dst, root, rank = rank_](cclComm_t c, bool async) {
    cclRequest_t q = nullptr;
    check(g.cclGatherAsync(src.data_ptr(), dst.defined() ? dst.data_ptr() : nullptr, nbytes(src),
                           cclUint8, root, c, &q),
          "gather_into_tensor", rank);
    return settle(q, async, "gather_into_tensor", rank);
  };
  return run(name, c10d::OpType::GATHER, opts.asyncOp, {call}, copyBack(std::move(outs)),
             {output});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupOxccl::scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  const char* name = "scatter";
  int root = static_cast<int>(opts.rootRank);
  if (outputs.size() != 1) invalid(name, c10::str(outputs.size(), " output tensors, ccl takes one"));
  Out o(outputs[0]);
  const size_t k = nbytes(o.c);
  at::Tensor flat;
  if (getRank() == root) {
    if (inputs.size() != 1 || static_cast<int>(inputs[0].size()) != getSize())
      invalid(name, c10::str("the root needs one list of ", getSize(), " inputs"));
    for (auto& x : inputs[0]) {
      if (nbytes(x) != k) {
        // The other ranks are already waiting for this root's data: failing the communicator
        // ends their wait at once ("rank <root> failed: aborted") instead of at the timeout.
        abort();
        TORCH_CHECK_VALUE(false, "scatter: every input must have the output's ", k,
                          " bytes, got ", nbytes(x),
                          " (the communicator was aborted so that the other ranks do not "
                          "wait for it)");
      }
    }
    flat = pack(inputs[0]);
  }
  at::Tensor dst = o.c;
  Call call = [flat, dst, root, rank = rank_](cclComm_t c, bool async) {
    cclRequest_t q = nullptr;
    check(g.cclScatterAsync(flat.defined() ? flat.data_ptr() : nullptr, dst.data_ptr(),
                            nbytes(dst), cclUint8, root, c, &q),
          "scatter", rank);
    return settle(q, async, "scatter", rank);
  };
  return run(name, c10d::OpType::SCATTER, opts.asyncOp, {call}, copyBack({o}), outputs);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupOxccl::alltoall(std::vector<at::Tensor>& outputs,
                                                         std::vector<at::Tensor>& inputs,
                                                         const c10d::AllToAllOptions& opts) {
  const char* name = "alltoall";
  const int n = getSize();
  if (static_cast<int>(outputs.size()) != n || static_cast<int>(inputs.size()) != n)
    invalid(name, c10::str(inputs.size(), " inputs and ", outputs.size(), " outputs for ", n,
                           " ranks"));
  auto src = pack(inputs);
  auto ssizes = sizesOf(inputs), rsizes = sizesOf(outputs);
  auto sdispls = displsOf(ssizes), rdispls = displsOf(rsizes);
  auto dst = at::empty({static_cast<int64_t>(rdispls.back() + rsizes.back())}, at::kByte);
  Call call = [src, dst, ssizes, rsizes, sdispls, rdispls, rank = rank_](cclComm_t c,
                                                                          bool async) {
    cclRequest_t q = nullptr;
    check(g.cclAlltoAllVAsync(src.data_ptr(), ssizes.data(), sdispls.data(), dst.data_ptr(),
                              rsizes.data(), rdispls.data(), cclUint8, c, &q),
          "alltoall", rank);
    return settle(q, async, "alltoall", rank);
  };
  auto finish = [dst, outputs, rdispls] { unpack(dst, outputs, rdispls); };
  return run(name, c10d::OpType::ALLTOALL, opts.asyncOp, {call}, finish, outputs);
}

namespace {

// Byte counts of `t`'s rows split as `splits` (or equally among n), for all_to_all_single.
std::vector<size_t> splitBytes(const char* what, const at::Tensor& t,
                               const std::vector<int64_t>& splits, int n) {
  const int64_t rows = t.dim() ? t.size(0) : 1;
  const size_t row = rows ? nbytes(t) / rows : 0;
  std::vector<int64_t> s = splits;
  if (s.empty()) {
    if (rows % n)
      invalid("all_to_all_single", c10::str(what, " has ", rows, " rows, not a multiple of ", n));
    s.assign(n, rows / n);
  }
  if (static_cast<int>(s.size()) != n || std::accumulate(s.begin(), s.end(), int64_t{0}) != rows ||
      std::any_of(s.begin(), s.end(), [](int64_t x) { return x < 0; }))
    invalid("all_to_all_single", c10::str(what, " splits ", s, " do not split ", rows,
                                          " rows among ", n, " ranks"));
  std::vector<size_t> out;
  for (auto x : s) out.push_back(static_cast<size_t>(x) * row);
  return out;
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupOxccl::all_to_all_single(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& outputSplits,
    std::vector<int64_t>& inputSplits, const c10d::AllToAllOptions& opts) {
  const char* name = "all_to_all_single";
  const int n = getSize();
  // As Gloo: refused before anything is sent (PyTorch's backend suite checks the message).
  TORCH_CHECK_VALUE(input.is_contiguous() && output.is_contiguous(),
                    "Tensors must be contiguous");
  Out o(output);
  auto src = input.contiguous();
  Call call;
  if (outputSplits.empty() && inputSplits.empty()) {
    if (nbytes(src) != nbytes(o.c) || nbytes(src) % n)
      invalid(name, c10::str("input and output of ", input.numel(), " and ", output.numel(),
                             " elements do not split into ", n, " equal blocks"));
    at::Tensor dst = o.c;
    call = [src, dst, n, rank = rank_](cclComm_t c, bool async) {
      cclRequest_t q = nullptr;
      check(g.cclAlltoAllAsync(src.data_ptr(), dst.data_ptr(), nbytes(src) / n, cclUint8, c, &q),
            "all_to_all_single", rank);
      return settle(q, async, "all_to_all_single", rank);
    };
  } else {
    // Rows split along dimension 0 are contiguous blocks: sent and received in place.
    auto ssizes = splitBytes("input", src, inputSplits, n);
    auto rsizes = splitBytes("output", o.c, outputSplits, n);
    auto sdispls = displsOf(ssizes), rdispls = displsOf(rsizes);
    at::Tensor dst = o.c;
    call = [src, dst, ssizes, rsizes, sdispls, rdispls, rank = rank_](cclComm_t c, bool async) {
      cclRequest_t q = nullptr;
      check(g.cclAlltoAllVAsync(src.data_ptr(), ssizes.data(), sdispls.data(), dst.data_ptr(),
                                rsizes.data(), rdispls.data(), cclUint8, c, &q),
            "all_to_all_single", rank);
      return settle(q, async, "all_to_all_single", rank);
    };
  }
  return run(name, c10d::OpType::ALLTOALL_BASE, opts.asyncOp, {call}, copyBack({o}), {output});
}

// ---- Synchronization -----------------------------------------------------------------------

c10::intrusive_ptr<c10d::Work> ProcessGroupOxccl::barrier(const c10d::BarrierOptions& opts) {
  // opts.device_ids names GPUs, which a CPU backend has none of.
  Call call = [rank = rank_](cclComm_t c, bool async) -> cclRequest_t {
    if (!async) {
      check(g.cclBarrier(c), "barrier", rank);
      return nullptr;
    }
    cclRequest_t q = nullptr;
    check(g.cclBarrierAsync(c, &q), "barrier", rank);
    return q;
  };
  return run("barrier", c10d::OpType::BARRIER, opts.asyncOp, {call}, nullptr, {});
}

namespace {

// Whether `key` appears in `store` within `timeout` (0: now, not the store's default).
bool storeWait(c10d::Store& store, const std::string& key, std::chrono::milliseconds timeout) {
  if (store.check({key})) return true;
  if (timeout.count() <= 0) return false;
  try {
    store.wait({key}, timeout);
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace

void ProcessGroupOxccl::monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) {
  // Gloo's monitored barrier, through the group's store so that it keeps its own timeout:
  // every rank checks in with rank 0, which reports the first rank (or, with waitAllRanks,
  // every rank) that did not arrive in time, then releases the others.
  auto timeout = opts.timeout < std::chrono::milliseconds(0) ? timeout_ : opts.timeout;
  state_->live("monitored_barrier");
  const std::string key = c10::str("oxccl/monitored_barrier/", ++monitored_);
  auto& store = *store_;
  if (getRank() != 0) {
    store.set(c10::str(key, "/", getRank()), std::vector<uint8_t>{'1'});
    bool ok = storeWait(store, key + "/release", timeout);
    if (ok) {
      auto v = store.get(key + "/release");
      ok = std::string(v.begin(), v.end()) == "ok";
    }
    TORCH_CHECK(ok, "Rank ", getRank(),
                " successfully reached monitoredBarrier, but received errors while waiting for "
                "send/recv from rank 0. Please check rank 0 logs for faulty rank.");
    return;
  }
  auto release = [&](const char* v) {
    store.set(key + "/release", std::vector<uint8_t>(v, v + std::strlen(v)));
  };
  if (timeout.count() <= 0) {
    release("failed");
    TORCH_CHECK(false, "Rank 0 timed out in monitoredBarrier after ", timeout.count(), " ms");
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<int> missing;
  for (int r = 1; r < getSize(); ++r) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (!storeWait(store, c10::str(key, "/", r), std::max(left, std::chrono::milliseconds(0)))) {
      missing.push_back(r);
      if (!waitAllRanks) break;
    }
  }
  release(missing.empty() ? "ok" : "failed");
  if (missing.size() == 1 && !waitAllRanks)
    TORCH_CHECK(false, "Rank ", missing[0], " failed to pass monitoredBarrier in ",
                timeout.count(), " ms");
  if (!missing.empty()) {
    std::string ranks;
    for (size_t i = 0; i < missing.size(); ++i)
      ranks += (i ? ", " : "") + std::to_string(missing[i]);
    TORCH_CHECK(false, "Ranks ", ranks, " failed to pass monitoredBarrier in ", timeout.count(),
                " ms");
  }
}

// ---- Point to point ------------------------------------------------------------------------

c10::intrusive_ptr<c10d::Work> ProcessGroupOxccl::p2p(bool send, std::vector<at::Tensor>& tensors,
                                                    int peer, int tag) {
  const char* name = send ? "send" : "recv";
  if (tensors.size() != 1)
    invalid(name, c10::str(tensors.size(), " tensors, ccl ", name, "s one"));
  auto t = p2p_->post(send, tensors[0], peer, tag);
  ++seq_;
  Drive drive = [p = p2p_, t] { p->wait(t); };
  auto type = send ? c10d::OpType::SEND
                   : (peer == kAnySource ? c10d::OpType::RECVANYSOURCE : c10d::OpType::RECV);
  auto work = c10::make_intrusive<CclWork>(rank_, type, seq_, name, std::move(drive), tensors,
                                           completer_, false);
  if (!send) work->setSource([t] { return t->peer; });
  return record(std::move(work));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupOxccl::send(std::vector<at::Tensor>& tensors, int dst,
                                                     int tag) {
  return p2p(true, tensors, dst, tag);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupOxccl::recv(std::vector<at::Tensor>& tensors, int src,
                                                     int tag) {
  return p2p(false, tensors, src, tag);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupOxccl::recvAnysource(std::vector<at::Tensor>& tensors,
                                                              int tag) {
  return p2p(false, tensors, kAnySource, tag);
}

}  // namespace oxccl_torch

// ---- The Python module ---------------------------------------------------------------------

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace py = pybind11;
  using oxccl_torch::ProcessGroupOxccl;
  m.doc() = "The oxccl torch.distributed backend in C++ (loaded by oxccl.torch).";
  m.def("load_library", &oxccl_torch::loadLibrary, py::arg("path"),
        "Looks up the library's functions in the libccl.so at path.");
  py::class_<ProcessGroupOxccl, c10d::Backend, c10::intrusive_ptr<ProcessGroupOxccl>>(
      m, "ProcessGroupOxccl", "A torch.distributed backend (device cpu) over a ccl communicator.")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       int64_t timeoutMs, bool enableReconfigure) {
             return c10::make_intrusive<ProcessGroupOxccl>(
                 store, rank, size, std::chrono::milliseconds(timeoutMs), enableReconfigure);
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout_ms"),
           py::arg("enable_reconfigure") = false, py::call_guard<py::gil_scoped_release>())
      .def("_comm_handle", &ProcessGroupOxccl::commHandle,
           "The cclComm_t as an integer (0 once the group is shut down or aborted).");
}
