// Runs the real shm_manager binary on a private socket and speaks to it raw:
// well-formed frames in pieces, garbage, truncated and foreign frames, and
// clients that die.
#include <fcntl.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "multiprocessing/manager_client.h"
#include "multiprocessing/manager_protocol.h"
#include "multiprocessing/unique_fd.h"

extern char** environ;

namespace ember::multiprocessing {
namespace {

using ::testing::HasSubstr;

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

bool WaitUntil(const std::function<bool()>& cond, absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  while (!cond()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return true;
}

class ServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::string> binary = FindManagerBinary();
    ASSERT_TRUE(binary.ok()) << binary.status();
    dir_ = "/tmp/ember-shm-test-XXXXXX";
    ASSERT_NE(::mkdtemp(dir_.data()), nullptr);
    socket_ = dir_ + "/manager.sock";
    std::string args[] = {*binary, "--socket=" + socket_, "--grace_ms=300"};
    char* argv[] = {args[0].data(), args[1].data(), args[2].data(), nullptr};
    pid_t pid;
    ASSERT_EQ(::posix_spawn(&pid, argv[0], nullptr, nullptr, argv, environ), 0);
    ::waitpid(pid, nullptr, 0);  // it detaches at once
    ASSERT_TRUE(WaitUntil([&] { return Exists(socket_); }, absl::Seconds(10)));
  }
  void TearDown() override {
    // The daemon leaves by itself once idle; so must its socket and directory.
    EXPECT_TRUE(WaitUntil([&] { return !Exists(dir_); }, absl::Seconds(10)));
  }

  UniqueFd Connect() {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strcpy(addr.sun_path, socket_.c_str());
    UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    EXPECT_EQ(
        ::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)),
        0);
    return fd;
  }
  absl::StatusOr<Frame> Read(const UniqueFd& fd) {
    FrameReader reader;
    return ReadFrame(fd.get(), reader, absl::Now() + absl::Seconds(5));
  }
  void Send(const UniqueFd& fd, const std::string& bytes) {
    ASSERT_TRUE(WriteAll(fd.get(), bytes, absl::Now() + absl::Seconds(5)).ok());
  }
  // Connects and says hello; the connection is ready for registrations.
  UniqueFd Hello() {
    UniqueFd fd = Connect();
    Send(fd, EncodeFrame(FrameType::kHello, absl::StrCat(::getpid())));
    absl::StatusOr<Frame> ack = Read(fd);
    EXPECT_TRUE(ack.ok() && ack->type == FrameType::kAck);
    return fd;
  }
  // Creates a real region the daemon can unlink.
  std::string MakeRegion(const std::string& tag) {
    // The directory's random part keeps names apart across parallel runs.
    std::string name = absl::StrCat("/embertest_server_",
                                    dir_.substr(dir_.rfind('-') + 1), "_", tag);
    int fd = ::shm_open(name.c_str(), O_CREAT | O_RDWR, 0600);
    EXPECT_GE(fd, 0);
    ::close(fd);
    return name;
  }
  static bool RegionExists(const std::string& name) {
    return Exists("/dev/shm" + name);
  }

  std::string dir_, socket_;
};

TEST_F(ServerTest, AcksRegistrationsSentByteByByte) {
  UniqueFd fd = Connect();
  std::string frames =
      EncodeFrame(FrameType::kHello, absl::StrCat(::getpid())) +
      EncodeFrame(FrameType::kRegister, "/embertest_bytewise");
  for (char c : frames) {
    Send(fd, std::string(1, c));
    absl::SleepFor(absl::Microseconds(200));
  }
  FrameReader reader;
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<Frame> f =
        ReadFrame(fd.get(), reader, absl::Now() + absl::Seconds(5));
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_EQ(f->type, FrameType::kAck);
  }
  Send(fd, EncodeFrame(FrameType::kUnregister, "/embertest_bytewise") +
               EncodeFrame(FrameType::kGoodbye));
}

TEST_F(ServerTest, RejectsGarbageAndKeepsServing) {
  UniqueFd bad = Connect();
  Send(bad, "GET / HTTP/1.1\r\n\r\n");
  absl::StatusOr<Frame> f = Read(bad);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->type, FrameType::kError);
  EXPECT_THAT(f->payload, HasSubstr("bad magic"));
  EXPECT_EQ(Read(bad).status().code(),
            absl::StatusCode::kUnavailable);  // closed
  UniqueFd good = Hello();
  Send(good, EncodeFrame(FrameType::kGoodbye));
}

TEST_F(ServerTest, RejectsForeignVersionsTypesLengthsAndNames) {
  auto expect_rejected = [&](const std::string& bytes, const std::string& why) {
    UniqueFd fd = Connect();
    Send(fd, bytes);
    FrameReader reader;
    absl::StatusOr<Frame> f;
    do {  // skip the ack of a valid kHello
      f = ReadFrame(fd.get(), reader, absl::Now() + absl::Seconds(5));
      ASSERT_TRUE(f.ok()) << f.status();
    } while (f->type == FrameType::kAck);
    EXPECT_EQ(f->type, FrameType::kError) << why;
    EXPECT_THAT(f->payload, HasSubstr(why));
  };
  std::string hello = EncodeFrame(FrameType::kHello, "1");
  std::string v9 = hello;
  v9[4] = 9;  // version
  expect_rejected(v9, "version 9");
  std::string type = hello;
  type[6] = 77;
  expect_rejected(type, "unknown frame type 77");
  std::string huge = hello;
  huge[10] = 0x7f;  // length
  expect_rejected(huge, "exceeds the limit");
  expect_rejected(EncodeFrame(FrameType::kRegister, "/early"),
                  "first frame must be kHello");
  expect_rejected(hello + EncodeFrame(FrameType::kRegister, "../etc/passwd"),
                  "is not a region name");
  expect_rejected(EncodeFrame(FrameType::kHello, "-3"), "bad kHello");
}

TEST_F(ServerTest, TruncatedFramesThenHangUpHarmNothing) {
  {
    UniqueFd fd = Connect();
    Send(fd, EncodeFrame(FrameType::kHello, "1").substr(0, 7));
  }
  UniqueFd good = Hello();
  Send(good, EncodeFrame(FrameType::kGoodbye));
}

TEST_F(ServerTest, UnlinksTheRegionsOfAClientThatDies) {
  std::string survivor_region = MakeRegion("survivor");
  std::string dead_region = MakeRegion("dead");
  UniqueFd survivor = Hello();
  Send(survivor, EncodeFrame(FrameType::kRegister, survivor_region));
  ASSERT_EQ(Read(survivor)->type, FrameType::kAck);
  {
    UniqueFd dying = Hello();
    Send(dying, EncodeFrame(FrameType::kRegister, dead_region));
    ASSERT_EQ(Read(dying)->type, FrameType::kAck);
  }  // hangs up without kGoodbye: as if killed
  EXPECT_TRUE(
      WaitUntil([&] { return !RegionExists(dead_region); }, absl::Seconds(5)));
  EXPECT_TRUE(RegionExists(survivor_region));
  // A clean exit leaves its regions to others until the daemon goes idle.
  Send(survivor, EncodeFrame(FrameType::kGoodbye));
  survivor.reset();
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_TRUE(RegionExists(survivor_region) || !Exists(socket_));
  EXPECT_TRUE(WaitUntil([&] { return !RegionExists(survivor_region); },
                        absl::Seconds(5)));
}

}  // namespace
}  // namespace ember::multiprocessing
