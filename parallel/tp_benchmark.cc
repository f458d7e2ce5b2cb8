// Tensor-parallel step of the MLP Linear(1024, 4096) -> GELU -> Linear(4096,
// 1024) (ColwiseParallel, RowwiseParallel) at TP=2 and TP=4, processes on
// this host over tcp with one thread each, beside one process running the whole
// MLP on the same batch of 64 rows with one thread: forward, backward of
// (y * w).sum(), zero_grad. Prints the median step of `--steps` (default
// 30, the first 5 not counted) for each. parallel/torch_tp_bench.py is
// PyTorch's side (gloo, the same shapes and protocol).
//
//   bazel run -c opt //parallel:tp_benchmark -- --steps=30
//
// Rank 0 runs the one-process row first, then forks the other ranks for
// each TP row.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "distributed/device_mesh.h"
#include "distributed/distributed.h"
#include "parallel/tensor_parallel.h"
#include "parallel/tensor_parallel_testing.h"
#include "tensor/factories.h"
#include "tensor/thread_pool.h"

namespace {

namespace dist = ::ember::distributed;
namespace par = ::ember::parallel;

constexpr int64_t kDim = 1024;
constexpr int64_t kHidden = 4096;
constexpr int64_t kBatch = 64;
constexpr int kWarmup = 5;

void Check(const absl::Status& status, const char* what) {
  if (!status.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, std::string(status.message()).c_str());
    std::exit(1);
  }
}

// The median of `steps` timed steps after kWarmup untimed ones, in ms.
double MedianStepMs(ember::nn::Module& model, int steps) {
  const ember::Tensor x = ember::randn({kBatch, kDim});
  const ember::Tensor w = ember::randn({kBatch, kDim});
  std::vector<double> ms;
  for (int i = 0; i < kWarmup + steps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    (model(x) * w).sum().backward();
    model.zero_grad();
    const auto end = std::chrono::steady_clock::now();
    if (i >= kWarmup) ms.push_back(std::chrono::duration<double, std::milli>(end - start).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// TP=n over n processes (this one rank 0, n - 1 forked); rank 0 prints the
// median step. Returns 0, or non-zero when a rank failed.
int RunTp(const std::shared_ptr<ember::nn::Module>& whole, int n, int steps) {
  char dir_template[] = "/tmp/ember_tp_benchmark_XXXXXX";
  const char* dir = mkdtemp(dir_template);
  if (dir == nullptr) return 1;
  std::vector<pid_t> children;
  int rank = 0;
  for (int r = 1; r < n; ++r) {
    const pid_t child = fork();
    if (child == 0) {
      rank = r;
      children.clear();
      break;
    }
    children.push_back(child);
  }
  Check(dist::init_process_group({.backend = "tcp",
                                  .init_method = absl::StrCat("file://", dir, "/store"),
                                  .world_size = n,
                                  .rank = rank}),
        "init_process_group");
  absl::StatusOr<dist::DeviceMesh> mesh = dist::init_device_mesh("cpu", {n}, {"tp"});
  Check(mesh.status(), "init_device_mesh");
  absl::StatusOr<std::shared_ptr<ember::nn::Module>> tp = par::parallelize_module(
      whole, *mesh, {{"0", par::ColwiseParallel{}}, {"2", par::RowwiseParallel{}}});
  Check(tp.status(), "parallelize_module");
  const double tp_ms = MedianStepMs(**tp, steps);
  if (rank == 0) {
    std::printf("TpStep tp=%d batch=%lld median_ms=%.3f\n", n, static_cast<long long>(kBatch),
                tp_ms);
    std::fflush(stdout);
  }
  Check(dist::destroy_process_group(), "destroy_process_group");
  if (rank != 0) _exit(0);
  int failed = 0;
  for (const pid_t child : children) {
    int status = 0;
    waitpid(child, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) failed = 1;
  }
  return failed;
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 30;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--steps=", 8) == 0) steps = std::max(1, std::atoi(argv[i] + 8));
  }
  ember::set_num_threads(1);
  ember::manual_seed(0);
  std::shared_ptr<ember::nn::Module> whole = par::testing::MakeMlp(kDim, kHidden);
  std::printf("OneProcessStep batch=%lld median_ms=%.3f\n", static_cast<long long>(kBatch),
              MedianStepMs(*whole, steps));
  std::fflush(stdout);

  for (const int n : {2, 4}) {
    const int failed = RunTp(whole, n, steps);
    if (failed != 0) return failed;
  }
  return 0;
}

