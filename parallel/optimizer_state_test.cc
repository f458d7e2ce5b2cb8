// Training resumed from a distributed checkpoint on a different number of
// ranks takes the same steps as a run that never stopped. The model is a
// plain linear regression (w [8, 4], b [8]); every rank computes the full
// gradient, and each rank's Adam steps only its own pieces of the parameters
// (ZeRO's sharded optimizer state), which an all_reduce puts back together.
// Pieces are rows (boxes) or flat ranges, differently on each world size.
#include "parallel/optimizer_state.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "distributed/checkpoint/checkpoint.h"
#include "distributed/testing/ranks.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "nn/loss.h"
#include "nn/optim/adam.h"
#include "nn/optim/sgd.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"

namespace ember::parallel {

namespace dcp = distributed::checkpoint;
using dcp::CheckpointOptions;
using dcp::Item;
using dcp::Placement;
using dcp::StateDict;

namespace {

namespace fs = std::filesystem;
using ::ember::distributed::testing::Rank;
using ::ember::distributed::testing::RunRanks;

std::string FreshDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  fs::path dir = fs::path(base ? base : "/tmp") / absl::StrCat("dcp_optim_", ::getpid()) / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

const Tensor& X() {
  static const Tensor x = arange(64, kFloat32).mul(0.37).sin().view({16, 4});
  return x;
}
const Tensor& Y() {
  static const Tensor y = arange(128, kFloat32).mul(0.11).cos().view({16, 8});
  return y;
}

// How a world of `world` ranks splits the parameters: each by rows, each as
// a flat range, or both flattened into one unit (FSDP's FlatParameter:
// w's 32 elements then b's 8, padded to a multiple of the world size) of
// which each rank's optimizer steps one even shard.
enum class Split { kRows, kFlat, kUnit };

struct LocalParam {
  std::string key;
  SizeVector global_shape;
  Placement placement;
  Tensor local;  // the leaf the optimizer steps

  Tensor PieceOf(const Tensor& full) const {
    if (placement.is_flat())
      return full.contiguous().view({full.numel()}).narrow(0, placement.flat_offset, local.numel());
    return full.narrow(0, placement.offsets[0], local.size(0));
  }
};

LocalParam MakeParam(const std::string& key, const Tensor& full_value, Split split, int rank,
                     int world) {
  LocalParam p;
  p.key = key;
  p.global_shape = SizeVector(full_value.sizes().begin(), full_value.sizes().end());
  if (split == Split::kFlat) {
    const int64_t n = full_value.numel();
    const int64_t start = n * rank / world, end = n * (rank + 1) / world;
    p.placement.global_shape = p.global_shape;
    p.placement.flat_offset = start;
    p.local = full_value.contiguous().view({n}).narrow(0, start, end - start).clone();
  } else {
    const int64_t rows = full_value.size(0);
    const int64_t start = rows * rank / world, end = rows * (rank + 1) / world;
    SizeVector offsets(p.global_shape.size(), 0);
    offsets[0] = start;
    p.placement.global_shape = p.global_shape;
    p.placement.offsets = offsets;
    p.local = full_value.narrow(0, start, end - start).clone();
  }
  p.local.requires_grad_(true);
  return p;
}

struct Job {
  int rank = 0;
  int world = 1;
  std::shared_ptr<distributed::ProcessGroup> group;
  std::vector<LocalParam> params;  // w, b (kRows, kFlat)
  // kUnit: this rank's shard of the flat unit, its size, and its segments.
  Tensor unit_shard;
  int64_t shard_size = 0;
  std::vector<FlatSegment> segments;
  std::unique_ptr<nn::optim::Optimizer> optimizer;

  std::vector<ParamKey> Keys() const {
    std::vector<ParamKey> keys;
    if (unit_shard.defined()) {
      keys.push_back({"", std::nullopt, segments});
      return keys;
    }
    for (const LocalParam& p : params) keys.push_back({p.key, p.placement});
    return keys;
  }
  StateDict Items() const {
    StateDict sd;
    for (const FlatSegment& seg : segments) {
      sd.push_back({seg.key, dcp::flat_shard(unit_shard.narrow(0, seg.local_offset, seg.numel),
                                             seg.global_shape, seg.flat_offset)});
    }
    for (const LocalParam& p : params) sd.push_back({p.key, Item{p.local, p.placement}});
    return sd;
  }

