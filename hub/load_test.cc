// torch.hub.load for C++ against a real HTTPS server on loopback: PyTorch's
// weights give PyTorch's outputs, a model loaded through the hub gives the
// same outputs as the same weights loaded directly, and the failure modes.
#include "hub/load.h"

#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>

#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hub/checkpoint.h"
#include "hub/hub_dir.h"
#include "hub/sha256.h"
#include "hub/testing/test_server.h"
#include "nn/module.h"
#include "tensor/factories.h"

namespace ember::hub {
namespace {

using ::ember::hub::testing::ArchiveEntry;
using ::ember::hub::testing::ReadFile;
using ::ember::hub::testing::TestServer;
using ::ember::hub::testing::WriteArchive;
using ::ember::hub::testing::WriteFile;
using ::testing::HasSubstr;

// An "input"/"output" pair written by testdata/make_fixtures.py.
std::pair<Tensor, Tensor> ReadIo(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  Tensor io[2];
  for (int i = 0; i < 2 && std::getline(in, line); ++i) {
    std::vector<std::string> parts = absl::StrSplit(line, ' ', absl::SkipEmpty());
    SizeVector sizes;
    for (absl::string_view s : absl::StrSplit(parts[1], ','))
      sizes.push_back(std::stoll(std::string(s)));
    std::vector<float> values;
    for (size_t k = 2; k < parts.size(); ++k) values.push_back(std::stof(parts[k]));
    io[i] = tensor(values, sizes);
  }
  return {io[0], io[1]};
}

double MaxAbsDiff(const Tensor& a, const Tensor& b) { return (a - b).abs().max().item<double>(); }

class LoadTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string tmp = std::getenv("TEST_TMPDIR");
    base_ = new std::string(tmp);
    std::string mlp = *ReadFile("hub/testdata/mlp_torch.pt");
    std::string cnn = *ReadFile("hub/testdata/small_cnn_torch.pt");
    std::string cnn_name = "small_cnn-" + sha256_hex(cnn).substr(0, 8) + ".pt";
    ASSERT_TRUE(WriteFile(tmp + "/www/w/" + cnn_name, cnn).ok());
    absl::StatusOr<TestServer> s = TestServer::Start(tmp + "/www", tmp + "/server");
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = new TestServer(std::move(*s));

    // Weights for a narrow ResNet-18, made with Ember and saved once.
    manual_seed(7);
    absl::StatusOr<std::shared_ptr<nn::Module>> resnet =
        build("resnet18", {{"num_classes", int64_t{5}}, {"width", int64_t{4}}});
    ASSERT_TRUE(resnet.ok()) << resnet.status();
    std::string resnet_file = tmp + "/resnet_tiny.safetensors";
    ASSERT_TRUE(save_checkpoint((*resnet)->state_dict(), resnet_file).ok());

    std::string hubconf = R"conf(
      dependencies: "mlp"
      dependencies: "small_cnn"
      dependencies: "resnet18"
      entry_points {
        name: "mlp"
        doc: "The MLP of make_fixtures.py, trained by nobody."
        builder: "mlp"
        kwargs { key: "out_features" value { int_value: 3 } }
        weights { file: "weights/mlp_torch.pt" sha256: ")conf" +
                          sha256_hex(mlp) + R"conf(" }
      }
      entry_points {
        name: "small_cnn"
        builder: "small_cnn"
        weights { url: ")conf" +
                          server_->url("/w/" + cnn_name) + R"conf(" sha256: ")conf" +
                          sha256_hex(cnn).substr(0, 16) + R"conf(" }
      }
      entry_points {
        name: "resnet18_tiny"
        builder: "resnet18"
        kwargs { key: "num_classes" value { int_value: 5 } }
        kwargs { key: "width" value { int_value: 4 } }
        weights { file: "weights/resnet_tiny.safetensors" }
      }
      entry_points { name: "fresh" builder: "mlp" }
    )conf";
    ASSERT_TRUE(WriteArchive(tmp + "/www/alice/models/zipball/master", "tar.gz",
                             {{"alice-models-1234abc/hubconf.textproto", hubconf},
                              {"alice-models-1234abc/weights/mlp_torch.pt", mlp},
                              {"alice-models-1234abc/weights/resnet_tiny.safetensors",
                               *ReadFile(resnet_file)}})
                    .ok());
    // A PyTorch-hub repository: only a hubconf.py (and Python code).
    ASSERT_TRUE(WriteArchive(tmp + "/www/alice/vision/zipball/master", "zip",
                             {{"alice-vision-5678def/hubconf.py",
                               *ReadFile("hub/testdata/hubconf_vision/hubconf.py")},
                              {"alice-vision-5678def/_helpers.py", "def load_weights(): pass\n"}})
                    .ok());
    ASSERT_TRUE(
        WriteArchive(tmp + "/www/alice/needs-vit/zipball/master", "zip",
                     {{"r/hubconf.textproto", "dependencies: \"mlp\" dependencies: \"vit\""}})
            .ok());
  }
  static void TearDownTestSuite() {
    delete server_;
    delete base_;
  }
  void SetUp() override {
    set_dir(*base_ + "/hub");
    options_.download.ca_bundle = server_->ca_bundle();
    options_.download.progress = false;
    options_.base_url = server_->base_url();
  }
  void TearDown() override { set_dir(""); }

  static std::string* base_;
  static TestServer* server_;
  LoadOptions options_;
};
std::string* LoadTest::base_ = nullptr;
TestServer* LoadTest::server_ = nullptr;

