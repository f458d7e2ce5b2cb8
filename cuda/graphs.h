// CUDA graphs, as torch.cuda.graphs: capture the work a stream is given
// once, replay it with one launch and no host work per kernel.
//
//   ```cpp compile-only
//   #include "cuda/graphs.h"
//   #include "tensor/factories.h"
//   const ember::Device gpu(ember::DeviceType::kCUDA, 0);
//   ember::Tensor x = ember::zeros({1024}, ember::TensorOptions().device(gpu));  // static input
//   ember::Tensor y;                                                              // static output
//   ember::cuda::CUDAGraph g;
//   {
//     ember::cuda::graph capture(g);  // a side stream, the graph's private pool
//     y = (x * 2).exp();
//   }
//   EMBER_RETURN_IF_ERROR(capture_status_of(g));
//   x.fill_(1.0);                      // new data into the static input
//   EMBER_RETURN_IF_ERROR(g.replay()); // y now holds exp(2)
//   ```
//
// Note [Capturing a graph]
// capture_begin starts a CUDA stream capture (cudaStreamBeginCapture) on the
// calling thread's current stream, which must not be a device's default
// stream; the kernels, copies and event records queued on it, and on streams
// made to wait on it, until capture_end, become the graph instead of
// running. capture_end instantiates it (cudaGraphInstantiate); replay()
// launches the whole graph on the current stream.
// - Memory: what the captured work allocates comes from the graph's private
//   pool (Note [Graph memory pools] in caching_allocator.h), so a replay
//   reads and writes the addresses the capture used: tensors allocated
//   during the capture are the graph's static outputs, each replay rewrites
//   them. Pass pool() of an earlier graph, or a graph_pool_handle(), to
//   share one pool among graphs that replay in capture order (torch's
//   advice). The pool lives until every graph sharing it is reset and its
//   last tensor freed.
// - Random numbers: a Philox generator used during the capture hands the
//   captured kernels its seed and offset through device memory (Note
//   [Random numbers under capture] in random_kernels.h); each replay writes
//   the generator's current seed and offset there, then moves the offset on
//   by what the whole graph draws. So every replay draws new numbers, and a
//   replay from a given generator state draws what eager work from that
//   state draws.
// - What cannot be captured fails while capturing with ember::Error naming
//   it, and the capture ends: a copy to the host or any wait for the device
//   (item(), cpu(), synchronize), and the allocator's release of memory
//   (empty_cache does nothing during a capture). The CUDA runtime's own
//   refusals (cudaErrorStreamCaptureUnsupported, ...) surface as errors of
//   the call that met them. capture_end after such an error returns it,
//   and the graph stays empty (replay is refused, naming the cause).
//
// Errors: absl::Status for the calls (FailedPrecondition without a usable
// device, naming the reason; InvalidArgument for capture on a default
// stream, a second capture_begin, replay before capture_end). The `graph`
// scope's constructor throws ember::Error when the capture cannot begin; its
// destructor never throws: a failure there is kept for capture_status_of().
//
// Thread-safety: a CUDAGraph is used from one thread at a time; captures on
// other threads proceed under the capture mode's rules (kGlobal, the
// default, makes other threads' unsafe calls fail while it is underway, as
// CUDA documents).
#ifndef EMBER_CUDA_GRAPHS_H_
#define EMBER_CUDA_GRAPHS_H_

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cuda/caching_allocator.h"
#include "tensor/factories.h"
#include "tensor/stream.h"

namespace ember::cuda {

// torch's capture_error_mode: "global", "thread_local", "relaxed".
enum class CaptureErrorMode { kGlobal, kThreadLocal, kRelaxed };

// A pool id to share among graphs (torch.cuda.graph_pool_handle): (0, n).
MempoolId graph_pool_handle();

class CUDAGraph {
 public:
  CUDAGraph();
  ~CUDAGraph();  // reset()
  CUDAGraph(const CUDAGraph&) = delete;
  CUDAGraph& operator=(const CUDAGraph&) = delete;

  // Note [Capturing a graph]. `pool`: a graph_pool_handle() or another
  // graph's pool(); default: the graph's own, (n, 0).
  absl::Status capture_begin(std::optional<MempoolId> pool = std::nullopt,
                             CaptureErrorMode mode = CaptureErrorMode::kGlobal);
  absl::Status capture_end();
  // Launches the captured work on the current stream of the capture's
  // device. InvalidArgument before a capture ended well.
  absl::Status replay();
  // Drops the graph and its hold on the pool; the graph may capture again.
  void reset();
  // The pool this graph's capture allocates from ({0, 0} before any).
  MempoolId pool() const;
  // The captured graph's node count (kernels, copies, ...), for tests and
  // debugging; InvalidArgument before a capture ended well.
  absl::StatusOr<size_t> num_nodes() const;

  struct State;  // the CUDA handles (graphs.cc)

 private:
  std::unique_ptr<State> state_;
  friend absl::Status capture_status_of(const CUDAGraph& g);
};

// The capture of `g` in the scope of this object (torch.cuda.graph): the
// device is synchronized, the capture runs on `stream` (default: a stream of
// the device's pool, made current for the scope) and the scope's end ends
// it. Throws ember::Error when the capture cannot begin.
class graph {
 public:
  explicit graph(CUDAGraph& g, std::optional<MempoolId> pool = std::nullopt,
                 std::optional<ember::Stream> stream = std::nullopt,
                 CaptureErrorMode mode = CaptureErrorMode::kGlobal);
  ~graph();
  graph(const graph&) = delete;
  graph& operator=(const graph&) = delete;

 private:
  CUDAGraph& graph_;
  std::optional<StreamGuard> guard_;
};

// What the last capture of `g` came to: OK once it ended well, else why
// (also what replay() refuses with).
absl::Status capture_status_of(const CUDAGraph& g);

// Runs `fn` with a stream of `device`'s pool current, that stream first made
// to wait for the current stream's work and the current stream then made to
// wait for its work: the warm-up before a capture that torch's
// make_graphed_callables runs (lazy initialisation and first allocations
// happen there, apart from the caller's stream). FailedPrecondition without
// a usable device; what fn throws propagates.
absl::Status run_on_side_stream(Device device, const std::function<void()>& fn);

namespace internal {
// For a random-number kernel launched while capture `capture_id` is
// underway (Note [Random numbers under capture] in random_kernels.h): where
// the kernel reads `gen`'s seed and starting offset, and its offset within
// the graph, which moves on by `increment` (rounded up to 4). Throws
// ember::Error when the capture was not begun by a CUDAGraph.
struct CapturedPhilox {
  const uint64_t* state;
  uint64_t offset;
};
CapturedPhilox CapturedDraw(unsigned long long capture_id, Generator* gen, uint64_t increment);
}  // namespace internal

}  // namespace ember::cuda

#endif  // EMBER_CUDA_GRAPHS_H_
