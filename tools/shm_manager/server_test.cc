// Runs the real shm_manager binary on a private socket and speaks to it raw:
// well-formed frames in pieces, garbage, truncated and foreign frames,
// clients that claim what is not theirs, clients that die, and a daemon that
// is killed before its clients.
#include "tools/shm_manager/server.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "multiprocessing/manager_protocol.h"
#include "multiprocessing/testing.h"
#include "base/unique_fd.h"
#include "tools/shm_manager/testing.h"

namespace ember::shm_manager::testing {
namespace {

using multiprocessing::EncodeFrame;
using multiprocessing::Frame;
using multiprocessing::FrameReader;
using multiprocessing::FrameType;
using multiprocessing::testing::DirEntries;
using multiprocessing::testing::WaitUntil;
using ::testing::HasSubstr;

// A process that has exited (a zombie counts: it holds nothing).
bool Gone(pid_t pid) {
  if (::kill(pid, 0) != 0) return true;
  char state = 0;
  if (FILE* f = std::fopen(absl::StrCat("/proc/", pid, "/stat").c_str(), "r")) {
    (void)!std::fscanf(f, "%*d %*s %c", &state);
    std::fclose(f);
  }
  return state == 'Z' || state == 'X';
}

class ServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = MakeTempDir();
    ASSERT_FALSE(base_.empty());
    absl::StatusOr<Daemon> d = StartDaemon(base_ + "/ember-shm-first", {});
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = *d;
  }
  void TearDown() override {
    for (pid_t child : children_) {
      ::kill(child, SIGKILL);
      ::waitpid(child, nullptr, 0);
    }
    // Every daemon leaves by itself once idle; so must its directory, and no
    // region of this test may remain.
    EXPECT_TRUE(WaitUntil([&] { return DirEntries(base_).empty(); }, absl::Seconds(10)))
        << "left in " << base_ << ": " << DirEntries(base_).size() << " entries";
    const std::string prefix = TestRegionPrefix(base_);
    EXPECT_TRUE(
        WaitUntil([&] { return DirEntries("/dev/shm", prefix).empty(); }, absl::Seconds(5)));
    for (const std::string& left : DirEntries("/dev/shm", prefix))
      ::shm_unlink(("/" + left).c_str());
    EXPECT_EQ(::rmdir(base_.c_str()), 0) << base_;
  }

  UniqueFd Hello() {
    absl::StatusOr<UniqueFd> fd = HelloFrom(daemon_.socket);
    EXPECT_TRUE(fd.ok()) << fd.status();
    return fd.ok() ? *std::move(fd) : UniqueFd();
  }
  void Send(const UniqueFd& fd, const std::string& bytes) {
    ASSERT_TRUE(SendBytes(fd, bytes).ok());
  }
  // The kError a request gets, or a failure naming what came instead.
  std::string ErrorFor(const UniqueFd& fd, const std::string& frame) {
    absl::StatusOr<Frame> f = Ask(fd, frame);
    if (!f.ok()) return "no answer: " + std::string(f.status().message());
    if (f->type != FrameType::kError) return "not refused";
    return f->payload;
  }
  // A child process that says hello, registers and creates `n` regions
  // (TestRegionName(base_, i, its pid)) with the daemon at `socket`, then
  // waits to be killed. Returns its pid once the regions exist.
  pid_t StartClient(const std::string& socket, int n) {
    int ready[2];
    EXPECT_EQ(::pipe(ready), 0);
    pid_t pid = ::fork();
    if (pid == 0) {
      ::close(ready[0]);
      absl::StatusOr<UniqueFd> fd = HelloFrom(socket);
      bool ok = fd.ok();
      for (int i = 0; ok && i < n; ++i) ok = RegisterAndCreate(*fd, TestRegionName(base_, i)).ok();
      (void)!::write(ready[1], ok ? "y" : "n", 1);
      while (true) ::pause();
    }
    ::close(ready[1]);
    char c = 0;
    EXPECT_EQ(::read(ready[0], &c, 1), 1);
    ::close(ready[0]);
    EXPECT_EQ(c, 'y');
    children_.push_back(pid);
    return pid;
  }
  void KillClient(pid_t pid) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    std::erase(children_, pid);
  }

  std::string base_;
  Daemon daemon_;
  std::vector<pid_t> children_;
};

