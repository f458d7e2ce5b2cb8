// all_reduce, broadcast and all_gather on the tcp backend (or any registered
// backend with --backend=gloo), ranks as
// processes on this host, 4 KiB to 64 MiB; a memcpy of the same bytes is the
// in-binary baseline (the figure every transfer is bounded by).
//
//   bazel run //distributed/tcp:collectives_benchmark -- --ranks=2
//   EMBER_TCP_SHM=0 bazel run ... -- --ranks=2   # sockets instead of shared memory
//   bazel run ... -- --ranks=2 --backend=gloo     # the gloo backend, same harness
//
// The process running the benchmarks is rank 0; it forks ranks 1..N-1, which
// follow its lead: before every timed op rank 0 broadcasts the op and size
// (untimed), then all ranks pass a barrier and run the op; rank 0 times the op
// alone (manual time), as ../shared/peers/torch_allreduce.py does for gloo.
// Counters (from the mean time, and p50_us / *_p50_GBps from the median):
// algbw = bytes / time, busbw = algbw x 2(N-1)/N for all_reduce,
// x (N-1)/N for all_gather (bytes = the gathered output), x 1 for broadcast.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "benchmark/benchmark.h"
#include "distributed/file_store.h"
#include "distributed/tcp/process_group_tcp.h"
#include "tensor/factories.h"

