// DataLoader with and without worker processes: the same batches either
// way, shared memory, seeds, iterable datasets split by worker, persistent
// workers, and every failure as a Status naming what went wrong, without a
// hang or an orphan.
#include "data/dataloader.h"

#include <signal.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "data/dataset.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "multiprocessing/process.h"
#include "multiprocessing/sharing.h"
#include "tensor/error.h"
#include "tensor/factories.h"

namespace ember::data {
namespace {

namespace mp = ::ember::multiprocessing;
using ::testing::HasSubstr;

// Every batch of one epoch; fails the test on an error.
std::vector<Sample> Drain(DataLoader& loader) {
  absl::StatusOr<DataLoaderIterator> it = loader.iter();
  EXPECT_TRUE(it.ok()) << it.status();
  std::vector<Sample> out;
  if (!it.ok()) return out;
  while (true) {
    absl::StatusOr<std::optional<Sample>> b = it->next();
    EXPECT_TRUE(b.ok()) << b.status();
    if (!b.ok() || !b->has_value()) break;
    out.push_back(**b);
  }
  return out;
}

Tensor Part(const Sample& batch, size_t i) { return *batch.list().at(i).get_if<Tensor>(); }

std::shared_ptr<TensorDataset> Numbers(int64_t n) {
  return std::make_shared<TensorDataset>(
      std::vector<Tensor>{arange(n * 3, kFloat32).reshape({n, 3}), arange(n)});
}

// Does something (below) for one index, in whichever process runs get().
class Tripwire : public Dataset {
 public:
  enum class Act { kFail, kThrow, kKill, kSleep, kNothing };
  Tripwire(int64_t n, int64_t at, Act act) : n_(n), at_(at), act_(act) {}
  int64_t size() const override { return n_; }
  absl::StatusOr<Sample> get(int64_t index) override {
    if (index == at_) {
      switch (act_) {
        case Act::kFail:
          return absl::InvalidArgumentError("bad sample");
        case Act::kThrow:
          EMBER_CHECK(false, "a thrown error");
        case Act::kKill:
          ::kill(::getpid(), SIGKILL);
          break;
        case Act::kSleep:
          absl::SleepFor(absl::Seconds(3));
          break;
        case Act::kNothing:
          break;
      }
    }
    return Sample(index);
  }

 private:
  int64_t n_, at_;
  Act act_;
};

// Sample i: [i, the pid of the process that got it, its worker id or -1,
// a number drawn from Ember's default generator there].
class WhoGotIt : public Dataset {
 public:
  explicit WhoGotIt(int64_t n) : n_(n) {}
  int64_t size() const override { return n_; }
  absl::StatusOr<Sample> get(int64_t index) override {
    const WorkerInfo* w = get_worker_info();
    return Sample(Sample::List{Sample(index), Sample(static_cast<int64_t>(::getpid())),
                               Sample(w != nullptr ? w->id : -1),
                               Sample(rand({1}, kFloat64).item<double>())});
  }

