#include "distributed/process_group.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "tensor/status_macros.h"

namespace ember::distributed {
namespace {
std::string DtypeText(Dtype dtype) { return std::string(dtype_name(dtype)); }
constexpr absl::Duration kDeadlineGrace = absl::Milliseconds(250);
}  // namespace

// Note [ProcessGroup layers]
// torch's c10d ProcessGroup grew one virtual per op and left each backend to
// check its own arguments, so the same mistake reads differently per backend.
// Here the base class owns every check that does not depend on how bytes move
// (defined tensors, agreeing sizes/dtypes, ranks in range, the reduce op
// against the dtype, and the support table) and backends implement Do* for
// validated calls only. Checks that need the peers' view (every rank passing
// the same size) happen as the op runs, through the backend's messages, but
// are built and worded here too (Note [Call checks]); they fail the Work with
// kFailedPrecondition.
//
// Note [Backend support table]
// Each backend declares, per device type, which ops it implements
// (SupportTable). The table is the same data that distributed/README.md shows;
// a call outside it fails before any communication with kUnimplemented naming
// the op, the backend and the device, instead of failing deep in a transport.

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "SUM";
    case ReduceOp::kProduct:
      return "PRODUCT";
    case ReduceOp::kMin:
      return "MIN";
    case ReduceOp::kMax:
      return "MAX";
    case ReduceOp::kAvg:
      return "AVG";
  }
  return "?";
}

const char* op_type_name(OpType op) {
  switch (op) {
    case OpType::kBroadcast:
      return "broadcast";
    case OpType::kAllReduce:
      return "all_reduce";
    case OpType::kReduce:
      return "reduce";
    case OpType::kAllGather:
      return "all_gather";
    case OpType::kAllGatherIntoTensor:
      return "all_gather_into_tensor";
    case OpType::kGather:
      return "gather";
    case OpType::kScatter:
      return "scatter";
    case OpType::kReduceScatter:
      return "reduce_scatter";
    case OpType::kAllToAll:
      return "all_to_all";
    case OpType::kBarrier:
      return "barrier";
    case OpType::kMonitoredBarrier:
      return "monitored_barrier";
    case OpType::kSend:
      return "send";
    case OpType::kRecv:
      return "recv";
  }
  return "?";
}

SupportTable& SupportTable::allow(OpType op, DeviceType device) {
  mask_[static_cast<int>(device)] |= 1u << static_cast<int>(op);
  return *this;
}

SupportTable& SupportTable::allow_all(DeviceType device) {
  for (int op = 0; op < kNumOpTypes; ++op) allow(static_cast<OpType>(op), device);
  return *this;
}

bool SupportTable::supports(OpType op, DeviceType device) const {
  return (mask_[static_cast<int>(device)] >> static_cast<int>(op)) & 1u;
}

// --- The call check (Note [Call checks]) ------------------------------------------

// Note [Call checks]
// Ranks that disagree about a collective (another op, other sizes, dtypes,
// roots or reduce ops, or a rank that skipped one) must fail with both sides'
// calls named, never with wrong results, a hang to the timeout, or a crash
// (gloo's network thread ends the process when a message is longer than the
// posted buffer). The check is one mechanism for every backend: the public
// methods here build each collective's CallFingerprint (words: op, dtype,
// root, reduce op, bytes, then at DETAIL the shape, then all_to_all's
// per-rank counts), and CallFingerprint::Check is the one comparison and the
// one message ("mismatched collectives: all_reduce (collective #3): rank 1
// ran all_reduce of 64 B float32 (SUM) but this rank (0) ran all_reduce of
// 32 B float32 (SUM); ..."). What differs by level is when the words travel:
// - default (EMBER_CHECK_COLLECTIVES unset): the backend gets the fingerprint
//   as IssuingCall() in its Do* and moves the words with its own messages
//   in the op's order, before the op's data can do harm: gloo sends them to
//   every peer when the call is made and compares before the collective
//   starts (a mismatch must never reach gloo), tcp sends them to every peer
//   ahead of the collective's first message on the same channels, so they
//   are compared by the time any result is returned (its transport refuses
//   a message of the wrong size on its own, so nothing can be written out
//   of bounds meanwhile). mpi has no such check (MPI itself reports
//   truncation); its groups have a store (Note [mpi's store]), so DETAIL's
//   applies.
// - DETAIL (TORCH_DISTRIBUTED_DEBUG=DETAIL): the shapes join the words, and
//   the ranks compare them through the group's store before the backend
//   sees the call, as PyTorch's ProcessGroupWrapper does; the call then runs
//   without the in-band check. A group without a store falls back to the
//   backend's in-band check, shapes included.
// - off (EMBER_CHECK_COLLECTIVES=0, or the older gloo-only
//   EMBER_GLOO_CHECK_COLLECTIVES=0): nothing is compared; for jobs known to
//   be consistent. Every rank must use the same setting.

