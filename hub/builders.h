// The registry of model builders: the C++ functions a hubconf entry point
// names in its `builder` field.
//
//   ```cpp
//   #include "hub/builders.h"
//   #include "nn/linear.h"
//   ember::hub::Kwargs args = {{"num_classes", int64_t{10}}};
//   EMBER_ASSIGN_OR_RETURN(std::shared_ptr<ember::nn::Module> m,
//                          ember::hub::build("resnet18", args));
//
//   // A library adds its own family once, before loading:
//   EMBER_RETURN_IF_ERROR(ember::hub::register_builder(
//       "my_net", [](const ember::hub::Kwargs& kw)
//                     -> absl::StatusOr<std::shared_ptr<ember::nn::Module>> {
//         return std::make_shared<ember::nn::Linear>(4, 2);
//       }));
//   ```
//
// Built in (arguments and defaults):
//   mlp        in_features=4, hidden=8, out_features=3, depth=2 (Linear layers);
//              Sequential(Linear, ReLU, ..., Linear), names "0.weight",
//              "2.bias", ...
//   small_cnn  in_channels=3, num_classes=4: Sequential(Conv2d(3x3, 8), ReLU,
//              MaxPool2d(2), Conv2d(3x3, 16), ReLU, AdaptiveAvgPool2d(1),
//              Flatten, Linear(16, num_classes))
//   resnet18   num_classes=1000, width=64, in_channels=3 (resnet.h)
//   gpt2       vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12,
//              n_head=12 (nn/models/gpt2.h: Hugging Face's GPT-2 layout; its
//              published weights are safetensors on the Hugging Face hub,
//              which GPT2::from_safetensors reads from a local copy)
// Each matches the torch.nn model of the same structure name for name, so
// PyTorch state_dicts load into them (gpt2: Hugging Face's GPT2Model names).
//
// A builder that mirrors a torchvision model may also say where torchvision
// publishes that model's weights (as torchvision's own model code does):
// load() fetches them for `pretrained = true` on a hubconf.py entry point
// built by it (load.h). Built in: resnet18 ->
// https://download.pytorch.org/models/resnet18-f37072fd.pth (torchvision's
// IMAGENET1K_V1 weights, for the default arguments: 1000 classes, width 64,
// 3 input channels).
//
// Thread-safety: register_builder, builder_names and build may be called from
// any thread.
#ifndef EMBER_HUB_BUILDERS_H_
#define EMBER_HUB_BUILDERS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "nn/module.h"

namespace ember::hub {

// One keyword argument's value.
using Arg = std::variant<int64_t, double, bool, std::string>;
using Kwargs = std::map<std::string, Arg>;
using Builder = std::function<absl::StatusOr<std::shared_ptr<nn::Module>>(const Kwargs& kwargs)>;

// Where torchvision publishes its model weights.
inline constexpr char kTorchvisionWeightsBaseUrl[] = "https://download.pytorch.org/models";

// The weights published for what a builder builds with its default
// arguments: <base_url>/<file_name>, the file name carrying a prefix of the
// file's SHA-256 as torchvision names its files ("name-<hex>.ext"), checked
// when loaded (load_state_dict_from_url's check_hash).
struct PublishedWeights {
  std::string file_name;  // e.g. "resnet18-f37072fd.pth"
  std::string base_url = kTorchvisionWeightsBaseUrl;
};

// Adds `builder` under `name`. Errors: AlreadyExists.
absl::Status register_builder(const std::string& name, Builder builder);
// The same, with the weights published for it. Errors: AlreadyExists;
// InvalidArgument when `weights.file_name` carries no hash prefix of 8 or
// more hex digits ("name-<hex>.ext") or `weights.base_url` is not an
// http(s) URL.
absl::Status register_builder(const std::string& name, Builder builder, PublishedWeights weights);

// Every registered name, sorted.
std::vector<std::string> builder_names();

// The weights registered with builder `name`, or nullopt (none published,
// or no such builder).
std::optional<PublishedWeights> builder_weights(const std::string& name);

// Calls the builder `name` with `kwargs`. Errors: NotFound listing the
// builders; InvalidArgument for an unknown argument, a wrong type or a bad
// value (naming the builder and the argument).
absl::StatusOr<std::shared_ptr<nn::Module>> build(const std::string& name, const Kwargs& kwargs);

// Reads a builder's arguments with defaults, then rejects any it did not read.
//   KwargsReader r("mlp", kwargs);
//   int64_t hidden = r.Int("hidden", 8);
//   EMBER_RETURN_IF_ERROR(r.finish());
class KwargsReader {
 public:
  KwargsReader(std::string builder, const Kwargs& kwargs)
      : builder_(std::move(builder)), kwargs_(kwargs) {}
  // A positive integer argument (or `fallback` when absent).
  int64_t positive_int(const std::string& name, int64_t fallback);
  // InvalidArgument for the first type error or unread argument, else OK.
  absl::Status finish() const;

 private:
  std::string builder_;
  const Kwargs& kwargs_;
  std::vector<std::string> read_;
  std::string error_;
};

}  // namespace ember::hub

#endif  // EMBER_HUB_BUILDERS_H_
