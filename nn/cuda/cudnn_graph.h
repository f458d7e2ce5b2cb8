// The pieces of cuDNN's graph ("backend") API that nn's graph-API kernels
// share (conv2d's three directions in conv_graph.cc, fused attention in
// attention.cc): tensors and operations built into an operation graph, an
// execution plan chosen over cuDNN's heuristics, a cache of plans by key, and
// execution through a variant pack. Private to nn/cuda/.
//
// Note [cuDNN graph building]
// A graph is a chain of cuDNN calls, any of which may refuse (a shape or a
// fusion no engine implements). A GraphBuilder keeps the first refusal, with
// cuDNN's words, and makes every later call a no-op that returns null, so a
// kernel writes its graph as straight-line code and checks once, at
// Finalize. Every descriptor it creates belongs to the Plan being built and
// is destroyed with it (newest first). Tensors are named by uids: the
// caller's non-virtual tensors by the uids it will pass to Execute, virtual
// ones (intermediates that never reach memory) by uids the builder counts up
// from kFirstVirtualUid. ChoosePlan then takes cuDNN's heuristics (mode A,
// then the fallback list) and keeps the first engine configuration that the
// caller's filter lets through, whose plan finalizes and whose workspace the
// device can allocate. A PlanCache keeps one plan, or the reason there is
// none, per key for the life of the process: the caller runs a key without a
// plan on its other path ever after.
//
// A plan belongs to the handle it was built with (part of every key): a
// handle is held by one thread at a time (Note [cuDNN handles and
// workspaces] in cudnn.h), so no plan is executed by two threads at once.
//
// Thread-safety: a GraphBuilder and a Plan under construction belong to one
// thread; PlanCache and Execute are thread-safe.
#ifndef EMBER_NN_CUDA_CUDNN_GRAPH_H_
#define EMBER_NN_CUDA_CUDNN_GRAPH_H_

#include <cudnn.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "tensor/device.h"

namespace ember::nn::cudnn::internal {

// The strides of a contiguous tensor of `dims` (row-major: NCHW for 4 dims).
inline std::vector<int64_t> PackedStrides(const std::vector<int64_t>& dims) {
  std::vector<int64_t> strides(dims.size(), 1);
  for (size_t i = dims.size(); i-- > 1;) strides[i - 1] = strides[i] * dims[i];
  return strides;
}

// The largest power of two, at most 16, that divides `address` (16 for
// address 0): the byte alignment a tensor descriptor promises cuDNN for the
// data it is executed on.
inline int64_t Alignment(uintptr_t address) {
  int64_t alignment = 1;
  while (alignment < 16 && address % (2 * alignment) == 0) alignment *= 2;
  return alignment;
}

// Whether an engine whose numerical notes are `notes` must be refused for
// data of `type`, as torch filters cuDNN's engine configurations: for
// float32 with TF32 off (`allow_tf32` false), one on the tensor cores (TF32
// products) or one that converts its inputs to a lower precision. float32
// with TF32 allowed, float64, float16 and bfloat16 take any engine, as on
// the legacy path.
inline bool RefusesEngine(const std::vector<cudnnBackendNumericalNote_t>& notes,
                          cudnnDataType_t type, bool allow_tf32) {
  if (type != CUDNN_DATA_FLOAT || allow_tf32) return false;
  for (cudnnBackendNumericalNote_t note : notes) {
    if (note == CUDNN_NUMERICAL_NOTE_TENSOR_CORE ||
        note == CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS) {
      return true;
    }
  }
  return false;
}

// Backend descriptors, destroyed (newest first) with their owner.
class Descriptors {
 public:
  Descriptors() = default;
  ~Descriptors();
  Descriptors(const Descriptors&) = delete;
  Descriptors& operator=(const Descriptors&) = delete;

  cudnnStatus_t Create(cudnnBackendDescriptorType_t type, cudnnBackendDescriptor_t* d);

 private:
  std::vector<cudnnBackendDescriptor_t> owned_;
};

// A finalized execution plan with every descriptor it was built from.
struct Plan {
  Descriptors owned;
  cudnnBackendDescriptor_t plan = nullptr;
  int64_t workspace = 0;
};

// True for success; otherwise sets `why` to what failed, with cuDNN's words.
bool Ok(cudnnStatus_t s, const char* what, std::string* why);

// One tensor of a graph.
struct TensorSpec {
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  std::vector<int64_t> dims;
  std::vector<int64_t> strides;  // empty: packed (PackedStrides)
  int64_t alignment = 16;        // of the data pointer, as Alignment gives it
  bool is_virtual = false;       // an intermediate that never reaches memory
  bool by_value = false;         // a host scalar, passed in the variant pack
};

// Builds an operation graph into a Plan's descriptors (Note [cuDNN graph
// building]). Each method returns the descriptor it made, or null once any
// call has failed.
class GraphBuilder {
 public:
  // Where the uids of virtual tensors start; callers' uids stay below it.
  static constexpr int64_t kFirstVirtualUid = 1 << 20;

