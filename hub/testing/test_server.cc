#include "hub/testing/test_server.h"

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "hub/download.h"

namespace ember::hub::testing {

absl::StatusOr<TestServer> TestServer::Start(const std::string& root,
                                             const std::string& work_dir) {
  std::filesystem::create_directories(work_dir);
  std::filesystem::create_directories(root);
  std::string port_file = work_dir + "/port";
  std::filesystem::remove(port_file);
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0)
    return absl::InternalError(std::strerror(errno));
  pid_t pid = fork();
  if (pid < 0)
    return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  if (pid == 0) {
    dup2(fds[0], STDIN_FILENO);
    execl("/usr/bin/python3", "python3", "hub/testing/hub_server.py", "--root",
          root.c_str(), "--port-file", port_file.c_str(), "--cert-dir",
          work_dir.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  close(fds[0]);
  TestServer server(pid, fds[1], 0, work_dir + "/cert.pem");
  absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (absl::Now() < deadline) {
    std::ifstream in(port_file);
    if (in >> server.port_) return server;
    int wstatus;
    if (waitpid(pid, &wstatus, WNOHANG) == pid) {
      server.pid_ = -1;
      return absl::InternalError(
          "hub/testing/hub_server.py exited before listening");
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::DeadlineExceededError(
      "hub/testing/hub_server.py did not start within 30 s");
}

TestServer::TestServer(TestServer&& other) noexcept
    : pid_(std::exchange(other.pid_, -1)),
      stdin_fd_(std::exchange(other.stdin_fd_, -1)),
      port_(other.port_),
      ca_bundle_(std::move(other.ca_bundle_)) {}

TestServer::~TestServer() {
  if (stdin_fd_ >= 0) close(stdin_fd_);
  if (pid_ <= 0) return;
  for (int i = 0; i < 100; ++i) {  // up to 5 s for a clean exit
    if (waitpid(pid_, nullptr, WNOHANG) == pid_) return;
    absl::SleepFor(absl::Milliseconds(50));
  }
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
}

absl::StatusOr<int> TestServer::RequestCount(const std::string& path) const {
  std::string tmp =
      std::filesystem::path(ca_bundle_).parent_path() / "stats.txt";
  DownloadOptions opts;
  opts.ca_bundle = ca_bundle_;
  opts.progress = false;
  if (absl::Status s = download_url_to_file(url("/__stats"), tmp, opts); !s.ok())
    return s;
  absl::StatusOr<std::string> text = ReadFile(tmp);
  if (!text.ok()) return text.status();
  for (absl::string_view line :
       absl::StrSplit(*text, '\n', absl::SkipEmpty())) {
    std::pair<std::string, std::string> kv =
        absl::StrSplit(line, absl::MaxSplits(' ', 1));
    int n;
    if (kv.second == path && absl::SimpleAtoi(kv.first, &n)) return n;
  }
  return 0;
}

absl::Status WriteArchive(const std::string& path, const std::string& format,
                          const std::vector<ArchiveEntry>& entries) {
  std::filesystem::create_directories(
      std::filesystem::path(path).parent_path());
  std::unique_ptr<struct archive, int (*)(struct archive*)> a(
      archive_write_new(), archive_write_free);
  if (format == "zip") {
    archive_write_set_format_zip(a.get());
  } else {
    archive_write_set_format_pax_restricted(a.get());
    archive_write_add_filter_gzip(a.get());
  }
  if (archive_write_open_filename(a.get(), path.c_str()) != ARCHIVE_OK) {
    return absl::InternalError(archive_error_string(a.get()));
  }
  for (const ArchiveEntry& e : entries) {
    std::unique_ptr<struct archive_entry, void (*)(struct archive_entry*)>
        entry(archive_entry_new(), archive_entry_free);
    archive_entry_set_pathname(entry.get(), e.path.c_str());
    archive_entry_set_perm(entry.get(), 0644);
    if (!e.symlink.empty()) {
      archive_entry_set_filetype(entry.get(), AE_IFLNK);
      archive_entry_set_symlink(entry.get(), e.symlink.c_str());
    } else if (!e.hardlink.empty()) {
      archive_entry_set_filetype(entry.get(), AE_IFREG);
      archive_entry_set_hardlink(entry.get(), e.hardlink.c_str());
    } else if (!e.path.empty() && e.path.back() == '/') {
      archive_entry_set_filetype(entry.get(), AE_IFDIR);
      archive_entry_set_perm(entry.get(), 0755);
    } else {
      archive_entry_set_filetype(entry.get(), AE_IFREG);
      archive_entry_set_size(entry.get(),
                             static_cast<la_int64_t>(e.contents.size()));
    }
    if (archive_write_header(a.get(), entry.get()) != ARCHIVE_OK) {
      return absl::InternalError(
          absl::StrCat(e.path, ": ", archive_error_string(a.get())));
    }
    if (!e.contents.empty() &&
        archive_write_data(a.get(), e.contents.data(), e.contents.size()) < 0) {
      return absl::InternalError(
          absl::StrCat(e.path, ": ", archive_error_string(a.get())));
    }
  }
  if (archive_write_close(a.get()) != ARCHIVE_OK)
    return absl::InternalError(archive_error_string(a.get()));
  return absl::OkStatus();
}

absl::Status WriteFile(const std::string& path, const std::string& contents) {
  std::filesystem::create_directories(
      std::filesystem::path(path).parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << contents;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace ember::hub::testing
