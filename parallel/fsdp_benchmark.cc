// FullyShardedDataParallel step beside DistributedDataParallel's on the same
// model, 2 ranks as processes on this host over gloo (one thread each), in
// one binary, so the figure is the ratio FSDP / DDP measured in the same run;
// and the *4Ranks rows: HYBRID_SHARD (2 shard groups of 2, replicated) beside
// FULL_SHARD over all 4 ranks, same batch per rank:
//
//   bazel run -c opt //parallel:fsdp_benchmark
//   bazel run -c opt //parallel:fsdp_benchmark -- --benchmark_filter=Mlp
//
// Models: the 4x512 ReLU MLP of nn/benchmark_mlp.h (batch 32 per rank; units:
// each Linear) and ResNet-18 of nn/models/resnet.h with 10 classes on 3x32x32
// images (batch 8 per rank; units: each BasicBlock, the stem and fc in the
// root), SGD lr 0.01 momentum 0.9, cross-entropy. Protocol of
// ddp_benchmark.cc: a fresh model per row, every step timed, the median of
// all but the first 5 steps (counter median_ms).
//
// Counters (rank 0; rank 1 is symmetric):
//   peak_MiB   the most tensor memory in use during the steps (a counting
//              wrapper around the CPU allocator, installed at start-up);
//   state_MiB  tensor memory in use after the last step: parameters,
//              gradients and optimizer state (inputs excluded);
//   ag_wait_ms, rs_wait_ms  (FSDP) per step, the time forward and backward
//              blocked on an all_gather, and the time after the autograd graph
//              spent waiting for the reduce_scatters: the communication that
//              compute did not hide;
//   comm_ms    (the *Collectives rows) the same all_gathers (2 per unit for
//              FULL_SHARD) and reduce_scatters alone, back to back;
//   hidden_pct (the *Collectives rows) the share of comm_ms that the
//              FULL_SHARD step (prefetch on) hid behind compute:
//              (compute_ms + comm_ms - step) / comm_ms, where compute_ms is
//              the *Compute row: the same DDP step under no_sync, both ranks
//              computing at once with no communication at all. The wait
//              counters above cannot give this on a machine whose ranks share
//              cores: they include waiting for the other rank.
//
// parallel/torch_fsdp.py runs PyTorch's fully_shard (FSDP2) and DDP over gloo
// on the same models and protocol.
//
// The process running the benchmarks is rank 0; it forks ranks 1-3 before
// anything else, which follow its lead: before each row rank 0 broadcasts
// what to run, on how many ranks and how many steps (untimed). The 2-rank
// rows run on the group of ranks 0 and 1; ranks 2 and 3 wait for the next row.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
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
#include "nn/benchmark_mlp.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "nn/loss.h"
#include "nn/optim/sgd.h"
#include "parallel/distributed_data_parallel.h"
#include "parallel/fully_sharded_data_parallel.h"
#include "tensor/allocator.h"
#include "tensor/factories.h"
#include "tensor/thread_pool.h"

namespace ember::parallel {
namespace {

namespace dist = ::ember::distributed;

constexpr int kProcesses = 4;
// Ranks 0 and 1: the group of the 2-rank rows (made at start-up).
dist::Group pair_group;
constexpr int kClasses = 10;

// Live and peak bytes of tensor memory (tensor/allocator.h keeps no such
// statistics itself).
class CountingAllocator : public Allocator {
 public:
  explicit CountingAllocator(Allocator* inner) : inner_(inner) {}
  DataPtr Allocate(size_t nbytes) override {
    DataPtr inner = inner_->Allocate(nbytes);
    void* data = inner.get();
    auto* record = new Record{std::move(inner), nbytes, this};
    const size_t now = live_.fetch_add(nbytes) + nbytes;
    size_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    return DataPtr(data, record, &Free, kCPU);
  }
  std::string_view name() const override { return "counting"; }
  size_t live() const { return live_.load(); }
  size_t peak() const { return peak_.load(); }
  void ResetPeak() { peak_.store(live_.load()); }