TEST_F(ServerTest, AcksRegistrationsSentByteByByte) {
  absl::StatusOr<UniqueFd> fd = ConnectTo(daemon_.socket);
  ASSERT_TRUE(fd.ok());
  const std::string name = TestRegionName(base_, 0);
  std::string frames = EncodeFrame(FrameType::kHello, absl::StrCat(::getpid())) +
                       EncodeFrame(FrameType::kRegister, name);
  for (char c : frames) {
    Send(*fd, std::string(1, c));
    absl::SleepFor(absl::Microseconds(200));
  }
  FrameReader reader;
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<Frame> f = ReadFrame(fd->get(), reader, absl::Now() + absl::Seconds(5));
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_EQ(f->type, FrameType::kAck);
  }
  Send(*fd, EncodeFrame(FrameType::kUnregister, name) + EncodeFrame(FrameType::kGoodbye));
}

TEST_F(ServerTest, RejectsGarbageAndKeepsServing) {
  absl::StatusOr<UniqueFd> bad = ConnectTo(daemon_.socket);
  ASSERT_TRUE(bad.ok());
  Send(*bad, "GET / HTTP/1.1\r\n\r\n");
  absl::StatusOr<Frame> f = ReadOne(*bad);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->type, FrameType::kError);
  EXPECT_THAT(f->payload, HasSubstr("bad magic"));
  EXPECT_EQ(ReadOne(*bad).status().code(), absl::StatusCode::kUnavailable);  // closed
  UniqueFd good = Hello();
  Send(good, EncodeFrame(FrameType::kGoodbye));
}

TEST_F(ServerTest, RejectsForeignVersionsTypesLengthsAndNames) {
  auto expect_rejected = [&](const std::string& bytes, const std::string& why) {
    absl::StatusOr<UniqueFd> fd = ConnectTo(daemon_.socket);
    ASSERT_TRUE(fd.ok());
    Send(*fd, bytes);
    FrameReader reader;
    absl::StatusOr<Frame> f;
    do {  // skip the ack of a valid kHello
      f = ReadFrame(fd->get(), reader, absl::Now() + absl::Seconds(5));
      ASSERT_TRUE(f.ok()) << f.status();
    } while (f->type == FrameType::kAck);
    EXPECT_EQ(f->type, FrameType::kError) << why;
    EXPECT_THAT(f->payload, HasSubstr(why));
  };
  std::string hello = EncodeFrame(FrameType::kHello, absl::StrCat(::getpid()));
  std::string v9 = hello;
  v9[4] = 9;  // version
  expect_rejected(v9, "version 9");
  std::string type = hello;
  type[6] = 77;
  expect_rejected(type, "unknown frame type 77");
  std::string huge = hello;
  huge[10] = 0x7f;  // length
  expect_rejected(huge, "exceeds the limit");
  expect_rejected(EncodeFrame(FrameType::kRegister, TestRegionName(base_, 0)),
                  "first frame must be kHello");
  expect_rejected(hello + EncodeFrame(FrameType::kRegister, "../etc/passwd"),
                  "is not an Ember region name");
  expect_rejected(EncodeFrame(FrameType::kHello, "-3"), "bad kHello");
}

TEST_F(ServerTest, HelloMustNameThePeersOwnPid) {
  absl::StatusOr<UniqueFd> fd = ConnectTo(daemon_.socket);
  ASSERT_TRUE(fd.ok());
  // pid 1 is another process: SO_PEERCRED says who is really there.
  EXPECT_THAT(
      ErrorFor(*fd, EncodeFrame(FrameType::kHello, "1")),
      HasSubstr(absl::StrCat("kHello says pid 1 but the connection is from pid ", ::getpid())));
}

