// Starting (and joining) one child that does nothing, under each start
// method (fork is the baseline; BENCHMARKS.md gives the others as ratios of
// it).
//
//   bazel run //multiprocessing:start_method_benchmark -- --benchmark_repetitions=5
//     --benchmark_enable_random_interleaving=true --benchmark_report_aggregates_only=true
//   (one command line)
//
// Every case runs a registered entry point through Context::process: fork
// forks this process; spawn forks and execs this binary, whose main() runs
// the child; forkserver asks this process's server to fork (the server is
// started before the timing: its own start, one spawn, is paid once per
// process and is not counted). BM_Start/<method>/1 times start and join,
// BM_Start/<method>/0 the start alone (the join is not timed). The joins
// differ in how they wait: fork's and spawn's poll waitpid with a backoff
// from 20 us to 5 ms, forkserver's wakes on the server's report.
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "multiprocessing/process.h"

namespace ember::multiprocessing {
namespace {

absl::Status NothingEntry(int rank, absl::Span<const Value> args) { return absl::OkStatus(); }
EMBER_REGISTER_ENTRY_POINT("nothing", NothingEntry);

const char* MethodOf(int64_t code) {
  return code == 0 ? "fork" : code == 1 ? "spawn" : "forkserver";
}

// Starts the idle child; joins it too with `join`, otherwise returns it.
std::optional<Process> Start(benchmark::State& state, const Context& ctx, bool join) {
  absl::StatusOr<Process> p = ctx.process("nothing");
  if (!p.ok()) {
    state.SkipWithError(std::string(p.status().message()).c_str());
    return std::nullopt;
  }
  if (join) {
    absl::StatusOr<ExitStatus> e = p->join(absl::Seconds(60));
    if (!e.ok() || !e->ok()) state.SkipWithError("the child did not end cleanly");
  }
  return *std::move(p);
}

// range(0): the start method (0 fork, 1 spawn, 2 forkserver); range(1): 1
// to time start and join, 0 to time the start alone (the join is not timed).
void BM_Start(benchmark::State& state) {
  const char* method = MethodOf(state.range(0));
  const bool join = state.range(1) != 0;
  state.SetLabel(absl::StrCat(method, join ? " start+join" : " start"));
  absl::StatusOr<Context> ctx = get_context(method);
  if (!ctx.ok()) {
    state.SkipWithError(std::string(ctx.status().message()).c_str());
    return;
  }
  (void)Start(state, *ctx, /*join=*/true);  // a forkserver's server starts here, untimed
  for (auto _ : state) {
    std::optional<Process> p = Start(state, *ctx, join);
    if (!join && p.has_value()) {
      state.PauseTiming();
      (void)p->join(absl::Seconds(60));
      p.reset();
      state.ResumeTiming();
    }
  }
}
BENCHMARK(BM_Start)
    ->ArgsProduct({{0, 1, 2}, {1, 0}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime()
    ->MinTime(1.0);

}  // namespace
}  // namespace ember::multiprocessing

int main(int argc, char** argv) {
  // Spawned children and the forkserver are this binary again.
  ember::multiprocessing::maybe_run_spawned_child();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
