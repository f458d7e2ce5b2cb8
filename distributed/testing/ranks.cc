#include "distributed/testing/ranks.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "distributed/backend_registry.h"
#include "distributed/file_store.h"
#include "distributed/hash_store.h"
#include "distributed/prefix_store.h"

namespace ember::distributed::testing {
namespace {

absl::Status RunOne(int rank, int world_size, std::shared_ptr<Store> store,
                    const std::function<absl::Status(Rank&)>& body, const RunRanksOptions& options,
                    const std::string& dir, std::vector<int> members = {}) {
  auto backend = find_backend(options.backend);
  if (!backend.ok()) return backend.status();
  BackendOptions b;
  b.store = store;
  b.store_prefix = options.store_prefix;
  b.rank = rank;
  b.size = world_size;
  b.timeout = options.timeout;
  b.ranks = std::move(members);
  b.pg_options = options.pg_options;
  auto group = (*backend)->create(b);
  if (!group.ok()) return group.status();
  Rank me{rank, world_size, *group, store, dir};
  return body(me);
}

std::string TempDir() {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string templ = absl::StrCat(base ? base : "/tmp", "/ember-ranks-XXXXXX");
  char* dir = mkdtemp(templ.data());
  return dir ? std::string(dir) : std::string("/tmp");
}

// --- Launched jobs (ranks.h) ---------------------------------------------------

// How long a rank of a launched job waits for the others' results.
constexpr absl::Duration kJobResultWait = absl::Minutes(5);

absl::StatusOr<std::shared_ptr<Store>> JobStore(const LaunchedJob& job) {
  static absl::StatusOr<std::shared_ptr<Store>>* store = [&] {
    auto opened = FileStore::open(job.store_path, absl::Seconds(60));
    return new absl::StatusOr<std::shared_ptr<Store>>(
        opened.ok()
            ? absl::StatusOr<std::shared_ptr<Store>>(std::shared_ptr<Store>(std::move(*opened)))
            : absl::StatusOr<std::shared_ptr<Store>>(opened.status()));
  }();
  return *store;
}

// Runs `run` as this process's rank of a run over the job's ranks
// 0..world_size-1 and returns every rank's result (what `run` returned
// there), or why they could not be had. Every process of the job calls
// this for every run, in the same order (the tests run in one order).
absl::StatusOr<std::vector<std::string>> RunInJob(
    int world_size, const std::function<std::string(std::shared_ptr<Store>, std::string)>& run) {
  static int next_run = 0;
  const int id = next_run++;
  const LaunchedJob job = *launched_job();
  if (world_size > job.world_size) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the test asks for ", world_size, " ranks but the launched job has ", job.world_size,
        " processes; start it with more (mpirun -np ", world_size, ")"));
  }
  auto store = JobStore(job);
  if (!store.ok()) return store.status();
  auto runs = std::make_shared<PrefixStore>(absl::StrCat("run", id), *store);
  if (job.rank < world_size) {
    const std::string dir = absl::StrCat(job.store_path, ".run", id);
    mkdir(dir.c_str(), 0700);
    absl::Status s = runs->set(absl::StrCat("result/", job.rank), run(runs, dir));
    if (!s.ok()) return s;
  }
  std::vector<std::string> results(world_size);
  for (int r = 0; r < world_size; ++r) {
    auto got = runs->get(absl::StrCat("result/", r), kJobResultWait);
    if (!got.ok()) return got.status();
    results[r] = *got;
  }
  return results;
}

std::vector<int> FirstRanks(int n) {
  std::vector<int> ranks(n);
  for (int r = 0; r < n; ++r) ranks[r] = r;
  return ranks;
}

std::vector<absl::Status> RunRanksInJob(int world_size,
                                        const std::function<absl::Status(Rank&)>& body,
                                        const RunRanksOptions& options) {
  const int rank = launched_job()->rank;
  auto results = RunInJob(world_size, [&](std::shared_ptr<Store> store, std::string dir) {
    absl::Status s = RunOne(rank, world_size, store, body, options, dir, FirstRanks(world_size));
    return absl::StrCat(static_cast<int>(s.code()), "|", s.message());
  });
  std::vector<absl::Status> statuses(world_size, results.status());
  if (!results.ok()) return statuses;
  for (int r = 0; r < world_size; ++r) {
    std::pair<std::string, std::string> f = absl::StrSplit((*results)[r], absl::MaxSplits('|', 1));
    int code = 0;
    if (!absl::SimpleAtoi(f.first, &code)) code = static_cast<int>(absl::StatusCode::kDataLoss);
    statuses[r] = absl::Status(static_cast<absl::StatusCode>(code), f.second);
  }
  return statuses;
}

