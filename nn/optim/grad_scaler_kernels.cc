// GradScaler's kernel slots and their CPU kernels (grad_scaler_kernels.h).
#include "nn/optim/grad_scaler_kernels.h"

#include <cmath>
#include <type_traits>

#include "tensor/dtype.h"
#include "tensor/error.h"
#include "tensor/thread_pool.h"

namespace ember::nn::optim::internal {

constinit ::ember::nn::internal::DeviceKernel<AmpUnscaleFn> amp_unscale{"GradScaler unscale"};
constinit ::ember::nn::internal::DeviceKernel<AmpUpdateScaleFn> amp_update_scale{
    "GradScaler update"};

namespace {

// One pass over a contiguous gradient: the multiply and the check together.
template <typename T>
bool UnscaleContiguous(const Tensor& grad, float inv_scale) {
  T* p = grad.data_ptr<T>();
  const int64_t n = grad.numel();
  std::atomic<bool> found{false};
  parallel_for(0, n, kDefaultGrainSize, [&](int64_t begin, int64_t end) {
    bool bad = false;
    for (int64_t i = begin; i < end; ++i) {
      const OpMath<T> v = static_cast<OpMath<T>>(p[i]);
      bad |= !std::isfinite(v);
      p[i] = static_cast<T>(v * static_cast<OpMath<T>>(inv_scale));
    }
    if (bad) found.store(true, std::memory_order_relaxed);
  });
  return found.load();
}

void AmpUnscaleCpu(const std::vector<Tensor>& grads, const Tensor& found_inf,
                   const Tensor& inv_scale) {
  const float inv = inv_scale.data_ptr<float>()[0];
  bool found = false;
  for (const Tensor& grad : grads) {
    if (grad.numel() == 0) continue;
    Tensor g = grad.is_contiguous() ? grad : grad.contiguous();
    VisitDtype(g.dtype(), [&]<typename T>() {
      if constexpr (std::is_floating_point_v<T> || std::is_same_v<T, Half> ||
                    std::is_same_v<T, BFloat16>) {
        found |= UnscaleContiguous<T>(g, inv);
      } else {
        EMBER_FAIL("GradScaler: gradients must be floating point, got ", dtype_name(g.dtype()));
      }
    });
    if (!g.is_same(grad)) grad.copy_(g);
  }
  if (found) found_inf.data_ptr<float>()[0] = 1.0f;
}

void AmpUpdateScaleCpu(const Tensor& scale, const Tensor& growth_tracker, const Tensor& found_inf,
                       double growth_factor, double backoff_factor, int64_t growth_interval) {
  float* s = scale.data_ptr<float>();
  int32_t* tracker = growth_tracker.data_ptr<int32_t>();
  if (found_inf.data_ptr<float>()[0] != 0.0f) {
    *s = static_cast<float>(*s * backoff_factor);
    *tracker = 0;
    return;
  }
  const int32_t successful = *tracker + 1;
  if (successful == growth_interval) {
    const float grown = static_cast<float>(*s * growth_factor);
    if (std::isfinite(grown)) *s = grown;
    *tracker = 0;
  } else {
    *tracker = successful;
  }
}

}  // namespace

EMBER_REGISTER_NN_KERNEL(amp_unscale, DeviceType::kCPU, &AmpUnscaleCpu);
EMBER_REGISTER_NN_KERNEL(amp_update_scale, DeviceType::kCPU, &AmpUpdateScaleCpu);

}  // namespace ember::nn::optim::internal
