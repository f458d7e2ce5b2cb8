#include "cuda/graphs.h"

#include <cuda_runtime_api.h>

#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cuda/device.h"
#include "cuda/status.h"
#include "cuda/stream.h"
#include "tensor/device_guard.h"
#include "tensor/error.h"
#include "tensor/status_macros.h"

namespace ember::cuda {

struct CUDAGraph::State {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  int device = -1;
  MempoolId pool;
  bool retained = false;  // holds `pool` (RetainPool)
  bool capturing = false;
  cudaStream_t capture_stream = nullptr;
  unsigned long long capture_id = 0;
  absl::Status status = absl::FailedPreconditionError("the graph has captured nothing yet");
  // The generators the captured work drew from (Note [Random numbers under
  // capture]): where their seed and offset go before each replay, and how
  // far the whole graph moves each one's offset.
  struct Drawn {
    Generator* gen;
    DataPtr state;  // two uint64s on the device
    uint64_t increment = 0;
  };
  std::vector<Drawn> generators;
};

namespace {

std::atomic<uint64_t> next_pool_id{1};

cudaStreamCaptureMode ModeOf(CaptureErrorMode mode) {
  switch (mode) {
    case CaptureErrorMode::kThreadLocal:
      return cudaStreamCaptureModeThreadLocal;
    case CaptureErrorMode::kRelaxed:
      return cudaStreamCaptureModeRelaxed;
    case CaptureErrorMode::kGlobal:
      break;
  }
  return cudaStreamCaptureModeGlobal;
}

// The captures CUDAGraph began, by capture id, for CapturedDraw.
struct Captures {
  std::mutex mu;
  std::map<unsigned long long, CUDAGraph::State*> by_id;
  static Captures& Get() {
    static Captures* captures = new Captures;
    return *captures;
  }
};

}  // namespace

MempoolId graph_pool_handle() { return {0, next_pool_id.fetch_add(1)}; }

CUDAGraph::CUDAGraph() : state_(std::make_unique<State>()) {}

CUDAGraph::~CUDAGraph() { reset(); }

absl::Status CUDAGraph::capture_begin(std::optional<MempoolId> pool, CaptureErrorMode mode) {
  State& s = *state_;
  if (s.capturing) {
    return absl::InvalidArgumentError("capture_begin: a capture of this graph is already underway");
  }
  if (s.exec != nullptr) {
    return absl::InvalidArgumentError(
        "capture_begin: this CUDAGraph already owns a captured graph; reset() it (or use another "
        "CUDAGraph) to capture again");
  }
  EMBER_RETURN_IF_ERROR(internal::CheckAvailable("CUDAGraph::capture_begin"));
  const int device = current_device();
  EMBER_ASSIGN_OR_RETURN(Stream stream, current_stream(device));
  if (stream.id() == 0) {
    return absl::InvalidArgumentError(
        "CUDA graphs must be captured on a non-default stream. (However, after capture, it's ok "
        "to replay on the default stream.) Make a stream of cuda::get_stream_from_pool() current "
        "(ember::StreamGuard), or use the cuda::graph scope, which does");
  }
  const MempoolId id = pool.value_or(MempoolId{next_pool_id.fetch_add(1), 0});
  if (id.first == 0 && id.second == 0) {
    return absl::InvalidArgumentError(
        "capture_begin: pool {0, 0} names no pool; pass graph_pool_handle() or another graph's "
        "pool()");
  }
  internal::RetainPool(device, id);
  if (absl::Status st = runtime_status(cudaStreamBeginCapture(stream.stream(), ModeOf(mode)),
                                       "cudaStreamBeginCapture");
      !st.ok()) {
    internal::ReleasePool(device, id);
    return st;
  }
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long capture_id = 0;
  absl::Status info = runtime_status(cudaStreamGetCaptureInfo(stream.stream(), &status, &capture_id),
                                     "cudaStreamGetCaptureInfo");
  if (info.ok()) info = internal::BeginAllocateToPool(device, id, capture_id);
  if (!info.ok()) {
    cudaGraph_t discarded = nullptr;
    (void)cudaStreamEndCapture(stream.stream(), &discarded);
    if (discarded != nullptr) (void)cudaGraphDestroy(discarded);
    internal::ReleasePool(device, id);
    return info;
  }
  s.device = device;
  s.pool = id;
  s.retained = true;
  s.capturing = true;
  s.capture_stream = stream.stream();
  s.capture_id = capture_id;
  s.status = absl::FailedPreconditionError("the capture has not ended");
  std::lock_guard<std::mutex> lock(Captures::Get().mu);
  Captures::Get().by_id[capture_id] = &s;
  return absl::OkStatus();
}

absl::Status CUDAGraph::capture_end() {
  State& s = *state_;
  if (!s.capturing) {
    return absl::InvalidArgumentError("capture_end: no capture of this graph is underway");
  }
  DeviceGuard guard(Device(DeviceType::kCUDA, s.device));
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(s.capture_stream, &graph);
  internal::EndAllocateToPool(s.device, s.pool);
  {
    std::lock_guard<std::mutex> lock(Captures::Get().mu);
    Captures::Get().by_id.erase(s.capture_id);
  }
  s.capturing = false;
  if (ended != cudaSuccess || graph == nullptr) {
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
    (void)cudaGetLastError();  // the invalidation is reported here, not by the next call
    s.status = absl::FailedPreconditionError(absl::StrCat(
        "the CUDA graph capture failed: ", cudaGetErrorString(ended),
        " (a call that cannot be captured ran during it; the error of that call says which)"));
    return s.status;
  }
  cudaGraphExec_t exec = nullptr;
  if (absl::Status st = runtime_status(cudaGraphInstantiate(&exec, graph, 0),
                                       "cudaGraphInstantiate");
      !st.ok()) {
    (void)cudaGraphDestroy(graph);
    s.status = st;
    return st;
  }
  s.graph = graph;
  s.exec = exec;
  s.status = absl::OkStatus();
  return absl::OkStatus();
}

absl::Status CUDAGraph::replay() {
  State& s = *state_;
  if (s.exec == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("replay: the graph holds no finished capture (", s.status.message(), ")"));
  }
  const Device device(DeviceType::kCUDA, s.device);
  DeviceGuard guard(device);
  EMBER_ASSIGN_OR_RETURN(Stream stream, current_stream(s.device));
  for (State::Drawn& d : s.generators) {
    const Generator::PhiloxInputs in = d.gen->philox_engine_inputs(d.increment);
    const uint64_t host[2] = {in.seed, in.offset};
    // From pageable memory: the copy has read `host` when the call returns.
    EMBER_RETURN_IF_ERROR(runtime_status(
        cudaMemcpyAsync(d.state.get(), host, sizeof(host), cudaMemcpyHostToDevice,
                        stream.stream()),
        "cudaMemcpyAsync (the graph's generator state)"));
  }
  return runtime_status(cudaGraphLaunch(s.exec, stream.stream()), "cudaGraphLaunch");
}

