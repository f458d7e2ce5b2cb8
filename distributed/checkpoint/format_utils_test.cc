// Converters to and from one torch.save file, and through them
// torch.distributed.checkpoint in both directions. PyTorch's side runs on a
// PyTorch 2.x interpreter, the peer tools/install_peers.sh installs (found
// through //base/testing:peers; EMBER_TORCH2_PYTHON names another); without
// one those cases skip, saying why.
#include "distributed/checkpoint/format_utils.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/testing/peers.h"
#include "distributed/checkpoint/checkpoint.h"
#include "distributed/testing/ranks.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "serialization/serialization.h"
#include "tensor/factories.h"

namespace ember::distributed::checkpoint {
namespace {

namespace fs = std::filesystem;
using ::ember::distributed::testing::Rank;
using ::ember::distributed::testing::RunRanks;

constexpr char kScript[] = "distributed/checkpoint/testdata/torch_side.py";

std::string FreshDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  fs::path dir = fs::path(base ? base : "/tmp") / absl::StrCat("dcp_fmt_", ::getpid()) / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

Tensor Global(IntArrayRef shape, Dtype dtype, double start) {
  return arange(Numel(shape), kFloat64).add(start).view(shape).to(dtype);
}

// The same tensors as expected() in testdata/torch_side.py.
std::vector<std::pair<std::string, Tensor>> Expected() {
  return {{"layer.weight", Global({10, 6}, kFloat32, 0)},
          {"layer.bias", Global({6}, kBFloat16, -3)},
          {"embed", Global({5, 7}, kFloat64, 1000)},
          {"steps", Global({3}, kInt64, 40)}};
}

void ExpectSame(const std::vector<std::pair<std::string, Tensor>>& got, const std::string& what) {
  std::vector<std::pair<std::string, Tensor>> want = Expected();
  ASSERT_EQ(got.size(), want.size()) << what;
  for (const auto& [key, w] : want) {
    auto it = std::find_if(got.begin(), got.end(), [&](const auto& p) { return p.first == key; });
    ASSERT_NE(it, got.end()) << what << ": no " << key;
    EXPECT_EQ(it->second.dtype(), w.dtype()) << what << ": " << key;
    EXPECT_TRUE(it->second.sizes() == w.sizes() && it->second.equal(w))
        << what << ": " << key << " " << it->second.ToString();
  }
}

// Saves Expected() from two ranks: the weight by rows, the embedding as flat
// halves, the rest replicated.
void SaveSharded(const std::string& path) {
  absl::Status s = RunRanks(2, [&](Rank& me) {
    const int r = me.rank;
    auto e = Expected();
    StateDict sd = {
        {"layer.weight", shard(e[0].second.narrow(0, 5 * r, 5), {10, 6}, {5 * r, 0})},
        {"layer.bias", replicated(e[1].second)},
        {"embed",
         flat_shard(e[2].second.view({35}).narrow(0, 18 * r, r == 0 ? 18 : 17), {5, 7}, 18 * r)},
        {"steps", replicated(e[3].second)},
    };
    return save(sd, {.path = path, .process_group = me.group});
  });
  ASSERT_TRUE(s.ok()) << s;
}

// The PyTorch 2.x interpreter; empty when there is none.
std::string TorchPython() {
  absl::StatusOr<std::string> py = ::ember::testing::torch2_python();
  return py.ok() ? *py : "";
}

// Empty when PyTorch 2.x with torch.distributed.checkpoint can run here,
// else why not.
std::string NoTorchReason() {
  absl::StatusOr<std::string> found = ::ember::testing::torch2_python();
  if (!found.ok()) return std::string(found.status().message());
  const std::string& py = *found;
  const std::string cmd =
      absl::StrCat(py, " -c 'import torch.distributed.checkpoint.format_utils' >/dev/null 2>&1");
  if (std::system(cmd.c_str()) != 0) {
    return absl::StrCat(py,
                        " cannot import torch.distributed.checkpoint.format_utils "
                        "(PyTorch 2.x is needed)");
  }
  return "";
}

int RunTorch(const std::string& args) {
  const std::string cmd = absl::StrCat(TorchPython(), " ", kScript, " ", args, " 2>&1");
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(FormatUtilsTest, ShardedCheckpointToOneFileAndBack) {
  const std::string dir = FreshDir("roundtrip");
  SaveSharded(dir + "/ckpt");
  ASSERT_TRUE(dcp_to_torch_save(dir + "/ckpt", dir + "/model.pt").ok());
  absl::StatusOr<ember::StateDict> file = ember::load(dir + "/model.pt");
  ASSERT_TRUE(file.ok()) << file.status();
  ExpectSame(*file, "the torch.save file");
  EXPECT_EQ((*file)[0].first, "layer.weight") << "the checkpoint's key order";

  absl::Status s = torch_save_to_dcp(dir + "/model.pt", dir + "/back");
  ASSERT_TRUE(s.ok()) << s;
  absl::StatusOr<std::vector<std::pair<std::string, Tensor>>> back =
      load_full_state_dict(dir + "/back");
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSame(*back, "the converted checkpoint");
}

TEST(FormatUtilsTest, PyTorchReadsWhatEmberWrites) {
  const std::string why = NoTorchReason();
  if (!why.empty()) GTEST_SKIP() << why;
  const std::string dir = FreshDir("to_torch");
  SaveSharded(dir + "/ckpt");
  ASSERT_TRUE(dcp_to_torch_save(dir + "/ckpt", dir + "/model.pt").ok());
  EXPECT_EQ(RunTorch(absl::StrCat("check_torch_save ", dir, "/model.pt")), 0);
  // Into PyTorch's own distributed checkpoint, read back by dcp.load.
  EXPECT_EQ(
      RunTorch(absl::StrCat("torch_save_to_torch_dcp ", dir, "/model.pt ", dir, "/torch_dcp")), 0);
}

TEST(FormatUtilsTest, EmberReadsWhatPyTorchWrites) {
  const std::string why = NoTorchReason();
  if (!why.empty()) GTEST_SKIP() << why;
  const std::string dir = FreshDir("from_torch");
  ASSERT_EQ(RunTorch(absl::StrCat("make_torch_dcp ", dir, "/torch_dcp ", dir, "/model.pt")), 0);
  // PyTorch's directory is not Ember's format (README.md says why) ...
  StateDict direct = {{"embed", replicated(zeros({5, 7}, kFloat64))}};
  absl::Status s = load(direct, {.path = dir + "/torch_dcp"});
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  // ... its converted file is.
  s = torch_save_to_dcp(dir + "/model.pt", dir + "/ckpt");
  ASSERT_TRUE(s.ok()) << s;
  absl::StatusOr<std::vector<std::pair<std::string, Tensor>>> got =
      load_full_state_dict(dir + "/ckpt");
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectSame(*got, "PyTorch's checkpoint");
  // Resharded on the way in: rows 3..7 of the weight.
  StateDict rows = {{"layer.weight", shard(zeros({5, 6}), {10, 6}, {3, 0})}};
  s = load(rows, {.path = dir + "/ckpt"});
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(rows[0].second.tensor.equal(Expected()[0].second.narrow(0, 3, 5)));
}

}  // namespace
}  // namespace ember::distributed::checkpoint
