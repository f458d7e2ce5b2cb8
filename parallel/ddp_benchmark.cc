// DistributedDataParallel step of the 4x512 ReLU MLP with a 10-way head
// (cross-entropy, SGD lr 0.01), 2 ranks as processes on this host with batch
// 32 each and one thread each, beside its in-binary baseline: one process
// training the same model on the whole batch of 64. The shape of
// ../shared/peers/torch_ddp.py, and its protocol: a fresh model, 30 steps,
// the median of the last 25 (counter median_ms). parallel/compare_ddp_with_torch.sh
// runs this and the peer side by side.
//
//   bazel run -c opt //parallel:ddp_benchmark
//
// How much of the all_reduce backward hides: the AllReduceBuckets row times
// the same buckets' all_reduce alone, back to back, and OneProcessStep/32 is
// one rank's compute alone, so the exposed communication is DdpStep -
// OneProcessStep/32 and hidden = 1 - exposed / AllReduceBuckets. Counters of
// the DDP rows, per step from the reducer's statistics: backward_ms (first
// gradient hook to the end of the autograd graph) and comm_wait_ms (waiting
// for the buckets after the graph, which includes waiting for the slower
// rank).
//
// The BM_DdpHookStep rows run the MLP's DDP step with a communication hook
// (bf16 and fp16 compression, PowerSGD of rank 4) beside the same step
// without one; parallel/torch_ddp_hooks.py is PyTorch's side.
//
// The ResNet rows do the same for torchvision's ResNet-18 (nn/models/resnet.h) with
// 10 classes on 3x32x32 images, batch 8 per rank (16 in all): the larger
// model of parallel/torch_ddp_resnet.py, which runs the PyTorch side.
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
#include "nn/models/resnet.h"
#include "nn/activation.h"
#include "nn/benchmark_mlp.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "nn/loss.h"
#include "nn/optim/sgd.h"
#include "parallel/comm_hooks.h"
#include "parallel/distributed_data_parallel.h"
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

constexpr int64_t kResNetGlobalBatch = 16;
constexpr int64_t kImageSize = 32;

enum Command : int64_t {
  kStop = 0,
  kDdpSteps = 1,
  kAllReduceBuckets = 2,
  kResNetDdpSteps = 3,
  kHookDdpSteps = 4,
};

// The communication hooks of the BM_DdpHookStep rows (parallel/comm_hooks.h).
enum Hook : int64_t { kNoHook = 0, kBf16 = 1, kFp16 = 2, kPowerSgd4 = 3 };

// The two models and their inputs.
enum class Model { kMlp, kResNet18 };

void Check(const absl::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "ddp_benchmark: %s: %s\n", what, s.ToString().c_str());
    std::exit(1);
  }
}

std::shared_ptr<nn::Module> Make(Model model) {
  manual_seed(0);
  if (model == Model::kMlp) return nn::benchmark_mlp(kWidth, kHidden, kClasses);
  return std::make_shared<nn::models::ResNet18>(nn::models::ResNetOptions{.num_classes = kClasses});
}

// A batch of `n` inputs for `model`.
Tensor Inputs(Model model, int64_t n) {
  if (model == Model::kMlp) return randn({n, kWidth});
  return randn({n, 3, kImageSize, kImageSize});
}

int64_t GlobalBatch(Model model) {
  return model == Model::kMlp ? kGlobalBatch : kResNetGlobalBatch;
}

// Per-step wall times; the median of all but the first five.
double MedianMs(std::vector<double> ms) {
  if (ms.size() > 5) ms.erase(ms.begin(), ms.begin() + 5);
  std::sort(ms.begin(), ms.end());
  return ms.empty() ? 0 : ms[ms.size() / 2];
}

