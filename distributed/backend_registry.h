// The registry of process-group backends by name ("tcp", "gloo", "mpi";
// "nccl" with CUDA): how init_process_group and new_group turn a backend name
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
// Names are case-insensitive, as torch's Backend("GLOO") == "gloo". A name
// listing a backend per device type, "cpu:gloo,cuda:nccl", names a backend
// built from the listed ones that runs each op on the backend of its
// tensors' device (mixed_process_group.h); its name is the list as written,
// lower-cased, with spaces dropped.
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
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "distributed/process_group.h"
#include "distributed/store.h"

namespace ember::distributed {

// What a backend needs to build one group: the rendezvous store (shared by
// the group's ranks), this process's rank in the group and its size.
// Options only one backend understands (torch's `pg_options`, e.g.
// ProcessGroupNCCL.Options): each backend that has some defines a subclass
// naming itself (TcpOptions, GlooOptions), and callers pass one through
// InitOptions / NewGroupOptions. A backend given another backend's options
// refuses them (OptionsFor).
struct BackendSpecificOptions {
  virtual ~BackendSpecificOptions() = default;
  // The backend these options are for ("tcp", "gloo").
  virtual std::string_view backend() const = 0;
};

struct BackendOptions {
  std::shared_ptr<Store> store;
  // Prepended to every key the backend writes, so that groups (and jobs
  // sharing a store through group_name) never collide.
  std::string store_prefix;
  int rank = 0;
  int size = 1;
  absl::Duration timeout = kDefaultStoreTimeout;
  // The members as ranks of the default group, in group-rank order (what
  // new_group was given); empty for the default group itself. Backends that
  // address peers by a launcher's rank (mpi) build sub-groups from it.
  std::vector<int> ranks;
  // The caller's backend-specific options, or null for the backend's defaults.
  std::shared_ptr<const BackendSpecificOptions> pg_options;
};

// The backend-specific options of type T (for backend `name`) in `options`:
// null when none were given, InvalidArgument when they are another
// backend's.
template <typename T>
absl::StatusOr<const T*> OptionsFor(const BackendOptions& options, std::string_view name) {
  if (options.pg_options == nullptr) return nullptr;
  const T* mine = dynamic_cast<const T*>(options.pg_options.get());
  if (mine == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("pg_options are for the '", std::string(options.pg_options->backend()),
                     "' backend, but the group's backend is '", std::string(name),
                     "'; pass that backend's options or none"));
  }
  return mine;
}

// This process's place in a job whose processes a backend's own launcher
// started (mpirun for mpi).
struct LauncherWorld {
  int rank = 0;
  int size = 1;
};

struct BackendInfo {
  std::string name;
  // The ops and devices the backend implements (Note [Backend support table]).
  SupportTable support;
  // Builds the group; blocks until every rank has connected or the timeout.
  std::function<absl::StatusOr<std::shared_ptr<ProcessGroup>>(const BackendOptions&)> create;
  // The timeout a group of this backend gets when init_process_group is
  // given none; unset: kDefaultProcessGroupTimeout (30 minutes). nccl's is
  // PyTorch's default_pg_nccl_timeout, 10 minutes.
  std::optional<absl::Duration> default_timeout;
  // Set by backends whose processes are started by their own launcher (mpi,
  // under mpirun): starts the backend's runtime and returns this process's
  // rank and the world size. init_process_group then runs no rendezvous, so
  // it needs no init_method (as in PyTorch); `rank` and `world_size` are
  // what the caller passed (-1: not given) and must agree with the
  // launcher's, else kInvalidArgument naming both.
  std::function<absl::StatusOr<LauncherWorld>(int rank, int world_size)> world_from_launcher;
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
