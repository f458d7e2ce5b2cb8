#include "distributed/distributed.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "distributed/backend_registry.h"
#include "distributed/rendezvous.h"
#include "tensor/device_guard.h"
#include "tensor/error.h"
#include "tensor/status_macros.h"

// Note [Store layout]
// Groups keep their keys where PyTorch keeps them, so that PyTorch processes
// can join an Ember job through a store both can reach (distributed/README.md,
// "PyTorch and Ember in one job"). A store made by the rendezvous is used
// under "default_pg/"; a store the caller passes is used as it is. Within it,
// groups are named by a counter of the groups made since init_process_group
// ("0" for the default group, then "1", "2", ... for new_group in call order),
// and a group's backend writes under "<name>/" (a mixed backend's, such as
// "cpu:gloo,cuda:nccl", under "<name>/<device type>/"). Once a group exists, every
// rank of the job (members of a new group or not) adds one to
// "store_based_barrier_key:<counter after naming it>" (PyTorch 1.13's key)
// and at PyTorch 2.x's ("store_based_barrier_key:0" for the default group,
// "0//store_based_barrier_key:<name>" for a new one, where the rank that
// brings the count to the world size sets "<key>:last_worker"); with
// TORCH_DIST_INIT_BARRIER=1 it then waits for either count to reach the
// world size, so init_process_group and new_group return only when every
// rank has the group. Unset or 0 (PyTorch 2.x's default) it does not wait: PyTorch 2.x
// ranks then count nothing. Backends placed by a launcher (mpi) skip the
// store barrier, as PyTorch does. destroy_process_group restarts the counter:
// initialising again on the same store needs a fresh store or a PrefixStore,
// as in PyTorch (a count already past the world size says so).
//
// Note [Splitting new groups]
// A backend may make a new group's communicators by splitting the default
// group's, as PyTorch's nccl backend does with ncclCommSplit when the parent
// communicator exists: cheaper than a new rendezvous, but collective over the
// whole default group, non-members included. Every process calls new_group in
// the same order (the API asks it), so new_group gives the default group's
// backend its turn on every rank, ProcessGroup::split_for_new_group with the
// new group's BackendOptions (rank -1 on non-members), just before the new
// group is made, whenever the new group uses the same backend as the default
// group. A mixed default group passes it on to each of its backends with
// their own prefix. What a backend makes there it hands to the new group by
// the group's store and prefix (nccl: process_group_nccl.cc); backends
// without splitting ignore it, and the new group then meets through the
// store as before.

//
// Note [Failing cleanly]
// A peer that is dead (SIGKILL), stopped (SIGSTOP) or slow must never hold a
// survivor longer than it asks for. ProcessGroup::abort() fails every
// pending op of the group (queued, running, posted sends and receives, and
// a thread blocked in Work::wait) with kAborted and its reason at once, and
// every later op at once; it pulls the backend out of whatever it waits in:
// tcp interrupts its channels (sockets shut down, shared-memory rings and
// the all_reduce arena woken) and fails the mesh's posted receives; gloo
// closes every pair of its context with an error (Note [Aborting gloo] in
// gloo/process_group_gloo.cc), which gloo itself propagates to every buffer
// waiting on the pair; mpi fails the Works but cannot take its worker out
// of MPI (Note [MPI timeouts]), so destroying it while a collective is
// inside MPI ends the job with MPI_Abort two seconds later; nccl aborts its
// communicators (ncclCommAbort). The group's threads then end without
// waiting for any peer, so its destructor is bounded too (gloo's failure
// path polls the store in 20 ms slices and stops at the abort).
// destroy_process_group calls ProcessGroup::shutdown() on every group it
// destroys: abort() with "the process group was destroyed" as the reason
// and no flight-recorder dump; tcp first says goodbye to its peers (a peer
// whose channel is busy or full is skipped), so that they fail only what
// they wait for from this rank. Handles the caller still holds stay aborted.
//
// Note [Shrinking groups]
// shrink_group (PyTorch 2.x's torch.distributed.shrink_group) makes a group
// of the survivors without re-initialising the process and without any
// collective that involves the excluded ranks: each survivor derives the new
// group's store prefix alone, "<old prefix>shrink:<excluded ranks>/", its
// rank (its index among the survivors, in the old order) and the size, and
// the backend's create meets only those ranks through the store. Before
// that, the backend may do its part on the old group
// (ProcessGroup::shrink_for_new_group: nccl's ncclCommShrink, Note [NCCL
// shrunken groups]), and the old group is aborted: its ops can no longer
// complete. Shrinking the default group makes the new group the default one,
// renumbers get_rank()/get_world_size() and aborts every other group, as
// PyTorch does; later new_group calls go on numbering groups as before (the
// survivors made the same ones) and count only the survivors in their store
// barrier. The store must outlive the excluded ranks: a TCPStore served by
// an excluded rank is gone with it.