 private:
  struct Record {
    DataPtr inner;
    size_t nbytes;
    CountingAllocator* owner;
  };
  static void Free(void* context) {
    auto* record = static_cast<Record*>(context);
    record->owner->live_.fetch_sub(record->nbytes);
    delete record;
  }
  Allocator* inner_;
  std::atomic<size_t> live_{0};
  std::atomic<size_t> peak_{0};
};
CountingAllocator* counting = nullptr;

enum Command : int64_t {
  kStop = 0,
  kDdpSteps = 1,
  kFsdpSteps = 2,
  kCollectives = 3,
  kComputeSteps = 4
};
enum class Model : int64_t { kMlp = 0, kResNet18 = 1 };

void Check(const absl::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "fsdp_benchmark: %s: %s\n", what, s.ToString().c_str());
    std::exit(1);
  }
}

std::shared_ptr<nn::Module> Make(Model model) {
  manual_seed(0);
  if (model == Model::kMlp) return nn::benchmark_mlp(512, 4, kClasses);
  return std::make_shared<nn::models::ResNet18>(nn::models::ResNetOptions{.num_classes = kClasses});
}

std::vector<std::shared_ptr<nn::Module>> Units(Model model, nn::Module& net) {
  std::vector<std::shared_ptr<nn::Module>> units;
  for (const auto& [name, m] : net.named_modules()) {
    if (model == Model::kMlp ? m->name() == "Linear" : m->name() == "BasicBlock") {
      units.push_back(m);
    }
  }
  return units;
}

int64_t LocalBatch(Model model) { return model == Model::kMlp ? 32 : 8; }
Tensor Inputs(Model model) {
  return model == Model::kMlp ? randn({LocalBatch(model), 512})
                              : randn({LocalBatch(model), 3, 32, 32});
}

double MedianMs(std::vector<double> ms) {
  if (ms.size() > 5) ms.erase(ms.begin(), ms.begin() + 5);
  std::sort(ms.begin(), ms.end());
  return ms.empty() ? 0 : ms[ms.size() / 2];
}

// Arguments of a row: model, and for FSDP the strategy and forward_prefetch;
// the ranks it runs on (2: ranks 0 and 1; 4: all, HYBRID_SHARD as 2 x 2).
struct Row {
  Model model = Model::kMlp;
  ShardingStrategy strategy = ShardingStrategy::kFullShard;
  bool forward_prefetch = true;
  int64_t ranks = 2;
};

struct Result {
  double median_ms = 0;
  double peak_mib = 0;
  double state_mib = 0;
  double ag_wait_ms = 0;
  double rs_wait_ms = 0;
};

constexpr double kMiB = 1 << 20;

enum class Mode { kDdp, kFsdp, kComputeOnly };