// One rank's DDP training loop.
class DdpRunner {
 public:
  DdpRunner(bool as_view, Model model = Model::kMlp, Hook hook = kNoHook) {
    dist::Group group = *dist::get_default_group();
    auto ddp = DistributedDataParallel::create(
        Make(model), {.process_group = group, .gradient_as_bucket_view = as_view});
    Check(ddp.status(), "create");
    ddp_ = *std::move(ddp);
    if (hook == kBf16) Check(ddp_->register_comm_hook(comm_hooks::bf16_compress_hook()), "hook");
    if (hook == kFp16) Check(ddp_->register_comm_hook(comm_hooks::fp16_compress_hook()), "hook");
    if (hook == kPowerSgd4) {
      // PowerSGD from the third step, so that the timed steps all compress.
      auto state = comm_hooks::PowerSGDState::create(
          nullptr, {.matrix_approximation_rank = 4, .start_powerSGD_iter = 2});
      Check(state.status(), "PowerSGDState");
      Check(ddp_->register_comm_hook(comm_hooks::powerSGD_hook(*state)), "hook");
    }
    opt_ = std::make_unique<nn::optim::SGD>(ddp_->parameters(), nn::optim::SGDOptions{.lr = 0.01});
    manual_seed(100 + group->rank());
    x_ = Inputs(model, GlobalBatch(model) / kWorld);
    y_ = randint(0, kClasses, {GlobalBatch(model) / kWorld});
  }
  // One step; its wall time in ms.
  double Step() {
    const absl::Time start = absl::Now();
    opt_->zero_grad(/*set_to_none=*/false);  // torch 1.13's default, as the peer
    nn::functional::cross_entropy((*ddp_)(x_), y_).backward();
    opt_->step();
    return absl::ToDoubleMilliseconds(absl::Now() - start);
  }
  DdpLoggingData data() const { return ddp_->get_ddp_logging_data(); }

 private:
  std::shared_ptr<DistributedDataParallel> ddp_;
  std::unique_ptr<nn::optim::SGD> opt_;
  Tensor x_, y_;
};

// The DDP buckets' all_reduce alone, back to back.
class AllReduceRunner {
 public:
  AllReduceRunner() {
    DdpRunner ddp(false);
    for (int64_t bytes : ddp.data().bucket_bytes) buckets_.push_back(ones({bytes / 4}));
  }
  double Step() {
    dist::Group group = *dist::get_default_group();
    const absl::Time start = absl::Now();
    std::vector<std::shared_ptr<dist::Work>> works;
    for (const Tensor& b : buckets_) {
      auto work = group->allreduce(b, {.op = dist::ReduceOp::kSum});
      Check(work.status(), "all_reduce");
      works.push_back(*work);
    }
    for (auto& w : works) Check(w->wait(), "all_reduce");
    return absl::ToDoubleMilliseconds(absl::Now() - start);
  }

 private:
  std::vector<Tensor> buckets_;
};

void Tell(Command command, int64_t steps, int64_t arg) {
  Tensor message = zeros({3}, TensorOptions().dtype(kInt64));
  message.data_ptr<int64_t>()[0] = command;
  message.data_ptr<int64_t>()[1] = steps;
  message.data_ptr<int64_t>()[2] = arg;
  Check(dist::broadcast(message, 0), "broadcast command");
}

// Rank 1: runs what rank 0 says until told to stop.
void Follow() {
  for (;;) {
    Tensor message = zeros({3}, TensorOptions().dtype(kInt64));
    Check(dist::broadcast(message, 0), "receive command");
    const int64_t* m = message.data_ptr<int64_t>();
    if (m[0] == kStop) return;
    if (m[0] == kDdpSteps) {
      DdpRunner runner(m[2] != 0);
      for (int64_t i = 0; i < m[1]; ++i) runner.Step();
    } else if (m[0] == kResNetDdpSteps) {
      DdpRunner runner(m[2] != 0, Model::kResNet18);
      for (int64_t i = 0; i < m[1]; ++i) runner.Step();
    } else if (m[0] == kHookDdpSteps) {
      DdpRunner runner(false, Model::kMlp, static_cast<Hook>(m[2]));
      for (int64_t i = 0; i < m[1]; ++i) runner.Step();
    } else if (m[0] == kAllReduceBuckets) {
      AllReduceRunner runner;
      for (int64_t i = 0; i < m[1]; ++i) runner.Step();
    }
  }
}