namespace ember::distributed {
namespace {

constexpr char kRendezvousStorePrefix[] = "default_pg/";

// Whether the store barrier waits (Note [Store layout]): TORCH_DIST_INIT_BARRIER,
// read as PyTorch 2.x reads it: "1" waits, unset or "0" does not.
absl::StatusOr<bool> BarrierWaits() {
  const char* env = std::getenv("TORCH_DIST_INIT_BARRIER");
  int value = 0;
  if (env != nullptr && !absl::SimpleAtoi(env, &value)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TORCH_DIST_INIT_BARRIER='", env, "' is not an integer; set it to 1 (barrier after "
        "init_process_group and new_group) or 0 (none), or unset it"));
  }
  return value == 1;
}

// The store-based barrier of Note [Store layout], at both PyTorch
// versions' keys: `key` as PyTorch 1.13 counts it (it polls the count, as
// 1.13 does, rather than waiting on a key the last rank sets: a 1.13 rank
// may be the last, and it sets no key), `torch2_key` as PyTorch 2.x counts
// it (the rank whose add reaches the world size sets "<key>:last_worker",
// which 2.x ranks wait for). Each job's ranks all count at one of the two,
// so the barrier passes once either count reaches the world size. Every
// rank counts itself in even when it does not wait, so that PyTorch ranks
// that do wait are let through, and a count past the world size (a used
// store) is refused either way.
absl::Status StoreBarrier(Store& store, const std::string& key, const std::string& torch2_key,
                          int world_size, absl::Duration timeout, const char* what) {
  const absl::Time deadline = absl::Now() + timeout;
  EMBER_ASSIGN_OR_RETURN(const bool waits, BarrierWaits());
  EMBER_ASSIGN_OR_RETURN(int64_t arrived, store.add(key, 1));
  EMBER_ASSIGN_OR_RETURN(int64_t arrived2, store.add(torch2_key, 1));
  if (arrived2 == world_size) {
    EMBER_RETURN_IF_ERROR(store.set(absl::StrCat(torch2_key, ":last_worker"), "1"));
  }
  absl::Duration pause = absl::Microseconds(200);
  while (waits && arrived < world_size && arrived2 < world_size) {
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          what, ": timed out after ", absl::FormatDuration(timeout),
          " waiting for every rank to create the group (", std::max(arrived, arrived2), " of ",
          world_size, " ranks counted at store key '", arrived >= arrived2 ? key : torch2_key,
          "')"));
    }
    absl::SleepFor(pause);
    pause = std::min(pause * 2, absl::Milliseconds(10));
    EMBER_ASSIGN_OR_RETURN(arrived, store.add(key, 0));
    EMBER_ASSIGN_OR_RETURN(arrived2, store.add(torch2_key, 0));
  }
  for (const auto& [count, at] : {std::pair(arrived, &key), std::pair(arrived2, &torch2_key)}) {
    if (count > world_size) {
      return absl::FailedPreconditionError(absl::StrCat(
          what, ": store key '", *at, "' counts ", count, " ranks for a world of ", world_size,
          "; the store holds an earlier job's groups: use a fresh store (or a PrefixStore) for "
          "each init_process_group"));
    }
  }
  return absl::OkStatus();
}

std::string BarrierKey(const std::string& prefix, int groups_made) {
  return absl::StrCat(prefix, "store_based_barrier_key:", groups_made);
}

// PyTorch 2.x's barrier key for group `group_id` (its name): the default
// group's under the job's prefix, a new group's within the default group's
// store (PrefixStore "0/", joined with "/").
std::string Torch2BarrierKey(const std::string& prefix, int group_id) {
  if (group_id == 0) return absl::StrCat(prefix, "store_based_barrier_key:0");
  return absl::StrCat(prefix, "0//store_based_barrier_key:", group_id);
}

// The handle new_group returns to processes outside the group: every op
// fails, naming this rank and the members.
class NonMemberGroup : public ProcessGroup {
 public:
  NonMemberGroup(int global_rank, std::vector<int> members, const BackendInfo& backend)
      : ProcessGroup(-1, static_cast<int>(members.size()), backend.name, backend.support,
                     absl::ZeroDuration()),
        error_(absl::FailedPreconditionError(absl::StrCat(
            "rank ", global_rank, " is not a member of this group (ranks [",
            absl::StrJoin(members, ", "), "]); only its members may run ops on it"))) {}
  void abort() override {}

