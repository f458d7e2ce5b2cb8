// Per-step fault tolerance on forked processes: a lighthouse (rank 0) and
// three replica groups (ranks 1-3, one process each) train an MLP with SGD
// and momentum for kSteps committed steps, each committed step's batch of 12
// rows split over its participants (Note [Steps that commit]). Replica "r2"
// is killed with SIGKILL in the middle of step kKillAt, before its gradients
// are averaged; the survivors go on without it up to step kRejoinAt, where
// they wait until its rank's process has started a replacement with other
// initial weights, which must recover the model and the momentum from a
// peer. Every replica's final parameters must equal one process training
// the whole batch of every step (within 1e-6 relative: the average of the
// participants' mean losses is the batch's mean loss when the rows split
// evenly), the broken step must have been discarded, and the replacement
// must have recovered. Over gloo and tcp. In the "+loader" cases the batches
// come from a QuorumDataLoader over a dataset of kEpochRows rows (shuffled,
// two epochs in kSteps), each replica logs the dataset indices of its
// committed shares, and the logs must hold every row of each epoch exactly
// once; the one process trains the logged batches. In the "+ddp" cases each
// replica group is two processes (Note [Replica groups of several ranks]):
// DistributedDataParallel averages the gradients within the group, the
// Manager across the groups, the whole group r2 is killed and replaced, and
// both ranks of every group must end equal to the one process; "+fsdp" the
// same with fully_shard over the group's two ranks (HSDP: shards averaged
// across groups, each rank's shards recovered from its counterpart). The
// quorum overlaps each step (Note [Overlapping the quorum]), so a survivor
// must also have discarded the step in which r2 came back; "+sync" asks it
// before each step instead; "+every4" asks it every 4 committed steps, so
// the replacement joins at step 12, not at kRejoinAt. The parent never touches gRPC (it does not
// survive fork); each process starts its own.
#include "parallel/fault_tolerance.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "distributed/elastic/lighthouse.h"
#include "distributed/testing/ranks.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/activation.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "nn/loss.h"
#include "nn/optim/sgd.h"
#include "data/dataset.h"
#include "distributed/backend_registry.h"
#include "distributed/file_store.h"
#include "parallel/distributed_data_parallel.h"
#include "parallel/fully_sharded_data_parallel.h"
#include "parallel/quorum_data_loader.h"
#include "parallel/rank_testing.h"
#include "serialization/serialization.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"

namespace ember::parallel {
namespace {

namespace fs = std::filesystem;
namespace elastic = ::ember::distributed::elastic;
using ::ember::distributed::testing::ProcessResult;
using ::ember::distributed::testing::Rank;
using ::ember::distributed::testing::RunRankProcesses;
using ::ember::distributed::testing::RunRanksOptions;

constexpr int kReplicas = 3;
constexpr int64_t kSteps = 16;
constexpr int64_t kRejoinAt = 10;  // the survivors wait here for the replacement
constexpr int64_t kKillAt = 4;
constexpr int64_t kRows = 12;
constexpr int64_t kEpochRows = kRows * kSteps / 2;

std::shared_ptr<nn::Sequential> MakeModel(uint64_t seed) {
  manual_seed(seed);
  return std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(8, 16), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(16, 4)});
}

nn::optim::SGDOptions Sgd() { return {.lr = 0.1, .momentum = 0.9}; }

// The global batch of committed step `step`.
std::pair<Tensor, Tensor> Batch(int64_t step) {
  Generator teacher(7);
  const Tensor w = randn({8, 4}, {}, &teacher);
  Generator gen(100 + step);
  Tensor x = randn({kRows, 8}, {}, &gen);
  return {x, x.matmul(w).argmax(1)};
}

// The loader cases' dataset: kEpochRows rows and their labels.
std::pair<Tensor, Tensor> Rows() {
  Generator teacher(7);
  const Tensor w = randn({8, 4}, {}, &teacher);
  Generator gen(99);
  Tensor x = randn({kEpochRows, 8}, {}, &gen);
  return {x, x.matmul(w).argmax(1)};
}

bool WithLoader(const std::string& param) { return absl::EndsWith(param, "+loader"); }
bool WithFsdp(const std::string& param) { return absl::EndsWith(param, "+fsdp"); }
// "+sync": the quorum asked before each step instead of overlapped with it.
bool Sync(const std::string& param) { return absl::EndsWith(param, "+sync"); }
// "+every4": the lighthouse asked every 4 committed steps (Note [Asking
// every few steps]).
int QuorumEvery(const std::string& param) { return absl::EndsWith(param, "+every4") ? 4 : 1; }
// Processes per replica group.
int GroupRanks(const std::string& param) {
  return absl::EndsWith(param, "+ddp") || WithFsdp(param) ? 2 : 1;
}
std::string BackendOf(const std::string& param) {
  return param.substr(0, param.find('+'));
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream(path + ".tmp") << text;
  fs::rename(path + ".tmp", path);
}

