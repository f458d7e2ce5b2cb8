// Elastic DistributedDataParallel training: the job runs under
// `launch --nnodes=MIN:MAX --rdzv_endpoint=...`, whose rounds may change the
// number of nodes (a node lost, a node added). Rank 0 saves a distributed
// checkpoint (model, optimizer momentum and the step; parallel/state_dict.h)
// every --save_every steps; every
// start, the first and each restart of a new round, resumes from the last
// checkpoint, so the loss goes on where it was rather than starting over.
//
//   bazel build //tools/launch //examples:elastic_train
//   # on each node (1 to 3 of them), the same command:
//   rdzv="--nnodes=1:3 --rdzv_endpoint=HEAD_HOST:29400 --rdzv_id=mlp"
//   bazel-bin/tools/launch/launch --nproc_per_node=2 $rdzv bazel-bin/examples/elastic_train
//
// Options: --steps=N (300), --batch=N (per rank, 32), --save_every=N (20),
// --checkpoint=DIR (elastic_train.ckpt), --step_delay_ms=N (0; slows steps
// down, for tests and demonstrations), --log=PATH (rank 0 appends "round R
// world W step S loss L" per step). Exits non-zero, with the error, when
// anything fails.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
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
#include "distributed/distributed.h"
#include "nn/activation.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "nn/loss.h"
#include "nn/optim/sgd.h"
#include "parallel/distributed_data_parallel.h"
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
  int steps = 300;
  int64_t batch = 32;
  int save_every = 20;
  int step_delay_ms = 0;
  std::string checkpoint = "elastic_train.ckpt";
  std::string log;
};

absl::Status PositiveInt(absl::string_view name, absl::string_view text, int& out, int min) {
  if (!absl::SimpleAtoi(text, &out) || out < min) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, " must be an integer >= ", min, ", got '", text, "'"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Options> ParseArgs(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    absl::string_view rest = argv[i];
    int batch = 0;
    if (absl::ConsumePrefix(&rest, "--steps=")) {
      EMBER_RETURN_IF_ERROR(PositiveInt("steps", rest, options.steps, 1));
    } else if (absl::ConsumePrefix(&rest, "--batch=")) {
      EMBER_RETURN_IF_ERROR(PositiveInt("batch", rest, batch, 1));
      options.batch = batch;
    } else if (absl::ConsumePrefix(&rest, "--save_every=")) {
      EMBER_RETURN_IF_ERROR(PositiveInt("save_every", rest, options.save_every, 1));
    } else if (absl::ConsumePrefix(&rest, "--step_delay_ms=")) {
      EMBER_RETURN_IF_ERROR(PositiveInt("step_delay_ms", rest, options.step_delay_ms, 0));
    } else if (absl::ConsumePrefix(&rest, "--checkpoint=")) {
      options.checkpoint = std::string(rest);
    } else if (absl::ConsumePrefix(&rest, "--log=")) {
      options.log = std::string(rest);
    } else if (!absl::StartsWith(argv[i], "--local_rank=")) {  // added by launch
      return absl::InvalidArgumentError(
          absl::StrCat("unknown argument '", argv[i],
                       "'; expected --steps, --batch, --save_every, --step_delay_ms, "
                       "--checkpoint or --log"));
    }
  }
  return options;
}

// The task: x ~ N(0, 1), label = argmax(x W) for a fixed W.
struct Task {
  Tensor teacher;
  Task() {
    ember::Generator gen(1234);
    teacher = ember::randn({kFeatures, kClasses}, {}, &gen);
  }
  // The batch of `rank` at `step`: the same whichever round draws it.
  std::pair<Tensor, Tensor> Sample(int64_t n, int step, int rank) const {
    ember::Generator gen(1000003 * static_cast<uint64_t>(step) + rank);
    Tensor x = ember::randn({n, kFeatures}, {}, &gen);
    return {x, x.matmul(teacher).argmax(1)};
  }
};

// The checkpoint, a distributed checkpoint (a directory) as
// parallel/state_dict.h names a model's state: the model's parameters, the
// optimizer's momentum buffers and hyperparameters, and the next step
// ("step"). Rank 0 writes it alone (every rank holds the same replicated
// state under DDP); a save replaces the previous checkpoint only once it is
// whole, so a rank killed mid-save leaves the last one.
absl::StatusOr<ember::parallel::ModelStateDict> Checkpoint(ember::nn::Module& model,
                                                           ember::nn::optim::Optimizer& optimizer,
                                                           const Tensor& step) {
  EMBER_ASSIGN_OR_RETURN(ember::parallel::ModelStateDict state,
                         ember::parallel::get_state_dict(model, &optimizer));
  state.model.emplace_back("step", dcp::replicated(step));
  return state;
}