 protected:
  absl::StatusOr<std::shared_ptr<Work>> DoBroadcast(const Tensor&,
                                                    const BroadcastOptions&) override {
    return error_;
  }
  absl::StatusOr<std::shared_ptr<Work>> DoAllReduce(const Tensor&,
                                                    const AllReduceOptions&) override {
    return error_;
  }
  absl::StatusOr<std::shared_ptr<Work>> DoReduce(const Tensor&, const ReduceOptions&) override {
    return error_;
  }
  absl::StatusOr<std::shared_ptr<Work>> DoAllGather(absl::Span<const Tensor>, const Tensor&,
                                                    const AllGatherOptions&) override {
    return error_;
  }
  absl::StatusOr<std::shared_ptr<Work>> DoAllGatherIntoTensor(const Tensor&, const Tensor&,
                                                              const AllGatherOptions&) override {
    return error_;
  }
  absl::StatusOr<std::shared_ptr<Work>> DoGather(absl::Span<const Tensor>, const Tensor&,
                                                 const GatherOptions&) override {
    return error_;
  }
  absl::StatusOr<std::shared_ptr<Work>> DoScatter(const Tensor&, absl::Span<const Tensor>,
                                                  const ScatterOptions&) override {
    return error_;
  }
  absl::StatusOr<std::shared_ptr<Work>> DoReduceScatter(const Tensor&, absl::Span<const Tensor>,
                                                        const ReduceScatterOptions&) override {
    return error_;
  }
  absl::StatusOr<std::shared_ptr<Work>> DoAllToAll(absl::Span<const Tensor>,
                                                   absl::Span<const Tensor>,
                                                   const AllToAllOptions&) override {
    return error_;
  }
  absl::StatusOr<std::shared_ptr<Work>> DoBarrier(const BarrierOptions&) override { return error_; }
  absl::StatusOr<std::shared_ptr<Work>> DoMonitoredBarrier(
      const MonitoredBarrierOptions&) override {
    return error_;
  }
  absl::StatusOr<std::shared_ptr<Work>> DoSend(const Tensor&, int, const P2POptions&) override {
    return error_;
  }
  absl::StatusOr<std::shared_ptr<RecvWork>> DoRecv(const Tensor&, int, const P2POptions&) override {
    return error_;
  }

 private:
  absl::Status error_;
};

// What destroy_process_group and shrink_group need of a group.
struct GroupRecord {
  std::weak_ptr<ProcessGroup> handle;
  const BackendInfo* backend = nullptr;
  BackendOptions options;  // what its backend was given
  std::string name;        // its flight-recorder name
};

struct State {
  absl::Mutex mu;
  Group world ABSL_GUARDED_BY(mu);
  std::shared_ptr<Store> store ABSL_GUARDED_BY(mu);
  // Where this job's groups live in `store` (Note [Store layout]).
  std::string prefix ABSL_GUARDED_BY(mu);
  std::string backend ABSL_GUARDED_BY(mu);
  absl::Duration timeout ABSL_GUARDED_BY(mu);
  int rank ABSL_GUARDED_BY(mu) = -1;
  int size ABSL_GUARDED_BY(mu) = 0;
  // Counts init_process_group calls, so that a new_group racing a destroy
  // can tell.
  int generation ABSL_GUARDED_BY(mu) = 0;
  int next_group ABSL_GUARDED_BY(mu) = 0;  // the next group's name
  // Global ranks of each group's members, by group rank.
  std::map<const ProcessGroup*, std::vector<int>> members ABSL_GUARDED_BY(mu);
  // How each group was made, for destroy_process_group and shrink_group.
  std::map<const ProcessGroup*, GroupRecord> records ABSL_GUARDED_BY(mu);
};

State& GetState() {
  static State* state = new State;
  return *state;
}

absl::Status NotInitialized() {
  return absl::FailedPreconditionError(
      "the default process group is not initialized; call init_process_group first");
}

// The group to run on and its members' global ranks.
struct Resolved {
  Group group;
  std::vector<int> members;
  int global_rank;

  // The group rank of global rank `rank` (kAnySource passes through).
  absl::StatusOr<int> GroupRank(int rank, const char* what) const {
    if (rank == kAnySource) return rank;
    auto it = std::find(members.begin(), members.end(), rank);
    if (it == members.end()) {
      return absl::InvalidArgumentError(absl::StrCat(what, " ", rank,
                                                     " is not a member of the group (ranks [",
                                                     absl::StrJoin(members, ", "), "])"));
    }
    return static_cast<int>(it - members.begin());
  }
};

absl::StatusOr<Resolved> Resolve(const Group& group) {
  State& s = GetState();
  absl::MutexLock lock(&s.mu);
  if (!s.world) return NotInitialized();
  Resolved r{group ? group : s.world, {}, s.rank};
  auto it = s.members.find(r.group.get());
  if (it == s.members.end()) {
    return absl::FailedPreconditionError(
        "the group was destroyed (destroy_process_group) or is not a group of this job");
  }
  r.members = it->second;
  if (r.group->rank() < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", s.rank, " is not a member of this group (ranks [",
                     absl::StrJoin(r.members, ", "), "]); only its members may run ops on it"));
  }
  return r;
}

