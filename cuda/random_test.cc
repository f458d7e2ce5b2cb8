// The per-device generator registry (cuda/random.h) without a device: lazy
// creation, seeding all devices before and after it, per-device seeds and
// states, the index checks, and its registration with tensor/. Runs in
// every build (with and without CUDA support); the draws themselves are
// random_kernels_test's.
#include "cuda/random.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cuda/device.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/error.h"
#include "tensor/factories.h"

namespace ember::cuda {
namespace {

using ::testing::HasSubstr;

// A registry over `count` devices whose current device is `*current`.
struct Registry {
  explicit Registry(int count)
      : generators(
            [this, count] {
              ++count_calls;
              return count;
            },
            [this, count](int device) -> absl::StatusOr<int> {
              const int d = device == -1 ? current : device;
              if (d < 0 || d >= count) {
                return absl::InvalidArgumentError(
                    absl::StrCat("CUDA error: invalid device ordinal ", d, " of ", count));
              }
              return d;
            }) {}
  int current = 0;
  int count_calls = 0;
  PhiloxGenerators generators;
};

TEST(PhiloxGeneratorsTest, OneGeneratorPerDeviceMadeOnFirstUse) {
  Registry r(3);
  EXPECT_FALSE(r.generators.created());
  EXPECT_EQ(r.count_calls, 0);
  absl::StatusOr<Generator*> g1 = r.generators.Get(1);
  ASSERT_TRUE(g1.ok()) << g1.status();
  EXPECT_TRUE(r.generators.created());
  EXPECT_EQ((*g1)->device(), Device(DeviceType::kCUDA, 1));
  EXPECT_EQ((*g1)->initial_seed(), Generator::kDefaultSeed);
  std::vector<Generator*> all = r.generators.all();
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[1], *g1);
  EXPECT_NE(all[0], all[2]);
  EXPECT_EQ(all[2]->device().index(), 2);
  EXPECT_EQ(r.count_calls, 1);  // asked once

  r.current = 2;
  EXPECT_EQ(*r.generators.Get(-1), all[2]);
  EXPECT_EQ(&r.generators.get(-1), all[2]);
}

TEST(PhiloxGeneratorsTest, IndicesThatNameNoDeviceAreErrors) {
  Registry r(2);
  absl::StatusOr<Generator*> g = r.generators.Get(2);
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(g.status().message()), HasSubstr("invalid device ordinal 2 of 2"));
  try {
    r.generators.get(5);
    ADD_FAILURE() << "no error for device 5";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("invalid device ordinal 5 of 2"));
  }
}

TEST(PhiloxGeneratorsTest, SeedingAllBeforeCreationIsKeptAndAsksNothing) {
  Registry r(2);
  r.generators.manual_seed_all(99);
  EXPECT_FALSE(r.generators.created());
  EXPECT_EQ(r.count_calls, 0);  // no device query: torch's lazy seeding
  for (Generator* g : r.generators.all()) {
    EXPECT_EQ(g->initial_seed(), 99u);
    EXPECT_EQ(g->offset(), 0u);
  }
}

TEST(PhiloxGeneratorsTest, SeedingAllAfterCreationResetsEveryOffset) {
  Registry r(2);
  std::vector<Generator*> all = r.generators.all();
  all[0]->philox_engine_inputs(8);
  all[1]->philox_engine_inputs(4);
  r.generators.manual_seed_all(5);
  for (Generator* g : all) {
    EXPECT_EQ(g->initial_seed(), 5u);
    EXPECT_EQ(g->offset(), 0u);
  }
  // One device alone.
  all[1]->manual_seed(6);
  EXPECT_EQ(all[0]->initial_seed(), 5u);
  EXPECT_EQ(all[1]->initial_seed(), 6u);
}

TEST(PhiloxGeneratorsTest, StatesArePerDevice) {
  Registry r(2);
  std::vector<Generator*> all = r.generators.all();
  all[0]->manual_seed(1);
  all[0]->philox_engine_inputs(12);
  const Tensor state0 = all[0]->get_state();
  all[1]->set_state(state0);
  EXPECT_EQ(all[1]->initial_seed(), 1u);
  EXPECT_EQ(all[1]->offset(), 12u);
  all[0]->philox_engine_inputs(4);
  EXPECT_EQ(all[0]->offset(), 16u);
  EXPECT_EQ(all[1]->offset(), 12u);
}

TEST(CudaRandomTest, RegisteredWithTensorForCuda) {
  EXPECT_EQ(GetDeviceGenerators(DeviceType::kCUDA), &generators());
}

TEST(CudaRandomTest, WithoutADeviceCallsFailAndSeedingAllDoesNot) {
  if (device_count() > 0) GTEST_SKIP() << "a CUDA device is usable: this case is for none";
  // Seeding every device never fails, and ember::manual_seed seeds them too.
  manual_seed_all(3);
  ember::manual_seed(3);
  seed_all();
  for (int device : {-1, 0}) {
    absl::StatusOr<Generator*> g = default_generator(device);
    EXPECT_FALSE(g.ok());
    EXPECT_NE(g.status().code(), absl::StatusCode::kOk);
    EXPECT_FALSE(manual_seed(1, device).ok());
    EXPECT_FALSE(initial_seed(device).ok());
    EXPECT_FALSE(get_rng_state(device).ok());
    EXPECT_FALSE(seed(device).ok());
  }
  absl::StatusOr<std::vector<Tensor>> states = get_rng_state_all();
  ASSERT_TRUE(states.ok()) << states.status();
  EXPECT_TRUE(states->empty());
  EXPECT_TRUE(set_rng_state_all({}).ok());
  absl::Status extra = set_rng_state_all({Generator(1, Device(DeviceType::kCUDA, 0)).get_state()});
  EXPECT_EQ(extra.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(extra.message()), HasSubstr("got 1 states for 0 devices"));
  // tensor/'s default generator for a CUDA device reports the same.
  try {
    ember::default_generator(Device(DeviceType::kCUDA, 0));
    ADD_FAILURE() << "no error without a device";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("CUDA generator"));
  }
}

}  // namespace
}  // namespace ember::cuda
