// The training loop of //examples:train_classifier (classifier_training.h).
#include "examples/classifier_training.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <numbers>
#include <vector>

#include "autograd/grad_mode.h"
#include "nn/activation.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "nn/loss.h"
#include "nn/optim/adam.h"
#include "nn/optim/lr_scheduler.h"
#include "tensor/factories.h"
#include "tensor/tensor.h"

namespace ember::examples {
namespace {

namespace nn = ember::nn;

constexpr int64_t kClasses = 3;

struct Dataset {
  Tensor x;  // [n, 2] float32
  Tensor y;  // [n] int64
};

// `per_class` points on each of kClasses spiral arms, with Gaussian noise on
// the angle.
Dataset MakeSpirals(int64_t per_class, ember::Generator& gen) {
  std::vector<float> xs;
  std::vector<int64_t> ys;
  for (int64_t c = 0; c < kClasses; ++c) {
    for (int64_t i = 0; i < per_class; ++i) {
      const double r = static_cast<double>(i) / static_cast<double>(per_class);
      const double theta = c * 2 * std::numbers::pi / kClasses + r * 4.0 + gen.NextNormal() * 0.2;
      xs.push_back(static_cast<float>(r * std::cos(theta)));
      xs.push_back(static_cast<float>(r * std::sin(theta)));
      ys.push_back(c);
    }
  }
  const int64_t n = per_class * kClasses;
  return {ember::tensor(xs, ember::SizeVector{n, 2}), ember::tensor(ys)};
}

// A random permutation of 0..n-1 (Fisher-Yates).
Tensor Permutation(int64_t n, ember::Generator& gen) {
  std::vector<int64_t> p(n);
  for (int64_t i = 0; i < n; ++i) p[i] = i;
  for (int64_t i = n - 1; i > 0; --i) std::swap(p[i], p[gen.NextInt(0, i + 1)]);
  return ember::tensor(p);
}

double Accuracy(nn::Module& model, const Dataset& data) {
  ember::autograd::NoGradGuard no_grad;
  Tensor predicted = model(data.x).argmax(1);
  return predicted.eq(data.y).to(ember::kFloat32).mean().item<double>();
}

}  // namespace

ClassifierResult train_classifier(const ClassifierOptions& options) {
  const Device device = options.device;
  ember::manual_seed(0);
  ember::Generator data_gen(42);
  Dataset train = MakeSpirals(300, data_gen);
  Dataset test = MakeSpirals(100, data_gen);
  // x = x.to(device): the data move once, the batches are cut on the device.
  for (Dataset* d : {&train, &test}) {
    d->x = d->x.to(device);
    d->y = d->y.to(device);
  }

  auto model = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(2, 64), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(64, 64), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(64, kClasses)});
  model->to(device);  // model.to(device), before the optimizer sees the parameters
  if (options.verbose) std::printf("%s\n", model->str().c_str());

  nn::optim::Adam opt(model->parameters(), {.lr = 0.02});
  nn::optim::CosineAnnealingLR schedule(opt, options.epochs);
  const int64_t n = train.x.size(0);
  ClassifierResult result;

  for (int epoch = 1; epoch <= options.epochs; ++epoch) {
    model->train();
    Tensor order = Permutation(n, data_gen).to(device);
    // The losses stay on the device until the epoch ends: no synchronisation
    // per step.
    Tensor loss_sum = ember::zeros({1}, ember::TensorOptions(ember::kFloat32).device(device));
    int64_t batches = 0;
    for (int64_t start = 0; start < n; start += options.batch) {
      Tensor idx = order.narrow(0, start, std::min(options.batch, n - start));
      Tensor xb = train.x.index_select(0, idx), yb = train.y.index_select(0, idx);
      opt.zero_grad();
      Tensor loss = nn::functional::cross_entropy((*model)(xb), yb);
      loss.backward();
      opt.step();
      {
        ember::autograd::NoGradGuard no_grad;
        loss_sum.add_(loss.detach());
      }
      ++batches;
    }
    schedule.step();
    result.epoch_losses.push_back(loss_sum.item<double>() / static_cast<double>(batches));
    if (options.verbose && (epoch % 10 == 0 || epoch == 1)) {
      model->eval();
      std::printf("epoch %3d  loss %.4f  train accuracy %.3f  lr %.5f\n", epoch,
                  result.epoch_losses.back(), Accuracy(*model, train), schedule.get_last_lr()[0]);
    }
  }
  model->eval();
  result.train_accuracy = Accuracy(*model, train);
  result.test_accuracy = Accuracy(*model, test);
  result.parameters_device = model->parameters().front().device();
  return result;
}

}  // namespace ember::examples
