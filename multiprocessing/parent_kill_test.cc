// SIGKILL of a parent under file_system: its children die with it, and the
// shm manager, left with no clients, unlinks every region once its grace
// period has passed, then exits. This test's own process never uses
// file_system, so the manager it checks belongs to the killed tree alone.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "multiprocessing/connection.h"
#include "multiprocessing/manager_client.h"
#include "multiprocessing/process.h"
#include "multiprocessing/queue.h"
#include "multiprocessing/sharing.h"
#include "multiprocessing/testing.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"

namespace ember::multiprocessing {
namespace {

TEST(ParentKillTest, RegionsAreUnlinkedAfterTheGracePeriod) {
  const std::string prefix = testing::UniquePrefix("parentkill");
  auto pipe = Pipe();
  ASSERT_TRUE(pipe.ok());
  absl::StatusOr<Process> parent = Process::start([&]() -> absl::Status {
    EMBER_RETURN_IF_ERROR(set_sharing_strategy("file_system"));
    EMBER_RETURN_IF_ERROR(set_shared_memory_prefix(prefix));
    Tensor mine = ones({2048});
    EMBER_RETURN_IF_ERROR(share_memory_(mine));
    EMBER_ASSIGN_OR_RETURN(Queue q, Queue::create());
    std::vector<Process> children;
    for (int c = 0; c < 2; ++c) {
      EMBER_ASSIGN_OR_RETURN(
          Process p, Process::start([&]() -> absl::Status {
            EMBER_RETURN_IF_ERROR(q.put(Value(zeros({4096}))));
            absl::SleepFor(absl::Seconds(60));
            return absl::OkStatus();
          }));
      children.push_back(std::move(p));
    }
    std::vector<Value> got;
    for (int c = 0; c < 2; ++c) {
      EMBER_ASSIGN_OR_RETURN(Value v, q.get(absl::Seconds(20)));
      got.push_back(std::move(v));
    }
    EMBER_RETURN_IF_ERROR(pipe->second.send(Value(ManagerSocketPath())));
    absl::SleepFor(absl::Seconds(60));
    return absl::OkStatus();
  });
  ASSERT_TRUE(parent.ok());
  absl::StatusOr<Value> socket = pipe->first.recv(absl::Seconds(20));
  ASSERT_TRUE(socket.ok()) << socket.status();
  const std::string socket_path = *socket->get_if<std::string>();
  EXPECT_GE(testing::ShmEntries(prefix).size(), 3u);
  parent->kill();
  ASSERT_TRUE(parent->join(absl::Seconds(10)).ok());
  EXPECT_TRUE(testing::WaitUntil(
      [&] { return testing::ShmEntries(prefix).empty(); }, absl::Seconds(10)))
      << testing::ShmEntries(prefix).size() << " regions left";
  struct stat st;
  EXPECT_TRUE(testing::WaitUntil(
      [&] { return ::stat(socket_path.c_str(), &st) != 0; }, absl::Seconds(10)))
      << "the shm manager did not exit";
}

// Ctrl-C reaches a whole process group; the manager, in its own session,
// must survive it to clean up after the group.
TEST(ParentKillTest, TheManagerSurvivesSignalsToItsStartersGroup) {
  const std::string prefix = testing::UniquePrefix("group");
  auto pipe = Pipe();
  ASSERT_TRUE(pipe.ok());
  absl::StatusOr<Process> leader = Process::start([&]() -> absl::Status {
    ::setpgid(0, 0);
    EMBER_RETURN_IF_ERROR(set_sharing_strategy("file_system"));
    EMBER_RETURN_IF_ERROR(set_shared_memory_prefix(prefix));
    Tensor mine = ones({2048});
    EMBER_RETURN_IF_ERROR(share_memory_(mine));
    EMBER_RETURN_IF_ERROR(pipe->second.send(Value(ManagerSocketPath())));
    absl::SleepFor(absl::Seconds(60));
    return absl::OkStatus();
  });
  ASSERT_TRUE(leader.ok());
  absl::StatusOr<Value> socket = pipe->first.recv(absl::Seconds(20));
  ASSERT_TRUE(socket.ok()) << socket.status();
  const std::string socket_path = *socket->get_if<std::string>();
  ASSERT_EQ(testing::ShmEntries(prefix).size(), 1u);
  ASSERT_EQ(::killpg(leader->pid(), SIGINT), 0);
  ASSERT_EQ(::killpg(leader->pid(), SIGHUP), 0);
  absl::StatusOr<ExitStatus> e = leader->join(absl::Seconds(10));
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->signal, SIGINT);
  // Only a live manager removes the region and then its own socket.
  EXPECT_TRUE(testing::WaitUntil(
      [&] { return testing::ShmEntries(prefix).empty(); }, absl::Seconds(10)));
  struct stat st;
  EXPECT_TRUE(
      testing::WaitUntil([&] { return ::stat(socket_path.c_str(), &st) != 0; },
                         absl::Seconds(10)));
}

}  // namespace
}  // namespace ember::multiprocessing
