// The forkserver start method's own behaviour: one server serves every child,
// children do not inherit the caller's threads' locks, the server's reports
// drive join / kill / terminate, a killed server is replaced, and the server
// leaves with the process that started it. What its children are handed and
// how their failures surface is spawn_test's, run under both methods.
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "multiprocessing/process.h"
#include "multiprocessing/queue.h"
#include "multiprocessing/testing.h"
#include "tensor/status_macros.h"

namespace ember::multiprocessing {
namespace {

using ::testing::HasSubstr;

class SpawnedChildEnvironment : public ::testing::Environment {
 public:
  void SetUp() override { maybe_run_spawned_child(); }
};
const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new SpawnedChildEnvironment);

// Puts [pid, parent pid] on the queue args[0], then sleeps args[1] seconds
// (none when absent).
absl::Status ReportParentEntry(int rank, absl::Span<const Value> args) {
  EMBER_ASSIGN_OR_RETURN(Queue q, args[0].as<Queue>());
  EMBER_RETURN_IF_ERROR(
      q.put(Value(Value::List{static_cast<int64_t>(::getpid()), static_cast<int64_t>(::getppid())}),
            absl::Seconds(20)));
  if (args.size() > 1) absl::SleepFor(absl::Seconds(args[1].as<int64_t>().value_or(0)));
  return absl::OkStatus();
}
EMBER_REGISTER_ENTRY_POINT("report_parent", ReportParentEntry);

// Held by a thread of the test process while a child is started.
std::timed_mutex g_held_by_a_thread;

absl::Status TakeLockEntry(int rank, absl::Span<const Value> args) {
  if (!g_held_by_a_thread.try_lock_for(std::chrono::milliseconds(500))) {
    return absl::DeadlineExceededError("the lock a thread of the parent holds is held here too");
  }
  g_held_by_a_thread.unlock();
  return absl::OkStatus();
}
EMBER_REGISTER_ENTRY_POINT("take_lock", TakeLockEntry);

// True when `pid` is gone or a zombie.
bool IsGone(int64_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;
  size_t paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] == 'Z';
}

struct Started {
  Process process;
  int64_t pid = -1;     // as the child saw itself
  int64_t server = -1;  // its parent: the forkserver
};

// Starts "report_parent" under forkserver and waits for its report.
absl::StatusOr<Started> StartReporting(Queue& q, int64_t sleep_s = 0) {
  EMBER_ASSIGN_OR_RETURN(Context ctx, get_context("forkserver"));
  EMBER_ASSIGN_OR_RETURN(Process p, ctx.process("report_parent", {Value(q), Value(sleep_s)}));
  EMBER_ASSIGN_OR_RETURN(Value v, q.get(absl::Seconds(20)));
  return Started{std::move(p), v.list()[0].as<int64_t>().value_or(-1),
                 v.list()[1].as<int64_t>().value_or(-1)};
}

TEST(ForkserverTest, OneServerForksEveryChild) {
  absl::StatusOr<Queue> q = Queue::create();
  ASSERT_TRUE(q.ok());
  absl::StatusOr<Started> a = StartReporting(*q);
  ASSERT_TRUE(a.ok()) << a.status();
  absl::StatusOr<Started> b = StartReporting(*q);
  ASSERT_TRUE(b.ok()) << b.status();
  // The caller's pid for each is the child's own; their parent is one
  // server, which is not the caller.
  EXPECT_EQ(a->process.pid(), a->pid);
  EXPECT_EQ(b->process.pid(), b->pid);
  EXPECT_EQ(a->server, b->server);
  EXPECT_NE(a->server, ::getpid());
  for (Started* s : {&*a, &*b}) {
    absl::StatusOr<ExitStatus> e = s->process.join(absl::Seconds(20));
    ASSERT_TRUE(e.ok()) << e.status();
    EXPECT_TRUE(e->ok()) << e->str() << ": " << s->process.error_message();
  }
  EXPECT_FALSE(IsGone(a->server));
}