TEST_F(ServerTest, RefusesRegionsTheClientDidNotCreate) {
  // Another program's segment, and one named like a region of this client
  // but made before registration: neither may be registered, so neither is
  // unlinked when this client dies.
  const std::string foreign =
      absl::StrCat("/embertest_foreign_", base_.substr(base_.rfind('-') + 1));
  const std::string premade = TestRegionName(base_, 7);
  for (const std::string& name : {foreign, premade}) {
    int shm = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    ASSERT_GE(shm, 0) << name;
    ::close(shm);
  }
  {
    UniqueFd a = Hello();
    EXPECT_THAT(ErrorFor(a, EncodeFrame(FrameType::kRegister, foreign)),
                HasSubstr("is not an Ember region name"));
  }
  {
    UniqueFd b = Hello();
    EXPECT_THAT(ErrorFor(b, EncodeFrame(FrameType::kRegister, premade)),
                HasSubstr("already exists in /dev/shm"));
  }
  {
    UniqueFd c = Hello();  // a name carrying another process's pid
    EXPECT_THAT(ErrorFor(c, EncodeFrame(FrameType::kRegister, TestRegionName(base_, 8, 1))),
                HasSubstr("carries pid 1 but this client is pid"));
  }
  absl::SleepFor(absl::Milliseconds(100));  // the daemon has dropped all three
  EXPECT_TRUE(RegionExists(foreign));
  EXPECT_TRUE(RegionExists(premade));
  ::shm_unlink(foreign.c_str());
  ::shm_unlink(premade.c_str());
}

TEST_F(ServerTest, OneClientCannotUnregisterAnothersLiveRegion) {
  pid_t owner = StartClient(daemon_.socket, 2);
  const std::string kept = TestRegionName(base_, 0, owner);
  const std::string released = TestRegionName(base_, 1, owner);
  UniqueFd other = Hello();
  EXPECT_THAT(ErrorFor(other, EncodeFrame(FrameType::kUnregister, kept)),
              HasSubstr(absl::StrCat("belongs to pid ", owner, " and still exists")));
  // Once a region is unlinked (its last holder here), anyone may say so.
  ASSERT_EQ(::shm_unlink(released.c_str()), 0);
  UniqueFd last_holder = Hello();
  Send(last_holder, EncodeFrame(FrameType::kUnregister, released));
  absl::StatusOr<Frame> ack =
      Ask(last_holder, EncodeFrame(FrameType::kRegister, TestRegionName(base_, 2)));
  ASSERT_TRUE(ack.ok()) << ack.status();
  EXPECT_EQ(ack->type, FrameType::kAck);  // still connected: nothing was refused
  Send(last_holder, EncodeFrame(FrameType::kUnregister, TestRegionName(base_, 2)) +
                        EncodeFrame(FrameType::kGoodbye));
  // The owner's registration survived: its death unlinks the region.
  KillClient(owner);
  EXPECT_TRUE(WaitUntil([&] { return !RegionExists(kept); }, absl::Seconds(5)));
}

TEST_F(ServerTest, TruncatedFramesThenHangUpHarmNothing) {
  {
    absl::StatusOr<UniqueFd> fd = ConnectTo(daemon_.socket);
    ASSERT_TRUE(fd.ok());
    Send(*fd, EncodeFrame(FrameType::kHello, absl::StrCat(::getpid())).substr(0, 7));
  }
  UniqueFd good = Hello();
  Send(good, EncodeFrame(FrameType::kGoodbye));
}

