#include "distributed/testing/ranks.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "distributed/backend_registry.h"
#include "distributed/file_store.h"
#include "distributed/hash_store.h"

namespace ember::distributed::testing {
namespace {

absl::Status RunOne(int rank, int world_size, std::shared_ptr<Store> store,
                    const std::function<absl::Status(Rank&)>& body,
                    const RunRanksOptions& options, const std::string& dir) {
  auto backend = find_backend(options.backend);
  if (!backend.ok()) return backend.status();
  BackendOptions b;
  b.store = store;
  b.store_prefix = options.store_prefix;
  b.rank = rank;
  b.size = world_size;
  b.timeout = options.timeout;
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

}  // namespace

std::vector<absl::Status> RunRanksEach(int world_size,
                                       const std::function<absl::Status(Rank&)>& body,
                                       const RunRanksOptions& options) {
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
                                            const RunRanksOptions& options,
                                            absl::Duration wait) {
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
      if (waitpid(pids[r], &status, WNOHANG | WUNTRACED) != pids[r]) {
        stopped += results[r].stopped;
        continue;
      }
      if (WIFSTOPPED(status)) {
        results[r].stopped = true;
        ++stopped;
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