// One process training `model` on a batch of `batch`.
void OneProcessStep(benchmark::State& state, Model model, int64_t batch) {
  auto net = Make(model);
  nn::optim::SGD opt(net->parameters(), {.lr = 0.01});
  Tensor x = Inputs(model, batch);
  Tensor y = randint(0, kClasses, {batch});
  std::vector<double> ms;
  for (auto _ : state) {
    const absl::Time start = absl::Now();
    opt.zero_grad(/*set_to_none=*/false);
    nn::functional::cross_entropy((*net)(x), y).backward();
    opt.step();
    ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
  }
  state.counters["median_ms"] = MedianMs(ms);
}

// Argument: the batch (64: the baseline; 32: one rank's compute alone).
void BM_OneProcessStep(benchmark::State& state) {
  OneProcessStep(state, Model::kMlp, state.range(0));
}
BENCHMARK(BM_OneProcessStep)
    ->Arg(64)
    ->Arg(32)
    ->Iterations(30)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Argument: the batch (16: the baseline; 8: one rank's compute alone).
void BM_ResNetOneProcessStep(benchmark::State& state) {
  OneProcessStep(state, Model::kResNet18, state.range(0));
}
BENCHMARK(BM_ResNetOneProcessStep)
    ->Arg(16)
    ->Arg(8)
    ->Iterations(30)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Rank 0's side of `steps` DDP steps (rank 1 runs the same, told by `command`).
void DdpSteps(benchmark::State& state, Command command, Model model, bool as_view,
              Hook hook = kNoHook) {
  Tell(command, state.max_iterations,
       command == kHookDdpSteps ? static_cast<int64_t>(hook) : (as_view ? 1 : 0));
  DdpRunner runner(as_view, model, hook);
  std::vector<double> ms;
  for (auto _ : state) ms.push_back(runner.Step());
  state.counters["median_ms"] = MedianMs(ms);
  const DdpLoggingData data = runner.data();
  const double n = static_cast<double>(data.stats.iterations);
  state.counters["backward_ms"] = absl::ToDoubleMilliseconds(data.stats.backward_compute_time) / n;
  state.counters["comm_wait_ms"] =
      absl::ToDoubleMilliseconds(data.stats.backward_comm_wait_time) / n;
  state.counters["buckets"] = static_cast<double>(data.bucket_bytes.size());
}

// Argument: gradient_as_bucket_view.
void BM_DdpStep(benchmark::State& state) {
  DdpSteps(state, kDdpSteps, Model::kMlp, state.range(0) != 0);
}
BENCHMARK(BM_DdpStep)->Arg(0)->Arg(1)->Iterations(30)->Unit(benchmark::kMillisecond)->UseRealTime();

// Argument: the communication hook (Hook): none, bf16_compress_hook,
// fp16_compress_hook, powerSGD_hook of rank 4; the MLP. torch_ddp_hooks.py
// runs PyTorch's DDP with the same hooks.
void BM_DdpHookStep(benchmark::State& state) {
  DdpSteps(state, kHookDdpSteps, Model::kMlp, false, static_cast<Hook>(state.range(0)));
}
BENCHMARK(BM_DdpHookStep)
    ->Arg(kNoHook)
    ->Arg(kBf16)
    ->Arg(kFp16)
    ->Arg(kPowerSgd4)
    ->Iterations(30)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

void BM_ResNetDdpStep(benchmark::State& state) {
  DdpSteps(state, kResNetDdpSteps, Model::kResNet18, /*as_view=*/false);
}
BENCHMARK(BM_ResNetDdpStep)->Iterations(30)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_AllReduceBuckets(benchmark::State& state) {
  Tell(kAllReduceBuckets, state.max_iterations, 0);
  AllReduceRunner runner;
  std::vector<double> ms;
  for (auto _ : state) ms.push_back(runner.Step());
  state.counters["median_ms"] = MedianMs(ms);
}
BENCHMARK(BM_AllReduceBuckets)->Iterations(30)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace ember::parallel

int main(int argc, char** argv) {
  namespace dist = ::ember::distributed;
  char dir_template[] = "/tmp/ember_ddp_benchmark_XXXXXX";
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
