#include "hub/builders.h"

#include <algorithm>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "hub/load_state_dict_from_url.h"
#include "nn/activation.h"
#include "nn/container.h"
#include "nn/conv.h"
#include "nn/linear.h"
#include "nn/models/gpt2.h"
#include "nn/models/resnet.h"
#include "nn/pooling.h"
#include "tensor/error.h"
#include "tensor/status_macros.h"

namespace ember::hub {
namespace {

using ModulePtr = std::shared_ptr<nn::Module>;

absl::StatusOr<ModulePtr> BuildMlp(const Kwargs& kwargs) {
  KwargsReader r("mlp", kwargs);
  int64_t in = r.positive_int("in_features", 4);
  int64_t hidden = r.positive_int("hidden", 8);
  int64_t out = r.positive_int("out_features", 3);
  int64_t depth = r.positive_int("depth", 2);
  EMBER_RETURN_IF_ERROR(r.finish());
  auto net = std::make_shared<nn::Sequential>();
  for (int64_t i = 0; i < depth; ++i) {
    bool last = i + 1 == depth;
    net->push_back(std::make_shared<nn::Linear>(i == 0 ? in : hidden, last ? out : hidden));
    if (!last) net->push_back(std::make_shared<nn::ReLU>());
  }
  return net;
}

absl::StatusOr<ModulePtr> BuildSmallCnn(const Kwargs& kwargs) {
  KwargsReader r("small_cnn", kwargs);
  int64_t in = r.positive_int("in_channels", 3);
  int64_t classes = r.positive_int("num_classes", 4);
  EMBER_RETURN_IF_ERROR(r.finish());
  return std::make_shared<nn::Sequential>(std::vector<ModulePtr>{
      std::make_shared<nn::Conv2d>(in, 8, 3, 1, 1), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::MaxPool2d>(2), std::make_shared<nn::Conv2d>(8, 16, 3, 1, 1),
      std::make_shared<nn::ReLU>(), std::make_shared<nn::AdaptiveAvgPool2d>(nn::Int2{1, 1}),
      std::make_shared<nn::Flatten>(), std::make_shared<nn::Linear>(16, classes)});
}

absl::StatusOr<ModulePtr> BuildResNet18(const Kwargs& kwargs) {
  KwargsReader r("resnet18", kwargs);
  nn::models::ResNetOptions options;
  options.num_classes = r.positive_int("num_classes", options.num_classes);
  options.width = r.positive_int("width", options.width);
  options.in_channels = r.positive_int("in_channels", options.in_channels);
  EMBER_RETURN_IF_ERROR(r.finish());
  return std::make_shared<nn::models::ResNet18>(options);
}

absl::StatusOr<std::shared_ptr<nn::Module>> BuildGpt2(const Kwargs& kwargs) {
  KwargsReader r("gpt2", kwargs);
  nn::models::GPT2Config config;
  config.vocab_size = r.positive_int("vocab_size", config.vocab_size);
  config.n_positions = r.positive_int("n_positions", config.n_positions);
  config.n_embd = r.positive_int("n_embd", config.n_embd);
  config.n_layer = r.positive_int("n_layer", config.n_layer);
  config.n_head = r.positive_int("n_head", config.n_head);
  EMBER_RETURN_IF_ERROR(r.finish());
  if (config.n_embd % config.n_head != 0) {
    return absl::InvalidArgumentError(absl::StrCat("builder gpt2: n_embd (", config.n_embd,
                                                   ") must be divisible by n_head (",
                                                   config.n_head, ")"));
  }
  return std::make_shared<nn::models::GPT2>(config);
}

struct Registered {
  Builder builder;
  std::optional<PublishedWeights> weights;
};

struct Registry {
  absl::Mutex mu;
  std::map<std::string, Registered> builders ABSL_GUARDED_BY(mu) = {
      {"gpt2", {BuildGpt2, std::nullopt}},
      {"mlp", {BuildMlp, std::nullopt}},
      {"small_cnn", {BuildSmallCnn, std::nullopt}},
      // torchvision.models.ResNet18_Weights.IMAGENET1K_V1.
      {"resnet18", {BuildResNet18, PublishedWeights{"resnet18-f37072fd.pth"}}}};
};

Registry& GetRegistry() {
  static auto* registry = new Registry();
  return *registry;
}

absl::Status Register(const std::string& name, Registered entry) {
  Registry& r = GetRegistry();
  absl::MutexLock lock(&r.mu);
  if (!r.builders.emplace(name, std::move(entry)).second) {
    return absl::AlreadyExistsError(
        absl::StrCat("a builder named '", name, "' is already registered"));
  }
  return absl::OkStatus();
}

std::string ArgTypeName(const Arg& a) {
  static const char* names[] = {"int", "float", "bool", "string"};
  return names[a.index()];
}

}  // namespace

int64_t KwargsReader::positive_int(const std::string& name, int64_t fallback) {
  read_.push_back(name);
  auto it = kwargs_.find(name);
  if (it == kwargs_.end()) return fallback;
  const int64_t* v = std::get_if<int64_t>(&it->second);
  if (v == nullptr || *v <= 0) {
    if (error_.empty()) {
      error_ =
          absl::StrCat("builder ", builder_, ": argument '", name, "' must be a positive int, got ",
                       v ? absl::StrCat(*v) : "a " + ArgTypeName(it->second));
    }
    return fallback;
  }
  return *v;
}

absl::Status KwargsReader::finish() const {
  if (!error_.empty()) return absl::InvalidArgumentError(error_);
  for (const auto& [name, value] : kwargs_) {
    if (std::find(read_.begin(), read_.end(), name) == read_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("builder ", builder_, " got an unexpected argument '", name,
                       "' (it takes: ", absl::StrJoin(read_, ", "), ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status register_builder(const std::string& name, Builder builder) {
  return Register(name, {std::move(builder), std::nullopt});
}

absl::Status register_builder(const std::string& name, Builder builder, PublishedWeights weights) {
  if (weights.file_name.find('/') != std::string::npos ||
      hash_prefix_from_file_name(weights.file_name).size() < 8) {
    return absl::InvalidArgumentError(absl::StrCat(
        "builder ", name, ": weights file name '", weights.file_name,
        "' must carry the file's SHA-256 as name-<first 8+ hex digits>.ext, as torchvision "
        "names its files (e.g. resnet18-f37072fd.pth)"));
  }
  if (!absl::StartsWith(weights.base_url, "https://") &&
      !absl::StartsWith(weights.base_url, "http://")) {
    return absl::InvalidArgumentError(absl::StrCat("builder ", name, ": weights base URL '",
                                                   weights.base_url,
                                                   "' is not an https:// (or http://) URL"));
  }
  return Register(name, {std::move(builder), std::move(weights)});
}

std::optional<PublishedWeights> builder_weights(const std::string& name) {
  Registry& r = GetRegistry();
  absl::MutexLock lock(&r.mu);
  auto it = r.builders.find(name);
  if (it == r.builders.end()) return std::nullopt;
  return it->second.weights;
}

std::vector<std::string> builder_names() {
  Registry& r = GetRegistry();
  absl::MutexLock lock(&r.mu);
  std::vector<std::string> names;
  for (const auto& [name, b] : r.builders) names.push_back(name);
  return names;
}

absl::StatusOr<std::shared_ptr<nn::Module>> build(const std::string& name, const Kwargs& kwargs) {
  Builder builder;
  {
    Registry& r = GetRegistry();
    absl::MutexLock lock(&r.mu);
    auto it = r.builders.find(name);
    if (it != r.builders.end()) builder = it->second.builder;
  }
  if (!builder) {
    return absl::NotFoundError(
        absl::StrCat("no builder named '", name,
                     "' is registered (registered: ", absl::StrJoin(builder_names(), ", "), ")"));
  }
  try {
    return builder(kwargs);
  } catch (const Error& e) {  // a layer's argument check (ember::Error) becomes
                              // a Status here
    return absl::InvalidArgumentError(absl::StrCat("builder ", name, ": ", e.what()));
  }
}

}  // namespace ember::hub
