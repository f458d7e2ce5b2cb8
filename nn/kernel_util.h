// Helpers shared by the CPU kernels of nn's layers (private to nn/).
//
//   ember::nn::internal::VisitNnDtype(x.dtype(), "conv2d", [&]<typename T>() {
//     const T* px = x.data_ptr<T>();
//     ...
//   });
//
// nn's own CPU kernels (convolution, pooling, normalisation, embedding,
// losses) work on float32 / float64 tensors; those registered through
// InFloat32 take float16 and bfloat16 too (Note [16-bit floats on the CPU]);
// other dtypes are refused with a message that says what to convert to. The layers reach their kernels
// through per-device slots (Note [nn device kernels] in device_kernels.h), so
// a CPU kernel only ever sees CPU tensors; the layers check that their
// tensors share the input's device (CheckDevice). Thread-safe.
#ifndef EMBER_NN_KERNEL_UTIL_H_
#define EMBER_NN_KERNEL_UTIL_H_

#include <array>
#include <optional>
#include <type_traits>

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

// Throws unless nn's kernels compute `t`'s dtype, naming `op` (a layer's
// check before it reaches its kernels): float32, float64, float16 and
// bfloat16 (cuDNN takes the 16-bit floats, nn's own CUDA kernels compute them
// through float32: Note [float16 and bfloat16 through float32] in
// nn/cuda/low_precision.h; the CPU's through InFloat32).
inline void CheckNnDtype(const Tensor& t, const char* op) {
  const Dtype d = t.dtype();
  EMBER_CHECK(d == kFloat32 || d == kFloat64 || d == kFloat16 || d == kBFloat16, op,
              ": expected a float32, float64, float16 or bfloat16 tensor, but got ",
              dtype_name(d), "; convert it with .to(ember::kFloat32) first");
}

// Note [16-bit floats on the CPU]
// nn's CPU kernels compute in float32 or float64. A kernel registered as
// InFloat32<&Kernel> also takes float16 and bfloat16 tensors: every 16-bit
// float argument is widened to float32, the kernel runs, and its first result
// (the output, or the input's gradient) is rounded once to the dtype of the
// first 16-bit argument; further results (saved statistics, parameter
// gradients) stay float32, as PyTorch keeps them in float32 parameters'
// dtype. Kernels of 32- and 64-bit arguments run as they are. This is how
// bfloat16 autocast (Note [Autocast] in tensor/autocast.h) and bfloat16
// models run on the CPU; the arithmetic is the float32 kernel's.
template <auto kKernel>
struct InFloat32Kernel;

template <typename R, typename... Args, R (*kKernel)(Args...)>
struct InFloat32Kernel<kKernel> {
  static bool Is16Bit(const Tensor& t) {
    return t.defined() && (t.dtype() == kFloat16 || t.dtype() == kBFloat16);
  }
  template <typename T>
  static void Find16Bit(const T& arg, std::optional<Dtype>* low) {
    if constexpr (std::is_same_v<std::decay_t<T>, Tensor>) {
      if (!*low && Is16Bit(arg)) *low = arg.dtype();
    }
  }
  template <typename T>
  static decltype(auto) Widen(const T& arg) {
    if constexpr (std::is_same_v<std::decay_t<T>, Tensor>) {
      return Is16Bit(arg) ? arg.to(kFloat32) : arg;
    } else {
      return (arg);
    }
  }
  static R Run(Args... args) {
    std::optional<Dtype> low;
    (Find16Bit(args, &low), ...);
    if (!low) return kKernel(args...);
    R result = kKernel(Widen(args)...);
    if constexpr (std::is_same_v<R, Tensor>) {
      return result.to(*low);
    } else {
      result[0] = result[0].to(*low);
      return result;
    }
  }
};

template <auto kKernel>
inline constexpr auto InFloat32 = &InFloat32Kernel<kKernel>::Run;

// Throws unless `param` (a weight or bias) may go with `input`: the same
// dtype, or float32 with a float16 / bfloat16 input (mixed precision's
// layout, as PyTorch's normalisation layers take it), naming `op`.
inline void CheckParamDtype(const Tensor& input, const Tensor& param, const char* op,
                            const char* what) {
  const Dtype in = input.dtype(), p = param.dtype();
  const bool mixed = p == kFloat32 && (in == kFloat16 || in == kBFloat16);
  EMBER_CHECK(in == p || mixed, op, ": expected ", what, " of the input's dtype (",
              dtype_name(in), ")", in == kFloat16 || in == kBFloat16 ? " or float32" : "",
              ", but got ", dtype_name(p));
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
