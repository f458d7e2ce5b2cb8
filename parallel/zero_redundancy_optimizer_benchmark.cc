// ZeroRedundancyOptimizer beside plain Adam under DDP: the step of the 4x512
// ReLU MLP with a 10-way head (cross-entropy, Adam lr 1e-3), 2 ranks as
// processes on this host over tcp, batch 32 each, one thread each. The
// protocol of ddp_benchmark.cc: a fresh model, 30 steps, the median of the
// last 25 (counter median_ms).
//
//   bazel run -c opt //parallel:zero_redundancy_optimizer_benchmark
//   <peer python> parallel/torch_zero_redundancy_optimizer_bench.py
//
// Rows: BM_DdpAdamStep (the baseline: every rank holds Adam's whole state)
// and BM_DdpZeroAdamStep/0 and /1 (ZeRO without and with
// parameters_as_bucket_view). Counters: state_bytes_rank0 and
// state_bytes_rank1, the bytes of the optimizer-state tensors each rank
// holds after the steps (for ZeRO, its local optimizer's), and median_ms.
// The peer script runs PyTorch's DDP + Adam and DDP + ZeroRedundancyOptimizer
// the same way and prints the same figures.
//
// The process running the benchmarks is rank 0; it forks rank 1 before
// anything else, which follows its lead: before each benchmark rank 0
// broadcasts what to run and how many steps (untimed).
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "benchmark/benchmark.h"
#include "distributed/distributed.h"
#include "nn/benchmark_mlp.h"
#include "nn/loss.h"
#include "nn/optim/adam.h"
#include "parallel/distributed_data_parallel.h"
#include "parallel/zero_redundancy_optimizer.h"
#include "tensor/factories.h"
#include "tensor/thread_pool.h"

namespace ember::parallel {
namespace {

namespace dist = ::ember::distributed;

constexpr int kWorld = 2;
constexpr int64_t kGlobalBatch = 64;
constexpr int kWidth = 512;
constexpr int kHidden = 4;
constexpr int kClasses = 10;

enum Command : int64_t { kStop = 0, kPlainSteps = 1, kZeroSteps = 2 };

void Check(const absl::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "zero_redundancy_optimizer_benchmark: %s: %s\n", what,
                 s.ToString().c_str());
    std::exit(1);
  }
}

double MedianMs(std::vector<double> ms) {
  if (ms.size() > 5) ms.erase(ms.begin(), ms.begin() + 5);
  std::sort(ms.begin(), ms.end());
  return ms.empty() ? 0 : ms[ms.size() / 2];
}

int64_t StateBytes(const nn::optim::Optimizer& opt) {
  int64_t bytes = 0;
  for (const auto& ps : opt.state_dict().state) {
    for (const auto& [name, t] : ps.values) {
      // Adam's "step" is a number in Ember's state (a tensor only in the
      // state_dict); torch keeps it as a 4-byte tensor, counted the same.
      if (t.defined()) bytes += static_cast<int64_t>(t.nbytes());
    }
  }
  return bytes;
}

// One rank's loop: DDP with plain Adam, or with ZeRO over Adam.
class Runner {
 public:
  Runner(bool zero, bool as_view) {
    dist::Group group = *dist::get_default_group();
    auto ddp = DistributedDataParallel::create(nn::benchmark_mlp(kWidth, kHidden, kClasses),
                                               {.process_group = group});
    Check(ddp.status(), "create");
    ddp_ = *std::move(ddp);
    const nn::optim::AdamOptions adam{.lr = 1e-3};
    if (zero) {
      auto made = ZeroRedundancyOptimizer::Create<nn::optim::Adam>(
          ddp_->parameters(), adam,
          {.process_group = group, .parameters_as_bucket_view = as_view});
      Check(made.status(), "ZeroRedundancyOptimizer");
      zero_ = *std::move(made);
    } else {
      plain_ = std::make_unique<nn::optim::Adam>(ddp_->parameters(), adam);
    }
    manual_seed(100 + group->rank());
    x_ = randn({kGlobalBatch / kWorld, kWidth});
    y_ = randint(0, kClasses, {kGlobalBatch / kWorld});
  }
  double Step() {
    const absl::Time start = absl::Now();
    nn::optim::Optimizer& opt = optimizer();
    opt.zero_grad();
    nn::functional::cross_entropy((*ddp_)(x_), y_).backward();
    if (zero_ != nullptr) {
      Check(zero_->Step(), "step");
    } else {
      plain_->step();
    }
    return absl::ToDoubleMilliseconds(absl::Now() - start);
  }
  // Every rank's state bytes (collective).
  std::vector<int64_t> AllStateBytes() {
    Tensor bytes = zeros({kWorld}, TensorOptions().dtype(kInt64));
    bytes.data_ptr<int64_t>()[dist::get_rank()] =
        StateBytes(zero_ != nullptr ? zero_->local_optimizer() : *plain_);
    Check(dist::all_reduce(bytes), "all_reduce state bytes");
    return {bytes.data_ptr<int64_t>(), bytes.data_ptr<int64_t>() + kWorld};
  }

