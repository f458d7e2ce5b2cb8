// Note [cuDNN graph API]
// Why: host time. A convolution call on the legacy path (conv.cc) builds
// five descriptors, looks its algorithm up and calls cudnnConvolution*; on
// an H200 a conv2d forward call costs about 56 us of host time against
// torch's 30 us (train_step_benchmark's BM_LayerHost), and ResNet-18's
// training step is bound by the host. Torch runs convolutions through
// cuDNN's graph ("backend") API instead: a finalized execution plan, built
// once per shape and cached, is executed with a variant pack (the call's
// data pointers and workspace), and nothing else is built per call.
//
// What: under set_graph_api(true) (nn/cuda/cudnn.h; benchmarking keeps the
// legacy path, whose cudnnFind* times the algorithms), each batch chunk's
// convolution (Note [cuDNN batch chunks] in conv.cc) looks up the plan of
// its GraphPlanKey (nn/cuda/conv_graph_plan.h). The first call of a key
// builds it: tensor descriptors for x, w and y (uids 1, 2, 3; packed NCHW
// strides; the byte alignment of the call's pointers), a convolution
// descriptor (cross-correlation, the compute type of the legacy path: float
// for float16 and bfloat16, the data's own otherwise; two spatial dims,
// dilations, strides, and padding before and after), the direction's
// operation (alpha 1, beta 0, or beta 1 where the weight gradient's later
// chunks add up), the operation graph, and cuDNN's heuristics (mode A, then
// the fallback list): the first engine configuration that RefusesEngine lets
// through (no TF32 for float32 unless allowed), whose execution plan
// finalizes and whose workspace the device can allocate becomes the plan.
// Groups have no attribute of their own: the graph API takes them from the
// channel dimensions of x [N, C, H, W] and w [O, C/g, kh, kw] (as torch
// relies on). When no
// configuration qualifies, or any cuDNN call of the building fails, the key
// is cached as "legacy" and the caller runs that shape on the legacy path
// ever after (GraphStats counts both and keeps the last reason). A call then
// takes the workspace from the caching allocator on the handle's stream,
// packs the pointers by uid and calls cudnnBackendExecute; its failures throw.
//
// A plan belongs to the handle it was built with (part of the key): a
// handle is held by one thread at a time (Note [cuDNN handles and
// workspaces]), so no plan is executed by two threads at once. Cached plans,
// and every descriptor they were built from, live as long as the process
// (the cache is never destroyed, as the legacy algorithm cache).
#include "nn/cuda/conv_graph.h"

#include <cudnn.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "cuda/status.h"
#include "nn/cuda/cudnn.h"
#include "tensor/error.h"

namespace ember::nn::cudnn::internal {
namespace {

using IntVector = std::vector<int64_t>;

constexpr int64_t kXUid = 1, kWUid = 2, kYUid = 3;

// Backend descriptors, destroyed (newest first) with their owner.
class Descriptors {
 public:
  Descriptors() = default;
  ~Descriptors() {
    for (auto it = owned_.rbegin(); it != owned_.rend(); ++it) cudnnBackendDestroyDescriptor(*it);
  }
  Descriptors(const Descriptors&) = delete;
  Descriptors& operator=(const Descriptors&) = delete;

