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
#include "hub/hub_dir.h"
#include "hub/sha256.h"
#include "hub/testing/test_server.h"
#include "nn/module.h"
#include "serialization/serialization.h"
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
    ASSERT_TRUE(ember::save((*resnet)->state_dict(), resnet_file).ok());

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
      entry_points {
        name: "mlp_positional"
        builder: "mlp"
        positional: "pretrained"
        positional: "hidden"
        positional: "depth"
        kwargs { key: "hidden" value { int_value: 5 } }
      }
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
  absl::StatusOr<StateDict> weights = ember::load(*base_ + "/resnet18.pt");
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
  absl::StatusOr<StateDict> weights = ember::load(*base_ + "/resnet_tiny.safetensors");
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
  EXPECT_THAT(s.message(), HasSubstr("mlp, small_cnn, resnet18_tiny, fresh, mlp_positional"));

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
  EXPECT_THAT(*names, ::testing::ElementsAre("ResNet", "deeplab", "entry_with_r_string",
                                             "load_state_dict_from_url", "load_weights", "mlp",
                                             "mobilenet_v2", "resnet18", "small_cnn"));
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
  // pretrained = true loads what the builder publishes; small_cnn's builder
  // publishes nothing.
  options_.pretrained = true;
  s = load("alice/vision", "small_cnn", options_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("builder 'small_cnn' was registered without published "
                                     "weights (builders with weights: resnet18)"));
  EXPECT_THAT(s.message(), HasSubstr("pretrained = false"));
}

// torch.hub.load(repo, model, *args): positional arguments bind to the
// entry point's parameters in order, as Python binds them.
TEST_F(LoadTest, PositionalArguments) {
  // A hubconf.textproto entry listing its positional parameters.
  options_.args = {false, int64_t{16}, int64_t{3}};  // pretrained, hidden, depth
  absl::StatusOr<std::shared_ptr<nn::Module>> model =
      load("alice/models", "mlp_positional", options_);
  ASSERT_TRUE(model.ok()) << model.status();
  StateDict sd = (*model)->state_dict();
  ASSERT_EQ(sd.size(), 6u);  // depth 3
  EXPECT_EQ(sd[0].second.sizes(), (IntArrayRef{16, 4}));
  // Fewer args: the rest from kwargs, then the entry's defaults (hidden 5).
  options_.args = {false};
  options_.kwargs = {{"depth", int64_t{4}}};
  model = load("alice/models", "mlp_positional", options_);
  ASSERT_TRUE(model.ok()) << model.status();
  sd = (*model)->state_dict();
  ASSERT_EQ(sd.size(), 8u);
  EXPECT_EQ(sd[0].second.sizes(), (IntArrayRef{5, 4}));

  // A hubconf.py def: resnet18(pretrained=False, progress=True, **kwargs).
  options_.args = {false, false};
  options_.kwargs = {{"num_classes", int64_t{7}}, {"width", int64_t{4}}};
  model = load("alice/vision", "resnet18", options_);
  ASSERT_TRUE(model.ok()) << model.status();
  (*model)->eval();
  EXPECT_EQ((**model)(randn({1, 3, 32, 32})).sizes(), (IntArrayRef{1, 7}));

  // Python's errors: too many, given twice, a wrong type.
  options_.args = {false, true, int64_t{3}};
  absl::Status s = load("alice/vision", "resnet18", options_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr("entry point resnet18 of alice/vision takes 2 positional arguments "
                        "(pretrained, progress) but 3 were given"));
  options_.args = {false};
  options_.kwargs = {{"pretrained", false}};
  s = load("alice/vision", "resnet18", options_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("got multiple values for argument 'pretrained'"));
  options_.kwargs = {};
  options_.args = {true};
  options_.pretrained = true;
  s = load("alice/vision", "resnet18", options_).status();
  EXPECT_THAT(s.message(), HasSubstr("got multiple values for argument 'pretrained'"));
  options_.pretrained = false;
  options_.args = {int64_t{1}};
  s = load("alice/vision", "resnet18", options_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("argument 'pretrained' must be a bool, got int 1"));
  // A def with no positional parameters, and a textproto entry listing none.
  options_.args = {int64_t{1}};
  s = load("alice/vision", "entry_with_r_string", options_).status();
  EXPECT_THAT(s.message(), HasSubstr("none is registered"));  // no builder: checked first
  s = load("alice/models", "fresh", options_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr("entry point fresh of alice/models takes 0 positional arguments but 1 "
                        "was given"));
}

