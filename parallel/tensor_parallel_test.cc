// parallelize_module on forked ranks (tcp and gloo, file:// rendezvous)
// against one process running the whole model: an MLP and a one-layer
// transformer block with ColwiseParallel / RowwiseParallel at TP=2 and 4,
// with SequenceParallel, Embeddings sharded both ways, loss_parallel's
// cross-entropy over an uneven vocabulary, and the errors. Each rank runs
// the whole model too (the same seed), as the reference; outputs and
// gradients must agree within 1e-5 relative. Expected shards use chunk sizes
// written out (torch.chunk's).
#include "parallel/tensor_parallel.h"

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "distributed/device_mesh.h"
#include "distributed/distributed.h"
#include "distributed/testing/ranks.h"
#include "gtest/gtest.h"
#include "nn/embedding.h"
#include "nn/loss.h"
#include "parallel/rank_testing.h"
#include "parallel/tensor_parallel_testing.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"

namespace ember::parallel {
namespace {

namespace dist = ::ember::distributed;
using ::ember::distributed::testing::Rank;
using ::ember::distributed::testing::RunRankProcesses;
using ::ember::distributed::testing::RunRanksOptions;
using ::ember::parallel::rank_testing::ExpectAllSucceeded;
using ::ember::parallel::rank_testing::Guard;
using ::ember::parallel::testing::Block;
using ::ember::parallel::testing::MakeMlp;

absl::Status Check(bool ok, const std::string& what) {
  return ok ? absl::OkStatus() : absl::InternalError(absl::StrCat("check failed: ", what));
}

// ||got - want|| <= 1e-5 ||want|| + 1e-6 (and equal shapes): relative, with
// an absolute floor for gradients that are zero up to rounding (a key
// projection's bias: softmax does not see it).
absl::Status Close(const Tensor& got, const Tensor& want, const std::string& what) {
  if (!got.defined() || got.sizes() != want.sizes()) {
    return absl::InternalError(absl::StrCat(what, ": shape differs or undefined"));
  }
  const double err = (got - want).norm().item<double>();
  const double ref = want.norm().item<double>();
  if (err > 1e-5 * ref + 1e-6) {
    std::ostringstream s;
    s << what << ": relative error " << err / std::max(ref, 1e-12) << "\ngot " << got << "\nwant "
      << want;
    return absl::InternalError(s.str());
  }
  return absl::OkStatus();
}

// torch.chunk's sizes, written out.
std::vector<int64_t> Sizes(int64_t length, int n) {
  if (n == 1) return {length};
  if (length == 10 && n == 2) return {5, 5};
  if (length == 10 && n == 4) return {3, 3, 3, 1};
  if (length == 8 && n == 2) return {4, 4};
  if (length == 8 && n == 4) return {2, 2, 2, 2};
  if (length == 16 && n == 2) return {8, 8};
  if (length == 16 && n == 4) return {4, 4, 4, 4};
  if (length == 4 && n == 2) return {2, 2};
  if (length == 4 && n == 4) return {1, 1, 1, 1};
  if (length == 6 && n == 2) return {3, 3};
  if (length == 6 && n == 4) return {2, 2, 2, 0};
  ADD_FAILURE() << "no sizes for " << length << " over " << n;
  return {};
}

Tensor Chunk(const Tensor& full, int64_t dim, int n, int index) {
  if (dim < 0) dim += full.dim();
  const std::vector<int64_t> sizes = Sizes(full.size(dim), n);
  int64_t offset = 0;
  for (int i = 0; i < index; ++i) offset += sizes[i];
  return full.narrow(dim, offset, sizes[index]);
}

absl::Status Init(const Rank& me, const std::string& backend) {
  return dist::init_process_group({.backend = backend,
                                   .init_method = absl::StrCat("file://", me.temp_dir, "/rdv"),
                                   .world_size = me.world_size,
                                   .rank = me.rank,
                                   .timeout = absl::Seconds(30)});
}

// Runs `body` on `ranks` forked ranks with a 1-D TP mesh over all of them.
void RunTp(int ranks, const std::string& backend,
           const std::function<absl::Status(const DeviceMesh&, int, int)>& body) {
  RunRanksOptions options;
  options.make_group = false;
  ExpectAllSucceeded(RunRankProcesses(
      ranks,
      [&](Rank& me) -> absl::Status {
        EMBER_RETURN_IF_ERROR(Init(me, backend));
        EMBER_RETURN_IF_ERROR(Guard([&]() -> absl::Status {
          EMBER_ASSIGN_OR_RETURN(DeviceMesh tp, dist::init_device_mesh("cpu", {ranks}, {"tp"}));
          return body(tp, me.rank, ranks);
        }));
        return dist::destroy_process_group();
      },
      options, absl::Seconds(120)));
}

// The parameter called `name` of `m`.
Tensor Param(const nn::Module& m, const std::string& name) {
  for (const auto& [n, p] : m.named_parameters()) {
    if (n == name) return p;
  }
  ADD_FAILURE() << "no parameter " << name;
  return Tensor();
}

// Compares the gradient of every parameter of `tp` with the whole model's:
// `shard_dim` names the parameters that are sharded (and along which dim).
absl::Status CompareGrads(const nn::Module& tp, const nn::Module& whole,
                          const std::vector<std::pair<std::string, int64_t>>& shard_dim, int r,
                          int n) {
  for (const auto& [name, p] : whole.named_parameters()) {
    Tensor want = p.grad();
    for (const auto& [sharded, dim] : shard_dim) {
      if (sharded == name) want = Chunk(want, dim, n, r);
    }
    EMBER_RETURN_IF_ERROR(Close(Param(tp, name).grad(), want, absl::StrCat(name, ".grad")));
    // And the values: the shard of the whole parameter.
    Tensor value = p;
    for (const auto& [sharded, dim] : shard_dim) {
      if (sharded == name) value = Chunk(value, dim, n, r);
    }
    EMBER_RETURN_IF_ERROR(Close(Param(tp, name).detach(), value.detach(), name));
  }
  return absl::OkStatus();
}

struct Case {
  std::string backend;
  int ranks;
};

class TensorParallelTest : public ::testing::TestWithParam<Case> {};

TEST_P(TensorParallelTest, MlpColwiseRowwiseMatchesTheWholeModel) {
  const Case c = GetParam();
  RunTp(c.ranks, c.backend, [](const DeviceMesh& tp, int r, int n) -> absl::Status {
    manual_seed(7);
    auto whole = MakeMlp(8, 10);  // hidden 10: uneven shards at TP=4 (3, 3, 3, 1)
    Tensor x = randn({4, 8});
    Tensor w = randn({4, 8});
    EMBER_ASSIGN_OR_RETURN(
        std::shared_ptr<nn::Module> mlp,
        parallelize_module(whole, tp, {{"0", ColwiseParallel{}}, {"2", RowwiseParallel{}}}));
    Tensor xw = x.clone().requires_grad_();
    Tensor y_whole = (*whole)(xw);
    (y_whole * w).sum().backward();
    Tensor xt = x.clone().requires_grad_();
    Tensor y = (*mlp)(xt);
    (y * w).sum().backward();
    EMBER_RETURN_IF_ERROR(Close(y, y_whole, "output"));
    EMBER_RETURN_IF_ERROR(Close(xt.grad(), xw.grad(), "input grad"));
    EMBER_RETURN_IF_ERROR(Check(Param(*mlp, "0.weight").size(0) == Sizes(10, n)[r], "shard rows"));
    return CompareGrads(*mlp, *whole, {{"0.weight", 0}, {"0.bias", 0}, {"2.weight", 1}}, r, n);
  });
}

// The block's plan without and with sequence parallelism.
ParallelizePlan BlockPlan(bool sequence_parallel) {
  if (!sequence_parallel) {
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

const std::vector<std::pair<std::string, int64_t>> kBlockShards = {
    {"attn.q.weight", 0}, {"attn.q.bias", 0}, {"attn.k.weight", 0}, {"attn.k.bias", 0},
    {"attn.v.weight", 0}, {"attn.v.bias", 0}, {"attn.o.weight", 1}, {"fc1.weight", 0},
    {"fc1.bias", 0},      {"fc2.weight", 1}};

absl::Status RunBlock(const DeviceMesh& tp, int r, int n, bool sequence_parallel) {
  manual_seed(11);
  // dim 8 with head_dim 2: 4 heads, so TP=4 gives each rank one head.
  auto whole = std::make_shared<Block>(8, 2, 16);
  Tensor x = randn({2, 4, 8});
  Tensor w = randn({2, 4, 8});
  EMBER_ASSIGN_OR_RETURN(std::shared_ptr<nn::Module> block,
                         parallelize_module(whole, tp, BlockPlan(sequence_parallel)));
  Tensor xw = x.clone().requires_grad_();
  Tensor y_whole = (*whole)(xw);
  (y_whole * w).sum().backward();
  if (!sequence_parallel) {
    Tensor xt = x.clone().requires_grad_();
    Tensor y = (*block)(xt);
    (y * w).sum().backward();
    EMBER_RETURN_IF_ERROR(Close(y, y_whole, "output"));
    EMBER_RETURN_IF_ERROR(Close(xt.grad(), xw.grad(), "input grad"));
  } else {
    // Each rank holds its part of the sequence, in and out.
    Tensor xt = Chunk(x, 1, n, r).contiguous().requires_grad_();
    Tensor y = (*block)(xt);
    (y * Chunk(w, 1, n, r)).sum().backward();
    EMBER_RETURN_IF_ERROR(Close(y, Chunk(y_whole, 1, n, r).contiguous(), "output shard"));
    EMBER_RETURN_IF_ERROR(
        Close(xt.grad(), Chunk(xw.grad(), 1, n, r).contiguous(), "input grad shard"));
  }
  return CompareGrads(*block, *whole, kBlockShards, r, n);
}

TEST_P(TensorParallelTest, TransformerBlockMatchesTheWholeModel) {
  const Case c = GetParam();
  RunTp(c.ranks, c.backend, [](const DeviceMesh& tp, int r, int n) {
    return RunBlock(tp, r, n, /*sequence_parallel=*/false);
  });
}

TEST_P(TensorParallelTest, SequenceParallelBlockMatchesTheWholeModel) {
  const Case c = GetParam();
  RunTp(c.ranks, c.backend, [](const DeviceMesh& tp, int r, int n) {
    return RunBlock(tp, r, n, /*sequence_parallel=*/true);
  });
}

// A Linear to a vocabulary of 10 (uneven at TP=4), cross-entropy on the
// sharded logits, against nn::functional::cross_entropy on the whole ones.
TEST_P(TensorParallelTest, LossParallelCrossEntropy) {
  const Case c = GetParam();
  RunTp(c.ranks, c.backend, [](const DeviceMesh& tp, int r, int n) -> absl::Status {
    for (nn::Reduction reduction :
         {nn::Reduction::kMean, nn::Reduction::kSum, nn::Reduction::kNone}) {
      manual_seed(3);
      auto whole = std::make_shared<nn::Linear>(8, 10);
      Tensor x = randn({6, 8});
      Tensor target = tensor<int64_t>({3, 9, 0, -100, 5, 7});
      const nn::CrossEntropyOptions options{.reduction = reduction};
      EMBER_ASSIGN_OR_RETURN(
          std::shared_ptr<nn::Module> head,
          parallelize_module(whole, tp, {{"", ColwiseParallel{.use_local_output = false}}}));
      Tensor xw = x.clone().requires_grad_();
      Tensor loss_whole = nn::functional::cross_entropy((*whole)(xw), target, options);
      (loss_whole * loss_whole).sum().backward();
      Tensor xt = x.clone().requires_grad_();
      Tensor local_logits = (*head)(xt);
      EMBER_ASSIGN_OR_RETURN(DTensor logits, DTensor::from_local(local_logits, tp, {Shard(-1)},
                                                                 {.shape = SizeVector{6, 10}}));
      EMBER_ASSIGN_OR_RETURN(Tensor loss, loss_parallel_cross_entropy(logits, target, options));
      (loss * loss).sum().backward();
      const std::string what = absl::StrCat("reduction ", static_cast<int>(reduction));
      EMBER_RETURN_IF_ERROR(Close(loss, loss_whole, absl::StrCat(what, " loss")));
      EMBER_RETURN_IF_ERROR(Close(xt.grad(), xw.grad(), absl::StrCat(what, " input grad")));
      EMBER_RETURN_IF_ERROR(CompareGrads(*head, *whole, {{"weight", 0}, {"bias", 0}}, r, n));
    }
    return absl::OkStatus();
  });
}

// Embeddings sharded by columns (Shard(1)) and by rows (Shard(0), masked
// lookups summed), feeding a Linear.
TEST_P(TensorParallelTest, EmbeddingColwiseAndRowwise) {
  const Case c = GetParam();
  RunTp(c.ranks, c.backend, [](const DeviceMesh& tp, int r, int n) -> absl::Status {
    for (bool rowwise : {false, true}) {
      manual_seed(5);
      auto whole = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
          std::make_shared<nn::Embedding>(10, 6), std::make_shared<nn::Linear>(6, 4)});
      Tensor idx = tensor<int64_t>({0, 9, 3, 4, 7, 2, 2, 8}, SizeVector{2, 4});
      Tensor w = randn({2, 4, 4});
      ParallelizePlan plan;
      if (rowwise) {
        plan = {{"0", RowwiseParallel{.input_layouts = Replicate()}}};
      } else {
        plan = {{"0", ColwiseParallel{.output_layouts = Replicate()}}};
      }
      EMBER_ASSIGN_OR_RETURN(std::shared_ptr<nn::Module> tpm, parallelize_module(whole, tp, plan));
      Tensor y_whole = (*whole)(idx);
      (y_whole * w).sum().backward();
      Tensor y = (*tpm)(idx);
      (y * w).sum().backward();
      const std::string what = rowwise ? "rowwise" : "colwise";
      EMBER_RETURN_IF_ERROR(Close(y, y_whole, absl::StrCat(what, " output")));
      EMBER_RETURN_IF_ERROR(CompareGrads(*tpm, *whole, {{"0.weight", rowwise ? 0 : 1}}, r, n));
    }
    return absl::OkStatus();
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, TensorParallelTest,
                         ::testing::Values(Case{"tcp", 2}, Case{"tcp", 4}, Case{"gloo", 2},
                                           Case{"gloo", 4}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return absl::StrCat(info.param.backend, "_", info.param.ranks);
                         });

// TP inside the rows of a 2 x 2 ("dp", "tp") mesh: each row's "tp" group
// (not the default group) carries the layers' collectives, and each row
// runs its own batch.
TEST(TensorParallel2DTest, MlpOverTheTpSubMesh) {
  RunRanksOptions options;
  options.make_group = false;
  ExpectAllSucceeded(RunRankProcesses(
      4,
      [](Rank& me) -> absl::Status {
        EMBER_RETURN_IF_ERROR(Init(me, "tcp"));
        EMBER_RETURN_IF_ERROR(Guard([&]() -> absl::Status {
          EMBER_ASSIGN_OR_RETURN(DeviceMesh mesh,
                                 dist::init_device_mesh("cpu", {2, 2}, {"dp", "tp"}));
          EMBER_ASSIGN_OR_RETURN(DeviceMesh tp, mesh["tp"]);
          const int row = me.rank / 2;
          const int col = me.rank % 2;
          manual_seed(7);
          auto whole = MakeMlp(8, 10);
          manual_seed(100 + row);  // each row its own batch
          Tensor x = randn({4, 8});
          EMBER_ASSIGN_OR_RETURN(
              std::shared_ptr<nn::Module> mlp,
              parallelize_module(whole, tp, {{"0", ColwiseParallel{}}, {"2", RowwiseParallel{}}}));
          Tensor y_whole = (*whole)(x);
          y_whole.sum().backward();
          Tensor y = (*mlp)(x);
          y.sum().backward();
          EMBER_RETURN_IF_ERROR(Close(y, y_whole, "output"));
          return CompareGrads(*mlp, *whole, {{"0.weight", 0}, {"0.bias", 0}, {"2.weight", 1}}, col,
                              2);
        }));
        return dist::destroy_process_group();
      },
      options, absl::Seconds(120)));
}

TEST(TensorParallelErrorsTest, BadPlansNameTheModule) {
  RunTp(2, "tcp", [](const DeviceMesh& tp, int, int) -> absl::Status {
    auto block = std::make_shared<Block>(8, 2, 16);
    absl::StatusOr<std::shared_ptr<nn::Module>> missing =
        parallelize_module(block, tp, {{"attn.x", ColwiseParallel{}}});
    EMBER_RETURN_IF_ERROR(Check(absl::IsInvalidArgument(missing.status()) &&
                                    absl::StrContains(missing.status().message(), "'attn.x'") &&
                                    absl::StrContains(missing.status().message(), "'attn.q'"),
                                missing.status().ToString()));
    absl::StatusOr<std::shared_ptr<nn::Module>> norm =
        parallelize_module(block, tp, {{"ln1", ColwiseParallel{}}});
    EMBER_RETURN_IF_ERROR(Check(absl::IsInvalidArgument(norm.status()) &&
                                    absl::StrContains(norm.status().message(), "'ln1'") &&
                                    absl::StrContains(norm.status().message(), "LayerNorm"),
                                norm.status().ToString()));
    absl::StatusOr<std::shared_ptr<nn::Module>> attn =
        parallelize_module(block, tp, {{"attn", RowwiseParallel{}}});
    EMBER_RETURN_IF_ERROR(Check(absl::IsInvalidArgument(attn.status()) &&
                                    absl::StrContains(attn.status().message(), "'attn'"),
                                attn.status().ToString()));
    absl::StatusOr<std::shared_ptr<nn::Module>> seq =
        parallelize_module(block, tp, {{"fc1", SequenceParallel{}}});
    EMBER_RETURN_IF_ERROR(Check(absl::IsInvalidArgument(seq.status()) &&
                                    absl::StrContains(seq.status().message(), "'fc1'") &&
                                    absl::StrContains(seq.status().message(), "Linear"),
                                seq.status().ToString()));
    auto padded = std::make_shared<nn::Embedding>(10, 4, 0);
    absl::StatusOr<std::shared_ptr<nn::Module>> pad =
        parallelize_module(padded, tp, {{"", RowwiseParallel{.input_layouts = Replicate()}}});
    EMBER_RETURN_IF_ERROR(Check(absl::IsUnimplemented(pad.status()) &&
                                    absl::StrContains(pad.status().message(), "padding_idx"),
                                pad.status().ToString()));
    auto tiny = std::make_shared<nn::Embedding>(1, 4);
    absl::StatusOr<std::shared_ptr<nn::Module>> empty =
        parallelize_module(tiny, tp, {{"", RowwiseParallel{.input_layouts = Replicate()}}});
    EMBER_RETURN_IF_ERROR(Check(absl::IsInvalidArgument(empty.status()) &&
                                    absl::StrContains(empty.status().message(), "without rows"),
                                empty.status().ToString()));
    // A 2-D mesh is refused; its "tp" sub-mesh is what to pass.
    EMBER_ASSIGN_OR_RETURN(DeviceMesh two, dist::init_device_mesh("cpu", {1, 2}, {"dp", "tp"}));
    absl::StatusOr<std::shared_ptr<nn::Module>> two_d =
        parallelize_module(block, two, {{"fc1", ColwiseParallel{}}});
    EMBER_RETURN_IF_ERROR(Check(absl::IsInvalidArgument(two_d.status()) &&
                                    absl::StrContains(two_d.status().message(), "1-D"),
                                two_d.status().ToString()));
    EMBER_ASSIGN_OR_RETURN(DeviceMesh sub, two["tp"]);
    EMBER_ASSIGN_OR_RETURN(std::shared_ptr<nn::Module> ok,
                           parallelize_module(block, sub, {{"fc1", ColwiseParallel{}}}));
    return Check(Param(*ok, "fc1.weight").size(0) == 8, "fc1 sharded over the tp sub-mesh");
  });
}

}  // namespace
}  // namespace ember::parallel
