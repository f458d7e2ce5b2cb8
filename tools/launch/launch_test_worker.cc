// A worker for launch_test: what it does is chosen by --mode.
//   env         writes its environment and arguments to <out>/rank<RANK>
//               and checks they agree (RANK = GROUP_RANK * LOCAL_WORLD_SIZE
//               + LOCAL_RANK, --local_rank as LOCAL_RANK or absent); exit 3
//               on any disagreement.
//   fail        rank --fail_rank exits with --code (or raises SIGKILL with
//               --code=kill) after 100 ms; the others sleep for a minute.
//   sleep       writes <out>/pid<RANK>, then sleeps; on SIGTERM writes
//               <out>/sigterm<RANK> and exits 0.
//   flaky       fails (exit 5) on the first attempt, succeeds on a restart.
//   flaky_rendezvous  joins with env://, then fails (exit 5) on the first
//               attempt; succeeds after joining on a restart.
//   grandchild  forks a child that sleeps for ten minutes and writes its pid
//               to <out>/grandchild<RANK>_<attempt>; rank --fail_rank then
//               exits with --code on attempt 0, once every rank's file is
//               there, and the others sleep for a minute. On a restart each
//               rank writes to <out>/check<RANK> whether the grandchildren of
//               attempt 0 are "gone", or "alive <pid>", and exits 0.
//   rendezvous  joins with env:// and checks every rank's key in the store;
//               with --rank0_leaves_early, rank 0 exits straight after
//               joining and the others use the store 300 ms later (it must
//               be served by the launcher then).
#include <errno.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "distributed/rendezvous.h"
#include "distributed/testing/flags.h"

namespace {

using ::ember::distributed::testing::Flag;

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "<unset>";
}

std::string out_dir;
int rank = -1;

void OnSigterm(int) {
  std::ofstream(absl::StrCat(out_dir, "/sigterm", rank)) << "1";
  _exit(0);
}