namespace {
constexpr int kOpWord = 0, kDtypeWord = 1, kRootWord = 2, kReduceWord = 3, kBytesWord = 4,
              kDimsWord = 5;

// The fingerprint being issued on this thread (ProcessGroup::IssuingCall).
thread_local const CallFingerprint* issuing_call = nullptr;

std::string DtypeWordText(int64_t w) {
  if (w < 0 || w >= kNumDtypes) return absl::StrCat("dtype #", w);
  return std::string(dtype_name(static_cast<Dtype>(w)));
}

std::string OpWordText(int64_t w) {
  if (w < 0 || w >= kNumOpTypes) return absl::StrCat("op #", w);
  return op_type_name(static_cast<OpType>(w));
}

int64_t Word(absl::Span<const int64_t> words, int i) {
  return i < static_cast<int>(words.size()) ? words[i] : -1;
}
}  // namespace

CallFingerprint::CallFingerprint(OpType op, const Tensor* like, int64_t nbytes, int root,
                                 std::optional<ReduceOp> reduce, int group_size, bool shapes)
    : words_(kFixedWords + group_size, 0) {
  words_[kOpWord] = static_cast<int64_t>(op);
  words_[kDtypeWord] = like != nullptr ? static_cast<int64_t>(like->dtype()) : -1;
  words_[kRootWord] = root;
  words_[kReduceWord] = reduce ? static_cast<int64_t>(*reduce) : -1;
  words_[kBytesWord] = nbytes;
  words_[kDimsWord] = -1;
  if (shapes && like != nullptr) {
    const int64_t dims = like->dim();
    words_[kDimsWord] = dims;
    for (int64_t d = 0; d < dims; ++d) {
      const int slot = kDimsWord + 1 + static_cast<int>(std::min<int64_t>(d, kMaxDims - 1));
      words_[slot] = d < kMaxDims ? like->sizes()[d] : words_[slot] * like->sizes()[d];
    }
  }
}

void CallFingerprint::set_counts(std::vector<int64_t> sends, std::vector<int64_t> receives) {
  for (size_t p = 0; p < sends.size() && kFixedWords + p < words_.size(); ++p) {
    words_[kFixedWords + p] = sends[p];
  }
  receives_ = std::move(receives);
}

std::string CallFingerprint::DescribeWords(absl::Span<const int64_t> w, bool shape) {
  const int64_t op = Word(w, kOpWord);
  std::string text = OpWordText(op);
  if (op == static_cast<int64_t>(OpType::kBarrier) ||
      op == static_cast<int64_t>(OpType::kMonitoredBarrier)) {
    return text;
  }
  if (op == static_cast<int64_t>(OpType::kAllToAll)) {
    return absl::StrCat(text, " of ", DtypeWordText(Word(w, kDtypeWord)));
  }
  absl::StrAppend(&text, " of ", bytes_text(Word(w, kBytesWord)), " ",
                  DtypeWordText(Word(w, kDtypeWord)));
  if (Word(w, kRootWord) >= 0) absl::StrAppend(&text, " with root ", Word(w, kRootWord));
  const int64_t reduce = Word(w, kReduceWord);
  if (reduce >= 0) {
    absl::StrAppend(&text, " (",
                    reduce <= static_cast<int64_t>(ReduceOp::kAvg)
                        ? reduce_op_name(static_cast<ReduceOp>(reduce))
                        : "?",
                    ")");
  }
  const int64_t dims = Word(w, kDimsWord);
  if (shape && dims >= 0) {
    std::vector<int64_t> sizes;
    for (int d = 0; d < std::min<int64_t>(dims, kMaxDims); ++d)
      sizes.push_back(Word(w, kDimsWord + 1 + d));
    absl::StrAppend(&text, ", shape [", absl::StrJoin(sizes, ", "), dims > kMaxDims ? ", ..." : "",
                    "]");
  }
  return text;
}

absl::Status CallFingerprint::Check(const std::string& what, int rank, int peer,
                                    absl::Span<const int64_t> theirs) const {
  const absl::Span<const int64_t> mine(words_);
  auto same = [&](int from, int to) {
    for (int i = from; i < to; ++i) {
      if (Word(theirs, i) != Word(mine, i)) return false;
    }
    return true;
  };
  const bool shapes_compared = Word(theirs, kDimsWord) >= 0 && Word(mine, kDimsWord) >= 0;
  const bool call_same = theirs.size() == mine.size() && same(0, kDimsWord);
  const bool shape_same = !shapes_compared || same(kDimsWord, kFixedWords);
  if (call_same && Word(mine, kOpWord) == static_cast<int64_t>(OpType::kAllToAll)) {
    const int64_t sends = Word(theirs, kFixedWords + rank);
    const int64_t expects = peer < static_cast<int>(receives_.size()) ? receives_[peer] : sends;
    if (sends == expects) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": rank ", peer, " sends ", sends, " elements to this rank (", rank,
                     ") but this rank expects ", expects, "; outputs[", peer,
                     "] here must have as many elements as rank ", peer, "'s inputs[", rank, "]"));
  }
  if (call_same && shape_same) return absl::OkStatus();
  const bool show_shape = call_same;  // the shapes are what differs
  return absl::FailedPreconditionError(absl::StrCat(
      "mismatched collectives: ", what, ": rank ", peer, " ran ", DescribeWords(theirs, show_shape),
      " but this rank (", rank, ") ran ", DescribeWords(mine, show_shape),
      "; every rank must run the same collectives in the same order with tensors of the same "
      "size and dtype"));
}

