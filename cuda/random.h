// Random numbers on CUDA devices, as torch.cuda's random functions: one
// Philox4x32-10 generator per device (Note [Random numbers] in
// tensor/factories.h), seeded all at once by ember::manual_seed or
// manual_seed_all, or one device at a time.
//
//   ```cpp
//   #include "cuda/random.h"
//   #include "tensor/factories.h"
//   ember::manual_seed(0);                     // the CPU's and every device's
//   EMBER_RETURN_IF_ERROR(ember::cuda::manual_seed(7, /*device=*/1));  // cuda:1 only
//   EMBER_ASSIGN_OR_RETURN(ember::Tensor state, ember::cuda::get_rng_state(1));
//   const ember::Device cuda1(ember::DeviceType::kCUDA, 1);
//   ember::Tensor a = ember::rand({4}, ember::TensorOptions().device(cuda1));
//   EMBER_RETURN_IF_ERROR(ember::cuda::set_rng_state(state, 1));
//   // rand on cuda:1 now gives `a` again, drawn on the device.
//   ```
//
// Linking //cuda:random registers the devices' default generators with
// tensor/ (SetDeviceGenerators), so rand/randn/randint/normal_/uniform_/
// bernoulli_ on a CUDA tensor without a generator draw from its device's
// (the kernels are //cuda:random_kernels). The generators are made on first
// use; until then seeds given to all devices are kept for them (torch's lazy
// seeding), so manual_seed_all never initialises CUDA: a process may seed,
// then fork.
//
// A device generator's state (get_rng_state) is 16 bytes: its seed and its
// offset, little-endian uint64s, as PyTorch's CUDA generator state. What a
// seed yields is the same on every device and for every launch geometry;
// it differs from PyTorch's values.
//
// Errors: a device index is the environment (README.md "API rules"): -1 is
// the current device; an index that names no device is kInvalidArgument
// ("CUDA error: invalid device ordinal"), no usable CUDA kFailedPrecondition
// with the reason. DeviceGenerators::get, which tensor factories call,
// throws ember::Error with the same messages.
//
// Thread-safety: thread-safe.
#ifndef EMBER_CUDA_RANDOM_H_
#define EMBER_CUDA_RANDOM_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tensor/factories.h"
#include "tensor/tensor.h"

namespace ember::cuda {

// The default generator of `device` (-1: the current device).
absl::StatusOr<Generator*> default_generator(int device = -1);

// torch.cuda.manual_seed: reseeds `device`'s default generator (-1: the
// current device); its offset goes back to 0.
absl::Status manual_seed(uint64_t seed, int device = -1);
// torch.cuda.manual_seed_all: reseeds every device's default generator,
// now or, before the generators exist, when they are made. Never fails.
void manual_seed_all(uint64_t seed);
// torch.cuda.seed / seed_all: a non-deterministic seed, for one device (the
// seed is returned) or for all of them.
absl::StatusOr<uint64_t> seed(int device = -1);
void seed_all();
// torch.cuda.initial_seed: the seed `device`'s default generator started from.
absl::StatusOr<uint64_t> initial_seed(int device = -1);

// torch.cuda.get_rng_state / set_rng_state: `device`'s generator state as a
// uint8 CPU tensor of 16 bytes, and its restoration (kInvalidArgument for a
// tensor that is not such a state).
absl::StatusOr<Tensor> get_rng_state(int device = -1);
absl::Status set_rng_state(const Tensor& state, int device = -1);
// Every device's, in device order.
absl::StatusOr<std::vector<Tensor>> get_rng_state_all();
// kInvalidArgument unless there is one state per device.
absl::Status set_rng_state_all(const std::vector<Tensor>& states);

// The per-device registry behind the functions above, which tensor/ reaches
// through DeviceGenerators. `count` says how many devices there are and
// `resolve` turns an index (-1: the current device) into a valid one or the
// error for it; both are called only once a generator is needed (the
// process-wide registry asks the CUDA runtime).
class PhiloxGenerators : public DeviceGenerators {
 public:
  PhiloxGenerators(std::function<int()> count, std::function<absl::StatusOr<int>(int)> resolve);

  // `index`'s generator; the error of `resolve` for an index that is not a
  // device.
  absl::StatusOr<Generator*> Get(int index);
  // DeviceGenerators: Get, throwing ember::Error with its message.
  Generator& get(int index) override;
  void manual_seed_all(uint64_t seed) override;
  // Whether the generators have been made (a device asked for).
  bool created() const;
  // Every device's generator, in device order (made now if not yet).
  std::vector<Generator*> all();

 private:
  void CreateLocked();

  std::function<int()> count_;
  std::function<absl::StatusOr<int>(int)> resolve_;
  mutable std::mutex mu_;
  bool created_ = false;
  std::optional<uint64_t> pending_seed_;  // manual_seed_all before creation
  std::vector<std::unique_ptr<Generator>> generators_;
};

// The process-wide registry (registered with tensor/ for kCUDA).
PhiloxGenerators& generators();

}  // namespace ember::cuda

#endif  // EMBER_CUDA_RANDOM_H_
