// Training time lost per checkpoint: a loop of steps that each compute on
// and update a 64 MiB state (8 float32 tensors of 8 MiB: four 512x512
// products, then every state tensor updated in place), saving the state
// every `--every` steps (not after the last step), timed without checkpoints, with synchronous
// saves and with async saves (AsyncCheckpointer). Lost per checkpoint = (loop time
// - loop time without checkpoints) / checkpoints. testdata/
// torch_async_save_bench.py runs the same loop with PyTorch's dcp.save and
// dcp.async_save. Files go to $EMBER_BENCH_DIR, else the system temp
// directory; one process, no group. --direct_io=0 writes through the page
// cache (CheckpointOptions::direct_io).
//
//   bazel build -c opt //distributed/checkpoint:async_save_benchmark
//   bazel-bin/distributed/checkpoint/async_save_benchmark --steps=200 --every=50 --rounds=3
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "distributed/checkpoint/async_save.h"
#include "distributed/checkpoint/checkpoint.h"
#include "tensor/factories.h"

namespace ember::distributed::checkpoint {
namespace {

namespace fs = std::filesystem;

enum class Mode { kNone, kSync, kAsync };

std::string Dir() {
  const char* env = std::getenv("EMBER_BENCH_DIR");
  fs::path d = fs::path(env ? env : fs::temp_directory_path().string()) /
               absl::StrCat("async_bench_", ::getpid());
  fs::create_directories(d);
  return d.string();
}

// Time spent inside save() / async_save() calls, summed over a loop.
absl::Duration in_calls;
// --direct_io (CheckpointOptions::direct_io).
bool direct_io = true;

// Seconds for one loop of `steps` steps in `mode`. One checkpointer serves
// the whole run, as a job keeps one: after the warm-up its staging tensors
// are reused (reuse_staging_buffers).
double Loop(Mode mode, AsyncCheckpointer& checkpointer, std::vector<Tensor>& state,
            const Tensor& a, int steps, int every, const std::string& dir, int round) {
  in_calls = absl::ZeroDuration();
  const absl::Time start = absl::Now();
  for (int step = 1; step <= steps; ++step) {
    Tensor x = a;
    for (int i = 0; i < 4; ++i) x = x.matmul(a).mul(0.01);
    for (Tensor& t : state) t.add_(x.narrow(0, 0, 1).mean().item<float>() + 1e-3);
    if (mode == Mode::kNone || step % every != 0 || step == steps) continue;
    StateDict sd;
    for (size_t i = 0; i < state.size(); ++i) {
      sd.push_back({absl::StrCat("layers.", i, ".weight"), replicated(state[i])});
    }
    const std::string path =
        absl::StrCat(dir, "/", mode == Mode::kSync ? "s" : "a", round, "_", step);
    const CheckpointOptions options{.path = path, .direct_io = direct_io};
    const absl::Time call = absl::Now();
    if (mode == Mode::kSync) {
      if (absl::Status s = save(sd, options); !s.ok()) {
        std::fprintf(stderr, "save: %s\n", s.ToString().c_str());
        std::exit(1);
      }
    } else if (absl::StatusOr<std::shared_ptr<Future>> f =
                   checkpointer.async_save(sd, options);
               !f.ok()) {
      std::fprintf(stderr, "async_save: %s\n", f.status().ToString().c_str());
      std::exit(1);
    }
    in_calls += absl::Now() - call;
  }
  if (absl::Status s = checkpointer.wait(); !s.ok()) {  // the last save, inside the time
    std::fprintf(stderr, "async_save: %s\n", s.ToString().c_str());
    std::exit(1);
  }
  return absl::ToDoubleSeconds(absl::Now() - start);
}

// --name=N from the command line, else `fallback`.
int Flag(int argc, char** argv, const std::string& name, int fallback) {
  const std::string prefix = "--" + name + "=";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind(prefix, 0) == 0) return std::atoi(arg.c_str() + prefix.size());
  }
  return fallback;
}

int Main(int argc, char** argv) {
  const int steps = Flag(argc, argv, "steps", 200), every = Flag(argc, argv, "every", 50);
  const int rounds = Flag(argc, argv, "rounds", 3);
  direct_io = Flag(argc, argv, "direct_io", 1) != 0;
  if (steps < 2 || every < 1 || every >= steps) {
    std::fprintf(stderr, "need 1 <= --every < --steps, got --steps=%d --every=%d\n", steps, every);
    return 2;
  }
  std::vector<Tensor> state;
  for (int i = 0; i < 8; ++i) state.push_back(randn({2048, 1024}));
  const Tensor a = randn({512, 512});
  const std::string dir = Dir();
  const int checkpoints = (steps - 1) / every;
  std::printf("state 64 MiB, %d steps, a checkpoint every %d (%d per loop), files in %s%s\n",
              steps, every, checkpoints, dir.c_str(), direct_io ? "" : " (no direct I/O)");
  AsyncCheckpointer checkpointer;
  Loop(Mode::kAsync, checkpointer, state, a, every + 1, every, dir, -1);  // warm up every path
  std::vector<double> sync_lost, async_lost;
  for (int round = 0; round < rounds; ++round) {
    const double none = Loop(Mode::kNone, checkpointer, state, a, steps, every, dir, round);
    const double sync = Loop(Mode::kSync, checkpointer, state, a, steps, every, dir, round);
    const double sync_calls = absl::ToDoubleMilliseconds(in_calls) / checkpoints;
    const double async = Loop(Mode::kAsync, checkpointer, state, a, steps, every, dir, round);
    const double async_calls = absl::ToDoubleMilliseconds(in_calls) / checkpoints;
    std::printf(
        "round %d: loop %.3f s; save %.3f s (lost %.1f ms per checkpoint, %.1f ms in the "
        "call); async_save %.3f s (lost %.1f ms per checkpoint, %.1f ms in the call; %.1f%% of "
        "save's loss)\n",
        round, none, sync, (sync - none) / checkpoints * 1e3, sync_calls, async,
        (async - none) / checkpoints * 1e3, async_calls, 100.0 * (async - none) / (sync - none));
    std::fflush(stdout);
    sync_lost.push_back((sync - none) / checkpoints * 1e3);
    async_lost.push_back((async - none) / checkpoints * 1e3);
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  };
  std::printf("median over %d rounds: save lost %.1f ms per checkpoint, async_save %.1f ms (%.1f%%)\n",
              rounds, median(sync_lost), median(async_lost),
              100.0 * median(async_lost) / median(sync_lost));
  fs::remove_all(dir);
  return 0;
}

}  // namespace
}  // namespace ember::distributed::checkpoint

int main(int argc, char** argv) { return ember::distributed::checkpoint::Main(argc, argv); }
