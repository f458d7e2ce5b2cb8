// HashStore under the shared store suite: every client is the same object.
#include "distributed/hash_store.h"

#include <memory>

#include "distributed/store_testing.h"
#include "gtest/gtest.h"

namespace ember::distributed {
namespace {

using testing::StoreConformanceTest;
using testing::StoreHarness;
using testing::StoreImpl;

class HashStoreHarness : public StoreHarness {
 public:
  std::shared_ptr<Store> NewClient() override { return store_; }

 private:
  std::shared_ptr<Store> store_ = std::make_shared<HashStore>();
};

INSTANTIATE_TEST_SUITE_P(All, StoreConformanceTest,
                         ::testing::Values(StoreImpl{"HashStore", [] {
                           return std::unique_ptr<StoreHarness>(new HashStoreHarness);
                         }}),
                         testing::StoreImplName);

}  // namespace
}  // namespace ember::distributed
