// Testing helpers for the hub (testonly): a real HTTPS server on loopback and
// an archive writer for fixture repositories.
//
//   EMBER_ASSIGN_OR_RETURN(ember::hub::testing::TestServer server,
//                          ember::hub::testing::TestServer::Start(root,
//                          work_dir));
//   server.url("/alice/models/zipball/master");   //
//   https://127.0.0.1:<port>/... setenv(ember::hub::kCaBundleEnv,
//   server.ca_bundle().c_str(), 1);
//
// The server is hub/testing/hub_server.py run by /usr/bin/python3 (see its
// docstring for the special paths); it serves whatever is under `root` at the
// time of each request, so tests change fixtures by writing files.
//
// Thread-safety: a TestServer is move-only; its accessors are const.
#ifndef EMBER_HUB_TESTING_TEST_SERVER_H_
#define EMBER_HUB_TESTING_TEST_SERVER_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ember::hub::testing {

class TestServer {
 public:
  // Starts the server on 127.0.0.1 (any free port) serving `root`; the
  // certificate goes to `work_dir`. Blocks until it listens (at most 30 s).
  static absl::StatusOr<TestServer> Start(const std::string& root,
                                          const std::string& work_dir);

  TestServer(TestServer&& other) noexcept;
  TestServer& operator=(TestServer&&) = delete;
  TestServer(const TestServer&) = delete;
  ~TestServer();  // stops the server

  std::string base_url() const {
    return "https://127.0.0.1:" + std::to_string(port_);
  }
  std::string url(const std::string& path) const { return base_url() + path; }
  int port() const { return port_; }
  // The PEM certificate clients must trust.
  const std::string& ca_bundle() const { return ca_bundle_; }
  // How many times `path` was requested so far.
  absl::StatusOr<int> RequestCount(const std::string& path) const;

 private:
  TestServer(pid_t pid, int stdin_fd, int port, std::string ca_bundle)
      : pid_(pid),
        stdin_fd_(stdin_fd),
        port_(port),
        ca_bundle_(std::move(ca_bundle)) {}
  pid_t pid_ = -1;
  int stdin_fd_ = -1;
  int port_ = 0;
  std::string ca_bundle_;
};

// One archive member: a file (`contents`), a directory (path ending in '/'),
// a symbolic link (`symlink` set) or a hard link (`hardlink` set).
struct ArchiveEntry {
  std::string path;
  std::string contents;
  std::string symlink;
  std::string hardlink;
};

// Writes `entries` as an archive at `path` (parent folders created); `format`
// is "zip" or "tar.gz".
absl::Status WriteArchive(const std::string& path, const std::string& format,
                          const std::vector<ArchiveEntry>& entries);

// Writes `contents` to `path`, creating parent directories.
absl::Status WriteFile(const std::string& path, const std::string& contents);

// The contents of `path`.
absl::StatusOr<std::string> ReadFile(const std::string& path);

}  // namespace ember::hub::testing

#endif  // EMBER_HUB_TESTING_TEST_SERVER_H_
