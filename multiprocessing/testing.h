// Test utilities for multiprocessing/ (testonly): counting this process's
// descriptors, listing /dev/shm, unique region prefixes, waiting for a
// condition with a deadline, CHILD_CHECK for code that runs in a child
// process, and (for every test binary that links this) a
// last step that lets the shm manager the tests started exit cleanly.
//
//   std::string prefix = UniquePrefix("leak");
//   ASSERT_TRUE(WaitUntil([&] { return ShmEntries(prefix).empty(); },
//   absl::Seconds(5)));
#ifndef EMBER_MULTIPROCESSING_TESTING_H_
#define EMBER_MULTIPROCESSING_TESTING_H_

#include <dirent.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "multiprocessing/manager_client.h"

// Inside a child: fail with the location and condition.
#define CHILD_CHECK(cond)                                                                          \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      return absl::InternalError(absl::StrCat(__FILE__, ":", __LINE__, ": check failed: " #cond)); \
    }                                                                                              \
  } while (0)

namespace ember::multiprocessing::testing {

// Entries of `dir` (e.g. "/proc/self/fd", "/dev/shm") whose names start with
// `prefix`.
inline std::vector<std::string> DirEntries(const std::string& dir, const std::string& prefix = "") {
  std::vector<std::string> out;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      std::string name = e->d_name;
      if (name != "." && name != ".." && name.starts_with(prefix)) out.push_back(name);
    }
    ::closedir(d);
  }
  return out;
}

// Open descriptors of this process (minus the one used to count them).
inline int OpenFdCount() { return static_cast<int>(DirEntries("/proc/self/fd").size()) - 1; }

// /dev/shm entries of regions named with `prefix` (given with its "/").
inline std::vector<std::string> ShmEntries(const std::string& prefix) {
  return DirEntries("/dev/shm", prefix.substr(1));
}

// A region prefix no other test run uses: "/embertest_<tag>_<pid>_<random>"
// (pids alone repeat across sandboxes with their own pid namespaces). Stable
// within a process, so that children compute the same one.
inline std::string UniquePrefix(const std::string& tag) {
  static const uint32_t random = [] {
    uint32_t r = 0;
    (void)!::getrandom(&r, sizeof(r), 0);
    return r;
  }();
  return absl::StrCat("/embertest_", tag, "_", ::getpid(), "_", absl::Hex(random));
}

// Polls `cond` until it holds (true) or `timeout` passes (false).
inline bool WaitUntil(const std::function<bool()>& cond, absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  while (!cond()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return true;
}

// Once all tests have run, says goodbye to the shm manager this process used
// and waits for it to go idle, unlink what is left and exit. Test sandboxes
// kill what remains of a test's process tree when it ends; a daemon killed
// mid-way leaves its directory in /tmp. Waits at most the daemon's grace
// period ($EMBER_SHM_MANAGER_GRACE_MS) plus 10 s.
class ManagerExitEnvironment : public ::testing::Environment {
 public:
  void TearDown() override {
    const std::string socket = ManagerSocketPath();
    DisconnectFromManager();
    if (socket.empty()) return;
    struct stat st;
    EXPECT_TRUE(WaitUntil([&] { return ::stat(socket.c_str(), &st) != 0; }, absl::Seconds(15)))
        << "the shm manager at " << socket << " did not exit";
  }
};
inline ::testing::Environment* const kManagerExitEnvironment =
    ::testing::AddGlobalTestEnvironment(new ManagerExitEnvironment);

}  // namespace ember::multiprocessing::testing

#endif  // EMBER_MULTIPROCESSING_TESTING_H_
