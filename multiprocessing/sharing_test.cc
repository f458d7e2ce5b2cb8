#include "multiprocessing/sharing.h"

#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "multiprocessing/connection.h"
#include "multiprocessing/process.h"
#include "multiprocessing/testing.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"
#include "tensor/tensor.h"
#include "tensor/testing.h"

namespace ember::multiprocessing {
namespace {

using ::ember::testing::Values;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// 0..5 (for bool: 0, 0, 0, 1, 1, 1) in `dtype`, shape {2, 3}.
Tensor Sample(Dtype dtype) {
  Tensor t = arange(6).view({2, 3});
  return dtype == kBool ? t.gt(2) : t.to(dtype);
}

TEST(SharingStrategyTest, ListsAndSetsStrategies) {
  EXPECT_THAT(get_all_sharing_strategies(), ElementsAre("file_descriptor", "file_system"));
  ASSERT_TRUE(set_sharing_strategy("file_system").ok());
  EXPECT_EQ(get_sharing_strategy(), "file_system");
  ASSERT_TRUE(set_sharing_strategy("file_descriptor").ok());
  EXPECT_EQ(get_sharing_strategy(), "file_descriptor");
}

TEST(SharingStrategyTest, UnknownStrategyNamesTheValidOnes) {
  absl::Status s = set_sharing_strategy("shared_mem");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("'shared_mem'"));
  EXPECT_THAT(s.message(), HasSubstr("file_descriptor, file_system"));
  EXPECT_EQ(get_sharing_strategy(), "file_descriptor");
}

TEST(SharingStrategyTest, BadPrefixIsRefused) {
  absl::Status s = set_shared_memory_prefix("no/slash");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("'no/slash'"));
}

class SharingTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    ASSERT_TRUE(set_sharing_strategy(GetParam()).ok());
    ASSERT_TRUE(set_shared_memory_prefix(testing::UniquePrefix("sharing")).ok());
  }
  void TearDown() override { ASSERT_TRUE(set_sharing_strategy("file_descriptor").ok()); }
};

TEST_P(SharingTest, ShareMemoryMovesInPlaceAndViewsFollow) {
  Tensor t = arange(12).view({3, 4}).to(kFloat32);
  Tensor view = t.t();
  EXPECT_FALSE(is_shared(t));
  ASSERT_TRUE(share_memory_(t).ok());
  EXPECT_TRUE(is_shared(t));
  EXPECT_TRUE(is_shared(view));
  EXPECT_EQ(Values(t), Values(arange(12).to(kFloat32)));
  view.select(0, 1).fill_(-1);  // column 1 of t
  EXPECT_EQ(Values(t.select(1, 1)), (std::vector<double>{-1, -1, -1}));
  ASSERT_TRUE(share_memory_(t).ok());  // already shared: nothing changes
  EXPECT_EQ(Values(t.select(1, 1)), (std::vector<double>{-1, -1, -1}));
}

TEST_P(SharingTest, EmptySharedIsBornInSharedMemoryAndAChildsWritesAreSeen) {
  absl::StatusOr<Tensor> t = empty_shared({2, 3}, kFloat64);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE(is_shared(*t));
  EXPECT_EQ(t->sizes(), (SizeVector{2, 3}));
  EXPECT_EQ(t->dtype(), kFloat64);
  EXPECT_TRUE(t->is_contiguous());
  Tensor shared = *t;
  absl::StatusOr<Process> child = Process::start([shared]() -> absl::Status {
    shared.fill_(2.5);
    return absl::OkStatus();
  });
  ASSERT_TRUE(child.ok()) << child.status();
  ASSERT_TRUE(child->join(absl::Seconds(10)).ok());
  EXPECT_EQ(Values(*t), (std::vector<double>(6, 2.5)));
  absl::StatusOr<Tensor> zero = empty_shared({0, 4}, kFloat32);
  ASSERT_TRUE(zero.ok()) << zero.status();
  EXPECT_EQ(zero->numel(), 0);
  absl::StatusOr<Tensor> bad = empty_shared({2, -1}, kFloat32);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("negative size in [2, -1]"));
}

