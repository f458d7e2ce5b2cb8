// float16 and bfloat16 in nn/cuda's own kernels (private to nn/cuda/).
//
// Note [float16 and bfloat16 through float32]
// nn/cuda's own kernels (pooling, layer_norm, the class losses, embedding's
// backward) are compiled for float and double only. A float16 or bfloat16
// call runs them on float32 copies of its floating operands and rounds the
// floating results back to the call's dtype, so every sum accumulates in
// float, as torch's kernels do (their accumulation type), for the price of
// the copies' memory traffic; integer operands (indices, targets) pass as
// they are. Convolution and batch normalisation need none of this: cuDNN
// takes both dtypes (conv.cc, batch_norm.cc).
//
//   if (IsLowPrecision(x)) return AvgPoolCuda(ToFloat(x), plan).to(x.dtype());
#ifndef EMBER_NN_CUDA_LOW_PRECISION_H_
#define EMBER_NN_CUDA_LOW_PRECISION_H_

#include "tensor/tensor.h"

namespace ember::nn::cuda_kernels {

// Whether `t` is a float16 or bfloat16 tensor.
inline bool IsLowPrecision(const Tensor& t) {
  return t.defined() && (t.dtype() == kFloat16 || t.dtype() == kBFloat16);
}

// `t` as float32 when it is float16 or bfloat16, else `t` (undefined stays
// undefined).
inline Tensor ToFloat(const Tensor& t) { return IsLowPrecision(t) ? t.to(kFloat32) : t; }

// `t` in `dtype` (undefined stays undefined).
inline Tensor ToDtype(const Tensor& t, Dtype dtype) { return t.defined() ? t.to(dtype) : t; }

}  // namespace ember::nn::cuda_kernels

#endif  // EMBER_NN_CUDA_LOW_PRECISION_H_