absl::Status CallFingerprint::CheckAll(const std::string& what, int rank,
                                       absl::Span<const int64_t> all) const {
  const size_t n = words_.size();
  for (size_t p = 0; p * n < all.size(); ++p) {
    if (static_cast<int>(p) == rank) continue;
    EMBER_RETURN_IF_ERROR(Check(what, rank, static_cast<int>(p),
                                all.subspan(p * n, std::min(n, all.size() - p * n))));
  }
  return absl::OkStatus();
}

// --- Work ---------------------------------------------------------------------

Work::Work(OpType op, absl::Time deadline) : op_(op), deadline_(deadline) {}

absl::Status Work::wait(absl::Duration timeout) {
  const absl::Time until = absl::Now() + timeout;
  // A short grace after the deadline lets the backend report the failure
  // itself, naming the peer it was waiting for.
  const absl::Time cancel_at = deadline_ + kDeadlineGrace;
  {
    absl::MutexLock lock(&mu_);
    auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_; };
    mu_.AwaitWithDeadline(absl::Condition(&done), std::min(until, cancel_at));
    if (done_) return status_;
    if (until < cancel_at) {
      return absl::DeadlineExceededError(
          absl::StrCat(op_type_name(op_), ": Work::Wait timed out after ",
                       absl::FormatDuration(timeout), "; the op is still running"));
    }
  }
  OnDeadline();
  Finish(absl::DeadlineExceededError(
      absl::StrCat(op_type_name(op_), ": timed out (the op's deadline passed)")));
  absl::MutexLock lock(&mu_);
  return status_;
}

bool Work::is_completed() {
  {
    absl::MutexLock lock(&mu_);
    if (done_ || absl::Now() < deadline_ + kDeadlineGrace) return done_;
  }
  // Past its deadline: a poller learns of the timeout as a waiter would.
  (void)wait(absl::ZeroDuration());
  return true;
}

absl::Status Work::status() {
  absl::MutexLock lock(&mu_);
  return status_;
}

void Work::Finish(absl::Status status) {
  // Note [Desync reports]: where the other ranks are, for a timeout here or
  // one that a peer reported (its message, passed on, says "timed out").
  if (absl::IsDeadlineExceeded(status) ||
      (!status.ok() && absl::StrContains(status.message(), "timed out"))) {
    std::shared_ptr<FlightRecorder> recorder;
    std::shared_ptr<ProgressPublisher> desync;
    int64_t id = -1;
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;
      recorder = recorder_;
      desync = desync_.lock();
      id = record_id_;
    }
    const int64_t seq = recorder != nullptr ? recorder->CollectiveSeq(id) : -1;
    if (desync != nullptr && seq >= 0) {
      status =
          absl::Status(status.code(), absl::StrCat(status.message(), "; ", desync->Report(seq)));
    }
  }
  std::shared_ptr<FlightRecorder> dump_from;
  std::string reason;
  {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    finished_ = true;
    status_ = std::move(status);
    finished_ns_ = absl::GetCurrentTimeNanos();
    if (recorder_ != nullptr && recorder_->Finished(record_id_, status_, finished_ns_)) {
      dump_from = recorder_;
      reason = std::string(status_.message());
    }
  }
  // The group's first failure (Note [Flight recorder dumps]) is on disk
  // before any waiter learns of it: a program that exits on the error
  // leaves its dump.
  if (dump_from != nullptr) (void)dump_flight_recorders(reason);
  absl::MutexLock lock(&mu_);
  done_ = true;
}

void Work::MarkStarted() {
  absl::MutexLock lock(&mu_);
  if (started_ns_ != 0) return;
  started_ns_ = absl::GetCurrentTimeNanos();
  if (recorder_ != nullptr) recorder_->Started(record_id_, started_ns_);
}

void Work::AttachRecord(std::shared_ptr<FlightRecorder> recorder, int64_t id,
                        std::weak_ptr<ProgressPublisher> desync) {
  std::string reason;
  {
    absl::MutexLock lock(&mu_);
    recorder_ = std::move(recorder);
    record_id_ = id;
    desync_ = std::move(desync);
    // The backend may have been quicker than the recording.
    if (started_ns_ != 0) recorder_->Started(id, started_ns_);
    if (!finished_ || !recorder_->Finished(id, status_, finished_ns_)) return;
    reason = std::string(status_.message());
  }
  (void)dump_flight_recorders(reason);
}

void Work::OnDeadline() {}

