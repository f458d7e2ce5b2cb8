// Training efficiency under failures: 3 replica groups (one process each,
// one thread, gloo) train with the fault-tolerance Manager for --duration
// seconds while group 1 is killed with SIGKILL every --kill_every seconds
// and started again at once; the replacement recovers the state from a
// peer. The job is parallel/testdata/torchft_train_bench.py's, PyTorch's
// side with torchft: Linear(64, 256) -> ReLU -> Linear(256, 256) -> ReLU ->
// Linear(256, 10), SGD lr 0.01 momentum 0.9, a global batch of 96 rows per
// committed step split over the participants; the lighthouse with
// min_replicas 2, join timeout 200 ms, heartbeat timeout 1 s; collectives
// time out after 1 s.
//
//   bench="bazel run -c opt //parallel:fault_tolerance_benchmark --"
//   $bench --duration=60 --kill_every=0
//   $bench --duration=60 --kill_every=15 --baseline=<steps_per_s of the first>
//
// Prints key=value lines: steps_per_s (commits of group 0, never killed,
// from 5 s after the start to the end), kills, each restart's time from
// starting the replacement to its first committed step and their median,
// efficiency against --baseline, steps_by_quorum_size; then "done".
//
// The controller serves the lighthouse and starts each group as this binary
// with --replica=K (posix_spawn, so no gRPC state crosses a fork).
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "distributed/elastic/lighthouse.h"
#include "nn/activation.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "nn/loss.h"
#include "nn/optim/sgd.h"
#include "parallel/fault_tolerance.h"
#include "tensor/factories.h"
#include "tensor/thread_pool.h"

extern char** environ;