absl::Status WaitFor(absl::StatusOr<std::shared_ptr<Work>> work) {
  if (!work.ok()) return work.status();
  return (*work)->wait();
}

// The backend init_process_group uses when none is named: PyTorch 2.x's
// "cpu:gloo,cuda:nccl" where a CUDA device is usable and nccl is linked,
// else Ember's tcp.
std::string DefaultBackend() {
  if (device_count(DeviceType::kCUDA) > 0 && find_backend("nccl").ok()) {
    return "cpu:gloo,cuda:nccl";
  }
  return "tcp";
}

}  // namespace

absl::Status init_process_group(const InitOptions& options) {
  State& s = GetState();
  absl::MutexLock lock(&s.mu);
  if (s.world) {
    return absl::FailedPreconditionError(
        "init_process_group was already called; call destroy_process_group first");
  }
  EMBER_ASSIGN_OR_RETURN(const BackendInfo* backend,
                         find_backend(options.backend.empty() ? DefaultBackend() : options.backend));
  const absl::Duration timeout =
      options.timeout.value_or(backend->default_timeout.value_or(kDefaultProcessGroupTimeout));
  BackendOptions b;
  std::string prefix;
  if (backend->world_from_launcher) {
    // The launcher (mpirun) placed this process; init_method is not used,
    // and a store, when given, serves only new_group with other backends.
    EMBER_ASSIGN_OR_RETURN(LauncherWorld placed,
                           backend->world_from_launcher(options.rank, options.world_size));
    b.store = options.store;
    b.rank = placed.rank;
    b.size = placed.size;
  } else if (options.store) {
    if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "init_process_group with a store needs world_size >= 1 and 0 <= rank < world_size; got "
          "world_size ",
          options.world_size, ", rank ", options.rank));
    }
    b.store = options.store;
    b.rank = options.rank;
    b.size = options.world_size;
  } else {
    RendezvousOptions r;
    r.init_method = options.init_method;
    r.world_size = options.world_size;
    r.rank = options.rank;
    r.group_name = options.group_name;
    r.timeout = timeout;
    EMBER_ASSIGN_OR_RETURN(RendezvousResult joined, rendezvous(r));
    b.store = joined.store;
    b.rank = joined.rank;
    b.size = joined.world_size;
    prefix = kRendezvousStorePrefix;
  }
  b.timeout = timeout;
  b.pg_options = options.pg_options;
  b.store_prefix = absl::StrCat(prefix, "0/");
  EMBER_ASSIGN_OR_RETURN(Group world, backend->create(b));
  // Dumps name the process by its global rank and the groups as PyTorch
  // does (Note [Flight recorder]).
  set_flight_recorder_rank(b.rank);
  world->flight_recorder().set_group_name("0");
  if (b.store && !backend->world_from_launcher) {
    EMBER_RETURN_IF_ERROR(StoreBarrier(*b.store, BarrierKey(prefix, 1),
                                       Torch2BarrierKey(prefix, 0), b.size, timeout,
                                       "init_process_group"));
  }
  s.world = world;
  s.store = b.store;
  s.prefix = prefix;
  s.backend = backend->name;
  s.timeout = timeout;
  s.rank = b.rank;
  s.size = b.size;
  s.next_group = 1;
  ++s.generation;
  std::vector<int> all(b.size);
  for (int i = 0; i < b.size; ++i) all[i] = i;
  s.members[world.get()] = std::move(all);
  s.records[world.get()] = GroupRecord{world, backend, b, "0"};
  return absl::OkStatus();
}

bool is_initialized() {
  State& s = GetState();
  absl::MutexLock lock(&s.mu);
  return s.world != nullptr;
}

int get_rank(const Group& group) {
  State& s = GetState();
  absl::MutexLock lock(&s.mu);
  EMBER_CHECK(s.world, "get_rank: ", NotInitialized().message());
  return group ? group->rank() : s.rank;
}

int get_world_size(const Group& group) {
  State& s = GetState();
  absl::MutexLock lock(&s.mu);
  EMBER_CHECK(s.world, "get_world_size: ", NotInitialized().message());
  return group ? group->size() : s.size;
}

absl::StatusOr<Group> get_default_group() {
  State& s = GetState();
  absl::MutexLock lock(&s.mu);
  if (!s.world) return NotInitialized();
  return s.world;
}