void CUDAGraph::reset() {
  State& s = *state_;
  if (s.capturing) {
    cudaGraph_t discarded = nullptr;
    (void)cudaStreamEndCapture(s.capture_stream, &discarded);
    if (discarded != nullptr) (void)cudaGraphDestroy(discarded);
    internal::EndAllocateToPool(s.device, s.pool);
    std::lock_guard<std::mutex> lock(Captures::Get().mu);
    Captures::Get().by_id.erase(s.capture_id);
    s.capturing = false;
  }
  if (s.exec != nullptr) (void)cudaGraphExecDestroy(s.exec);
  if (s.graph != nullptr) (void)cudaGraphDestroy(s.graph);
  s.exec = nullptr;
  s.graph = nullptr;
  s.generators.clear();  // their states go back to the pool
  if (s.retained) internal::ReleasePool(s.device, s.pool);
  s.retained = false;
  s.status = absl::FailedPreconditionError("the graph was reset");
}

MempoolId CUDAGraph::pool() const { return state_->pool; }

absl::StatusOr<size_t> CUDAGraph::num_nodes() const {
  if (state_->graph == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("num_nodes: the graph holds no finished capture (",
                                                   state_->status.message(), ")"));
  }
  size_t n = 0;
  EMBER_RETURN_IF_ERROR(
      runtime_status(cudaGraphGetNodes(state_->graph, nullptr, &n), "cudaGraphGetNodes"));
  return n;
}

