// Training efficiency under failures: --groups replica groups (one process
// each, one thread, gloo) train with the fault-tolerance Manager for
// --duration seconds while group 1 is killed with SIGKILL every
// --kill_every seconds and started again at once; the replacement recovers
// the state from a peer. The job is parallel/testdata/torchft_train_bench.py's,
// PyTorch's side with torchft. --model=mlp: Linear(64, 256) -> ReLU ->
// Linear(256, 256) -> ReLU -> Linear(256, 10), a global batch of 96 rows of
// 64 features per committed step; --model=resnet18: ResNet-18 with 10
// classes on 3x32x32 images, a global batch of 24; split over the step's
// participants (96 and 24 split evenly over 2, 3 and 4). SGD lr 0.01
// momentum 0.9; the lighthouse with min_replicas 2, join timeout
// --join_timeout_ms (200), heartbeat timeout 1 s; collectives time out after
// 1 s (the MLP) or 10 s (ResNet-18, whose 45 MB all-reduce and 90 MB state
// transfer take longer than 1 s on 2 cores). The quorum overlaps each step
// (Note [Overlapping the quorum]); --sync_quorum asks it before each step;
// --quorum_every=N asks the lighthouse every N committed steps (Note [Asking
// every few steps]; 1 by default).
//
// --elastic: the same job under restart-based elastic training instead:
// tools/launch (--launch, default bazel-bin's next to this binary) with
// --max_restarts and --serve_store starts --groups workers, one DDP rank
// each over gloo; rank 0 saves the model, the momentum and the step every
// --save_every steps (serialization's save, an atomic rename), and every
// start resumes from that file. Killing rank 1 makes the launcher stop and
// restart every worker, which lose the steps since the last save.
//
//   bazel build -c opt //tools/launch //parallel:fault_tolerance_benchmark
//   bench=bazel-bin/parallel/fault_tolerance_benchmark
//   $bench --duration=60 --kill_every=0
//   $bench --duration=60 --kill_every=15 --baseline=<steps_per_s of the first>
//   $bench --elastic --duration=60 --kill_every=15 --baseline=...
//
// Prints key=value lines: steps_per_s (progress of group 0, never killed:
// its committed step at the end less the one 5 s after the start, over the
// window; a restarted elastic job's repeated steps do not count), kills,
// each restart's time from starting the replacement (the kill, elastic) to
// its first committed step and their median, efficiency against
// --baseline, steps_by_quorum_size; then "done".
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
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "distributed/distributed.h"
#include "distributed/elastic/lighthouse.h"
#include "distributed/testing/free_port.h"
#include "nn/activation.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "nn/loss.h"
#include "nn/models/resnet.h"
#include "nn/optim/sgd.h"
#include "parallel/distributed_data_parallel.h"
#include "parallel/fault_tolerance.h"
#include "serialization/serialization.h"
#include "tensor/factories.h"
#include "tensor/thread_pool.h"

extern char** environ;