TEST_P(SharingTest, EveryDtypeViewsAndEmptyTensorsCrossAndWritesAreSeenBothWays) {
  std::vector<Tensor> sent;
  Value::List message;
  for (Dtype d : kAllDtypes) {
    sent.push_back(Sample(d));
    message.push_back(sent.back());
  }
  Tensor base = arange(24).view({4, 6}).to(kFloat64);
  Tensor strided = base.t().slice(1, 1, 4);  // non-contiguous view, offset 1
  message.push_back(strided);
  message.push_back(empty({0, 3}));
  message.push_back(Value::List{Value(7), Value("label"), Value(2.5), Value(true), Value()});
  auto pipe = Pipe();
  ASSERT_TRUE(pipe.ok()) << pipe.status();
  absl::StatusOr<Process> child = Process::start([&]() -> absl::Status {
    EMBER_ASSIGN_OR_RETURN(Value v, pipe->second.recv(absl::Seconds(20)));
    const Value::List& got = v.list();
    CHILD_CHECK(got.size() == kNumDtypes + 3);
    for (int i = 0; i < kNumDtypes; ++i) {
      EMBER_ASSIGN_OR_RETURN(Tensor t, got[i].as<Tensor>());
      CHILD_CHECK(t.dtype() == kAllDtypes[i]);
      CHILD_CHECK(t.sizes() == IntArrayRef({2, 3}));
      CHILD_CHECK(Values(t) == Values(Sample(kAllDtypes[i])));
      CHILD_CHECK(is_shared(t));
      t.fill_(1);  // the parent must see this
    }
    EMBER_ASSIGN_OR_RETURN(Tensor s, got[kNumDtypes].as<Tensor>());
    CHILD_CHECK(s.sizes() == IntArrayRef({6, 3}));
    CHILD_CHECK(s.strides() == IntArrayRef({1, 6}));
    CHILD_CHECK(s.storage_offset() == 6);
    CHILD_CHECK(Values(s) == Values(arange(24).view({4, 6}).t().slice(1, 1, 4).to(kFloat64)));
    s.fill_(-5);
    EMBER_ASSIGN_OR_RETURN(Tensor e, got[kNumDtypes + 1].as<Tensor>());
    CHILD_CHECK(e.numel() == 0 && e.sizes() == IntArrayRef({0, 3}));
    const Value::List& plain = got[kNumDtypes + 2].list();
    CHILD_CHECK(plain.size() == 5);
    CHILD_CHECK(*plain[0].get_if<int64_t>() == 7);
    CHILD_CHECK(*plain[1].get_if<std::string>() == "label");
    CHILD_CHECK(*plain[2].get_if<double>() == 2.5);
    CHILD_CHECK(*plain[3].get_if<bool>());
    CHILD_CHECK(plain[4].is_none());
    EMBER_RETURN_IF_ERROR(pipe->second.send(Value("written")));
    // Now wait for the parent's write to arrive in our view.
    EMBER_ASSIGN_OR_RETURN(Value go, pipe->second.recv(absl::Seconds(20)));
    EMBER_ASSIGN_OR_RETURN(Tensor f, got[0].as<Tensor>());
    CHILD_CHECK(Values(f) == std::vector<double>(6, 42));
    return absl::OkStatus();
  });
  ASSERT_TRUE(child.ok()) << child.status();
  ASSERT_TRUE(pipe->first.send(Value(message), absl::Seconds(20)).ok());
  absl::StatusOr<Value> ack = pipe->first.recv(absl::Seconds(20));
  ASSERT_TRUE(ack.ok()) << ack.status() << " / " << child->join(absl::Seconds(5)).status()
                        << child->error_message();
  for (const Tensor& t : sent) {
    EXPECT_TRUE(is_shared(t));  // moved in place when sent
    EXPECT_EQ(Values(t), std::vector<double>(6, 1)) << t.dtype();
  }
  EXPECT_EQ(Values(strided), std::vector<double>(18, -5));
  EXPECT_EQ(Values(base.select(0, 0)), (std::vector<double>{0, 1, 2, 3, 4, 5}));  // untouched
  sent[0].fill_(42);
  ASSERT_TRUE(pipe->first.send(Value("go")).ok());
  absl::StatusOr<ExitStatus> exit = child->join(absl::Seconds(20));
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_TRUE(exit->ok()) << exit->str() << ": " << child->error_message();
}

TEST_P(SharingTest, AStorageSentTwiceIsMappedOnce) {
  Tensor t = ones({256}, kFloat32);
  auto pipe = Pipe();
  ASSERT_TRUE(pipe.ok());
  absl::StatusOr<Process> child = Process::start([&]() -> absl::Status {
    EMBER_ASSIGN_OR_RETURN(Value a, pipe->second.recv(absl::Seconds(20)));
    EMBER_ASSIGN_OR_RETURN(Value b, pipe->second.recv(absl::Seconds(20)));
    EMBER_ASSIGN_OR_RETURN(Tensor ta, a.as<Tensor>());
    EMBER_ASSIGN_OR_RETURN(Tensor tb, b.list()[0].as<Tensor>());
    EMBER_ASSIGN_OR_RETURN(Tensor tc, b.list()[1].as<Tensor>());
    CHILD_CHECK(ta.storage().data() == tb.storage().data());
    CHILD_CHECK(tb.storage().is_alias_of(tc.storage()));  // one storage per message entry
    CHILD_CHECK(tc.storage_offset() == 128);
    return absl::OkStatus();
  });
  ASSERT_TRUE(child.ok());
  ASSERT_TRUE(pipe->first.send(Value(t)).ok());
  ASSERT_TRUE(pipe->first.send(Value(Value::List{t, t.narrow(0, 128, 128)})).ok());
  absl::StatusOr<ExitStatus> exit = child->join(absl::Seconds(20));
  ASSERT_TRUE(exit.ok());
  EXPECT_TRUE(exit->ok()) << exit->str() << ": " << child->error_message();
}

