// cross_entropy's and nll_loss's CUDA kernels (nn/loss_kernels.h): the host
// side of loss_kernels.cu, registered as the kCUDA kernels of the losses'
// slots when the library is loaded. The backward kernels are asynchronous on
// the current stream of the input's device; a forward reads the kernel's
// verdict on the targets and the count of rows kept back to the host (one
// synchronisation of that stream), so that a bad target throws "Target 12 is
// out of bounds." as on the CPU, and the mean knows its divisor. float16 and
// bfloat16 go through float32 (Note [float16 and bfloat16 through float32] in
// low_precision.h).
#include "cuda/kernels.h"
#include "nn/cuda/loss_launch.h"
#include "nn/cuda/low_precision.h"
#include "nn/kernel_util.h"
#include "nn/loss_kernels.h"
#include "tensor/device_guard.h"
#include "tensor/factories.h"

namespace ember::nn::cuda_kernels {
namespace {

using ::ember::cuda::internal::CheckLaunch;
using ::ember::cuda::internal::StreamOf;
using internal::ClassLossGrad;
using internal::ClassLossRows;

// Device memory for a forward's ClassLossStatus.
Tensor StatusBuffer(Device device) {
  static_assert(sizeof(ClassLossStatus) == 2 * sizeof(int64_t));
  return empty({2}, TensorOptions(kInt64).device(device));
}

// Waits for the forward, throws for its first bad target, returns the count
// of rows kept.
int64_t ReadStatus(cudaStream_t stream, const Tensor& status, const Tensor& target) {
  ClassLossStatus host{};
  EMBER_CUDA_CHECK(
      cudaMemcpyAsync(&host, status.raw_data(), sizeof(host), cudaMemcpyDeviceToHost, stream));
  EMBER_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (host.first_bad_row != kNoBadRow) {
    int64_t value = 0;
    EMBER_CUDA_CHECK(cudaMemcpyAsync(
        &value, target.data_ptr<int64_t>() + static_cast<int64_t>(host.first_bad_row),
        sizeof(value), cudaMemcpyDeviceToHost, stream));
    EMBER_CUDA_CHECK(cudaStreamSynchronize(stream));
    EMBER_FAIL("Target ", value, " is out of bounds.");
  }
  return static_cast<int64_t>(host.count);
}

ClassLossStatus* StatusPtr(const Tensor& status) {
  return static_cast<ClassLossStatus*>(status.raw_data());
}

ClassLossRows CrossEntropyForwardCuda(const Tensor& x, const Tensor& target, int64_t ignore_index,
                                      double smoothing) {
  // The rows are float64 whatever x's dtype.
  if (IsLowPrecision(x)) return CrossEntropyForwardCuda(ToFloat(x), target, ignore_index, smoothing);
  DeviceGuard guard(x.device());
  cudaStream_t stream = StreamOf(x.device());
  const int64_t n = x.size(0), c = x.size(1);
  const TensorOptions f64 = TensorOptions(kFloat64).device(x.device());
  ClassLossRows r{empty({n}, f64), empty({n}, f64), 0};
  Tensor status = StatusBuffer(x.device());
  internal::VisitNnDtype(x.dtype(), "cross_entropy", [&]<typename T>() {
    CheckLaunch(LaunchCrossEntropyForward<T>(stream, x.data_ptr<T>(), target.data_ptr<int64_t>(),
                                             r.rows.data_ptr<double>(), r.lse.data_ptr<double>(),
                                             StatusPtr(status), n, c, ignore_index, smoothing),
                "cross_entropy forward kernel");
  });
  r.count = ReadStatus(stream, status, target);
  return r;
}

Tensor CrossEntropyBackwardCuda(const Tensor& g, const Tensor& x, const Tensor& target,
                                const Tensor& lse, const ClassLossGrad& args) {
  if (IsLowPrecision(x)) {
    return CrossEntropyBackwardCuda(ToFloat(g), ToFloat(x), target, lse, args).to(x.dtype());
  }
  DeviceGuard guard(x.device());
  const int64_t n = x.size(0), c = x.size(1);
  Tensor gx = empty(x.sizes(), x.options());
  internal::VisitNnDtype(x.dtype(), "cross_entropy backward", [&]<typename T>() {
    CheckLaunch(LaunchCrossEntropyBackward<T>(
                    StreamOf(x.device()), g.data_ptr<T>(), x.data_ptr<T>(),
                    target.data_ptr<int64_t>(), lse.data_ptr<double>(), gx.data_ptr<T>(), n, c,
                    args.per_row, args.divisor, args.ignore_index, args.label_smoothing),
                "cross_entropy backward kernel");
  });
  return gx;
}

ClassLossRows NllForwardCuda(const Tensor& x, const Tensor& target, int64_t ignore_index) {
  if (IsLowPrecision(x)) return NllForwardCuda(ToFloat(x), target, ignore_index);
  DeviceGuard guard(x.device());
  cudaStream_t stream = StreamOf(x.device());
  const int64_t n = x.size(0), c = x.size(1);
  ClassLossRows r{empty({n}, TensorOptions(kFloat64).device(x.device())), Tensor(), 0};
  Tensor status = StatusBuffer(x.device());
  internal::VisitNnDtype(x.dtype(), "nll_loss", [&]<typename T>() {
    CheckLaunch(
        LaunchNllForward<T>(stream, x.data_ptr<T>(), target.data_ptr<int64_t>(),
                            r.rows.data_ptr<double>(), StatusPtr(status), n, c, ignore_index),
        "nll_loss forward kernel");
  });
  r.count = ReadStatus(stream, status, target);
  return r;
}

Tensor NllBackwardCuda(const Tensor& g, const Tensor& target, int64_t c,
                       const ClassLossGrad& args) {
  if (IsLowPrecision(g)) return NllBackwardCuda(ToFloat(g), target, c, args).to(g.dtype());
  DeviceGuard guard(g.device());
  const int64_t n = target.numel();
  Tensor gx = zeros({n, c}, g.options());
  internal::VisitNnDtype(g.dtype(), "nll_loss backward", [&]<typename T>() {
    CheckLaunch(
        LaunchNllBackward<T>(StreamOf(g.device()), g.data_ptr<T>(), target.data_ptr<int64_t>(),
                             gx.data_ptr<T>(), n, c, args.per_row, args.divisor, args.ignore_index),
        "nll_loss backward kernel");
  });
  return gx;
}

EMBER_REGISTER_NN_KERNEL(internal::cross_entropy_forward, DeviceType::kCUDA,
                         &CrossEntropyForwardCuda);
EMBER_REGISTER_NN_KERNEL(internal::cross_entropy_backward, DeviceType::kCUDA,
                         &CrossEntropyBackwardCuda);
EMBER_REGISTER_NN_KERNEL(internal::nll_loss_forward, DeviceType::kCUDA, &NllForwardCuda);
EMBER_REGISTER_NN_KERNEL(internal::nll_loss_backward, DeviceType::kCUDA, &NllBackwardCuda);

}  // namespace
}  // namespace ember::nn::cuda_kernels