 private:
  int64_t n_;
};

TEST(DataLoaderTest, WorkersGiveTheLoopsBatchesInItsOrder) {
  auto ds = Numbers(103);
  std::vector<std::vector<Sample>> runs;
  for (int workers : {0, 1, 3, 16, 64}) {
    Generator g(5);
    absl::StatusOr<DataLoader> loader = DataLoader::create(
        ds, {.batch_size = 8, .shuffle = true, .num_workers = workers, .generator = &g});
    ASSERT_TRUE(loader.ok()) << loader.status();
    EXPECT_EQ(loader->size(), 13);
    runs.push_back(Drain(*loader));
  }
  ASSERT_EQ(runs[0].size(), 13u);
  for (size_t r = 1; r < runs.size(); ++r) {
    ASSERT_EQ(runs[r].size(), runs[0].size()) << "run " << r;
    for (size_t b = 0; b < runs[0].size(); ++b) {
      EXPECT_TRUE(Part(runs[r][b], 0).equal(Part(runs[0][b], 0))) << "run " << r << " batch " << b;
      EXPECT_TRUE(Part(runs[r][b], 1).equal(Part(runs[0][b], 1))) << "run " << r << " batch " << b;
    }
  }
  // Only with workers did the batches cross through shared memory.
  EXPECT_FALSE(mp::is_shared(Part(runs[0][0], 0)));
  EXPECT_TRUE(mp::is_shared(Part(runs[2][0], 0)));
}

TEST(DataLoaderTest, OutOfOrderDeliveryGivesEveryBatchOnce) {
  absl::StatusOr<DataLoader> loader =
      DataLoader::create(Numbers(64), {.batch_size = 4, .num_workers = 3, .in_order = false});
  ASSERT_TRUE(loader.ok());
  std::vector<int64_t> seen;
  for (const Sample& b : Drain(*loader)) {
    const Tensor y = Part(b, 1);
    for (int64_t i = 0; i < y.numel(); ++i) seen.push_back(y.data_ptr<int64_t>()[i]);
  }
  std::sort(seen.begin(), seen.end());
  ASSERT_EQ(seen.size(), 64u);
  for (int64_t i = 0; i < 64; ++i) EXPECT_EQ(seen[i], i);
}

TEST(DataLoaderTest, EachWorkerIsSeededWithBaseSeedPlusItsId) {
  absl::StatusOr<DataLoader> loader = DataLoader::create(
      std::make_shared<WhoGotIt>(8), {.batch_size = std::nullopt, .num_workers = 2});
  ASSERT_TRUE(loader.ok());
  std::vector<Sample> samples = Drain(*loader);
  ASSERT_EQ(samples.size(), 8u);
  // Round robin: sample i came from worker i % 2; each worker's first draw
  // differs from the other's.
  std::set<double> first_draws;
  for (int64_t i = 0; i < 8; ++i) {
    EXPECT_EQ(*samples[i].list()[2].get_if<int64_t>(), i % 2) << i;
    EXPECT_NE(*samples[i].list()[1].get_if<int64_t>(), ::getpid()) << i;
    if (i < 2) first_draws.insert(*samples[i].list()[3].get_if<double>());
  }
  EXPECT_EQ(first_draws.size(), 2u);
}

TEST(DataLoaderTest, TheWorkerSeedIsTheOneItsGeneratorsDrawFrom) {
  // WorkerInfo.seed is base_seed + id, and a generator seeded with it draws
  // what the worker drew.
  class SeedAndDraw : public Dataset {
   public:
    int64_t size() const override { return 2; }
    absl::StatusOr<Sample> get(int64_t) override {
      const WorkerInfo* w = get_worker_info();
      if (w == nullptr) return absl::InternalError("not in a worker");
      return Sample(Sample::List{Sample(static_cast<int64_t>(w->seed)),
                                 Sample(rand({1}, kFloat64).item<double>()), Sample(w->id)});
    }
  };
  Generator loader_gen(77);
  absl::StatusOr<DataLoader> loader =
      DataLoader::create(std::make_shared<SeedAndDraw>(),
                         {.batch_size = std::nullopt, .num_workers = 2, .generator = &loader_gen});
  ASSERT_TRUE(loader.ok());
  std::vector<Sample> s = Drain(*loader);
  ASSERT_EQ(s.size(), 2u);
  Generator expect_base(77);
  const uint64_t base = internal::DrawSeed(expect_base);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(static_cast<uint64_t>(*s[i].list()[0].get_if<int64_t>()), base + i);
    Generator g(base + i);
    EXPECT_EQ(*s[i].list()[1].get_if<double>(), rand({1}, kFloat64, &g).item<double>());
  }
}

TEST(DataLoaderTest, AFailedGetNamesWorkerAndIndexAndTheEpochGoesOn) {
  for (int workers : {0, 2}) {
    absl::StatusOr<DataLoader> loader =
        DataLoader::create(std::make_shared<Tripwire>(20, 13, Tripwire::Act::kFail),
                           {.batch_size = 4, .num_workers = workers});
    ASSERT_TRUE(loader.ok());
    absl::StatusOr<DataLoaderIterator> it = loader->iter();
    ASSERT_TRUE(it.ok());
    for (int b = 0; b < 3; ++b) ASSERT_TRUE(it->next().ok()) << b;
    absl::StatusOr<std::optional<Sample>> bad = it->next();  // samples 12..15
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
    EXPECT_THAT(std::string(bad.status().message()), HasSubstr("sample 13: bad sample"));
    if (workers > 0) {
      EXPECT_THAT(std::string(bad.status().message()), HasSubstr("DataLoader worker 1, "));
    }
    absl::StatusOr<std::optional<Sample>> after = it->next();
    ASSERT_TRUE(after.ok()) << after.status();
    ASSERT_TRUE(after->has_value());
    EXPECT_EQ((*after)->get_if<Tensor>()->data_ptr<int64_t>()[0], 16);
    EXPECT_FALSE(it->next()->has_value());
  }
}

TEST(DataLoaderTest, AThrownErrorIsReportedAsAStatus) {
  for (int workers : {0, 1}) {
    absl::StatusOr<DataLoader> loader =
        DataLoader::create(std::make_shared<Tripwire>(4, 2, Tripwire::Act::kThrow),
                           {.batch_size = 2, .num_workers = workers});
    ASSERT_TRUE(loader.ok());
    absl::StatusOr<DataLoaderIterator> it = loader->iter();
    ASSERT_TRUE(it->next().ok());
    absl::StatusOr<std::optional<Sample>> bad = it->next();
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInternal);
    EXPECT_THAT(std::string(bad.status().message()), HasSubstr("sample 2: threw: a thrown error"));
  }
}

