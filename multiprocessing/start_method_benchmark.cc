// Starting and joining one child that does nothing, under each start method
// (fork is the baseline; BENCHMARKS.md gives the others as ratios of it).
//
//   bazel run -c opt //multiprocessing:start_method_benchmark -- --benchmark_repetitions=3
//
// Every case runs a registered entry point through Context::process and
// joins it: fork forks this process; spawn forks and execs this binary, whose
// main() runs the child; forkserver asks this process's server to fork (the
// server is started before the timing: its own start, one spawn, is paid once
// per process and is not counted).
#include <string>

#include "benchmark/benchmark.h"
#include "multiprocessing/process.h"

namespace ember::multiprocessing {
namespace {

absl::Status NothingEntry(int rank, absl::Span<const Value> args) { return absl::OkStatus(); }
EMBER_REGISTER_ENTRY_POINT("nothing", NothingEntry);

const char* MethodOf(int64_t code) {
  return code == 0 ? "fork" : code == 1 ? "spawn" : "forkserver";
}

void StartAndJoin(benchmark::State& state, const Context& ctx) {
  absl::StatusOr<Process> p = ctx.process("nothing");
  if (!p.ok()) {
    state.SkipWithError(std::string(p.status().message()).c_str());
    return;
  }
  absl::StatusOr<ExitStatus> e = p->join(absl::Seconds(60));
  if (!e.ok() || !e->ok()) state.SkipWithError("the child did not end cleanly");
}

void BM_StartJoin(benchmark::State& state) {
  const char* method = MethodOf(state.range(0));
  state.SetLabel(method);
  absl::StatusOr<Context> ctx = get_context(method);
  if (!ctx.ok()) {
    state.SkipWithError(std::string(ctx.status().message()).c_str());
    return;
  }
  StartAndJoin(state, *ctx);  // a forkserver's server starts here, untimed
  for (auto _ : state) StartAndJoin(state, *ctx);
}
BENCHMARK(BM_StartJoin)
    ->Arg(0)
    ->Arg(1)
    ->Arg(2)
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