std::shared_ptr<Future> Work::get_future() {
  std::shared_ptr<Work> self = shared_from_this();
  return Future::FromOp([self](absl::Duration timeout) { return self->wait(timeout); },
                        [self] { return self->is_completed(); },
                        [self] { return self->result(); });
}

std::shared_ptr<Work> Work::Completed(OpType op, absl::Status status) {
  auto work = std::make_shared<Work>(op, absl::Now());
  work->Finish(std::move(status));
  return work;
}

// --- ProcessGroup: the checks shared by every backend --------------------------

ProcessGroup::ProcessGroup(int rank, int size, std::string backend, SupportTable support,
                           absl::Duration timeout)
    : rank_(rank),
      size_(size),
      backend_(std::move(backend)),
      support_(support),
      timeout_(timeout),
      recorder_(std::make_shared<FlightRecorder>(next_flight_group_name(), backend_, rank, size,
                                                 FlightRecorder::CapacityFromEnv())),
      call_check_(call_check_level_from_env()) {}

void ProcessGroup::OnAbort() {
  if (aborted_once_.exchange(true) || !recorder_->enabled()) return;
  (void)dump_flight_recorders(
      absl::StrCat("process group ", recorder_->group_name(), " (", backend_, ") was aborted"));
}

void ProcessGroup::shutdown() {
  // A group aborted before keeps its reason; otherwise OnAbort finds the
  // group already marked and dumps nothing.
  if (!aborted_once_.exchange(true)) shut_down_.store(true);
  abort();
}

std::string ProcessGroup::AbortReason() const {
  return shut_down_.load() ? "the process group was destroyed" : "the process group was aborted";
}

void ProcessGroup::PublishProgress(std::shared_ptr<Store> store, const std::string& prefix) {
  debug_store_ = store;
  debug_prefix_ = prefix;
  if (store == nullptr || !recorder_->enabled() || size_ < 2) return;
  publisher_ = std::make_shared<ProgressPublisher>(std::move(store), prefix, recorder_);
}

const CallFingerprint* ProcessGroup::IssuingCall() { return issuing_call; }

CallFingerprint ProcessGroup::Fingerprint(OpType op, const Tensor* like, int64_t nbytes, int root,
                                          std::optional<ReduceOp> reduce) const {
  if (call_check_ == CallCheckLevel::kOff || size_ < 2) return {};
  return CallFingerprint(op, like, nbytes, root, reduce, size_,
                         call_check_ == CallCheckLevel::kDetail);
}

template <typename F>
auto ProcessGroup::Checked(const CallFingerprint& call, const FlightOp& op, F run)
    -> decltype(run()) {
  if (call.words().empty()) return run();
  if (call_check_ == CallCheckLevel::kDetail && debug_store_ != nullptr) {
    const int64_t seq = fingerprint_seq_++;
    const std::string what = absl::StrCat(op.op, " (collective #", seq, ")");
    absl::StatusOr<std::vector<std::vector<int64_t>>> rows =
        exchange_call_words(*debug_store_, debug_prefix_, rank_, size_, seq, call.words(), what,
                            absl::Milliseconds(op.timeout_ms));
    if (!rows.ok()) return rows.status();
    for (int p = 0; p < size_; ++p) {
      if (p != rank_) EMBER_RETURN_IF_ERROR(call.Check(what, rank_, p, (*rows)[p]));
    }
    return run();
  }
  const CallFingerprint* outer = issuing_call;
  issuing_call = &call;
  auto result = run();
  issuing_call = outer;
  return result;
}

int64_t ProcessGroup::RecordClock() const {
  return recorder_->enabled() ? absl::GetCurrentTimeNanos() : 0;
}

template <typename W>
absl::StatusOr<std::shared_ptr<W>> ProcessGroup::Recorded(absl::StatusOr<std::shared_ptr<W>> work,
                                                          const FlightOp& op, int64_t created_ns) {
  if (!recorder_->enabled() || !work.ok() || *work == nullptr) return work;
  (*work)->AttachRecord(recorder_, recorder_->Record(op, created_ns), publisher_);
  return work;
}

absl::Time ProcessGroup::DeadlineFor(const std::optional<absl::Duration>& timeout) const {
  return absl::Now() + timeout.value_or(timeout_);
}

absl::Status ProcessGroup::CheckSupported(OpType op, DeviceType device) const {
  if (support_.supports(op, device)) return absl::OkStatus();
  return absl::UnimplementedError(absl::StrCat(
      op_type_name(op), " is not supported by the '", backend_, "' backend for ",
      std::string(DeviceTypeName(device)),
      " tensors (see the backend support table in distributed/README.md); ",
      device == DeviceType::kCUDA
          ? "for CUDA tensors use the 'nccl' backend (one GPU per rank) or 'gloo' (through "
            "host memory; ranks may share a GPU), e.g. backend \"cpu:gloo,cuda:nccl\", or move "
            "the tensor to the CPU"
          : "use a backend that supports it or move the tensor"));
}

