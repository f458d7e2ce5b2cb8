#include "hub/hub_dir.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace ember::hub {
namespace {

absl::Mutex dir_mu;
std::string& DirSetByUser() ABSL_EXCLUSIVE_LOCKS_REQUIRED(dir_mu) {
  static auto* dir = new std::string();
  return *dir;
}

// The value of environment variable `name`, "" when unset.
std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

bool IsDir(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace

void set_dir(std::string dir) {
  absl::MutexLock lock(&dir_mu);
  DirSetByUser() = std::move(dir);
}

absl::Status make_dirs(const std::string& dir) {
  for (size_t pos = 1; pos <= dir.size(); ++pos) {
    if (pos != dir.size() && dir[pos] != '/') continue;
    std::string prefix = dir.substr(0, pos);
    if (mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
      return absl::InternalError(
          absl::StrCat("cannot create directory ", prefix, ": ", std::strerror(errno)));
    }
  }
  struct stat st;
  if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::InternalError(absl::StrCat(dir, " exists but is not a directory"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> get_dir() {
  std::string dir;
  {
    absl::MutexLock lock(&dir_mu);
    dir = DirSetByUser();
  }
  const std::string home = Env("HOME");
  auto expand = [&](std::string path) {
    if (!home.empty() && (path == "~" || absl::StartsWith(path, "~/"))) path.replace(0, 1, home);
    while (path.size() > 1 && path.back() == '/') path.pop_back();
    return path;
  };
  if (dir.empty()) dir = expand(Env(kHubDirEnv));
  if (dir.empty() && !Env(kTorchHomeEnv).empty()) dir = expand(Env(kTorchHomeEnv)) + "/hub";
  if (dir.empty() && !Env(kXdgCacheHomeEnv).empty()) {
    dir = expand(Env(kXdgCacheHomeEnv)) + "/torch/hub";
  }
  if (dir.empty()) {
    if (home.empty()) {
      return absl::FailedPreconditionError(absl::StrCat("no hub directory: call set_dir(), or set ",
                                                        kHubDirEnv, ", ", kTorchHomeEnv, ", ",
                                                        kXdgCacheHomeEnv, " or HOME"));
    }
    // Note [Hub directory fallback]: an existing ~/.torch/hub, else an
    // existing ~/.cache/torch/hub (PyTorch >= 1.1's cache, so its fetched
    // repositories and weights stay in use), else ~/.torch/hub, created.
    const std::string torch_dir = absl::StrCat(home, "/.torch/hub");
    const std::string cache_dir = absl::StrCat(home, "/.cache/torch/hub");
    dir = !IsDir(torch_dir) && IsDir(cache_dir) ? cache_dir : torch_dir;
  }
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  if (absl::Status s = make_dirs(dir); !s.ok()) return s;
  return dir;
}

}  // namespace ember::hub