int Fail(const std::string& why) {
  std::fprintf(stderr, "launch_test_worker rank %d: %s\n", rank, why.c_str());
  return 3;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = Flag(argc, argv, "mode");
  out_dir = Flag(argc, argv, "out");
  rank = std::atoi(Env("RANK").c_str());
  if (mode == "env") {
    std::string local_rank_arg = Flag(argc, argv, "local_rank");
    std::ofstream out(absl::StrCat(out_dir, "/rank", Env("RANK")));
    for (const char* name :
         {"MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
          "GROUP_RANK", "OMP_NUM_THREADS", "TORCHELASTIC_RESTART_COUNT"}) {
      out << name << "=" << Env(name) << "\n";
    }
    out << "--local_rank=" << (local_rank_arg.empty() ? "<absent>" : local_rank_arg) << "\n";
    out << "args=";
    for (int i = 1; i < argc; ++i) out << argv[i] << (i + 1 < argc ? " " : "");
    out << "\n";
    int local = std::atoi(Env("LOCAL_RANK").c_str());
    int expected =
        std::atoi(Env("GROUP_RANK").c_str()) * std::atoi(Env("LOCAL_WORLD_SIZE").c_str()) + local;
    if (rank != expected)
      return Fail("RANK disagrees with GROUP_RANK * LOCAL_WORLD_SIZE + LOCAL_RANK");
    if (!local_rank_arg.empty() && local_rank_arg != Env("LOCAL_RANK"))
      return Fail("--local_rank != LOCAL_RANK");
    return 0;
  }
  if (mode == "fail") {
    if (rank == std::atoi(Flag(argc, argv, "fail_rank").c_str())) {
      usleep(100 * 1000);
      std::string code = Flag(argc, argv, "code");
      if (code == "kill") raise(SIGKILL);
      return std::atoi(code.c_str());
    }
    sleep(60);
    return 0;
  }
  if (mode == "sleep") {
    signal(SIGTERM, OnSigterm);
    std::ofstream(absl::StrCat(out_dir, "/pid", rank)) << getpid();
    sleep(60);
    return 0;
  }
  if (mode == "grandchild") {
    const std::string attempt = Env("TORCHELASTIC_RESTART_COUNT");
    const int world_size = std::atoi(Env("WORLD_SIZE").c_str());
    auto pid_file = [&](int r, const std::string& a) {
      return absl::StrCat(out_dir, "/grandchild", r, "_", a);
    };
    if (attempt != "0") {
      std::string verdict = "gone";
      for (int r = 0; r < world_size; ++r) {
        std::ifstream in(pid_file(r, "0"));
        pid_t pid = 0;
        if (in >> pid && pid > 0 && (kill(pid, 0) == 0 || errno != ESRCH))
          verdict = absl::StrCat("alive ", pid);
      }
      std::ofstream(absl::StrCat(out_dir, "/check", rank)) << verdict;
      return 0;
    }
    pid_t child = fork();
    if (child == 0) {
      sleep(600);
      _exit(0);
    }
    {
      const std::string path = pid_file(rank, attempt);
      std::ofstream(path + ".tmp") << child;
      std::rename((path + ".tmp").c_str(), path.c_str());
    }
    if (Flag(argc, argv, "fail_rank") == Env("RANK")) {
      for (int waited_ms = 0; waited_ms < 10'000; waited_ms += 10) {
        bool all = true;
        for (int r = 0; r < world_size; ++r)
          all = all && access(pid_file(r, attempt).c_str(), F_OK) == 0;
        if (all) break;
        usleep(10 * 1000);
      }
      return std::atoi(Flag(argc, argv, "code").c_str());
    }
    sleep(60);
    return 0;
  }
  if (mode == "flaky") {
    return Env("TORCHELASTIC_RESTART_COUNT") == "0" ? 5 : 0;
  }
  if (mode == "flaky_rendezvous") {
    ember::distributed::RendezvousOptions options;  // env://
    options.timeout = absl::Seconds(30);
    absl::StatusOr<ember::distributed::RendezvousResult> joined =
        ember::distributed::rendezvous(options);
    if (!joined.ok()) return Fail(std::string(joined.status().message()));
    if (Env("TORCHELASTIC_RESTART_COUNT") == "0") return 5;
    std::ofstream(absl::StrCat(out_dir, "/joined", joined->rank))
        << Env("TORCHELASTIC_RESTART_COUNT");
    return 0;
  }
  if (mode == "rendezvous") {
    ember::distributed::RendezvousOptions options;  // env://
    options.timeout = absl::Seconds(30);
    absl::StatusOr<ember::distributed::RendezvousResult> joined =
        ember::distributed::rendezvous(options);
    if (!joined.ok()) return Fail(std::string(joined.status().message()));
    auto& store = *joined->store;
    if (!store.set(absl::StrCat("hello/", joined->rank), "1").ok()) return Fail("Set failed");
    if (!Flag(argc, argv, "rank0_leaves_early").empty()) {
      if (joined->rank == 0) return 0;
      usleep(300 * 1000);
      for (int r = 0; r < joined->world_size; ++r) {
        if (!store.get(absl::StrCat("hello/", r), absl::Seconds(20)).ok())
          return Fail("a rank's key is missing");
      }
      if (!store.add("after_rank0_left", 1).ok()) return Fail("the store went away with rank 0");
      std::ofstream(absl::StrCat(out_dir, "/joined", joined->rank)) << joined->world_size;
      return 0;
    }
    for (int r = 0; r < joined->world_size; ++r) {
      if (!store.get(absl::StrCat("hello/", r), absl::Seconds(20)).ok())
        return Fail("a rank's key is missing");
    }
    // Rank 0 serves the store, so it waits for the others to finish.
    if (!store.add("finished", 1).ok()) return Fail("Add failed");
    if (joined->rank == 0) {
      while (store.add("finished", 0).value_or(0) < joined->world_size) usleep(10 * 1000);
    }
    std::ofstream(absl::StrCat(out_dir, "/joined", joined->rank)) << joined->world_size;
    return 0;
  }
  return Fail("unknown --mode=" + mode);
}
