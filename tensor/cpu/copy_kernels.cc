// CPU kernels of copy_out (any dtype to any dtype, strided, broadcast source)
// and fill_out.
#include <cstring>

#include "tensor/cpu/loops.h"
#include "tensor/half.h"
#include "tensor/ops.h"

namespace ember::cpu {
namespace {

void CopyOut(const Tensor& out, const Tensor& src) {
  EMBER_CHECK(src.is_cpu() && out.is_cpu(), "copy_: cpu kernel got a ", src.device().str(),
              " source and a ", out.device().str(), " destination");
  if (out.dtype() == src.dtype() && out.is_contiguous() && src.is_contiguous()) {
    std::memcpy(out.raw_data(), src.raw_data(), out.nbytes());
    return;
  }
  // float16 / bfloat16 <-> float32 of whole contiguous tensors: the block
  // conversions (F16C for float16).
  if (out.is_contiguous() && src.is_contiguous() && out.numel() == src.numel()) {
    if (out.dtype() == kFloat32 && src.dtype() == kFloat16) {
      HalfToFloat(src.data_ptr<Half>(), out.data_ptr<float>(), out.numel());
      return;
    }
    if (out.dtype() == kFloat16 && src.dtype() == kFloat32) {
      FloatToHalf(src.data_ptr<float>(), out.data_ptr<Half>(), out.numel());
      return;
    }
    if (out.dtype() == kFloat32 && src.dtype() == kBFloat16) {
      HalfToFloat(src.data_ptr<BFloat16>(), out.data_ptr<float>(), out.numel());
      return;
    }
    if (out.dtype() == kBFloat16 && src.dtype() == kFloat32) {
      FloatToHalf(src.data_ptr<float>(), out.data_ptr<BFloat16>(), out.numel());
      return;
    }
  }
  VisitDtype(out.dtype(), [&]<typename D>() {
    VisitDtype(src.dtype(), [&]<typename S>() {
      Map<D, S>(out, {src}, [](S v) { return CastTo<D>(v); });
    });
  });
}

void FillOut(const Tensor& out, const Scalar& value) {
  VisitDtype(out.dtype(), [&]<typename T>() {
    const T v = value.to<T>();
    std::array<char*, 1> base{static_cast<char*>(out.raw_data())};
    std::array<IntArrayRef, 1> strides{out.strides()};
    ForEachStrided<1>(out.sizes(), base, strides, {int64_t{sizeof(T)}},
                      [&](char** p, const int64_t* s, int64_t n) {
                        if (s[0] == int64_t{sizeof(T)}) {
                          T* o = reinterpret_cast<T*>(p[0]);
                          for (int64_t i = 0; i < n; ++i) o[i] = v;
                        } else {
                          for (int64_t i = 0; i < n; ++i) {
                            *reinterpret_cast<T*>(p[0] + i * s[0]) = v;
                          }
                        }
                      });
  });
}

EMBER_REGISTER_KERNEL(copy_out, kCPU, &CopyOut);
EMBER_REGISTER_KERNEL(fill_out, kCPU, &FillOut);

}  // namespace
}  // namespace ember::cpu