TEST_F(LoadTest, PyTorchWeightsGivePyTorchOutputs) {
  options_.pretrained = true;
  for (const char* entry : {"mlp", "small_cnn"}) {
    SCOPED_TRACE(entry);
    absl::StatusOr<std::shared_ptr<nn::Module>> model = load("alice/models", entry, options_);
    ASSERT_TRUE(model.ok()) << model.status();
    auto [x, y] = ReadIo(std::string("hub/testdata/") + entry + "_torch.io.txt");
    Tensor out = (**model)(x);
    ASSERT_EQ(out.sizes(), y.sizes());
    EXPECT_LT(MaxAbsDiff(out, y), 1e-5);
  }
}

// torchvision's own resnet18: its state_dict loads into the "resnet18" builder
// (names, shapes and the BN buffers match) and gives torchvision's outputs.
TEST_F(LoadTest, TorchvisionResNet18WeightsGiveTorchvisionOutputs) {
  std::string cmd = "/usr/bin/python3 hub/testdata/torchvision_resnet18.py " + *base_;
  int status = std::system(cmd.c_str());
  if (WIFEXITED(status) && WEXITSTATUS(status) == 77) {
    GTEST_SKIP() << "python3-torchvision is not installed; the torchvision "
                    "comparison is unchecked";
  }
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << cmd;
  absl::StatusOr<std::shared_ptr<nn::Module>> model =
      build("resnet18", {{"num_classes", int64_t{10}}});
  ASSERT_TRUE(model.ok()) << model.status();
  absl::StatusOr<StateDict> weights = load_checkpoint(*base_ + "/resnet18.pt");
  ASSERT_TRUE(weights.ok()) << weights.status();
  ASSERT_TRUE((*model)->load_state_dict(*weights).ok());
  (*model)->eval();
  auto [x, y] = ReadIo(*base_ + "/resnet18.io.txt");
  Tensor out = (**model)(x);
  ASSERT_EQ(out.sizes(), y.sizes());
  EXPECT_LT(MaxAbsDiff(out, y), 1e-4);
}

TEST_F(LoadTest, HubLoadedModelMatchesTheSameWeightsLoadedDirectly) {
  options_.pretrained = true;
  absl::StatusOr<std::shared_ptr<nn::Module>> hub_model =
      load("alice/models", "resnet18_tiny", options_);
  ASSERT_TRUE(hub_model.ok()) << hub_model.status();
  absl::StatusOr<std::shared_ptr<nn::Module>> direct =
      build("resnet18", {{"num_classes", int64_t{5}}, {"width", int64_t{4}}});
  ASSERT_TRUE(direct.ok());
  absl::StatusOr<StateDict> weights = load_checkpoint(*base_ + "/resnet_tiny.safetensors");
  ASSERT_TRUE(weights.ok()) << weights.status();
  ASSERT_TRUE((*direct)->load_state_dict(*weights).ok());
  (*hub_model)->eval();
  (*direct)->eval();
  manual_seed(3);
  Tensor x = randn({2, 3, 32, 32});
  Tensor a = (**hub_model)(x);
  Tensor b = (**direct)(x);
  EXPECT_EQ(a.sizes(), (IntArrayRef{2, 5}));
  EXPECT_EQ(MaxAbsDiff(a, b), 0.0);

  // Without pretrained weights the same entry point is freshly initialised.
  options_.pretrained = false;
  absl::StatusOr<std::shared_ptr<nn::Module>> fresh =
      load("alice/models", "resnet18_tiny", options_);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  (*fresh)->eval();
  EXPECT_GT(MaxAbsDiff((**fresh)(x), a), 1e-4);
}

TEST_F(LoadTest, KwargsOverrideEntryDefaults) {
  options_.kwargs = {{"hidden", int64_t{16}}, {"depth", int64_t{3}}};
  absl::StatusOr<std::shared_ptr<nn::Module>> model = load("alice/models", "fresh", options_);
  ASSERT_TRUE(model.ok()) << model.status();
  StateDict sd = (*model)->state_dict();
  ASSERT_EQ(sd.size(), 6u);
  EXPECT_EQ(sd[0].first, "0.weight");
  EXPECT_EQ(sd[0].second.sizes(), (IntArrayRef{16, 4}));
  EXPECT_EQ(sd[4].first, "4.weight");

  options_.kwargs = {{"hidden", std::string("wide")}};
  absl::Status s = load("alice/models", "fresh", options_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("'hidden' must be a positive int, got a string"));
  options_.kwargs = {{"dropout", 0.5}};
  s = load("alice/models", "fresh", options_).status();
  EXPECT_THAT(s.message(), HasSubstr("unexpected argument 'dropout'"));
}

