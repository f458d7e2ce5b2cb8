// ConnectFullMesh (Note [Two gloo dialects] in mesh.cc): the store keys of
// both dialects, Ember ranks meeting as libgloo does and exchanging data over
// the mesh, and a peer's malformed newer-gloo record refused with its rank.
// The mixed meshes with PyTorch 2.15 ranks run in torch_interop_test.
#include "distributed/gloo/mesh.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "distributed/gloo/device.h"
#include "distributed/hash_store.h"
#include "gloo/allreduce_ring.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ember::distributed::gloo {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

std::shared_ptr<::gloo::transport::Device> Loopback() {
  return CreateDevice({.interface = "", .hostname = "127.0.0.1", .describe = "loopback"}).value();
}

// The keys PyTorch 2.15's gloo backend waits for, as it named them in a run
// over a logging store: the default group "0" and new_group's group "1",
// over a store passed in and over env:// (under "default_pg/").
TEST(MeshTest, KeysAreWhereEachGlooLooksForThem) {
  EXPECT_EQ(NewerGlooRankKey("0/", 1), "0//cpu//0/1");
  EXPECT_EQ(NewerGlooRankKey("1/", 0), "0//1//cpu//0/0");
  EXPECT_EQ(NewerGlooRankKey("default_pg/0/", 1), "default_pg/0//cpu//0/1");
  EXPECT_EQ(NewerGlooRankKey("default_pg/12/", 2), "default_pg/0//12//cpu//0/2");
  // A mixed backend's prefix is taken as it is.
  EXPECT_EQ(NewerGlooRankKey("0/cpu/", 3), "0/cpu//cpu//0/3");
  // libgloo's (PyTorch 1.13's): "<group>/0/<rank>".
  EXPECT_EQ(LibglooAddressKey("0/", 2), "0/0/2");
}

TEST(MeshTest, EmberRanksMeetAndReduce) {
  constexpr int kRanks = 3;
  auto store = std::make_shared<HashStore>();
  std::vector<absl::StatusOr<MeshResult>> meshes(kRanks, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      const std::string record = "g/ember_gloo/proc/";
      (void)store->set(record + std::to_string(r), "ember");
      meshes[r] = ConnectFullMesh({.store = store,
                                   .group_prefix = "g/",
                                   .rank = r,
                                   .size = kRanks,
                                   .device = Loopback(),
                                   .timeout = absl::Seconds(30),
                                   .ember_record_prefix = record});
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(meshes[r].ok()) << meshes[r].status();
    EXPECT_THAT(meshes[r]->newer_gloo, ::testing::Each(false));
  }
  // Both dialects' keys were published.
  EXPECT_TRUE(store->check({"g/0/rank_1", "g/0/1", "g//cpu//0/1"}).value());

  std::vector<std::vector<float>> data(kRanks);
  threads.clear();
  for (int r = 0; r < kRanks; ++r) {
    data[r] = {float(r + 1), float(10 * (r + 1))};
    threads.emplace_back([&, r] {
      ::gloo::AllreduceRing<float> ring(meshes[r]->context, {data[r].data()}, 2);
      ring.run();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) EXPECT_THAT(data[r], ::testing::ElementsAre(6.0f, 60.0f));
}

TEST(MeshTest, MalformedNewerGlooRecordNamesTheRank) {
  auto store = std::make_shared<HashStore>();
  // Rank 1 wrote no Ember record and a newer-gloo record cut short.
  ASSERT_TRUE(store->set(NewerGlooRankKey("g/", 1), std::string("\x02\0\0\0\0\0\0\0vm", 10)).ok());
  absl::StatusOr<MeshResult> mesh = ConnectFullMesh({.store = store,
                                                     .group_prefix = "g/",
                                                     .rank = 0,
                                                     .size = 2,
                                                     .device = Loopback(),
                                                     .timeout = absl::Seconds(5),
                                                     .ember_record_prefix = "g/ember_gloo/proc/"});
  ASSERT_EQ(mesh.status().code(), absl::StatusCode::kDataLoss) << mesh.status();
  EXPECT_THAT(mesh.status().message(), HasSubstr("rank 1's gloo record (10 bytes)"));
}

// A newer-gloo rank that connects lazily publishes its record without the
// pair sequence numbers (u64 0, no host name, u64 136, a zeroed IPv4
// address); it would never open the pairs Ember waits on, so it is refused.
TEST(MeshTest, LazyNewerGlooRankIsRefusedByName) {
  auto store = std::make_shared<HashStore>();
  std::string record(8, '\0');
  record += std::string("\x88\0\0\0\0\0\0\0", 8);
  std::string address(136, '\0');
  address[0] = 2;  // AF_INET
  record += address;
  ASSERT_TRUE(store->set(NewerGlooRankKey("g/", 1), record).ok());
  absl::StatusOr<MeshResult> mesh = ConnectFullMesh({.store = store,
                                                     .group_prefix = "g/",
                                                     .rank = 0,
                                                     .size = 2,
                                                     .device = Loopback(),
                                                     .timeout = absl::Seconds(5),
                                                     .ember_record_prefix = "g/ember_gloo/proc/"});
  ASSERT_EQ(mesh.status().code(), absl::StatusCode::kFailedPrecondition) << mesh.status();
  EXPECT_THAT(mesh.status().message(),
              AllOf(HasSubstr("rank 1"), HasSubstr("TORCH_GLOO_LAZY_INIT=1")));
}

}  // namespace
}  // namespace ember::distributed::gloo