 private:
  nn::optim::Optimizer& optimizer() {
    return zero_ != nullptr ? static_cast<nn::optim::Optimizer&>(*zero_) : *plain_;
  }
  std::shared_ptr<DistributedDataParallel> ddp_;
  std::unique_ptr<nn::optim::Adam> plain_;
  std::unique_ptr<ZeroRedundancyOptimizer> zero_;
  Tensor x_, y_;
};

void Tell(Command command, int64_t steps, int64_t arg) {
  Tensor message = zeros({3}, TensorOptions().dtype(kInt64));
  message.data_ptr<int64_t>()[0] = command;
  message.data_ptr<int64_t>()[1] = steps;
  message.data_ptr<int64_t>()[2] = arg;
  Check(dist::broadcast(message, 0), "broadcast command");
}

void Follow() {
  for (;;) {
    Tensor message = zeros({3}, TensorOptions().dtype(kInt64));
    Check(dist::broadcast(message, 0), "receive command");
    const int64_t* m = message.data_ptr<int64_t>();
    if (m[0] == kStop) return;
    Runner runner(m[0] == kZeroSteps, m[2] != 0);
    for (int64_t i = 0; i < m[1]; ++i) runner.Step();
    runner.AllStateBytes();
  }
}

void Steps(benchmark::State& state, bool zero, bool as_view) {
  Tell(zero ? kZeroSteps : kPlainSteps, state.max_iterations, as_view ? 1 : 0);
  Runner runner(zero, as_view);
  std::vector<double> ms;
  for (auto _ : state) ms.push_back(runner.Step());
  state.counters["median_ms"] = MedianMs(ms);
  const std::vector<int64_t> bytes = runner.AllStateBytes();
  state.counters["state_bytes_rank0"] = static_cast<double>(bytes[0]);
  state.counters["state_bytes_rank1"] = static_cast<double>(bytes[1]);
}

void BM_DdpAdamStep(benchmark::State& state) { Steps(state, false, false); }
BENCHMARK(BM_DdpAdamStep)->Iterations(30)->Unit(benchmark::kMillisecond)->UseRealTime();

// Argument: parameters_as_bucket_view.
void BM_DdpZeroAdamStep(benchmark::State& state) { Steps(state, true, state.range(0) != 0); }
BENCHMARK(BM_DdpZeroAdamStep)
    ->Arg(0)
    ->Arg(1)
    ->Iterations(30)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace ember::parallel

int main(int argc, char** argv) {
  namespace dist = ::ember::distributed;
  char dir_template[] = "/tmp/ember_zero_benchmark_XXXXXX";
  const char* dir = mkdtemp(dir_template);
  if (dir == nullptr) return 1;
  const std::string init = ::absl::StrCat("file://", dir, "/store");
  const pid_t child = fork();
  const int rank = child == 0 ? 1 : 0;
  ember::set_num_threads(1);
  ember::parallel::Check(dist::init_process_group({.backend = "tcp",
                                                   .init_method = init,
                                                   .world_size = ember::parallel::kWorld,
                                                   .rank = rank}),
                         "init_process_group");
  if (rank == 1) {
    ember::parallel::Follow();
    ember::parallel::Check(dist::destroy_process_group(), "destroy_process_group");
    _exit(0);
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  ember::parallel::Tell(ember::parallel::kStop, 0, 0);
  ember::parallel::Check(dist::destroy_process_group(), "destroy_process_group");
  int status = 0;
  waitpid(child, &status, 0);
  benchmark::Shutdown();
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}