TEST(BuilderWeightsTest, TorchvisionPublishesResNet18Here) {
  // torchvision.models.ResNet18_Weights.IMAGENET1K_V1's URL.
  std::optional<PublishedWeights> w = builder_weights("resnet18");
  ASSERT_TRUE(w.has_value());
  EXPECT_EQ(w->base_url + "/" + w->file_name,
            "https://download.pytorch.org/models/resnet18-f37072fd.pth");
  EXPECT_FALSE(builder_weights("mlp").has_value());
  EXPECT_FALSE(builder_weights("gpt2").has_value());
  // gpt2's arguments are GPT2Config's.
  absl::StatusOr<std::shared_ptr<nn::Module>> gpt2 =
      build("gpt2", {{"n_embd", int64_t{16}}, {"n_layer", int64_t{1}}, {"n_head", int64_t{2}},
                     {"vocab_size", int64_t{11}}, {"n_positions", int64_t{8}}});
  ASSERT_TRUE(gpt2.ok()) << gpt2.status();
  EXPECT_EQ((*gpt2)->named_parameters().front().second.sizes(), (SizeVector{11, 16}));
  absl::StatusOr<std::shared_ptr<nn::Module>> odd =
      build("gpt2", {{"n_embd", int64_t{15}}, {"n_head", int64_t{2}}});
  EXPECT_THAT(odd.status().message(), HasSubstr("n_embd (15) must be divisible by n_head (2)"));
  EXPECT_FALSE(builder_weights("no_such_builder").has_value());
  Builder any = [](const Kwargs&) { return build("mlp", {}); };
  absl::Status s = register_builder("bad_weights", any, PublishedWeights{"model.pth"});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("'model.pth' must carry the file's SHA-256"));
  s = register_builder("bad_base", any,
                       PublishedWeights{"model-0123abcd.pth", "ftp://mirror.example/models"});
  EXPECT_THAT(s.message(), HasSubstr("'ftp://mirror.example/models' is not an https://"));
  EXPECT_EQ(register_builder("resnet18", any, PublishedWeights{"model-0123abcd.pth"}).code(),
            absl::StatusCode::kAlreadyExists);
}

