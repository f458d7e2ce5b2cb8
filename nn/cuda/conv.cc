// conv2d's CUDA kernels through cuDNN (nn/conv_kernels.h): the convolution,
// its input gradient (also nn's transposed convolution) and its weight
// gradient (the bias's by Ember's own reduction: Note [conv2d bias
// gradient]), for float32, float64, float16 and bfloat16, any stride,
// padding, dilation and groups. float16 and bfloat16 convolutions
// accumulate in float (as torch's) on the tensor cores; float32 ones may use
// TF32 unless set_allow_tf32(false).
//
// Note [cuDNN convolution algorithms]
// Each direction's algorithm is chosen once per shape by cuDNN's heuristics
// (cudnnGetConvolution*Algorithm_v7, as torch with benchmark=False) or, under
// set_benchmark(true), by timing them on the call's tensors
// (cudnnFind*AlgorithmEx, with a workspace as large as the heuristics'
// hungriest usable algorithm wants): the first of that ranking that cuDNN
// reports usable, whose workspace size it can
// tell for the math type in force and whose workspace the device can
// allocate (out of memory for one, the next is tried). The choice (algorithm,
// math type, workspace size) is cached by device, dtype, input and weight
// sizes, stride, padding, dilation, groups and the TF32 and benchmark
// settings (nn/cuda/cudnn.h), so later calls of a shape go straight to the
// convolution. Operands are made contiguous (NCHW); empty shapes are answered
// without cuDNN, which refuses zero-sized dimensions; batches past cuDNN's int
// dimensions run in chunks (Note [cuDNN batch chunks]). Under
// set_graph_api(true) (and not set_benchmark(true)) each chunk runs through
// a cached graph-API execution plan instead where cuDNN builds one for its
// shape (Note [cuDNN graph API] in conv_graph.cc), with the bias added by
// Ember's own broadcast add.
#include <cudnn.h>

#include <algorithm>
#include <climits>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "cuda/status.h"
#include "nn/conv_kernels.h"
#include "nn/cuda/conv_graph.h"
#include "nn/cuda/cudnn.h"
#include "tensor/device_guard.h"
#include "tensor/error.h"
#include "tensor/factories.h"
#include "tensor/ops.h"

namespace ember::nn::cudnn {
namespace {

using ::ember::nn::internal::ConvParams;
using IntVector = std::vector<int64_t>;
using Direction = internal::ConvDirection;

struct Algo {
  int algo;
  cudnnMathType_t math;
  size_t workspace;
};

// [N, O, OH, OW] for x [N, C, H, W] and w [O, C/g, kh, kw].
IntVector OutputSizes(const IntVector& x, const IntVector& w, const ConvParams& p) {
  return {x[0], w[0], (x[2] + 2 * p.padding[0] - p.dilation[0] * (w[2] - 1) - 1) / p.stride[0] + 1,
          (x[3] + 2 * p.padding[1] - p.dilation[1] * (w[3] - 1) - 1) / p.stride[1] + 1};
}

// The descriptors of one convolution without empty dimensions (cuDNN
// refuses them): x [N, C, H, W], w [O, C/g, kh, kw], y [N, O, OH, OW].
struct Conv {
  Conv(Dtype dtype, const IntVector& x_sizes, const IntVector& w_sizes, const ConvParams& p,
       const char* op)
      : dtype(dtype), type(internal::DataType(dtype, op)), scalars(type) {
    y_sizes = OutputSizes(x_sizes, w_sizes, p);
    x.Set(type, x_sizes, op);
    w.Set(type, w_sizes, op);
    y.Set(type, y_sizes, op);
    EMBER_CUDA_CHECK(cudnnSetConvolution2dDescriptor(
        conv.get(), internal::ToInt(p.padding[0], op, "padding"),
        internal::ToInt(p.padding[1], op, "padding"), internal::ToInt(p.stride[0], op, "stride"),
        internal::ToInt(p.stride[1], op, "stride"), internal::ToInt(p.dilation[0], op, "dilation"),
        internal::ToInt(p.dilation[1], op, "dilation"), CUDNN_CROSS_CORRELATION,
        internal::ComputeType(type)));
    EMBER_CUDA_CHECK(
        cudnnSetConvolutionGroupCount(conv.get(), internal::ToInt(p.groups, op, "groups")));
    EMBER_CUDA_CHECK(cudnnSetConvolutionMathType(conv.get(), BaseMath()));
    key = {static_cast<int64_t>(dtype), allow_tf32() ? 1 : 0, benchmark() ? 1 : 0};
    key.insert(key.end(), x_sizes.begin(), x_sizes.end());
    key.insert(key.end(), w_sizes.begin(), w_sizes.end());
    key.insert(key.end(), {p.stride[0], p.stride[1], p.padding[0], p.padding[1], p.dilation[0],
                           p.dilation[1], p.groups});
  }

