// The forward+backward step of ResNet-18 (nn::models::ResNet18's layout, 10
// classes, torchvision's) on 2 ranks over gloo, batch 8 per rank of 3x64x64
// images, cross-entropy, one thread per rank; 30 steps, the median of the
// last 25 (counters median_ms, wall, and cpu_ms, rank 0's process CPU time
// per step). Rows (BM_ResNetStep/<layer>/<ddp>):
//   0/1  BatchNorm2d under DistributedDataParallel: the in-binary baseline;
//   1/1  SyncBatchNorm (convert_sync_batchnorm over DDP's group) under DDP;
//   2/1  the same with SyncBatchNorm over a group of its own (new_group), so
//        that its collectives do not queue behind DDP's bucket all_reduces;
//   0/0, 1/0  both layers without DDP (each rank keeps its gradients): the
//        synchronisation's own cost, one all_gather in forward and one
//        all_reduce in backward for each of the 20 layers.
// BM_LayerStep/<layer> times one layer alone on [8, 64, 32, 32] (ResNet-18's
// first batch norm here). parallel/torch_sync_batch_norm_bench.py times the
// four ResNet-18 configurations in PyTorch 2.x.
//
//   bazel build //parallel:sync_batch_norm_benchmark
//   OPENBLAS_NUM_THREADS=1 bazel-bin/parallel/sync_batch_norm_benchmark
//
// EMBER_SYNC_BN_BENCHMARK_BACKEND=tcp runs the same rows over Ember's tcp
// backend instead.
//
// The model is nn::models::ResNet18 with its blocks made convertible
// (parallel/sync_batch_norm_testing.h: nn::models' BasicBlock refuses
// replace_module), the same modules and parameters.
//
// The process running the benchmarks is rank 0; it forks rank 1 before
// anything else, which follows its lead: before each benchmark rank 0
// broadcasts what to run and how many steps (untimed).
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "benchmark/benchmark.h"
#include "distributed/distributed.h"
#include "nn/loss.h"
#include "nn/normalization.h"
#include "parallel/distributed_data_parallel.h"
#include "parallel/sync_batch_norm.h"
#include "parallel/sync_batch_norm_testing.h"
#include "tensor/factories.h"
#include "tensor/thread_pool.h"

namespace ember::parallel {
namespace {

namespace dist = ::ember::distributed;

constexpr int kWorld = 2;
constexpr int64_t kBatchPerRank = 8;
constexpr int64_t kImageSize = 64;
constexpr int64_t kClasses = 10;

enum Command : int64_t { kStop = 0, kSteps = 1, kLayerSteps = 2 };

void Check(const absl::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "sync_batch_norm_benchmark: %s: %s\n", what, s.ToString().c_str());
    std::exit(1);
  }
}

// Per-step times; the median of all but the first five.
double MedianMs(std::vector<double> ms) {
  if (ms.size() > 5) ms.erase(ms.begin(), ms.begin() + 5);
  std::sort(ms.begin(), ms.end());
  return ms.empty() ? 0 : ms[ms.size() / 2];
}

// A step's wall time and this process's CPU time (every thread: the
// compute and the process group's), in ms. The CPU time hardly moves with
// the machine's load, which stretches the wall time of every collective.
struct Times {
  double wall_ms = 0, cpu_ms = 0;
};
class Clock {
 public:
  Clock() : wall_(absl::Now()), cpu_(std::clock()) {}
  Times Elapsed() const {
    return {absl::ToDoubleMilliseconds(absl::Now() - wall_),
            1e3 * static_cast<double>(std::clock() - cpu_) / CLOCKS_PER_SEC};
  }

 private:
  absl::Time wall_;
  std::clock_t cpu_;
};

// Runs `step` for every iteration of `state`; counters median_ms (wall) and
// cpu_ms (median process CPU time per step).
template <typename Runner>
void Measure(benchmark::State& state, Runner& runner) {
  std::vector<double> wall, cpu;
  for (auto _ : state) {
    const Times t = runner.Step();
    wall.push_back(t.wall_ms);
    cpu.push_back(t.cpu_ms);
  }
  state.counters["median_ms"] = MedianMs(wall);
  state.counters["cpu_ms"] = MedianMs(cpu);
}

// One rank's forward+backward loop, with SyncBatchNorm or BatchNorm2d,
// under DDP or not (then each rank keeps its own gradients).
class Runner {
 public:
  // sync: 0 BatchNorm2d, 1 SyncBatchNorm over the default group (DDP's),
  // 2 SyncBatchNorm over a group of its own (new_group of every rank).
  Runner(int64_t sync, bool ddp) {
    dist::Group group = *dist::get_default_group();
    manual_seed(0);
    model_ = sync_batch_norm_testing::ConvertibleResNet18({.num_classes = kClasses});
    if (sync == 2) {
      auto own = dist::new_group();
      Check(own.status(), "new_group");
      model_ = SyncBatchNorm::convert_sync_batchnorm(model_, *own);
    } else if (sync == 1) {
      model_ = SyncBatchNorm::convert_sync_batchnorm(model_, group);
    }
    if (ddp) {
      auto wrapped = DistributedDataParallel::create(model_, {.process_group = group});
      Check(wrapped.status(), "create");
      model_ = *std::move(wrapped);
    }
    manual_seed(100 + group->rank());
    x_ = randn({kBatchPerRank, 3, kImageSize, kImageSize});
    y_ = randint(0, kClasses, {kBatchPerRank});
  }
  // One step; its wall and process CPU time in ms.
  Times Step() {
    const Clock start;
    model_->zero_grad();
    nn::functional::cross_entropy((*model_)(x_), y_).backward();
    return start.Elapsed();
  }

