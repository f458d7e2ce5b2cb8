// The registry of process-group backends by name ("tcp", later "gloo",
// "nccl", "mpi"): how init_process_group and new_group turn a backend name
// into a ProcessGroup.
//
// A backend's .cc (an alwayslink library) registers it once per process, at
// namespace scope:
//   EMBER_REGISTER_BACKEND(tcp, ember::distributed::BackendInfo{
//       .name = "tcp", .support = TcpSupportTable(), .create = &CreateTcpGroup});
//
//   ```cpp
//   #include "distributed/backend_registry.h"
//   #include "distributed/hash_store.h"
//   namespace dist = ember::distributed;
//   EMBER_ASSIGN_OR_RETURN(const dist::BackendInfo* info, dist::find_backend("TCP"));
//   // info->name == "tcp". A one-rank group, as init_process_group makes them:
//   EMBER_ASSIGN_OR_RETURN(std::shared_ptr<dist::ProcessGroup> pg,
//                          info->create({.store = std::make_shared<dist::HashStore>()}));
//   ```
//
// Names are case-insensitive, as torch's Backend("GLOO") == "gloo".
//
// Errors: FindBackend returns kInvalidArgument naming the unknown backend and
// listing the registered ones. A second registration of a name is an error,
// never silently dropped: RegisterBackend returns kAlreadyExists naming the
// backend, EMBER_REGISTER_BACKEND prints that error to stderr at startup,
// and from then on FindBackend (so init_process_group and new_group) fails
// for that name with the same kAlreadyExists error.
//
// Thread-safety: all functions are thread-safe.
#ifndef EMBER_DISTRIBUTED_BACKEND_REGISTRY_H_
#define EMBER_DISTRIBUTED_BACKEND_REGISTRY_H_

#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "distributed/process_group.h"
#include "distributed/store.h"

namespace ember::distributed {

// What a backend needs to build one group: the rendezvous store (shared by
// the group's ranks), this process's rank in the group and its size.
struct BackendOptions {
  std::shared_ptr<Store> store;
  // Prepended to every key the backend writes, so that groups (and jobs
  // sharing a store through group_name) never collide.
  std::string store_prefix;
  int rank = 0;
  int size = 1;
  absl::Duration timeout = kDefaultStoreTimeout;
};

struct BackendInfo {
  std::string name;
  // The ops and devices the backend implements (Note [Backend support table]).
  SupportTable support;
  // Builds the group; blocks until every rank has connected or the timeout.
  std::function<absl::StatusOr<std::shared_ptr<ProcessGroup>>(const BackendOptions&)> create;
};

absl::Status register_backend(BackendInfo info);
// The backend called `name`; the pointer stays valid for the process's life.
absl::StatusOr<const BackendInfo*> find_backend(const std::string& name);
std::vector<std::string> registered_backends();

}  // namespace ember::distributed

// Registers a backend while the program starts (use in an alwayslink library).
#define EMBER_REGISTER_BACKEND(id, ...)                                     \
  static const bool ember_backend_registered_##id = [] {                    \
    ::absl::Status s = ::ember::distributed::register_backend(__VA_ARGS__); \
    if (!s.ok()) std::fprintf(stderr, "ember: %s\n", s.ToString().c_str()); \
    return s.ok();                                                          \
  }()

#endif  // EMBER_DISTRIBUTED_BACKEND_REGISTRY_H_