  // Tensor cores for float32 only where TF32 is allowed (CUDNN_FMA_MATH
  // keeps full float32 products); float16 and bfloat16 always use them.
  cudnnMathType_t BaseMath() const {
    if (type == CUDNN_DATA_HALF || type == CUDNN_DATA_BFLOAT16) return CUDNN_TENSOR_OP_MATH;
    return type == CUDNN_DATA_FLOAT && !allow_tf32() ? CUDNN_FMA_MATH : CUDNN_DEFAULT_MATH;
  }

  Dtype dtype;
  cudnnDataType_t type;
  internal::Scalars scalars;
  IntVector y_sizes;
  internal::TensorDescriptor x, y;
  internal::FilterDescriptor w;
  internal::ConvolutionDescriptor conv;
  IntVector key;  // without the device and direction
};

// The first usable algorithm of `perfs` (ranked by cuDNN) whose workspace
// `device` can allocate, with the conv's math type set to it (Note [cuDNN
// convolution algorithms]).
template <typename Perf, typename SizeFn>
Algo Pick(const Perf* perfs, int count, Conv& c, SizeFn workspace_size, Device device,
          const char* op) {
  std::string why = "none reported usable";
  for (int i = 0; i < count; ++i) {
    if (perfs[i].status != CUDNN_STATUS_SUCCESS) continue;
    const cudnnMathType_t math =
        c.BaseMath() == CUDNN_FMA_MATH ? CUDNN_FMA_MATH : perfs[i].mathType;
    EMBER_CUDA_CHECK(cudnnSetConvolutionMathType(c.conv.get(), math));
    size_t bytes = 0;
    if (workspace_size(perfs[i].algo, &bytes) != CUDNN_STATUS_SUCCESS) continue;
    try {
      // Freed at once into the caching allocator, which serves the call's.
      internal::Workspace(device, bytes);
    } catch (const Error& e) {
      why = e.what();  // Out of memory for this one: try one that needs less.
      continue;
    }
    return {static_cast<int>(perfs[i].algo), math, bytes};
  }
  EMBER_FAIL(op, ": cuDNN offers no usable algorithm for this convolution (dtype ",
             dtype_name(c.dtype), "; ", why,
             "); try float32 or a smaller batch, or run it on the CPU with .to(ember::kCPU)");
}

// The workspace cudnnFind*AlgorithmEx times the algorithms with: what the
// most demanding of the heuristics' usable algorithms wants or, when that
// does not fit in memory, none (then only algorithms without one are timed).
template <typename Perf>
Tensor TrialWorkspace(const Perf* perfs, int count, Device device) {
  size_t most = 0;
  for (int i = 0; i < count; ++i) {
    if (perfs[i].status == CUDNN_STATUS_SUCCESS) most = std::max(most, perfs[i].memory);
  }
  try {
    return internal::Workspace(device, most);
  } catch (const Error&) {
    return internal::Workspace(device, 0);
  }
}

size_t Bytes(const Tensor& t) { return static_cast<size_t>(t.numel()); }

class AlgoCache {
 public:
  static AlgoCache& Get() {
    static AlgoCache* cache = new AlgoCache();  // Outlives every thread.
    return *cache;
  }
  // The cached algorithm of (device, direction, c), or `choose()`'s, cached.
  template <typename F>
  Algo Find(Device device, Direction direction, Conv& c, F choose) {
    IntVector key = c.key;
    key.insert(key.begin(),
               {static_cast<int64_t>(device.index()), static_cast<int64_t>(direction)});
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = algos_.find(key);
      if (it != algos_.end()) {
        EMBER_CUDA_CHECK(cudnnSetConvolutionMathType(c.conv.get(), it->second.math));
        return it->second;
      }
    }
    const Algo algo = choose();  // Outside the lock: it calls into cuDNN.
    std::lock_guard<std::mutex> lock(mu_);
    algos_.emplace(key, algo);
    return algo;
  }

