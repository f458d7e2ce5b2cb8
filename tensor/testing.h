// Test helpers shared by the tensor tests (testonly): build tensors from
// plain values and read them back without going through the ops under test.
//
//   ember::Tensor t = ember::testing::Make({1, 2, 3, 4}, {2, 2}, ember::kInt8);
//   EXPECT_EQ(ember::testing::Values(t.t()), (std::vector<double>{1, 3, 2, 4}));
//   EXPECT_THAT(ember::testing::ErrorOf([&] { t.view({3}); }), HasSubstr("view"));
#ifndef EMBER_TENSOR_TESTING_H_
#define EMBER_TENSOR_TESTING_H_

#include <string>
#include <vector>

#include "tensor/factories.h"
#include "tensor/tensor.h"

namespace ember::testing {

// The elements of `t` in row-major order, as doubles. Reads through sizes and
// strides directly, so it relies on no op but the tensor's geometry.
inline std::vector<double> Values(const Tensor& t) {
  std::vector<double> out;
  out.reserve(t.numel());
  const char* base = static_cast<const char*>(t.storage().data());
  SizeVector idx(t.dim(), 0);
  for (int64_t n = 0; n < t.numel(); ++n) {
    int64_t off = t.storage_offset();
    for (int64_t d = 0; d < t.dim(); ++d) off += idx[d] * t.strides()[d];
    VisitDtype(t.dtype(), [&]<typename T>() {
      out.push_back(static_cast<double>(
          static_cast<OpMath<T>>(*reinterpret_cast<const T*>(base + off * sizeof(T)))));
    });
    for (int64_t d = t.dim() - 1; d >= 0 && ++idx[d] == t.sizes()[d]; --d) idx[d] = 0;
  }
  return out;
}

// A contiguous tensor of `dtype` and `shape` holding `values` (converted with
// CastTo, so pick values the dtype represents exactly).
inline Tensor Make(const std::vector<double>& values, SizeVector shape, Dtype dtype) {
  Tensor t = empty(shape, TensorOptions(dtype));
  VisitDtype(dtype, [&]<typename T>() {
    T* p = static_cast<T*>(t.raw_data());
    for (size_t i = 0; i < values.size(); ++i) p[i] = CastTo<T>(values[i]);
  });
  return t;
}
inline Tensor Make(const std::vector<double>& values, Dtype dtype = kFloat32) {
  return Make(values, {static_cast<int64_t>(values.size())}, dtype);
}

// The message of the ember::Error that `f` throws, or "no error".
template <typename F>
std::string ErrorOf(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace ember::testing

#endif  // EMBER_TENSOR_TESTING_H_
