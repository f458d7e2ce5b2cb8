// Ember's samplers, random_split and DataLoader order against PyTorch 2.x's
// for the same seeds: DistributedSampler over (size, replicas, rank, seed,
// epoch, drop_last, shuffle) for every rank, RandomSampler with and without
// replacement over two epochs on one generator, SubsetRandomSampler,
// WeightedRandomSampler, random_split by lengths and fractions, and a
// shuffled DataLoader's batches with a generator and with the default one.
// torch's side is testdata/torch_samplers.py, run on the peer
// tools/install_peers.sh installs; without it the test skips, saying so.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/testing/peers.h"
#include "data/dataloader.h"
#include "data/dataset.h"
#include "data/distributed_sampler.h"
#include "data/sampler.h"
#include "gtest/gtest.h"

namespace ember::data {
namespace {

struct Case {
  std::vector<std::string> words;  // the case: its kind, then its parameters
  std::string values;              // what torch gave, as printed
};

class SamplerTorchTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    out_ = new absl::StatusOr<std::string>(
        ::ember::testing::run_torch2("data/testdata/torch_samplers.py"));
  }
  void SetUp() override {
    if (absl::IsNotFound(out_->status())) GTEST_SKIP() << out_->status().message();
    ASSERT_TRUE(out_->ok()) << out_->status();
    for (absl::string_view line : absl::StrSplit(**out_, '\n', absl::SkipEmpty())) {
      std::pair<std::string, std::string> halves = absl::StrSplit(line, absl::MaxSplits(':', 1));
      cases_.push_back({absl::StrSplit(halves.first, ' ', absl::SkipEmpty()),
                        std::string(absl::StripAsciiWhitespace(halves.second))});
    }
  }
  std::vector<const Case*> Of(const std::string& kind) const {
    std::vector<const Case*> out;
    for (const Case& c : cases_) {
      if (c.words[0] == kind) out.push_back(&c);
    }
    return out;
  }
  static absl::StatusOr<std::string>* out_;
  std::vector<Case> cases_;
};

absl::StatusOr<std::string>* SamplerTorchTest::out_ = nullptr;

int64_t Int(const std::string& word) {
  int64_t v = 0;
  EXPECT_TRUE(absl::SimpleAtoi(word, &v)) << word;
  return v;
}

double Double(const std::string& word) {
  double v = 0;
  EXPECT_TRUE(absl::SimpleAtod(word, &v)) << word;
  return v;
}

std::string Joined(const std::vector<int64_t>& v) { return absl::StrJoin(v, " "); }

// Sample i is the integer i (torch's list(range(n))).
class Range : public Dataset {
 public:
  explicit Range(int64_t n) : n_(n) {}
  int64_t size() const override { return n_; }
  absl::StatusOr<Sample> get(int64_t index) override { return Sample(index); }

 private:
  int64_t n_;
};

// A loader's epoch as torch_samplers.py prints it: "a b c | d e".
std::string Epoch(DataLoader& loader) {
  absl::StatusOr<DataLoaderIterator> it = loader.iter();
  EXPECT_TRUE(it.ok()) << it.status();
  std::vector<std::string> batches;
  while (true) {
    absl::StatusOr<std::optional<Sample>> b = it->next();
    EXPECT_TRUE(b.ok()) << b.status();
    if (!b.ok() || !b->has_value()) break;
    const Tensor t = *(*b)->get_if<Tensor>();
    batches.push_back(
        Joined(std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel())));
  }
  return absl::StrJoin(batches, " | ");
}

TEST_F(SamplerTorchTest, DistributedSamplerGivesEveryRankTorchsIndices) {
  const std::vector<const Case*> cases = Of("distributed");
  ASSERT_EQ(cases.size(), 6u * (1 + 2 + 3 + 4 + 8) * 2 * 3 * 2 * 2);
  for (const Case* c : cases) {
    const auto& w = c->words;
    DistributedSampler s(Int(w[1]), {.num_replicas = static_cast<int>(Int(w[2])),
                                     .rank = static_cast<int>(Int(w[3])),
                                     .shuffle = w[7] == "1",
                                     .seed = static_cast<uint64_t>(Int(w[4])),
                                     .drop_last = w[6] == "1"});
    s.set_epoch(Int(w[5]));
    const std::vector<int64_t> mine = s.indices();
    EXPECT_EQ(Joined(mine), c->values) << absl::StrJoin(w, " ");
    EXPECT_EQ(static_cast<int64_t>(mine.size()), s.size()) << absl::StrJoin(w, " ");
  }
}

