// SyncBatchNorm against PyTorch 2.x, the peer tools/install_peers.sh installs
// (found through //base/testing:peers; EMBER_TORCH2_PYTHON names another;
// without one these cases skip, saying why). parallel/testdata/
// torch_sync_batch_norm.py computes, in two processes over gloo, what
// torch.nn.SyncBatchNorm gives each rank for the batches this test writes
// with ember::save (torch's batch norm over the all_gathered batch, as its
// SyncBatchNorm is CUDA-only), and lists the layers
// torch.nn.SyncBatchNorm.convert_sync_batchnorm converts in torchvision's
// ResNet-18. Two Ember ranks over gloo must match its files within 1e-6.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "autograd/grad_mode.h"
#include "base/testing/peers.h"
#include "distributed/testing/ranks.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/normalization.h"
#include "parallel/sync_batch_norm.h"
#include "parallel/sync_batch_norm_testing.h"
#include "serialization/serialization.h"
#include "tensor/error.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"

namespace ember::parallel {
namespace {

namespace fs = std::filesystem;
namespace testing = ::ember::distributed::testing;
using ::testing::HasSubstr;

constexpr char kScript[] = "parallel/testdata/torch_sync_batch_norm.py";
constexpr int kWorld = 2;
constexpr int64_t kChannels = 3;
constexpr int kSteps = 3;

// The cases the script knows by name: an image batch (BatchNorm2d) and rows
// (BatchNorm1d, rank 0 holding one row, momentum unset).
struct TorchCase {
  std::string name;
  SizeVector spatial;
  std::vector<int64_t> batch;  // per rank
  std::optional<double> momentum;
};
const std::vector<TorchCase>& TorchCases() {
  static const std::vector<TorchCase> cases = {{"image", {4, 5}, {3, 5}, 0.1},
                                               {"rows", {}, {1, 4}, std::nullopt}};
  return cases;
}

std::string FreshDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  fs::path dir = fs::path(base ? base : "/tmp") / absl::StrCat("sync_bn_", ::getpid()) / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

// Rank `rank`'s batch of `c` at `step` (float64), centred and scaled per rank.
Tensor Batch(const TorchCase& c, int rank, int step, uint64_t salt) {
  SizeVector shape = {c.batch[rank], kChannels};
  shape.insert(shape.end(), c.spatial.begin(), c.spatial.end());
  Generator gen(salt + 10 * step + rank);
  Tensor x = randn(shape, TensorOptions(kFloat64), &gen);
  return salt == 0 ? x * (1.0 + 2 * rank) + 3.0 * rank : x;
}
Tensor Input(const TorchCase& c, int rank, int step) { return Batch(c, rank, step, 0); }
Tensor OutputGrad(const TorchCase& c, int rank, int step) { return Batch(c, rank, step, 900); }
Tensor Weight() { return arange(kChannels, TensorOptions(kFloat64)).mul(0.5).add(0.75); }
Tensor Bias() { return arange(kChannels, TensorOptions(kFloat64)).mul(-0.2).add(0.1); }

// What the script reads from inputs.pt.
StateDict Inputs() {
  StateDict sd;
  for (const TorchCase& c : TorchCases()) {
    sd.emplace_back(c.name + ".steps", full({}, kSteps, TensorOptions(kInt64)));
    sd.emplace_back(c.name + ".momentum",
                    full({}, c.momentum.value_or(-1.0), TensorOptions(kFloat64)));
    sd.emplace_back(c.name + ".weight", Weight());
    sd.emplace_back(c.name + ".bias", Bias());
    for (int r = 0; r < kWorld; ++r) {
      for (int s = 0; s < kSteps; ++s) {
        sd.emplace_back(absl::StrCat(c.name, ".x.", r, ".", s), Input(c, r, s));
        sd.emplace_back(absl::StrCat(c.name, ".gy.", r, ".", s), OutputGrad(c, r, s));
      }
    }
  }
  Generator gen(77);
  sd.emplace_back("fallback.x", randn({6, kChannels, 2, 2}, TensorOptions(kFloat64), &gen));
  sd.emplace_back("fallback.gy", randn({6, kChannels, 2, 2}, TensorOptions(kFloat64), &gen));
  return sd;
}

absl::StatusOr<std::map<std::string, Tensor>> LoadMap(const std::string& path) {
  EMBER_ASSIGN_OR_RETURN(StateDict sd, ember::load(path));
  return std::map<std::string, Tensor>(sd.begin(), sd.end());
}

// OK when |got - want| <= 1e-6 (|want| + 1e-3) everywhere.
absl::Status ExpectClose(const Tensor& got, const Tensor& want, const std::string& what) {
  if (!got.defined() || got.sizes() != want.sizes()) {
    return absl::InternalError(absl::StrCat(what, ": shape ",
                                            got.defined() ? ShapeToString(got.sizes()) : "none",
                                            ", torch's ", ShapeToString(want.sizes())));
  }
  if (got.numel() == 0) return absl::OkStatus();
  Tensor g = got.detach().to(kFloat64), w = want.to(kFloat64);
  const double worst = ((g - w).abs() - (w.abs() + 1e-3) * 1e-6).max().item<double>();
  if (worst > 0) {
    return absl::InternalError(
        absl::StrCat(what, ": differs from torch by up to ", (g - w).abs().max().item<double>()));
  }
  return absl::OkStatus();
}

// This rank's SyncBatchNorm steps against expected.<rank>.pt.
absl::Status CompareRank(testing::Rank& me, const std::string& dir) {
  EMBER_ASSIGN_OR_RETURN(auto expected, LoadMap(absl::StrCat(dir, "/expected.", me.rank, ".pt")));
  auto want = [&](const std::string& key) -> absl::StatusOr<Tensor> {
    auto it = expected.find(key);
    if (it == expected.end()) return absl::NotFoundError(absl::StrCat("torch wrote no ", key));
    return it->second;
  };
  try {
    for (const TorchCase& c : TorchCases()) {
      SyncBatchNorm bn({.num_features = kChannels, .momentum = c.momentum}, me.group);
      bn.to(kFloat64);
      {
        autograd::NoGradGuard no_grad;
        bn.weight().copy_(Weight());
        bn.bias().copy_(Bias());
      }
      for (int s = 0; s < kSteps; ++s) {
        const std::string at = absl::StrCat(c.name, ".", s);
        Tensor x = Input(c, me.rank, s).requires_grad_();
        Tensor y = bn(x);
        (y * OutputGrad(c, me.rank, s)).sum().backward();
        EMBER_ASSIGN_OR_RETURN(Tensor y_want, want("y." + at));
        EMBER_RETURN_IF_ERROR(ExpectClose(y, y_want, "output " + at));
        EMBER_ASSIGN_OR_RETURN(Tensor gx_want, want("gx." + at));
        EMBER_RETURN_IF_ERROR(ExpectClose(x.grad(), gx_want, "input gradient " + at));
        EMBER_ASSIGN_OR_RETURN(Tensor gw_want, want("gw." + at));
        EMBER_RETURN_IF_ERROR(ExpectClose(bn.weight().grad(), gw_want, "weight gradient " + at));
        EMBER_ASSIGN_OR_RETURN(Tensor gb_want, want("gb." + at));
        EMBER_RETURN_IF_ERROR(ExpectClose(bn.bias().grad(), gb_want, "bias gradient " + at));
        EMBER_ASSIGN_OR_RETURN(Tensor rm, want("running_mean." + at));
        EMBER_RETURN_IF_ERROR(ExpectClose(bn.running_mean(), rm, "running_mean " + at));
        EMBER_ASSIGN_OR_RETURN(Tensor rv, want("running_var." + at));
        EMBER_RETURN_IF_ERROR(ExpectClose(bn.running_var(), rv, "running_var " + at));
        EMBER_ASSIGN_OR_RETURN(Tensor nbt, want("num_batches_tracked." + at));
        if (!bn.num_batches_tracked().equal(nbt)) {
          return absl::InternalError("num_batches_tracked differs at " + at);
        }
        // The group's statistics are not this rank's own (the test can fail).
        if (s == 0 && c.batch[me.rank] > 1) {
          Tensor local = nn::functional::batch_norm(x.detach(), Tensor(), Tensor(), bn.weight(),
                                                    bn.bias(), true);
          if ((local - y_want).abs().max().item<double>() < 0.1) {
            return absl::InternalError(at + ": torch's output is this rank's local batch norm");
          }
        }
        bn.zero_grad();
      }
    }
  } catch (const Error& e) {
    return absl::InternalError(e.what());
  }
  return absl::OkStatus();
}

TEST(SyncBatchNormTorchTest, MatchesTorchOnTwoRanksOverGloo) {
  absl::StatusOr<std::string> python = ember::testing::torch2_python();
  if (!python.ok()) GTEST_SKIP() << python.status().message();
  const std::string dir = FreshDir("sync");
  ASSERT_TRUE(ember::save(Inputs(), dir + "/inputs.pt").ok());
  absl::StatusOr<std::string> out = ember::testing::run_torch2(kScript, {"sync", dir});
  ASSERT_TRUE(out.ok()) << out.status();
  // Why the script gathers batches instead of running torch.nn.SyncBatchNorm.
  EXPECT_THAT(*out, HasSubstr("cpu_refusal SyncBatchNorm expected input tensor to be on GPU"));

  testing::RunRanksOptions options;
  options.backend = "gloo";
  const auto results = testing::RunRankProcesses(
      kWorld, [&](testing::Rank& me) { return CompareRank(me, dir); }, options);
  for (const testing::ProcessResult& r : results) EXPECT_EQ(r.exit_code, 0) << r.output;

  // torch.nn.SyncBatchNorm without a process group, and ours.
  absl::StatusOr<std::map<std::string, Tensor>> fallback = LoadMap(dir + "/fallback.pt");
  ASSERT_TRUE(fallback.ok()) << fallback.status();
  const StateDict inputs = Inputs();
  Tensor x = inputs[inputs.size() - 2].second.clone().requires_grad_();
  SyncBatchNorm bn(kChannels);
  bn.to(kFloat64);
  Tensor y = bn(x);
  (y * inputs.back().second).sum().backward();
  EXPECT_TRUE(ExpectClose(y, (*fallback)["fallback.y"], "fallback output").ok());
  EXPECT_TRUE(ExpectClose(x.grad(), (*fallback)["fallback.gx"], "fallback input gradient").ok());
  EXPECT_TRUE(
      ExpectClose(bn.running_var(), (*fallback)["fallback.running_var"], "fallback running_var")
          .ok());
}

TEST(SyncBatchNormTorchTest, ConvertsTheLayersTorchConverts) {
  absl::StatusOr<std::string> python = ember::testing::torch2_python();
  if (!python.ok()) GTEST_SKIP() << python.status().message();
  absl::StatusOr<std::string> out = ember::testing::run_torch2(kScript, {"convert"});
  ASSERT_TRUE(out.ok()) << out.status();
  std::vector<std::string> torch_sync, torch_keys;
  std::istringstream lines(*out);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("sync ", 0) == 0) torch_sync.push_back(line.substr(5));
    if (line.rfind("key ", 0) == 0) torch_keys.push_back(line.substr(4));
  }
  ASSERT_EQ(torch_sync.size(), 20u) << *out;

  auto net = sync_batch_norm_testing::ConvertibleResNet18({.num_classes = 10, .width = 8});
  std::shared_ptr<nn::Module> converted = SyncBatchNorm::convert_sync_batchnorm(net);
  std::vector<std::string> sync, keys;
  for (const auto& [name, m] : converted->named_modules()) {
    if (dynamic_cast<SyncBatchNorm*>(m.get()) != nullptr) sync.push_back(name);
  }
  for (const auto& [key, t] : converted->state_dict()) keys.push_back(key);
  EXPECT_EQ(sync, torch_sync);
  EXPECT_EQ(keys, torch_keys);
}

}  // namespace
}  // namespace ember::parallel
