// Leaks and resource limits: killed children under file_system, repeated
// normal runs under both strategies, a lowered descriptor limit, a tiny
// /dev/shm.
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "multiprocessing/connection.h"
#include "multiprocessing/process.h"
#include "multiprocessing/queue.h"
#include "multiprocessing/sharing.h"
#include "multiprocessing/testing.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"

namespace ember::multiprocessing {
namespace {

using ::testing::HasSubstr;
using testing::ShmEntries;
using testing::UniquePrefix;
using testing::WaitUntil;

constexpr int kSkipExitCode = 77;

TEST(LeakTest, KilledChildrenLeaveNoRegions) {
  const std::string prefix = UniquePrefix("killed");
  ASSERT_TRUE(set_shared_memory_prefix(prefix).ok());
  ASSERT_TRUE(set_sharing_strategy("file_system").ok());
  absl::StatusOr<Queue> q = Queue::create();
  ASSERT_TRUE(q.ok());
  std::vector<Process> children;
  for (int c = 0; c < 3; ++c) {
    absl::StatusOr<Process> p = Process::start([&]() -> absl::Status {
      // Two regions sent to the parent, one kept to itself.
      Tensor kept = ones({1000});
      EMBER_RETURN_IF_ERROR(share_memory_(kept));
      EMBER_RETURN_IF_ERROR(q->put(Value(Value::List{ones({100}), zeros({5000})})));
      absl::SleepFor(absl::Seconds(60));
      return absl::OkStatus();
    });
    ASSERT_TRUE(p.ok());
    children.push_back(*std::move(p));
  }
  std::vector<Value> received;
  for (int c = 0; c < 3; ++c) {
    absl::StatusOr<Value> v = q->get(absl::Seconds(20));
    ASSERT_TRUE(v.ok()) << v.status();
    received.push_back(*v);
  }
  EXPECT_GE(ShmEntries(prefix).size(), 9u);
  for (Process& p : children) {
    p.kill();
    ASSERT_TRUE(p.join(absl::Seconds(10)).ok());
  }
  // The parent still maps what it received: the data stays readable.
  EXPECT_EQ(received[0].list()[0].get_if<Tensor>()->sum().item<double>(), 100);
  received.clear();
  EXPECT_TRUE(WaitUntil([&] { return ShmEntries(prefix).empty(); }, absl::Seconds(10)))
      << ShmEntries(prefix).size() << " regions left, e.g. " << ShmEntries(prefix)[0];
  ASSERT_TRUE(set_sharing_strategy("file_descriptor").ok());
}

TEST(LeakTest, ThirtyNormalRunsLeakNoDescriptorsOrRegions) {
  const std::string prefix = UniquePrefix("repeat");
  ASSERT_TRUE(set_shared_memory_prefix(prefix).ok());
  auto run_once = [&](const std::string& strategy) {
    ASSERT_TRUE(set_sharing_strategy(strategy).ok());
    absl::StatusOr<Queue> to_child = Queue::create();
    absl::StatusOr<Queue> to_parent = Queue::create();
    ASSERT_TRUE(to_child.ok() && to_parent.ok());
    Tensor t = arange(1000).to(kFloat32);
    ASSERT_TRUE(to_child->put(Value(t)).ok());
    absl::Status s = spawn(
        [&](int) -> absl::Status {
          EMBER_ASSIGN_OR_RETURN(Value v, to_child->get(absl::Seconds(20)));
          EMBER_ASSIGN_OR_RETURN(Tensor got, v.as<Tensor>());
          got.mul_(2);
          return to_parent->put(Value(Value::List{got, ones({300})}));
        },
        1);
    ASSERT_TRUE(s.ok()) << s;
    absl::StatusOr<Value> back = to_parent->get(absl::Seconds(20));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->list()[0].get_if<Tensor>()->sum().item<double>(), 999 * 1000);
    EXPECT_EQ(t.sum().item<double>(), 999 * 1000);
  };
  for (const std::string strategy : {"file_descriptor", "file_system"}) {
    run_once(strategy);  // warms up: the manager connection, thread-locals
    empty_shared_memory_cache();
    const int fds = testing::OpenFdCount();
    for (int rep = 0; rep < 30; ++rep) {
      run_once(strategy);
      empty_shared_memory_cache();
      ASSERT_EQ(testing::OpenFdCount(), fds) << strategy << " repetition " << rep;
      ASSERT_EQ(ShmEntries(prefix).size(), 0u) << strategy << " repetition " << rep;
    }
  }
  ASSERT_TRUE(set_sharing_strategy("file_descriptor").ok());
}

// Runs `fn` in a child and returns its status; kSkipExitCode means skipped.
absl::StatusOr<ExitStatus> InChild(std::function<absl::Status()> fn, std::string* message) {
  EMBER_ASSIGN_OR_RETURN(Process p, Process::start(std::move(fn)));
  EMBER_ASSIGN_OR_RETURN(ExitStatus e, p.join(absl::Seconds(30)));
  *message = p.error_message();
  return e;
}

TEST(LimitTest, TooFewDescriptorsToShareGivesAClearError) {
  std::string message;
  absl::StatusOr<ExitStatus> e = InChild(
      []() -> absl::Status {
        rlimit rl;
        ::getrlimit(RLIMIT_NOFILE, &rl);
        rl.rlim_cur = testing::OpenFdCount() + 4;
        ::setrlimit(RLIMIT_NOFILE, &rl);
        std::vector<Tensor> kept;
        for (int i = 0; i < 50; ++i) {
          kept.push_back(ones({10}));
          absl::Status s = share_memory_(kept.back());
          if (!s.ok()) return s;  // the error under test
        }
        return absl::InternalError("50 storages shared with a limit of a few descriptors");
      },
      &message);
  ASSERT_TRUE(e.ok());
  EXPECT_THAT(message, HasSubstr("limit (RLIMIT_NOFILE) is"));
  EXPECT_THAT(message, HasSubstr("set_sharing_strategy(\"file_system\")"));
}

TEST(LimitTest, TooFewDescriptorsToReceiveGivesAClearError) {
  auto pipe = Pipe();
  ASSERT_TRUE(pipe.ok());
  std::string message;
  std::vector<Tensor> many;
  Value::List list;
  for (int i = 0; i < 16; ++i) list.push_back(ones({4}));
  absl::StatusOr<Process> child = Process::start([&]() -> absl::Status {
    rlimit rl;
    ::getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_cur = testing::OpenFdCount() + 4;
    ::setrlimit(RLIMIT_NOFILE, &rl);
    EMBER_RETURN_IF_ERROR(pipe->second.send(Value("limit lowered")));
    absl::StatusOr<Value> v = pipe->second.recv(absl::Seconds(20));
    return v.ok() ? absl::InternalError("16 descriptors arrived under a limit of a few")
                  : v.status();
  });
  ASSERT_TRUE(child.ok());
  ASSERT_TRUE(pipe->first.recv(absl::Seconds(20)).ok());
  ASSERT_TRUE(pipe->first.send(Value(list)).ok());
  ASSERT_TRUE(child->join(absl::Seconds(20)).ok());
  EXPECT_THAT(child->error_message(), HasSubstr("descriptor limit (RLIMIT_NOFILE"));
}

TEST(LimitTest, FullDevShmIsAnAllocationErrorNamingTheSize) {
  std::string message;
  absl::StatusOr<ExitStatus> e = InChild(
      [&]() -> absl::Status {
        // A private mount namespace with a 1 MiB tmpfs on /dev/shm.
        if (::unshare(CLONE_NEWNS) != 0 ||
            ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
            ::mount("tmpfs", "/dev/shm", "tmpfs", 0, "size=1m") != 0) {
          message = std::strerror(errno);
          ::_exit(kSkipExitCode);
        }
        EMBER_RETURN_IF_ERROR(set_sharing_strategy("file_system"));
        EMBER_RETURN_IF_ERROR(set_shared_memory_prefix(UniquePrefix("quota")));
        Tensor small = ones({1000});
        EMBER_RETURN_IF_ERROR(share_memory_(small));  // fits
        Tensor big = ones({1 << 20});                 // 4 MiB does not
        absl::Status s = share_memory_(big);
        if (s.ok()) return absl::InternalError("4 MiB fit in a 1 MiB /dev/shm");
        if (big.sum().item<double>() != (1 << 20)) return absl::InternalError("data lost");
        return s;
      },
      &message);
  ASSERT_TRUE(e.ok());
  if (e->exit_code == kSkipExitCode) {
    GTEST_SKIP() << "cannot mount a small tmpfs on /dev/shm here (needs "
                    "CAP_SYS_ADMIN in a "
                    "private mount namespace)";
  }
  EXPECT_EQ(e->exit_code, 1);
  EXPECT_THAT(message, HasSubstr("cannot reserve 4194368 bytes of shared memory"));
  EXPECT_THAT(message, HasSubstr("No space left on device"));
}

}  // namespace
}  // namespace ember::multiprocessing