  cudnnStatus_t Create(cudnnBackendDescriptorType_t type, cudnnBackendDescriptor_t* d) {
    *d = nullptr;
    const cudnnStatus_t s = cudnnBackendCreateDescriptor(type, d);
    if (s == CUDNN_STATUS_SUCCESS) owned_.push_back(*d);
    return s;
  }

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
bool Ok(cudnnStatus_t s, const char* what, std::string* why) {
  if (s == CUDNN_STATUS_SUCCESS) return true;
  char detail[512] = "";
  cudnnGetLastErrorString(detail, sizeof(detail));
  *why = std::string(what) + ": " + cudnnGetErrorString(s);
  if (detail[0] != '\0') *why += std::string(" (") + detail + ")";
  return false;
}

#define EMBER_GRAPH_TRY(call, what)           \
  do {                                        \
    if (!Ok((call), what, why)) return false; \
  } while (0)

// What one plan is built for.
struct Shape {
  ConvDirection direction;
  cudnnHandle_t handle;
  Device device;
  cudnnDataType_t type;
  const IntVector& x_sizes;
  const IntVector& w_sizes;
  const IntVector& y_sizes;
  const ::ember::nn::internal::ConvParams& p;
  std::array<int64_t, 3> alignments;  // x, w, y
  bool accumulate;
};

bool MakeTensor(Descriptors& owned, cudnnDataType_t type, int64_t uid, const IntVector& dims,
                int64_t alignment, cudnnBackendDescriptor_t* out, std::string* why) {
  const IntVector strides = PackedStrides(dims);
  cudnnBackendDescriptor_t t = nullptr;
  EMBER_GRAPH_TRY(owned.Create(CUDNN_BACKEND_TENSOR_DESCRIPTOR, &t), "creating a tensor");
  EMBER_GRAPH_TRY(
      cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type),
      "a tensor's data type");
  EMBER_GRAPH_TRY(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64,
                                           static_cast<int64_t>(dims.size()), dims.data()),
                  "a tensor's dimensions");
  EMBER_GRAPH_TRY(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64,
                                           static_cast<int64_t>(strides.size()), strides.data()),
                  "a tensor's strides");
  EMBER_GRAPH_TRY(
      cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid),
      "a tensor's uid");
  EMBER_GRAPH_TRY(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1,
                                           &alignment),
                  "a tensor's alignment");
  EMBER_GRAPH_TRY(cudnnBackendFinalize(t), "finalizing a tensor");
  *out = t;
  return true;
}

bool MakeConvolution(Descriptors& owned, const Shape& s, cudnnBackendDescriptor_t* out,
                     std::string* why) {
  const cudnnDataType_t compute = ComputeType(s.type);
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  const int64_t spatial = 2;
  const int64_t dilations[2] = {s.p.dilation[0], s.p.dilation[1]};
  const int64_t strides[2] = {s.p.stride[0], s.p.stride[1]};
  const int64_t paddings[2] = {s.p.padding[0], s.p.padding[1]};
  cudnnBackendDescriptor_t c = nullptr;
  EMBER_GRAPH_TRY(owned.Create(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, &c), "creating a convolution");
  EMBER_GRAPH_TRY(cudnnBackendSetAttribute(c, CUDNN_ATTR_CONVOLUTION_COMP_TYPE,
                                           CUDNN_TYPE_DATA_TYPE, 1, &compute),
                  "the compute type");
  EMBER_GRAPH_TRY(cudnnBackendSetAttribute(c, CUDNN_ATTR_CONVOLUTION_CONV_MODE,
                                           CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode),
                  "the convolution mode");
  EMBER_GRAPH_TRY(cudnnBackendSetAttribute(c, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64,
                                           1, &spatial),
                  "the spatial dims");
  EMBER_GRAPH_TRY(
      cudnnBackendSetAttribute(c, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, dilations),
      "the dilations");
  EMBER_GRAPH_TRY(cudnnBackendSetAttribute(c, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES,
                                           CUDNN_TYPE_INT64, 2, strides),
                  "the strides");
  EMBER_GRAPH_TRY(cudnnBackendSetAttribute(c, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64,
                                           2, paddings),
                  "the paddings before");
  EMBER_GRAPH_TRY(cudnnBackendSetAttribute(c, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS,
                                           CUDNN_TYPE_INT64, 2, paddings),
                  "the paddings after");
  EMBER_GRAPH_TRY(cudnnBackendFinalize(c), "finalizing the convolution");
  *out = c;
  return true;
}

// The descriptor type of a direction's operation and the names of its
// attributes. x and y are the convolution's input and output whichever of
// them is the gradient (dx for backward data, dy for both backwards; w is
// dw for backward weights).
struct OperationNames {
  cudnnBackendDescriptorType_t kind;
  cudnnBackendAttributeName_t alpha, beta, conv, x, w, y;
};