TEST_F(ServerTest, UnlinksTheRegionsOfAClientThatDies) {
  pid_t dying = StartClient(daemon_.socket, 1);
  const std::string dead_region = TestRegionName(base_, 0, dying);
  UniqueFd survivor = Hello();
  const std::string survivor_region = TestRegionName(base_, 0);
  ASSERT_TRUE(RegisterAndCreate(survivor, survivor_region).ok());
  KillClient(dying);
  EXPECT_TRUE(WaitUntil([&] { return !RegionExists(dead_region); }, absl::Seconds(5)));
  EXPECT_TRUE(RegionExists(survivor_region));
  // A clean exit leaves its regions to others until the daemon goes idle.
  Send(survivor, EncodeFrame(FrameType::kGoodbye));
  survivor.reset();
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_TRUE(RegionExists(survivor_region) || !PathExists(daemon_.socket));
  EXPECT_TRUE(WaitUntil([&] { return !RegionExists(survivor_region); }, absl::Seconds(5)));
}

TEST_F(ServerTest, ANewDaemonReapsWhatAKilledOneLeft) {
  pid_t doomed = StartClient(daemon_.socket, 2);
  pid_t running = StartClient(daemon_.socket, 1);
  const std::vector<std::string> doomed_regions = {TestRegionName(base_, 0, doomed),
                                                   TestRegionName(base_, 1, doomed)};
  const std::string running_region = TestRegionName(base_, 0, running);
  // The daemon dies first, then one of its clients.
  ::kill(daemon_.pid, SIGKILL);
  ASSERT_TRUE(WaitUntil([&] { return Gone(daemon_.pid); }, absl::Seconds(5)));
  KillClient(doomed);
  absl::SleepFor(absl::Milliseconds(200));
  for (const std::string& name : doomed_regions) EXPECT_TRUE(RegionExists(name)) << name;
  EXPECT_TRUE(PathExists(daemon_.dir));

  // The next daemon started beside it reaps: the dead client's regions go,
  // the running client's region stays until that client dies too.
  absl::StatusOr<Daemon> next = StartDaemon(base_ + "/ember-shm-next", {});
  ASSERT_TRUE(next.ok()) << next.status();
  UniqueFd client = [&] {
    absl::StatusOr<UniqueFd> fd = HelloFrom(next->socket);
    EXPECT_TRUE(fd.ok());
    return fd.ok() ? *std::move(fd) : UniqueFd();
  }();
  EXPECT_FALSE(PathExists(daemon_.dir));
  for (const std::string& name : doomed_regions) EXPECT_FALSE(RegionExists(name)) << name;
  EXPECT_TRUE(RegionExists(running_region));
  KillClient(running);
  EXPECT_TRUE(WaitUntil([&] { return !RegionExists(running_region); }, absl::Seconds(5)));
  // The adopted registration is in the new journal too: killing this daemon
  // as well leaves nothing a third cannot reap.
  Send(client, EncodeFrame(FrameType::kGoodbye));
}

TEST_F(ServerTest, TheJournalStaysBounded) {
  UniqueFd fd = Hello();
  const std::string journal = daemon_.dir + "/journal";
  struct stat st {};
  off_t largest = 0;
  for (int i = 0; i < 1500; ++i) {
    const std::string name = TestRegionName(base_, i);
    absl::StatusOr<Frame> ack = Ask(fd, EncodeFrame(FrameType::kRegister, name));
    ASSERT_TRUE(ack.ok() && ack->type == FrameType::kAck) << i;
    Send(fd, EncodeFrame(FrameType::kUnregister, name));
    if (::stat(journal.c_str(), &st) == 0) largest = std::max(largest, st.st_size);
  }
  // 1500 registrations and releases write ~150 KiB of lines; compaction keeps
  // the file near its threshold.
  EXPECT_LE(largest, static_cast<off_t>(kJournalCompactBytes + 4096));
  EXPECT_GT(largest, 0);
  Send(fd, EncodeFrame(FrameType::kGoodbye));
}

}  // namespace
}  // namespace ember::shm_manager::testing