namespace {

namespace elastic = ::ember::distributed::elastic;
using ember::Tensor;

constexpr int64_t kRows = 96;
constexpr int kGroups = 3;

struct Flags {
  double duration = 60;
  double kill_every = 15;
  double baseline = 0;
  int replica = -1;  // >= 0: run as that replica group
  std::string lighthouse;
  std::string dir;
};

int64_t NowNs() { return absl::ToUnixNanos(absl::Now()); }

// One replica group: trains until killed or told to stop (SIGTERM). Group 0
// appends "<ns> <step> <participants>" per commit to <dir>/commits; a
// replacement writes "<ns>" of its first commit to <dir>/first_<pid>.
int RunReplica(const Flags& f) {
  ember::set_num_threads(1);
  ember::manual_seed(0);
  auto model = std::make_shared<ember::nn::Sequential>(std::vector<std::shared_ptr<ember::nn::Module>>{
      std::make_shared<ember::nn::Linear>(64, 256), std::make_shared<ember::nn::ReLU>(),
      std::make_shared<ember::nn::Linear>(256, 256), std::make_shared<ember::nn::ReLU>(),
      std::make_shared<ember::nn::Linear>(256, 10)});
  ember::nn::optim::SGD opt(model->parameters(), {.lr = 0.01, .momentum = 0.9});
  auto ft = ember::parallel::Manager::create(model, &opt,
                                             {.lighthouse = f.lighthouse,
                                              .replica_id = absl::StrCat("replica_", f.replica),
                                              .backend = "gloo",
                                              .min_replicas = 2,
                                              .timeout = absl::Seconds(1),
                                              .quorum_timeout = absl::Seconds(30)});
  if (!ft.ok()) {
    std::fprintf(stderr, "replica %d: %s\n", f.replica, ft.status().ToString().c_str());
    return 1;
  }
  ember::Generator teacher(7);
  const Tensor w = ember::randn({64, 10}, {}, &teacher);
  std::ofstream commits;
  if (f.replica == 0) commits.open(f.dir + "/commits", std::ios::app);
  bool first = true;
  for (;;) {
    if (!(*ft)->start_quorum().ok()) {
      (*ft)->should_commit();
      continue;
    }
    const int64_t n = (*ft)->num_participants();
    const int64_t r = (*ft)->participant_rank();
    ember::Generator gen(1000 + (*ft)->current_step());
    const Tensor x = ember::randn({kRows, 64}, {}, &gen);
    const Tensor y = x.matmul(w).argmax(1);
    const int64_t lo = r * kRows / n, hi = (r + 1) * kRows / n;
    opt.zero_grad();
    ember::nn::functional::cross_entropy((*model)(x.narrow(0, lo, hi - lo)), y.narrow(0, lo, hi - lo))
        .backward();
    (*ft)->allreduce_gradients().IgnoreError();
    if (!(*ft)->should_commit()) continue;
    opt.step();
    if (f.replica == 0) commits << NowNs() << " " << (*ft)->current_step() << " " << n << "\n";
    if (first && f.replica == 1) {
      std::ofstream(absl::StrCat(f.dir, "/first_", getpid())) << NowNs() << "\n";
    }
    first = false;
  }
}

pid_t Spawn(const std::string& self, const Flags& f, int replica) {
  std::vector<std::string> args = {self, absl::StrCat("--replica=", replica),
                                   absl::StrCat("--lighthouse=", f.lighthouse),
                                   absl::StrCat("--dir=", f.dir)};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  if (posix_spawn(&pid, self.c_str(), nullptr, nullptr, argv.data(), environ) != 0) return -1;
  return pid;
}

int RunController(const Flags& f0) {
  Flags f = f0;
  char dir_template[] = "/tmp/ember_ft_benchmark_XXXXXX";
  if (mkdtemp(dir_template) == nullptr) return 1;
  f.dir = dir_template;
  auto lighthouse = elastic::LighthouseServer::create({.min_replicas = 2,
                                                       .join_timeout = absl::Milliseconds(200),
                                                       .heartbeat_timeout = absl::Seconds(1)});
  if (!lighthouse.ok()) {
    std::fprintf(stderr, "%s\n", lighthouse.status().ToString().c_str());
    return 1;
  }
  f.lighthouse = (*lighthouse)->address();
  char self[4096] = {};
  if (readlink("/proc/self/exe", self, sizeof(self) - 1) <= 0) return 1;
  const absl::Time start = absl::Now();
  std::vector<pid_t> pids;
  for (int g = 0; g < kGroups; ++g) pids.push_back(Spawn(self, f, g));
  std::map<pid_t, int64_t> spawned_ns;  // replacements of group 1
  int kills = 0;
  const absl::Time end = start + absl::Seconds(f.duration);
  absl::Time next_kill =
      f.kill_every > 0 ? start + absl::Seconds(f.kill_every) : absl::InfiniteFuture();
  while (absl::Now() < end) {
    absl::SleepFor(std::min(absl::Milliseconds(20), end - absl::Now()));
    if (absl::Now() >= next_kill && absl::Now() < end) {
      kill(pids[1], SIGKILL);
      waitpid(pids[1], nullptr, 0);
      ++kills;
      pids[1] = Spawn(self, f, 1);
      spawned_ns[pids[1]] = NowNs();
      next_kill += absl::Seconds(f.kill_every);
    }
  }
  for (pid_t p : pids) kill(p, SIGKILL);
  for (pid_t p : pids) waitpid(p, nullptr, 0);

  // Group 0's commits in the window [start + 5 s, end].
  const int64_t window_start = absl::ToUnixNanos(start + absl::Seconds(5));
  const int64_t window_end = absl::ToUnixNanos(end);
  std::ifstream in(f.dir + "/commits");
  int64_t ns = 0, step = 0, n = 0, counted = 0;
  std::map<int64_t, int64_t> by_size;
  while (in >> ns >> step >> n) {
    if (ns < window_start || ns > window_end) continue;
    ++counted;
    ++by_size[n];
  }
  const double window_s = absl::ToDoubleSeconds(end - (start + absl::Seconds(5)));
  const double steps_per_s = counted / window_s;
  std::printf("steps_per_s=%.2f\nwindow_s=%.2f\ncommitted_steps=%lld\nkills=%d\n", steps_per_s,
              window_s, static_cast<long long>(counted), kills);
  std::string sizes;
  for (const auto& [size, count] : by_size) absl::StrAppend(&sizes, sizes.empty() ? "" : ",", size, ":", count);
  std::printf("steps_by_quorum_size=%s\n", sizes.c_str());
  std::vector<double> restarts;
  for (const auto& [pid, t0] : spawned_ns) {
    std::ifstream first(absl::StrCat(f.dir, "/first_", pid));
    int64_t t1 = 0;
    if (first >> t1) {
      restarts.push_back((t1 - t0) / 1e9);
      std::printf("restart_%zu_s=%.3f\n", restarts.size(), restarts.back());
    }
  }
  if (!restarts.empty()) {
    std::sort(restarts.begin(), restarts.end());
    std::printf("restart_median_s=%.3f\n", restarts[restarts.size() / 2]);
  }
  if (f.baseline > 0) std::printf("efficiency=%.3f\n", steps_per_s / f.baseline);
  std::printf("done\n");
  std::string cleanup = absl::StrCat("rm -rf ", f.dir);
  return std::system(cleanup.c_str()) == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&](const char* prefix) -> const char* {
      const size_t n = std::strlen(prefix);
      return arg.compare(0, n, prefix) == 0 ? argv[i] + n : nullptr;
    };
    if (const char* v = value("--duration=")) f.duration = std::atof(v);
    else if (const char* v = value("--kill_every=")) f.kill_every = std::atof(v);
    else if (const char* v = value("--baseline=")) f.baseline = std::atof(v);
    else if (const char* v = value("--replica=")) f.replica = std::atoi(v);
    else if (const char* v = value("--lighthouse=")) f.lighthouse = v;
    else if (const char* v = value("--dir=")) f.dir = v;
    else {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  if (f.duration <= 5) {
    std::fprintf(stderr, "--duration must exceed the 5 s warm-up, got %g\n", f.duration);
    return 2;
  }
  return f.replica >= 0 ? RunReplica(f) : RunController(f);
}
