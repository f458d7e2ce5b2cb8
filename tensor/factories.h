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
// a seedable generator of the tensor's device (Note [Random numbers]):
// manual_seed(s) reseeds the CPU's and every device's default generator, so
// every later rand/randn/randint sequence is reproducible across runs and
// machines. Errors throw ember::Error. Generators are guarded by a mutex;
// factories are thread-safe.
//
// Note [Random numbers]
// A Generator belongs to a device type, as torch.Generator does. The CPU's
// is PyTorch's CPU engine: the 32-bit Mersenne Twister (MT19937) seeded with
// the seed's low 32 bits; a 64-bit draw is two 32-bit ones, the first the
// high word (random() and random64(), as torch's CPUGeneratorImpl). Draws
// happen on the host in row-major order. randint, randperm and float64
// uniform draw as PyTorch's CPU kernels do (a 32-bit draw modulo the range
// below 2^32, else a 64-bit one; Fisher-Yates with a draw modulo the rest;
// the low 53 bits of a 64-bit draw), so a seed gives PyTorch's values and a
// sampler shuffled here visits the data in PyTorch's order; uniform and
// normal of every floating dtype draw as PyTorch's CPU kernels too (Note
// [PyTorch's CPU draws] in factories.cc). A device's is counter-based Philox4x32-10, PyTorch's
// CUDA generator: its state is a seed and an offset, nothing else. A kernel
// that draws asks philox_engine_inputs(increment) for the seed and the
// offset to start from, and the offset moves on by `increment` (rounded up
// to a multiple of 4, one Philox block), the count of 32-bit values each
// element group draws, so the next kernel draws values never used before.
// The kernels (cuda/random_kernels.cu) give element group g Philox
// subsequence g at that offset, so what a seed yields does not depend on
// the launch's grid. rand/randn/randint/uniform_/normal_/bernoulli_ resolve
// the generator (the caller's, or default_generator(device)), check that it
// belongs to the tensor's device type, and call the dispatched kernels
// uniform_out/normal_out/random_out/bernoulli_out, so a CUDA tensor's numbers
// are drawn on its device, never on the host. Each device backend registers
// its default generators, one per device (DeviceGenerators); //cuda:random
// registers CUDA's (cuda/random.h: manual_seed(seed, device), get_rng_state).
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

// A seedable random source of one device type (torch.Generator; Note
// [Random numbers]). The CPU's draws on the host (NextDouble, NextNormal,
// NextInt, with mutex() held); a device's hands out Philox seeds and offsets
// to kernels (philox_engine_inputs). The other members lock by themselves.
class Generator {
 public:
  // torch's default seed.
  static constexpr uint64_t kDefaultSeed = 67280421310721ull;
  // Bytes of a device generator's state: the seed and the offset, each a
  // little-endian uint64 (as PyTorch's CUDA generator state).
  static constexpr int64_t kPhiloxStateSize = 16;

  explicit Generator(uint64_t seed = kDefaultSeed) : Generator(seed, kCPU) {}
  // A generator of `device`'s type: the CPU's Mersenne Twister, or Philox
  // for any other type (its index only names which device's it is).
  Generator(uint64_t seed, Device device);

  Device device() const { return device_; }
  // Reseeds; a device generator's offset goes back to 0.
  void manual_seed(uint64_t seed);
  uint64_t initial_seed() const;
  // torch.Generator.seed(): reseeds from a non-deterministic source and
  // returns the seed.
  uint64_t seed();
  // torch.Generator.get_state(): a uint8 CPU tensor that set_state restores
  // exactly. A device generator's is kPhiloxStateSize bytes; the CPU's is
  // torch.get_rng_state()'s 5,056 bytes, so states move between Ember and
  // PyTorch both ways (Note [The CPU generator's state] in factories.cc).
  Tensor get_state() const;
  // Throws, saying what is wrong, for a tensor that is not a uint8 CPU
  // tensor of this generator's state (its size, or an engine position or
  // word no MT19937 state has).
  void set_state(const Tensor& state);

