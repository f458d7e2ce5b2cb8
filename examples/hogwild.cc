// Hogwild: N processes train one logistic-regression model that lives in
// shared memory, each updating it in place without locks (Recht et al.,
// 2011; PyTorch's mnist_hogwild example). The gradient is written out with
// tensor ops, so no autograd is involved.
//
//   bazel run //examples:hogwild -- [--workers=4] [--epochs=5]
//
// Prints the loss before and after training and each worker's last batch
// loss; exits non-zero if the loss did not fall by at least half.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "absl/strings/numbers.h"
#include "multiprocessing/process.h"
#include "multiprocessing/queue.h"
#include "multiprocessing/sharing.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"
#include "tensor/tensor.h"

namespace mp = ember::multiprocessing;
using ember::Tensor;

namespace {

constexpr int64_t kSamples = 8192;
constexpr int64_t kFeatures = 32;
constexpr int64_t kBatch = 64;
constexpr double kLearningRate = 0.5;

struct Model {
  Tensor w;  // [kFeatures]
  Tensor b;  // [1]
};

Tensor Predict(const Model& m, const Tensor& x) {
  return (x.matmul(m.w) + m.b).sigmoid();
}

// Mean binary cross-entropy.
double Loss(const Model& m, const Tensor& x, const Tensor& y) {
  Tensor p = Predict(m, x).clamp(1e-7, 1 - 1e-7);
  return -(y * p.log() + (1 - y) * (1 - p).log()).mean().item<double>();
}

double Accuracy(const Model& m, const Tensor& x, const Tensor& y) {
  return Predict(m, x)
      .gt(0.5)
      .to(ember::kFloat32)
      .eq(y)
      .to(ember::kFloat32)
      .mean()
      .item<double>();
}

// One worker: SGD over its own shuffled batches, writing into the shared
// model in place.
absl::Status Train(int rank, const Model& model, const Tensor& x,
                   const Tensor& y, int epochs, mp::Queue& results) {
  ember::Generator gen(1000 + rank);
  double last = 0;
  for (int epoch = 0; epoch < epochs; ++epoch) {
    Tensor order = ember::randint(0, kSamples, {kSamples / kBatch, kBatch},
                                  ember::kInt64, &gen);
    for (int64_t step = 0; step < order.size(0); ++step) {
      Tensor idx = order[step];
      Tensor xb = x.index_select(0, idx), yb = y.index_select(0, idx);
      Tensor err = Predict(model, xb) - yb;  // d(loss)/d(logit)
      model.w.sub_(xb.t().matmul(err) / kBatch, kLearningRate);
      model.b.sub_(err.mean(), kLearningRate);
    }
    last = Loss(model, x.narrow(0, 0, 512), y.narrow(0, 0, 512));
  }
  return results.Put(mp::Value(mp::Value::List{rank, last}), absl::Seconds(30));
}

absl::Status Run(int workers, int epochs) {
  // A linearly separable problem with label noise.
  ember::manual_seed(0);
  Tensor x = ember::randn({kSamples, kFeatures});
  Tensor truth = ember::randn({kFeatures});
  Tensor y = (x.matmul(truth) + ember::randn({kSamples}) * 0.5)
                 .gt(0)
                 .to(ember::kFloat32);

  Model model{ember::zeros({kFeatures}), ember::zeros({1})};
  EMBER_RETURN_IF_ERROR(mp::share_memory_(model.w));
  EMBER_RETURN_IF_ERROR(mp::share_memory_(model.b));
  const double before = Loss(model, x, y);
  std::printf("hogwild: %d workers, %d epochs, %lld samples x %lld features\n",
              workers, epochs, static_cast<long long>(kSamples),
              static_cast<long long>(kFeatures));
  std::printf("loss before training: %.4f\n", before);

  EMBER_ASSIGN_OR_RETURN(mp::Queue results, mp::Queue::Create());
  mp::SpawnOptions options;
  options.timeout = absl::Minutes(5);
  EMBER_RETURN_IF_ERROR(mp::Spawn(
      [&](int rank) { return Train(rank, model, x, y, epochs, results); },
      workers, options));
  for (int i = 0; i < workers; ++i) {
    EMBER_ASSIGN_OR_RETURN(mp::Value v, results.Get(absl::Seconds(10)));
    std::printf("  worker %lld: last loss %.4f\n",
                static_cast<long long>(*v.list()[0].get_if<int64_t>()),
                *v.list()[1].get_if<double>());
  }
  const double after = Loss(model, x, y);
  std::printf("loss after training:  %.4f (accuracy %.1f%%)\n", after,
              100 * Accuracy(model, x, y));
  if (!(after < 0.5 * before)) {
    return absl::InternalError("the loss did not fall by half: " +
                               std::to_string(after));
  }
  return absl::OkStatus();
}

int FlagOr(int argc, char** argv, std::string_view name, int fallback) {
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    int v = 0;
    if (arg.starts_with(name) &&
        absl::SimpleAtoi(std::string(arg.substr(name.size())), &v) && v > 0) {
      return v;
    }
  }
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  absl::Status s = Run(FlagOr(argc, argv, "--workers=", 4),
                       FlagOr(argc, argv, "--epochs=", 5));
  if (!s.ok()) {
    std::fprintf(stderr, "hogwild: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}