namespace ember::distributed::tcp {
namespace {

enum Command : int64_t { kStop = 0, kAllReduce = 1, kBroadcast = 2, kAllGather = 3 };

std::shared_ptr<ProcessGroup>& Group() {
  static auto* group = new std::shared_ptr<ProcessGroup>;
  return *group;
}

void Check(const absl::Status& s, const char* what) {
  if (!s.ok()) {
    fprintf(stderr, "collectives_benchmark: %s: %s\n", what, s.ToString().c_str());
    std::exit(1);
  }
}

void Wait(absl::StatusOr<std::shared_ptr<Work>> work, const char* what) {
  Check(work.ok() ? (*work)->wait() : work.status(), what);
}

// Runs one op of `command` on `nbytes` (per-rank input) with every rank.
struct Buffers {
  Tensor data;
  std::vector<Tensor> gathered;
};

Buffers& BuffersFor(int64_t nbytes, int world) {
  static Buffers* b = new Buffers;
  if (!b->data.defined() || static_cast<int64_t>(b->data.nbytes()) != nbytes) {
    b->data = ones({nbytes / 4}, kFloat32);
    b->gathered.clear();
    for (int r = 0; r < world; ++r) b->gathered.push_back(zeros({nbytes / 4}, kFloat32));
  }
  return *b;
}

void RunOp(int64_t command, int64_t nbytes) {
  ProcessGroup& pg = *Group();
  Buffers& b = BuffersFor(nbytes, pg.size());
  switch (command) {
    case kAllReduce:
      Wait(pg.allreduce(b.data), "all_reduce");
      break;
    case kBroadcast:
      Wait(pg.broadcast(b.data), "broadcast");
      break;
    case kAllGather:
      Wait(pg.allgather(b.gathered, b.data), "all_gather");
      break;
  }
}

// Rank 0 tells the others what comes next.
void Announce(int64_t command, int64_t nbytes) {
  Tensor control = tensor(std::vector<int64_t>{command, nbytes});
  Wait(Group()->broadcast(control), "control broadcast");
}

void Follow() {
  while (true) {
    Tensor control = zeros({2}, kInt64);
    Wait(Group()->broadcast(control), "control broadcast");
    const int64_t command = control.data_ptr<int64_t>()[0];
    if (command == kStop) return;
    BuffersFor(control.data_ptr<int64_t>()[1], Group()->size());
    Wait(Group()->barrier(), "barrier");
    RunOp(command, control.data_ptr<int64_t>()[1]);
  }
}

void Collective(benchmark::State& state, int64_t command) {
  const int64_t nbytes = state.range(0);
  const int world = Group()->size();
  BuffersFor(nbytes, world);
  for (int warmup = 0; warmup < 2; ++warmup) {  // first touches of buffers and rings
    Announce(command, nbytes);
    Wait(Group()->barrier(), "barrier");
    RunOp(command, nbytes);
  }
  std::vector<double> seconds;
  for (auto _ : state) {
    Announce(command, nbytes);
    Wait(Group()->barrier(), "barrier");
    const absl::Time start = absl::Now();
    RunOp(command, nbytes);
    seconds.push_back(absl::ToDoubleSeconds(absl::Now() - start));
    state.SetIterationTime(seconds.back());
  }
  // The median as well as the mean: the peer script reports medians, and on
  // a shared machine a few descheduled iterations move the mean a lot.
  std::sort(seconds.begin(), seconds.end());
  const double median = seconds.empty() ? 0 : seconds[seconds.size() / 2];
  const double bytes = command == kAllGather ? double(nbytes) * world : double(nbytes);
  const double factor = command == kAllReduce   ? 2.0 * (world - 1) / world
                        : command == kAllGather ? double(world - 1) / world
                                                : 1.0;
  state.counters["ranks"] = world;
  state.counters["p50_us"] = median * 1e6;
  state.counters["algbw_p50_GBps"] = median > 0 ? bytes / median / 1e9 : 0;
  state.counters["busbw_p50_GBps"] = median > 0 ? bytes * factor / median / 1e9 : 0;
  state.counters["algbw"] = benchmark::Counter(
      bytes * state.iterations(), benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
  state.counters["busbw"] =
      benchmark::Counter(bytes * factor * state.iterations(), benchmark::Counter::kIsRate,
                         benchmark::Counter::kIs1000);
}

void BM_AllReduce(benchmark::State& state) { Collective(state, kAllReduce); }
void BM_Broadcast(benchmark::State& state) { Collective(state, kBroadcast); }
void BM_AllGather(benchmark::State& state) { Collective(state, kAllGather); }

// The baseline: one memcpy of the same bytes in this process.
void BM_Memcpy(benchmark::State& state) {
  const int64_t nbytes = state.range(0);
  std::vector<char> a(nbytes, 1), b(nbytes, 0);
  for (auto _ : state) {
    std::memcpy(b.data(), a.data(), nbytes);
    benchmark::DoNotOptimize(b.data());
    benchmark::ClobberMemory();
  }
  state.counters["algbw"] =
      benchmark::Counter(double(nbytes) * state.iterations(), benchmark::Counter::kIsRate,
                         benchmark::Counter::kIs1000);
}

void Sizes(benchmark::internal::Benchmark* b) {
  for (int64_t n = 4 << 10; n <= (64 << 20); n *= 4) b->Arg(n);
}

BENCHMARK(BM_Memcpy)->Apply(Sizes);
BENCHMARK(BM_AllReduce)->Apply(Sizes)->UseManualTime();
BENCHMARK(BM_Broadcast)->Apply(Sizes)->UseManualTime();
BENCHMARK(BM_AllGather)->Apply(Sizes)->UseManualTime();

std::shared_ptr<ProcessGroup> Join(const std::string& backend, const std::string& store_path,
                                   int rank, int world) {
  auto store = FileStore::open(store_path, absl::Seconds(60));
  Check(store.status(), "FileStore");
  BackendOptions options{.store = std::shared_ptr<Store>(std::move(*store)),
                         .store_prefix = "bench/",
                         .rank = rank,
                         .size = world,
                         .timeout = absl::Seconds(120)};
  auto info = find_backend(backend);
  Check(info.status(), "--backend");
  auto group = (*info)->create(options);
  Check(group.status(), "creating the group");
  return *group;
}

}  // namespace
}  // namespace ember::distributed::tcp

int main(int argc, char** argv) {
  using namespace ember::distributed::tcp;  // NOLINT: a benchmark main
  int world = 2;
  std::string backend = "tcp";
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--ranks=", 0) == 0) {
      if (!absl::SimpleAtoi(a.substr(8), &world) || world < 1) {
        fprintf(stderr, "--ranks needs a positive integer, got '%s'\n", a.c_str());
        return 2;
      }
      continue;
    }
    if (a.rfind("--backend=", 0) == 0) {
      backend = a.substr(10);
      continue;
    }
    args.push_back(argv[i]);
  }
  char dir[] = "/tmp/ember-bench-XXXXXX";
  if (mkdtemp(dir) == nullptr) return 1;
  const std::string store_path = std::string(dir) + "/store";
  std::vector<pid_t> children;
  for (int r = 1; r < world; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      Group() = Join(backend, store_path, r, world);
      Follow();
      Group().reset();
      _exit(0);
    }
    children.push_back(pid);
  }
  Group() = Join(backend, store_path, 0, world);
  int count = static_cast<int>(args.size());
  benchmark::Initialize(&count, args.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  Announce(kStop, 0);
  Group().reset();
  for (pid_t pid : children) waitpid(pid, nullptr, 0);
  rmdir(dir);  // the store's file is gone with the group; its directory is left
  return 0;
}