// `steps` training steps of the DDP or FSDP model of `row`; kComputeOnly:
// DDP's step under no_sync (no communication).
Result Train(const Row& row, Mode mode, int64_t steps) {
  const bool fsdp = mode == Mode::kFsdp;
  Result result;
  if (dist::get_rank() >= row.ranks) return result;  // not in this row
  dist::Group group = row.ranks == kProcesses ? *dist::get_default_group() : pair_group;
  manual_seed(100 + group->rank());
  const Tensor x = Inputs(row.model);
  const Tensor y = randint(0, kClasses, {LocalBatch(row.model)});
  const size_t before = counting->live();
  counting->ResetPeak();
  std::vector<double> ms;
  {
    auto model = Make(row.model);
    std::shared_ptr<nn::Module> wrapped;
    std::shared_ptr<FullyShardedDataParallel> sharded;
    if (fsdp) {
      // HYBRID_SHARD makes its groups from the default group (all ranks).
      const bool hybrid = is_hybrid_strategy(row.strategy);
      auto created = FullyShardedDataParallel::create(
          model, {.process_group = hybrid ? nullptr : group,
                  .sharding_strategy = row.strategy,
                  .units = Units(row.model, *model),
                  .forward_prefetch = row.forward_prefetch,
                  .shard_group_size = hybrid ? 2 : 0});
      Check(created.status(), "FullyShardedDataParallel::create");
      sharded = *created;
      wrapped = sharded;
    } else {
      auto created = DistributedDataParallel::create(model, {.process_group = group});
      Check(created.status(), "DistributedDataParallel::create");
      wrapped = *created;
    }
    nn::optim::SGD opt(wrapped->parameters(), {.lr = 0.01, .momentum = 0.9});
    for (int64_t i = 0; i < steps; ++i) {
      const absl::Time start = absl::Now();
      opt.zero_grad();
      if (mode == Mode::kComputeOnly) {
        auto no_sync = static_cast<DistributedDataParallel&>(*wrapped).no_sync();
        nn::functional::cross_entropy((*wrapped)(x), y).backward();
      } else {
        nn::functional::cross_entropy((*wrapped)(x), y).backward();
      }
      opt.step();
      ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
    }
    result.state_mib = static_cast<double>(counting->live() - before) / kMiB;
    result.peak_mib = static_cast<double>(counting->peak() - before) / kMiB;
    if (sharded != nullptr) {
      const FsdpStats& stats = sharded->stats();
      const double n = static_cast<double>(std::max<int64_t>(stats.iterations, 1));
      result.ag_wait_ms = absl::ToDoubleMilliseconds(stats.all_gather_wait_time) / n;
      result.rs_wait_ms = absl::ToDoubleMilliseconds(stats.reduce_wait_time) / n;
    }
  }
  result.median_ms = MedianMs(ms);
  return result;
}

// The collectives of one FULL_SHARD step of `model` alone, back to back:
// per unit two all_gathers (forward and backward) and one reduce_scatter.
double Collectives(Model model, int64_t steps) {
  if (dist::get_rank() >= 2) return 0;
  dist::Group group = pair_group;
  auto net = Make(model);
  auto created = FullyShardedDataParallel::create(
      net, {.process_group = group, .units = Units(model, *net)});
  Check(created.status(), "create");
  std::vector<Tensor> shards, gathered, grads;
  for (const FlatParamInfo& info : (*created)->flat_param_infos()) {
    shards.push_back(ones({info.shard_numel}));
    gathered.push_back(empty({info.padded_numel}));
    grads.push_back(ones({info.padded_numel}));
  }
  std::vector<double> ms;
  for (int64_t i = 0; i < steps; ++i) {
    const absl::Time start = absl::Now();
    std::vector<std::shared_ptr<dist::Work>> works;
    auto keep = [&](absl::StatusOr<std::shared_ptr<dist::Work>> work) {
      Check(work.status(), "collective");
      works.push_back(*work);
    };
    for (int pass = 0; pass < 2; ++pass) {
      for (size_t u = 0; u < shards.size(); ++u) {
        keep(group->allgather_into_tensor(gathered[u], shards[u]));
      }
    }
    for (size_t u = 0; u < shards.size(); ++u) {
      std::vector<Tensor> inputs;
      for (int r = 0; r < group->size(); ++r) {
        inputs.push_back(grads[u].narrow(0, r * shards[u].numel(), shards[u].numel()));
      }
      Tensor out = empty({shards[u].numel()});
      keep(group->reduce_scatter(out, inputs));
    }
    for (auto& w : works) Check(w->wait(), "wait");
    ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
  }
  return MedianMs(ms);
}

void Tell(Command command, int64_t steps, const Row& row) {
  Tensor message = zeros({6}, TensorOptions().dtype(kInt64));
  int64_t* m = message.data_ptr<int64_t>();
  m[0] = command;
  m[1] = steps;
  m[2] = static_cast<int64_t>(row.model);
  m[3] = static_cast<int64_t>(row.strategy);
  m[4] = row.forward_prefetch ? 1 : 0;
  m[5] = row.ranks;
  Check(dist::broadcast(message, 0), "broadcast command");
}