  // --- Device generators (Philox) ----------------------------------------
  struct PhiloxInputs {
    uint64_t seed;
    uint64_t offset;
  };
  // The seed and the offset a kernel starts from; moves the offset on by
  // `increment` rounded up to a multiple of 4. Throws for a CPU generator.
  PhiloxInputs philox_engine_inputs(uint64_t increment);
  // torch.Generator.get_offset()/set_offset(); set_offset throws unless the
  // offset is a multiple of 4 (kernels start at a Philox block).
  uint64_t offset() const;
  void set_offset(uint64_t offset);

  // --- CPU draws (the caller holds mutex()) -------------------------------
  // The engine's next 32 bits, and 64 bits from two 32-bit draws (the first
  // the high word): torch's CPUGeneratorImpl random() and random64().
  uint32_t random();
  uint64_t random64();
  // Uniform in [0, 1): the low 53 bits of random64() (PyTorch's double).
  double NextDouble();
  // Uniform in [0, 1) with `mantissa_bits` significant bits, as PyTorch's
  // uniform draw for a dtype with that significand: NextDouble() for 53,
  // else the low bits of random() (24 for float32).
  double NextUniform(int mantissa_bits);
  // Standard normal as PyTorch's normal_distribution<double>: Box-Muller on
  // two NextDouble() draws, the pair's second value kept for the next call.
  double NextNormal();
  // Integer in [low, high) as torch.randint draws it: random() modulo the
  // range below 2^32, random64() modulo it above.
  int64_t NextInt(int64_t low, int64_t high);
  std::mutex& mutex() { return mu_; }

 private:
  void CheckCpu(const char* call) const;
  void CheckDevice(const char* call) const;
  void SeedLocked(uint64_t seed);

  Device device_;
  std::mt19937 engine_;  // seeded with the seed's low 32 bits
  uint64_t seed_;
  uint64_t offset_ = 0;  // device generators: the next kernel's Philox offset
  std::optional<double> spare_normal_;
  mutable std::mutex mu_;
};

// The process-wide default generator of the CPU.
Generator& default_generator();

// A device backend's default generators, one per device (//cuda:random
// registers CUDA's at load time). Thread-safe.
class DeviceGenerators {
 public:
  virtual ~DeviceGenerators() = default;
  // The default generator of device `index` (-1: the calling thread's
  // current device); throws for an index that names no device.
  virtual Generator& get(int index) = 0;
  // Reseeds every device's default generator (torch.cuda.manual_seed_all).
  virtual void manual_seed_all(uint64_t seed) = 0;
};
// Registers `generators` (not owned, must outlive its use; null
// unregisters) for `type`, which is not the CPU.
void SetDeviceGenerators(DeviceType type, DeviceGenerators* generators);
DeviceGenerators* GetDeviceGenerators(DeviceType type);

// The default generator of `device`: the CPU's, or its backend's for the
// device (an index-less device: the current one). Throws when no backend
// registered generators for the type (link //cuda).
Generator& default_generator(Device device);

// torch.manual_seed: reseeds the CPU's default generator and every device's
// (each registered DeviceGenerators' manual_seed_all).
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
// A random permutation of 0..n-1 (torch.randperm): int64 unless told, drawn
// on the CPU generator as PyTorch's CPU kernel draws it (Note [Random
// numbers]); a tensor for another device is drawn on the host and copied.
Tensor randperm(int64_t n, TensorOptions options = {}, Generator* gen = nullptr);
// In place: uniform in [from, to) and normal(mean, std).
Tensor uniform_(const Tensor& t, double from = 0.0, double to = 1.0, Generator* gen = nullptr);
Tensor normal_(const Tensor& t, double mean = 0.0, double std = 1.0, Generator* gen = nullptr);
// In place: 1 with probability p, else 0 (any dtype; 0 <= p <= 1).
Tensor bernoulli_(const Tensor& t, double p = 0.5, Generator* gen = nullptr);
// 1 where a uniform draw falls below `probs` (floating, each in [0, 1)),
// else 0, in probs' dtype and on its device (torch.bernoulli).
Tensor bernoulli(const Tensor& probs, Generator* gen = nullptr);

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
