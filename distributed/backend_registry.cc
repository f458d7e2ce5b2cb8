#include "distributed/backend_registry.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"

namespace ember::distributed {
namespace {

struct Registry {
  absl::Mutex mu;
  // unique_ptr: pointers handed out stay valid while the map grows.
  std::map<std::string, std::unique_ptr<BackendInfo>> backends ABSL_GUARDED_BY(mu);
  // Names registered more than once: which registration is meant is
  // unknown, so the name cannot be used.
  std::map<std::string, int> duplicates ABSL_GUARDED_BY(mu);
};

absl::Status Duplicate(const std::string& key, int registrations) {
  return absl::AlreadyExistsError(absl::StrCat(
      "backend '", key, "' is registered ", registrations,
      " times (two libraries register the same name); link only one of them, or register the "
      "other under another name"));
}

Registry& GetRegistry() {
  static Registry* registry = new Registry;
  return *registry;
}

}  // namespace

absl::Status register_backend(BackendInfo info) {
  Registry& r = GetRegistry();
  std::string key = absl::AsciiStrToLower(info.name);
  absl::MutexLock lock(&r.mu);
  if (r.backends.count(key)) {
    int& count = r.duplicates[key];
    count = count == 0 ? 2 : count + 1;
    return Duplicate(key, count);
  }
  r.backends.emplace(key, std::make_unique<BackendInfo>(std::move(info)));
  return absl::OkStatus();
}

absl::StatusOr<const BackendInfo*> find_backend(const std::string& name) {
  Registry& r = GetRegistry();
  std::string key = absl::AsciiStrToLower(name);
  absl::MutexLock lock(&r.mu);
  auto dup = r.duplicates.find(key);
  if (dup != r.duplicates.end()) return Duplicate(key, dup->second);
  auto it = r.backends.find(key);
  if (it != r.backends.end()) return it->second.get();
  std::vector<std::string> names;
  for (const auto& [n, info] : r.backends) names.push_back(n);
  return absl::InvalidArgumentError(
      absl::StrCat("unknown backend '", name, "'; registered backends: ",
                   names.empty() ? "(none: link //distributed/tcp)" : absl::StrJoin(names, ", ")));
}

std::vector<std::string> registered_backends() {
  Registry& r = GetRegistry();
  absl::MutexLock lock(&r.mu);
  std::vector<std::string> names;
  for (const auto& [n, info] : r.backends) names.push_back(n);
  return names;
}

}  // namespace ember::distributed