void Follow() {
  for (;;) {
    Tensor message = zeros({6}, TensorOptions().dtype(kInt64));
    Check(dist::broadcast(message, 0), "receive command");
    const int64_t* m = message.data_ptr<int64_t>();
    const Row row{static_cast<Model>(m[2]), static_cast<ShardingStrategy>(m[3]), m[4] != 0, m[5]};
    if (m[0] == kStop) return;
    if (m[0] == kDdpSteps) Train(row, Mode::kDdp, m[1]);
    if (m[0] == kFsdpSteps) Train(row, Mode::kFsdp, m[1]);
    if (m[0] == kComputeSteps) Train(row, Mode::kComputeOnly, m[1]);
    if (m[0] == kCollectives) Collectives(row.model, m[1]);
  }
}

void Report(benchmark::State& state, const Result& r, bool fsdp) {
  state.counters["median_ms"] = r.median_ms;
  state.counters["peak_MiB"] = r.peak_mib;
  state.counters["state_MiB"] = r.state_mib;
  if (fsdp) {
    state.counters["ag_wait_ms"] = r.ag_wait_ms;
    state.counters["rs_wait_ms"] = r.rs_wait_ms;
  }
}

// The timed loop is inside Train (fresh model per row); the benchmark loop
// runs once.
// The latest FULL_SHARD (prefetch on) and compute-only step times, for the
// Collectives row's hidden_pct.
double full_shard_ms = 0;
double compute_ms = 0;

void DdpRow(benchmark::State& state, Model model, int64_t steps) {
  const Row row{model};
  Result r;
  for (auto _ : state) {
    Tell(kDdpSteps, steps, row);
    r = Train(row, Mode::kDdp, steps);
  }
  Report(state, r, false);
}

void ComputeRow(benchmark::State& state, Model model, int64_t steps) {
  const Row row{model};
  Result r;
  for (auto _ : state) {
    Tell(kComputeSteps, steps, row);
    r = Train(row, Mode::kComputeOnly, steps);
  }
  compute_ms = r.median_ms;
  state.counters["median_ms"] = r.median_ms;
}

void FsdpRow(benchmark::State& state, Model model, int64_t steps, int64_t ranks = 2) {
  const Row row{model, static_cast<ShardingStrategy>(state.range(0)), state.range(1) != 0, ranks};
  Result r;
  for (auto _ : state) {
    Tell(kFsdpSteps, steps, row);
    r = Train(row, Mode::kFsdp, steps);
  }
  if (row.strategy == ShardingStrategy::kFullShard && row.forward_prefetch && ranks == 2) {
    full_shard_ms = r.median_ms;
  }
  Report(state, r, true);
}

void CollectivesRow(benchmark::State& state, Model model, int64_t steps) {
  double ms = 0;
  for (auto _ : state) {
    Tell(kCollectives, steps, Row{model});
    ms = Collectives(model, steps);
  }
  state.counters["comm_ms"] = ms;
  if (ms > 0 && full_shard_ms > 0 && compute_ms > 0) {
    state.counters["hidden_pct"] = 100.0 * (compute_ms + ms - full_shard_ms) / ms;
  }
}

constexpr int64_t kMlpSteps = 30;
constexpr int64_t kResNetSteps = 15;

void BM_MlpDdp(benchmark::State& state) { DdpRow(state, Model::kMlp, kMlpSteps); }
void BM_MlpFsdp(benchmark::State& state) { FsdpRow(state, Model::kMlp, kMlpSteps); }
void BM_MlpCompute(benchmark::State& state) { ComputeRow(state, Model::kMlp, kMlpSteps); }
void BM_MlpFsdp4Ranks(benchmark::State& state) { FsdpRow(state, Model::kMlp, kMlpSteps, 4); }
void BM_MlpCollectives(benchmark::State& state) {
  CollectivesRow(state, Model::kMlp, kMlpSteps);
}
void BM_ResNetDdp(benchmark::State& state) { DdpRow(state, Model::kResNet18, kResNetSteps); }
void BM_ResNetFsdp(benchmark::State& state) { FsdpRow(state, Model::kResNet18, kResNetSteps); }
void BM_ResNetCompute(benchmark::State& state) {
  ComputeRow(state, Model::kResNet18, kResNetSteps);
}
void BM_ResNetCollectives(benchmark::State& state) {
  CollectivesRow(state, Model::kResNet18, kResNetSteps);
}

