// Save and load throughput of a distributed checkpoint against writing and
// reading one torch.save file of the same state (ember::save /
// ember::load), in the same binary. The state: 8 float32 tensors of
// 8 MiB (64 MiB). Files go to $EMBER_BENCH_DIR, else the system temp
// directory.
//
//   bazel run -c opt //distributed/checkpoint:checkpoint_benchmark --
//       --benchmark_repetitions=3 --benchmark_enable_random_interleaving=true
// (one command line; compare_with_torch.sh runs it beside PyTorch 2.x).
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "distributed/checkpoint/checkpoint.h"
#include "distributed/testing/ranks.h"
#include "serialization/serialization.h"
#include "tensor/factories.h"

namespace ember::distributed::checkpoint {
namespace {

namespace fs = std::filesystem;

constexpr int kTensors = 8;
constexpr int64_t kRows = 2048, kCols = 1024;  // 8 MiB of float32 each
constexpr int64_t kBytes = kTensors * kRows * kCols * 4;

std::string Dir() {
  static const std::string dir = [] {
    const char* env = std::getenv("EMBER_BENCH_DIR");
    fs::path d = fs::path(env ? env : fs::temp_directory_path().string()) /
                 absl::StrCat("dcp_bench_", ::getpid());
    fs::create_directories(d);
    return d.string();
  }();
  return dir;
}

const std::vector<std::pair<std::string, Tensor>>& State() {
  static const auto state = [] {
    std::vector<std::pair<std::string, Tensor>> s;
    for (int i = 0; i < kTensors; ++i) {
      s.push_back({absl::StrCat("layers.", i, ".weight"), randn({kRows, kCols})});
    }
    return s;
  }();
  return state;
}

// Rank r of `world`'s rows of every tensor.
StateDict Rows(int r, int world) {
  StateDict sd;
  const int64_t start = kRows * r / world, end = kRows * (r + 1) / world;
  for (const auto& [k, t] : State()) {
    sd.push_back({k, shard(t.narrow(0, start, end - start), {kRows, kCols}, {start, 0})});
  }
  return sd;
}

void Report(benchmark::State& state) { state.SetBytesProcessed(state.iterations() * kBytes); }

void BM_TorchSave(benchmark::State& state) {
  const std::string path = Dir() + "/state.pt";
  for (auto _ : state) {
    absl::Status s = ember::save(State(), path);
    if (!s.ok()) state.SkipWithError(s.ToString().c_str());
  }
  Report(state);
}

void BM_TorchLoad(benchmark::State& state) {
  const std::string path = Dir() + "/state_load.pt";
  (void)ember::save(State(), path);
  for (auto _ : state) {
    auto sd = ember::load(path);
    if (!sd.ok()) state.SkipWithError(sd.status().ToString().c_str());
    benchmark::DoNotOptimize(sd);
  }
  Report(state);
}

// One process (no group); arg: sync_files.
void BM_DcpSave(benchmark::State& state) {
  const std::string path = Dir() + "/dcp";
  StateDict sd = Rows(0, 1);
  for (auto _ : state) {
    absl::Status s = save(sd, {.path = path, .sync_files = state.range(0) != 0});
    if (!s.ok()) state.SkipWithError(s.ToString().c_str());
  }
  Report(state);
}

// `world` ranks as threads over the tcp backend, each saving its rows; rank
// 0 times the iterations and tells the others (a broadcast) whether to go on.
void BM_DcpSaveRanks(benchmark::State& state) {
  const int world = static_cast<int>(state.range(0));
  const std::string path = Dir() + "/dcp_ranks";
  absl::Status s = testing::RunRanks(world, [&](testing::Rank& me) -> absl::Status {
    StateDict sd = Rows(me.rank, world);
    Tensor go = zeros({1}, kInt64);
    auto next = [&](int64_t v) -> absl::Status {
      go.fill_(v);
      return testing::Finish(me.group->broadcast(go));
    };
    if (me.rank == 0) {
      for (auto _ : state) {
        absl::Status n = next(1);
        if (!n.ok()) return n;
        absl::Status s = save(sd, {.path = path, .process_group = me.group, .sync_files = false});
        if (!s.ok()) return s;
      }
      return next(0);
    }
    while (true) {
      absl::Status n = next(0);
      if (!n.ok()) return n;
      if (go.item<int64_t>() == 0) return absl::OkStatus();
      absl::Status s = save(sd, {.path = path, .process_group = me.group, .sync_files = false});
      if (!s.ok()) return s;
    }
  });
  if (!s.ok()) state.SkipWithError(s.ToString().c_str());
  Report(state);
}

const std::string& SavedDcp() {
  static const std::string path = [] {
    std::string p = Dir() + "/dcp_load";
    (void)save(Rows(0, 1), {.path = p, .sync_files = false});
    return p;
  }();
  return path;
}

// Into preallocated tensors of the saved layout (the in-place read path).
void BM_DcpLoadInPlace(benchmark::State& state) {
  StateDict sd;
  for (const auto& [k, t] : State()) sd.push_back({k, replicated(empty({kRows, kCols}))});
  for (auto _ : state) {
    absl::Status s = load(sd, {.path = SavedDcp()});
    if (!s.ok()) state.SkipWithError(s.ToString().c_str());
  }
  Report(state);
}

// Allocating, as torch.load does.
void BM_DcpLoadFull(benchmark::State& state) {
  for (auto _ : state) {
    auto sd = load_full_state_dict(SavedDcp());
    if (!sd.ok()) state.SkipWithError(sd.status().ToString().c_str());
    benchmark::DoNotOptimize(sd);
  }
  Report(state);
}

// Resharded: the one-rank checkpoint read as column halves (strided
// targets, partial rows of every chunk), both halves by this thread.
void BM_DcpLoadColumnHalves(benchmark::State& state) {
  std::vector<StateDict> halves(2);
  for (int h = 0; h < 2; ++h) {
    for (const auto& [k, t] : State()) {
      halves[h].push_back(
          {k, shard(empty({kRows, kCols / 2}), {kRows, kCols}, {0, h * kCols / 2})});
    }
  }
  for (auto _ : state) {
    for (const StateDict& sd : halves) {
      absl::Status s = load(sd, {.path = SavedDcp()});
      if (!s.ok()) state.SkipWithError(s.ToString().c_str());
    }
  }
  Report(state);
}

BENCHMARK(BM_TorchSave)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_DcpSave)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_DcpSaveRanks)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_TorchLoad)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_DcpLoadInPlace)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_DcpLoadFull)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_DcpLoadColumnHalves)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace ember::distributed::checkpoint
