#include "distributed/tcp/algorithms.h"

#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "distributed/reduce.h"
#include "tensor/status_macros.h"

namespace ember::distributed::tcp {

Sink CopySink(char* dst) {
  return [dst](size_t off, const char* data, size_t n) { std::memcpy(dst + off, data, n); };
}
Sink ReduceSink(ReduceOp op, Dtype dtype, char* acc) {
  const size_t elem = element_size(dtype);
  return [=](size_t off, const char* data, size_t n) {
    ReduceInto(op, dtype, acc + off, data, static_cast<int64_t>(n / elem));
  };
}

absl::Status SendTo(Mesh& mesh, const OpContext& ctx, int dst, int32_t step,
                    absl::Span<const char> bytes) {
  absl::Status s = mesh.Send(dst, {MessageKind::kCollective, ctx.seq, step},
                             static_cast<uint8_t>(ctx.op), bytes, ctx.deadline);
  if (s.ok()) return s;
  // A peer that hung up may only be echoing a failure elsewhere (it gave up
  // on this collective and exited): report the cause when it is known.
  if (absl::IsUnavailable(s)) {
    absl::Status cause = mesh.CollectiveFailure(ctx.seq, absl::Milliseconds(200));
    if (!cause.ok() && !absl::StrContains(cause.message(), absl::StrCat("lost rank ", dst))) {
      return absl::Status(cause.code(), absl::StrCat(ctx.what, ": ", cause.message()));
    }
  }
  return absl::Status(
      s.code(), absl::StrCat(ctx.what, ": sending to ", mesh.DescribePeer(dst), ": ", s.message()));
}

absl::Status Exchange(Mesh& mesh, const OpContext& ctx, int32_t step,
                      const std::vector<std::optional<absl::Span<const char>>>& sends,
                      const std::vector<std::optional<Target>>& recvs) {
  const int n = mesh.size(), r = mesh.rank();
  const uint8_t code = static_cast<uint8_t>(ctx.op);
  const MessageKey key{MessageKind::kCollective, ctx.seq, step};
  std::vector<std::shared_ptr<PendingRecv>> posted(n);
  OpRecvs guard(mesh);
  for (int p = 0; p < n; ++p) {
    if (p != r && recvs[p]) {
      posted[p] = guard.Add(mesh.Post(p, key, code, recvs[p]->nbytes, CopySink(recvs[p]->data),
                                      nullptr, recvs[p]->data));
    }
  }
  for (int i = 1; i < n; ++i) {
    const int p = (r + i) % n;
    if (!sends[p]) continue;
    EMBER_RETURN_IF_ERROR(SendTo(mesh, ctx, p, step, *sends[p]));
  }
  for (int i = 1; i < n; ++i) {
    const int p = (r - i + n) % n;
    if (posted[p]) EMBER_RETURN_IF_ERROR(mesh.Wait(posted[p], ctx.deadline, ctx.what));
  }
  return absl::OkStatus();
}

// The reduce-scatter half of the ring : afterwards
// segment r+1 of `data` holds the full reduction on rank r.
absl::Status RingReduceScatter(Mesh& mesh, const OpContext& ctx, char* data, int64_t numel,
                               Dtype dtype, ReduceOp op) {
  const int n = mesh.size(), r = mesh.rank();
  const size_t elem = element_size(dtype);
  const int left = (r - 1 + n) % n, right = (r + 1) % n;
  const uint8_t code = static_cast<uint8_t>(ctx.op);
  std::vector<std::shared_ptr<PendingRecv>> rs(n - 1);
  OpRecvs guard(mesh);
  for (int k = 0; k < n - 1; ++k) {
    Segment s = SegmentOf(r - k - 1, n, numel, elem);
    rs[k] = guard.Add(mesh.Post(left, {MessageKind::kCollective, ctx.seq, k}, code, s.nbytes,
                                ReduceSink(op, dtype, data + s.offset)));
  }
  for (int k = 0; k < n - 1; ++k) {
    Segment s = SegmentOf(r - k, n, numel, elem);
    EMBER_RETURN_IF_ERROR(SendTo(mesh, ctx, right, k, {data + s.offset, s.nbytes}));
    EMBER_RETURN_IF_ERROR(mesh.Wait(rs[k], ctx.deadline, ctx.what));
  }
  return absl::OkStatus();
}

// Small all_reduce in one hop: everyone sends its whole buffer to everyone,
// and every rank reduces the N inputs in rank order 0..N-1 (the same bits
// everywhere, as the ring gives).
absl::Status DirectAllReduce(Mesh& mesh, const OpContext& ctx, char* data, int64_t numel,
                             Dtype dtype, ReduceOp op) {
  const int n = mesh.size(), r = mesh.rank();
  const size_t nbytes = static_cast<size_t>(numel) * element_size(dtype);
  std::vector<std::string> inputs(n);
  std::vector<std::optional<absl::Span<const char>>> sends(n, absl::Span<const char>(data, nbytes));
  std::vector<std::optional<Target>> recvs(n);
  for (int p = 0; p < n; ++p) {
    if (p == r) {
      inputs[p].assign(data, nbytes);
    } else {
      inputs[p].resize(nbytes);
      recvs[p] = Target{inputs[p].data(), nbytes};
    }
  }
  EMBER_RETURN_IF_ERROR(Exchange(mesh, ctx, 0, sends, recvs));
  std::memcpy(data, inputs[0].data(), nbytes);
  for (int p = 1; p < n; ++p) ReduceInto(op, dtype, data, inputs[p].data(), numel);
  if (op == ReduceOp::kAvg) DivideBy(dtype, data, numel, n);
  return absl::OkStatus();
}

absl::Status RingAllReduce(Mesh& mesh, const OpContext& ctx, char* data, int64_t numel, Dtype dtype,
                           ReduceOp op) {
  const int n = mesh.size(), r = mesh.rank();
  const size_t elem = element_size(dtype);
  const int left = (r - 1 + n) % n, right = (r + 1) % n;
  const uint8_t code = static_cast<uint8_t>(ctx.op);
  // All-gather receives are posted first too: a segment's final value only
  // arrives after this rank has sent its own part of it (Note [tcp algorithms]).
  std::vector<std::shared_ptr<PendingRecv>> ag(n - 1);
  OpRecvs guard(mesh);
  for (int k = 0; k < n - 1; ++k) {
    Segment s = SegmentOf(r - k, n, numel, elem);
    ag[k] = guard.Add(mesh.Post(left, {MessageKind::kCollective, ctx.seq, n - 1 + k}, code,
                                s.nbytes, CopySink(data + s.offset), nullptr, data + s.offset));
  }
  EMBER_RETURN_IF_ERROR(RingReduceScatter(mesh, ctx, data, numel, dtype, op));
  Segment own = SegmentOf(r + 1, n, numel, elem);
  if (op == ReduceOp::kAvg) {
    DivideBy(dtype, data + own.offset, static_cast<int64_t>(own.nbytes / elem), n);
  }
  for (int k = 0; k < n - 1; ++k) {
    Segment s = SegmentOf(r + 1 - k, n, numel, elem);
    EMBER_RETURN_IF_ERROR(SendTo(mesh, ctx, right, n - 1 + k, {data + s.offset, s.nbytes}));
    EMBER_RETURN_IF_ERROR(mesh.Wait(ag[k], ctx.deadline, ctx.what));
  }
  return absl::OkStatus();
}

absl::Status AllGatherInto(Mesh& mesh, const OpContext& ctx, const std::vector<Target>& outputs,
                           absl::Span<const char> input) {
  const int n = mesh.size(), r = mesh.rank();
  std::vector<std::optional<absl::Span<const char>>> sends(n, input);
  std::vector<std::optional<Target>> recvs(outputs.begin(), outputs.end());
  std::memcpy(outputs[r].data, input.data(), input.size());
  return Exchange(mesh, ctx, 0, sends, recvs);
}

}  // namespace ember::distributed::tcp
