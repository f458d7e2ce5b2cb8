// Training that survives the loss of a replica group without a restart: each
// process started by `launch --replica_groups` is a replica group of its own
// (parallel/fault_tolerance.h). Before every step the groups ask the
// lighthouse (tools/lighthouse) who takes part; gradients are averaged over
// those; a step in which a group died is discarded by all; launch restarts
// the dead group alone, and it takes the model and the momentum from a
// living peer over the network before its first step.
//
//   bazel build //tools/launch //tools/lighthouse //examples:ft_train
//   lighthouse="bazel-bin/tools/lighthouse/lighthouse --bind=127.0.0.1:29510"
//   $lighthouse --min_replicas=2 --join_timeout_ms=200 --heartbeat_timeout_ms=1000 &
//   launch="bazel-bin/tools/launch/launch --nproc_per_node=3 --replica_groups"
//   $launch --max_restarts=3 --lighthouse=127.0.0.1:29510 bazel-bin/examples/ft_train
//
// The task (as ddp_train's): label = argmax(x W) for a fixed random W; the
// batch of committed step s is 96 rows drawn from seed 1000 + s and split
// over the step's participants, so no sample is lost or trained twice
// whatever fails. Replica group 0 prints the loss and the participants every
// 50 steps, each group its discarded steps and recoveries at the end.
// Options: --steps=N (300), --die_at=N (replica group 1, first run only,
// kills itself with SIGKILL in the middle of step N: a failure to survive).
// Exits non-zero, with the error, when anything fails.
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "autograd/grad_mode.h"
#include "nn/activation.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "nn/loss.h"
#include "nn/optim/sgd.h"
#include "parallel/fault_tolerance.h"
#include "tensor/error.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"

using ember::Tensor;

namespace {

constexpr int64_t kRows = 96;

struct Options {
  int64_t steps = 300;
  int64_t die_at = -1;
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
    } else if (absl::ConsumePrefix(&rest, "--die_at=")) {
      if (!absl::SimpleAtoi(rest, &options.die_at) || options.die_at < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("--die_at must be a step number, got '", rest, "'"));
      }
    } else if (!absl::StartsWith(arg, "--local_rank=")) {  // added by launch
      return absl::InvalidArgumentError(
          absl::StrCat("unknown argument '", arg, "'; expected --steps=N or --die_at=N"));
    }
  }
  return options;
}

// The batch of committed step `step`: 96 rows, labelled by a fixed teacher.
std::pair<Tensor, Tensor> Batch(int64_t step) {
  ember::Generator teacher(7);
  const Tensor w = ember::randn({64, 10}, {}, &teacher);
  ember::Generator gen(1000 + step);
  Tensor x = ember::randn({kRows, 64}, {}, &gen);
  return {x, x.matmul(w).argmax(1)};
}

absl::Status Train(const Options& options) {
  const char* id_env = std::getenv("REPLICA_GROUP_ID");
  const std::string id = id_env != nullptr ? id_env : "";
  const char* restarts = std::getenv("TORCHELASTIC_RESTART_COUNT");
  const bool first_run = restarts == nullptr || std::string(restarts) == "0";
  ember::manual_seed(0);  // every group starts equal; a replacement recovers anyway
  auto model = std::make_shared<ember::nn::Sequential>(std::vector<std::shared_ptr<ember::nn::Module>>{
      std::make_shared<ember::nn::Linear>(64, 256), std::make_shared<ember::nn::ReLU>(),
      std::make_shared<ember::nn::Linear>(256, 256), std::make_shared<ember::nn::ReLU>(),
      std::make_shared<ember::nn::Linear>(256, 10)});
  ember::nn::optim::SGD optimizer(model->parameters(), {.lr = 0.01, .momentum = 0.9});
  // The lighthouse and this group's id come from launch (TORCHFT_LIGHTHOUSE,
  // REPLICA_GROUP_ID).
  EMBER_ASSIGN_OR_RETURN(auto ft, ember::parallel::Manager::create(
                                      model, &optimizer,
                                      {.min_replicas = 2, .timeout = absl::Seconds(5)}));
  while (ft->current_step() < options.steps) {
    if (!ft->start_quorum().ok()) {
      ft->should_commit();  // this step fails; the next quorum makes a new group
      continue;
    }
    const int64_t n = ft->num_participants();
    const int64_t r = ft->participant_rank();
    const auto [x, y] = Batch(ft->current_step());
    optimizer.zero_grad();
    Tensor loss = ember::nn::functional::cross_entropy(
        (*model)(x.narrow(0, r * kRows / n, (r + 1) * kRows / n - r * kRows / n)),
        y.narrow(0, r * kRows / n, (r + 1) * kRows / n - r * kRows / n));
    loss.backward();
    if (id == "1" && first_run && ft->current_step() == options.die_at) ::raise(SIGKILL);
    ft->allreduce_gradients().IgnoreError();  // recorded: should_commit sees it
    if (!ft->should_commit()) continue;       // discarded by every participant
    optimizer.step();
    if (id == "0" && ft->current_step() % 50 == 0) {
      std::printf("step %lld  loss %.4f  (%lld participants, quorum %lld)\n",
                  static_cast<long long>(ft->current_step()), loss.item<double>(),
                  static_cast<long long>(n), static_cast<long long>(ft->quorum_id()));
      std::fflush(stdout);
    }
  }
  std::printf("replica group %s: %lld steps committed, %lld discarded, %lld recoveries\n",
              id.c_str(), static_cast<long long>(ft->current_step()),
              static_cast<long long>(ft->discarded_steps()),
              static_cast<long long>(ft->recoveries()));
  return absl::OkStatus();
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
    std::fprintf(stderr, "ft_train: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