bool Gone(pid_t pid) {
  if (::kill(pid, 0) != 0) return true;
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string pid_word, comm, state;
  stat >> pid_word >> comm >> state;
  return state == "Z";
}

TEST(DataLoaderTest, AKilledWorkerIsNamedWithItsPidAndSignalAndTheOthersStop) {
  absl::StatusOr<DataLoader> loader = DataLoader::create(
      std::make_shared<Tripwire>(40, 9, Tripwire::Act::kKill), {.batch_size = 2, .num_workers = 3});
  ASSERT_TRUE(loader.ok());
  absl::StatusOr<DataLoaderIterator> it = loader->iter();
  ASSERT_TRUE(it.ok());
  absl::Status failure;
  for (int b = 0; b < 20 && failure.ok(); ++b) failure = it->next().status();
  EXPECT_EQ(failure.code(), absl::StatusCode::kAborted) << failure;
  // Sample 9 is in batch 4, worker 4 % 3 = 1's.
  EXPECT_THAT(std::string(failure.message()), HasSubstr("DataLoader worker 1 (pid "));
  EXPECT_THAT(std::string(failure.message()),
              HasSubstr("exited unexpectedly with signal SIGKILL; the other workers were stopped"));
  // Every later call says the same, at once.
  EXPECT_EQ(it->next().status(), failure);
  // A new epoch starts new workers and fails again at sample 9, no hang.
  absl::StatusOr<DataLoaderIterator> again = loader->iter();
  ASSERT_TRUE(again.ok());
  absl::Status second;
  for (int b = 0; b < 20 && second.ok(); ++b) second = again->next().status();
  EXPECT_EQ(second.code(), absl::StatusCode::kAborted);
}

TEST(DataLoaderTest, TimeoutNamesTheBatchAndTheWorker) {
  absl::StatusOr<DataLoader> loader =
      DataLoader::create(std::make_shared<Tripwire>(4, 0, Tripwire::Act::kSleep),
                         {.batch_size = 2, .num_workers = 1, .timeout = absl::Milliseconds(300)});
  ASSERT_TRUE(loader.ok());
  absl::StatusOr<DataLoaderIterator> it = loader->iter();
  absl::StatusOr<std::optional<Sample>> b = it->next();
  EXPECT_EQ(b.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(b.status().message()),
              HasSubstr("DataLoader timed out after 300ms waiting for batch 0 from worker 0"));
}

