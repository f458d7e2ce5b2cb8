// Hogwild: N processes train one MLP classifier whose parameters live in
// shared memory, each running its own SGD optimizer with autograd and
// updating the shared weights in place without locks (Recht et al., 2011;
// PyTorch's mnist_hogwild example and its multiprocessing docs).
//
//   bazel run //examples:hogwild -- [--steps=1500] [--procs=1,2]
//
// The setup is the one of ../shared/peers/torch_hogwild.py, so the two
// can be run side by side: an MLP 64 -> 256 -> 256 -> 10 (ReLU),
// cross-entropy, batch 32, lr 0.05, one thread per process, synthetic
// learnable data (labels from a fixed random linear teacher), `steps`
// batches per process. For each process count it prints the wall time,
// samples/s and the accuracy of the shared model on held-out data, in the
// peer's format. Exits non-zero when a run with more processes ends more
// than 3 points below the single-process accuracy, or that one below 80%.
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "autograd/grad_mode.h"
#include "multiprocessing/process.h"
#include "nn/activation.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "nn/loss.h"
#include "nn/optim/sgd.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"
#include "tensor/tensor.h"
#include "tensor/thread_pool.h"

namespace mp = ember::multiprocessing;
namespace nn = ember::nn;
using ember::Tensor;

namespace {

constexpr int64_t kInputs = 64, kHidden = 256, kClasses = 10, kBatch = 32;
constexpr double kLearningRate = 0.05;
constexpr double kTolerance = 0.03;

struct Data {
  Tensor x;  // [n, kInputs]
  Tensor y;  // [n] int64
};

// `n` samples drawn with `seed`, labelled by a fixed linear teacher.
Data MakeData(uint64_t seed, int64_t n) {
  ember::Generator teacher_gen(0), gen(seed);
  Tensor teacher = ember::randn({kInputs, kClasses}, {}, &teacher_gen);
  Tensor x = ember::randn({n, kInputs}, {}, &gen);
  return {x, x.matmul(teacher).argmax(1)};
}

std::shared_ptr<nn::Sequential> MakeModel() {
  ember::manual_seed(1);
  return std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(kInputs, kHidden), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(kHidden, kHidden), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(kHidden, kClasses)});
}

// One worker: its own data and optimizer over the shared parameters. Each
// process accumulates its own gradients; only the weights are shared.
absl::Status Train(int rank, nn::Sequential& model, int64_t steps) {
  ember::set_num_threads(1);
  Data data = MakeData(100 + rank, steps * kBatch);
  nn::optim::SGD opt(model.parameters(), {.lr = kLearningRate});
  for (int64_t i = 0; i < steps; ++i) {
    Tensor xb = data.x.narrow(0, i * kBatch, kBatch);
    Tensor yb = data.y.narrow(0, i * kBatch, kBatch);
    opt.zero_grad();
    nn::functional::cross_entropy(model(xb), yb).backward();
    opt.step();
  }
  return absl::OkStatus();
}

double Accuracy(nn::Sequential& model) {
  ember::autograd::NoGradGuard no_grad;
  Data test = MakeData(7, 4096);
  return model(test.x).argmax(1).eq(test.y).to(ember::kFloat32).mean().item<double>();
}

absl::Status Run(int64_t steps, const std::vector<int>& procs) {
  double single = -1;
  for (int n : procs) {
    std::shared_ptr<nn::Sequential> model = MakeModel();
    EMBER_RETURN_IF_ERROR(model->share_memory());
    mp::SpawnOptions options;
    options.timeout = absl::Minutes(10);
    const absl::Time start = absl::Now();
    EMBER_RETURN_IF_ERROR(
        mp::spawn([&](int rank) { return Train(rank, *model, steps); }, n, options));
    const double wall = absl::ToDoubleSeconds(absl::Now() - start);
    const double accuracy = Accuracy(*model);
    std::printf("ember_hogwild procs=%d steps=%lld wall_s=%.3f samples_per_s=%.0f accuracy=%.3f\n",
                n, static_cast<long long>(steps), wall, n * steps * kBatch / wall, accuracy);
    std::fflush(stdout);
    if (n == 1) single = accuracy;
    if (n == 1 && accuracy < 0.8) {
      return absl::InternalError(absl::StrCat("one process reached only ", accuracy));
    }
    if (single >= 0 && accuracy < single - kTolerance) {
      return absl::InternalError(absl::StrCat(n, " processes reached ", accuracy, ", more than ",
                                              kTolerance, " below one process's ", single));
    }
  }
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  int64_t steps = 1500;
  std::vector<int> procs = {1, 2};
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    bool ok = false;
    if (arg.starts_with("--steps=")) {
      ok = absl::SimpleAtoi(std::string(arg.substr(8)), &steps) && steps > 0;
    } else if (arg.starts_with("--procs=")) {
      procs.clear();
      ok = true;
      for (const std::string& p :
           std::vector<std::string>(absl::StrSplit(std::string(arg.substr(8)), ','))) {
        int n = 0;
        ok &= absl::SimpleAtoi(p, &n) && n > 0;
        procs.push_back(n);
      }
    }
    if (!ok) {
      std::fprintf(stderr, "hogwild: bad argument '%s'; usage: hogwild [--steps=N] [--procs=1,2]\n",
                   argv[i]);
      return 2;
    }
  }
  absl::Status s = Run(steps, procs);
  if (!s.ok()) {
    std::fprintf(stderr, "hogwild: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}
