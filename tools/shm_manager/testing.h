// Test utilities for the shm manager daemon (testonly): starting the real
// binary on a private socket, speaking its protocol raw, and naming regions.
//
//   std::string base = MakeTempDir();           // the daemons' parent folder
//   absl::StatusOr<Daemon> d = StartDaemon(base + "/ember-shm-a", {});
//   absl::StatusOr<UniqueFd> c = HelloFrom(d->socket);   // ready to register
//   SendOrDie(*c, EncodeFrame(FrameType::kRegister, TestRegionName(base, 0)));
//
// Thread-compatible.
#ifndef EMBER_TOOLS_SHM_MANAGER_TESTING_H_
#define EMBER_TOOLS_SHM_MANAGER_TESTING_H_

#include <fcntl.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "multiprocessing/manager_client.h"
#include "multiprocessing/manager_protocol.h"
#include "multiprocessing/testing.h"
#include "base/unique_fd.h"

extern char** environ;

namespace ember::shm_manager::testing {

using base::UniqueFd;

inline bool PathExists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

// A fresh 0700 directory "/tmp/embertest-shm-XXXXXX"; its name's random part
// keeps runs apart.
inline std::string MakeTempDir() {
  std::string dir = "/tmp/embertest-shm-XXXXXX";
  if (::mkdtemp(dir.data()) == nullptr) return "";
  return dir;
}

// What every TestRegionName(base, ...) starts with, without its "/".
inline std::string TestRegionPrefix(const std::string& base) {
  return absl::StrCat("embertest_srv_", base.substr(base.rfind('-') + 1));
}

// A region name of Ember's scheme for process `pid`, unique to `base` (a
// MakeTempDir() directory) and `counter`.
inline std::string TestRegionName(const std::string& base, uint64_t counter,
                                  pid_t pid = ::getpid()) {
  return multiprocessing::FormatRegionName({"/" + TestRegionPrefix(base), pid, counter, 0xabcd});
}
inline bool RegionExists(const std::string& name) { return PathExists("/dev/shm" + name); }

struct Daemon {
  std::string dir;
  std::string socket;
  pid_t pid = 0;  // the daemon proper (it detaches from its starter)
};

struct DaemonOptions {
  int grace_ms = 300;
  bool quiet = false;  // its stderr to /dev/null
};

// Creates `dir` (0700) and starts the real shm_manager there; returns once it
// listens.
inline absl::StatusOr<Daemon> StartDaemon(const std::string& dir, const DaemonOptions& options) {
  absl::StatusOr<std::string> binary = multiprocessing::FindManagerBinary();
  if (!binary.ok()) return binary.status();
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::InternalError(absl::StrCat("mkdir ", dir, ": ", std::strerror(errno)));
  }
  Daemon d{dir, dir + "/manager.sock", 0};
  std::string args[] = {*binary, "--socket=" + d.socket,
                        absl::StrCat("--grace_ms=", options.grace_ms)};
  char* argv[] = {args[0].data(), args[1].data(), args[2].data(), nullptr};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (options.quiet) {
    posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  }
  pid_t starter;
  int err = ::posix_spawn(&starter, argv[0], &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  if (err != 0) return absl::InternalError(absl::StrCat("posix_spawn: ", std::strerror(err)));
  ::waitpid(starter, nullptr, 0);  // it detaches at once
  if (!multiprocessing::testing::WaitUntil([&] { return PathExists(d.socket); },
                                           absl::Seconds(10))) {
    return absl::DeadlineExceededError(absl::StrCat("no daemon listens on ", d.socket));
  }
  // The lock file holds the daemon's pid, then its pid namespace.
  int fd = ::open((dir + "/lock").c_str(), O_RDONLY | O_CLOEXEC);
  char buf[32] = {};
  if (fd >= 0) {
    (void)!::read(fd, buf, sizeof(buf) - 1);
    ::close(fd);
  }
  if (!absl::SimpleAtoi(std::string(buf, std::strcspn(buf, " \n")), &d.pid)) {
    return absl::InternalError(absl::StrCat("no pid in ", dir, "/lock"));
  }
  return d;
}

inline absl::StatusOr<UniqueFd> ConnectTo(const std::string& socket) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strcpy(addr.sun_path, socket.c_str());
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return absl::UnavailableError(absl::StrCat("connect ", socket, ": ", std::strerror(errno)));
  }
  return fd;
}

inline absl::Status SendBytes(const UniqueFd& fd, const std::string& bytes) {
  return multiprocessing::WriteAll(fd.get(), bytes, absl::Now() + absl::Seconds(5));
}

inline absl::StatusOr<multiprocessing::Frame> ReadOne(const UniqueFd& fd) {
  multiprocessing::FrameReader reader;
  return multiprocessing::ReadFrame(fd.get(), reader, absl::Now() + absl::Seconds(5));
}

// Sends `frame` and returns the answer.
inline absl::StatusOr<multiprocessing::Frame> Ask(const UniqueFd& fd, const std::string& frame) {
  if (absl::Status s = SendBytes(fd, frame); !s.ok()) return s;
  return ReadOne(fd);
}

// Connects and says hello as this process; ready for registrations.
inline absl::StatusOr<UniqueFd> HelloFrom(const std::string& socket) {
  absl::StatusOr<UniqueFd> fd = ConnectTo(socket);
  if (!fd.ok()) return fd.status();
  absl::StatusOr<multiprocessing::Frame> ack = Ask(
      *fd,
      multiprocessing::EncodeFrame(multiprocessing::FrameType::kHello, absl::StrCat(::getpid())));
  if (!ack.ok()) return ack.status();
  if (ack->type != multiprocessing::FrameType::kAck) {
    return absl::InternalError("kHello answered with " + ack->payload);
  }
  return fd;
}

// Registers `name` on `fd`, then creates the region (as a client does).
inline absl::Status RegisterAndCreate(const UniqueFd& fd, const std::string& name) {
  absl::StatusOr<multiprocessing::Frame> ack =
      Ask(fd, multiprocessing::EncodeFrame(multiprocessing::FrameType::kRegister, name));
  if (!ack.ok()) return ack.status();
  if (ack->type != multiprocessing::FrameType::kAck) {
    return absl::InvalidArgumentError("register refused: " + ack->payload);
  }
  int shm = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (shm < 0) return absl::InternalError(absl::StrCat("shm_open: ", std::strerror(errno)));
  ::close(shm);
  return absl::OkStatus();
}

// Open descriptors of process `pid`.
inline int OpenFdsOf(pid_t pid) {
  return static_cast<int>(
      multiprocessing::testing::DirEntries(absl::StrCat("/proc/", pid, "/fd")).size());
}

}  // namespace ember::shm_manager::testing

#endif  // EMBER_TOOLS_SHM_MANAGER_TESTING_H_