// The lighthouse's address, once rank 0 has written it.
absl::StatusOr<std::string> LighthouseAddress(const std::string& dir) {
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (absl::Now() < deadline) {
    if (fs::exists(dir + "/lighthouse")) return ReadFile(dir + "/lighthouse");
    absl::SleepFor(absl::Milliseconds(5));
  }
  return absl::DeadlineExceededError("no lighthouse address written");
}

// Waits for <dir>/<name> to exist.
absl::Status AwaitFile(const std::string& dir, const std::string& name) {
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (!fs::exists(absl::StrCat(dir, "/", name))) {
    if (absl::Now() > deadline) return absl::DeadlineExceededError(absl::StrCat("no ", name));
    absl::SleepFor(absl::Milliseconds(2));
  }
  return absl::OkStatus();
}

// One process of a replica group: rank `local` of its `ranks`.
struct Member {
  std::string id;
  int local = 0;
  int ranks = 1;
  std::string file(const std::string& what) const {
    return ranks == 1 ? absl::StrCat(what, id) : absl::StrCat(what, id, "_", local);
  }
};

// Trains member `me` until kSteps committed steps (or, with `die_at`, until
// it kills itself in the middle of that step). The survivors ("r1", "r3")
// stop at kRejoinAt until the replacement is alive ("r2_back"); "r1" says
// when it got there ("reached"). Writes the final parameters and counters to
// <dir>/<id>.pt (<id>_<local>.pt in a group of several).
absl::Status Replica(const std::string& dir, const Member& me, const std::string& param,
                     uint64_t seed, int64_t die_at) {
  const std::string backend = BackendOf(param);
  const std::string& id = me.id;
  EMBER_ASSIGN_OR_RETURN(std::string lighthouse, LighthouseAddress(dir));
  auto model = MakeModel(seed);
  // What the optimizer steps and the Manager recovers: the model, or under
  // fully_shard this rank's shards.
  std::shared_ptr<nn::Module> trained = model;
  const bool replacement = id == "r2" && die_at < 0;
  std::shared_ptr<distributed::ProcessGroup> group;
  std::shared_ptr<DistributedDataParallel> ddp;
  std::shared_ptr<FullyShardedDataParallel> fsdp;
  if (me.ranks > 1) {
    // The group's own ranks, over a store of this incarnation's.
    EMBER_ASSIGN_OR_RETURN(
        std::shared_ptr<distributed::Store> store,
        distributed::FileStore::open(absl::StrCat(dir, "/", id, replacement ? "b" : "a", ".store"),
                                     absl::Seconds(30)));
    EMBER_ASSIGN_OR_RETURN(const distributed::BackendInfo* info, distributed::find_backend(backend));
    EMBER_ASSIGN_OR_RETURN(group, info->create({.store = store,
                                                .rank = me.local,
                                                .size = me.ranks,
                                                .timeout = absl::Seconds(10)}));
    if (WithFsdp(param)) {
      EMBER_ASSIGN_OR_RETURN(fsdp, FullyShardedDataParallel::create(model, {.process_group = group}));
      trained = fsdp;
    } else {
      EMBER_ASSIGN_OR_RETURN(ddp, DistributedDataParallel::create(model, {.process_group = group}));
    }
  }
  nn::optim::SGD opt(trained->parameters(), Sgd());
  EMBER_ASSIGN_OR_RETURN(auto ft, Manager::create(trained, &opt,
                                                  {.lighthouse = lighthouse,
                                                   .replica_id = id,
                                                   .backend = backend,
                                                   .timeout = absl::Seconds(10),
                                                   .quorum_timeout = absl::Seconds(30),
                                                   .replica_group = group,
                                                   .async_quorum = !Sync(param),
                                                   .quorum_every = QuorumEvery(param)}));
  std::unique_ptr<QuorumDataLoader> loader;
  if (WithLoader(param)) {
    const auto [rx, ry] = Rows();
    EMBER_ASSIGN_OR_RETURN(
        loader, QuorumDataLoader::create(
                    std::make_shared<data::TensorDataset>(std::vector<Tensor>{rx, ry}), ft.get(),
                    {.global_batch_size = kRows, .seed = 5}));
  }
  std::ofstream log(absl::StrCat(dir, "/", id, ".log"), std::ios::app);
  if (replacement) {
    if (me.local == 0) WriteFile(dir + "/r2_back", "1");
  } else {
    // Everyone starts together, so the first quorum has every group.
    WriteFile(dir + "/" + me.file("up_"), "1");
    for (int i = 1; i <= kReplicas; ++i) {
      for (int l = 0; l < me.ranks; ++l) {
        EMBER_RETURN_IF_ERROR(
            AwaitFile(dir, Member{absl::StrCat("r", i), l, me.ranks}.file("up_")));
      }
    }
  }
  int failures = 0;
  int64_t first_commit = -1;  // the step of this process's first commit
  while (ft->current_step() < kSteps) {
    if (!replacement && id != "r2" && ft->current_step() == kRejoinAt) {
      if (id == "r1" && me.local == 0) WriteFile(dir + "/reached", "1");
      EMBER_RETURN_IF_ERROR(AwaitFile(dir, "r2_back"));
    }
    if (absl::Status s = ft->start_quorum(); !s.ok()) {
      if (++failures > 5) return s;  // never loop forever
      ft->should_commit();           // fails; the next quorum makes a new group
      continue;
    }
    // This process's share: chunk p * ranks + local of n * ranks.
    const int64_t chunks = ft->num_participants() * me.ranks;
    const int64_t chunk = ft->participant_rank() * me.ranks + me.local;
    Tensor x, y;
    if (loader != nullptr) {
      EMBER_ASSIGN_OR_RETURN(data::Sample batch, loader->next());
      EMBER_ASSIGN_OR_RETURN(x, batch.list()[0].as<Tensor>());
      EMBER_ASSIGN_OR_RETURN(y, batch.list()[1].as<Tensor>());
    } else {
      const auto [bx, by] = Batch(ft->current_step());
      x = bx.narrow(0, chunk * kRows / chunks, kRows / chunks);
      y = by.narrow(0, chunk * kRows / chunks, kRows / chunks);
    }
    opt.zero_grad();
    // Under DDP or fully_shard the backward pass averages the gradients
    // within the group (fully_shard: this rank's shard of them).
    const Tensor out = fsdp != nullptr ? (*fsdp)(x) : ddp != nullptr ? (*ddp)(x) : (*model)(x);
    nn::functional::cross_entropy(out, y).backward();
    if (die_at >= 0 && ft->current_step() >= die_at) ::raise(SIGKILL);
    ft->allreduce_gradients().IgnoreError();  // recorded; should_commit sees it
    const int64_t step = ft->current_step();
    if (ft->should_commit()) {
      opt.step();
      if (first_commit < 0) first_commit = step;
      if (loader != nullptr) {
        log << step;
        for (int64_t i : loader->last_indices()) log << " " << i;
        log << std::endl;
      }
    }
  }
  StateDict out;
  if (fsdp != nullptr) {
    EMBER_ASSIGN_OR_RETURN(out, fsdp->full_state_dict());
  } else {
    out = model->state_dict();
  }
  out.push_back({"recoveries", tensor<int64_t>({ft->recoveries()})});
  out.push_back({"discarded", tensor<int64_t>({ft->discarded_steps()})});
  out.push_back({"first_commit", tensor<int64_t>({first_commit})});
  EMBER_RETURN_IF_ERROR(save(out, absl::StrCat(dir, "/", me.file(""), ".pt")));
  WriteFile(dir + "/" + me.file("done_"), "1");
  return absl::OkStatus();
}

