// How fast the survivors of a killed rank are back at work (Note [Failing
// cleanly] and Note [Shrinking groups] in distributed.cc), on tcp and gloo,
// ranks as processes on this host over a FileStore:
//   abort_ms        from the victim's SIGKILL to abort() returning on rank 0
//                   (the survivors learn of the death from their pending
//                   all_reduce, then abort), and
//   first_op_ms     from the SIGKILL to the end of the first all_reduce on
//                   the group shrink_group made (the iteration's manual time).
// The baseline in the same binary, BM_FreshGroup, is what the same ranks pay
// for a new group and its first all_reduce without any failure, which is
// what shrink_group does after the abort.
//
//   bazel run -c opt //distributed:failure_benchmark
//   bazel run -c opt //distributed:failure_benchmark -- --benchmark_filter=gloo
//   bazel run -c opt //distributed:failure_benchmark -- --ranks=4
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "benchmark/benchmark.h"
#include "distributed/distributed.h"
#include "distributed/file_store.h"
#include "distributed/prefix_store.h"
#include "distributed/testing/ranks.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"

namespace ember::distributed {
namespace {

int g_ranks = 3;

absl::Status Expect(bool ok, const char* what) {
  return ok ? absl::OkStatus() : absl::InternalError(what);
}

int64_t NowNs() { return absl::ToUnixNanos(absl::Now()); }

// One run of `g_ranks` processes; rank 0 writes "<abort ns> <first op ns>"
// (from the victim's kill, or from the start for a fresh group) to `out`.
absl::Status RunOnce(const std::string& backend, bool kill_one, const std::string& out) {
  std::vector<testing::ProcessResult> results = testing::RunRankProcesses(
      g_ranks,
      [&](testing::Rank& me) -> absl::Status {
        EMBER_ASSIGN_OR_RETURN(std::unique_ptr<FileStore> opened,
                               FileStore::open(me.temp_dir + "/files", absl::Seconds(60)));
        std::shared_ptr<Store> files(std::move(opened));
        const int victim = me.world_size - 1;
        const int64_t start = NowNs();
        EMBER_RETURN_IF_ERROR(
            init_process_group({.backend = backend,
                                .world_size = me.world_size,
                                .rank = me.rank,
                                .timeout = absl::Seconds(60),
                                .store = std::make_shared<PrefixStore>("job", files)}));
        Tensor t = ones({256}, kFloat32);  // 1 KiB
        EMBER_RETURN_IF_ERROR(all_reduce(t));
        int64_t abort_ns = 0;
        int64_t origin = start;
        if (kill_one) {
          EMBER_ASSIGN_OR_RETURN(Group world, get_default_group());
          if (me.rank == victim) {
            EMBER_RETURN_IF_ERROR(files->set("killed_at", absl::StrCat(NowNs())));
            raise(SIGKILL);
          }
          EMBER_ASSIGN_OR_RETURN(std::string killed, files->get("killed_at", absl::Seconds(30)));
          EMBER_RETURN_IF_ERROR(Expect(absl::SimpleAtoi(killed, &origin), "bad kill time"));
          // The all_reduce that needs the victim fails; the survivors abort.
          EMBER_ASSIGN_OR_RETURN(std::shared_ptr<Work> pending, world->allreduce(t));
          (void)pending->wait();
          world->abort();
          abort_ns = NowNs() - origin;
          EMBER_ASSIGN_OR_RETURN(Group shrunk, shrink_group({victim}));
          (void)shrunk;
        } else {
          EMBER_RETURN_IF_ERROR(destroy_process_group());
          origin = NowNs();
          EMBER_RETURN_IF_ERROR(
              init_process_group({.backend = backend,
                                  .world_size = me.world_size,
                                  .rank = me.rank,
                                  .timeout = absl::Seconds(60),
                                  .store = std::make_shared<PrefixStore>("fresh", files)}));
        }
        Tensor u = ones({256}, kFloat32);
        EMBER_RETURN_IF_ERROR(all_reduce(u));
        const int64_t first_ns = NowNs() - origin;
        if (me.rank == 0) {
          std::ofstream(out) << abort_ns << " " << first_ns << "\n";
        }
        return destroy_process_group();
      },
      {.backend = backend, .make_group = false});
  for (int r = 0; r < g_ranks; ++r) {
    if (kill_one && r == g_ranks - 1) continue;
    if (results[r].exit_code != 0) {
      return absl::InternalError(absl::StrCat("rank ", r, ": ", results[r].output));
    }
  }
  return absl::OkStatus();
}

void Run(benchmark::State& state, const std::string& backend, bool kill_one) {
  char path[] = "/tmp/ember_failure_benchmark_XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0) {
    state.SkipWithError("mkstemp failed");
    return;
  }
  close(fd);
  double abort_total = 0;
  int64_t runs = 0;
  for (auto _ : state) {
    absl::Status s = RunOnce(backend, kill_one, path);
    if (!s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      break;
    }
    std::ifstream in(path);
    int64_t abort_ns = 0, first_ns = 0;
    in >> abort_ns >> first_ns;
    abort_total += abort_ns / 1e6;
    ++runs;
    state.SetIterationTime(first_ns / 1e9);
  }
  unlink(path);
  if (runs > 0 && kill_one) state.counters["abort_ms"] = abort_total / runs;
  state.counters["ranks"] = g_ranks;
}

void BM_RecoverFromSigkill(benchmark::State& state, const char* backend) {
  Run(state, backend, true);
}
void BM_FreshGroup(benchmark::State& state, const char* backend) { Run(state, backend, false); }

BENCHMARK_CAPTURE(BM_RecoverFromSigkill, tcp, "tcp")
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_FreshGroup, tcp, "tcp")->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_RecoverFromSigkill, gloo, "gloo")
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_FreshGroup, gloo, "gloo")->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace ember::distributed

// --ranks=N (at least 2) before Google Benchmark's own flags.
int main(int argc, char** argv) {
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--ranks=", 8) == 0) {
      if (!absl::SimpleAtoi(argv[i] + 8, &ember::distributed::g_ranks) ||
          ember::distributed::g_ranks < 2) {
        fprintf(stderr, "failure_benchmark: --ranks needs a number of at least 2, got '%s'\n",
                argv[i] + 8);
        return 2;
      }
      continue;
    }
    rest.push_back(argv[i]);
  }
  int n = static_cast<int>(rest.size());
  benchmark::Initialize(&n, rest.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
