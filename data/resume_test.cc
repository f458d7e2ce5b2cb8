// Resuming a DataLoader mid-epoch (Note [Resuming a loader]): through a
// file, in a new loader, the rest of the epoch is the uninterrupted run's,
// workers' random draws included; with a DistributedSampler at another
// world size, no sample of the epoch is lost and none is seen twice but the
// padding torch's sampler adds.
#include <unistd.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "data/dataloader.h"
#include "data/dataset.h"
#include "data/distributed_sampler.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "serialization/serialization.h"
#include "tensor/factories.h"

namespace ember::data {
namespace {

using ::testing::HasSubstr;

// Sample i: [i, a number drawn from Ember's default generator where get()
// runs] (a worker's augmentation, say).
class Noisy : public Dataset {
 public:
  explicit Noisy(int64_t n) : n_(n) {}
  int64_t size() const override { return n_; }
  absl::StatusOr<Sample> get(int64_t index) override {
    return Sample(Sample::List{Sample(index), Sample(rand({1}, kFloat64).item<double>())});
  }

 private:
  int64_t n_;
};

// Each batch as text: its indices and draws.
std::string Text(const Sample& batch) {
  std::string out;
  for (size_t part = 0; part < batch.list().size(); ++part) {
    const Tensor t = *batch.list()[part].get_if<Tensor>();
    for (int64_t i = 0; i < t.numel(); ++i)
      out += std::to_string(t.to(kFloat64).data_ptr<double>()[i]) + " ";
    out += "| ";
  }
  return out;
}

std::vector<std::string> Take(DataLoaderIterator& it, int n) {
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) {
    absl::StatusOr<std::optional<Sample>> b = it.next();
    EXPECT_TRUE(b.ok()) << b.status();
    if (!b.ok() || !b->has_value()) break;
    out.push_back(Text(**b));
  }
  return out;
}

std::string Path(const std::string& name) {
  return std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
}

TEST(ResumeTest, TheRestOfTheEpochAndTheNextAreTheUninterruptedRunsThroughAFile) {
  for (int workers : {0, 2, 3}) {
    SCOPED_TRACE(workers);
    // Without workers the draws would come from the loop's own default
    // generator, which the training loop shares; only workers' are the
    // loader's to restore.
    std::shared_ptr<Dataset> ds =
        workers > 0 ? std::shared_ptr<Dataset>(std::make_shared<Noisy>(50))
                    : std::make_shared<TensorDataset>(std::vector<Tensor>{arange(50)});
    auto options = [&](Generator* g) {
      return DataLoaderOptions{
          .batch_size = 4, .shuffle = true, .num_workers = workers, .generator = g};
    };
    Generator g1(11);
    absl::StatusOr<DataLoader> whole = DataLoader::create(ds, options(&g1));
    ASSERT_TRUE(whole.ok());
    absl::StatusOr<DataLoaderIterator> e1 = whole->iter();
    const std::vector<std::string> first = Take(*e1, 100);
    ASSERT_EQ(first.size(), 13u);
    absl::StatusOr<DataLoaderIterator> e2 = whole->iter();
    const std::vector<std::string> second = Take(*e2, 100);

    Generator g2(11);
    absl::StatusOr<DataLoader> broken = DataLoader::create(ds, options(&g2));
    absl::StatusOr<DataLoaderIterator> part = broken->iter();
    const std::vector<std::string> before = Take(*part, 5);
    ASSERT_TRUE(ember::save(broken->state_dict(), Path("loader.pt")).ok());

    Generator g3(12345);  // another seed: the state sets it back
    absl::StatusOr<DataLoader> resumed = DataLoader::create(ds, options(&g3));
    absl::StatusOr<StateDict> state = ember::load(Path("loader.pt"));
    ASSERT_TRUE(state.ok()) << state.status();
    ASSERT_TRUE(resumed->load_state_dict(*state).ok());
    absl::StatusOr<DataLoaderIterator> rest = resumed->iter();
    std::vector<std::string> after = Take(*rest, 100);
    std::vector<std::string> joined = before;
    joined.insert(joined.end(), after.begin(), after.end());
    EXPECT_EQ(joined, first);
    absl::StatusOr<DataLoaderIterator> next = resumed->iter();
    EXPECT_EQ(Take(*next, 100), second);
  }
}

TEST(ResumeTest, ASecondSaveInAResumedEpochResumesToo) {
  auto ds = std::make_shared<Noisy>(30);
  auto make = [&](Generator* g) {
    return DataLoader::create(ds,
                              {.batch_size = 2, .shuffle = true, .num_workers = 2, .generator = g});
  };
  Generator g1(3);
  absl::StatusOr<DataLoader> whole = make(&g1);
  absl::StatusOr<DataLoaderIterator> e = whole->iter();
  const std::vector<std::string> all = Take(*e, 100);
  Generator g2(3);
  absl::StatusOr<DataLoader> a = make(&g2);
  absl::StatusOr<DataLoaderIterator> ia = a->iter();
  std::vector<std::string> got = Take(*ia, 4);
  Generator g3(0);
  absl::StatusOr<DataLoader> b = make(&g3);
  ASSERT_TRUE(b->load_state_dict(a->state_dict()).ok());
  absl::StatusOr<DataLoaderIterator> ib = b->iter();
  for (const std::string& s : Take(*ib, 5)) got.push_back(s);
  Generator g4(0);
  absl::StatusOr<DataLoader> c = make(&g4);
  ASSERT_TRUE(c->load_state_dict(b->state_dict()).ok());
  absl::StatusOr<DataLoaderIterator> ic = c->iter();
  for (const std::string& s : Take(*ic, 100)) got.push_back(s);
  EXPECT_EQ(got, all);
}

// The indices each rank's loader yields, in batches of 3, from a
// DistributedSampler at `world` ranks over 100 samples (seed 5, epoch 2).
struct Rank {
  std::unique_ptr<DataLoader> loader;
  std::shared_ptr<DistributedSampler> sampler;
  std::optional<DataLoaderIterator> it;
};

Rank MakeRank(int world, int rank) {
  Rank r;
  r.sampler = std::make_shared<DistributedSampler>(
      100, DistributedSamplerOptions{.num_replicas = world, .rank = rank, .seed = 5});
  r.sampler->set_epoch(2);
  auto ds = std::make_shared<TensorDataset>(std::vector<Tensor>{arange(100)});
  absl::StatusOr<DataLoader> l =
      DataLoader::create(ds, {.batch_size = 3, .sampler = r.sampler, .num_workers = 1});
  EXPECT_TRUE(l.ok()) << l.status();
  r.loader = std::make_unique<DataLoader>(*std::move(l));
  return r;
}

std::vector<int64_t> Indices(Rank& r, int batches) {
  if (!r.it) {
    absl::StatusOr<DataLoaderIterator> it = r.loader->iter();
    EXPECT_TRUE(it.ok()) << it.status();
    r.it.emplace(*std::move(it));
  }
  std::vector<int64_t> out;
  for (int b = 0; b < batches; ++b) {
    absl::StatusOr<std::optional<Sample>> batch = r.it->next();
    EXPECT_TRUE(batch.ok()) << batch.status();
    if (!batch.ok() || !batch->has_value()) break;
    const Tensor t = *(*batch)->list()[0].get_if<Tensor>();
    out.insert(out.end(), t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
  }
  return out;
}

TEST(ResumeTest, ADistributedEpochSavedAtFourRanksResumesAtThreeTwoAndFour) {
  // Four ranks take 4 batches each (48 of the 100 samples), in lockstep.
  std::vector<Rank> four;
  std::multiset<int64_t> taken;
  for (int r = 0; r < 4; ++r) {
    four.push_back(MakeRank(4, r));
    for (int64_t i : Indices(four.back(), 4)) taken.insert(i);
  }
  ASSERT_EQ(taken.size(), 48u);
  ASSERT_EQ(std::set<int64_t>(taken.begin(), taken.end()).size(), 48u);
  const StateDict state = four[0].loader->state_dict();

  for (int world : {3, 2}) {
    SCOPED_TRACE(world);
    std::multiset<int64_t> rest;
    for (int r = 0; r < world; ++r) {
      Rank fresh = MakeRank(world, r);
      ASSERT_TRUE(fresh.loader->load_state_dict(state).ok());
      fresh.sampler->set_epoch(2);  // as a training loop does; the start stays
      for (int64_t i : Indices(fresh, 100)) rest.insert(i);
    }
    // 52 samples left: at 3 ranks 18 each (2 of padding, from the order's
    // start, which was taken), at 2 ranks 26 each.
    const size_t padding = world == 3 ? 2 : 0;
    EXPECT_EQ(rest.size(), 52u + padding);
    size_t seen_again = 0;
    for (int64_t i = 0; i < 100; ++i) {
      if (taken.count(i)) {
        seen_again += rest.count(i);
      } else {
        EXPECT_EQ(rest.count(i), 1u) << "sample " << i;
      }
    }
    EXPECT_EQ(seen_again, padding);
  }

  // At the same world size, each rank yields what it would have.
  for (int r = 0; r < 4; ++r) {
    Rank whole = MakeRank(4, r);
    const std::vector<int64_t> all = Indices(whole, 100);
    Rank fresh = MakeRank(4, r);
    ASSERT_TRUE(fresh.loader->load_state_dict(state).ok());
    EXPECT_EQ(Indices(fresh, 100), std::vector<int64_t>(all.begin() + 12, all.end())) << r;
  }
}

TEST(ResumeTest, ABadStateIsRefusedNamingWhatIsWrong) {
  auto ds = std::make_shared<TensorDataset>(std::vector<Tensor>{arange(10)});
  absl::StatusOr<DataLoader> l = DataLoader::create(ds, {.batch_size = 2});
  absl::Status s = l->load_state_dict({});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("no 'generator_state'"));
  StateDict state = l->state_dict();
  for (auto& [key, t] : state) {
    if (key == "batches_taken") t = full({}, 9, kInt64);
  }
  s = l->load_state_dict(state);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("9 batches of the epoch were taken, but an epoch of this loader has 5"));

  auto sampler = std::make_shared<DistributedSampler>(
      10, DistributedSamplerOptions{.num_replicas = 2, .rank = 0, .seed = 1});
  absl::StatusOr<DataLoader> d = DataLoader::create(ds, {.batch_size = 2, .sampler = sampler});
  absl::StatusOr<DataLoaderIterator> it = d->iter();
  ASSERT_TRUE(it->next().ok());
  const StateDict saved = d->state_dict();
  auto other = std::make_shared<DistributedSampler>(
      10, DistributedSamplerOptions{.num_replicas = 2, .rank = 0, .seed = 2});
  absl::StatusOr<DataLoader> e = DataLoader::create(ds, {.batch_size = 2, .sampler = other});
  s = e->load_state_dict(saved);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("saved with seed 1 and this sampler has seed 2"));
}

}  // namespace
}  // namespace ember::data