absl::Status destroy_process_group(const Group& group) {
  State& s = GetState();
  std::vector<Group> dropped;
  {
    absl::MutexLock lock(&s.mu);
    if (!s.world) return NotInitialized();
    if (group && group != s.world) {
      if (s.members.erase(group.get()) == 0) {
        return absl::InvalidArgumentError("destroy_process_group: unknown or destroyed group");
      }
      s.records.erase(group.get());
      dropped.push_back(group);
    } else {
      dropped.push_back(std::move(s.world));
      for (auto& [pg, record] : s.records) {
        if (Group g = record.handle.lock(); g != nullptr && g != dropped[0]) dropped.push_back(g);
      }
      s.world = nullptr;
      s.members.clear();
      s.records.clear();
      s.store = nullptr;
      s.rank = -1;
      s.size = 0;
    }
  }
  // Note [Failing cleanly]: outside the lock, every destroyed group is shut
  // down (its pending ops fail with kAborted at once, whatever its peers
  // do), and the default group (and groups the caller no longer holds) are
  // released here: destruction joins the group's threads, which no longer
  // wait for any peer.
  for (const Group& g : dropped) g->shutdown();
  dropped.clear();
  return absl::OkStatus();
}

absl::StatusOr<Group> shrink_group(std::vector<int> ranks_to_exclude, const Group& group,
                                   int shrink_flags,
                                   std::shared_ptr<const BackendSpecificOptions> pg_options) {
  State& s = GetState();
  if (shrink_flags != kShrinkDefault && shrink_flags != kShrinkAbort) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shrink_group: shrink_flags ", shrink_flags, " is not kShrinkDefault (", kShrinkDefault,
        ") or kShrinkAbort (", kShrinkAbort, ")"));
  }
  if (ranks_to_exclude.empty()) {
    return absl::InvalidArgumentError(
        "shrink_group: ranks_to_exclude is empty; name at least one rank of the group to leave "
        "out (e.g. the failed one)");
  }
  Group old;
  GroupRecord record;
  std::vector<int> members;
  bool is_default = false;
  int generation = 0, global_rank = -1;
  {
    absl::MutexLock lock(&s.mu);
    if (!s.world) return NotInitialized();
    global_rank = s.rank;
    old = group ? group : s.world;
    is_default = old == s.world;
    generation = s.generation;
    auto m = s.members.find(old.get());
    auto r = s.records.find(old.get());
    if (m == s.members.end() || r == s.records.end()) {
      return absl::FailedPreconditionError(
          "shrink_group: the group was destroyed (destroy_process_group) or is not a group of "
          "this job");
    }
    members = m->second;
    record = r->second;
  }
  const int size = old->size(), me = old->rank();
  if (me < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("shrink_group: rank ", global_rank, " is not a member of this group (ranks [",
                     absl::StrJoin(members, ", "), "]); only its surviving members shrink it"));
  }
  if (size < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shrink_group: the group has ", size, " rank; shrinking needs at least 2 ranks"));
  }
  std::vector<int> excluded = ranks_to_exclude;
  std::sort(excluded.begin(), excluded.end());
  for (size_t i = 0; i < ranks_to_exclude.size(); ++i) {
    const int rank = ranks_to_exclude[i];
    if (rank < 0 || rank >= size) {
      return absl::InvalidArgumentError(
          absl::StrCat("shrink_group: rank ", rank, " at index ", i,
                       " of ranks_to_exclude is out of range for a group of size ", size,
                       " (group ranks are 0..", size - 1, ")"));
    }
  }
  for (size_t i = 1; i < excluded.size(); ++i) {
    if (excluded[i] == excluded[i - 1]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shrink_group: rank ", excluded[i], " is listed twice in ranks_to_exclude"));
    }
  }
  if (static_cast<int>(excluded.size()) >= size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shrink_group: ranks_to_exclude names all ", size, " ranks; at least one must remain"));
  }
  if (std::binary_search(excluded.begin(), excluded.end(), me)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shrink_group: this rank (", me, " in the group) is in ranks_to_exclude; only the "
        "surviving ranks call shrink_group, and an excluded rank should end its process"));
  }
  if (record.backend->world_from_launcher || !record.options.store) {
    return absl::UnimplementedError(absl::StrCat(
        "shrink_group: the '", record.backend->name, "' backend does not support shrinking (its "
        "ranks were placed by a launcher and meet through no store); use tcp, gloo or nccl"));
  }
  // Note [Shrinking groups]: the survivors' group, renumbered in the old
  // order, under a prefix every survivor derives alone.
  BackendOptions b = record.options;
  std::vector<int> survivors;  // global ranks
  std::vector<int> kept;       // old group ranks
  for (int r = 0; r < size; ++r) {
    if (!std::binary_search(excluded.begin(), excluded.end(), r)) {
      kept.push_back(r);
      survivors.push_back(members[r]);
    }
  }
  b.store_prefix = absl::StrCat(record.options.store_prefix, "shrink:",
                                absl::StrJoin(excluded, ","), "/");
  b.rank = static_cast<int>(std::find(kept.begin(), kept.end(), me) - kept.begin());
  b.size = static_cast<int>(kept.size());
  if (is_default) {
    b.ranks.clear();
  } else {
    b.ranks = survivors;
  }
  if (pg_options != nullptr) b.pg_options = std::move(pg_options);
  // The backend's part first (nccl shrinks the live communicator, stopping
  // its kernels itself with kShrinkAbort); then the old group is aborted
  // before the new one connects: its ops can no longer complete without the
  // excluded ranks, and the survivors' waits for them must end now.
  EMBER_RETURN_IF_ERROR(
      old->shrink_for_new_group(b, excluded, shrink_flags == kShrinkAbort));
  old->abort();
  EMBER_ASSIGN_OR_RETURN(Group shrunk, record.backend->create(b));
  const std::string name = absl::StrCat(record.name, ":shrunk");
  shrunk->flight_recorder().set_group_name(name);
  std::vector<Group> dropped;
  {
    absl::MutexLock lock(&s.mu);
    if (!s.world || s.generation != generation) {
      return absl::FailedPreconditionError(
          "shrink_group: the default process group was destroyed while the group was being "
          "shrunk; call init_process_group again");
    }
    s.members.erase(old.get());
    s.records.erase(old.get());
    if (is_default) {
      // Every other group names ranks of the old world: they go, as in
      // PyTorch, and the shrunken group is the world, renumbered.
      for (auto& [pg, other] : s.records) {
        if (Group g = other.handle.lock(); g != nullptr) dropped.push_back(g);
      }
      s.members.clear();
      s.records.clear();
      s.world = shrunk;
      s.rank = b.rank;
      s.size = b.size;
      std::vector<int> all(b.size);
      for (int i = 0; i < b.size; ++i) all[i] = i;
      s.members[shrunk.get()] = std::move(all);
    } else {
      s.members[shrunk.get()] = survivors;
    }
    s.records[shrunk.get()] = GroupRecord{shrunk, record.backend, b, name};
  }
  for (const Group& g : dropped) g->abort();
  return shrunk;
}