TEST(DataLoaderTest, AFailingWorkerInitFnStopsTheWorkers) {
  absl::StatusOr<DataLoader> loader = DataLoader::create(
      Numbers(10), {.batch_size = 2, .num_workers = 2, .worker_init_fn = [](int id) {
                      return id == 1 ? absl::FailedPreconditionError("no GPU here")
                                     : absl::OkStatus();
                    }});
  ASSERT_TRUE(loader.ok());
  absl::StatusOr<DataLoaderIterator> it = loader->iter();
  absl::Status failure;
  for (int b = 0; b < 10 && failure.ok(); ++b) failure = it->next().status();
  EXPECT_EQ(failure.code(), absl::StatusCode::kAborted) << failure;
  EXPECT_THAT(std::string(failure.message()),
              HasSubstr("DataLoader worker 1: worker_init_fn failed: no GPU here"));
}

// 0..n-1, each worker taking every num_workers-th when `split`.
class Stream : public IterableDataset {
 public:
  Stream(int64_t n, bool split) : n_(n), split_(split) {}
  SampleStream iter() override {
    const WorkerInfo* w = get_worker_info();
    const int64_t step = split_ && w != nullptr ? w->num_workers : 1;
    auto next = std::make_shared<int64_t>(split_ && w != nullptr ? w->id : 0);
    const int64_t n = n_;
    return [next, step, n]() -> absl::StatusOr<std::optional<Sample>> {
      if (*next >= n) return std::optional<Sample>();
      const int64_t v = *next;
      *next += step;
      return std::optional<Sample>(Sample(v));
    };
  }
  std::optional<int64_t> size() const override { return n_; }

 private:
  int64_t n_;
  bool split_;
};

std::multiset<int64_t> Values(const std::vector<Sample>& batches) {
  std::multiset<int64_t> out;
  for (const Sample& b : batches) {
    const Tensor t = *b.get_if<Tensor>();
    for (int64_t i = 0; i < t.numel(); ++i) out.insert(t.data_ptr<int64_t>()[i]);
  }
  return out;
}

TEST(DataLoaderTest, AnIterableSplitByWorkerInfoIsYieldedOnce) {
  for (int workers : {0, 1, 3}) {
    absl::StatusOr<DataLoader> loader = DataLoader::create(
        std::make_shared<Stream>(100, true), {.batch_size = 7, .num_workers = workers});
    ASSERT_TRUE(loader.ok());
    EXPECT_EQ(loader->size(), 15);
    for (int epoch = 0; epoch < 2; ++epoch) {
      std::multiset<int64_t> seen = Values(Drain(*loader));
      ASSERT_EQ(seen.size(), 100u) << workers << " workers";
      for (int64_t i = 0; i < 100; ++i) EXPECT_EQ(seen.count(i), 1u) << i;
    }
  }
  // Unsplit, every worker yields the whole stream (as torch).
  absl::StatusOr<DataLoader> loader =
      DataLoader::create(std::make_shared<Stream>(10, false), {.batch_size = 4, .num_workers = 2});
  ASSERT_TRUE(loader.ok());
  std::multiset<int64_t> seen = Values(Drain(*loader));
  EXPECT_EQ(seen.size(), 20u);
  EXPECT_EQ(seen.count(3), 2u);
}

std::set<int64_t> Pids(const std::vector<Sample>& samples) {
  std::set<int64_t> out;
  for (const Sample& s : samples) {
    const Tensor pid = *s.list()[1].get_if<Tensor>();
    for (int64_t i = 0; i < pid.numel(); ++i) out.insert(pid.data_ptr<int64_t>()[i]);
  }
  return out;
}

