#include "distributed/backend_registry.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "distributed/mixed_process_group.h"
#include "tensor/status_macros.h"

namespace ember::distributed {
namespace {

struct Registry {
  absl::Mutex mu;
  // unique_ptr: pointers handed out stay valid while the map grows.
  std::map<std::string, std::unique_ptr<BackendInfo>> backends ABSL_GUARDED_BY(mu);
  // Names registered more than once: which registration is meant is
  // unknown, so the name cannot be used.
  std::map<std::string, int> duplicates ABSL_GUARDED_BY(mu);
  // Backends per device type ("cpu:gloo,cuda:nccl"), built on first use.
  std::map<std::string, std::unique_ptr<BackendInfo>> mixed ABSL_GUARDED_BY(mu);
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

// The backend a "device:backend,..." string names: a MixedProcessGroup over
// one group of each listed backend (mixed_process_group.h).
absl::StatusOr<std::unique_ptr<BackendInfo>> MixedBackend(const std::string& spec) {
  struct Part {
    DeviceType device;
    const BackendInfo* backend;
  };
  EMBER_ASSIGN_OR_RETURN(auto listed, parse_device_backends(spec));
  auto info = std::make_unique<BackendInfo>();
  std::vector<Part> parts;
  std::vector<std::string> names;
  DeviceType untyped = listed.front().first;
  for (const auto& [device, name] : listed) {
    EMBER_ASSIGN_OR_RETURN(const BackendInfo* backend, find_backend(name));
    if (backend->world_from_launcher) {
      return absl::InvalidArgumentError(absl::StrCat(
          "backend '", spec, "': '", backend->name,
          "' places its processes through its own launcher and cannot share a group with "
          "another backend; use it alone"));
    }
    for (int op = 0; op < kNumOpTypes; ++op) {
      if (backend->support.supports(static_cast<OpType>(op), device)) {
        info->support.allow(static_cast<OpType>(op), device);
      }
    }
    if (device == DeviceType::kCPU) untyped = device;
    parts.push_back({device, backend});
    names.push_back(absl::StrCat(std::string(DeviceTypeName(device)), ":", backend->name));
  }
  info->name = absl::StrJoin(names, ",");
  info->create = [parts, name = info->name, support = info->support,
                  untyped](const BackendOptions& options)
      -> absl::StatusOr<std::shared_ptr<ProcessGroup>> {
    // pg_options go to the listed backend they are for, and no other.
    const std::string for_backend =
        options.pg_options ? absl::AsciiStrToLower(std::string(options.pg_options->backend())) : "";
    auto is_for = [&](const Part& p) { return p.backend->name == for_backend; };
    if (!for_backend.empty() && std::none_of(parts.begin(), parts.end(), is_for)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "pg_options are for the '", for_backend, "' backend, which the group's backend '", name,
          "' does not list; pass options of a listed backend"));
    }
    MixedProcessGroup::Groups groups;
    for (const Part& p : parts) {
      BackendOptions own = options;
      own.store_prefix =
          absl::StrCat(options.store_prefix, std::string(DeviceTypeName(p.device)), "/");
      if (!is_for(p)) own.pg_options = nullptr;
      EMBER_ASSIGN_OR_RETURN(groups[static_cast<int>(p.device)], p.backend->create(own));
    }
    return std::make_shared<MixedProcessGroup>(options.rank, options.size, name, support,
                                               options.timeout, std::move(groups), untyped);
  };
  return info;
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
  if (key.find(':') != std::string::npos) {
    key.erase(std::remove_if(key.begin(), key.end(), absl::ascii_isspace), key.end());
    {
      absl::MutexLock lock(&r.mu);
      if (auto it = r.mixed.find(key); it != r.mixed.end()) return it->second.get();
    }
    // Built without the lock: it looks up each listed backend.
    EMBER_ASSIGN_OR_RETURN(std::unique_ptr<BackendInfo> mixed, MixedBackend(name));
    absl::MutexLock lock(&r.mu);
    return r.mixed.try_emplace(key, std::move(mixed)).first->second.get();
  }
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