  explicit GraphBuilder(Descriptors& owned) : owned_(owned) {}

  // A tensor named `uid` (the caller's, below kFirstVirtualUid).
  cudnnBackendDescriptor_t Tensor(int64_t uid, const TensorSpec& spec);
  // An intermediate of `type`, `dims` and `strides` (empty: packed).
  cudnnBackendDescriptor_t Virtual(cudnnDataType_t type, std::vector<int64_t> dims,
                                   std::vector<int64_t> strides = {});
  // A float scalar passed by value under `uid` ([1, 1, 1, 1]).
  cudnnBackendDescriptor_t Scalar(int64_t uid);

  // y = mode(x[, b[, t]]) computed in `compute` (b and t null where the mode
  // takes fewer inputs; BINARY_SELECT: y = t ? x : b). `axis`: GEN_INDEX's.
  void Pointwise(cudnnPointwiseMode_t mode, cudnnDataType_t compute, cudnnBackendDescriptor_t x,
                 cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t t,
                 cudnnBackendDescriptor_t y, int64_t axis = -1);
  // c = a b over the last two dims, batched over the others, in `compute`.
  void Matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c,
              cudnnDataType_t compute);
  // y = reduce(x) over the dims where y has size 1, in float.
  void Reduction(cudnnReduceTensorOp_t op, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y);
  // y = x seen with y's dims and strides (a transpose, as the graph sees it).
  void Reshape(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y);
  // An operation the caller finalized (a convolution), to be part of the graph.
  void Add(cudnnBackendDescriptor_t operation);
  // Runs a cuDNN call of the caller's in the chain: false, recording `what`
  // and cuDNN's words, when it (or an earlier call) failed.
  bool Try(cudnnStatus_t status, const char* what);
  // A descriptor of `type` owned by the plan (null after a failure).
  cudnnBackendDescriptor_t Create(cudnnBackendDescriptorType_t type, const char* what);

  // The finalized operation graph of every operation added, on `handle`
  // (null after a failure).
  cudnnBackendDescriptor_t Finalize(cudnnHandle_t handle);

  bool ok() const { return why_.empty(); }
  const std::string& why() const { return why_; }

 private:
  Descriptors& owned_;
  std::vector<cudnnBackendDescriptor_t> operations_;
  int64_t next_virtual_uid_ = kFirstVirtualUid;
  std::string why_;
};

// Whether to refuse an engine with these numerical notes (RefusesEngine
// bound to the data's type and the TF32 switch); empty: refuse none.
using EngineFilter = std::function<bool(const std::vector<cudnnBackendNumericalNote_t>&)>;

// The execution plan of finalized `graph` on `handle` and `device`
// (Note [cuDNN graph building]) into `plan`; false, with `why`, when no
// engine configuration qualifies.
bool ChoosePlan(cudnnBackendDescriptor_t graph, cudnnHandle_t handle, Device device,
                const EngineFilter& refuse, Plan* plan, std::string* why);

// What a plan cache holds (for tests and diagnostics): keys with a plan,
// keys left to the caller's other path, and why the last of those was.
struct GraphPlanStats {
  int64_t plans = 0;
  int64_t fallbacks = 0;
  std::string last_fallback;
};

// Plans by key; a null plan: no plan for the key. Made once per kernel and
// never destroyed, so cached plans outlive every thread.
class PlanCache {
 public:
  PlanCache() = default;
  PlanCache(const PlanCache&) = delete;
  PlanCache& operator=(const PlanCache&) = delete;

  // The plan of `key` (null: none), built by `build(Plan*, std::string*
  // why)` on the key's first call.
  template <typename F>
  const Plan* Find(const std::vector<int64_t>& key, F build) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = plans_.find(key);
      if (it != plans_.end()) return it->second.get();
    }
    // Outside the lock: it calls into cuDNN. Keys hold the handle, which one
    // thread holds at a time, so no two threads build the same key.
    auto plan = std::make_unique<Plan>();
    std::string why;
    const bool built = build(plan.get(), &why);
    std::lock_guard<std::mutex> lock(mu_);
    if (!built) {
      plan.reset();
      ++stats_.fallbacks;
      stats_.last_fallback = why;
    } else {
      ++stats_.plans;
    }
    return plans_.emplace(key, std::move(plan)).first->second.get();
  }

  GraphPlanStats Stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

 private:
  std::mutex mu_;
  std::map<std::vector<int64_t>, std::unique_ptr<Plan>> plans_;
  GraphPlanStats stats_;
};

// Executes `plan` on `handle`'s stream with the data of each uid at the
// pointer in the same place (a by-value scalar's pointer is to host memory),
// and a workspace from the caching allocator on `device`. Throws when cuDNN
// fails.
void Execute(cudnnHandle_t handle, Device device, const Plan& plan, std::span<const int64_t> uids,
             std::span<void* const> pointers);

}  // namespace ember::nn::cudnn::internal

#endif  // EMBER_NN_CUDA_CUDNN_GRAPH_H_