absl::Status ProcessGroup::CheckTensor(OpType op, const Tensor& tensor,
                                       const std::string& what) const {
  if (!tensor.defined()) {
    return absl::InvalidArgumentError(
        absl::StrCat(op_type_name(op), ": ", what, " is an undefined tensor"));
  }
  return CheckSupported(op, tensor.device().type());
}

absl::Status ProcessGroup::CheckRank(OpType op, int rank, const std::string& what) const {
  if (rank >= 0 && rank < size_) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(op_type_name(op), ": ", what, " ", rank,
                                                 " is out of range for a group of size ", size_,
                                                 " (valid: 0..", size_ - 1, ")"));
}

absl::Status ProcessGroup::CheckList(OpType op, absl::Span<const Tensor> list,
                                     const std::string& what, const Tensor& like,
                                     bool same_numel) const {
  if (static_cast<int>(list.size()) != size_) {
    return absl::InvalidArgumentError(absl::StrCat(op_type_name(op), ": ", what, " has ",
                                                   list.size(), " tensors; expected one per rank (",
                                                   size_, ")"));
  }
  for (size_t i = 0; i < list.size(); ++i) {
    EMBER_RETURN_IF_ERROR(CheckTensor(op, list[i], absl::StrCat(what, "[", i, "]")));
    if (list[i].dtype() != like.dtype()) {
      return absl::InvalidArgumentError(
          absl::StrCat(op_type_name(op), ": ", what, "[", i, "] is ", DtypeText(list[i].dtype()),
                       " but the other tensor is ", DtypeText(like.dtype()), "; use one dtype"));
    }
    if (same_numel && list[i].numel() != like.numel()) {
      return absl::InvalidArgumentError(
          absl::StrCat(op_type_name(op), ": ", what, "[", i, "] has ", list[i].numel(),
                       " elements but the other tensor has ", like.numel(), "; sizes must match"));
    }
  }
  return absl::OkStatus();
}

absl::Status ProcessGroup::CheckReduceOp(OpType op, ReduceOp reduce, Dtype dtype) const {
  if (reduce == ReduceOp::kAvg && !is_floating_point(dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat(op_type_name(op), ": ReduceOp.AVG needs a floating point tensor, got ",
                     DtypeText(dtype), "; use SUM and divide, or convert the tensor"));
  }
  return absl::OkStatus();
}

namespace {

// A queued op's Work, told which tensors the op writes (Work::result).
template <typename W>
absl::StatusOr<std::shared_ptr<W>> WithResult(absl::StatusOr<std::shared_ptr<W>> work,
                                              std::vector<Tensor> tensors) {
  if (work.ok() && *work != nullptr) (*work)->set_result(std::move(tensors));
  return work;
}
std::vector<Tensor> List(absl::Span<const Tensor> tensors) {
  return std::vector<Tensor>(tensors.begin(), tensors.end());
}

int64_t Numel(absl::Span<const Tensor> tensors) {
  int64_t n = 0;
  for (const Tensor& t : tensors) n += t.numel();
  return n;
}

// The flight recorder's view of a call (Note [Flight recorder]).
FlightOp Flight(OpType op, const Tensor* like, int64_t in_numel, int64_t out_numel, int64_t nbytes,
                int peer, const std::optional<absl::Duration>& timeout, absl::Duration fallback) {
  FlightOp f;
  f.op = op_type_name(op);
  f.collective = op != OpType::kSend && op != OpType::kRecv;
  f.dtype = like != nullptr ? dtype_name(like->dtype()).data() : "";
  f.in_numel = in_numel;
  f.out_numel = out_numel;
  f.nbytes = nbytes;
  f.peer = peer;
  f.timeout_ms = absl::ToInt64Milliseconds(timeout.value_or(fallback));
  return f;
}

}  // namespace

absl::StatusOr<std::shared_ptr<Work>> ProcessGroup::broadcast(const Tensor& tensor,
                                                              const BroadcastOptions& options) {
  EMBER_RETURN_IF_ERROR(CheckTensor(OpType::kBroadcast, tensor, "tensor"));
  EMBER_RETURN_IF_ERROR(CheckRank(OpType::kBroadcast, options.root, "root"));
  const FlightOp flight = Flight(OpType::kBroadcast, &tensor, tensor.numel(), tensor.numel(),
                                 tensor.nbytes(), options.root, options.timeout, timeout_);
  const int64_t t0 = RecordClock();
  return Recorded(
      WithResult(Checked(Fingerprint(OpType::kBroadcast, &tensor, tensor.nbytes(), options.root),
                         flight, [&] { return DoBroadcast(tensor, options); }),
                 {tensor}),
      flight, t0);
}