TEST(DataLoaderTest, PersistentWorkersServeEveryEpochAndSurviveADroppedOne) {
  absl::StatusOr<DataLoader> persistent =
      DataLoader::create(std::make_shared<WhoGotIt>(12),
                         {.batch_size = 3, .num_workers = 2, .persistent_workers = true});
  ASSERT_TRUE(persistent.ok());
  const std::set<int64_t> first = Pids(Drain(*persistent));
  EXPECT_EQ(first.size(), 2u);
  {
    // An epoch dropped after one batch: its other results are still in
    // flight and must not reach the next epoch.
    absl::StatusOr<DataLoaderIterator> it = persistent->iter();
    ASSERT_TRUE(it->next().ok());
  }
  std::vector<Sample> next = Drain(*persistent);
  ASSERT_EQ(next.size(), 4u);
  for (int64_t b = 0; b < 4; ++b) {
    EXPECT_EQ(Part(next[b], 0).data_ptr<int64_t>()[0], 3 * b) << "batch " << b;
  }
  EXPECT_EQ(Pids(next), first);

  absl::StatusOr<DataLoader> fresh =
      DataLoader::create(std::make_shared<WhoGotIt>(12), {.batch_size = 3, .num_workers = 2});
  ASSERT_TRUE(fresh.ok());
  const std::set<int64_t> a = Pids(Drain(*fresh));
  const std::set<int64_t> b = Pids(Drain(*fresh));
  for (int64_t pid : a) EXPECT_EQ(b.count(pid), 0u) << "worker " << pid << " outlived its epoch";
  for (int64_t pid : a) EXPECT_TRUE(Gone(static_cast<pid_t>(pid))) << pid;
}

