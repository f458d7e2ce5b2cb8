// layer_norm's CUDA kernels (nn/layer_norm_kernels.h): the host side of
// layer_norm_kernels.cu, registered as the kCUDA kernels of layer_norm's
// slots when the library is loaded. Asynchronous on the current stream of the
// input's device. float16 and bfloat16 go through float32 (Note [float16 and
// bfloat16 through float32] in low_precision.h).
#include <array>

#include "cuda/kernels.h"
#include "nn/cuda/layer_norm_launch.h"
#include "nn/cuda/low_precision.h"
#include "nn/kernel_util.h"
#include "nn/layer_norm_kernels.h"
#include "tensor/device_guard.h"
#include "tensor/factories.h"

namespace ember::nn::cuda_kernels {
namespace {

using ::ember::cuda::internal::CheckLaunch;
using ::ember::cuda::internal::StreamOf;

template <typename T>
const T* PtrOrNull(const Tensor& t) {
  return t.defined() ? t.data_ptr<T>() : nullptr;
}
template <typename T>
T* MutablePtrOrNull(const Tensor& t) {
  return t.defined() ? t.data_ptr<T>() : nullptr;
}

std::array<Tensor, 3> LayerNormForwardCuda(const Tensor& x, const Tensor& w, const Tensor& b,
                                           int64_t d, double eps) {
  if (IsLowPrecision(x)) {  // The statistics too come back in x's dtype.
    auto outs = LayerNormForwardCuda(ToFloat(x), ToFloat(w), ToFloat(b), d, eps);
    for (Tensor& t : outs) t = t.to(x.dtype());
    return outs;
  }
  DeviceGuard guard(x.device());
  const int64_t r = d > 0 ? x.numel() / d : 0;
  Tensor out = empty(x.sizes(), x.options());
  Tensor mean = empty({r}, x.options()), rstd = empty({r}, x.options());
  internal::VisitNnDtype(x.dtype(), "layer_norm", [&]<typename T>() {
    CheckLaunch(LaunchLayerNormForward<T>(StreamOf(x.device()), x.data_ptr<T>(), PtrOrNull<T>(w),
                                          PtrOrNull<T>(b), out.data_ptr<T>(), mean.data_ptr<T>(),
                                          rstd.data_ptr<T>(), r, d, eps),
                "layer_norm forward kernel");
  });
  return {out, mean, rstd};
}

std::array<Tensor, 3> LayerNormBackwardCuda(const Tensor& g, const Tensor& x, const Tensor& w,
                                            const Tensor& mean, const Tensor& rstd, int64_t d,
                                            std::array<bool, 3> needs) {
  if (IsLowPrecision(x)) {
    auto grads = LayerNormBackwardCuda(ToFloat(g), ToFloat(x), ToFloat(w), ToFloat(mean),
                                       ToFloat(rstd), d, needs);
    for (Tensor& t : grads) t = ToDtype(t, x.dtype());
    return grads;
  }
  DeviceGuard guard(x.device());
  const int64_t r = d > 0 ? x.numel() / d : 0;
  Tensor gx = needs[0] ? empty(x.sizes(), x.options()) : Tensor();
  Tensor gw = needs[1] && w.defined() ? empty({d}, x.options()) : Tensor();
  Tensor gb = needs[2] ? empty({d}, x.options()) : Tensor();
  // The parameters' partial sums over chunks of rows (caching allocator).
  Tensor workspace;
  if (gw.defined() || gb.defined()) {
    const auto bytes = static_cast<int64_t>(LayerNormBackwardWorkspaceBytes(r, d));
    workspace = empty({(bytes + 7) / 8}, TensorOptions(kFloat64).device(x.device()));
  }
  internal::VisitNnDtype(x.dtype(), "layer_norm backward", [&]<typename T>() {
    CheckLaunch(LaunchLayerNormBackward<T>(StreamOf(x.device()), g.data_ptr<T>(), x.data_ptr<T>(),
                                           PtrOrNull<T>(w), mean.data_ptr<T>(), rstd.data_ptr<T>(),
                                           MutablePtrOrNull<T>(gx), MutablePtrOrNull<T>(gw),
                                           MutablePtrOrNull<T>(gb), r, d,
                                           workspace.defined() ? workspace.raw_data() : nullptr),
                "layer_norm backward kernels");
  });
  return {gx, gw, gb};
}

EMBER_REGISTER_NN_KERNEL(internal::layer_norm_forward, DeviceType::kCUDA, &LayerNormForwardCuda);
EMBER_REGISTER_NN_KERNEL(internal::layer_norm_backward, DeviceType::kCUDA, &LayerNormBackwardCuda);

}  // namespace
}  // namespace ember::nn::cuda_kernels