std::vector<ProcessResult> RunRankProcessesInJob(int world_size,
                                                 const std::function<absl::Status(Rank&)>& body,
                                                 const RunRanksOptions& options) {
  const int rank = launched_job()->rank;
  auto results = RunInJob(world_size, [&](std::shared_ptr<Store> store, std::string dir) {
    absl::Status s;
    if (options.make_group) {
      s = RunOne(rank, world_size, store, body, options, dir, FirstRanks(world_size));
    } else {
      Rank me{rank, world_size, nullptr, nullptr, dir};
      s = body(me);
    }
    return absl::StrCat(s.ok() ? 0 : 1, "|", s.ok() ? "" : s.ToString() + "\n");
  });
  std::vector<ProcessResult> processes(world_size);
  for (int r = 0; r < world_size; ++r) {
    if (!results.ok()) {
      processes[r].output = results.status().ToString();
      continue;
    }
    std::pair<std::string, std::string> f = absl::StrSplit((*results)[r], absl::MaxSplits('|', 1));
    if (!absl::SimpleAtoi(f.first, &processes[r].exit_code)) processes[r].exit_code = -1;
    processes[r].output = f.second;
  }
  return processes;
}

}  // namespace

std::optional<LaunchedJob> launched_job() {
  const char* store = std::getenv("EMBER_TEST_JOB_STORE");
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  const char* size = std::getenv("OMPI_COMM_WORLD_SIZE");
  LaunchedJob job;
  if (store == nullptr || rank == nullptr || size == nullptr ||
      !absl::SimpleAtoi(rank, &job.rank) || !absl::SimpleAtoi(size, &job.world_size)) {
    return std::nullopt;
  }
  job.store_path = store;
  return job;
}

std::vector<absl::Status> RunRanksEach(int world_size,
                                       const std::function<absl::Status(Rank&)>& body,
                                       const RunRanksOptions& options) {
  if (launched_job()) return RunRanksInJob(world_size, body, options);
  auto store = std::make_shared<HashStore>();
  std::vector<absl::Status> results(world_size);
  std::vector<std::thread> threads;
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back([&, r] { results[r] = RunOne(r, world_size, store, body, options, ""); });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

absl::Status RunRanks(int world_size, const std::function<absl::Status(Rank&)>& body,
                      const RunRanksOptions& options) {
  std::vector<absl::Status> results = RunRanksEach(world_size, body, options);
  std::vector<std::string> errors;
  for (int r = 0; r < world_size; ++r) {
    if (!results[r].ok()) errors.push_back(absl::StrCat("rank ", r, ": ", results[r].ToString()));
  }
  if (errors.empty()) return absl::OkStatus();
  return absl::UnknownError(absl::StrJoin(errors, "\n"));
}

std::vector<ProcessResult> RunRankProcesses(int world_size,
                                            const std::function<absl::Status(Rank&)>& body,
                                            const RunRanksOptions& options, absl::Duration wait) {
  if (launched_job()) return RunRankProcessesInJob(world_size, body, options);
  const std::string dir = TempDir();
  const std::string store_path = dir + "/store";
  std::vector<pid_t> pids(world_size, -1);
  std::vector<ProcessResult> results(world_size);
  fflush(nullptr);
  for (int r = 0; r < world_size; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      // The child: errors go to a file the parent reads.
      const std::string log = absl::StrCat(dir, "/rank", r, ".log");
      if (!freopen(log.c_str(), "w", stderr)) _exit(3);
      absl::Status s;
      if (options.make_group) {
        auto store = FileStore::open(store_path, options.timeout);
        s = store.ok() ? RunOne(r, world_size, std::shared_ptr<Store>(std::move(*store)), body,
                                options, dir)
                       : store.status();
      } else {
        Rank me{r, world_size, nullptr, nullptr, dir};
        s = body(me);
      }
      if (!s.ok()) fprintf(stderr, "%s\n", s.ToString().c_str());
      fflush(stderr);
      _exit(s.ok() ? 0 : 1);
    }
    pids[r] = pid;
  }
  const absl::Time deadline = absl::Now() + wait;
  auto kill_child = [&](int r) {
    kill(pids[r], SIGKILL);
    kill(pids[r], SIGCONT);
  };
  int left = world_size;
  while (left > 0) {
    int stopped = 0;
    for (int r = 0; r < world_size; ++r) {
      if (pids[r] <= 0) continue;
      int status = 0;
      if (waitpid(pids[r], &status, WNOHANG | WUNTRACED | WCONTINUED) != pids[r]) {
        stopped += results[r].stopped;
        continue;
      }
      if (WIFSTOPPED(status)) {
        results[r].stopped = true;
        ++stopped;
        continue;
      }
      if (WIFCONTINUED(status)) {  // a rank continued it (SIGCONT): running again
        results[r].stopped = false;
        continue;
      }
      if (WIFEXITED(status)) results[r].exit_code = WEXITSTATUS(status);
      if (WIFSIGNALED(status)) results[r].signal = WTERMSIG(status);
      pids[r] = -1;
      --left;
    }
    if (left == 0) break;
    const bool only_stopped_left = stopped == left;
    if (only_stopped_left || absl::Now() > deadline) {
      for (int r = 0; r < world_size; ++r) {
        if (pids[r] > 0) kill_child(r);
      }
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  for (int r = 0; r < world_size; ++r) {
    std::ifstream in(absl::StrCat(dir, "/rank", r, ".log"));
    std::stringstream text;
    text << in.rdbuf();
    results[r].output = text.str();
  }
  return results;
}

absl::Status Finish(const absl::StatusOr<std::shared_ptr<Work>>& work) {
  if (!work.ok()) return work.status();
  return (*work)->wait();
}

}  // namespace ember::distributed::testing