absl::StatusOr<Group> new_group(std::vector<int> ranks, const NewGroupOptions& options) {
  State& s = GetState();
  BackendOptions b;
  const BackendInfo* backend = nullptr;
  int my_index = -1, my_rank = -1, world_size = 0, generation = 0, group_id = 0;
  std::string barrier_key, torch2_barrier_key;
  Group split_from;  // Note [Splitting new groups]
  {
    absl::MutexLock lock(&s.mu);
    if (!s.world) return NotInitialized();
    if (ranks.empty()) {
      for (int i = 0; i < s.size; ++i) ranks.push_back(i);
    }
    std::sort(ranks.begin(), ranks.end());
    for (size_t i = 0; i < ranks.size(); ++i) {
      if (ranks[i] < 0 || ranks[i] >= s.size) {
        return absl::InvalidArgumentError(
            absl::StrCat("new_group: rank ", ranks[i], " is out of range for world size ", s.size));
      }
      if (i > 0 && ranks[i] == ranks[i - 1]) {
        return absl::InvalidArgumentError(
            absl::StrCat("new_group: rank ", ranks[i], " is listed twice"));
      }
    }
    const int id = s.next_group++;
    group_id = id;
    const std::string backend_name = options.backend.empty() ? s.backend : options.backend;
    EMBER_ASSIGN_OR_RETURN(backend, find_backend(backend_name));
    if (absl::StatusOr<const BackendInfo*> world = find_backend(s.backend);
        world.ok() && *world == backend) {
      split_from = s.world;
    }
    auto me = std::find(ranks.begin(), ranks.end(), s.rank);
    if (me != ranks.end()) my_index = static_cast<int>(me - ranks.begin());
    my_rank = s.rank;
    world_size = s.size;
    generation = s.generation;
    b.store = s.store;
    b.store_prefix = absl::StrCat(s.prefix, id, "/");
    barrier_key = BarrierKey(s.prefix, id + 1);
    torch2_barrier_key = Torch2BarrierKey(s.prefix, id);
    b.rank = my_index;
    b.size = static_cast<int>(ranks.size());
    b.ranks = ranks;
    b.timeout = options.timeout.value_or(s.timeout);
    b.pg_options = options.pg_options;
    if (!b.store && !backend->world_from_launcher) {
      return absl::FailedPreconditionError(
          absl::StrCat("new_group: the '", backend->name,
                       "' backend meets its ranks through a store, and the '", s.backend,
                       "' default group was started without one; pass InitOptions.store to "
                       "init_process_group"));
    }
  }
  // The group's rendezvous blocks until its members arrive (up to the
  // timeout), so it runs without the lock: other threads' ops, get_rank and
  // the like go on meanwhile.
  if (split_from != nullptr) EMBER_RETURN_IF_ERROR(split_from->split_for_new_group(b));
  Group group;
  if (my_index < 0) {
    group = std::make_shared<NonMemberGroup>(my_rank, ranks, *backend);
  } else {
    EMBER_ASSIGN_OR_RETURN(group, backend->create(b));
  }
  group->flight_recorder().set_group_name(absl::StrCat(group_id));
  if (b.store && !backend->world_from_launcher) {
    EMBER_RETURN_IF_ERROR(StoreBarrier(*b.store, barrier_key, torch2_barrier_key, world_size,
                                       b.timeout, "new_group"));
  }
  absl::MutexLock lock(&s.mu);
  if (!s.world || s.generation != generation) {
    return absl::FailedPreconditionError(
        "new_group: the default process group was destroyed while this group was being "
        "created; call init_process_group and new_group again");
  }
  s.members[group.get()] = ranks;
  s.records[group.get()] = GroupRecord{group, backend, b, absl::StrCat(group_id)};
  return group;
}