absl::Status Save(const std::string& path, ember::nn::Module& model,
                  ember::nn::optim::Optimizer& optimizer, int next_step) {
  EMBER_ASSIGN_OR_RETURN(
      ember::parallel::ModelStateDict state,
      Checkpoint(model, optimizer, ember::full({1}, next_step, ember::TensorOptions(ember::kInt64))));
  return ember::parallel::save_state_dict(state, &optimizer, {.path = path});
}

// The step to start from: 1 without a checkpoint, else the saved one, with
// the model and optimizer restored in place.
absl::StatusOr<int> Resume(const std::string& path, ember::nn::Module& model,
                           ember::nn::optim::Optimizer& optimizer) {
  if (access(path.c_str(), R_OK) != 0) return 1;
  Tensor step = ember::zeros({1}, ember::TensorOptions(ember::kInt64));
  EMBER_ASSIGN_OR_RETURN(ember::parallel::ModelStateDict state,
                         Checkpoint(model, optimizer, step));
  EMBER_RETURN_IF_ERROR(ember::parallel::load_state_dict(state, &optimizer, {.path = path}));
  return static_cast<int>(step.item<int64_t>());
}

absl::Status Train(const Options& options) {
  EMBER_RETURN_IF_ERROR(dist::init_process_group({.backend = "tcp"}));
  const int rank = dist::get_rank();
  const int world = dist::get_world_size();
  const char* round = std::getenv("EMBER_RDZV_ROUND");
  const char* restarts = std::getenv("TORCHELASTIC_RESTART_COUNT");

  auto model =
      std::make_shared<ember::nn::Sequential>(std::vector<std::shared_ptr<ember::nn::Module>>{
          std::make_shared<ember::nn::Linear>(kFeatures, 64), std::make_shared<ember::nn::ReLU>(),
          std::make_shared<ember::nn::Linear>(64, 64), std::make_shared<ember::nn::ReLU>(),
          std::make_shared<ember::nn::Linear>(64, kClasses)});
  ember::nn::optim::SGD optimizer(model->parameters(), {.lr = 0.05, .momentum = 0.9});
  // Every rank resumes from the same file; DDP then checks they agree.
  EMBER_ASSIGN_OR_RETURN(int first_step, Resume(options.checkpoint, *model, optimizer));
  EMBER_ASSIGN_OR_RETURN(auto ddp, ember::parallel::DistributedDataParallel::create(model));
  if (rank == 0) {
    std::printf("round %s (restart %s): %d processes, resuming at step %d\n", round ? round : "-",
                restarts ? restarts : "0", world, first_step);
    std::fflush(stdout);
  }
  std::ofstream log;
  if (rank == 0 && !options.log.empty()) log.open(options.log, std::ios::app);
  const Task task;
  for (int step = first_step; step <= options.steps; ++step) {
    auto [x, y] = task.Sample(options.batch, step, rank);
    optimizer.zero_grad();
    Tensor loss = ember::nn::functional::cross_entropy((*ddp)(x), y);
    loss.backward();
    optimizer.step();
    if (rank == 0) {
      const double value = loss.item<double>();
      if (log.is_open()) {
        log << "round " << (round ? round : "-") << " world " << world << " step " << step
            << " loss " << value << std::endl;
      }
      if (step % 50 == 0) std::printf("step %d  loss %.4f\n", step, value);
      if (step % options.save_every == 0 || step == options.steps) {
        EMBER_RETURN_IF_ERROR(Save(options.checkpoint, *model, optimizer, step + 1));
      }
    }
    if (options.step_delay_ms > 0) absl::SleepFor(absl::Milliseconds(options.step_delay_ms));
  }
  if (rank == 0) std::printf("done at step %d\n", options.steps);
  return dist::destroy_process_group();
}

}  // namespace

int main(int argc, char** argv) {
  absl::StatusOr<Options> options = ParseArgs(argc, argv);
  if (!options.ok()) {
    std::fprintf(stderr, "elastic_train: %s\n", std::string(options.status().message()).c_str());
    return 2;
  }
  try {
    if (absl::Status s = Train(*options); !s.ok()) {
      std::fprintf(stderr, "elastic_train: %s\n", std::string(s.message()).c_str());
      return 1;
    }
  } catch (const ember::Error& e) {
    std::fprintf(stderr, "elastic_train: %s\n", e.what());
    return 1;
  }
  return 0;
}