TEST_F(SamplerTorchTest, RandomSamplerFollowsTorchAcrossEpochsOnOneGenerator) {
  const std::vector<const Case*> cases = Of("random");
  ASSERT_EQ(cases.size(), 14u);
  for (size_t k = 0; k < cases.size(); k += 2) {
    const auto& w = cases[k]->words;
    Generator g(static_cast<uint64_t>(Int(w[4])));
    RandomSamplerOptions options{.replacement = w[2] == "1", .generator = &g};
    if (Int(w[3]) != 0) options.num_samples = Int(w[3]);
    RandomSampler s(Int(w[1]), options);
    EXPECT_EQ(Joined(s.indices()), cases[k]->values) << absl::StrJoin(w, " ");
    EXPECT_EQ(Joined(s.indices()), cases[k + 1]->values) << absl::StrJoin(cases[k + 1]->words, " ");
  }
}

TEST_F(SamplerTorchTest, SubsetAndWeightedSamplersAreTorchs) {
  for (const Case* c : Of("subset")) {
    Generator g(static_cast<uint64_t>(Int(c->words[1])));
    SubsetRandomSampler s({3, 1, 4, 1, 5, 9, 2, 6}, &g);
    EXPECT_EQ(Joined(s.indices()), c->values) << absl::StrJoin(c->words, " ");
  }
  const std::vector<const Case*> weighted = Of("weighted");
  ASSERT_EQ(weighted.size(), 2u);
  for (const Case* c : weighted) {
    Generator g(static_cast<uint64_t>(Int(c->words[1])));
    std::vector<double> weights;
    for (size_t i = 3; i < c->words.size(); ++i) weights.push_back(Double(c->words[i]));
    WeightedRandomSampler s(weights, Int(c->words[2]), /*replacement=*/true, &g);
    EXPECT_EQ(Joined(s.indices()), c->values) << absl::StrJoin(c->words, " ");
  }
}

TEST_F(SamplerTorchTest, RandomSplitIsTorchsByLengthsAndFractions) {
  const std::vector<const Case*> cases = Of("split");
  ASSERT_EQ(cases.size(), 3u);
  for (const Case* c : cases) {
    Generator g(static_cast<uint64_t>(Int(c->words[1])));
    std::vector<double> lengths;
    for (size_t i = 2; i < c->words.size(); ++i) lengths.push_back(Double(c->words[i]));
    absl::StatusOr<std::vector<std::shared_ptr<Subset>>> parts =
        random_split(std::make_shared<Range>(10), lengths, g);
    ASSERT_TRUE(parts.ok()) << parts.status();
    std::vector<std::string> printed;
    for (const auto& p : *parts) printed.push_back(Joined(p->indices()));
    EXPECT_EQ(absl::StrJoin(printed, " | "), c->values) << absl::StrJoin(c->words, " ");
  }
}

TEST_F(SamplerTorchTest, AShuffledLoaderYieldsTorchsBatches) {
  const std::vector<const Case*> cases = Of("loader");
  ASSERT_EQ(cases.size(), 6u);
  for (size_t k = 0; k < cases.size(); k += 2) {
    const auto& w = cases[k]->words;
    Generator g(static_cast<uint64_t>(Int(w[4])));
    absl::StatusOr<DataLoader> loader = DataLoader::create(
        std::make_shared<Range>(Int(w[1])),
        {.batch_size = Int(w[2]), .shuffle = true, .drop_last = w[3] == "1", .generator = &g});
    ASSERT_TRUE(loader.ok()) << loader.status();
    EXPECT_EQ(Epoch(*loader), cases[k]->values) << absl::StrJoin(w, " ");
    EXPECT_EQ(Epoch(*loader), cases[k + 1]->values) << absl::StrJoin(cases[k + 1]->words, " ");
  }
}

TEST_F(SamplerTorchTest, WithoutAGeneratorTheLoaderDrawsAsTorchDoesFromTheDefaultOne) {
  const std::vector<const Case*> cases = Of("default_loader");
  ASSERT_EQ(cases.size(), 2u);
  manual_seed(static_cast<uint64_t>(Int(cases[0]->words[3])));
  absl::StatusOr<DataLoader> loader =
      DataLoader::create(std::make_shared<Range>(12), {.batch_size = 5, .shuffle = true});
  ASSERT_TRUE(loader.ok()) << loader.status();
  EXPECT_EQ(Epoch(*loader), cases[0]->values);
  EXPECT_EQ(Epoch(*loader), cases[1]->values);
}

}  // namespace
}  // namespace ember::data
