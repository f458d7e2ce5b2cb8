// ScheduleGPipe beside Schedule1F1B: an MLP of 8 Linear(width, width) + ReLU
// layers cut into p equal stages, p = 2 and 4 ranks as processes on this
// host over tcp (one thread each), a batch of 64 rows in m microbatches
// (default 8), mse_loss, SGD lr 0.01. Each configuration runs 2 untimed
// steps, then --steps timed ones.
//
//   bazel run -c opt //parallel:pipelining_benchmark -- --steps=20 --microbatches=8
//   <peer python> parallel/testdata/torch_pipelining_bench.py --steps=20 --microbatches=8
//
// One line per rank and configuration: the median step time, the idle
// fraction (the time blocked in receives and final send waits over the
// step time, medians over the timed steps) beside the theoretical bubble
// (p - 1) / (m + p - 1), and the most microbatches whose activations the
// rank held at once (GPipe: m; 1F1B: p - stage). The peer script runs
// torch.distributed.pipelining's schedules on the same model (over gloo) and
// prints its step times; torch does not report idle time, so only the
// step times compare.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "distributed/distributed.h"
#include "nn/activation.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "nn/loss.h"
#include "nn/optim/sgd.h"
#include "parallel/pipelining.h"
#include "tensor/factories.h"
#include "tensor/thread_pool.h"

namespace ember::parallel {
namespace {

namespace dist = ::ember::distributed;

constexpr int kLayers = 8;
constexpr int64_t kBatch = 64;

struct Flags {
  int steps = 20;
  int microbatches = 8;
  int64_t width = 512;
};

void Check(const absl::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "pipelining_benchmark: %s: %s\n", what, s.ToString().c_str());
    std::exit(1);
  }
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// One rank of one configuration; prints its line.
void RunRank(int rank, int world, bool one_f_one_b, const Flags& flags, const std::string& init) {
  set_num_threads(1);
  Check(dist::init_process_group(
            {.backend = "tcp", .init_method = init, .world_size = world, .rank = rank}),
        "init_process_group");
  manual_seed(0);
  std::vector<std::shared_ptr<nn::Linear>> layers;
  for (int i = 0; i < kLayers; ++i) {
    layers.push_back(std::make_shared<nn::Linear>(flags.width, flags.width));
  }
  const int per = kLayers / world;
  auto part = std::make_shared<nn::Sequential>();
  for (int i = rank * per; i < (rank + 1) * per; ++i) {
    part->push_back(layers[i]);
    part->push_back(std::make_shared<nn::ReLU>());
  }
  absl::StatusOr<std::shared_ptr<PipelineStage>> stage = PipelineStage::create(part, rank, world);
  Check(stage.status(), "PipelineStage::create");
  ScheduleOptions options{.loss_fn = [](const Tensor& out, const Tensor& y) {
    return nn::functional::mse_loss(out, y);
  }};
  std::unique_ptr<PipelineSchedule> schedule;
  if (one_f_one_b) {
    auto s = Schedule1F1B::create(*stage, flags.microbatches, options);
    Check(s.status(), "Schedule1F1B::create");
    schedule = *std::move(s);
  } else {
    auto s = ScheduleGPipe::create(*stage, flags.microbatches, options);
    Check(s.status(), "ScheduleGPipe::create");
    schedule = *std::move(s);
  }
  nn::optim::SGD opt(part->parameters(), {.lr = 0.01});
  Generator gen(17);
  const Tensor x = randn({kBatch, flags.width}, {}, &gen);
  const Tensor y = randn({kBatch, flags.width}, {}, &gen);
  std::vector<double> step_ms, idle;
  int peak = 0;
  for (int step = 0; step < 2 + flags.steps; ++step) {
    opt.zero_grad();
    Check(schedule->step(rank == 0 ? x : Tensor(), rank == world - 1 ? y : Tensor()).status(),
          "step");
    opt.step();
    if (step < 2) continue;
    const PipelineStepStats& st = schedule->last_step_stats();
    step_ms.push_back(absl::ToDoubleMilliseconds(st.step_time));
    idle.push_back(absl::ToDoubleMilliseconds(st.wait_time) /
                   std::max(1e-9, absl::ToDoubleMilliseconds(st.step_time)));
    peak = std::max(peak, st.peak_in_flight);
  }
  const int m = flags.microbatches;
  const double bubble = static_cast<double>(world - 1) / (m + world - 1);
  const std::string line = absl::StrFormat(
      "%-6s p=%d m=%d rank %d: step %8.2f ms  idle %5.1f%%  (bubble (p-1)/(m+p-1) %5.1f%%)  "
      "peak activations held %d\n",
      one_f_one_b ? "1F1B" : "GPipe", world, m, rank, Median(step_ms), 100 * Median(idle),
      100 * bubble, peak);
  std::fputs(line.c_str(), stdout);
  std::fflush(stdout);
  Check(dist::destroy_process_group(), "destroy_process_group");
}

}  // namespace
}  // namespace ember::parallel

int main(int argc, char** argv) {
  ember::parallel::Flags flags;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--steps=", 8) == 0) flags.steps = std::atoi(argv[i] + 8);
    if (std::strncmp(argv[i], "--microbatches=", 15) == 0) {
      flags.microbatches = std::atoi(argv[i] + 15);
    }
    if (std::strncmp(argv[i], "--width=", 8) == 0) flags.width = std::atoi(argv[i] + 8);
  }
  std::printf("MLP of %d Linear(%lld, %lld)+ReLU, batch %lld, %d microbatches, %d timed steps\n",
              ember::parallel::kLayers, static_cast<long long>(flags.width),
              static_cast<long long>(flags.width), static_cast<long long>(ember::parallel::kBatch),
              flags.microbatches, flags.steps);
  std::fflush(stdout);
  int failures = 0;
  for (int world : {2, 4}) {
    for (bool one_f_one_b : {false, true}) {
      char dir_template[] = "/tmp/ember_pipelining_benchmark_XXXXXX";
      const char* dir = mkdtemp(dir_template);
      if (dir == nullptr) return 1;
      const std::string init = absl::StrCat("file://", dir, "/store");
      std::vector<pid_t> children;
      for (int rank = 0; rank < world; ++rank) {
        const pid_t child = fork();
        if (child == 0) {
          ember::parallel::RunRank(rank, world, one_f_one_b, flags, init);
          _exit(0);
        }
        children.push_back(child);
      }
      for (pid_t child : children) {
        int status = 0;
        waitpid(child, &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failures;
      }
      std::error_code ignored;
      std::filesystem::remove_all(dir, ignored);
    }
  }
  return failures == 0 ? 0 : 1;
}
