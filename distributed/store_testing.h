// One behaviour suite that every Store implementation runs, so HashStore,
// FileStore, TcpStore and PrefixStore agree on set/get/add/compare_set/wait/
// delete/num_keys, on timeout errors and under concurrent clients.
//
//   class FileHarness : public StoreHarness { ... };
//   INSTANTIATE_TEST_SUITE_P(FileStore, StoreConformanceTest,
//       ::testing::Values(StoreImpl{"FileStore", [] { return MakeFileHarness(); }}),
//       StoreImplName);
//
// Thread-safety: a harness's NewClient may be called from any thread.
#ifndef EMBER_DISTRIBUTED_STORE_TESTING_H_
#define EMBER_DISTRIBUTED_STORE_TESTING_H_

#include <functional>
#include <memory>
#include <ostream>
#include <string>

#include "distributed/store.h"
#include "gtest/gtest.h"

namespace ember::distributed::testing {

// Owns one store under test (a server, a file, ...) and hands out clients.
class StoreHarness {
 public:
  virtual ~StoreHarness() = default;
  // A new client of the store under test; all clients of one harness see the
  // same keys. Fails the test (and returns null) if no client can be made.
  virtual std::shared_ptr<Store> NewClient() = 0;
};

struct StoreImpl {
  std::string name;
  std::function<std::unique_ptr<StoreHarness>()> make;
};

inline void PrintTo(const StoreImpl& impl, std::ostream* os) { *os << impl.name; }

inline std::string StoreImplName(const ::testing::TestParamInfo<StoreImpl>& info) { return info.param.name; }

class StoreConformanceTest : public ::testing::TestWithParam<StoreImpl> {
 protected:
  void SetUp() override {
    harness_ = GetParam().make();
    ASSERT_NE(harness_, nullptr);
  }
  std::shared_ptr<Store> NewClient() { return harness_->NewClient(); }

 private:
  std::unique_ptr<StoreHarness> harness_;
};

}  // namespace ember::distributed::testing

#endif  // EMBER_DISTRIBUTED_STORE_TESTING_H_