  absl::Status AllReduce(const Tensor& t) const {
    if (!group) return absl::OkStatus();
    auto work = group->allreduce(t);
    if (!work.ok()) return work.status();
    return (*work)->wait();
  }

  // The full parameters: each rank's pieces summed over ranks.
  absl::StatusOr<std::vector<Tensor>> FullParams() const {
    std::vector<Tensor> out;
    if (unit_shard.defined()) {
      Tensor flat = zeros({shard_size * world});
      flat.narrow(0, rank * shard_size, shard_size).copy_(unit_shard.detach());
      EMBER_RETURN_IF_ERROR(AllReduce(flat));
      out.push_back(flat.narrow(0, 0, 32).view({8, 4}).clone());
      out.push_back(flat.narrow(0, 32, 8).clone());
      return out;
    }
    for (const LocalParam& p : params) {
      Tensor full_value = zeros(p.global_shape);
      p.PieceOf(full_value).copy_(p.local.detach());
      if (group) {
        auto work = group->allreduce(full_value);
        if (!work.ok()) return work.status();
        EMBER_RETURN_IF_ERROR((*work)->wait());
      }
      out.push_back(full_value);
    }
    return out;
  }

  // One step; returns the loss before it.
  absl::StatusOr<float> Step() {
    EMBER_ASSIGN_OR_RETURN(std::vector<Tensor> full_params, FullParams());
    Tensor w = full_params[0].requires_grad_(true);
    Tensor b = full_params[1].requires_grad_(true);
    Tensor loss = nn::functional::mse_loss(X().matmul(w.t()).add(b), Y());
    loss.backward();
    optimizer->zero_grad();
    if (unit_shard.defined()) {
      Tensor flat_grad =
          cat({w.grad().contiguous().view({32}), b.grad(), zeros({shard_size * world - 40})});
      unit_shard.set_grad(flat_grad.narrow(0, rank * shard_size, shard_size).clone());
      optimizer->step();
      return loss.item<float>();
    }
    params[0].local.set_grad(
        params[0].PieceOf(w.grad()).contiguous().view(params[0].local.sizes()));
    params[1].local.set_grad(
        params[1].PieceOf(b.grad()).contiguous().view(params[1].local.sizes()));
    optimizer->step();
    return loss.item<float>();
  }
};

enum class Opt { kAdam, kSgdMomentum };

Job MakeJob(int rank, int world, std::shared_ptr<distributed::ProcessGroup> group, Split split,
            Opt opt) {
  Job job;
  job.rank = rank;
  job.world = world;
  job.group = std::move(group);
  const Tensor w0 = arange(32, kFloat32).mul(0.05).sub(0.8).view({8, 4});
  const Tensor b0 = arange(8, kFloat32).mul(-0.1);
  std::vector<Tensor> leaves;
  if (split == Split::kUnit) {
    job.shard_size = (40 + world - 1) / world;
    const int64_t lo = rank * job.shard_size, hi = lo + job.shard_size;
    Tensor flat = cat({w0.view({32}), b0, zeros({job.shard_size * world - 40})});
    job.unit_shard = flat.narrow(0, lo, job.shard_size).clone().requires_grad_(true);
    struct Original {
      const char* key;
      SizeVector shape;
      int64_t start, end;  // in the unit
    };
    for (const Original& o :
         {Original{"fc.weight", {8, 4}, 0, 32}, Original{"fc.bias", {8}, 32, 40}}) {
      const int64_t a = std::max(lo, o.start), e = std::min(hi, o.end);
      const int64_t n = std::max<int64_t>(0, e - a);
      job.segments.push_back({o.key, o.shape, n > 0 ? a - o.start : 0, n > 0 ? a - lo : 0, n});
    }
    leaves = {job.unit_shard};
  } else {
    job.params.push_back(MakeParam("fc.weight", w0, split, rank, world));
    job.params.push_back(MakeParam("fc.bias", b0, split, rank, world));
    leaves = {job.params[0].local, job.params[1].local};
  }
  if (opt == Opt::kAdam) {
    job.optimizer = std::make_unique<nn::optim::Adam>(leaves, nn::optim::AdamOptions{.lr = 0.05});
  } else {
    job.optimizer = std::make_unique<nn::optim::SGD>(
        leaves, nn::optim::SGDOptions{.lr = 0.05, .momentum = 0.9, .nesterov = true});
  }
  return job;
}

// Runs steps [from, to) on `world` ranks (threads; world 1: one process,
// no group), loading `resume` first and saving to `save_to` at the end when
// given. Returns rank 0's losses.
std::vector<float> Train(int world, Split split, Opt opt, int from, int to,
                         const std::string& resume, const std::string& save_to) {
  std::vector<float> losses;
  std::mutex mu;
  auto body = [&](int rank, std::shared_ptr<distributed::ProcessGroup> group) -> absl::Status {
    Job job = MakeJob(rank, world, group, split, opt);
    if (!resume.empty()) {
      EMBER_RETURN_IF_ERROR(dcp::load(job.Items(), {.path = resume}));
      EMBER_RETURN_IF_ERROR(set_optimizer_state_dict(*job.optimizer, job.Keys(), {.path = resume}));
    }
    for (int step = from; step < to; ++step) {
      EMBER_ASSIGN_OR_RETURN(float loss, job.Step());
      if (rank == 0) {
        std::lock_guard<std::mutex> lock(mu);
        losses.push_back(loss);
      }
    }
    if (!save_to.empty()) {
      StateDict sd = job.Items();
      EMBER_ASSIGN_OR_RETURN(StateDict optim, get_optimizer_state_dict(*job.optimizer, job.Keys()));
      sd.insert(sd.end(), optim.begin(), optim.end());
      EMBER_RETURN_IF_ERROR(dcp::save(sd, {.path = save_to, .process_group = group}));
    }
    return absl::OkStatus();
  };
  absl::Status s = world == 1 ? body(0, nullptr)
                              : RunRanks(world, [&](Rank& me) { return body(me.rank, me.group); });
  EXPECT_TRUE(s.ok()) << s;
  return losses;
}

struct Case {
  Opt opt;
  Split save_split;
  Split resume_split;
};

class ResumeTest : public ::testing::TestWithParam<Case> {};

TEST_P(ResumeTest, SameLossesOnAnyNumberOfRanks) {
  const Case c = GetParam();
  // The run that never stops, on one process.
  const std::vector<float> straight = Train(1, c.save_split, c.opt, 0, 10, "", "");
  ASSERT_EQ(straight.size(), 10u);
  EXPECT_LT(straight[9], straight[0]) << "the model learns";

  const std::string ckpt = FreshDir("resume") + "/step5";
  std::vector<float> first = Train(4, c.save_split, c.opt, 0, 5, "", ckpt);
  ASSERT_EQ(first.size(), 5u);
  for (int world : {3, 2, 1}) {
    std::vector<float> rest = Train(world, c.resume_split, c.opt, 5, 10, ckpt, "");
    ASSERT_EQ(rest.size(), 5u);
    std::vector<float> all = first;
    all.insert(all.end(), rest.begin(), rest.end());
    EXPECT_EQ(all, straight) << "resumed on " << world << " ranks";
  }
}

INSTANTIATE_TEST_SUITE_P(Optimizers, ResumeTest,
                         ::testing::Values(Case{Opt::kAdam, Split::kRows, Split::kFlat},
                                           Case{Opt::kAdam, Split::kFlat, Split::kRows},
                                           Case{Opt::kSgdMomentum, Split::kRows, Split::kFlat},
                                           Case{Opt::kAdam, Split::kUnit, Split::kRows},
                                           Case{Opt::kAdam, Split::kRows, Split::kUnit},
                                           Case{Opt::kSgdMomentum, Split::kUnit, Split::kUnit}),
                         [](const auto& info) {
                           auto name = [](Split s) {
                             return s == Split::kRows   ? "Rows"
                                    : s == Split::kFlat ? "Flat"
                                                        : "Unit";
                           };
                           return absl::StrCat(
                               info.param.opt == Opt::kAdam ? "Adam" : "SgdMomentum", "_",
                               name(info.param.save_split), "To", name(info.param.resume_split));
                         });

// A checkpoint saved from sharded pieces loads into a plain module's
// state_dict() (its parameters, in place) and through load_state_dict.
TEST(PlainModuleTest, ShardedCheckpointIntoAPlainModule) {
  const std::string ckpt = FreshDir("plain") + "/ckpt";
  auto source = std::make_shared<nn::Sequential>();
  source->push_back(std::make_shared<nn::Linear>(4, 6));
  source->push_back(std::make_shared<nn::Linear>(6, 3));
  const ember::StateDict want = source->state_dict();
  // Two ranks save every tensor as a flat half.
  absl::Status s = RunRanks(2, [&](Rank& me) {
    StateDict sd;
    for (const auto& [k, t] : want) {
      const int64_t n = t.numel(), lo = n * me.rank / 2, hi = n * (me.rank + 1) / 2;
      sd.push_back({k, dcp::flat_shard(t.detach().contiguous().view({n}).narrow(0, lo, hi - lo),
                                       SizeVector(t.sizes().begin(), t.sizes().end()), lo)});
    }
    return dcp::save(sd, {.path = ckpt, .process_group = me.group});
  });
  ASSERT_TRUE(s.ok()) << s;

  auto target = std::make_shared<nn::Sequential>();
  target->push_back(std::make_shared<nn::Linear>(4, 6));
  target->push_back(std::make_shared<nn::Linear>(6, 3));
  StateDict in_place;
  for (const auto& [k, t] : target->named_parameters()) in_place.push_back({k, dcp::replicated(t)});
  s = dcp::load(in_place, {.path = ckpt});
  ASSERT_TRUE(s.ok()) << s;
  for (const auto& [k, t] : target->named_parameters()) {
    auto it = std::find_if(want.begin(), want.end(), [&](const auto& p) { return p.first == k; });
    ASSERT_NE(it, want.end());
    EXPECT_TRUE(t.detach().equal(it->second.detach())) << k;
    EXPECT_TRUE(t.requires_grad()) << k << " is still a parameter";
  }

  auto third = std::make_shared<nn::Sequential>();
  third->push_back(std::make_shared<nn::Linear>(4, 6));
  third->push_back(std::make_shared<nn::Linear>(6, 3));
  absl::StatusOr<std::vector<std::pair<std::string, Tensor>>> full_sd =
      dcp::load_full_state_dict(ckpt);
  ASSERT_TRUE(full_sd.ok()) << full_sd.status();
  ember::StateDict as_module(full_sd->begin(), full_sd->end());
  s = third->load_state_dict(as_module);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(third->named_parameters()[2].second.detach().equal(want[2].second.detach()));
}

TEST(OptimizerStateTest, KeysAndPlacements) {
  Job job = MakeJob(1, 2, nullptr, Split::kRows, Opt::kAdam);
  ASSERT_TRUE(job.Step().ok());
  absl::StatusOr<StateDict> sd = get_optimizer_state_dict(*job.optimizer, job.Keys());
  ASSERT_TRUE(sd.ok()) << sd.status();
  std::vector<std::string> keys;
  for (const auto& [k, item] : *sd) keys.push_back(k);
  EXPECT_THAT(keys, ::testing::IsSupersetOf(
                        {"optim.state.fc.weight.exp_avg", "optim.state.fc.weight.exp_avg_sq",
                         "optim.state.fc.weight.step", "optim.state.fc.bias.exp_avg",
                         "optim.param_groups.0.lr", "optim.param_groups.0.beta2"}));
  for (const auto& [k, item] : *sd) {
    if (k == "optim.state.fc.weight.exp_avg") {
      ASSERT_TRUE(item.placement.has_value());
      EXPECT_EQ(item.placement->offsets, SizeVector({4, 0}));
      EXPECT_EQ(item.placement->global_shape, SizeVector({8, 4}));
    }
    if (k == "optim.state.fc.weight.step") {
      EXPECT_FALSE(item.placement.has_value());
    }
  }
  absl::StatusOr<StateDict> wrong = get_optimizer_state_dict(*job.optimizer, {{"fc.weight", {}}});
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(wrong.status().message(), ::testing::HasSubstr("has 2 parameters but 1 ParamKeys"));
}

}  // namespace
}  // namespace ember::parallel
