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
// builds it (with the graph pieces of nn/cuda/cudnn_graph.h, Note [cuDNN
// graph building]): tensor descriptors for x, w and y (uids 1, 2, 3; packed
// NCHW strides; the byte alignment of the call's pointers), a convolution
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

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "nn/cuda/cudnn.h"
#include "nn/cuda/cudnn_graph.h"

namespace ember::nn::cudnn::internal {
namespace {

using IntVector = std::vector<int64_t>;

constexpr int64_t kXUid = 1, kWUid = 2, kYUid = 3;

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

cudnnBackendDescriptor_t MakeConvolution(GraphBuilder& g, const Shape& s) {
  const cudnnDataType_t compute = ComputeType(s.type);
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  const int64_t spatial = 2;
  const int64_t dilations[2] = {s.p.dilation[0], s.p.dilation[1]};
  const int64_t strides[2] = {s.p.stride[0], s.p.stride[1]};
  const int64_t paddings[2] = {s.p.padding[0], s.p.padding[1]};
  cudnnBackendDescriptor_t c =
      g.Create(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, "creating a convolution");
  const bool made =
      g.Try(cudnnBackendSetAttribute(c, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1,
                                     &compute),
            "the compute type") &&
      g.Try(cudnnBackendSetAttribute(c, CUDNN_ATTR_CONVOLUTION_CONV_MODE,
                                     CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode),
            "the convolution mode") &&
      g.Try(cudnnBackendSetAttribute(c, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1,
                                     &spatial),
            "the spatial dims") &&
      g.Try(cudnnBackendSetAttribute(c, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2,
                                     dilations),
            "the dilations") &&
      g.Try(cudnnBackendSetAttribute(c, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2,
                                     strides),
            "the strides") &&
      g.Try(cudnnBackendSetAttribute(c, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2,
                                     paddings),
            "the paddings before") &&
      g.Try(cudnnBackendSetAttribute(c, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2,
                                     paddings),
            "the paddings after") &&
      g.Try(cudnnBackendFinalize(c), "finalizing the convolution");
  return made ? c : nullptr;
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

// The direction's operation on tensors x, w, y and convolution `conv`,
// added to the graph.
void AddOperation(GraphBuilder& g, const Shape& s, cudnnBackendDescriptor_t x,
                  cudnnBackendDescriptor_t w, cudnnBackendDescriptor_t y,
                  cudnnBackendDescriptor_t conv) {
  const OperationNames names = NamesOf(s.direction);
  // The scaling factors in double for float64 data, float otherwise (as the
  // legacy path's Scalars).
  const bool in_double = s.type == CUDNN_DATA_DOUBLE;
  const cudnnBackendAttributeType_t scalar_type = in_double ? CUDNN_TYPE_DOUBLE : CUDNN_TYPE_FLOAT;
  const double d_alpha = 1, d_beta = s.accumulate ? 1 : 0;
  const float f_alpha = 1, f_beta = s.accumulate ? 1 : 0;
  const void* alpha = in_double ? static_cast<const void*>(&d_alpha) : &f_alpha;
  const void* beta = in_double ? static_cast<const void*>(&d_beta) : &f_beta;
  cudnnBackendDescriptor_t op = g.Create(names.kind, "creating the operation");
  const bool made =
      g.Try(cudnnBackendSetAttribute(op, names.x, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x),
            "the operation's x") &&
      g.Try(cudnnBackendSetAttribute(op, names.w, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &w),
            "the operation's w") &&
      g.Try(cudnnBackendSetAttribute(op, names.y, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y),
            "the operation's y") &&
      g.Try(cudnnBackendSetAttribute(op, names.conv, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &conv),
            "the operation's convolution") &&
      g.Try(cudnnBackendSetAttribute(op, names.alpha, scalar_type, 1, alpha),
            "the operation's alpha") &&
      g.Try(cudnnBackendSetAttribute(op, names.beta, scalar_type, 1, beta),
            "the operation's beta") &&
      g.Try(cudnnBackendFinalize(op), "finalizing the operation");
  if (made) g.Add(op);
}

// Builds the plan of `s` into `plan`; false, with `why`, when there is none.
bool Build(const Shape& s, Plan* plan, std::string* why) {
  GraphBuilder g(plan->owned);
  auto tensor = [&](int64_t uid, const IntVector& dims, int64_t alignment) {
    return g.Tensor(uid, TensorSpec{.type = s.type, .dims = dims, .alignment = alignment});
  };
  cudnnBackendDescriptor_t x = tensor(kXUid, s.x_sizes, s.alignments[0]);
  cudnnBackendDescriptor_t w = tensor(kWUid, s.w_sizes, s.alignments[1]);
  cudnnBackendDescriptor_t y = tensor(kYUid, s.y_sizes, s.alignments[2]);
  cudnnBackendDescriptor_t conv = MakeConvolution(g, s);
  AddOperation(g, s, x, w, y, conv);
  cudnnBackendDescriptor_t graph = g.Finalize(s.handle);
  if (graph == nullptr) {
    *why = g.why();
    return false;
  }
  // The notes matter only where RefusesEngine may refuse: float32, TF32 off.
  EngineFilter refuse;
  const cudnnDataType_t type = s.type;
  if (type == CUDNN_DATA_FLOAT && !allow_tf32()) {
    refuse = [type](const std::vector<cudnnBackendNumericalNote_t>& notes) {
      return RefusesEngine(notes, type, /*allow_tf32=*/false);
    };
  }
  return ChoosePlan(graph, s.handle, s.device, refuse, plan, why);
}

// Conv2d's plans by GraphPlanKey. Never destroyed, so cached plans outlive
// every thread.
PlanCache& Plans() {
  static PlanCache* cache = new PlanCache();
  return *cache;
}

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
  const Plan* plan = Plans().Find(key, [&](Plan* out, std::string* why) {
    const Shape s{direction,  handle,    device,  DataType(dtype, "conv2d"),
                  x_sizes,    w_sizes,   y_sizes, p,
                  alignments, accumulate};
    return Build(s, out, why);
  });
  if (plan == nullptr) return false;
  void* const pointers[3] = {x, w, y};
  const int64_t uids[3] = {kXUid, kWUid, kYUid};
  Execute(handle, device, *plan, uids, pointers);
  return true;
}

GraphPlanStats GraphStats() { return Plans().Stats(); }

}  // namespace ember::nn::cudnn::internal