// The seed's example, torch.hub.load('pytorch/vision', 'resnet18',
// pretrained=True), against a loopback mirror: a hubconf.py that imports
// its models as pytorch/vision's does, and weights torchvision wrote, named
// as torchvision names its files (resnet18-<SHA-256 prefix>.pth, the prefix
// computed by the generator with Python's hashlib).
TEST_F(LoadTest, HubconfPyPretrainedWeightsFromTheBuilderTorchvisionWrote) {
  const std::string gen = *base_ + "/tv1000";
  ASSERT_TRUE(WriteFile(gen + "/.keep", "").ok());
  const std::string cmd = "/usr/bin/python3 hub/testdata/torchvision_resnet18.py " + gen + " 1000";
  int status = std::system(cmd.c_str());
  if (WIFEXITED(status) && WEXITSTATUS(status) == 77) {
    GTEST_SKIP() << "python3-torchvision is not installed; torchvision-written weights are "
                    "unchecked";
  }
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << cmd;
  const std::string name = *ReadFile(gen + "/resnet18.hub_name");
  const std::string weights = *ReadFile(gen + "/resnet18.pt");
  ASSERT_TRUE(WriteFile(*base_ + "/www/models/" + name, weights).ok());
  ASSERT_TRUE(WriteFile(*base_ + "/www/mirror/" + name, weights).ok());
  // What download.pytorch.org's resnet18-f37072fd.pth would be, were it
  // these bytes: a file whose SHA-256 does not start f37072fd.
  ASSERT_TRUE(WriteFile(*base_ + "/www/models/resnet18-f37072fd.pth", weights).ok());

  // A builder mirroring torchvision's resnet18, published under this file
  // name at an address that does not answer (port 1) unless overridden.
  static const bool registered = [&] {
    return register_builder(
               "tv_resnet18", [](const Kwargs& kw) { return build("resnet18", kw); },
               PublishedWeights{name, "https://127.0.0.1:1/models"})
        .ok();
  }();
  ASSERT_TRUE(registered);
  const std::string vision_hubconf =
      "dependencies = [\"torch\"]\n"
      "from torchvision.models.resnet import (\n"
      "    resnet18,\n"
      "    resnet34,\n"
      ")\n\n"
      "def tv_resnet18(pretrained=False, progress=True, **kwargs):\n"
      "    \"\"\"torchvision's resnet18 under another name.\"\"\"\n";
  ASSERT_TRUE(WriteArchive(*base_ + "/www/pytorch/vision/zipball/master", "zip",
                           {{"pytorch-vision-0a1b2c3/hubconf.py", vision_hubconf}})
                  .ok());
  set_dir(*base_ + "/hub_pretrained");
  const std::string cached = *base_ + "/hub_pretrained/checkpoints/" + name;

  options_.pretrained = true;
  options_.weights_base_url = server_->url("/models/");  // a trailing '/' is fine
  absl::StatusOr<std::shared_ptr<nn::Module>> model =
      load("pytorch/vision", "tv_resnet18", options_);
  ASSERT_TRUE(model.ok()) << model.status();
  (*model)->eval();
  auto [x, y] = ReadIo(gen + "/resnet18.io.txt");
  Tensor out = (**model)(x);
  ASSERT_EQ(out.sizes(), (IntArrayRef{2, 1000}));
  EXPECT_LT(MaxAbsDiff(out, y), 1e-4);
  EXPECT_EQ(*ReadFile(cached), weights);
  EXPECT_EQ(*server_->RequestCount("/models/" + name), 1);

  // Cached: the positional form, resnet18(True), loads without a download.
  options_.pretrained = false;
  options_.args = {true};
  model = load("pytorch/vision", "tv_resnet18", options_);
  ASSERT_TRUE(model.ok()) << model.status();
  (*model)->eval();
  EXPECT_LT(MaxAbsDiff((**model)(x), y), 1e-4);
  EXPECT_EQ(*server_->RequestCount("/models/" + name), 1);
  options_.args = {};
  options_.pretrained = true;

  // The mirror from the environment, when the option is empty; the option
  // wins over it.
  set_dir(*base_ + "/hub_env");
  options_.weights_base_url = "";
  setenv(kWeightsBaseUrlEnv, server_->url("/mirror").c_str(), 1);
  ASSERT_TRUE(load("pytorch/vision", "tv_resnet18", options_).ok());
  EXPECT_EQ(*server_->RequestCount("/mirror/" + name), 1);
  set_dir(*base_ + "/hub_option");
  options_.weights_base_url = server_->url("/models");
  ASSERT_TRUE(load("pytorch/vision", "tv_resnet18", options_).ok());
  EXPECT_EQ(*server_->RequestCount("/models/" + name), 2);
  EXPECT_EQ(*server_->RequestCount("/mirror/" + name), 1);
  unsetenv(kWeightsBaseUrlEnv);

  // Neither: the builder's own base, here unreachable.
  set_dir(*base_ + "/hub_default");
  options_.weights_base_url = "";
  options_.download.max_attempts = 1;
  absl::Status s = load("pytorch/vision", "tv_resnet18", options_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(s.message(), HasSubstr("127.0.0.1:1/models/" + name));

  // The imported resnet18 is the built-in builder, which fetches
  // torchvision's resnet18-f37072fd.pth and checks that prefix: these bytes
  // are refused, and nothing is cached.
  set_dir(*base_ + "/hub_pretrained");
  options_.weights_base_url = server_->url("/models");
  s = load("pytorch/vision", "resnet18", options_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), HasSubstr("f37072fd"));
  EXPECT_EQ(*server_->RequestCount("/models/resnet18-f37072fd.pth"), 1);
  EXPECT_FALSE(ReadFile(*base_ + "/hub_pretrained/checkpoints/resnet18-f37072fd.pth").ok());

  // Weights that do not fit what the kwargs build: load_state_dict's message.
  options_.kwargs = {{"num_classes", int64_t{10}}};
  s = load("pytorch/vision", "tv_resnet18", options_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("pretrained weights of pytorch/vision tv_resnet18"));
  options_.kwargs = {};

  // A cached file that no longer matches its name is refused, not loaded.
  ASSERT_TRUE(WriteFile(cached, weights.substr(0, weights.size() - 1) + "!").ok());
  s = load("pytorch/vision", "tv_resnet18", options_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), HasSubstr(cached));
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