absl::Status Lighthouse(const std::string& dir, int ranks) {
  EMBER_ASSIGN_OR_RETURN(auto server,
                         elastic::LighthouseServer::create({.min_replicas = 2,
                                                            .join_timeout = absl::Seconds(5),
                                                            .heartbeat_timeout =
                                                                absl::Seconds(1)}));
  WriteFile(dir + "/lighthouse", server->address());
  const absl::Time deadline = absl::Now() + absl::Seconds(90);
  for (;;) {
    int done = 0;
    for (int i = 1; i <= kReplicas; ++i) {
      for (int l = 0; l < ranks; ++l) {
        done += fs::exists(dir + "/" + Member{absl::StrCat("r", i), l, ranks}.file("done_"));
      }
    }
    if (done == kReplicas * ranks) return absl::OkStatus();
    if (absl::Now() > deadline) return absl::DeadlineExceededError("replicas did not finish");
    absl::SleepFor(absl::Milliseconds(10));
  }
}

// Every replica's final parameters against one process training the whole
// batch of every step; the counters of the survivors and the replacement.
// The loader cases: the rows every replica logged for each committed step;
// each epoch's steps must hold each row once.
absl::StatusOr<std::vector<std::vector<int64_t>>> LoggedBatches(const std::string& dir) {
  std::vector<std::vector<int64_t>> steps(kSteps);
  for (int i = 1; i <= kReplicas; ++i) {
    std::ifstream in(absl::StrCat(dir, "/r", i, ".log"));
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream words(line);
      int64_t step = -1, index = 0;
      words >> step;
      if (step < 0 || step >= kSteps) return absl::InternalError("bad log line: " + line);
      while (words >> index) steps[step].push_back(index);
    }
  }
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    std::vector<int> seen(kEpochRows, 0);
    for (int64_t s = epoch * kSteps / 2; s < (epoch + 1) * kSteps / 2; ++s) {
      if (static_cast<int64_t>(steps[s].size()) != kRows) {
        return absl::InternalError(absl::StrCat("committed step ", s, " trained ",
                                                steps[s].size(), " rows, not ", kRows));
      }
      for (int64_t i : steps[s]) ++seen[i];
    }
    for (int64_t i = 0; i < kEpochRows; ++i) {
      if (seen[i] != 1) {
        return absl::InternalError(
            absl::StrCat("row ", i, " was trained ", seen[i], " times in epoch ", epoch));
      }
    }
  }
  return steps;
}