namespace {

namespace elastic = ::ember::distributed::elastic;
using ember::Tensor;

struct Flags {
  double duration = 60;
  double kill_every = 15;
  double baseline = 0;
  int groups = 3;
  std::string model = "mlp";
  bool elastic = false;
  std::string launch;  // --elastic: the launcher
  int save_every = 100;
  bool sync_quorum = false;  // the quorum before each step, not overlapped
  int quorum_every = 1;      // ManagerOptions::quorum_every
  int join_timeout_ms = 200;
  int replica = -1;  // >= 0: run as that replica group
  bool elastic_worker = false;
  std::string lighthouse;
  std::string dir;
};

int64_t NowNs() { return absl::ToUnixNanos(absl::Now()); }

bool IsResNet(const Flags& f) { return f.model == "resnet18"; }
int64_t GlobalRows(const Flags& f) { return IsResNet(f) ? 24 : 96; }
absl::Duration Timeout(const Flags& f) { return absl::Seconds(IsResNet(f) ? 10 : 1); }

std::shared_ptr<ember::nn::Module> MakeModel(const Flags& f) {
  ember::manual_seed(0);
  if (IsResNet(f)) {
    return std::make_shared<ember::nn::models::ResNet18>(
        ember::nn::models::ResNetOptions{.num_classes = 10});
  }
  return std::make_shared<ember::nn::Sequential>(std::vector<std::shared_ptr<ember::nn::Module>>{
      std::make_shared<ember::nn::Linear>(64, 256), std::make_shared<ember::nn::ReLU>(),
      std::make_shared<ember::nn::Linear>(256, 256), std::make_shared<ember::nn::ReLU>(),
      std::make_shared<ember::nn::Linear>(256, 10)});
}

// Rows [lo, hi) of committed step `step`'s global batch: x from a generator
// seeded 1000 + step, labels argmax(x.flatten(1) @ w), w seeded 7.
std::pair<Tensor, Tensor> Batch(const Flags& f, int64_t step, int64_t lo, int64_t hi) {
  const int64_t features = IsResNet(f) ? 3 * 32 * 32 : 64;
  ember::Generator teacher(7);
  const Tensor w = ember::randn({features, 10}, {}, &teacher);
  ember::Generator gen(1000 + step);
  const Tensor x = IsResNet(f) ? ember::randn({GlobalRows(f), 3, 32, 32}, {}, &gen)
                               : ember::randn({GlobalRows(f), features}, {}, &gen);
  const Tensor y = x.reshape({GlobalRows(f), features}).matmul(w).argmax(1);
  return {x.narrow(0, lo, hi - lo), y.narrow(0, lo, hi - lo)};
}

// One replica group: trains until killed or told to stop (SIGTERM). Group 0
// appends "<ns> <step> <participants>" per commit to <dir>/commits; a
// replacement writes "<ns>" of its first commit to <dir>/first_<pid>.
int RunReplica(const Flags& f) {
  ember::set_num_threads(1);
  auto model = MakeModel(f);
  ember::nn::optim::SGD opt(model->parameters(), {.lr = 0.01, .momentum = 0.9});
  auto ft = ember::parallel::Manager::create(model, &opt,
                                             {.lighthouse = f.lighthouse,
                                              .replica_id = absl::StrCat("replica_", f.replica),
                                              .backend = "gloo",
                                              .min_replicas = 2,
                                              .timeout = Timeout(f),
                                              .quorum_timeout = absl::Seconds(30),
                                              .async_quorum = !f.sync_quorum,
                                              .quorum_every = f.quorum_every});
  if (!ft.ok()) {
    std::fprintf(stderr, "replica %d: %s\n", f.replica, ft.status().ToString().c_str());
    return 1;
  }
  std::ofstream commits;
  if (f.replica == 0) commits.open(f.dir + "/commits", std::ios::app);
  bool first = true;
  const int64_t rows = GlobalRows(f);
  for (;;) {
    if (!(*ft)->start_quorum().ok()) {
      (*ft)->should_commit();
      continue;
    }
    const int64_t n = (*ft)->num_participants();
    const int64_t r = (*ft)->participant_rank();
    const auto [x, y] = Batch(f, (*ft)->current_step(), r * rows / n, (r + 1) * rows / n);
    opt.zero_grad();
    ember::nn::functional::cross_entropy((*model)(x), y).backward();
    (*ft)->allreduce_gradients().IgnoreError();
    if (!(*ft)->should_commit()) continue;
    opt.step();
    if (f.replica == 0) commits << NowNs() << " " << (*ft)->current_step() << " " << n << std::endl;
    if (first && f.replica == 1) {
      std::ofstream(absl::StrCat(f.dir, "/first_", getpid())) << NowNs() << "\n";
    }
    first = false;
  }
}

// --elastic: one DDP rank under the launcher. Resumes from <dir>/ckpt.pt
// (the model's state, the momentum buffers and the step), trains, and rank 0
// saves every --save_every steps; rank 0 logs its commits as RunReplica's
// group 0 does, and the first commit of each start to <dir>/first_<pid>.
int RunElasticWorker(const Flags& f) {
  namespace dist = ember::distributed;
  ember::set_num_threads(1);
  std::ofstream(absl::StrCat(f.dir, "/pid_", std::getenv("RANK"))) << getpid() << "\n";
  if (absl::Status s = dist::init_process_group({.backend = "gloo", .timeout = Timeout(f)});
      !s.ok()) {
    std::fprintf(stderr, "elastic worker: %s\n", s.ToString().c_str());
    return 1;
  }
  const int rank = dist::get_rank();
  const int world = dist::get_world_size();
  auto model = MakeModel(f);
  ember::nn::optim::SGD opt(model->parameters(), {.lr = 0.01, .momentum = 0.9});
  const std::string ckpt = f.dir + "/ckpt.pt";
  int64_t step = 0;
  if (auto loaded = ember::load(ckpt); loaded.ok()) {
    ember::StateDict params;
    ember::nn::optim::OptimizerStateDict state = opt.state_dict();
    for (auto& [name, t] : *loaded) {
      absl::string_view index_text = name;
      int64_t index = 0;
      if (name == "step") {
        step = t.item<int64_t>();
      } else if (absl::ConsumePrefix(&index_text, "momentum.") &&
                 absl::SimpleAtoi(index_text, &index)) {
        state.state.push_back({index, {{"momentum_buffer", t}}});
      } else {
        params.emplace_back(name, t);
      }
    }
    absl::Status s = model->load_state_dict(params);
    if (s.ok()) s = opt.load_state_dict(state);
    if (!s.ok()) {
      std::fprintf(stderr, "elastic worker: %s: %s\n", ckpt.c_str(), s.ToString().c_str());
      return 1;
    }
  }
  auto ddp = ember::parallel::DistributedDataParallel::create(model);
  if (!ddp.ok()) {
    std::fprintf(stderr, "elastic worker: %s\n", ddp.status().ToString().c_str());
    return 1;
  }
  std::ofstream commits;
  if (rank == 0) commits.open(f.dir + "/commits", std::ios::app);
  const int64_t rows = GlobalRows(f);
  bool first = true;
  for (;;) {
    const auto [x, y] = Batch(f, step, rank * rows / world, (rank + 1) * rows / world);
    opt.zero_grad();
    ember::nn::functional::cross_entropy((**ddp)(x), y).backward();
    opt.step();
    ++step;
    if (rank != 0) continue;
    commits << NowNs() << " " << step << " " << world << std::endl;
    if (first) std::ofstream(absl::StrCat(f.dir, "/first_", getpid())) << NowNs() << "\n";
    first = false;
    if (step % f.save_every == 0) {
      ember::StateDict out = model->state_dict();
      const ember::nn::optim::OptimizerStateDict state = opt.state_dict();
      for (const auto& param : state.state) {
        for (const auto& [key, value] : param.values) {
          if (key == "momentum_buffer") out.emplace_back(absl::StrCat("momentum.", param.index), value);
        }
      }
      out.emplace_back("step", ember::tensor<int64_t>({step}));
      if (absl::Status s = ember::save(out, ckpt); !s.ok()) {
        std::fprintf(stderr, "elastic worker: %s\n", s.ToString().c_str());
        return 1;
      }
    }
  }
}

pid_t Spawn(const std::vector<std::string>& command) {
  std::vector<std::string> args = command;
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  if (posix_spawn(&pid, args[0].c_str(), nullptr, nullptr, argv.data(), environ) != 0) return -1;
  return pid;
}

// This binary's own flags for a child of the controller.
std::vector<std::string> ChildArgs(const std::string& self, const Flags& f) {
  std::vector<std::string> args = {
      self, absl::StrCat("--model=", f.model), absl::StrCat("--save_every=", f.save_every),
      absl::StrCat("--lighthouse=", f.lighthouse), absl::StrCat("--dir=", f.dir)};
  if (f.sync_quorum) args.push_back("--sync_quorum");
  args.push_back(absl::StrCat("--quorum_every=", f.quorum_every));
  return args;
}

pid_t SpawnReplica(const std::string& self, const Flags& f, int replica) {
  std::vector<std::string> args = ChildArgs(self, f);
  args.push_back(absl::StrCat("--replica=", replica));
  return Spawn(args);
}

// --elastic: the launcher running --groups workers of this binary.
pid_t SpawnLaunch(const std::string& self, const Flags& f) {
  std::vector<std::string> args = {f.launch, absl::StrCat("--nproc_per_node=", f.groups),
                                   "--max_restarts=1000", "--serve_store", "--use_env",
                                   "--master_addr=127.0.0.1",
                                   absl::StrCat("--master_port=", ember::distributed::testing::FreePort())};
  for (const std::string& a : ChildArgs(self, f)) args.push_back(a);
  args.push_back("--elastic_worker");
  return Spawn(args);
}

// The pid the worker of `rank` wrote at its start (-1 before the first).
pid_t WorkerPid(const Flags& f, int rank) {
  std::ifstream in(absl::StrCat(f.dir, "/pid_", rank));
  pid_t pid = -1;
  in >> pid;
  return pid;
}

int RunController(const Flags& f0) {
  Flags f = f0;
  char dir_template[] = "/tmp/ember_ft_benchmark_XXXXXX";
  if (mkdtemp(dir_template) == nullptr) return 1;
  f.dir = dir_template;
  char self_path[4096] = {};
  if (readlink("/proc/self/exe", self_path, sizeof(self_path) - 1) <= 0) return 1;
  const std::string self = self_path;
  std::unique_ptr<elastic::LighthouseServer> lighthouse;
  if (f.elastic) {
    if (f.launch.empty()) {
      f.launch = self.substr(0, self.rfind('/')) + "/../tools/launch/launch";
    }
    if (access(f.launch.c_str(), X_OK) != 0) {
      std::fprintf(stderr, "--elastic: no launcher at %s; bazel build //tools/launch or pass --launch\n",
                   f.launch.c_str());
      return 2;
    }
  } else {
    auto server = elastic::LighthouseServer::create({.min_replicas = 2,
                                                     .join_timeout = absl::Milliseconds(f.join_timeout_ms),
                                                     .heartbeat_timeout = absl::Seconds(1)});
    if (!server.ok()) {
      std::fprintf(stderr, "%s\n", server.status().ToString().c_str());
      return 1;
    }
    lighthouse = std::move(*server);
    f.lighthouse = lighthouse->address();
  }
  const absl::Time start = absl::Now();
  std::vector<pid_t> pids;
  if (f.elastic) {
    pids.push_back(SpawnLaunch(self, f));
  } else {
    for (int g = 0; g < f.groups; ++g) pids.push_back(SpawnReplica(self, f, g));
  }
  std::vector<int64_t> kill_ns;  // when group 1 was killed (its replacement started)
  const absl::Time end = start + absl::Seconds(f.duration);
  absl::Time next_kill =
      f.kill_every > 0 ? start + absl::Seconds(f.kill_every) : absl::InfiniteFuture();
  while (absl::Now() < end) {
    absl::SleepFor(std::min(absl::Milliseconds(20), end - absl::Now()));
    if (absl::Now() >= next_kill && absl::Now() < end) {
      next_kill += absl::Seconds(f.kill_every);
      if (f.elastic) {
        const pid_t victim = WorkerPid(f, 1);
        if (victim <= 0 || kill(victim, SIGKILL) != 0) continue;  // restarting: try at the next
        kill_ns.push_back(NowNs());
      } else {
        kill(pids[1], SIGKILL);
        waitpid(pids[1], nullptr, 0);
        pids[1] = SpawnReplica(self, f, 1);
        kill_ns.push_back(NowNs());
      }
    }
  }
  for (pid_t p : pids) kill(p, f.elastic ? SIGTERM : SIGKILL);
  for (pid_t p : pids) waitpid(p, nullptr, 0);

  // Group 0's progress over the window [start + 5 s, end]: the step of its
  // last commit before each end.
  const int64_t window_start = absl::ToUnixNanos(start + absl::Seconds(5));
  const int64_t window_end = absl::ToUnixNanos(end);
  std::ifstream in(f.dir + "/commits");
  int64_t ns = 0, step = 0, n = 0, at_start = 0, at_end = 0, lines = 0;
  std::map<int64_t, int64_t> by_size;
  while (in >> ns >> step >> n) {
    if (ns <= window_start) at_start = step;
    if (ns <= window_end) at_end = step;
    if (ns < window_start || ns > window_end) continue;
    ++lines;
    ++by_size[n];
  }
  const double window_s = absl::ToDoubleSeconds(end - (start + absl::Seconds(5)));
  const int64_t progress = at_end - at_start;
  const double steps_per_s = progress / window_s;
  std::printf("mode=%s\nmodel=%s\ngroups=%d\n", f.elastic ? "elastic" : "per_step", f.model.c_str(),
              f.groups);
  std::printf("steps_per_s=%.2f\nwindow_s=%.2f\ncommitted_steps=%lld\nsteps_run=%lld\nkills=%zu\n",
              steps_per_s, window_s, static_cast<long long>(progress),
              static_cast<long long>(lines), kill_ns.size());
  std::string sizes;
  for (const auto& [size, count] : by_size) absl::StrAppend(&sizes, sizes.empty() ? "" : ",", size, ":", count);
  std::printf("steps_by_quorum_size=%s\n", sizes.c_str());
  // Each kill's restart: the first first_<pid> time after it.
  std::vector<int64_t> firsts;
  for (const auto& entry : std::filesystem::directory_iterator(f.dir)) {
    if (entry.path().filename().string().rfind("first_", 0) != 0) continue;
    std::ifstream first(entry.path());
    int64_t t = 0;
    if (first >> t) firsts.push_back(t);
  }
  std::sort(firsts.begin(), firsts.end());
  std::vector<double> restarts;
  for (int64_t t0 : kill_ns) {
    auto it = std::upper_bound(firsts.begin(), firsts.end(), t0);
    if (it == firsts.end()) continue;
    restarts.push_back((*it - t0) / 1e9);
    std::printf("restart_%zu_s=%.3f\n", restarts.size(), restarts.back());
  }
  if (!restarts.empty()) {
    std::sort(restarts.begin(), restarts.end());
    std::printf("restart_median_s=%.3f\n", restarts[restarts.size() / 2]);
  }
  if (f.baseline > 0) std::printf("efficiency=%.3f\n", steps_per_s / f.baseline);
  std::printf("done\n");
  std::error_code ec;
  std::filesystem::remove_all(f.dir, ec);
  return ec ? 1 : 0;
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
    else if (const char* v = value("--groups=")) f.groups = std::atoi(v);
    else if (const char* v = value("--model=")) f.model = v;
    else if (arg == "--elastic") f.elastic = true;
    else if (const char* v = value("--launch=")) f.launch = v;
    else if (const char* v = value("--save_every=")) f.save_every = std::atoi(v);
    else if (arg == "--elastic_worker") f.elastic_worker = true;
    else if (arg == "--sync_quorum") f.sync_quorum = true;
    else if (const char* v = value("--quorum_every=")) f.quorum_every = std::atoi(v);
    else if (const char* v = value("--join_timeout_ms=")) f.join_timeout_ms = std::atoi(v);
    else if (const char* v = value("--replica=")) f.replica = std::atoi(v);
    else if (const char* v = value("--lighthouse=")) f.lighthouse = v;
    else if (const char* v = value("--dir=")) f.dir = v;
    else {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  if (f.model != "mlp" && f.model != "resnet18") {
    std::fprintf(stderr, "--model must be mlp or resnet18, got %s\n", f.model.c_str());
    return 2;
  }
  if (f.groups < 2 || f.save_every < 1) {
    std::fprintf(stderr, "--groups must be at least 2 (got %d) and --save_every at least 1 (got %d)\n",
                 f.groups, f.save_every);
    return 2;
  }
  if (f.elastic_worker) return RunElasticWorker(f);
  if (f.duration <= 5) {
    std::fprintf(stderr, "--duration must exceed the 5 s warm-up, got %g\n", f.duration);
    return 2;
  }
  return f.replica >= 0 ? RunReplica(f) : RunController(f);
}