// Arguments of the FSDP rows: strategy (0 FULL_SHARD, 1 SHARD_GRAD_OP,
// 2 NO_SHARD), forward_prefetch. DDP rows run before and after the FSDP
// rows, so that drift in the machine's load shows.
#define EMBER_FSDP_ROWS(Model)                                                           \
  BENCHMARK(BM_##Model##Ddp)->Iterations(1)->Unit(benchmark::kMillisecond)->UseRealTime(); \
  BENCHMARK(BM_##Model##Fsdp)                                                             \
      ->Args({0, 1})                                                                      \
      ->Args({0, 0})                                                                      \
      ->Args({1, 1})                                                                      \
      ->Args({2, 1})                                                                      \
      ->Iterations(1)                                                                     \
      ->Unit(benchmark::kMillisecond)                                                     \
      ->UseRealTime();                                                                    \
  BENCHMARK(BM_##Model##Compute)->Iterations(1)->Unit(benchmark::kMillisecond)->UseRealTime(); \
  BENCHMARK(BM_##Model##Collectives)->Iterations(1)->Unit(benchmark::kMillisecond)->UseRealTime()

// A first row warms the processes up (thread pools, the allocator's cache,
// gloo's pairs); its figure is not compared.
BENCHMARK(BM_MlpDdp)->Name("BM_MlpDdp/warmup")->Iterations(1)->Unit(benchmark::kMillisecond)->UseRealTime();
EMBER_FSDP_ROWS(Mlp);
BENCHMARK(BM_MlpDdp)->Name("BM_MlpDdp/again")->Iterations(1)->Unit(benchmark::kMillisecond)->UseRealTime();
EMBER_FSDP_ROWS(ResNet);
// 4 ranks: FULL_SHARD over all 4, HYBRID_SHARD as 2 shard groups of 2
// (strategy 3), each with forward_prefetch.
BENCHMARK(BM_MlpFsdp4Ranks)
    ->Args({0, 1})
    ->Args({3, 1})
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_ResNetDdp)
    ->Name("BM_ResNetDdp/again")
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace ember::parallel

int main(int argc, char** argv) {
  namespace dist = ::ember::distributed;
  char dir_template[] = "/tmp/ember_fsdp_benchmark_XXXXXX";
  const char* dir = mkdtemp(dir_template);
  if (dir == nullptr) return 1;
  const std::string init = ::absl::StrCat("file://", dir, "/store");
  int rank = 0;
  std::vector<pid_t> children;
  for (int r = 1; r < ember::parallel::kProcesses; ++r) {
    const pid_t child = fork();
    if (child == 0) {
      rank = r;
      children.clear();
      break;
    }
    children.push_back(child);
  }
  ember::set_num_threads(1);
  ember::parallel::counting = new ember::parallel::CountingAllocator(ember::GetCpuAllocator());
  ember::SetAllocator(ember::DeviceType::kCPU, ember::parallel::counting);
  const char* backend = std::getenv("EMBER_FSDP_BENCHMARK_BACKEND");
  ember::parallel::Check(
      dist::init_process_group({.backend = backend != nullptr ? backend : "gloo",
                                .init_method = init,
                                .world_size = ember::parallel::kProcesses,
                                .rank = rank}),
      "init_process_group");
  absl::StatusOr<dist::Group> pair = dist::new_group({0, 1});
  ember::parallel::Check(pair.status(), "new_group({0, 1})");
  ember::parallel::pair_group = *pair;
  if (rank != 0) {
    ember::parallel::Follow();
    ember::parallel::Check(dist::destroy_process_group(), "destroy_process_group");
    _exit(0);
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  ember::parallel::Tell(ember::parallel::kStop, 0, {});
  ember::parallel::Check(dist::destroy_process_group(), "destroy_process_group");
  int failed = 0;
  for (pid_t child : children) {
    int status = 0;
    waitpid(child, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) failed = 1;
  }
  rmdir(dir);  // the store's file is gone with the group; its directory is left
  benchmark::Shutdown();
  return failed;
}