absl::Status capture_status_of(const CUDAGraph& g) { return g.state_->status; }

absl::Status run_on_side_stream(Device device, const std::function<void()>& fn) {
  EMBER_RETURN_IF_ERROR(internal::CheckAvailable("cuda::run_on_side_stream"));
  const int index = device.has_index() ? device.index() : current_device();
  DeviceGuard device_guard(Device(DeviceType::kCUDA, index));
  EMBER_ASSIGN_OR_RETURN(Stream caller, current_stream(index));
  EMBER_ASSIGN_OR_RETURN(Stream side, get_stream_from_pool(false, index));
  EMBER_RETURN_IF_ERROR(side.wait_stream(caller));
  {
    StreamGuard on_side(side);
    fn();
  }
  return caller.wait_stream(side);
}

graph::graph(CUDAGraph& g, std::optional<MempoolId> pool, std::optional<ember::Stream> stream,
             CaptureErrorMode mode)
    : graph_(g) {
  if (absl::Status st = internal::CheckAvailable("cuda::graph"); !st.ok()) {
    internal::ThrowStatus(st);
  }
  // As torch.cuda.graph: nothing queued before the capture runs inside it.
  if (absl::Status st = synchronize(); !st.ok()) internal::ThrowStatus(st);
  ember::Stream capture_stream;
  if (stream.has_value()) {
    capture_stream = *stream;
  } else {
    absl::StatusOr<Stream> side = get_stream_from_pool();
    if (!side.ok()) internal::ThrowStatus(side.status());
    capture_stream = *side;
  }
  guard_.emplace(capture_stream);
  if (absl::Status st = graph_.capture_begin(pool, mode); !st.ok()) {
    guard_.reset();
    internal::ThrowStatus(st);
  }
}

graph::~graph() {
  // Kept in the graph (capture_status_of, replay) when it fails.
  (void)graph_.capture_end();
  guard_.reset();
}

namespace internal {

CapturedPhilox CapturedDraw(unsigned long long capture_id, Generator* gen, uint64_t increment) {
  Captures& captures = Captures::Get();
  std::lock_guard<std::mutex> lock(captures.mu);
  auto it = captures.by_id.find(capture_id);
  EMBER_CHECK(it != captures.by_id.end(),
              "random numbers drawn on a CUDA stream that is capturing a graph not begun by "
              "ember::cuda::CUDAGraph: every replay would draw the same numbers; capture with "
              "CUDAGraph::capture_begin or the cuda::graph scope");
  CUDAGraph::State& s = *it->second;
  CUDAGraph::State::Drawn* drawn = nullptr;
  for (CUDAGraph::State::Drawn& d : s.generators) {
    if (d.gen == gen) drawn = &d;
  }
  if (drawn == nullptr) {
    // Allocated during the capture: from the graph's private pool.
    absl::StatusOr<DataPtr> state = caching_allocator_alloc(2 * sizeof(uint64_t), s.device);
    if (!state.ok()) ThrowStatus(state.status());
    s.generators.push_back({gen, std::move(*state), 0});
    drawn = &s.generators.back();
  }
  const uint64_t offset = drawn->increment;
  drawn->increment += (increment + 3) / 4 * 4;
  return {static_cast<const uint64_t*>(drawn->state.get()), offset};
}

}  // namespace internal

}  // namespace ember::cuda