absl::Status CompareWithOneProcess(const std::string& dir, bool with_loader, int ranks,
                                   bool async_quorum, int quorum_every) {
  auto whole = MakeModel(0);
  nn::optim::SGD opt(whole->parameters(), Sgd());
  std::vector<std::vector<int64_t>> logged;
  if (with_loader) {
    EMBER_ASSIGN_OR_RETURN(logged, LoggedBatches(dir));
  }
  const auto [rx, ry] = Rows();
  for (int64_t s = 0; s < kSteps; ++s) {
    auto [x, y] = Batch(s);
    if (with_loader) {
      const Tensor index = tensor<int64_t>(logged[s]);
      x = rx.index_select(0, index);
      y = ry.index_select(0, index);
    }
    opt.zero_grad();
    nn::functional::cross_entropy((*whole)(x), y).backward();
    opt.step();
  }
  int64_t survivors_discarded = 0;
  for (int i = 1; i <= kReplicas * ranks; ++i) {
    const Member who{absl::StrCat("r", (i - 1) / ranks + 1), (i - 1) % ranks, ranks};
    const std::string id = who.file("");
    EMBER_ASSIGN_OR_RETURN(StateDict got, load(absl::StrCat(dir, "/", id, ".pt")));
    for (const auto& [name, want] : whole->state_dict()) {
      const Tensor mine = rank_testing::Get(got, name);
      if (!mine.defined()) return absl::NotFoundError(absl::StrCat(id, " saved no ", name));
      const double rel = (mine - want).abs().max().item<double>() /
                         std::max(want.abs().max().item<double>(), 1e-12);
      if (rel > 1e-6) {
        return absl::InternalError(
            absl::StrCat(id, "'s ", name, " differs from one process by ", rel, " relative"));
      }
    }
    const int64_t recoveries = rank_testing::Get(got, "recoveries").item<int64_t>();
    const int64_t discarded = rank_testing::Get(got, "discarded").item<int64_t>();
    std::fprintf(stderr, "%s: recoveries %lld, discarded steps %lld\n", id.c_str(),
                 static_cast<long long>(recoveries), static_cast<long long>(discarded));
    if (who.id == "r2" && recoveries < 1) {
      return absl::InternalError("the replacement r2 did not recover the state from a peer");
    }
    if (who.id != "r2") survivors_discarded += discarded;
    // The survivors wait for the replacement at kRejoinAt (10), so asking
    // every step it joins at 10 or 11; asking every 4 steps, not before the
    // survivors' next ask at 12.
    const int64_t first_commit = rank_testing::Get(got, "first_commit").item<int64_t>();
    if (who.id == "r2" && quorum_every > 1 &&
        (first_commit < kRejoinAt || first_commit % quorum_every != 0)) {
      return absl::InternalError(absl::StrCat("the replacement r2 first committed step ",
                                              first_commit, "; asking the lighthouse every ",
                                              quorum_every, " steps it should join at ",
                                              (kRejoinAt / quorum_every + 1) * quorum_every));
    }
    // Overlapped quorums (Note [Overlapping the quorum]): a survivor also
    // discards the step in which r2 came back, whose batch it chose for
    // two participants.
    if (async_quorum && who.id != "r2" && discarded < 2) {
      return absl::InternalError(absl::StrCat(
          id, " discarded ", discarded, " steps; r2's death and its return should cost two"));
    }
  }
  // Whoever was in r2's quorum when it died discarded that step (a survivor
  // that joined later saw none).
  if (survivors_discarded < 1) {
    return absl::InternalError("no survivor discarded a step, yet r2 died in one");
  }
  return absl::OkStatus();
}