OperationNames NamesOf(ConvDirection direction) {
  switch (direction) {
    case ConvDirection::kForward:
      return {CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y};
    case ConvDirection::kInputGrad:
      return {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY};
    default:
      return {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY};
  }
}

// The direction's operation on tensors x, w, y and convolution `conv`.
bool MakeOperation(Descriptors& owned, const Shape& s, cudnnBackendDescriptor_t x,
                   cudnnBackendDescriptor_t w, cudnnBackendDescriptor_t y,
                   cudnnBackendDescriptor_t conv, cudnnBackendDescriptor_t* out, std::string* why) {
  const OperationNames names = NamesOf(s.direction);
  // The scaling factors in double for float64 data, float otherwise (as the
  // legacy path's Scalars).
  const bool in_double = s.type == CUDNN_DATA_DOUBLE;
  const cudnnBackendAttributeType_t scalar_type = in_double ? CUDNN_TYPE_DOUBLE : CUDNN_TYPE_FLOAT;
  const double d_alpha = 1, d_beta = s.accumulate ? 1 : 0;
  const float f_alpha = 1, f_beta = s.accumulate ? 1 : 0;
  const void* alpha = in_double ? static_cast<const void*>(&d_alpha) : &f_alpha;
  const void* beta = in_double ? static_cast<const void*>(&d_beta) : &f_beta;
  cudnnBackendDescriptor_t op = nullptr;
  EMBER_GRAPH_TRY(owned.Create(names.kind, &op), "creating the operation");
  EMBER_GRAPH_TRY(cudnnBackendSetAttribute(op, names.x, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x),
                  "the operation's x");
  EMBER_GRAPH_TRY(cudnnBackendSetAttribute(op, names.w, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &w),
                  "the operation's w");
  EMBER_GRAPH_TRY(cudnnBackendSetAttribute(op, names.y, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y),
                  "the operation's y");
  EMBER_GRAPH_TRY(cudnnBackendSetAttribute(op, names.conv, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &conv),
                  "the operation's convolution");
  EMBER_GRAPH_TRY(cudnnBackendSetAttribute(op, names.alpha, scalar_type, 1, alpha),
                  "the operation's alpha");
  EMBER_GRAPH_TRY(cudnnBackendSetAttribute(op, names.beta, scalar_type, 1, beta),
                  "the operation's beta");
  EMBER_GRAPH_TRY(cudnnBackendFinalize(op), "finalizing the operation");
  *out = op;
  return true;
}

// The numerical notes of engine configuration `cfg`'s engine.
bool Notes(Descriptors& owned, cudnnBackendDescriptor_t cfg,
           std::vector<cudnnBackendNumericalNote_t>* notes, std::string* why) {
  cudnnBackendDescriptor_t engine = nullptr;
  EMBER_GRAPH_TRY(owned.Create(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &engine), "creating an engine");
  int64_t count = 0;
  EMBER_GRAPH_TRY(cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE,
                                           CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &count, &engine),
                  "an engine configuration's engine");
  notes->assign(static_cast<size_t>(CUDNN_NUMERICAL_NOTE_TYPE_COUNT),
                CUDNN_NUMERICAL_NOTE_TYPE_COUNT);
  EMBER_GRAPH_TRY(
      cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                               CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &count, notes->data()),
      "an engine's numerical notes");
  notes->resize(static_cast<size_t>(
      std::max<int64_t>(0, std::min<int64_t>(count, CUDNN_NUMERICAL_NOTE_TYPE_COUNT))));
  return true;
}