 private:
  std::mutex mu_;
  std::map<IntVector, Algo> algos_;
};

IntVector SizesOf(const Tensor& t) { return IntVector(t.sizes().begin(), t.sizes().end()); }

// Note [cuDNN batch chunks]
// cuDNN's descriptors hold int dimensions and strides, so a batch whose input
// or output has more than INT_MAX elements runs as consecutive chunks of whole
// samples (as torch splits it): each chunk is a convolution of its own shape
// (its algorithm cached as any other), and the weight gradient adds the
// chunks' parts (cuDNN's beta = 1 after the first).
//
// Note [conv2d bias gradient]
// The bias's gradient, grad_output summed over N, OH and OW, is Ember's own
// CUDA reduction (go.sum({0, 2, 3}); Note [CUDA reduction strategy] in
// cuda/reduce_kernels.cu), one call over the whole batch for every dtype:
// float accumulation for float16, bfloat16 and float32, double for float64,
// rounded once to the bias's dtype (the input's), as the CPU kernel computes
// it. cuDNN's cudnnConvolutionBackwardBias is not used: cuDNN 9 (on an
// H200) answers CUDNN_STATUS_NOT_SUPPORTED for float16 and bfloat16, and a
// reduction needs no int-sized chunks.

// The most samples of `x` / `y` sizes one cuDNN call takes.
int64_t BatchChunk(const IntVector& x, const IntVector& y, const char* op) {
  return internal::BatchChunk(std::max(x[1] * x[2] * x[3], y[1] * y[2] * y[3]), op);
}

IntVector WithBatch(IntVector sizes, int64_t n) {
  sizes[0] = n;
  return sizes;
}

Tensor ConvForwardCuda(const Tensor& input, const Tensor& weight, const Tensor& bias,
                       const ConvParams& p) {
  const char* op = "conv2d";
  Tensor x = input.contiguous(), w = weight.contiguous();
  internal::DataType(x.dtype(), op);
  DeviceGuard guard(x.device());
  const IntVector x_sizes = SizesOf(x), w_sizes = SizesOf(w);
  Tensor y = empty(OutputSizes(x_sizes, w_sizes, p), x.options());
  if (y.numel() == 0) return y;
  if (x.numel() == 0 || w.numel() == 0) {  // No input channels: nothing to sum.
    if (bias.defined()) {
      y.copy_(bias.view({1, y.size(1), 1, 1}));
    } else {
      y.fill_(0);
    }
    return y;
  }
  Tensor b = bias.defined() ? bias.contiguous() : Tensor();
  cudnnHandle_t h = internal::Handle(x.device());
  const IntVector y_sizes = SizesOf(y);
  const int64_t n = x_sizes[0], chunk = BatchChunk(x_sizes, y_sizes, op);
  const bool graph = graph_api() && !benchmark();
  for (int64_t start = 0; start < n; start += chunk) {
    const int64_t len = std::min(chunk, n - start);
    Tensor xc = x.narrow(0, start, len), yc = y.narrow(0, start, len);
    if (graph && internal::GraphConvolution(Direction::kForward, h, x.device(), x.dtype(),
                                            WithBatch(x_sizes, len), w_sizes,
                                            WithBatch(y_sizes, len), p, xc.raw_data(), w.raw_data(),
                                            yc.raw_data(), /*accumulate=*/false)) {
      if (b.defined()) yc.add_(b.view({1, w_sizes[0], 1, 1}));
      continue;
    }
    Conv c(x.dtype(), WithBatch(x_sizes, len), w_sizes, p, op);
    const Algo a = AlgoCache::Get().Find(x.device(), Direction::kForward, c, [&] {
      cudnnConvolutionFwdAlgoPerf_t perfs[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
      int count = 0;
      EMBER_CUDA_CHECK(
          cudnnGetConvolutionForwardAlgorithm_v7(h, c.x.get(), c.w.get(), c.conv.get(), c.y.get(),
                                                 CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &count, perfs));
      if (benchmark()) {  // Timed into yc, which the convolution then writes.
        Tensor trial = TrialWorkspace(perfs, count, x.device());
        EMBER_CUDA_CHECK(cudnnFindConvolutionForwardAlgorithmEx(
            h, c.x.get(), xc.raw_data(), c.w.get(), w.raw_data(), c.conv.get(), c.y.get(),
            yc.raw_data(), CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &count, perfs, trial.raw_data(),
            Bytes(trial)));
      }
      return Pick(
          perfs, count, c,
          [&](cudnnConvolutionFwdAlgo_t algo, size_t* bytes) {
            return cudnnGetConvolutionForwardWorkspaceSize(h, c.x.get(), c.w.get(), c.conv.get(),
                                                           c.y.get(), algo, bytes);
          },
          x.device(), op);
    });
    Tensor ws = internal::Workspace(x.device(), a.workspace);
    EMBER_CUDA_CHECK(cudnnConvolutionForward(
        h, c.scalars.one(), c.x.get(), xc.raw_data(), c.w.get(), w.raw_data(), c.conv.get(),
        static_cast<cudnnConvolutionFwdAlgo_t>(a.algo), ws.raw_data(), a.workspace,
        c.scalars.zero(), c.y.get(), yc.raw_data()));
    if (b.defined()) {
      internal::TensorDescriptor bd;
      bd.Set(c.type, {1, w_sizes[0], 1, 1}, op);
      EMBER_CUDA_CHECK(cudnnAddTensor(h, c.scalars.one(), bd.get(), b.raw_data(), c.scalars.one(),
                                      c.y.get(), yc.raw_data()));
    }
  }
  return y;
}

Tensor ConvInputGradCuda(const Tensor& grad, const Tensor& weight, const IntVector& x_sizes,
                         const ConvParams& p) {
  const char* op = "conv2d input gradient";
  Tensor go = grad.contiguous(), w = weight.contiguous();
  internal::DataType(go.dtype(), op);
  DeviceGuard guard(go.device());
  Tensor gx = empty(x_sizes, go.options());
  if (gx.numel() == 0) return gx;
  if (go.numel() == 0 || w.numel() == 0) {
    gx.fill_(0);
    return gx;
  }
  const IntVector w_sizes = SizesOf(w), y_sizes = SizesOf(go);
  cudnnHandle_t h = internal::Handle(go.device());
  const int64_t n = x_sizes[0], chunk = BatchChunk(x_sizes, y_sizes, op);
  const bool graph = graph_api() && !benchmark();
  for (int64_t start = 0; start < n; start += chunk) {
    const int64_t len = std::min(chunk, n - start);
    Tensor goc = go.narrow(0, start, len), gxc = gx.narrow(0, start, len);
    if (graph && internal::GraphConvolution(Direction::kInputGrad, h, go.device(), go.dtype(),
                                            WithBatch(x_sizes, len), w_sizes,
                                            WithBatch(y_sizes, len), p, gxc.raw_data(),
                                            w.raw_data(), goc.raw_data(), /*accumulate=*/false)) {
      continue;
    }
    Conv c(go.dtype(), WithBatch(x_sizes, len), w_sizes, p, op);
    const Algo a = AlgoCache::Get().Find(go.device(), Direction::kInputGrad, c, [&] {
      cudnnConvolutionBwdDataAlgoPerf_t perfs[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
      int count = 0;
      EMBER_CUDA_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(
          h, c.w.get(), c.y.get(), c.conv.get(), c.x.get(), CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
          &count, perfs));
      if (benchmark()) {  // Timed into gxc, which the convolution then writes.
        Tensor trial = TrialWorkspace(perfs, count, go.device());
        EMBER_CUDA_CHECK(cudnnFindConvolutionBackwardDataAlgorithmEx(
            h, c.w.get(), w.raw_data(), c.y.get(), goc.raw_data(), c.conv.get(), c.x.get(),
            gxc.raw_data(), CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &count, perfs, trial.raw_data(),
            Bytes(trial)));
      }
      return Pick(
          perfs, count, c,
          [&](cudnnConvolutionBwdDataAlgo_t algo, size_t* bytes) {
            return cudnnGetConvolutionBackwardDataWorkspaceSize(
                h, c.w.get(), c.y.get(), c.conv.get(), c.x.get(), algo, bytes);
          },
          go.device(), op);
    });
    Tensor ws = internal::Workspace(go.device(), a.workspace);
    EMBER_CUDA_CHECK(cudnnConvolutionBackwardData(
        h, c.scalars.one(), c.w.get(), w.raw_data(), c.y.get(), goc.raw_data(), c.conv.get(),
        static_cast<cudnnConvolutionBwdDataAlgo_t>(a.algo), ws.raw_data(), a.workspace,
        c.scalars.zero(), c.x.get(), gxc.raw_data()));
  }
  return gx;
}

Tensor ConvWeightGradCuda(const Tensor& input, const Tensor& grad, const IntVector& w_sizes,
                          const ConvParams& p, Tensor* grad_bias) {
  const char* op = "conv2d weight gradient";
  Tensor x = input.contiguous(), go = grad.contiguous();
  internal::DataType(x.dtype(), op);
  DeviceGuard guard(x.device());
  Tensor gw = empty(w_sizes, x.options());
  // Note [conv2d bias gradient]: Ember's reduction, not cuDNN's.
  if (grad_bias != nullptr) *grad_bias = go.sum(/*dims=*/{0, 2, 3});
  if (go.numel() == 0 || x.numel() == 0) {  // Sums without terms.
    gw.fill_(0);
    return gw;
  }
  const IntVector x_sizes = SizesOf(x), y_sizes = SizesOf(go);
  cudnnHandle_t h = internal::Handle(x.device());
  const int64_t n = x_sizes[0], chunk = BatchChunk(x_sizes, y_sizes, op);
  const bool graph = graph_api() && !benchmark();
  for (int64_t start = 0; start < n; start += chunk) {
    const int64_t len = std::min(chunk, n - start);
    Tensor xc = x.narrow(0, start, len), goc = go.narrow(0, start, len);
    // The first chunk writes the weight gradient, the others add to it.
    if (graph &&
        internal::GraphConvolution(Direction::kWeightGrad, h, x.device(), x.dtype(),
                                   WithBatch(x_sizes, len), w_sizes, WithBatch(y_sizes, len), p,
                                   xc.raw_data(), gw.raw_data(), goc.raw_data(),
                                   /*accumulate=*/start != 0)) {
      continue;
    }
    Conv c(x.dtype(), WithBatch(x_sizes, len), w_sizes, p, op);
    const void* beta = start == 0 ? c.scalars.zero() : c.scalars.one();
    const Algo a = AlgoCache::Get().Find(x.device(), Direction::kWeightGrad, c, [&] {
      cudnnConvolutionBwdFilterAlgoPerf_t perfs[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
      int count = 0;
      EMBER_CUDA_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
          h, c.x.get(), c.y.get(), c.conv.get(), c.w.get(), CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT,
          &count, perfs));
      if (benchmark()) {  // Timed into a scratch gradient: gw may hold earlier chunks'.
        Tensor trial = TrialWorkspace(perfs, count, x.device());
        Tensor scratch = empty(w_sizes, x.options());
        EMBER_CUDA_CHECK(cudnnFindConvolutionBackwardFilterAlgorithmEx(
            h, c.x.get(), xc.raw_data(), c.y.get(), goc.raw_data(), c.conv.get(), c.w.get(),
            scratch.raw_data(), CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &count, perfs,
            trial.raw_data(), Bytes(trial)));
      }
      return Pick(
          perfs, count, c,
          [&](cudnnConvolutionBwdFilterAlgo_t algo, size_t* bytes) {
            return cudnnGetConvolutionBackwardFilterWorkspaceSize(
                h, c.x.get(), c.y.get(), c.conv.get(), c.w.get(), algo, bytes);
          },
          x.device(), op);
    });
    Tensor ws = internal::Workspace(x.device(), a.workspace);
    EMBER_CUDA_CHECK(cudnnConvolutionBackwardFilter(
        h, c.scalars.one(), c.x.get(), xc.raw_data(), c.y.get(), goc.raw_data(), c.conv.get(),
        static_cast<cudnnConvolutionBwdFilterAlgo_t>(a.algo), ws.raw_data(), a.workspace, beta,
        c.w.get(), gw.raw_data()));
  }
  return gw;
}

EMBER_REGISTER_NN_KERNEL(::ember::nn::internal::conv2d_forward, DeviceType::kCUDA,
                         &ConvForwardCuda);
EMBER_REGISTER_NN_KERNEL(::ember::nn::internal::conv2d_input_grad, DeviceType::kCUDA,
                         &ConvInputGradCuda);
EMBER_REGISTER_NN_KERNEL(::ember::nn::internal::conv2d_weight_grad, DeviceType::kCUDA,
                         &ConvWeightGradCuda);

}  // namespace
}  // namespace ember::nn::cudnn
