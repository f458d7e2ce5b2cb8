// Ember's tensor parallelism against PyTorch 2.15's
// torch.distributed.tensor.parallel on the CPU over gloo
// (parallel/testdata/torch_tp.py): the same whole weights and inputs,
// written by torch; the same plans at TP=2 and TP=4, for the MLP, the
// transformer block, the block with SequenceParallel and loss_parallel's
// cross-entropy. Outputs, input gradients and every parameter's gradient
// (this rank's shard of torch's full_tensor()) agree within 1e-5 relative
// (with a 1e-6 absolute floor for gradients that are zero up to rounding).
// Rank 0 prints the largest relative difference of each run.
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "distributed/device_mesh.h"
#include "distributed/distributed.h"
#include "distributed/testing/ranks.h"
#include "gtest/gtest.h"
#include "nn/linear.h"
#include "parallel/dtensor.h"
#include "parallel/rank_testing.h"
#include "parallel/tensor_parallel.h"
#include "parallel/tensor_parallel_testing.h"
#include "serialization/serialization.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"

namespace ember::parallel {
namespace {

namespace dist = ::ember::distributed;
using ::ember::distributed::testing::ProcessResult;
using ::ember::distributed::testing::Rank;
using ::ember::distributed::testing::RunRankProcesses;
using ::ember::distributed::testing::RunRanksOptions;
using ::ember::parallel::rank_testing::Get;
using ::ember::parallel::rank_testing::Guard;

const rank_testing::TorchRun& Torch() {
  return rank_testing::RunTorchOnce("parallel/testdata/torch_tp.py", "torch_tp");
}

// Chunk `index` of `full` along `dim` over `n` ranks (torch.chunk's sizes;
// every size here divides by 4).
Tensor Chunk(const Tensor& full, int64_t dim, int n, int index) {
  if (dim < 0) dim += full.dim();
  const int64_t size = full.size(dim) / n;
  return full.narrow(dim, size * index, size).contiguous();
}

// Compares and records the largest relative difference.
struct Comparison {
  double worst = 0;
  std::string worst_name;
  absl::Status Close(const Tensor& got, const Tensor& want, const std::string& what) {
    if (!got.defined() || got.sizes() != want.sizes()) {
      return absl::InternalError(absl::StrCat(what, ": undefined or shape differs"));
    }
    const double err = (got.to(kFloat64) - want.to(kFloat64)).norm().item<double>();
    const double ref = want.to(kFloat64).norm().item<double>();
    const double rel = err / std::max(ref, 1e-30);
    if (ref > 1e-4 && rel > worst) {
      worst = rel;
      worst_name = what;
    }
    if (err > 1e-5 * ref + 1e-6) {
      std::ostringstream s;
      s << what << ": relative difference " << rel << "\nember " << got << "\ntorch " << want;
      return absl::InternalError(s.str());
    }
    return absl::OkStatus();
  }
};

ParallelizePlan Plan(const std::string& model) {
  if (model == "mlp") return {{"0", ColwiseParallel{}}, {"2", RowwiseParallel{}}};
  if (model == "loss") return {{"", ColwiseParallel{.use_local_output = false}}};
  if (model == "block") {
    return {{"attn.q", ColwiseParallel{}}, {"attn.k", ColwiseParallel{}},
            {"attn.v", ColwiseParallel{}}, {"attn.o", RowwiseParallel{}},
            {"fc1", ColwiseParallel{}},    {"fc2", RowwiseParallel{}}};
  }
  return {
      {"ln1", SequenceParallel{}},
      {"attn", PrepareModuleInput{.input_layouts = Shard(1), .desired_input_layouts = Replicate()}},
      {"attn.q", ColwiseParallel{}},
      {"attn.k", ColwiseParallel{}},
      {"attn.v", ColwiseParallel{}},
      {"attn.o", RowwiseParallel{.output_layouts = Shard(1)}},
      {"ln2", SequenceParallel{}},
      {"fc1", ColwiseParallel{.input_layouts = Shard(1)}},
      {"fc2", RowwiseParallel{.output_layouts = Shard(1)}}};
}

std::shared_ptr<nn::Module> Make(const std::string& model) {
  if (model == "mlp") return testing::MakeMlp(8, 16);
  if (model == "loss") return std::make_shared<nn::Linear>(8, 12);
  return std::make_shared<testing::Block>(8, 2, 16);
}

// The dim along which a parameter of `model` is sharded, or -1.
int64_t ShardDim(const std::string& model, const std::string& name) {
  auto ends = [&](const std::string& suffix) {
    return name.size() >= suffix.size() &&
           name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  if (model == "mlp")
    return name == "0.weight" || name == "0.bias" ? 0 : name == "2.weight" ? 1 : -1;
  if (model == "loss") return 0;
  if (absl::StartsWith(name, "attn.q.") || absl::StartsWith(name, "attn.k.") ||
      absl::StartsWith(name, "attn.v.") || absl::StartsWith(name, "fc1.")) {
    return 0;
  }
  if (ends("o.weight") || name == "fc2.weight") return 1;
  return -1;
}

absl::Status RunModel(Rank& me, const std::string& dir, const std::string& model) {
  const int n = me.world_size;
  const int r = me.rank;
  EMBER_ASSIGN_OR_RETURN(DeviceMesh tp, dist::init_device_mesh("cpu", {n}));
  EMBER_ASSIGN_OR_RETURN(StateDict init, load(absl::StrCat(dir, "/init_", model, ".pt")));
  EMBER_ASSIGN_OR_RETURN(StateDict data, load(absl::StrCat(dir, "/input_", model, ".pt")));
  EMBER_ASSIGN_OR_RETURN(StateDict theirs, load(absl::StrCat(dir, "/out_", model, "_", n, ".pt")));
  std::shared_ptr<nn::Module> whole = Make(model);
  EMBER_RETURN_IF_ERROR(whole->load_state_dict(init));
  EMBER_ASSIGN_OR_RETURN(std::shared_ptr<nn::Module> m, parallelize_module(whole, tp, Plan(model)));
  const bool sp = model == "block_sp";
  Tensor x = Get(data, "x").clone();
  if (sp) x = Chunk(x, 1, n, r);
  x.requires_grad_();
  Comparison c;
  if (model == "loss") {
    Tensor local = (*m)(x);
    EMBER_ASSIGN_OR_RETURN(DTensor logits, DTensor::from_local(local, tp, {Shard(-1)}));
    EMBER_ASSIGN_OR_RETURN(Tensor loss, loss_parallel_cross_entropy(logits, Get(data, "target")));
    (loss * loss).sum().backward();
    EMBER_RETURN_IF_ERROR(c.Close(loss, Get(theirs, "y"), "loss"));
  } else {
    Tensor y = (*m)(x);
    Tensor w = Get(data, "w");
    (y * (sp ? Chunk(w, 1, n, r) : w)).sum().backward();
    const Tensor want = Get(theirs, "y");
    EMBER_RETURN_IF_ERROR(c.Close(y, sp ? Chunk(want, 1, n, r) : want, "output"));
  }
  const Tensor x_grad = Get(theirs, "x_grad");
  EMBER_RETURN_IF_ERROR(c.Close(x.grad(), sp ? Chunk(x_grad, 1, n, r) : x_grad, "x.grad"));
  for (const auto& [name, p] : m->named_parameters()) {
    Tensor want = Get(theirs, "grad." + name);
    if (!want.defined()) return absl::NotFoundError(absl::StrCat("torch wrote no grad.", name));
    const int64_t dim = ShardDim(model, name);
    if (dim >= 0) want = Chunk(want, dim, n, r);
    EMBER_RETURN_IF_ERROR(c.Close(p.grad(), want, absl::StrCat(name, ".grad")));
  }
  if (r == 0) {
    std::fprintf(stderr, "largest relative difference %s TP=%d: %.3g (%s)\n", model.c_str(), n,
                 c.worst, c.worst_name.c_str());
  }
  return absl::OkStatus();
}

struct Case {
  std::string model;
  int ranks;
};

class TensorParallelTorchTest : public ::testing::TestWithParam<Case> {};

TEST_P(TensorParallelTorchTest, MatchesTorch) {
  const rank_testing::TorchRun& torch = Torch();
  if (absl::IsNotFound(torch.status)) GTEST_SKIP() << torch.status.message();
  ASSERT_TRUE(torch.status.ok()) << torch.status;
  const Case c = GetParam();
  const std::string dir = torch.dir;
  RunRanksOptions options;
  options.make_group = false;
  const std::vector<ProcessResult> results = RunRankProcesses(
      c.ranks,
      [&](Rank& me) -> absl::Status {
        EMBER_RETURN_IF_ERROR(
            dist::init_process_group({.backend = "gloo",
                                      .init_method = absl::StrCat("file://", me.temp_dir, "/rdv"),
                                      .world_size = me.world_size,
                                      .rank = me.rank,
                                      .timeout = absl::Seconds(30)}));
        EMBER_RETURN_IF_ERROR(Guard([&] { return RunModel(me, dir, c.model); }));
        return dist::destroy_process_group();
      },
      options, absl::Seconds(120));
  rank_testing::ExpectAllSucceeded(results);
  std::cout << results[0].output;
}

INSTANTIATE_TEST_SUITE_P(Models, TensorParallelTorchTest,
                         ::testing::Values(Case{"mlp", 2}, Case{"mlp", 4}, Case{"block", 2},
                                           Case{"block", 4}, Case{"block_sp", 2},
                                           Case{"block_sp", 4}, Case{"loss", 2}, Case{"loss", 4}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return absl::StrCat(info.param.model, "_", info.param.ranks);
                         });

}  // namespace
}  // namespace ember::parallel