TEST(DataLoaderTest, WorkersDieWithTheProcessThatStartedThem) {
  Tensor pids = zeros({3}, kInt64);
  ASSERT_TRUE(mp::share_memory_(pids).ok());
  absl::StatusOr<mp::Process> trainer = mp::Process::start([pids]() -> absl::Status {
    absl::StatusOr<DataLoader> loader =
        DataLoader::create(std::make_shared<WhoGotIt>(30), {.batch_size = 1, .num_workers = 3});
    if (!loader.ok()) return loader.status();
    absl::StatusOr<DataLoaderIterator> it = loader->iter();
    if (!it.ok()) return it.status();
    for (int i = 0; i < 3; ++i) {
      absl::StatusOr<std::optional<Sample>> b = it->next();
      if (!b.ok()) return b.status();
      pids.data_ptr<int64_t>()[i] = Part(**b, 1).item<int64_t>();
    }
    absl::SleepFor(absl::Seconds(60));  // killed before this ends
    return absl::OkStatus();
  });
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (pids.data_ptr<int64_t>()[2] == 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_NE(pids.data_ptr<int64_t>()[2], 0) << "the trainer's loader never started";
  trainer->kill();
  ASSERT_TRUE(trainer->join(absl::Seconds(10)).ok());
  for (int i = 0; i < 3; ++i) {
    const pid_t pid = static_cast<pid_t>(pids.data_ptr<int64_t>()[i]);
    const absl::Time until = absl::Now() + absl::Seconds(10);
    while (!Gone(pid) && absl::Now() < until) absl::SleepFor(absl::Milliseconds(10));
    EXPECT_TRUE(Gone(pid)) << "worker " << pid << " outlived the trainer";
  }
}

int OpenDescriptors() {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd"))
    n += e.exists() ? 1 : 0;
  return n;
}

// The loop holds every batch, each a shared region with its descriptor, in
// a process whose descriptor limit is nearly reached: a clear error naming
// the limit, not "received 0 items of ancdata".
TEST(DataLoaderTest, ADescriptorLimitReachedIsNamed) {
  absl::StatusOr<mp::Process> child = mp::Process::start([]() -> absl::Status {
    absl::StatusOr<DataLoader> loader =
        DataLoader::create(Numbers(400), {.batch_size = 2, .num_workers = 2});
    if (!loader.ok()) return loader.status();
    absl::StatusOr<DataLoaderIterator> it = loader->iter();
    if (!it.ok()) return it.status();
    std::vector<Sample> held;
    absl::StatusOr<std::optional<Sample>> b = it->next();
    if (!b.ok()) return b.status();
    held.push_back(**b);
    const rlimit low{static_cast<rlim_t>(OpenDescriptors() + 8),
                     static_cast<rlim_t>(OpenDescriptors() + 8)};
    if (::setrlimit(RLIMIT_NOFILE, &low) != 0) return absl::InternalError("setrlimit");
    for (int i = 0; i < 200; ++i) {
      b = it->next();
      if (!b.ok()) {
        if (b.status().code() == absl::StatusCode::kResourceExhausted &&
            absl::StrContains(b.status().message(), "RLIMIT_NOFILE")) {
          return absl::OkStatus();
        }
        return b.status();
      }
      if (!b->has_value()) break;
      held.push_back(**b);
    }
    return absl::InternalError("the limit was never reached");
  });
  ASSERT_TRUE(child.ok()) << child.status();
  absl::StatusOr<mp::ExitStatus> end = child->join(absl::Seconds(60));
  ASSERT_TRUE(end.ok()) << end.status();
  EXPECT_TRUE(end->ok()) << end->str() << ": " << child->error_message();
}

// Shared memory that cannot hold a batch (here: a file size limit on the
// workers, which posix_fallocate meets as /dev/shm full would be met): an
// error naming the size, the free space and what to do, never a SIGBUS.
TEST(DataLoaderTest, SharedMemoryTooSmallForABatchIsExplained) {
  absl::StatusOr<mp::Process> child = mp::Process::start([]() -> absl::Status {
    ::signal(SIGXFSZ, SIG_IGN);
    const rlimit small{1 << 20, 1 << 20};
    if (::setrlimit(RLIMIT_FSIZE, &small) != 0) return absl::InternalError("setrlimit");
    auto big = std::make_shared<TensorDataset>(std::vector<Tensor>{zeros({8, 1 << 18})});
    absl::StatusOr<DataLoader> loader =
        DataLoader::create(big, {.batch_size = 4, .num_workers = 1});  // 4 MiB batches
    if (!loader.ok()) return loader.status();
    absl::StatusOr<DataLoaderIterator> it = loader->iter();
    if (!it.ok()) return it.status();
    absl::StatusOr<std::optional<Sample>> b = it->next();
    if (b.ok()) return absl::InternalError("a 4 MiB batch fit under a 1 MiB limit");
    const std::string m(b.status().message());
    if (b.status().code() != absl::StatusCode::kResourceExhausted ||
        !absl::StrContains(m, "4194304 bytes") || !absl::StrContains(m, "free in /dev/shm") ||
        !absl::StrContains(m, "--shm-size")) {
      return absl::InternalError("unexpected: " + b.status().ToString());
    }
    return absl::OkStatus();
  });
  ASSERT_TRUE(child.ok()) << child.status();
  absl::StatusOr<mp::ExitStatus> end = child->join(absl::Seconds(60));
  ASSERT_TRUE(end.ok()) << end.status();
  EXPECT_TRUE(end->ok()) << end->str() << ": " << child->error_message();
}

// The file_system strategy: batches cross as named /dev/shm regions, and a
// killed worker's regions are gone once everyone let go of them (the shm
// manager unlinks those of dead processes).
TEST(DataLoaderTest, TheFileSystemStrategyCarriesBatchesAndLeavesNothingBehind) {
  // Unique across runs: in a sandbox this process's pid repeats.
  const std::string prefix =
      absl::StrCat("/ember_dltest_", ::getpid(), "_", absl::ToUnixNanos(absl::Now()) % 1000000007);
  ASSERT_TRUE(mp::set_sharing_strategy("file_system").ok());
  ASSERT_TRUE(mp::set_shared_memory_prefix(prefix).ok());
  {
    absl::StatusOr<DataLoader> loader =
        DataLoader::create(Numbers(40), {.batch_size = 4, .num_workers = 2});
    ASSERT_TRUE(loader.ok());
    std::vector<Sample> batches = Drain(*loader);
    ASSERT_EQ(batches.size(), 10u);
    EXPECT_TRUE(mp::is_shared(Part(batches[3], 0)));
    EXPECT_TRUE(Part(batches[9], 1).equal(tensor(std::vector<int64_t>{36, 37, 38, 39})));

    absl::StatusOr<DataLoader> killed =
        DataLoader::create(std::make_shared<Tripwire>(40, 9, Tripwire::Act::kKill),
                           {.batch_size = 2, .num_workers = 2});
    ASSERT_TRUE(killed.ok());
    absl::StatusOr<DataLoaderIterator> it = killed->iter();
    absl::Status failure;
    for (int b = 0; b < 20 && failure.ok(); ++b) failure = it->next().status();
    EXPECT_EQ(failure.code(), absl::StatusCode::kAborted) << failure;
  }
  mp::empty_shared_memory_cache();
  ASSERT_TRUE(mp::set_sharing_strategy("file_descriptor").ok());
  const std::string stem = prefix.substr(1);
  auto left = [&] {
    int n = 0;
    for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
      n += e.path().filename().string().rfind(stem, 0) == 0;
    }
    return n;
  };
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (left() > 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(50));
  std::string names;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
    if (e.path().filename().string().rfind(stem, 0) == 0)
      names += e.path().filename().string() + " ";
  }
  EXPECT_EQ(left(), 0) << "regions named " << prefix << "* are left in /dev/shm: " << names
                       << " (this process is " << ::getpid() << ")";
}