// Group r2's ranks: the first r2 in a child that dies at kKillAt, then a
// replacement.
absl::Status KilledAndReplaced(const std::string& dir, const Member& me, const std::string& param) {
  const pid_t child = fork();
  if (child == 0) {
    const absl::Status s = Replica(dir, me, param, /*seed=*/0, kKillAt);
    _exit(s.ok() ? 3 : 4);  // should not get here: it kills itself
  }
  int status = 0;
  if (waitpid(child, &status, 0) != child || !WIFSIGNALED(status) || WTERMSIG(status) != SIGKILL) {
    return absl::InternalError(absl::StrCat("the first r2 was not killed (status ", status, ")"));
  }
  // Once the survivors went on without r2 (its heartbeat expired after
  // 1 s) up to kRejoinAt, so some steps committed with 2 participants.
  EMBER_RETURN_IF_ERROR(AwaitFile(dir, "reached"));
  return Replica(dir, me, param, /*seed=*/555, /*die_at=*/-1);
}

class FaultToleranceTest : public ::testing::TestWithParam<std::string> {};

TEST_P(FaultToleranceTest, AKilledReplicaIsReplacedAndTrainingEqualsOneProcess) {
  const std::string param = GetParam();
  const int ranks = GroupRanks(param);
  RunRanksOptions options;
  options.make_group = false;
  const std::vector<ProcessResult> results = RunRankProcesses(
      1 + kReplicas * ranks,
      [&](Rank& me) -> absl::Status {
        return rank_testing::Guard([&]() -> absl::Status {
          if (me.rank == 0) {
            EMBER_RETURN_IF_ERROR(Lighthouse(me.temp_dir, ranks));
            return CompareWithOneProcess(me.temp_dir, WithLoader(param), ranks, !Sync(param),
                                         QuorumEvery(param));
          }
          const Member member{absl::StrCat("r", (me.rank - 1) / ranks + 1), (me.rank - 1) % ranks,
                              ranks};
          if (member.id == "r2") return KilledAndReplaced(me.temp_dir, member, param);
          return Replica(me.temp_dir, member, param, /*seed=*/0, -1);
        });
      },
      options, absl::Seconds(120));
  rank_testing::ExpectAllSucceeded(results);
  ASSERT_EQ(results.size(), static_cast<size_t>(1 + kReplicas * ranks));
  // Rank 0 compared and reported the counters.
  EXPECT_THAT(results[0].output,
              ::testing::HasSubstr(ranks == 1 ? "r2: recoveries 1" : "r2_1: recoveries 1"));
  std::cout << results[0].output;
}

// Options that make no sense are refused by name before anything is
// started (no store, no lighthouse call: the parent never touches gRPC).
TEST(ManagerOptionsTest, RefusesBadOptionsByName) {
  auto model = MakeModel(0);
  const ManagerOptions good{.lighthouse = "127.0.0.1:1", .replica_id = "r1"};
  ManagerOptions every = good;
  every.quorum_every = 0;
  absl::StatusOr<std::unique_ptr<Manager>> m = Manager::create(model, nullptr, every);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(m.status().message(), ::testing::HasSubstr("quorum_every must be at least 1"));
  EXPECT_THAT(m.status().message(), ::testing::HasSubstr("got 0"));
  ManagerOptions replicas = good;
  replicas.min_replicas = 0;
  m = Manager::create(model, nullptr, replicas);
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(m.status().message(), ::testing::HasSubstr("min_replicas must be at least 1"));
}

INSTANTIATE_TEST_SUITE_P(Backends, FaultToleranceTest,
                         ::testing::Values("gloo", "tcp", "gloo+sync", "tcp+sync", "gloo+every4",
                                           "gloo+loader",
                                           "tcp+loader", "gloo+ddp", "tcp+ddp", "gloo+fsdp",
                                           "tcp+fsdp"),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '+', '_');
                           return name;
                         });

}  // namespace
}  // namespace ember::parallel
