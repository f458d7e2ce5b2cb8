// The CUDA kernels of max_pool2d, avg_pool2d and adaptive_avg_pool2d
// (nn/pooling_kernels.h), for float32 and float64 (float16 and bfloat16
// through float32: Note [float16 and bfloat16 through float32] in
// low_precision.h), on kernels of their own
// (pooling_device.cu) rather than cuDNN's pooling: cuDNN's max pooling keeps
// no argmax (nn's backward and double backward scatter and gather at it),
// and its average pooling has neither ceil_mode's partial windows nor
// adaptive windows, which one AvgPlan covers here. Both backwards gather per
// input element, so they are deterministic (no atomics, sums in the CPU's
// order), as torch's max_pool2d backward. Each kernel runs on the
// current stream of its tensors' device; an average pool's plan goes to the
// device as one small int64 tensor.
#include <array>
#include <vector>

#include "cuda/kernels.h"
#include "nn/cuda/low_precision.h"
#include "nn/cuda/pooling_device.h"
#include "nn/pooling_kernels.h"
#include "tensor/device_guard.h"
#include "tensor/error.h"
#include "tensor/factories.h"

namespace ember::nn::pooling_device {
namespace {

using ::ember::cuda::internal::CheckLaunch;
using ::ember::cuda::internal::StreamOf;
using ::ember::nn::cuda_kernels::IsLowPrecision;
using ::ember::nn::cuda_kernels::ToFloat;
using ::ember::nn::internal::AvgPlan;
using ::ember::nn::internal::MaxPoolWindow;
using ::ember::nn::internal::Pool2;

// Whether `t` is float64 (else float32); throws for other dtypes, naming `op`.
bool IsDouble(const Tensor& t, const char* op) {
  EMBER_CHECK(t.dtype() == kFloat32 || t.dtype() == kFloat64, op,
              ": expected a float32 or float64 tensor on CUDA, but got ", dtype_name(t.dtype()),
              "; convert it with .to(ember::kFloat32) first");
  return t.dtype() == kFloat64;
}

MaxWindow WindowOf(Pool2 kernel, Pool2 stride, Pool2 padding, Pool2 dilation) {
  return {{kernel[0], kernel[1]},
          {stride[0], stride[1]},
          {padding[0], padding[1]},
          {dilation[0], dilation[1]}};
}

std::array<Tensor, 2> MaxPool2dCuda(const Tensor& input, Pool2 kernel, Pool2 stride, Pool2 padding,
                                    Pool2 dilation, Pool2 out_size) {
  if (IsLowPrecision(input)) {
    auto [out, indices] = MaxPool2dCuda(ToFloat(input), kernel, stride, padding, dilation, out_size);
    return {out.to(input.dtype()), indices};
  }
  const bool is_double = IsDouble(input, "max_pool2d");
  Tensor x = input.contiguous();
  DeviceGuard guard(x.device());
  const PoolShape s{x.size(0) * x.size(1), x.size(2), x.size(3), out_size[0], out_size[1]};
  Tensor out = empty({x.size(0), x.size(1), s.oh, s.ow}, x.options());
  Tensor indices = empty(out.sizes(), x.options().dtype(kInt64));
  const MaxWindow win = WindowOf(kernel, stride, padding, dilation);
  CheckLaunch(LaunchMaxPool(StreamOf(x.device()), is_double, s, win, x.raw_data(), out.raw_data(),
                            indices.data_ptr<int64_t>()),
              "max_pool2d kernel");
  return {out, indices};
}

Tensor MaxPoolScatterCuda(const Tensor& grad, const Tensor& indices,
                          const std::vector<int64_t>& sizes, const MaxPoolWindow& window) {
  if (IsLowPrecision(grad)) {
    return MaxPoolScatterCuda(ToFloat(grad), indices, sizes, window).to(grad.dtype());
  }
  const bool is_double = IsDouble(grad, "max_pool2d backward");
  Tensor g = grad.contiguous(), idx = indices.contiguous();
  DeviceGuard guard(g.device());
  Tensor gx = empty(sizes, g.options());
  const PoolShape s{sizes[0] * sizes[1], sizes[2], sizes[3], idx.size(2), idx.size(3)};
  CheckLaunch(LaunchMaxPoolBackward(
                  StreamOf(g.device()), is_double, s,
                  WindowOf(window.kernel, window.stride, window.padding, window.dilation),
                  g.raw_data(), idx.data_ptr<int64_t>(), gx.raw_data()),
              "max_pool2d backward kernel");
  return gx;
}

Tensor MaxPoolGatherCuda(const Tensor& input, const Tensor& indices) {
  if (IsLowPrecision(input)) return MaxPoolGatherCuda(ToFloat(input), indices).to(input.dtype());
  const bool is_double = IsDouble(input, "max_pool2d double backward");
  Tensor x = input.contiguous(), idx = indices.contiguous();
  DeviceGuard guard(x.device());
  Tensor out = empty(idx.sizes(), x.options());
  const PoolShape s{x.size(0) * x.size(1), x.size(2), x.size(3), idx.size(2), idx.size(3)};
  CheckLaunch(LaunchMaxPoolGather(StreamOf(x.device()), is_double, s, x.raw_data(),
                                  idx.data_ptr<int64_t>(), out.raw_data()),
              "max_pool2d double backward kernel");
  return out;
}

// The plan's windows on `device`: ys, ye, yc, xs, xe, xc in a row.
Tensor PlanOn(const AvgPlan& p, Device device) {
  std::vector<int64_t> flat;
  for (const std::vector<int64_t>* v : {&p.ys, &p.ye, &p.yc, &p.xs, &p.xe, &p.xc}) {
    flat.insert(flat.end(), v->begin(), v->end());
  }
  return tensor(flat).to(device);
}

PoolShape ShapeOf(const AvgPlan& p) {
  return {p.sizes[0] * p.sizes[1], p.sizes[2], p.sizes[3], static_cast<int64_t>(p.ys.size()),
          static_cast<int64_t>(p.xs.size())};
}

Tensor AvgPoolCuda(const Tensor& input, const AvgPlan& plan) {
  if (IsLowPrecision(input)) return AvgPoolCuda(ToFloat(input), plan).to(input.dtype());
  const bool is_double = IsDouble(input, "avg_pool2d");
  Tensor x = input.contiguous();
  DeviceGuard guard(x.device());
  const PoolShape s = ShapeOf(plan);
  Tensor out = empty({plan.sizes[0], plan.sizes[1], s.oh, s.ow}, x.options());
  if (out.numel() == 0) return out;
  Tensor windows = PlanOn(plan, x.device());
  CheckLaunch(LaunchAvgPool(StreamOf(x.device()), is_double, s, windows.data_ptr<int64_t>(),
                            x.raw_data(), out.raw_data()),
              "avg_pool2d kernel");
  return out;
}

Tensor AvgPoolAdjointCuda(const Tensor& grad, const AvgPlan& plan) {
  if (IsLowPrecision(grad)) return AvgPoolAdjointCuda(ToFloat(grad), plan).to(grad.dtype());
  const bool is_double = IsDouble(grad, "avg_pool2d backward");
  Tensor g = grad.contiguous();
  DeviceGuard guard(g.device());
  Tensor gx = empty(plan.sizes, g.options());
  if (gx.numel() == 0) return gx;
  const PoolShape s = ShapeOf(plan);
  if (g.numel() == 0) return gx.fill_(0);
  Tensor windows = PlanOn(plan, g.device());
  CheckLaunch(LaunchAvgPoolAdjoint(StreamOf(g.device()), is_double, s, windows.data_ptr<int64_t>(),
                                   g.raw_data(), gx.raw_data()),
              "avg_pool2d backward kernel");
  return gx;
}

EMBER_REGISTER_NN_KERNEL(::ember::nn::internal::max_pool2d_forward, DeviceType::kCUDA,
                         &MaxPool2dCuda);
EMBER_REGISTER_NN_KERNEL(::ember::nn::internal::max_pool2d_scatter, DeviceType::kCUDA,
                         &MaxPoolScatterCuda);
EMBER_REGISTER_NN_KERNEL(::ember::nn::internal::max_pool2d_gather, DeviceType::kCUDA,
                         &MaxPoolGatherCuda);
EMBER_REGISTER_NN_KERNEL(::ember::nn::internal::avg_pool2d_forward, DeviceType::kCUDA,
                         &AvgPoolCuda);
EMBER_REGISTER_NN_KERNEL(::ember::nn::internal::avg_pool2d_adjoint, DeviceType::kCUDA,
                         &AvgPoolAdjointCuda);

}  // namespace
}  // namespace ember::nn::pooling_device