// The engine configurations cuDNN's heuristics of `mode` rank for `graph`.
bool Heuristics(Descriptors& owned, cudnnBackendDescriptor_t graph, cudnnBackendHeurMode_t mode,
                std::vector<cudnnBackendDescriptor_t>* cfgs, std::string* why) {
  cudnnBackendDescriptor_t heur = nullptr;
  EMBER_GRAPH_TRY(owned.Create(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heur), "creating heuristics");
  EMBER_GRAPH_TRY(cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH,
                                           CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph),
                  "the heuristics' graph");
  EMBER_GRAPH_TRY(
      cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode),
      "the heuristics' mode");
  EMBER_GRAPH_TRY(cudnnBackendFinalize(heur), "finalizing the heuristics");
  int64_t count = 0;
  EMBER_GRAPH_TRY(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                           CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr),
                  "the heuristics' result count");
  cfgs->assign(static_cast<size_t>(std::max<int64_t>(count, 0)), nullptr);
  for (cudnnBackendDescriptor_t& cfg : *cfgs) {
    EMBER_GRAPH_TRY(owned.Create(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &cfg),
                    "creating an engine configuration");
  }
  if (cfgs->empty()) return true;
  EMBER_GRAPH_TRY(
      cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                               count, &count, cfgs->data()),
      "the heuristics' results");
  cfgs->resize(static_cast<size_t>(std::max<int64_t>(0, std::min<int64_t>(count, cfgs->size()))));
  return true;
}

// Builds the plan of `s` into `plan`; false, with `why`, when there is none.
bool Build(const Shape& s, Plan* plan, std::string* why) {
  Descriptors& owned = plan->owned;
  cudnnBackendDescriptor_t x = nullptr, w = nullptr, y = nullptr, conv = nullptr, op = nullptr;
  if (!MakeTensor(owned, s.type, kXUid, s.x_sizes, s.alignments[0], &x, why) ||
      !MakeTensor(owned, s.type, kWUid, s.w_sizes, s.alignments[1], &w, why) ||
      !MakeTensor(owned, s.type, kYUid, s.y_sizes, s.alignments[2], &y, why) ||
      !MakeConvolution(owned, s, &conv, why) || !MakeOperation(owned, s, x, w, y, conv, &op, why)) {
    return false;
  }
  cudnnBackendDescriptor_t graph = nullptr;
  EMBER_GRAPH_TRY(owned.Create(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, &graph),
                  "creating the operation graph");
  EMBER_GRAPH_TRY(cudnnBackendSetAttribute(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS,
                                           CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &op),
                  "the graph's operation");
  cudnnHandle_t handle = s.handle;
  EMBER_GRAPH_TRY(cudnnBackendSetAttribute(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE,
                                           CUDNN_TYPE_HANDLE, 1, &handle),
                  "the graph's handle");
  EMBER_GRAPH_TRY(cudnnBackendFinalize(graph), "finalizing the operation graph");

  const cudnnDataType_t type = s.type;
  const bool tf32 = allow_tf32();
  std::string refused;
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    std::vector<cudnnBackendDescriptor_t> cfgs;
    if (!Heuristics(owned, graph, mode, &cfgs, why)) {
      refused = *why;
      continue;
    }
    for (cudnnBackendDescriptor_t cfg : cfgs) {
      // The notes matter only where RefusesEngine may refuse: float32, TF32 off.
      if (type == CUDNN_DATA_FLOAT && !tf32) {
        std::vector<cudnnBackendNumericalNote_t> notes;
        if (!Notes(owned, cfg, &notes, why)) {
          refused = *why;
          continue;
        }
        if (RefusesEngine(notes, type, tf32)) {
          refused = "an engine using TF32 (turned off) or lower-precision inputs was refused";
          continue;
        }
      }
      cudnnBackendDescriptor_t candidate = nullptr;
      int64_t bytes = 0, count = 0;
      if (!Ok(owned.Create(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &candidate),
              "creating an execution plan", why) ||
          !Ok(cudnnBackendSetAttribute(candidate, CUDNN_ATTR_EXECUTION_PLAN_HANDLE,
                                       CUDNN_TYPE_HANDLE, 1, &handle),
              "the plan's handle", why) ||
          !Ok(cudnnBackendSetAttribute(candidate, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                       CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg),
              "the plan's engine configuration", why) ||
          !Ok(cudnnBackendFinalize(candidate), "finalizing an execution plan", why) ||
          !Ok(cudnnBackendGetAttribute(candidate, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                       CUDNN_TYPE_INT64, 1, &count, &bytes),
              "the plan's workspace size", why)) {
        refused = *why;
        continue;
      }
      try {
        // Freed at once into the caching allocator, which serves the calls'.
        Workspace(s.device, static_cast<size_t>(std::max<int64_t>(bytes, 0)));
      } catch (const Error& e) {
        refused = e.what();  // Out of memory for this one: try one that needs less.
        continue;
      }
      plan->plan = candidate;
      plan->workspace = std::max<int64_t>(bytes, 0);
      return true;
    }
  }
  *why = refused.empty() ? "cuDNN's heuristics offer no engine" : refused;
  return false;
}

