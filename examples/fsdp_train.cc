// Sharded data-parallel training with a distributed checkpoint: every process
// started by the launch utility trains its share of a small MLP with
// fully_shard (parallel/fully_sharded_data_parallel.h: each rank holds 1/N of
// the parameters, gradients and momentum), then saves a distributed
// checkpoint (distributed/checkpoint/) in which every rank writes its own
// shards, per original parameter. A later run resumes from it on any number
// of processes, here one: it reads the slices its own shards cover, model
// and optimizer state both, and goes on training.
//
//   bazel build //tools/launch //examples:fsdp_train
//   fsdp="bazel-bin/examples/fsdp_train --steps=200 --checkpoint_dir=/tmp/fsdp_ckpt"
//   bazel-bin/tools/launch/launch --nproc_per_node=2 $fsdp
//   bazel-bin/tools/launch/launch --nproc_per_node=1 $fsdp --resume
//
// The task (as ddp_train's): label = argmax(x W) for a fixed random W; each
// rank draws its own samples. Rank 0 prints the loss, the held-out accuracy
// and where it saved or resumed. Options: --steps=N (200), --batch=N (per
// rank, 32), --checkpoint_dir=PATH (fsdp_ckpt), --resume. Exits non-zero,
// with the error, when anything fails.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "autograd/grad_mode.h"
#include "distributed/checkpoint/checkpoint.h"
#include "distributed/distributed.h"
#include "nn/activation.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "nn/loss.h"
#include "nn/optim/sgd.h"
#include "parallel/fully_sharded_data_parallel.h"
#include "parallel/state_dict.h"
#include "tensor/error.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"

namespace dist = ember::distributed;
namespace dcp = ember::distributed::checkpoint;
using ember::Tensor;

namespace {

constexpr int64_t kFeatures = 16;
constexpr int64_t kClasses = 4;

struct Options {
  int steps = 200;
  int64_t batch = 32;
  std::string checkpoint_dir = "fsdp_ckpt";
  bool resume = false;
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
    } else if (absl::ConsumePrefix(&rest, "--checkpoint_dir=")) {
      options.checkpoint_dir = std::string(rest);
    } else if (arg == "--resume") {
      options.resume = true;
    } else if (!absl::StartsWith(arg, "--local_rank=")) {  // added by launch
      return absl::InvalidArgumentError(
          absl::StrCat("unknown argument '", arg,
                       "'; expected --steps=N, --batch=N, --checkpoint_dir=PATH or --resume"));
    }
  }
  return options;
}

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

double HeldOutAccuracy(const Task& task, ember::parallel::FullyShardedDataParallel& fsdp) {
  ember::Generator held_out(7);
  auto [x, y] = task.Sample(2048, held_out);
  ember::autograd::NoGradGuard no_grad;
  return fsdp(x).argmax(1).eq(y).to(ember::kFloat32).mean().item<double>();
}

absl::Status Train(const Options& options) {
  EMBER_RETURN_IF_ERROR(dist::init_process_group({.backend = "gloo"}));
  const int rank = dist::get_rank();
  const int world = dist::get_world_size();
  EMBER_ASSIGN_OR_RETURN(dist::Group group, dist::get_default_group());

  ember::manual_seed(0);
  auto fc1 = std::make_shared<ember::nn::Linear>(kFeatures, 64);
  auto fc2 = std::make_shared<ember::nn::Linear>(64, 64);
  auto model =
      std::make_shared<ember::nn::Sequential>(std::vector<std::shared_ptr<ember::nn::Module>>{
          fc1, std::make_shared<ember::nn::ReLU>(), fc2, std::make_shared<ember::nn::ReLU>(),
          std::make_shared<ember::nn::Linear>(64, kClasses)});
  // Units: fc1 and fc2; the head stays in the root unit.
  EMBER_ASSIGN_OR_RETURN(auto fsdp, ember::parallel::fully_shard(model, {.units = {fc1, fc2}}));
  ember::nn::optim::SGD optimizer(fsdp->parameters(), {.lr = 0.05, .momentum = 0.9});
  // This rank's shards and momentum under the model's own names, plus the
  // step counter: what the checkpoint holds (parallel/state_dict.h).
  EMBER_ASSIGN_OR_RETURN(ember::parallel::ModelStateDict state,
                         ember::parallel::get_state_dict(*fsdp, &optimizer));
  Tensor step_counter = ember::zeros({1}, ember::TensorOptions().dtype(ember::kInt64));
  state.model.emplace_back("train.step", dcp::replicated(step_counter));

  int first_step = 1;
  if (options.resume) {
    EMBER_RETURN_IF_ERROR(
        ember::parallel::load_state_dict(state, &optimizer, {.path = options.checkpoint_dir}));
    first_step = static_cast<int>(step_counter.data_ptr<int64_t>()[0]) + 1;
  }
  const Task task;
  if (options.resume) {
    const double accuracy = HeldOutAccuracy(task, *fsdp);
    if (rank == 0) {
      std::printf("resumed from %s at step %d on %d process(es); held-out accuracy %.4f\n",
                  options.checkpoint_dir.c_str(), first_step - 1, world, accuracy);
    }
  }
  ember::Generator gen(1000 * first_step + rank);
  double window_loss = 0;
  int window_steps = 0;
  const int last_step = first_step + options.steps - 1;
  for (int step = first_step; step <= last_step; ++step) {
    auto [x, y] = task.Sample(options.batch, gen);
    optimizer.zero_grad();
    Tensor loss = ember::nn::functional::cross_entropy((*fsdp)(x), y);
    loss.backward();
    optimizer.step();
    window_loss += loss.item<double>();
    ++window_steps;
    if ((step % 50 == 0 || step == last_step) && rank == 0) {
      std::printf("step %d  loss %.4f  (%d process(es), each holding 1/%d of the state)\n", step,
                  window_loss / window_steps, world, world);
      std::fflush(stdout);
      window_loss = 0;
      window_steps = 0;
    }
  }

  const double accuracy = HeldOutAccuracy(task, *fsdp);
  if (rank == 0) std::printf("held-out accuracy: %.4f\n", accuracy);

  step_counter.data_ptr<int64_t>()[0] = last_step;
  EMBER_RETURN_IF_ERROR(ember::parallel::save_state_dict(
      state, &optimizer, {.path = options.checkpoint_dir, .process_group = group}));
  if (rank == 0) {
    std::printf("saved a distributed checkpoint of step %d from %d process(es) to %s\n", last_step,
                world, options.checkpoint_dir.c_str());
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
    std::fprintf(stderr, "fsdp_train: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
