// Helpers shared by the CPU kernels of nn's layers (private to nn/).
//
//   ember::nn::internal::VisitNnDtype(x.dtype(), "conv2d", [&]<typename T>() {
//     const T* px = x.data_ptr<T>();
//     ...
//   });
//
// nn's own CPU kernels (convolution, pooling, normalisation, embedding,
// losses) work on float32 / float64 tensors; other dtypes are refused with a
// message that says what to convert to. The layers reach their kernels
// through per-device slots (Note [nn device kernels] in device_kernels.h), so
// a CPU kernel only ever sees CPU tensors; the layers check that their
// tensors share the input's device (CheckDevice). Thread-safe.
#ifndef EMBER_NN_KERNEL_UTIL_H_
#define EMBER_NN_KERNEL_UTIL_H_

#include "tensor/error.h"
#include "tensor/tensor.h"

namespace ember::nn::internal {

// Calls f.template operator()<T>() with T float or double; throws for other
// dtypes, naming `op`.
template <typename F>
void VisitNnDtype(Dtype dtype, const char* op, F&& f) {
  switch (dtype) {
    case kFloat32:
      f.template operator()<float>();
      return;
    case kFloat64:
      f.template operator()<double>();
      return;
    default:
      EMBER_FAIL(op, ": expected a float32 or float64 tensor, but got ", dtype_name(dtype),
                 "; convert it with .to(ember::kFloat32) first");
  }
}

// Throws unless nn's kernels of `t`'s device compute its dtype, naming `op`
// (a layer's check before it reaches its kernels): float32 and float64 on
// every device, and on CUDA float16 and bfloat16 too (cuDNN takes them, nn's
// own CUDA kernels compute them through float32: Note [float16 and bfloat16
// through float32] in nn/cuda/low_precision.h).
inline void CheckNnDtype(const Tensor& t, const char* op) {
  const Dtype d = t.dtype();
  if (d == kFloat32 || d == kFloat64) return;
  if (t.is_cuda()) {
    EMBER_CHECK(d == kFloat16 || d == kBFloat16, op,
                ": expected a float32, float64, float16 or bfloat16 tensor on CUDA, but got ",
                dtype_name(d), "; convert it with .to(ember::kFloat32) first");
    return;
  }
  VisitNnDtype(d, op, []<typename T>() {});  // Throws, naming the dtype.
}

// Throws unless `t` is defined and on `device` (the input's), naming `op` and
// the argument: a layer's tensors must share one device.
inline void CheckDevice(const Tensor& t, Device device, const char* op, const char* what) {
  EMBER_CHECK(t.defined(), op, ": ", what, " is an undefined tensor");
  EMBER_CHECK(t.device() == device, op, ": expected ", what, " on ", device.str(),
              " (the input's device), but it is on ", t.device().str(),
              "; move it there with .to()");
}

// Throws unless `a` and `b` have the same dtype, naming `op`.
inline void CheckSameDtype(const Tensor& a, const Tensor& b, const char* op, const char* what_a,
                           const char* what_b) {
  EMBER_CHECK(a.dtype() == b.dtype(), op, ": expected ", what_a, " and ", what_b,
              " to have the same dtype, but got ", dtype_name(a.dtype()), " and ",
              dtype_name(b.dtype()));
}

}  // namespace ember::nn::internal

#endif  // EMBER_NN_KERNEL_UTIL_H_