TEST(DataLoaderTest, WithoutBatchingSamplesComeAsTheyAre) {
  absl::StatusOr<DataLoader> loader =
      DataLoader::create(Numbers(5), {.batch_size = std::nullopt, .num_workers = 2});
  ASSERT_TRUE(loader.ok());
  EXPECT_EQ(loader->size(), 5);
  std::vector<Sample> s = Drain(*loader);
  ASSERT_EQ(s.size(), 5u);
  EXPECT_EQ(Part(s[3], 0).dim(), 1);  // a row, not a batch of rows
  EXPECT_EQ(Part(s[3], 1).item<int64_t>(), 3);
}

TEST(DataLoaderTest, PinMemoryWithoutAGpuIsIgnoredAndBatchesStillCome) {
  absl::StatusOr<DataLoader> loader =
      DataLoader::create(Numbers(6), {.batch_size = 3, .pin_memory = true});
  ASSERT_TRUE(loader.ok());
  EXPECT_EQ(Drain(*loader).size(), 2u);
}

TEST(DataLoaderTest, RefusesWhatTorchRefuses) {
  auto ds = Numbers(4);
  auto message = [&](DataLoaderOptions o) {
    absl::StatusOr<DataLoader> l = DataLoader::create(ds, std::move(o));
    EXPECT_FALSE(l.ok());
    return std::string(l.status().message());
  };
  EXPECT_THAT(message({.num_workers = -1}), HasSubstr("num_workers option should be non-negative"));
  EXPECT_THAT(message({.shuffle = true, .sampler = std::make_shared<SequentialSampler>(4)}),
              HasSubstr("sampler option is mutually exclusive with shuffle"));
  EXPECT_THAT(message({.batch_size = 2,
                       .batch_sampler = std::make_shared<BatchSampler>(
                           std::make_shared<SequentialSampler>(4), 2, false)}),
              HasSubstr("batch_sampler option is mutually exclusive"));
  EXPECT_THAT(message({.prefetch_factor = 4}),
              HasSubstr("prefetch_factor option could only be specified in multiprocessing"));
  EXPECT_THAT(message({.persistent_workers = true}),
              HasSubstr("persistent_workers option needs num_workers > 0"));
  EXPECT_THAT(message({.batch_size = std::nullopt, .drop_last = true}),
              HasSubstr("mutually exclusive with drop_last"));
  EXPECT_THAT(message({.num_workers = 1,
                       .worker_init_fn = [](int) { return absl::OkStatus(); },
                       .multiprocessing_context = "spawn"}),
              HasSubstr("worker_init_fn (a C++ function) cannot be sent"));
  absl::StatusOr<DataLoader> no_recipe =
      DataLoader::create(std::make_shared<Tripwire>(4, 0, Tripwire::Act::kNothing),
                         {.num_workers = 1, .multiprocessing_context = "forkserver"});
  EXPECT_THAT(std::string(no_recipe.status().message()),
              HasSubstr("this dataset has none; give it one"));
  EXPECT_THAT(message({.num_workers = 1, .multiprocessing_context = "thread"}),
              HasSubstr("but got multiprocessing_context='thread'"));
  absl::StatusOr<DataLoader> l =
      DataLoader::create(std::make_shared<Stream>(3, false), {.shuffle = true});
  EXPECT_THAT(std::string(l.status().message()), HasSubstr("expected unspecified shuffle option"));
}

}  // namespace
}  // namespace ember::data