// --- Point-to-point ------------------------------------------------------------------

absl::StatusOr<std::shared_ptr<Work>> isend(const Tensor& tensor, int dst, const Group& group,
                                            int tag) {
  EMBER_ASSIGN_OR_RETURN(Resolved r, Resolve(group));
  EMBER_ASSIGN_OR_RETURN(int to, r.GroupRank(dst, "send: dst"));
  return r.group->send(tensor, to, {.tag = tag});
}

absl::StatusOr<std::shared_ptr<RecvWork>> irecv(const Tensor& tensor, int src, const Group& group,
                                                int tag) {
  EMBER_ASSIGN_OR_RETURN(Resolved r, Resolve(group));
  EMBER_ASSIGN_OR_RETURN(int from, r.GroupRank(src, "recv: src"));
  return r.group->recv(tensor, from, {.tag = tag});
}

absl::StatusOr<std::vector<std::shared_ptr<Work>>> batch_isend_irecv(absl::Span<const P2POp> ops) {
  if (ops.empty()) {
    return absl::InvalidArgumentError(
        "batch_isend_irecv: the list of ops is empty; pass at least one P2POp");
  }
  EMBER_ASSIGN_OR_RETURN(Resolved r, Resolve(ops[0].group));
  std::vector<P2PRequest> requests;
  requests.reserve(ops.size());
  for (size_t i = 0; i < ops.size(); ++i) {
    const P2POp& op = ops[i];
    if (i > 0 && op.group != ops[0].group) {
      EMBER_ASSIGN_OR_RETURN(Resolved other, Resolve(op.group));
      if (other.group != r.group) {
        return absl::InvalidArgumentError(absl::StrCat(
            "batch_isend_irecv: op ", i, " uses another group than op 0 (ranks [",
            absl::StrJoin(other.members, ", "), "] against [", absl::StrJoin(r.members, ", "),
            "]); all ops need to use the same group"));
      }
    }
    const bool is_send = op.op == P2POp::Kind::kIsend;
    const std::string what = absl::StrCat("batch_isend_irecv: op ", i, is_send ? " (isend) dst" : " (irecv) src");
    EMBER_ASSIGN_OR_RETURN(int peer, r.GroupRank(op.peer, what.c_str()));
    requests.push_back({.op = is_send ? OpType::kSend : OpType::kRecv,
                        .tensor = op.tensor,
                        .peer = peer,
                        .options = {.tag = op.tag}});
  }
  return r.group->batch_p2p(requests);
}

absl::Status send(const Tensor& tensor, int dst, const Group& group, int tag) {
  return WaitFor(isend(tensor, dst, group, tag));
}

absl::StatusOr<int> recv(const Tensor& tensor, int src, const Group& group, int tag) {
  EMBER_ASSIGN_OR_RETURN(Resolved r, Resolve(group));
  EMBER_ASSIGN_OR_RETURN(int from, r.GroupRank(src, "recv: src"));
  EMBER_ASSIGN_OR_RETURN(std::shared_ptr<RecvWork> work, r.group->recv(tensor, from, {.tag = tag}));
  EMBER_RETURN_IF_ERROR(work->wait());
  const int source = work->source();
  return source >= 0 && source < static_cast<int>(r.members.size()) ? r.members[source] : source;
}

// --- Collectives ---------------------------------------------------------------------

absl::StatusOr<std::shared_ptr<Work>> broadcast_async(const Tensor& tensor, int src,
                                                      const Group& group) {
  EMBER_ASSIGN_OR_RETURN(Resolved r, Resolve(group));
  EMBER_ASSIGN_OR_RETURN(int root, r.GroupRank(src, "broadcast: src"));
  return r.group->broadcast(tensor, {.root = root});
}

absl::StatusOr<std::shared_ptr<Work>> all_reduce_async(const Tensor& tensor, ReduceOp op,
                                                       const Group& group) {
  EMBER_ASSIGN_OR_RETURN(Resolved r, Resolve(group));
  return r.group->allreduce(tensor, {.op = op});
}

absl::StatusOr<std::shared_ptr<Work>> reduce_async(const Tensor& tensor, int dst, ReduceOp op,
                                                   const Group& group) {
  EMBER_ASSIGN_OR_RETURN(Resolved r, Resolve(group));
  EMBER_ASSIGN_OR_RETURN(int root, r.GroupRank(dst, "reduce: dst"));
  return r.group->reduce(tensor, {.root = root, .op = op});
}