#undef EMBER_GRAPH_TRY

// Plans by GraphPlanKey; a null plan: the legacy path's shape. Never
// destroyed, so cached plans outlive every thread.
class PlanCache {
 public:
  static PlanCache& Get() {
    static PlanCache* cache = new PlanCache();
    return *cache;
  }

  // The plan of `key` (null for the legacy path), built by `build` on the
  // first call of the key.
  template <typename F>
  const Plan* Find(const IntVector& key, F build) {
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
  std::map<IntVector, std::unique_ptr<Plan>> plans_;
  GraphPlanStats stats_;
};

// A variant pack, destroyed with the object.
class VariantPack {
 public:
  VariantPack() {
    EMBER_CUDA_CHECK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &d_));
  }
  ~VariantPack() { cudnnBackendDestroyDescriptor(d_); }
  VariantPack(const VariantPack&) = delete;
  VariantPack& operator=(const VariantPack&) = delete;
  cudnnBackendDescriptor_t get() const { return d_; }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

}  // namespace

bool GraphConvolution(ConvDirection direction, cudnnHandle_t handle, Device device, Dtype dtype,
                      const std::vector<int64_t>& x_sizes, const std::vector<int64_t>& w_sizes,
                      const std::vector<int64_t>& y_sizes,
                      const ::ember::nn::internal::ConvParams& p, void* x, void* w, void* y,
                      bool accumulate) {
  const std::array<int64_t, 3> alignments = {Alignment(reinterpret_cast<uintptr_t>(x)),
                                             Alignment(reinterpret_cast<uintptr_t>(w)),
                                             Alignment(reinterpret_cast<uintptr_t>(y))};
  const IntVector key = GraphPlanKey(device.index(), reinterpret_cast<uintptr_t>(handle), direction,
                                     static_cast<int>(dtype), allow_tf32(), accumulate, x_sizes,
                                     w_sizes, p, IntVector(alignments.begin(), alignments.end()));
  const Plan* plan = PlanCache::Get().Find(key, [&](Plan* out, std::string* why) {
    const Shape s{direction,  handle,    device,  DataType(dtype, "conv2d"),
                  x_sizes,    w_sizes,   y_sizes, p,
                  alignments, accumulate};
    return Build(s, out, why);
  });
  if (plan == nullptr) return false;
  Tensor workspace = Workspace(device, static_cast<size_t>(plan->workspace));
  void* pointers[3] = {x, w, y};
  const int64_t uids[3] = {kXUid, kWUid, kYUid};
  void* scratch = workspace.raw_data();
  VariantPack pack;
  EMBER_CUDA_CHECK(cudnnBackendSetAttribute(pack.get(), CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
                                            CUDNN_TYPE_VOID_PTR, 3, pointers));
  EMBER_CUDA_CHECK(cudnnBackendSetAttribute(pack.get(), CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS,
                                            CUDNN_TYPE_INT64, 3, uids));
  EMBER_CUDA_CHECK(cudnnBackendSetAttribute(pack.get(), CUDNN_ATTR_VARIANT_PACK_WORKSPACE,
                                            CUDNN_TYPE_VOID_PTR, 1, &scratch));
  EMBER_CUDA_CHECK(cudnnBackendFinalize(pack.get()));
  EMBER_CUDA_CHECK(cudnnBackendExecute(handle, plan->plan, pack.get()));
  return true;
}

GraphPlanStats GraphStats() { return PlanCache::Get().Stats(); }

}  // namespace ember::nn::cudnn::internal
