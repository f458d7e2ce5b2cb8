// PrefixStore: the shared store suite over a HashStore, then isolation of
// prefixes and the names in its errors.
#include "distributed/prefix_store.h"

#include <memory>

#include "distributed/hash_store.h"
#include "distributed/store_testing.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ember::distributed {
namespace {

using ::testing::HasSubstr;
using testing::StoreConformanceTest;
using testing::StoreHarness;
using testing::StoreImpl;

class PrefixStoreHarness : public StoreHarness {
 public:
  std::shared_ptr<Store> NewClient() override { return std::make_shared<PrefixStore>("job", base_); }

 private:
  std::shared_ptr<Store> base_ = std::make_shared<HashStore>();
};

INSTANTIATE_TEST_SUITE_P(All, StoreConformanceTest,
                         ::testing::Values(StoreImpl{"PrefixStore", [] {
                           return std::unique_ptr<StoreHarness>(new PrefixStoreHarness);
                         }}),
                         testing::StoreImplName);

TEST(PrefixStoreTest, PrefixesIsolateAndNest) {
  auto base = std::make_shared<HashStore>();
  PrefixStore a("a", base);
  PrefixStore b("b", base);
  auto a_inner = std::make_shared<PrefixStore>("a", base);
  PrefixStore nested("x", a_inner);
  ASSERT_TRUE(a.set("k", "from a").ok());
  ASSERT_TRUE(b.set("k", "from b").ok());
  ASSERT_TRUE(nested.set("k", "from a/x").ok());
  EXPECT_EQ(base->get("a/k", absl::Seconds(1)).value(), "from a");
  EXPECT_EQ(base->get("b/k", absl::Seconds(1)).value(), "from b");
  EXPECT_EQ(base->get("a/x/k", absl::Seconds(1)).value(), "from a/x");
  EXPECT_EQ(a.add("n", 2).value(), 2);
  EXPECT_EQ(b.add("n", 5).value(), 5);
  EXPECT_TRUE(a.delete_key("k").value());
  EXPECT_EQ(b.get("k", absl::Seconds(1)).value(), "from b");
  EXPECT_EQ(a.num_keys().value(), base->num_keys().value());
}

TEST(PrefixStoreTest, TimeoutNamesThePrefixedKey) {
  PrefixStore group("group7", std::make_shared<HashStore>());
  absl::Status status = group.wait({"rank3"}, absl::Milliseconds(50));
  ASSERT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(status.message(), HasSubstr("group7/rank3"));
}

TEST(PrefixStoreTest, InheritsTheWrappedTimeout) {
  auto base = std::make_shared<HashStore>();
  base->set_timeout(absl::Milliseconds(30));
  PrefixStore group("g", base);
  EXPECT_EQ(group.timeout(), absl::Milliseconds(30));
}

}  // namespace
}  // namespace ember::distributed