absl::StatusOr<std::shared_ptr<Work>> all_gather_async(absl::Span<const Tensor> tensor_list,
                                                       const Tensor& tensor, const Group& group) {
  EMBER_ASSIGN_OR_RETURN(Resolved r, Resolve(group));
  return r.group->allgather(tensor_list, tensor);
}

absl::StatusOr<std::shared_ptr<Work>> all_gather_into_tensor_async(const Tensor& output,
                                                                   const Tensor& input,
                                                                   const Group& group) {
  EMBER_ASSIGN_OR_RETURN(Resolved r, Resolve(group));
  return r.group->allgather_into_tensor(output, input);
}

absl::StatusOr<std::shared_ptr<Work>> gather_async(const Tensor& tensor,
                                                   absl::Span<const Tensor> gather_list, int dst,
                                                   const Group& group) {
  EMBER_ASSIGN_OR_RETURN(Resolved r, Resolve(group));
  EMBER_ASSIGN_OR_RETURN(int root, r.GroupRank(dst, "gather: dst"));
  return r.group->gather(gather_list, tensor, {.root = root});
}

absl::StatusOr<std::shared_ptr<Work>> scatter_async(const Tensor& tensor,
                                                    absl::Span<const Tensor> scatter_list, int src,
                                                    const Group& group) {
  EMBER_ASSIGN_OR_RETURN(Resolved r, Resolve(group));
  EMBER_ASSIGN_OR_RETURN(int root, r.GroupRank(src, "scatter: src"));
  return r.group->scatter(tensor, scatter_list, {.root = root});
}

absl::StatusOr<std::shared_ptr<Work>> reduce_scatter_async(const Tensor& output,
                                                           absl::Span<const Tensor> input_list,
                                                           ReduceOp op, const Group& group) {
  EMBER_ASSIGN_OR_RETURN(Resolved r, Resolve(group));
  return r.group->reduce_scatter(output, input_list, {.op = op});
}

absl::StatusOr<std::shared_ptr<Work>> all_to_all_async(absl::Span<const Tensor> output_list,
                                                       absl::Span<const Tensor> input_list,
                                                       const Group& group) {
  EMBER_ASSIGN_OR_RETURN(Resolved r, Resolve(group));
  return r.group->alltoall(output_list, input_list);
}

absl::StatusOr<std::shared_ptr<Work>> barrier_async(const Group& group) {
  EMBER_ASSIGN_OR_RETURN(Resolved r, Resolve(group));
  return r.group->barrier();
}

absl::Status broadcast(const Tensor& tensor, int src, const Group& group) {
  return WaitFor(broadcast_async(tensor, src, group));
}
absl::Status all_reduce(const Tensor& tensor, ReduceOp op, const Group& group) {
  return WaitFor(all_reduce_async(tensor, op, group));
}
absl::Status reduce(const Tensor& tensor, int dst, ReduceOp op, const Group& group) {
  return WaitFor(reduce_async(tensor, dst, op, group));
}
absl::Status all_gather(absl::Span<const Tensor> tensor_list, const Tensor& tensor,
                        const Group& group) {
  return WaitFor(all_gather_async(tensor_list, tensor, group));
}
absl::Status all_gather_into_tensor(const Tensor& output, const Tensor& input, const Group& group) {
  return WaitFor(all_gather_into_tensor_async(output, input, group));
}
absl::Status gather(const Tensor& tensor, absl::Span<const Tensor> gather_list, int dst,
                    const Group& group) {
  return WaitFor(gather_async(tensor, gather_list, dst, group));
}
absl::Status scatter(const Tensor& tensor, absl::Span<const Tensor> scatter_list, int src,
                     const Group& group) {
  return WaitFor(scatter_async(tensor, scatter_list, src, group));
}
absl::Status reduce_scatter(const Tensor& output, absl::Span<const Tensor> input_list, ReduceOp op,
                            const Group& group) {
  return WaitFor(reduce_scatter_async(output, input_list, op, group));
}
absl::Status all_to_all(absl::Span<const Tensor> output_list, absl::Span<const Tensor> input_list,
                        const Group& group) {
  return WaitFor(all_to_all_async(output_list, input_list, group));
}
absl::Status barrier(const Group& group) { return WaitFor(barrier_async(group)); }

absl::Status monitored_barrier(const Group& group, std::optional<absl::Duration> timeout,
                               bool wait_all_ranks) {
  EMBER_ASSIGN_OR_RETURN(Resolved r, Resolve(group));
  return WaitFor(
      r.group->monitored_barrier({.timeout = timeout, .wait_all_ranks = wait_all_ranks}));
}

}  // namespace ember::distributed