// Regions are reused once released (Note [Segment reuse]); every message must
// still carry its own values, including while the receiver holds earlier ones.
TEST_P(SharingTest, ReusedRegionsCarryFreshValues) {
  auto pipe = Pipe();
  ASSERT_TRUE(pipe.ok());
  constexpr int kMessages = 60;
  absl::StatusOr<Process> child = Process::start([&]() -> absl::Status {
    std::vector<Tensor> held;  // every third one is kept alive
    for (int i = 0; i < kMessages; ++i) {
      EMBER_ASSIGN_OR_RETURN(Value v, pipe->second.recv(absl::Seconds(20)));
      EMBER_ASSIGN_OR_RETURN(Tensor t, v.as<Tensor>());
      CHILD_CHECK(Values(t) == std::vector<double>(1024, i));
      if (i % 3 == 0) held.push_back(t);
      EMBER_RETURN_IF_ERROR(pipe->second.send(Value(i)));
    }
    for (size_t k = 0; k < held.size(); ++k) {
      CHILD_CHECK(Values(held[k]) == std::vector<double>(1024, 3 * k));
    }
    return absl::OkStatus();
  });
  ASSERT_TRUE(child.ok());
  for (int i = 0; i < kMessages; ++i) {
    ASSERT_TRUE(pipe->first.send(Value(full({1024}, i, kFloat32))).ok());
    ASSERT_TRUE(pipe->first.recv(absl::Seconds(20)).ok()) << child->error_message();
  }
  absl::StatusOr<ExitStatus> exit = child->join(absl::Seconds(20));
  ASSERT_TRUE(exit.ok());
  EXPECT_TRUE(exit->ok()) << exit->str() << ": " << child->error_message();
}

int MemfdMappings() {
  std::ifstream maps("/proc/self/maps");
  int n = 0;
  for (std::string line; std::getline(maps, line);) {
    n += line.find("memfd:ember_shm") != std::string::npos;
  }
  return n;
}

// A receiver keeps mappings of released regions only while their sender may
// send them again (Note [Segment reuse]): once the sender has freed them,
// their memory is let go.
TEST(SharingCacheTest, ReceiversDropMappingsOfRegionsNobodyHolds) {
  ASSERT_TRUE(set_sharing_strategy("file_descriptor").ok());
  auto pipe = Pipe();
  ASSERT_TRUE(pipe.ok());
  absl::StatusOr<Process> child = Process::start([&]() -> absl::Status {
    for (int i = 0; i < 10; ++i) {  // ten regions, held at once, then dropped
      EMBER_ASSIGN_OR_RETURN(Value v, pipe->second.recv(absl::Seconds(20)));
    }
    CHILD_CHECK(MemfdMappings() >= 10);  // kept for reuse: the sender caches them
    EMBER_RETURN_IF_ERROR(pipe->second.send(Value("dropped")));
    { EMBER_ASSIGN_OR_RETURN(Value last, pipe->second.recv(absl::Seconds(20))); }
    CHILD_CHECK(MemfdMappings() <= 1);
    return absl::OkStatus();
  });
  ASSERT_TRUE(child.ok());
  Value::List held;
  for (int i = 0; i < 10; ++i) {
    held.push_back(full({1000 + i}, i, kFloat32));  // distinct sizes: no reuse
    ASSERT_TRUE(pipe->first.send(held.back()).ok());
  }
  ASSERT_TRUE(pipe->first.recv(absl::Seconds(20)).ok()) << child->error_message();
  held.clear();
  empty_shared_memory_cache();  // the sender frees all ten
  ASSERT_TRUE(pipe->first.send(Value(ones({3}))).ok());
  absl::StatusOr<ExitStatus> exit = child->join(absl::Seconds(20));
  ASSERT_TRUE(exit.ok());
  EXPECT_TRUE(exit->ok()) << exit->str() << ": " << child->error_message();
}

// A region that comes back to its creator gets another storage over the
// same bytes (Note [Dedup]); when all of them die it enters the reuse cache
// once, and the next tensor of its size reuses it.
TEST_P(SharingTest, ARegionReceivedBackIsReusedOnceAllItsStoragesDie) {
  empty_shared_memory_cache();
  auto pipe = Pipe();
  ASSERT_TRUE(pipe.ok());
  const void* first = nullptr;
  {
    Tensor t = zeros({1000});
    ASSERT_TRUE(share_memory_(t).ok());
    first = t.storage().data();
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(pipe->first.send(Value(t)).ok());
      absl::StatusOr<Value> back = pipe->second.recv(absl::Seconds(20));
      ASSERT_TRUE(back.ok()) << back.status();
      EXPECT_EQ(back->get_if<Tensor>()->storage().data(), first);
    }
  }
  Tensor u = zeros({1000});
  ASSERT_TRUE(share_memory_(u).ok());
  EXPECT_EQ(u.storage().data(), first);
}

INSTANTIATE_TEST_SUITE_P(BothStrategies, SharingTest,
                         ::testing::Values("file_descriptor", "file_system"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace ember::multiprocessing
