// GradScaler's per-device kernels (private to nn/optim and the libraries that
// implement them for a device, e.g. nn/cuda/), slots of Note [nn device
// kernels] in nn/device_kernels.h. They are PyTorch's
// _amp_foreach_non_finite_check_and_unscale_ and _amp_update_scale_, and,
// like them, keep every value on the device: nothing here waits for the
// device or reads a value back to the host.
#ifndef EMBER_NN_OPTIM_GRAD_SCALER_KERNELS_H_
#define EMBER_NN_OPTIM_GRAD_SCALER_KERNELS_H_

#include <cstdint>
#include <vector>

#include "nn/device_kernels.h"
#include "tensor/tensor.h"

namespace ember::nn::optim::internal {

// Multiplies every gradient in place by inv_scale[0] and sets found_inf[0] to
// 1 when any gradient value (before the multiply) is an inf or a NaN; one pass
// over each. found_inf and inv_scale are float32 [1] tensors; every tensor is
// on grads[0]'s device; gradients are float32, float64, float16 or bfloat16,
// of any layout.
using AmpUnscaleFn = void(const std::vector<Tensor>& grads, const Tensor& found_inf,
                          const Tensor& inv_scale);

// The scale's update after a step: with found_inf[0] set, scale *=
// backoff_factor and growth_tracker = 0; otherwise growth_tracker + 1, and at
// growth_interval the scale grows by growth_factor (kept when the product is
// still finite) and growth_tracker returns to 0. scale and found_inf are
// float32 [1], growth_tracker int32 [1], all on one device.
using AmpUpdateScaleFn = void(const Tensor& scale, const Tensor& growth_tracker,
                              const Tensor& found_inf, double growth_factor,
                              double backoff_factor, int64_t growth_interval);

extern constinit ::ember::nn::internal::DeviceKernel<AmpUnscaleFn> amp_unscale;
extern constinit ::ember::nn::internal::DeviceKernel<AmpUpdateScaleFn> amp_update_scale;

}  // namespace ember::nn::optim::internal

#endif  // EMBER_NN_OPTIM_GRAD_SCALER_KERNELS_H_