TEST_F(LoadTest, Failures) {
  absl::Status s = load("alice/needs-vit", "x", options_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("missing dependencies: vit"));

  s = load("alice/models", "resnet50", options_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("mlp, small_cnn, resnet18_tiny, fresh"));

  options_.pretrained = true;
  s = load("alice/models", "fresh", options_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("publishes no weights"));

  // Published weights that do not fit the module: load_state_dict's message.
  options_.kwargs = {{"out_features", int64_t{7}}};
  s = load("alice/models", "mlp", options_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("pretrained weights of alice/models mlp"));
}

TEST_F(LoadTest, HubconfPyRepositoryListsHelpsAndLoads) {
  absl::StatusOr<std::vector<std::string>> names = list("alice/vision", options_);
  ASSERT_TRUE(names.ok()) << names.status();
  EXPECT_THAT(*names, ::testing::ElementsAre("entry_with_r_string", "mlp", "mobilenet_v2",
                                             "resnet18", "small_cnn"));
  absl::StatusOr<std::string> doc = help("alice/vision", "resnet18", options_);
  ASSERT_TRUE(doc.ok()) << doc.status();
  EXPECT_THAT(*doc, ::testing::StartsWith("ResNet-18 model from\n"));
  EXPECT_THAT(*doc, HasSubstr("\nArgs:\n    pretrained (bool):"));

  // Entry points with a registered C++ builder of the same name load.
  options_.kwargs = {{"num_classes", int64_t{10}}, {"width", int64_t{8}}};
  absl::StatusOr<std::shared_ptr<nn::Module>> model = load("alice/vision", "resnet18", options_);
  ASSERT_TRUE(model.ok()) << model.status();
  (*model)->eval();
  EXPECT_EQ((**model)(randn({1, 3, 32, 32})).sizes(), (IntArrayRef{1, 10}));
  options_.kwargs = {};
  EXPECT_TRUE(load("alice/vision", "small_cnn", options_).ok());

  // Others are an error naming the entry point.
  absl::Status s = load("alice/vision", "mobilenet_v2", options_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("entry point mobilenet_v2 of alice/vision is a Python "
                                     "function in its hubconf.py"));
  EXPECT_THAT(s.message(), HasSubstr("resnet18"));
  // Their weights come from Python code, which is not run.
  options_.pretrained = true;
  s = load("alice/vision", "resnet18", options_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("pretrained = false"));
}

TEST_F(LoadTest, PlainHttpWeightsOnlyFromAnHttpBaseUrlsHost) {
  const std::string dir = *base_ + "/http_repo";
  ASSERT_TRUE(WriteFile(dir + "/hubconf.textproto",
                        "entry_points { name: \"m\" builder: \"mlp\" weights { url: "
                        "\"http://127.0.0.1:1/w-0123abcd.pt\" sha256: \"0123abcd\" } }")
                  .ok());
  LoadOptions local;
  local.source = Source::kLocal;
  local.pretrained = true;
  local.download = options_.download;
  local.download.max_attempts = 1;
  local.base_url = "https://127.0.0.1:1";
  absl::Status s = load(dir, "m", local).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_THAT(s.message(), HasSubstr("plain http"));
  // The caller chose a plain-http base URL on that host: allowed (and the
  // download then fails to connect).
  local.base_url = "http://127.0.0.1:1";
  s = load(dir, "m", local).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
}

TEST_F(LoadTest, TamperedWeightsAreCaughtAndForceReloadRepairs) {
  options_.pretrained = true;
  ASSERT_TRUE(load("alice/models", "mlp", options_).ok());
  std::string cached = *base_ + "/hub/alice_models_master/weights/mlp_torch.pt";
  std::string good = *ReadFile(cached);
  ASSERT_TRUE(WriteFile(cached, good.substr(0, good.size() - 1) + "!").ok());
  absl::Status s = load("alice/models", "mlp", options_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("force_reload"));
  options_.force_reload = true;
  EXPECT_TRUE(load("alice/models", "mlp", options_).ok());
  EXPECT_EQ(*ReadFile(cached), good);
}

TEST_F(LoadTest, LocalSourceAndOffline) {
  ASSERT_TRUE(load("alice/models", "fresh", options_).ok());
  LoadOptions local;
  local.source = Source::kLocal;
  local.pretrained = true;
  absl::StatusOr<std::shared_ptr<nn::Module>> model =
      load(*base_ + "/hub/alice_models_master", "mlp", local);
  ASSERT_TRUE(model.ok()) << model.status();
  // Offline (an unreachable base URL): the cached repository still loads.
  options_.base_url = "https://127.0.0.1:1";
  options_.pretrained = true;
  EXPECT_TRUE(load("alice/models", "mlp", options_).ok());
}

}  // namespace
}  // namespace ember::hub