TEST(ForkserverTest, ChildrenDoNotInheritLocksHeldByTheCallersThreads) {
  absl::Notification locked, release;
  std::thread holder([&] {
    std::lock_guard lock(g_held_by_a_thread);
    locked.Notify();
    release.WaitForNotificationWithTimeout(absl::Seconds(60));
  });
  locked.WaitForNotification();
  // A forked child copies the held lock; a forkserver's child never saw it.
  absl::StatusOr<Context> fork = get_context("fork");
  ASSERT_TRUE(fork.ok());
  absl::Status forked = fork->spawn("take_lock", {}, 1);
  EXPECT_THAT(forked.message(), HasSubstr("held here too"));
  absl::StatusOr<Context> forkserver = get_context("forkserver");
  ASSERT_TRUE(forkserver.ok());
  absl::Status served = forkserver->spawn("take_lock", {}, 2);
  EXPECT_TRUE(served.ok()) << served;
  release.Notify();
  holder.join();
}

TEST(ForkserverTest, ThreadsStartChildrenConcurrently) {
  absl::StatusOr<Queue> q = Queue::create();
  ASSERT_TRUE(q.ok());
  constexpr int kThreads = 4, kEach = 3;
  std::vector<absl::Status> results(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      absl::StatusOr<Context> ctx = get_context("forkserver");
      results[t] = ctx.ok() ? ctx->spawn("report_parent", {Value(*q)}, kEach) : ctx.status();
    });
  }
  for (std::thread& t : threads) t.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_TRUE(results[t].ok()) << t << ": " << results[t];
  std::set<int64_t> pids, servers;
  for (int i = 0; i < kThreads * kEach; ++i) {
    absl::StatusOr<Value> v = q->get(absl::Seconds(20));
    ASSERT_TRUE(v.ok()) << v.status();
    pids.insert(v->list()[0].as<int64_t>().value());
    servers.insert(v->list()[1].as<int64_t>().value());
  }
  EXPECT_EQ(pids.size(), kThreads * kEach);
  EXPECT_EQ(servers.size(), 1u);
}

TEST(ForkserverTest, JoinKillAndTerminateWorkThroughTheServer) {
  absl::StatusOr<Queue> q = Queue::create();
  ASSERT_TRUE(q.ok());
  absl::StatusOr<Started> a = StartReporting(*q, /*sleep_s=*/60);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(a->process.is_alive());
  absl::StatusOr<ExitStatus> running = a->process.join(absl::Milliseconds(50));
  EXPECT_EQ(running.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(running.status().message(), HasSubstr("still running after 50ms"));
  a->process.terminate();
  absl::StatusOr<ExitStatus> e = a->process.join(absl::Seconds(20));
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->str(), "signal SIGTERM");
  EXPECT_FALSE(a->process.is_alive());
  EXPECT_TRUE(IsGone(a->pid));

  absl::StatusOr<Started> b = StartReporting(*q, /*sleep_s=*/60);
  ASSERT_TRUE(b.ok()) << b.status();
  b->process.kill();
  e = b->process.join(absl::Seconds(20));
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->str(), "signal SIGKILL");
  b->process.kill();  // after the end: nothing is signalled
  EXPECT_EQ(b->process.join()->str(), "signal SIGKILL");
}

TEST(ForkserverTest, AKilledServerTakesItsChildrenAndIsReplaced) {
  absl::StatusOr<Queue> q = Queue::create();
  ASSERT_TRUE(q.ok());
  absl::StatusOr<Started> a = StartReporting(*q, /*sleep_s=*/60);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_EQ(::kill(static_cast<pid_t>(a->server), SIGKILL), 0);
  // Its child dies with it, unreported: the join says so (exit code 255,
  // as Python's forkserver).
  absl::StatusOr<ExitStatus> e = a->process.join(absl::Seconds(20));
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->exit_code, 255);
  EXPECT_THAT(a->process.error_message(),
              HasSubstr("the forkserver ended before reporting how process"));
  EXPECT_TRUE(testing::WaitUntil([&] { return IsGone(a->pid); }, absl::Seconds(10)));
  ASSERT_TRUE(testing::WaitUntil([&] { return IsGone(a->server); }, absl::Seconds(10)));
  // The next start starts a new server.
  absl::StatusOr<Started> b = StartReporting(*q);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_NE(b->server, a->server);
  EXPECT_NE(b->server, ::getpid());
  e = b->process.join(absl::Seconds(20));
  ASSERT_TRUE(e.ok() && e->ok()) << b->process.error_message();
}