absl::StatusOr<std::shared_ptr<Work>> ProcessGroup::allreduce(const Tensor& tensor,
                                                              const AllReduceOptions& options) {
  EMBER_RETURN_IF_ERROR(CheckTensor(OpType::kAllReduce, tensor, "tensor"));
  EMBER_RETURN_IF_ERROR(CheckReduceOp(OpType::kAllReduce, options.op, tensor.dtype()));
  const FlightOp flight = Flight(OpType::kAllReduce, &tensor, tensor.numel(), tensor.numel(),
                                 tensor.nbytes(), -1, options.timeout, timeout_);
  const int64_t t0 = RecordClock();
  return Recorded(
      WithResult(Checked(Fingerprint(OpType::kAllReduce, &tensor, tensor.nbytes(), -1, options.op),
                         flight, [&] { return DoAllReduce(tensor, options); }),
                 {tensor}),
      flight, t0);
}

absl::StatusOr<std::shared_ptr<Work>> ProcessGroup::reduce(const Tensor& tensor,
                                                           const ReduceOptions& options) {
  EMBER_RETURN_IF_ERROR(CheckTensor(OpType::kReduce, tensor, "tensor"));
  EMBER_RETURN_IF_ERROR(CheckRank(OpType::kReduce, options.root, "root"));
  EMBER_RETURN_IF_ERROR(CheckReduceOp(OpType::kReduce, options.op, tensor.dtype()));
  const FlightOp flight = Flight(OpType::kReduce, &tensor, tensor.numel(), tensor.numel(),
                                 tensor.nbytes(), options.root, options.timeout, timeout_);
  const int64_t t0 = RecordClock();
  return Recorded(WithResult(Checked(Fingerprint(OpType::kReduce, &tensor, tensor.nbytes(),
                                                 options.root, options.op),
                                     flight, [&] { return DoReduce(tensor, options); }),
                             {tensor}),
                  flight, t0);
}

absl::StatusOr<std::shared_ptr<Work>> ProcessGroup::allgather(absl::Span<const Tensor> outputs,
                                                              const Tensor& input,
                                                              const AllGatherOptions& options) {
  EMBER_RETURN_IF_ERROR(CheckTensor(OpType::kAllGather, input, "input"));
  EMBER_RETURN_IF_ERROR(CheckList(OpType::kAllGather, outputs, "outputs", input, true));
  const FlightOp flight = Flight(OpType::kAllGather, &input, input.numel(), Numel(outputs),
                                 input.nbytes(), -1, options.timeout, timeout_);
  const int64_t t0 = RecordClock();
  return Recorded(WithResult(Checked(Fingerprint(OpType::kAllGather, &input, input.nbytes(), -1),
                                     flight, [&] { return DoAllGather(outputs, input, options); }),
                             List(outputs)),
                  flight, t0);
}

absl::StatusOr<std::shared_ptr<Work>> ProcessGroup::allgather_into_tensor(
    const Tensor& output, const Tensor& input, const AllGatherOptions& options) {
  const OpType op = OpType::kAllGatherIntoTensor;
  EMBER_RETURN_IF_ERROR(CheckTensor(op, input, "input"));
  EMBER_RETURN_IF_ERROR(CheckTensor(op, output, "output"));
  if (output.dtype() != input.dtype()) {
    return absl::InvalidArgumentError(absl::StrCat(op_type_name(op), ": output is ",
                                                   DtypeText(output.dtype()), " but input is ",
                                                   DtypeText(input.dtype())));
  }
  if (output.numel() != input.numel() * size_) {
    return absl::InvalidArgumentError(absl::StrCat(
        op_type_name(op), ": output has ", output.numel(), " elements; expected world size (",
        size_, ") x input (", input.numel(), ") = ", input.numel() * size_));
  }
  const FlightOp flight = Flight(op, &input, input.numel(), output.numel(), input.nbytes(), -1,
                                 options.timeout, timeout_);
  const int64_t t0 = RecordClock();
  return Recorded(WithResult(Checked(Fingerprint(op, &input, input.nbytes(), -1), flight,
                                     [&] { return DoAllGatherIntoTensor(output, input, options); }),
                             {output}),
                  flight, t0);
}

absl::StatusOr<std::shared_ptr<Work>> ProcessGroup::gather(absl::Span<const Tensor> outputs,
                                                           const Tensor& input,
                                                           const GatherOptions& options) {
  EMBER_RETURN_IF_ERROR(CheckTensor(OpType::kGather, input, "input"));
  EMBER_RETURN_IF_ERROR(CheckRank(OpType::kGather, options.root, "root"));
  if (rank_ == options.root) {
    EMBER_RETURN_IF_ERROR(CheckList(OpType::kGather, outputs, "outputs", input, true));
  } else if (!outputs.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gather: outputs must be empty on non-root rank ", rank_, " (root is ", options.root, ")"));
  }
  const FlightOp flight = Flight(OpType::kGather, &input, input.numel(), Numel(outputs),
                                 input.nbytes(), options.root, options.timeout, timeout_);
  const int64_t t0 = RecordClock();
  return Recorded(
      WithResult(Checked(Fingerprint(OpType::kGather, &input, input.nbytes(), options.root), flight,
                         [&] { return DoGather(outputs, input, options); }),
                 List(outputs)),
      flight, t0);
}

