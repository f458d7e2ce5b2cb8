// Factories: tensors made from sizes, ranges, random numbers or caller data.
//
//   ```cpp
//   #include "tensor/factories.h"
//   ember::Tensor z = ember::zeros({2, 3});                    // float32
//   ember::Tensor r = ember::arange(0, 10, 2);                 // int64 [5]
//   ember::manual_seed(0);
//   ember::Tensor n = ember::randn({4, 4});                    // same every run
//   ember::Tensor v = ember::tensor(std::vector<float>{1, 2, 3});
//   double data[4] = {1, 2, 3, 4};
//   ember::Tensor b = ember::from_blob(data, {2, 2}, ember::kFloat64);  // no copy
//   ember::Tensor w = ember::randn({3}, ember::TensorOptions().requires_grad(true));
//   ```
//
// Every factory takes TensorOptions (tensor.h): dtype, device, requires_grad
// and pinned_memory, as torch's factories. Defaults follow torch: float32
// unless the values say otherwise (arange of integers gives int64, full of a
// bool gives bool, randint gives int64); the *_like factories take the
// input's dtype and device unless the options set them (never its
// requires_grad). requires_grad(true) is applied to the filled tensor, which
// is then a leaf; it needs //autograd and a floating dtype. pinned_memory(true)
// puts the result in pinned host memory (Tensor::pin_memory): it needs //cuda
// linked and a usable device, and throws otherwise, as torch does without
// CUDA. Random numbers come from
// a seedable generator: manual_seed(s) makes every later rand/randn/randint
// sequence reproducible across runs and machines (a 64-bit Mersenne Twister
// with Ember's own, platform-independent distributions; the values differ
// from PyTorch's). Errors throw ember::Error. The default generator is
// guarded by a mutex; factories are thread-safe.
#ifndef EMBER_TENSOR_FACTORIES_H_
#define EMBER_TENSOR_FACTORIES_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <vector>

#include "tensor/tensor.h"

namespace ember {

Tensor empty(IntArrayRef sizes, TensorOptions options = {});
Tensor empty_like(const Tensor& t, TensorOptions options = {});
Tensor zeros(IntArrayRef sizes, TensorOptions options = {});
Tensor zeros_like(const Tensor& t, TensorOptions options = {});
Tensor ones(IntArrayRef sizes, TensorOptions options = {});
Tensor ones_like(const Tensor& t, TensorOptions options = {});
// dtype from the value when not given: bool, int64 or float32.
Tensor full(IntArrayRef sizes, const Scalar& value, TensorOptions options = {});
Tensor full_like(const Tensor& t, const Scalar& value, TensorOptions options = {});

// [start, end) with `step`; int64 when all three are integers, else float32.
Tensor arange(const Scalar& end, TensorOptions options = {});
Tensor arange(const Scalar& start, const Scalar& end, const Scalar& step = 1,
              TensorOptions options = {});
// `steps` evenly spaced values from start to end inclusive.
Tensor linspace(double start, double end, int64_t steps, TensorOptions options = {});
// Identity matrix n x m (m defaults to n).
Tensor eye(int64_t n, std::optional<int64_t> m = std::nullopt, TensorOptions options = {});

// A seedable random source (torch.Generator).
class Generator {
 public:
  explicit Generator(uint64_t seed = 67280421310721ull) : engine_(seed), seed_(seed) {}
  void manual_seed(uint64_t seed);
  uint64_t initial_seed() const { return seed_; }
  // Uniform in [0, 1) with 53 random bits.
  double NextDouble();
  // Standard normal (Box-Muller on NextDouble).
  double NextNormal();
  // Uniform integer in [low, high).
  int64_t NextInt(int64_t low, int64_t high);
  std::mutex& mutex() { return mu_; }

 private:
  std::mt19937_64 engine_;
  uint64_t seed_;
  std::optional<double> spare_normal_;
  std::mutex mu_;
};

// The process-wide default generator.
Generator& default_generator();
// torch.manual_seed: reseeds the default generator.
void manual_seed(uint64_t seed);

// Uniform in [0, 1) (floating dtypes only).
Tensor rand(IntArrayRef sizes, TensorOptions options = {}, Generator* gen = nullptr);
Tensor rand_like(const Tensor& t, TensorOptions options = {}, Generator* gen = nullptr);
// Standard normal (floating dtypes only).
Tensor randn(IntArrayRef sizes, TensorOptions options = {}, Generator* gen = nullptr);
Tensor randn_like(const Tensor& t, TensorOptions options = {}, Generator* gen = nullptr);
// Uniform integers in [low, high); int64 unless told.
Tensor randint(int64_t low, int64_t high, IntArrayRef sizes, TensorOptions options = {},
               Generator* gen = nullptr);
// In place: uniform in [from, to) and normal(mean, std).
Tensor uniform_(const Tensor& t, double from = 0.0, double to = 1.0, Generator* gen = nullptr);
Tensor normal_(const Tensor& t, double mean = 0.0, double std = 1.0, Generator* gen = nullptr);

// A tensor over caller memory, without copying. `deleter` (may be empty) runs
// when the last tensor using the memory goes away; otherwise the caller keeps
// the memory alive for as long as the tensor is used. Contiguous unless
// `strides` are given.
Tensor from_blob(void* data, IntArrayRef sizes, TensorOptions options = {},
                 std::function<void(void*)> deleter = {});
Tensor from_blob(void* data, IntArrayRef sizes, IntArrayRef strides, TensorOptions options = {},
                 std::function<void(void*)> deleter = {});

// A copy of `values`, 1-D unless `sizes` is given (numel must match); the
// dtype is that of T unless the options set one (the values are converted).
template <typename T>
Tensor tensor(const std::vector<T>& values, std::optional<SizeVector> sizes = std::nullopt,
              TensorOptions options = {});
template <typename T>
Tensor tensor(const std::vector<T>& values, TensorOptions options) {
  return tensor(values, std::nullopt, options);
}
Tensor tensor(std::initializer_list<float> values, TensorOptions options = {});
Tensor tensor(std::initializer_list<double> values, TensorOptions options = {});
Tensor tensor(std::initializer_list<int64_t> values, TensorOptions options = {});
Tensor tensor(std::initializer_list<int> values, TensorOptions options = {});
Tensor tensor(std::initializer_list<bool> values, TensorOptions options = {});

// A 0-dim tensor holding `value` in `dtype` (default: from the value).
Tensor scalar_tensor(const Scalar& value, TensorOptions options = {});

// --- Implementation ----------------------------------------------------------------

namespace internal {
// A tensor of `sizes` filled from `count` host values of `dtype`, then
// converted and placed as `options` say (see tensor() above).
Tensor copy_from_host(const void* data, size_t count, Dtype dtype, IntArrayRef sizes,
                      const TensorOptions& options);
}  // namespace internal

template <typename T>
Tensor tensor(const std::vector<T>& values, std::optional<SizeVector> sizes,
              TensorOptions options) {
  using Stored = std::conditional_t<std::is_same_v<T, bool>, bool, T>;
  SizeVector shape = sizes ? *sizes : SizeVector{static_cast<int64_t>(values.size())};
  if constexpr (std::is_same_v<T, bool>) {
    std::vector<uint8_t> bytes(values.begin(), values.end());
    return internal::copy_from_host(bytes.data(), bytes.size(), kBool, shape, options);
  } else {
    return internal::copy_from_host(values.data(), values.size(), kDtypeOf<Stored>, shape, options);
  }
}

}  // namespace ember

#endif  // EMBER_TENSOR_FACTORIES_H_
