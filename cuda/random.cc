#include "cuda/random.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "cuda/device.h"
#include "tensor/error.h"
#include "tensor/status_macros.h"

namespace ember::cuda {

PhiloxGenerators::PhiloxGenerators(std::function<int()> count,
                                   std::function<absl::StatusOr<int>(int)> resolve)
    : count_(std::move(count)), resolve_(std::move(resolve)) {}

void PhiloxGenerators::CreateLocked() {
  if (created_) return;
  const int n = count_();
  for (int d = 0; d < n; ++d) {
    generators_.push_back(std::make_unique<Generator>(
        pending_seed_.value_or(Generator::kDefaultSeed), Device(DeviceType::kCUDA, d)));
  }
  created_ = true;
}

absl::StatusOr<Generator*> PhiloxGenerators::Get(int index) {
  EMBER_ASSIGN_OR_RETURN(const int d, resolve_(index));
  std::lock_guard<std::mutex> lock(mu_);
  CreateLocked();
  if (d < 0 || d >= static_cast<int>(generators_.size())) {
    return absl::InternalError(absl::StrCat("CUDA generators: device ", d, " resolved from ", index,
                                            " but ", generators_.size(), " generators exist"));
  }
  return generators_[d].get();
}

Generator& PhiloxGenerators::get(int index) {
  absl::StatusOr<Generator*> g = Get(index);
  if (!g.ok()) EMBER_FAIL(g.status().message());
  return **g;
}

void PhiloxGenerators::manual_seed_all(uint64_t seed) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!created_) {
    pending_seed_ = seed;
    return;
  }
  for (const auto& g : generators_) g->manual_seed(seed);
}

bool PhiloxGenerators::created() const {
  std::lock_guard<std::mutex> lock(mu_);
  return created_;
}

std::vector<Generator*> PhiloxGenerators::all() {
  std::lock_guard<std::mutex> lock(mu_);
  CreateLocked();
  std::vector<Generator*> out;
  for (const auto& g : generators_) out.push_back(g.get());
  return out;
}

PhiloxGenerators& generators() {
  static PhiloxGenerators* registry = new PhiloxGenerators(
      [] { return device_count(); },
      [](int device) { return internal::CheckDevice("CUDA generator", device); });
  return *registry;
}

namespace {

// tensor/'s factories reach the CUDA generators through this registration.
const bool registered = [] {
  SetDeviceGenerators(DeviceType::kCUDA, &generators());
  return true;
}();

// Runs `body` (which may throw ember::Error, as Generator::set_state does)
// and returns its error as kInvalidArgument.
template <typename F>
absl::Status Catching(F&& body) {
  try {
    body();
  } catch (const Error& e) {
    return absl::InvalidArgumentError(e.what());
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Generator*> default_generator(int device) { return generators().Get(device); }

absl::Status manual_seed(uint64_t seed, int device) {
  EMBER_ASSIGN_OR_RETURN(Generator * g, default_generator(device));
  g->manual_seed(seed);
  return absl::OkStatus();
}

void manual_seed_all(uint64_t seed) { generators().manual_seed_all(seed); }

absl::StatusOr<uint64_t> seed(int device) {
  EMBER_ASSIGN_OR_RETURN(Generator * g, default_generator(device));
  return g->seed();
}

void seed_all() {
  Generator source(0);
  const uint64_t s = source.seed();
  manual_seed_all(s);
}

absl::StatusOr<uint64_t> initial_seed(int device) {
  EMBER_ASSIGN_OR_RETURN(Generator * g, default_generator(device));
  return g->initial_seed();
}

absl::StatusOr<Tensor> get_rng_state(int device) {
  EMBER_ASSIGN_OR_RETURN(Generator * g, default_generator(device));
  return g->get_state();
}

absl::Status set_rng_state(const Tensor& state, int device) {
  EMBER_ASSIGN_OR_RETURN(Generator * g, default_generator(device));
  return Catching([&] { g->set_state(state); });
}

absl::StatusOr<std::vector<Tensor>> get_rng_state_all() {
  std::vector<Tensor> states;
  for (Generator* g : generators().all()) states.push_back(g->get_state());
  return states;
}

absl::Status set_rng_state_all(const std::vector<Tensor>& states) {
  const std::vector<Generator*> all = generators().all();
  if (states.size() != all.size()) {
    return absl::InvalidArgumentError(absl::StrCat("cuda::set_rng_state_all: got ", states.size(),
                                                   " states for ", all.size(), " devices"));
  }
  // Every state is checked before any generator changes.
  for (size_t d = 0; d < all.size(); ++d) {
    Generator probe(0, all[d]->device());
    EMBER_RETURN_IF_ERROR(Catching([&] { probe.set_state(states[d]); }));
  }
  for (size_t d = 0; d < all.size(); ++d) all[d]->set_state(states[d]);
  return absl::OkStatus();
}

}  // namespace ember::cuda