absl::StatusOr<std::shared_ptr<Work>> ProcessGroup::scatter(const Tensor& output,
                                                            absl::Span<const Tensor> inputs,
                                                            const ScatterOptions& options) {
  EMBER_RETURN_IF_ERROR(CheckTensor(OpType::kScatter, output, "output"));
  EMBER_RETURN_IF_ERROR(CheckRank(OpType::kScatter, options.root, "root"));
  if (rank_ == options.root) {
    EMBER_RETURN_IF_ERROR(CheckList(OpType::kScatter, inputs, "inputs", output, true));
  } else if (!inputs.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "scatter: inputs must be empty on non-root rank ", rank_, " (root is ", options.root, ")"));
  }
  const FlightOp flight = Flight(OpType::kScatter, &output, Numel(inputs), output.numel(),
                                 output.nbytes(), options.root, options.timeout, timeout_);
  const int64_t t0 = RecordClock();
  return Recorded(
      WithResult(Checked(Fingerprint(OpType::kScatter, &output, output.nbytes(), options.root),
                         flight, [&] { return DoScatter(output, inputs, options); }),
                 {output}),
      flight, t0);
}

absl::StatusOr<std::shared_ptr<Work>> ProcessGroup::reduce_scatter(
    const Tensor& output, absl::Span<const Tensor> inputs, const ReduceScatterOptions& options) {
  EMBER_RETURN_IF_ERROR(CheckTensor(OpType::kReduceScatter, output, "output"));
  EMBER_RETURN_IF_ERROR(CheckList(OpType::kReduceScatter, inputs, "inputs", output, true));
  EMBER_RETURN_IF_ERROR(CheckReduceOp(OpType::kReduceScatter, options.op, output.dtype()));
  const FlightOp flight = Flight(OpType::kReduceScatter, &output, Numel(inputs), output.numel(),
                                 output.nbytes(), -1, options.timeout, timeout_);
  const int64_t t0 = RecordClock();
  return Recorded(
      WithResult(
          Checked(Fingerprint(OpType::kReduceScatter, &output, output.nbytes(), -1, options.op),
                  flight, [&] { return DoReduceScatter(output, inputs, options); }),
          {output}),
      flight, t0);
}

absl::StatusOr<std::shared_ptr<Work>> ProcessGroup::alltoall(absl::Span<const Tensor> outputs,
                                                             absl::Span<const Tensor> inputs,
                                                             const AllToAllOptions& options) {
  if (inputs.empty()) {
    return absl::InvalidArgumentError("all_to_all: inputs is empty; pass one tensor per rank");
  }
  EMBER_RETURN_IF_ERROR(CheckList(OpType::kAllToAll, inputs, "inputs", inputs[0], false));
  EMBER_RETURN_IF_ERROR(CheckList(OpType::kAllToAll, outputs, "outputs", inputs[0], false));
  const int64_t t0 = RecordClock();
  int64_t in_bytes = 0;
  for (const Tensor& t : inputs) in_bytes += static_cast<int64_t>(t.nbytes());
  const FlightOp flight = Flight(OpType::kAllToAll, &inputs[0], Numel(inputs), Numel(outputs),
                                 in_bytes, -1, options.timeout, timeout_);
  // Sizes may differ per pair of ranks: each rank's count for this one must
  // match what this one expects (Note [Call checks]); shapes are not compared.
  CallFingerprint call = Fingerprint(OpType::kAllToAll, &inputs[0], 0, -1);
  if (!call.words().empty()) {
    std::vector<int64_t> sends, receives;
    for (const Tensor& t : inputs) sends.push_back(t.numel());
    for (const Tensor& t : outputs) receives.push_back(t.numel());
    call = CallFingerprint(OpType::kAllToAll, &inputs[0], 0, -1, std::nullopt, size_, false);
    call.set_counts(std::move(sends), std::move(receives));
  }
  return Recorded(
      WithResult(Checked(call, flight, [&] { return DoAllToAll(outputs, inputs, options); }),
                 List(outputs)),
      flight, t0);
}

absl::StatusOr<std::shared_ptr<Work>> ProcessGroup::barrier(const BarrierOptions& options) {
  EMBER_RETURN_IF_ERROR(CheckSupported(OpType::kBarrier, DeviceType::kCPU));
  const FlightOp flight = Flight(OpType::kBarrier, nullptr, 0, 0, 0, -1, options.timeout, timeout_);
  const int64_t t0 = RecordClock();
  return Recorded(Checked(Fingerprint(OpType::kBarrier, nullptr, 0, -1), flight,
                          [&] { return DoBarrier(options); }),
                  flight, t0);
}

