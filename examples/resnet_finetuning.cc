// The recipe of //examples:finetune_resnet (resnet_finetuning.h).
#include "examples/resnet_finetuning.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "hub/builders.h"
#include "hub/load.h"
#include "nn/linear.h"
#include "nn/loss.h"
#include "nn/optim/sgd.h"
#include "serialization/serialization.h"
#include "tensor/factories.h"

namespace ember::examples {
namespace {

// Writes a repository publishing ResNet-18 with weights, as a model author
// would.
absl::Status PublishRepository(const std::string& dir) {
  std::filesystem::create_directories(dir + "/weights");
  manual_seed(0);
  absl::StatusOr<std::shared_ptr<nn::Module>> pretrained = hub::build("resnet18", {});
  if (!pretrained.ok()) return pretrained.status();
  absl::Status saved = ember::save((*pretrained)->state_dict(), dir + "/weights/resnet18.pt");
  if (!saved.ok()) return saved;
  std::ofstream(dir + "/hubconf.textproto") << R"pb(
    dependencies: "resnet18"
    entry_points {
      name: "resnet18"
      doc: "ResNet-18 (torchvision layout), 1000 classes."
      builder: "resnet18"
      weights { file: "weights/resnet18.pt" }
    }
  )pb";
  return absl::OkStatus();
}

absl::Status Broken(const std::string& why) {
  return absl::InternalError("finetune_resnet: " + why);
}

}  // namespace

absl::StatusOr<FinetuneResult> finetune_resnet(const FinetuneOptions& options) {
  std::string repo = options.repo_dir;
  if (repo.empty()) {
    const char* test_tmp = std::getenv("TEST_TMPDIR");
    repo = (test_tmp ? std::filesystem::path(test_tmp) : std::filesystem::temp_directory_path()) /
           "ember_finetune_repo";
  }
  if (absl::Status s = PublishRepository(repo); !s.ok()) return s;

  // model = torch.hub.load(repo, "resnet18", source="local", pretrained=True)
  hub::LoadOptions load_options;
  load_options.source = hub::Source::kLocal;
  load_options.pretrained = true;
  absl::StatusOr<std::shared_ptr<nn::Module>> loaded = hub::load(repo, "resnet18", load_options);
  if (!loaded.ok()) return loaded.status();
  std::shared_ptr<nn::Module> model = *loaded;

  // for p in model.parameters(): p.requires_grad = False
  const std::vector<Tensor> pretrained = model->parameters();
  for (const Tensor& p : pretrained) p.requires_grad_(false);

  // model.fc = nn.Linear(512, 2): only the new layer requires grad.
  std::shared_ptr<nn::Linear> fc =
      model->replace_module("fc", std::make_shared<nn::Linear>(512, 2));
  // model.to(device): parameters and buffers (the batch-norm statistics) move.
  model->to(options.device);
  // The new head took the old one's place: the trunk's tensors, then fc's.
  const std::vector<Tensor> params = model->parameters();
  if (params.size() != pretrained.size() || !params[params.size() - 2].is_same(fc->weight()) ||
      !params.back().is_same(fc->bias())) {
    return Broken("the new fc is not the model's last layer");
  }
  const std::vector<Tensor> frozen(params.begin(), params.end() - 2);
  std::vector<Tensor> frozen_before;
  for (const Tensor& p : frozen) frozen_before.push_back(p.clone());
  model->eval();  // the frozen trunk's batch-norm statistics stay as published

  // A small synthetic task: is the image brighter on its left or right half?
  manual_seed(1);
  const int64_t n = 32;
  Tensor images = randn({n, 3, 32, 32});
  Tensor labels = zeros({n}, kInt64);
  for (int64_t i = 0; i < n; ++i) {
    int64_t label = i % 2;
    labels.data_ptr<int64_t>()[i] = label;
    images[i].narrow(2, label * 16, 16).add_(1.5);
  }
  images = images.to(options.device);
  labels = labels.to(options.device);

  nn::optim::SGD optimizer(fc->parameters(), {.lr = 0.05, .momentum = 0.9});
  FinetuneResult result;
  for (int step = 0; step < options.steps; ++step) {
    optimizer.zero_grad();
    Tensor loss = nn::functional::cross_entropy((*model)(images), labels);
    loss.backward();
    if (step == 0) {
      // No gradient is computed for the frozen part.
      for (const Tensor& p : frozen) {
        if (p.grad().defined()) return Broken("a frozen parameter received a gradient");
      }
      if (!fc->weight().grad().defined()) return Broken("the new layer received no gradient");
      IntArrayRef g = fc->weight().grad().sizes();
      if (options.verbose) {
        std::printf(
            "after backward: none of the %zu frozen tensors has a .grad; fc.weight.grad has "
            "shape [%lld, %lld]\n",
            frozen.size(), static_cast<long long>(g[0]), static_cast<long long>(g[1]));
      }
    }
    optimizer.step();
    result.losses.push_back(loss.item<double>());
    if (options.verbose) std::printf("step %2d  loss %.4f\n", step, result.losses.back());
  }
  for (size_t i = 0; i < frozen.size(); ++i) {
    if ((frozen[i] - frozen_before[i]).abs().max().item<double>() != 0.0) {
      return Broken(absl::StrCat("frozen parameter ", i, " changed"));
    }
  }
  if (result.losses.size() >= 2 && !(result.losses.back() < result.losses.front())) {
    return Broken(absl::StrCat("the loss did not go down (", result.losses.front(), " -> ",
                               result.losses.back(), ")"));
  }
  result.frozen_tensors = frozen.size();
  result.parameters_device = fc->weight().device();
  std::filesystem::remove_all(repo);
  return result;
}

}  // namespace ember::examples
