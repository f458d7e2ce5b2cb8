// DistributedDataParallel training: every process started by the launch
// utility trains the same small MLP on its own stream of a synthetic,
// learnable task (the class is the argmax of a fixed random linear map of
// the input); gradients are averaged over the processes during backward
// (parallel/), so the replicas stay equal. Rank 0 prints the loss and the
// throughput over all ranks, the accuracy on held-out data, and saves the
// model as an ordinary checkpoint (loadable by a plain module or PyTorch).
//
//   bazel build //tools/launch //examples:ddp_train
//   bazel-bin/tools/launch/launch --nproc_per_node=2 bazel-bin/examples/ddp_train
//
// Options: --steps=N (300), --batch=N (per rank, 32), --checkpoint=PATH
// (ddp_train.pt). Exits non-zero, with the error, when anything fails.
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "autograd/grad_mode.h"
#include "distributed/distributed.h"
#include "nn/activation.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "nn/loss.h"
#include "nn/optim/sgd.h"
#include "parallel/distributed_data_parallel.h"
#include "serialization/serialization.h"
#include "tensor/error.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"

namespace dist = ember::distributed;
using ember::Tensor;

namespace {

constexpr int64_t kFeatures = 16;
constexpr int64_t kClasses = 4;

struct Options {
  int steps = 300;
  int64_t batch = 32;
  std::string checkpoint = "ddp_train.pt";
};

absl::StatusOr<Options> ParseArgs(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    absl::string_view rest = arg;
    if (absl::ConsumePrefix(&rest, "--steps=")) {
      if (!absl::SimpleAtoi(rest, &options.steps) || options.steps < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("--steps must be a positive integer, got '", rest, "'"));
      }
    } else if (absl::ConsumePrefix(&rest, "--batch=")) {
      if (!absl::SimpleAtoi(rest, &options.batch) || options.batch < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("--batch must be a positive integer, got '", rest, "'"));
      }
    } else if (absl::ConsumePrefix(&rest, "--checkpoint=")) {
      options.checkpoint = std::string(rest);
    } else if (!absl::StartsWith(arg, "--local_rank=")) {  // added by launch
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown argument '", arg, "'; expected --steps=N, --batch=N or --checkpoint=PATH"));
    }
  }
  return options;
}

// The task: x ~ N(0, 1), label = argmax(x W) for a fixed W, the same on every
// rank; each rank draws its own samples.
struct Task {
  Tensor teacher;
  Task() {
    ember::Generator gen(1234);
    teacher = ember::randn({kFeatures, kClasses}, {}, &gen);
  }
  std::pair<Tensor, Tensor> Sample(int64_t n, ember::Generator& gen) const {
    Tensor x = ember::randn({n, kFeatures}, {}, &gen);
    return {x, x.matmul(teacher).argmax(1)};
  }
};

absl::Status Train(const Options& options) {
  EMBER_RETURN_IF_ERROR(dist::init_process_group({.backend = "tcp"}));
  const int rank = dist::get_rank();
  const int world = dist::get_world_size();

  ember::manual_seed(rank);  // DDP starts every rank from rank 0's parameters
  auto model =
      std::make_shared<ember::nn::Sequential>(std::vector<std::shared_ptr<ember::nn::Module>>{
          std::make_shared<ember::nn::Linear>(kFeatures, 64), std::make_shared<ember::nn::ReLU>(),
          std::make_shared<ember::nn::Linear>(64, 64), std::make_shared<ember::nn::ReLU>(),
          std::make_shared<ember::nn::Linear>(64, kClasses)});
  EMBER_ASSIGN_OR_RETURN(auto ddp, ember::parallel::DistributedDataParallel::create(model));
  ember::nn::optim::SGD optimizer(ddp->parameters(), {.lr = 0.05, .momentum = 0.9});

  const Task task;
  ember::Generator gen(1000 + rank);
  if (rank == 0) {
    std::printf("training on %d processes, batch %lld per process\n", world,
                static_cast<long long>(options.batch));
  }
  absl::Time window_start = absl::Now();
  double window_loss = 0;
  int window_steps = 0;
  for (int step = 1; step <= options.steps; ++step) {
    auto [x, y] = task.Sample(options.batch, gen);
    optimizer.zero_grad();
    Tensor loss = ember::nn::functional::cross_entropy((*ddp)(x), y);
    loss.backward();
    optimizer.step();
    window_loss += loss.item<double>();
    ++window_steps;
    if (step % 50 == 0 || step == options.steps) {
      const double seconds = absl::ToDoubleSeconds(absl::Now() - window_start);
      if (rank == 0) {
        std::printf("step %d  loss %.4f  %.0f samples/s over %d processes\n", step,
                    window_loss / window_steps,
                    static_cast<double>(window_steps * options.batch * world) / seconds, world);
        std::fflush(stdout);
      }
      window_start = absl::Now();
      window_loss = 0;
      window_steps = 0;
    }
  }

  if (rank == 0) {
    ember::Generator held_out(7);
    auto [x, y] = task.Sample(2048, held_out);
    ember::autograd::NoGradGuard no_grad;
    const double accuracy = (*model)(x).argmax(1).eq(y).to(ember::kFloat32).mean().item<double>();
    std::printf("held-out accuracy: %.4f\n", accuracy);
    EMBER_RETURN_IF_ERROR(ember::save(ddp->module()->state_dict(), options.checkpoint));
    std::printf("saved checkpoint to %s\n", options.checkpoint.c_str());
  }
  return dist::destroy_process_group();
}

}  // namespace

int main(int argc, char** argv) {
  absl::StatusOr<Options> options = ParseArgs(argc, argv);
  absl::Status status = options.status();
  if (status.ok()) {
    try {
      status = Train(*options);
    } catch (const ember::Error& e) {
      status = absl::InternalError(e.what());
    }
  }
  if (!status.ok()) {
    std::fprintf(stderr, "ddp_train: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