absl::StatusOr<std::shared_ptr<Work>> ProcessGroup::monitored_barrier(
    const MonitoredBarrierOptions& options) {
  EMBER_RETURN_IF_ERROR(CheckSupported(OpType::kMonitoredBarrier, DeviceType::kCPU));
  const FlightOp flight =
      Flight(OpType::kMonitoredBarrier, nullptr, 0, 0, 0, -1, options.timeout, timeout_);
  const int64_t t0 = RecordClock();
  return Recorded(Checked(Fingerprint(OpType::kMonitoredBarrier, nullptr, 0, -1), flight,
                          [&] { return DoMonitoredBarrier(options); }),
                  flight, t0);
}

absl::StatusOr<std::shared_ptr<Work>> ProcessGroup::send(const Tensor& tensor, int dst,
                                                         const P2POptions& options) {
  EMBER_RETURN_IF_ERROR(CheckTensor(OpType::kSend, tensor, "tensor"));
  EMBER_RETURN_IF_ERROR(CheckRank(OpType::kSend, dst, "dst"));
  if (dst == rank_) {
    return absl::InvalidArgumentError(
        absl::StrCat("send: dst ", dst, " is this rank; a rank cannot send to itself"));
  }
  const int64_t t0 = RecordClock();
  FlightOp flight = Flight(OpType::kSend, &tensor, tensor.numel(), 0, tensor.nbytes(), dst,
                           options.timeout, timeout_);
  flight.tag = options.tag;
  return Recorded(WithResult(DoSend(tensor, dst, options), {tensor}), flight, t0);
}

absl::StatusOr<std::shared_ptr<RecvWork>> ProcessGroup::recv(const Tensor& tensor, int src,
                                                             const P2POptions& options) {
  EMBER_RETURN_IF_ERROR(CheckTensor(OpType::kRecv, tensor, "tensor"));
  if (src != kAnySource) {
    EMBER_RETURN_IF_ERROR(CheckRank(OpType::kRecv, src, "src"));
    if (src == rank_) {
      return absl::InvalidArgumentError(
          absl::StrCat("recv: src ", src, " is this rank; a rank cannot receive from itself"));
    }
  }
  const int64_t t0 = RecordClock();
  FlightOp flight = Flight(OpType::kRecv, &tensor, 0, tensor.numel(), tensor.nbytes(), src,
                           options.timeout, timeout_);
  flight.tag = options.tag;
  return Recorded(WithResult(DoRecv(tensor, src, options), {tensor}), flight, t0);
}

absl::StatusOr<std::vector<std::shared_ptr<Work>>> ProcessGroup::batch_p2p(
    absl::Span<const P2PRequest> ops) {
  if (ops.empty()) {
    return absl::InvalidArgumentError(
        "batch_isend_irecv: the list of ops is empty; pass at least one isend or irecv");
  }
  // Every op is checked before the first is issued: a bad one leaves no
  // half-issued batch behind.
  for (size_t i = 0; i < ops.size(); ++i) {
    const P2PRequest& op = ops[i];
    const std::string what = absl::StrCat("op ", i);
    if (op.op == OpType::kSend) {
      EMBER_RETURN_IF_ERROR(CheckTensor(OpType::kSend, op.tensor, what + " tensor"));
      EMBER_RETURN_IF_ERROR(CheckRank(OpType::kSend, op.peer, what + " dst"));
      if (op.peer == rank_) {
        return absl::InvalidArgumentError(absl::StrCat(
            "batch_isend_irecv: ", what, " sends to rank ", op.peer,
            ", this rank; a rank cannot send to itself"));
      }
    } else if (op.op == OpType::kRecv) {
      EMBER_RETURN_IF_ERROR(CheckTensor(OpType::kRecv, op.tensor, what + " tensor"));
      if (op.peer != kAnySource) {
        EMBER_RETURN_IF_ERROR(CheckRank(OpType::kRecv, op.peer, what + " src"));
        if (op.peer == rank_) {
          return absl::InvalidArgumentError(absl::StrCat(
              "batch_isend_irecv: ", what, " receives from rank ", op.peer,
              ", this rank; a rank cannot receive from itself"));
        }
      }
    } else {
      return absl::InvalidArgumentError(absl::StrCat("batch_isend_irecv: ", what, " is ",
                                                     op_type_name(op.op),
                                                     "; only isend and irecv may be batched"));
    }
  }
  return DoBatchP2P(ops);
}

absl::StatusOr<std::vector<std::shared_ptr<Work>>> ProcessGroup::DoBatchP2P(
    absl::Span<const P2PRequest> ops) {
  std::vector<std::shared_ptr<Work>> works;
  for (const P2PRequest& op : ops) {
    if (op.op == OpType::kSend) {
      EMBER_ASSIGN_OR_RETURN(std::shared_ptr<Work> work, send(op.tensor, op.peer, op.options));
      works.push_back(std::move(work));
    } else {
      EMBER_ASSIGN_OR_RETURN(std::shared_ptr<RecvWork> work, recv(op.tensor, op.peer, op.options));
      works.push_back(std::move(work));
    }
  }
  return works;
}

}  // namespace ember::distributed
