// cuda/graphs.h in a build without CUDA support (Note [Builds with and
// without CUDA] in tools/cuda_configure.bzl): nothing can be captured; every
// call says why (cuda::unavailable_reason()).
#include <atomic>

#include "absl/strings/str_cat.h"
#include "cuda/device.h"
#include "cuda/graphs.h"
#include "tensor/error.h"

namespace ember::cuda {

struct CUDAGraph::State {
  absl::Status status = absl::FailedPreconditionError("the graph has captured nothing yet");
};

namespace {
std::atomic<uint64_t> next_pool_id{1};
}  // namespace

MempoolId graph_pool_handle() { return {0, next_pool_id.fetch_add(1)}; }

CUDAGraph::CUDAGraph() : state_(std::make_unique<State>()) {}
CUDAGraph::~CUDAGraph() = default;

absl::Status CUDAGraph::capture_begin(std::optional<MempoolId>, CaptureErrorMode) {
  return internal::CheckAvailable("CUDAGraph::capture_begin");
}
absl::Status CUDAGraph::capture_end() {
  return absl::InvalidArgumentError("capture_end: no capture of this graph is underway");
}
absl::Status CUDAGraph::replay() {
  return absl::InvalidArgumentError(absl::StrCat("replay: the graph holds no finished capture (",
                                                 state_->status.message(), ")"));
}
void CUDAGraph::reset() {}
MempoolId CUDAGraph::pool() const { return {}; }
absl::StatusOr<size_t> CUDAGraph::num_nodes() const {
  return absl::InvalidArgumentError("num_nodes: the graph holds no finished capture");
}

absl::Status capture_status_of(const CUDAGraph& g) { return g.state_->status; }

absl::Status run_on_side_stream(Device, const std::function<void()>&) {
  return internal::CheckAvailable("cuda::run_on_side_stream");
}

graph::graph(CUDAGraph& g, std::optional<MempoolId>, std::optional<ember::Stream>,
             CaptureErrorMode)
    : graph_(g) {
  EMBER_FAIL(internal::CheckAvailable("cuda::graph").message());
}
graph::~graph() = default;

namespace internal {
CapturedPhilox CapturedDraw(unsigned long long, Generator*, uint64_t) {
  EMBER_FAIL(CheckAvailable("a random-number kernel under capture").message());
}
}  // namespace internal

}  // namespace ember::cuda
