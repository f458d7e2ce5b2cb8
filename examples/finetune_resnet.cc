// Fine-tuning through the hub, the transfer-learning recipe of PyTorch's
// autograd notes in C++: load a pretrained ResNet-18, freeze it, replace its
// classifier with a new Linear and train only that layer.
//
//   bazel run //examples:finetune_resnet
//
// The "published" repository is a local folder this program writes first (a
// hubconf.textproto and a ResNet-18 checkpoint in PyTorch's format), loaded
// with source = kLocal, so the example runs offline. Loading
// "owner/repo" from GitHub or a mirror works the same way.
//
// It then checks what the recipe promises and exits non-zero otherwise: no
// frozen parameter receives a gradient or changes, the new layer does, and the
// loss goes down.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "hub/builders.h"
#include "hub/checkpoint.h"
#include "hub/load.h"
#include "nn/linear.h"
#include "nn/loss.h"
#include "nn/optim/sgd.h"
#include "tensor/factories.h"

namespace {

int Fail(const std::string& why) {
  std::cerr << "finetune_resnet: " << why << "\n";
  return 1;
}

// Writes a repository publishing ResNet-18 with weights, as a model author
// would.
absl::Status PublishRepository(const std::string& dir) {
  std::filesystem::create_directories(dir + "/weights");
  ember::manual_seed(0);
  absl::StatusOr<std::shared_ptr<ember::nn::Module>> pretrained =
      ember::hub::build("resnet18", {});
  if (!pretrained.ok()) return pretrained.status();
  absl::Status saved = ember::hub::save_checkpoint((*pretrained)->state_dict(),
                                                  dir + "/weights/resnet18.pt");
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

}  // namespace

int main() {
  const char* test_tmp = std::getenv("TEST_TMPDIR");
  const std::string repo = (test_tmp ? std::filesystem::path(test_tmp)
                                     : std::filesystem::temp_directory_path()) /
                           "ember_finetune_repo";
  if (absl::Status s = PublishRepository(repo); !s.ok())
    return Fail(std::string(s.message()));

  // model = torch.hub.load(repo, "resnet18", source="local", pretrained=True)
  ember::hub::LoadOptions options;
  options.source = ember::hub::Source::kLocal;
  options.pretrained = true;
  absl::StatusOr<std::shared_ptr<ember::nn::Module>> loaded =
      ember::hub::load(repo, "resnet18", options);
  if (!loaded.ok()) return Fail(std::string(loaded.status().message()));
  std::shared_ptr<ember::nn::Module> model = *loaded;

  // for p in model.parameters(): p.requires_grad = False
  const std::vector<ember::Tensor> pretrained = model->parameters();
  for (const ember::Tensor& p : pretrained) p.requires_grad_(false);

  // model.fc = nn.Linear(512, 2): only the new layer requires grad.
  std::shared_ptr<ember::nn::Linear> fc = model->replace_module(
      "fc", std::make_shared<ember::nn::Linear>(512, 2));
  // The new head took the old one's place: the trunk's tensors, then fc's.
  const std::vector<ember::Tensor> params = model->parameters();
  if (params.size() != pretrained.size() ||
      !params[params.size() - 2].is_same(fc->weight()) ||
      !params.back().is_same(fc->bias()))
    return Fail("the new fc is not the model's last layer");
  const std::vector<ember::Tensor> frozen(params.begin(), params.end() - 2);
  std::vector<ember::Tensor> frozen_before;
  for (const ember::Tensor& p : frozen) frozen_before.push_back(p.clone());
  model->eval();  // the frozen trunk's batch-norm statistics stay as published

  // A small synthetic task: is the image brighter on its left or right half?
  ember::manual_seed(1);
  const int64_t n = 32;
  ember::Tensor images = ember::randn({n, 3, 32, 32});
  ember::Tensor labels = ember::zeros({n}, ember::kInt64);
  for (int64_t i = 0; i < n; ++i) {
    int64_t label = i % 2;
    labels.data_ptr<int64_t>()[i] = label;
    images[i].narrow(2, label * 16, 16).add_(1.5);
  }

  ember::nn::optim::SGD optimizer(fc->parameters(),
                                  {.lr = 0.05, .momentum = 0.9});
  double first_loss = 0, last_loss = 0;
  for (int step = 0; step < 15; ++step) {
    optimizer.zero_grad();
    ember::Tensor loss =
        ember::nn::functional::cross_entropy((*model)(images), labels);
    loss.backward();
    if (step == 0) {
      // No gradient is computed for the frozen part.
      for (const ember::Tensor& p : frozen) {
        if (p.grad().defined())
          return Fail("a frozen parameter received a gradient");
      }
      if (!fc->weight().grad().defined())
        return Fail("the new layer received no gradient");
      ember::IntArrayRef g = fc->weight().grad().sizes();
      std::cout << "after backward: none of the " << frozen.size()
                << " frozen tensors has a .grad; fc.weight.grad has shape ["
                << g[0] << ", " << g[1] << "]\n";
    }
    optimizer.step();
    last_loss = loss.item<double>();
    if (step == 0) first_loss = last_loss;
    std::printf("step %2d  loss %.4f\n", step, last_loss);
  }
  for (size_t i = 0; i < frozen.size(); ++i) {
    if ((frozen[i] - frozen_before[i]).abs().max().item<double>() != 0.0)
      return Fail("a frozen parameter changed");
  }
  if (!(last_loss < first_loss)) return Fail("the loss did not go down");
  std::printf(
      "trained only fc: loss %.4f -> %.4f; the %zu frozen tensors are "
      "unchanged\n",
      first_loss, last_loss, frozen.size());
  std::filesystem::remove_all(repo);
  return 0;
}