 private:
  std::shared_ptr<nn::Module> model_;
  Tensor x_, y_;
};

// One layer's forward+backward on [8, 64, 32, 32] (the shape of ResNet-18's
// first batch norm here), SyncBatchNorm or BatchNorm2d, no DDP.
class LayerRunner {
 public:
  explicit LayerRunner(bool sync) {
    dist::Group group = *dist::get_default_group();
    layer_ = sync ? std::shared_ptr<nn::Module>(std::make_shared<SyncBatchNorm>(64, group))
                  : std::make_shared<nn::BatchNorm2d>(64);
    manual_seed(100 + group->rank());
    x_ = randn({kBatchPerRank, 64, kImageSize / 2, kImageSize / 2}).requires_grad_();
    gy_ = randn({kBatchPerRank, 64, kImageSize / 2, kImageSize / 2});
  }
  Times Step() {
    const Clock start;
    (*layer_)(x_).backward(gy_);
    return start.Elapsed();
  }

 private:
  std::shared_ptr<nn::Module> layer_;
  Tensor x_, gy_;
};

void Tell(Command command, int64_t steps, int64_t sync, int64_t ddp = 0) {
  Tensor message = zeros({4}, TensorOptions().dtype(kInt64));
  message.data_ptr<int64_t>()[0] = command;
  message.data_ptr<int64_t>()[1] = steps;
  message.data_ptr<int64_t>()[2] = sync;
  message.data_ptr<int64_t>()[3] = ddp;
  Check(dist::broadcast(message, 0), "broadcast command");
}

// Rank 1: runs what rank 0 says until told to stop.
void Follow() {
  for (;;) {
    Tensor message = zeros({4}, TensorOptions().dtype(kInt64));
    Check(dist::broadcast(message, 0), "receive command");
    const int64_t* m = message.data_ptr<int64_t>();
    if (m[0] == kStop) return;
    if (m[0] == kLayerSteps) {
      LayerRunner runner(m[2] != 0);
      for (int64_t i = 0; i < m[1]; ++i) runner.Step();
    } else {
      Runner runner(m[2], m[3] != 0);
      for (int64_t i = 0; i < m[1]; ++i) runner.Step();
    }
  }
}

// Arguments: SyncBatchNorm (1) or BatchNorm2d (0); under DDP (1) or not.
void BM_ResNetStep(benchmark::State& state) {
  const int64_t sync = state.range(0);
  const bool ddp = state.range(1) != 0;
  Tell(kSteps, state.max_iterations, sync, ddp ? 1 : 0);
  Runner runner(sync, ddp);
  Measure(state, runner);
  const char* layer[] = {"BatchNorm2d", "SyncBatchNorm", "SyncBatchNorm, own group"};
  state.SetLabel(absl::StrCat(layer[sync], ddp ? ", DDP" : ""));
}
BENCHMARK(BM_ResNetStep)
    ->Args({0, 1})
    ->Args({1, 1})
    ->Args({2, 1})
    ->Args({0, 0})
    ->Args({1, 0})
    ->Iterations(30)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Argument: 1 for SyncBatchNorm, 0 for BatchNorm2d.
void BM_LayerStep(benchmark::State& state) {
  const bool sync = state.range(0) != 0;
  Tell(kLayerSteps, state.max_iterations, sync ? 1 : 0);
  LayerRunner runner(sync);
  Measure(state, runner);
  state.SetLabel(sync ? "SyncBatchNorm" : "BatchNorm2d");
}
BENCHMARK(BM_LayerStep)
    ->Arg(0)
    ->Arg(1)
    ->Iterations(100)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace ember::parallel

int main(int argc, char** argv) {
  namespace dist = ::ember::distributed;
  char dir_template[] = "/tmp/ember_sync_bn_benchmark_XXXXXX";
  const char* dir = mkdtemp(dir_template);
  if (dir == nullptr) return 1;
  const std::string init = ::absl::StrCat("file://", dir, "/store");
  const pid_t child = fork();
  const int rank = child == 0 ? 1 : 0;
  ember::set_num_threads(1);
  const char* backend = std::getenv("EMBER_SYNC_BN_BENCHMARK_BACKEND");
  ember::parallel::Check(dist::init_process_group({.backend = backend != nullptr ? backend : "gloo",
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
