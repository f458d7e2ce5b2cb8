// The flight recorder through real tcp groups: what each op leaves in the
// ring, the ring's size from the environment, and the dumps (on failure,
// through the API, on SIGUSR1 and on a fatal signal).
#include "distributed/flight_recorder.h"

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <pthread.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "distributed/backend_registry.h"
#include "distributed/hash_store.h"
#include "distributed/process_group.h"
#include "distributed/testing/ranks.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"

namespace ember::distributed {
namespace {

using ::ember::distributed::testing::Finish;
using ::ember::distributed::testing::Rank;
using ::ember::distributed::testing::RunRankProcesses;
using ::ember::distributed::testing::RunRanks;
using ::testing::HasSubstr;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string TempDir() {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string templ = absl::StrCat(base ? base : "/tmp", "/fr_XXXXXX");
  return mkdtemp(templ.data());
}

// A group of one over a fresh store.
std::shared_ptr<ProcessGroup> GroupOfOne() {
  auto backend = find_backend("tcp");
  EXPECT_TRUE(backend.ok());
  auto pg = (*backend)->create({.store = std::make_shared<HashStore>()});
  EXPECT_TRUE(pg.ok()) << pg.status();
  return *pg;
}

TEST(FlightRecorderTest, RecordsEveryOpWithItsStateSizesAndPeers) {
  unsetenv("TORCH_FR_BUFFER_SIZE");
  std::vector<std::vector<FlightEntry>> seen(2);
  absl::Status s = RunRanks(2, [&](Rank& me) -> absl::Status {
    Tensor f = ones({1024}, kFloat32);
    EMBER_RETURN_IF_ERROR(Finish(me.group->allreduce(f)));
    Tensor i = ones({3}, kInt64);
    EMBER_RETURN_IF_ERROR(Finish(me.group->broadcast(i, {.root = 1})));
    EMBER_RETURN_IF_ERROR(Finish(me.group->barrier()));
    Tensor p = ones({5}, kFloat64);
    if (me.rank == 0) {
      EMBER_RETURN_IF_ERROR(Finish(me.group->send(p, 1, {.tag = 7})));
    } else {
      EMBER_ASSIGN_OR_RETURN(auto recv, me.group->recv(p, 0, {.tag = 7}));
      EMBER_RETURN_IF_ERROR(recv->wait());
    }
    seen[me.rank] = me.group->flight_recorder().entries();
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    const std::vector<FlightEntry>& e = seen[r];
    ASSERT_EQ(e.size(), 4u);
    EXPECT_STREQ(e[0].op, "all_reduce");
    EXPECT_EQ(e[0].seq, 0);
    EXPECT_STREQ(e[0].dtype, "float32");
    EXPECT_EQ(e[0].nbytes, 4096);
    EXPECT_EQ(e[0].in_numel, 1024);
    EXPECT_STREQ(e[1].op, "broadcast");
    EXPECT_EQ(e[1].seq, 1);
    EXPECT_STREQ(e[1].dtype, "int64");
    EXPECT_EQ(e[1].nbytes, 24);
    EXPECT_EQ(e[1].peer, 1);
    EXPECT_STREQ(e[2].op, "barrier");
    EXPECT_EQ(e[2].seq, 2);
    EXPECT_STREQ(e[3].op, r == 0 ? "send" : "recv");
    EXPECT_FALSE(e[3].collective);
    EXPECT_EQ(e[3].seq, 0);  // the first p2p op
    EXPECT_EQ(e[3].peer, 1 - r);
    EXPECT_EQ(e[3].tag, 7);
    for (int k = 0; k < 4; ++k) {
      EXPECT_EQ(e[k].id, k);
      EXPECT_EQ(e[k].state, FlightState::kCompleted);
      EXPECT_GT(e[k].created_ns, 0);
      EXPECT_GE(e[k].finished_ns, e[k].created_ns);
      EXPECT_STREQ(e[k].error, "");
    }
    // The tcp worker runs collectives and sends: they were marked started.
    for (int k = 0; k < 3; ++k) {
      EXPECT_GE(e[k].started_ns, e[k].created_ns);
      EXPECT_LE(e[k].started_ns, e[k].finished_ns);
    }
  }
}

TEST(FlightRecorderTest, TheRingKeepsTheLastEntriesAndZeroTurnsItOff) {
  setenv("TORCH_FR_BUFFER_SIZE", "3", 1);
  {
    auto pg = GroupOfOne();
    ASSERT_EQ(pg->flight_recorder().capacity(), 3);
    for (int k = 0; k < 5; ++k) ASSERT_TRUE(Finish(pg->allreduce(ones({2}))).ok());
    std::vector<FlightEntry> e = pg->flight_recorder().entries();
    ASSERT_EQ(e.size(), 3u);
    EXPECT_EQ(e[0].seq, 2);
    EXPECT_EQ(e[2].seq, 4);
    EXPECT_EQ(pg->flight_recorder().last_completed(), 4);
  }
  setenv("TORCH_FR_BUFFER_SIZE", "0", 1);
  {
    auto pg = GroupOfOne();
    EXPECT_FALSE(pg->flight_recorder().enabled());
    ASSERT_TRUE(Finish(pg->allreduce(ones({2}))).ok());
    EXPECT_TRUE(pg->flight_recorder().entries().empty());
  }
  unsetenv("TORCH_FR_BUFFER_SIZE");
}

TEST(FlightRecorderTest, TheApiDumpsEveryGroupInTheDocumentedFormat) {
  const std::string dir = TempDir();
  setenv("TORCH_FR_DUMP_TEMP_FILE", absl::StrCat(dir, "/trace_").c_str(), 1);
  auto pg = GroupOfOne();
  pg->flight_recorder().set_group_name("grp_api");
  ASSERT_TRUE(Finish(pg->allreduce(ones({4}, kFloat64))).ok());
  absl::StatusOr<std::string> path = dump_flight_recorders("a checkpoint");
  ASSERT_TRUE(path.ok()) << path.status();
  // Without %r the variable is a prefix; rank and host are appended.
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  EXPECT_EQ(*path, absl::StrCat(dir, "/trace_0.", host));
  const std::string text = ReadFile(*path);
  EXPECT_THAT(text, HasSubstr(absl::StrCat("process rank=0 host=", host, " pid=", getpid())));
  EXPECT_THAT(text, HasSubstr("reason=\"a checkpoint\""));
  EXPECT_THAT(text, HasSubstr("group name=grp_api backend=tcp rank=0 size=1"));
  EXPECT_THAT(text, HasSubstr("op group=grp_api id=0 seq=0 kind=collective op=all_reduce "
                              "dtype=float64 in_numel=4 out_numel=4 bytes=32 peer=-1"));
  EXPECT_THAT(text, HasSubstr("state=completed"));
  EXPECT_TRUE(absl::EndsWith(text, "end\n"));
  unsetenv("TORCH_FR_DUMP_TEMP_FILE");
}

// Rank 1 never joins rank 0's second all_reduce: rank 0's failure leaves a
// dump naming the failed op and its error.
TEST(FlightRecorderTest, AFailedCollectiveDumpsItsRanksRecorder) {
  const std::string dir = TempDir();
  setenv("TORCH_FR_DUMP_TEMP_FILE", absl::StrCat(dir, "/fr_%r.%h").c_str(), 1);
  testing::RunRanksOptions options;
  options.timeout = absl::Seconds(1);
  std::vector<testing::ProcessResult> results = RunRankProcesses(
      2,
      [](Rank& me) -> absl::Status {
        EMBER_RETURN_IF_ERROR(Finish(me.group->allreduce(ones({8}))));
        if (me.rank == 1) {
          absl::SleepFor(absl::Seconds(3));
          return absl::OkStatus();
        }
        absl::Status s = Finish(me.group->allreduce(ones({8})));
        if (s.ok()) return absl::InternalError("the all_reduce succeeded without rank 1");
        return absl::OkStatus();
      },
      options, absl::Seconds(30));
  unsetenv("TORCH_FR_DUMP_TEMP_FILE");
  ASSERT_EQ(results[0].exit_code, 0) << results[0].output;
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  const std::string text = ReadFile(absl::StrCat(dir, "/fr_0.", host));
  EXPECT_THAT(text, HasSubstr("seq=0 kind=collective op=all_reduce"));
  EXPECT_THAT(text, HasSubstr("seq=1 kind=collective op=all_reduce dtype=float32 in_numel=8"));
  EXPECT_THAT(text, HasSubstr("state=failed"));
  EXPECT_THAT(text, HasSubstr("rank 1"));  // the error names the missing rank
}

// Dumps that overlap (SIGUSR1 reaching a thread in the middle of writing a
// dump, as the launcher's request reaches a rank dumping its own error) each
// leave a whole dump: one header, one process line, every op, "end" last.
TEST(FlightRecorderTest, ASignalDuringADumpLeavesAWholeDump) {
  const std::string dir = TempDir();
  setenv("TORCH_FR_DUMP_TEMP_FILE", absl::StrCat(dir, "/overlap_").c_str(), 1);
  setenv("TORCH_FR_BUFFER_SIZE", "4000", 1);
  // Counts the signals handled (the recorder's handler chains to it), so
  // that the next is sent only after the last dump: a handler is slower than
  // a sender that does not wait.
  static std::atomic<int> handled{0};
  signal(SIGUSR1, [](int) { handled.fetch_add(1); });
  auto pg = GroupOfOne();
  unsetenv("TORCH_FR_BUFFER_SIZE");
  pg->flight_recorder().set_group_name("grp_overlap");
  constexpr int kOps = 3000;
  for (int i = 0; i < kOps; ++i) ASSERT_TRUE(Finish(pg->allreduce(ones({2}))).ok());
  auto whole = [](const std::string& text) -> std::string {
    size_t ops = 0;
    for (size_t at = text.find("\nop group=grp_overlap "); at != std::string::npos;
         at = text.find("\nop group=grp_overlap ", at + 1)) {
      ++ops;
    }
    size_t processes = 0;
    for (size_t at = text.find("process rank="); at != std::string::npos;
         at = text.find("process rank=", at + 1)) {
      ++processes;
    }
    if (!absl::StartsWith(text, "# Ember flight recorder dump")) return "no header first";
    if (processes != 1) return absl::StrCat(processes, " process lines");
    if (ops != static_cast<size_t>(kOps)) return absl::StrCat(ops, " ops of ", kOps);
    if (!absl::EndsWith(text, "\nend\n") || text.find("\nend\n") != text.size() - 5) {
      return "'end' is not the last line, once";
    }
    return "";
  };
  std::atomic<bool> done{false};
  std::vector<std::string> broken;
  std::thread dumper([&] {
    for (int i = 0; i < 300; ++i) {
      absl::StatusOr<std::string> path = dump_flight_recorders("overlap");
      std::string why = path.ok() ? whole(ReadFile(*path)) : std::string(path.status().message());
      if (!why.empty() && broken.size() < 3) broken.push_back(absl::StrCat("dump ", i, ": ", why));
    }
    done = true;
  });
  int signals = 0;
  while (!done) {
    const int before = handled.load();
    pthread_kill(dumper.native_handle(), SIGUSR1);
    ++signals;
    const absl::Time until = absl::Now() + absl::Seconds(10);
    while (handled.load() == before && !done && absl::Now() < until) {
      absl::SleepFor(absl::Microseconds(50));
    }
    absl::SleepFor(absl::Microseconds(50 * (signals % 20)));  // land anywhere in a dump
  }
  dumper.join();
  signal(SIGUSR1, SIG_IGN);
  EXPECT_GT(signals, 10);
  EXPECT_THAT(broken, ::testing::IsEmpty());
  EXPECT_EQ(whole(ReadFile(flight_recorder_dump_path())), "");
  unsetenv("TORCH_FR_DUMP_TEMP_FILE");
}

// In a child: a SIGUSR1 handler the program had is still called after the
// dump, and a fatal signal dumps and still kills the process.
TEST(FlightRecorderTest, SignalsDumpAndChainToEarlierHandlers) {
  const std::string dir = TempDir();
  const std::string pattern = absl::StrCat(dir, "/sig_%p_r%r");
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const rlimit no_core{0, 0};  // a core file would only slow the test
    setrlimit(RLIMIT_CORE, &no_core);
    static volatile sig_atomic_t got = 0;
    signal(SIGUSR1, [](int) { got = 1; });
    setenv("TORCH_FR_DUMP_TEMP_FILE", pattern.c_str(), 1);
    auto backend = find_backend("tcp");
    auto pg = (*backend)->create({.store = std::make_shared<HashStore>()});
    if (!pg.ok() || !Finish((*pg)->broadcast(ones({6}, kInt32))).ok()) _exit(3);
    raise(SIGUSR1);
    if (got != 1) _exit(4);
    const std::string usr1 = ReadFile(flight_recorder_dump_path());
    if (!absl::StrContains(usr1, "reason=\"SIGUSR1\"") ||
        !absl::StrContains(usr1, "op=broadcast dtype=int32")) {
      _exit(5);
    }
    raise(SIGSEGV);
    _exit(6);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status)) << "exit code " << WEXITSTATUS(status);
  EXPECT_EQ(WTERMSIG(status), SIGSEGV);
  const std::string text = ReadFile(absl::StrCat(dir, "/sig_", child, "_r0"));
  EXPECT_THAT(text, HasSubstr("reason=\"fatal signal SIGSEGV\""));
  EXPECT_THAT(text, HasSubstr("op=broadcast dtype=int32 in_numel=6"));
  EXPECT_TRUE(absl::EndsWith(text, "end\n"));
}

// In a child: SIGTERM (as mpirun sends the rest of a job when a rank dies)
// dumps and still ends the process by SIGTERM; an ignored SIGTERM stays
// ignored.
TEST(FlightRecorderTest, SigtermDumpsAndStillTerminates) {
  const std::string dir = TempDir();
  const std::string pattern = absl::StrCat(dir, "/term_%p_r%r");
  for (const bool ignored : {false, true}) {
    SCOPED_TRACE(ignored ? "SIGTERM ignored" : "SIGTERM default");
    pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      if (ignored) signal(SIGTERM, SIG_IGN);
      setenv("TORCH_FR_DUMP_TEMP_FILE", pattern.c_str(), 1);
      auto backend = find_backend("tcp");
      auto pg = (*backend)->create({.store = std::make_shared<HashStore>()});
      if (!pg.ok() || !Finish((*pg)->allreduce(ones({5}))).ok()) _exit(3);
      raise(SIGTERM);
      _exit(ignored ? 0 : 4);
    }
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    const std::string path = absl::StrCat(dir, "/term_", child, "_r0");
    if (ignored) {
      ASSERT_TRUE(WIFEXITED(status));
      EXPECT_EQ(WEXITSTATUS(status), 0);
      EXPECT_EQ(ReadFile(path), "");
      continue;
    }
    ASSERT_TRUE(WIFSIGNALED(status)) << "exit code " << WEXITSTATUS(status);
    EXPECT_EQ(WTERMSIG(status), SIGTERM);
    const std::string text = ReadFile(path);
    EXPECT_THAT(text, HasSubstr("reason=\"SIGTERM\""));
    EXPECT_THAT(text, HasSubstr("op=all_reduce dtype=float32 in_numel=5"));
  }
}

}  // namespace
}  // namespace ember::distributed