TEST(ForkserverTest, TheServerLeavesWithTheProcessThatStartedIt) {
  absl::StatusOr<Queue> out = Queue::create();
  ASSERT_TRUE(out.ok());
  // A forked child starts its own server and a child that sleeps, then
  // exits without joining it.
  absl::StatusOr<Process> starter = Process::start([&]() -> absl::Status {
    EMBER_ASSIGN_OR_RETURN(Queue q, Queue::create());
    EMBER_ASSIGN_OR_RETURN(Started s, StartReporting(q, /*sleep_s=*/60));
    EMBER_RETURN_IF_ERROR(out->put(Value(Value::List{s.pid, s.server})));
    return absl::OkStatus();  // exits without the Process destructor
  });
  ASSERT_TRUE(starter.ok());
  absl::StatusOr<Value> v = out->get(absl::Seconds(30));
  ASSERT_TRUE(v.ok()) << v.status();
  absl::StatusOr<ExitStatus> e = starter->join(absl::Seconds(20));
  ASSERT_TRUE(e.ok() && e->ok()) << starter->error_message();
  const int64_t child = v->list()[0].as<int64_t>().value();
  const int64_t server = v->list()[1].as<int64_t>().value();
  EXPECT_NE(server, starter->pid());
  EXPECT_TRUE(testing::WaitUntil([&] { return IsGone(server); }, absl::Seconds(20)))
      << "the forkserver " << server << " outlived its starter";
  EXPECT_TRUE(testing::WaitUntil([&] { return IsGone(child); }, absl::Seconds(20)))
      << "the forkserver's child " << child << " outlived it";
}

TEST(ForkserverTest, RepeatedStartsLeakNoDescriptorsInTheServer) {
  absl::StatusOr<Queue> q = Queue::create();
  ASSERT_TRUE(q.ok());
  absl::StatusOr<Started> warm = StartReporting(*q);
  ASSERT_TRUE(warm.ok()) << warm.status();
  ASSERT_TRUE(warm->process.join(absl::Seconds(20)).ok());
  const std::string fds = "/proc/" + std::to_string(warm->server) + "/fd";
  const size_t server_fds = testing::DirEntries(fds).size();
  const int caller_fds = testing::OpenFdCount();
  for (int rep = 0; rep < 5; ++rep) {
    absl::StatusOr<Started> s = StartReporting(*q);
    ASSERT_TRUE(s.ok()) << s.status();
    ASSERT_EQ(s->server, warm->server);
    ASSERT_TRUE(s->process.join(absl::Seconds(20)).ok());
  }
  // The server closes a child's report socket just after sending its end
  // (so the first count may include the warm-up child's).
  EXPECT_TRUE(testing::WaitUntil([&] { return testing::DirEntries(fds).size() <= server_fds; },
                                 absl::Seconds(10)))
      << testing::DirEntries(fds).size() << " descriptors open in the server, " << server_fds
      << " before";
  EXPECT_EQ(testing::OpenFdCount(), caller_fds);
}

TEST(ForkserverTest, ABadServerDescriptorIsRefusedClearly) {
  absl::StatusOr<Process> p = Process::start([] {
    ::setenv("EMBER_MP_FORKSERVER_FD", "not-a-descriptor", 1);
    maybe_run_spawned_child();
    return absl::InternalError("maybe_run_spawned_child returned");
  });
  ASSERT_TRUE(p.ok());
  absl::StatusOr<ExitStatus> e = p->join(absl::Seconds(20));
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->exit_code, 2);
}

}  // namespace
}  // namespace ember::multiprocessing
