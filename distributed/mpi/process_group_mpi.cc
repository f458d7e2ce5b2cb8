#include "distributed/mpi/process_group_mpi.h"

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "distributed/backend_util.h"
#include "distributed/mpi/runtime.h"
#include "distributed/tcp_store.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"

namespace ember::distributed::mpi {

// Note [MPI timeouts]
// MPI has no timeout for a collective and no way to cancel one that has
// started, and a rank cannot leave a collective the others are in without
// breaking every later one. So:
//  - Work's deadline is the op's timeout, and Work::wait returns
//    kDeadlineExceeded then (TimedWork below says why the op is still
//    running), rather than hanging;
//  - the worker runs every collective it was given, even one whose Work has
//    already timed out, since skipping it on one rank would pair this rank's
//    next collective with the others' current one (wrong data, not an
//    error);
//  - a receive is cancelled at its deadline (MPI_Cancel works on receives);
//    a send cannot be, and stays posted with its buffer kept alive;
//  - abort() fails every Work at once but cannot pull the worker out of MPI;
//    if the group is destroyed while a collective is still inside MPI, the
//    rank can neither finish it nor finalize MPI, so the destructor calls
//    MPI_Abort and the job ends (PyTorch's abort() calls MPI_Abort at once).
//
// Note [mpi post-mortems]
// What names the faulty rank of an mpi job (README.md in this directory has
// the mpirun flags; post_mortem_test and tools/launch:multihost_test check
// each case):
//  - a rank stuck in its own code, or stopped: the others' collectives time
//    out as above; their errors carry the desync report (Note [Desync
//    reports]) read from the group's store (Note [mpi's store]), and their
//    flight recorder dumps (written at that first failure) let fr_trace
//    name the rank and the collective;
//  - a rank that dies: mpirun ends the job. Each of its daemons sends the
//    ranks it started SIGCONT, then SIGTERM odls_base_sigkill_timeout
//    seconds later (1 by default), then SIGKILL as long again after that.
//    The flight recorder dumps on that SIGTERM (Note [Flight recorder
//    dumps]), so fr_trace over the dumps names the dead rank (the one that
//    left no dump) and the collective the others were in, even though they
//    were stopped before their timeout. With odls_base_sigkill_timeout
//    longer than the timeout (+ 2 s), the others time out first and their
//    errors' desync reports name the dead rank too;
//  - another op, size or dtype: only TORCH_DISTRIBUTED_DEBUG=DETAIL names
//    the rank and both calls (the ranks compare through the store before MPI
//    sees the call; Note [Call checks]). At the default level this backend
//    sends no call words of its own, and MPI reports what it sees
//    (MPI_ERR_TRUNCATE on the ranks that receive the larger message, a
//    timeout on the others), naming no rank.

namespace {

// Polling of posted sends and receives: quick at first, backing off while
// nothing completes.
constexpr absl::Duration kFirstPoll = absl::Microseconds(20);
constexpr absl::Duration kLongestPoll = absl::Milliseconds(1);
// How long a destructor waits for a worker that an aborted group left inside
// MPI before ending the job.
constexpr absl::Duration kAbortGrace = absl::Seconds(2);

// A Work whose timeout explains what MPI does with the op.
template <typename Base>
class TimedWork : public Base {
 public:
  TimedWork(OpType op, absl::Time deadline, std::string timeout_message)
      : Base(op, deadline), timeout_message_(std::move(timeout_message)) {}

 protected:
  void OnDeadline() override { this->Finish(absl::DeadlineExceededError(timeout_message_)); }

 private:
  const std::string timeout_message_;
};

// MPI counts are ints.
absl::StatusOr<int> Count(OpType op, int64_t numel) {
  if (numel > INT_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(
        op_type_name(op), ": ", numel, " elements are more than MPI's int counts can carry (",
        INT_MAX, "); split the tensor or use the 'tcp' or 'gloo' backend"));
  }
  return static_cast<int>(numel);
}

// Send buffers of sends that were still posted when their group was aborted
// or destroyed: MPI may still read them, so they live until the process
// ends.
void KeepUntilExit(Tensor buffer) {
  static absl::Mutex* mu = new absl::Mutex;
  static std::vector<Tensor>* kept = new std::vector<Tensor>;
  absl::MutexLock lock(mu);
  kept->push_back(std::move(buffer));
}

}  // namespace

SupportTable MpiSupportTable() {
  SupportTable table;
  for (int op = 0; op < kNumOpTypes; ++op) table.allow(static_cast<OpType>(op), DeviceType::kCPU);
  return table;
}

absl::StatusOr<LauncherWorld> MpiWorldFromLauncher(int rank, int world_size) {
  EMBER_RETURN_IF_ERROR(EnsureMpi());
  const WorldPlace world = World();
  if (world_size != -1 && world_size != world.size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "init_process_group: world_size=", world_size, " was given, but MPI_COMM_WORLD has ",
        world.size,
        " processes; with the 'mpi' backend leave world_size unset (mpirun decides it: mpirun -np ",
        world_size, " ...)"));
  }
  if (rank != -1 && rank != world.rank) {
    return absl::InvalidArgumentError(
        absl::StrCat("init_process_group: rank=", rank,
                     " was given, but MPI_COMM_WORLD has this process as rank ", world.rank,
                     "; with the 'mpi' backend leave rank unset (mpirun decides it)"));
  }
  return LauncherWorld{world.rank, world.size};
}

// --- Creation --------------------------------------------------------------------

// Note [mpi's store]
// mpirun places the processes, so init_process_group({.backend = "mpi"})
// needs no store to meet the ranks, and PyTorch's mpi backend has none. But
// the layer above the backends keeps its desync progress and its
// TORCH_DISTRIBUTED_DEBUG=DETAIL call check in the group's store (Note
// [Desync reports], Note [Call checks]), so a group made without one makes
// its own, as PyTorch's env:// would:
// - with MASTER_ADDR and MASTER_PORT set, the default group (the whole of
//   MPI_COMM_WORLD) uses a TcpStore there, served by rank 0;
// - otherwise (and for every new_group) the group's rank 0 serves a TcpStore
//   on a free port and tells the others where through MPI_Bcast on the
//   group's communicator: "127.0.0.1" to ranks on its host, its host name
//   (or MASTER_ADDR) to the others.
// EMBER_MPI_STORE=0 leaves such groups without a store. A rank 0 that cannot
// serve sends its error instead, so no rank waits for a store that is not
// coming; and the ranks agree (MPI_Allreduce) that every one reached the
// store before any goes on, so rank 0 never takes its server away (by
// destroying the group) while another rank is still connecting.

namespace {

constexpr int kWhereBytes = 512;
// How long a rank tries to reach the group's store (at most the group's timeout).
constexpr absl::Duration kConnectLimit = absl::Seconds(60);

std::string HostName() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return host;
}

// Every rank of `comm` learns whether every rank got its store: rank 0 must
// not go on (and, when the group is destroyed soon after, take its server
// away) while another rank is still connecting.
absl::StatusOr<std::shared_ptr<Store>> AgreeOnStore(
    MPI_Comm comm, absl::StatusOr<std::unique_ptr<TcpStore>> store) {
  const int mine = store.ok() ? 1 : 0;
  int all = 0;
  EMBER_RETURN_IF_ERROR(CallMpi("mpi backend: agreeing on the group's store", "MPI_Allreduce", [&] {
    return MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, comm);
  }));
  if (!store.ok()) return store.status();
  if (all == 0) {
    return absl::UnavailableError(
        "mpi backend: another rank of the group could not reach the group's store (its error "
        "names the address); set MASTER_ADDR to an address of rank 0's host that every rank "
        "reaches, or EMBER_MPI_STORE=0 to run without one");
  }
  return std::shared_ptr<Store>(std::move(*store));
}

absl::StatusOr<std::shared_ptr<Store>> StoreOverMpi(MPI_Comm comm, int rank, bool whole_world,
                                                    absl::Duration timeout) {
  const char* env_addr = std::getenv("MASTER_ADDR");
  const char* env_port = std::getenv("MASTER_PORT");
  const bool env =
      env_addr != nullptr && *env_addr != '\0' && env_port != nullptr && *env_port != '\0';
  const absl::Duration connect = std::min(timeout, kConnectLimit);
  if (env && whole_world) {
    int port = 0;
    if (!absl::SimpleAtoi(env_port, &port) || port <= 0 || port > 65535) {
      return absl::InvalidArgumentError(
          absl::StrCat("mpi backend: MASTER_PORT='", env_port,
                       "' is not a port (1..65535); set it to a free "
                       "port on MASTER_ADDR's host, or unset MASTER_ADDR and MASTER_PORT"));
    }
    absl::StatusOr<std::unique_ptr<TcpStore>> store = TcpStore::create(
        {.host = env_addr, .port = port, .is_server = rank == 0, .timeout = connect});
    if (!store.ok()) {
      store =
          absl::Status(store.status().code(),
                       absl::StrCat("mpi backend: the group's store at MASTER_ADDR:MASTER_PORT (",
                                    env_addr, ":", port, "): ", store.status().message()));
    }
    return AgreeOnStore(comm, std::move(store));
  }
  // Rank 0 serves; "<host>|<port>" or "!<error>" travels to the others.
  absl::StatusOr<std::unique_ptr<TcpStore>> store = absl::UnknownError("not connected");
  std::vector<char> where(kWhereBytes, '\0');
  if (rank == 0) {
    store =
        TcpStore::create({.host = "127.0.0.1", .port = 0, .is_server = true, .timeout = connect});
    const std::string text = store.ok()
                                 ? absl::StrCat(env ? env_addr : HostName(), "|", (*store)->port())
                                 : absl::StrCat("!", store.status().message());
    std::copy_n(text.begin(), std::min<size_t>(text.size(), kWhereBytes - 1), where.begin());
  }
  EMBER_RETURN_IF_ERROR(
      CallMpi("mpi backend: telling the group where its store is", "MPI_Bcast",
              [&] { return MPI_Bcast(where.data(), kWhereBytes, MPI_CHAR, 0, comm); }));
  const std::string text(where.data());
  if (!text.empty() && text[0] == '!') {
    // Every rank saw rank 0's error: nobody waits for the others.
    return absl::UnavailableError(absl::StrCat(
        "mpi backend: the group's rank 0 could not serve its store (", text.substr(1),
        "); set MASTER_ADDR and MASTER_PORT, or EMBER_MPI_STORE=0 to run without one"));
  }
  if (rank != 0) {
    std::vector<std::string> f = absl::StrSplit(text, '|');
    int port = 0;
    if (f.size() != 2 || !absl::SimpleAtoi(f[1], &port)) {
      store = absl::DataLossError(
          absl::StrCat("mpi backend: rank 0 sent '", text, "' as its store's address"));
    } else {
      const std::string host = f[0] == HostName() ? "127.0.0.1" : f[0];
      store =
          TcpStore::create({.host = host, .port = port, .is_server = false, .timeout = connect});
      if (!store.ok()) {
        store =
            absl::Status(store.status().code(),
                         absl::StrCat("mpi backend: connecting to the group's store on rank 0 (",
                                      host, ":", port, "): ", store.status().message(),
                                      "; set MASTER_ADDR to an address of rank 0's host that "
                                      "this one reaches, or EMBER_MPI_STORE=0"));
      }
    }
  }
  return AgreeOnStore(comm, std::move(store));
}

}  // namespace

absl::StatusOr<std::shared_ptr<MpiProcessGroup>> MpiProcessGroup::create(
    const BackendOptions& options) {
  EMBER_RETURN_IF_ERROR(EnsureMpi());
  const WorldPlace world = World();
  const int n = options.size, rank = options.rank;
  std::vector<int> ranks = options.ranks;
  if (ranks.empty()) {
    if (n != world.size || rank != world.rank) {
      return absl::InvalidArgumentError(absl::StrCat(
          "mpi backend: asked for rank ", rank, " of a group of ", n,
          ", but MPI_COMM_WORLD has this process as rank ", world.rank, " of ", world.size,
          "; start the job with `mpirun -np ", n, "` and take rank and size from MPI"));
    }
    for (int r = 0; r < n; ++r) ranks.push_back(r);
  } else {
    if (static_cast<int>(ranks.size()) != n || rank < 0 || rank >= n) {
      return absl::InvalidArgumentError(
          absl::StrCat("mpi backend: rank ", rank, " of ", ranks.size(), " members is invalid"));
    }
    for (int r : ranks) {
      if (r < 0 || r >= world.size) {
        return absl::InvalidArgumentError(absl::StrCat(
            "mpi backend: member ", r, " is not a rank of MPI_COMM_WORLD (size ", world.size, ")"));
      }
    }
    if (ranks[rank] != world.rank) {
      return absl::InvalidArgumentError(absl::StrCat(
          "mpi backend: this process is member ", rank, " of the group, global rank ", ranks[rank],
          ", but MPI_COMM_WORLD rank ", world.rank,
          "; mpi groups need the default group's ranks to be MPI_COMM_WORLD's (init_process_group "
          "with the 'mpi' backend)"));
    }
  }
  bool whole_world = n == world.size;
  for (int r = 0; whole_world && r < n; ++r) whole_world = ranks[r] == r;

  MPI_Comm comm = MPI_COMM_NULL;
  if (whole_world) {
    EMBER_RETURN_IF_ERROR(CallMpi("mpi backend: creating the group", "MPI_Comm_dup",
                                  [&] { return MPI_Comm_dup(MPI_COMM_WORLD, &comm); }));
  } else {
    EMBER_RETURN_IF_ERROR(CallMpi("mpi backend: creating the group", "MPI_Comm_create_group", [&] {
      MPI_Group world_group = MPI_GROUP_NULL, members = MPI_GROUP_NULL;
      int rc = MPI_Comm_group(MPI_COMM_WORLD, &world_group);
      if (rc == MPI_SUCCESS) rc = MPI_Group_incl(world_group, n, ranks.data(), &members);
      if (rc == MPI_SUCCESS) rc = MPI_Comm_create_group(MPI_COMM_WORLD, members, 0, &comm);
      if (members != MPI_GROUP_NULL) MPI_Group_free(&members);
      if (world_group != MPI_GROUP_NULL) MPI_Group_free(&world_group);
      return rc;
    }));
  }
  EMBER_RETURN_IF_ERROR(CallMpi("mpi backend: creating the group", "MPI_Comm_set_errhandler",
                                [&] { return MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN); }));
  // Note [MPI monitored barriers]: their messages on a communicator of their own.
  MPI_Comm barrier_comm = MPI_COMM_NULL;
  EMBER_RETURN_IF_ERROR(CallMpi("mpi backend: creating the group", "MPI_Comm_dup",
                                [&] { return MPI_Comm_dup(comm, &barrier_comm); }));
  BackendOptions with_store = options;
  const char* own_store = std::getenv("EMBER_MPI_STORE");
  if (with_store.store == nullptr && n > 1 &&
      (own_store == nullptr || std::string(own_store) != "0")) {
    absl::StatusOr<std::shared_ptr<Store>> store =
        StoreOverMpi(comm, rank, whole_world, options.timeout);
    if (!store.ok()) {
      CallMpi("mpi backend: creating the group", "MPI_Comm_free", [&] {
        MPI_Comm_free(&barrier_comm);
        return MPI_Comm_free(&comm);
      }).IgnoreError();
      return store.status();
    }
    with_store.store = *std::move(store);
  }
  return std::shared_ptr<MpiProcessGroup>(
      new MpiProcessGroup(with_store, comm, barrier_comm, std::move(ranks)));
}

MpiProcessGroup::MpiProcessGroup(const BackendOptions& options, MPI_Comm comm,
                                 MPI_Comm barrier_comm, std::vector<int> world_ranks)
    : ProcessGroup(options.rank, options.size, "mpi", MpiSupportTable(), options.timeout),
      comm_(comm),
      barrier_comm_(barrier_comm),
      world_ranks_(std::move(world_ranks)),
      poll_(kFirstPoll),
      // No admission hook: every collective runs, even past its deadline
      // (Note [MPI timeouts]).
      queue_({.poll = [this](bool woken) { return Poll(woken); }}) {
  PublishProgress(options.store, options.store_prefix);
}

MpiProcessGroup::~MpiProcessGroup() {
  absl::Time limit = absl::Now() + kAbortGrace;
  {
    absl::MutexLock lock(&mu_);
    for (OpQueue::Op& op : queue_.TakeQueued()) {
      op.work->Finish(
          absl::AbortedError(absl::StrCat(op.what, ": the process group was destroyed")));
    }
    queue_.Stop();
    const OpQueue::Running running = queue_.running();
    if (running.work && aborted_.ok()) limit = std::max(limit, running.work->deadline());
  }
  // Note [MPI timeouts]: a worker still inside MPI at the limit never returns.
  if (!queue_.WaitUntilStopped(limit)) {
    fprintf(stderr,
            "ember: mpi backend: the process group is destroyed while %s is still inside MPI, "
            "which cannot cancel it; calling MPI_Abort to end the job\n",
            queue_.running().what.c_str());
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  queue_.Join();
  // What is still posted: receives are cancelled, sends keep their buffers.
  std::vector<std::shared_ptr<PendingP2P>> pending;
  {
    absl::MutexLock lock(&mu_);
    pending.swap(p2p_);
  }
  absl::MutexLock mpi(&MpiLock());
  if (MpiFinalized()) return;
  for (auto& p : pending) {
    p->work->Finish(absl::AbortedError(absl::StrCat(p->what, ": the process group was destroyed")));
    if (p->recv) {
      MPI_Cancel(&p->request);
      MPI_Wait(&p->request, MPI_STATUS_IGNORE);
    } else {
      MPI_Request_free(&p->request);
      KeepUntilExit(p->staging);
    }
  }
  MPI_Comm comm = comm_;
  MPI_Comm_free(&comm);
  comm = barrier_comm_;
  MPI_Comm_free(&comm);
}

void MpiProcessGroup::abort() {
  OnAbort();
  absl::MutexLock lock(&mu_);
  if (aborted_.ok()) aborted_ = absl::AbortedError(AbortReason());
  for (OpQueue::Op& op : queue_.TakeQueued()) {
    op.work->Finish(absl::AbortedError(absl::StrCat(op.what, ": ", aborted_.message())));
  }
  if (const OpQueue::Running running = queue_.running(); running.work) {
    running.work->Finish(absl::AbortedError(absl::StrCat(running.what, ": ", aborted_.message())));
  }
  for (auto& p : p2p_) {
    p->work->Finish(absl::AbortedError(absl::StrCat(p->what, ": ", aborted_.message())));
  }
  queue_.Wake();  // the worker cancels the receives
}

std::string MpiProcessGroup::DescribePeer(int rank) const {
  if (rank == kAnySource) return "any rank";
  return absl::StrCat("rank ", rank, " (MPI_COMM_WORLD rank ", world_ranks_[rank], ")");
}

// --- Execution ---------------------------------------------------------------------

std::shared_ptr<Work> MpiProcessGroup::Enqueue(OpType op,
                                               const std::optional<absl::Duration>& timeout,
                                               Job job) {
  const absl::Time deadline = DeadlineFor(timeout);
  absl::MutexLock lock(&mu_);
  const std::string what = absl::StrCat(op_type_name(op), " (collective #", next_seq_, ")");
  auto work = std::make_shared<TimedWork<Work>>(
      op, deadline,
      absl::StrCat(what,
                   ": did not finish within its timeout. MPI can neither time out nor cancel a "
                   "collective, so it is still running (a rank that never joins it leaves it "
                   "stuck) and this group's later ops wait behind it; destroying the group "
                   "while it is stuck ends the job (MPI_Abort)"));
  if (!aborted_.ok()) {
    work->Finish(absl::AbortedError(absl::StrCat(what, ": ", aborted_.message())));
    return work;
  }
  ++next_seq_;
  queue_.Push(
      {.work = work, .what = what, .deadline = deadline, .run = [what, job = std::move(job)] {
         return job(what);
       }});
  return work;
}

absl::Duration MpiProcessGroup::Poll(bool woken) {
  if (woken) poll_ = kFirstPoll;
  poll_ = PollP2P() ? kFirstPoll : std::min(poll_ * 2, kLongestPoll);
  absl::MutexLock lock(&mu_);
  return p2p_.empty() ? absl::InfiniteDuration() : poll_;
}

bool MpiProcessGroup::PollP2P() {
  std::vector<std::shared_ptr<PendingP2P>> pending;
  bool aborted = false;
  {
    absl::MutexLock lock(&mu_);
    pending = p2p_;
    aborted = !aborted_.ok();
  }
  if (pending.empty()) return false;
  std::vector<Completion> finished;
  {
    absl::MutexLock mpi(&MpiLock());
    if (MpiFinalized()) return false;
    for (auto& p : pending) {
      // A receive that was aborted or timed out is cancelled.
      if (p->recv && (aborted || p->work->is_completed())) {
        MPI_Cancel(&p->request);
        MPI_Wait(&p->request, MPI_STATUS_IGNORE);
        finished.push_back({p, absl::AbortedError(absl::StrCat(p->what, ": cancelled"))});
        continue;
      }
      if (!p->recv && aborted) {
        MPI_Request_free(&p->request);
        KeepUntilExit(p->staging);
        finished.push_back({p, absl::AbortedError(absl::StrCat(p->what, ": aborted"))});
        continue;
      }
      int flag = 0;
      MPI_Status status;
      const int rc = MPI_Test(&p->request, &flag, &status);
      if (rc != MPI_SUCCESS) {
        finished.push_back({p, MpiStatus(rc, p->what, p->recv ? "MPI_Irecv" : "MPI_Isend")});
        continue;
      }
      if (!flag) continue;
      Completion done{p, absl::OkStatus(), status.MPI_SOURCE};
      if (p->recv) {
        int got = 0;
        MPI_Get_count(&status, MpiType(p->staging.dtype()), &got);
        if (got != p->count) {
          done.status = absl::FailedPreconditionError(
              absl::StrCat(p->what, ": ", DescribePeer(status.MPI_SOURCE), " sent ", got,
                           " elements but this receive's tensor holds ", p->count,
                           "; send and receive tensors of the same size and dtype"));
        }
      }
      finished.push_back(std::move(done));
    }
  }
  for (Completion& c : finished) {
    if (c.status.ok() && c.p2p->recv) {
      CopyBackFromStaging(c.p2p->user, c.p2p->staging);
      c.p2p->recv->set_source(c.source);
    }
    c.p2p->work->Finish(std::move(c.status));
  }
  absl::MutexLock lock(&mu_);
  for (const Completion& c : finished) {
    p2p_.erase(std::find(p2p_.begin(), p2p_.end(), c.p2p));
  }
  return !finished.empty();
}

// --- Collectives -------------------------------------------------------------------

absl::StatusOr<std::shared_ptr<Work>> MpiProcessGroup::DoBroadcast(
    const Tensor& tensor, const BroadcastOptions& options) {
  EMBER_ASSIGN_OR_RETURN(const int n, Count(OpType::kBroadcast, tensor.numel()));
  const int root = options.root;
  return Enqueue(OpType::kBroadcast, options.timeout,
                 [this, tensor, n, root](const std::string& what) -> absl::Status {
                   Tensor data = ContiguousStaging(tensor);
                   EMBER_RETURN_IF_ERROR(CallMpi(what, "MPI_Bcast", [&] {
                     return MPI_Bcast(data.raw_data(), n, MpiType(data.dtype()), root, comm_);
                   }));
                   CopyBackFromStaging(tensor, data);
                   return absl::OkStatus();
                 });
}

absl::StatusOr<std::shared_ptr<Work>> MpiProcessGroup::DoAllReduce(
    const Tensor& tensor, const AllReduceOptions& options) {
  EMBER_RETURN_IF_ERROR(RefuseAvg(OpType::kAllReduce, options.op, "mpi"));
  EMBER_ASSIGN_OR_RETURN(const int n, Count(OpType::kAllReduce, tensor.numel()));
  const ReduceOp op = options.op;
  return Enqueue(OpType::kAllReduce, options.timeout,
                 [this, tensor, n, op](const std::string& what) -> absl::Status {
                   Tensor data = ContiguousStaging(tensor);
                   EMBER_RETURN_IF_ERROR(CallMpi(what, "MPI_Allreduce", [&] {
                     return MPI_Allreduce(MPI_IN_PLACE, data.raw_data(), n, MpiType(data.dtype()),
                                          MpiOp(op, data.dtype()), comm_);
                   }));
                   CopyBackFromStaging(tensor, data);
                   return absl::OkStatus();
                 });
}

absl::StatusOr<std::shared_ptr<Work>> MpiProcessGroup::DoReduce(const Tensor& tensor,
                                                                const ReduceOptions& options) {
  EMBER_RETURN_IF_ERROR(RefuseAvg(OpType::kReduce, options.op, "mpi"));
  EMBER_ASSIGN_OR_RETURN(const int n, Count(OpType::kReduce, tensor.numel()));
  const ReduceOp op = options.op;
  const int root = options.root;
  return Enqueue(OpType::kReduce, options.timeout,
                 [this, tensor, n, op, root](const std::string& what) -> absl::Status {
                   Tensor data = ContiguousStaging(tensor);
                   const bool is_root = rank() == root;
                   EMBER_RETURN_IF_ERROR(CallMpi(what, "MPI_Reduce", [&] {
                     // The root reduces in place; the others' tensors are only read.
                     return MPI_Reduce(is_root ? MPI_IN_PLACE : data.raw_data(),
                                       is_root ? data.raw_data() : nullptr, n,
                                       MpiType(data.dtype()), MpiOp(op, data.dtype()), root, comm_);
                   }));
                   if (is_root) CopyBackFromStaging(tensor, data);
                   return absl::OkStatus();
                 });
}

absl::StatusOr<std::shared_ptr<Work>> MpiProcessGroup::DoAllGather(
    absl::Span<const Tensor> outputs, const Tensor& input, const AllGatherOptions& options) {
  EMBER_ASSIGN_OR_RETURN(const int n, Count(OpType::kAllGather, input.numel()));
  EMBER_RETURN_IF_ERROR(Count(OpType::kAllGather, input.numel() * size()).status());
  std::vector<Tensor> outs(outputs.begin(), outputs.end());
  return Enqueue(OpType::kAllGather, options.timeout,
                 [this, outs, input, n](const std::string& what) -> absl::Status {
                   Tensor in = ContiguousStaging(input);
                   Tensor flat = empty({size() * input.numel()}, TensorOptions(input.dtype()));
                   const MPI_Datatype type = MpiType(input.dtype());
                   EMBER_RETURN_IF_ERROR(CallMpi(what, "MPI_Allgather", [&] {
                     return MPI_Allgather(in.raw_data(), n, type, flat.raw_data(), n, type, comm_);
                   }));
                   for (int p = 0; p < size(); ++p) {
                     outs[p].copy_(flat.narrow(0, p * int64_t{n}, n).view(outs[p].sizes()));
                   }
                   return absl::OkStatus();
                 });
}

absl::StatusOr<std::shared_ptr<Work>> MpiProcessGroup::DoAllGatherIntoTensor(
    const Tensor& output, const Tensor& input, const AllGatherOptions& options) {
  EMBER_ASSIGN_OR_RETURN(const int n, Count(OpType::kAllGatherIntoTensor, input.numel()));
  EMBER_RETURN_IF_ERROR(Count(OpType::kAllGatherIntoTensor, output.numel()).status());
  return Enqueue(OpType::kAllGatherIntoTensor, options.timeout,
                 [this, output, input, n](const std::string& what) -> absl::Status {
                   Tensor in = ContiguousStaging(input);
                   Tensor out = ContiguousStaging(output);
                   const MPI_Datatype type = MpiType(input.dtype());
                   EMBER_RETURN_IF_ERROR(CallMpi(what, "MPI_Allgather", [&] {
                     return MPI_Allgather(in.raw_data(), n, type, out.raw_data(), n, type, comm_);
                   }));
                   CopyBackFromStaging(output, out);
                   return absl::OkStatus();
                 });
}

absl::StatusOr<std::shared_ptr<Work>> MpiProcessGroup::DoGather(absl::Span<const Tensor> outputs,
                                                                const Tensor& input,
                                                                const GatherOptions& options) {
  EMBER_ASSIGN_OR_RETURN(const int n, Count(OpType::kGather, input.numel()));
  EMBER_RETURN_IF_ERROR(Count(OpType::kGather, input.numel() * size()).status());
  const int root = options.root;
  std::vector<Tensor> outs(outputs.begin(), outputs.end());
  return Enqueue(OpType::kGather, options.timeout,
                 [this, outs, input, n, root](const std::string& what) -> absl::Status {
                   Tensor in = ContiguousStaging(input);
                   const bool is_root = rank() == root;
                   Tensor flat;
                   if (is_root)
                     flat = empty({size() * input.numel()}, TensorOptions(input.dtype()));
                   const MPI_Datatype type = MpiType(input.dtype());
                   EMBER_RETURN_IF_ERROR(CallMpi(what, "MPI_Gather", [&] {
                     return MPI_Gather(in.raw_data(), n, type, is_root ? flat.raw_data() : nullptr,
                                       n, type, root, comm_);
                   }));
                   for (size_t p = 0; p < outs.size(); ++p) {
                     outs[p].copy_(flat.narrow(0, p * int64_t{n}, n).view(outs[p].sizes()));
                   }
                   return absl::OkStatus();
                 });
}

absl::StatusOr<std::shared_ptr<Work>> MpiProcessGroup::DoScatter(const Tensor& output,
                                                                 absl::Span<const Tensor> inputs,
                                                                 const ScatterOptions& options) {
  EMBER_ASSIGN_OR_RETURN(const int n, Count(OpType::kScatter, output.numel()));
  EMBER_RETURN_IF_ERROR(Count(OpType::kScatter, output.numel() * size()).status());
  const int root = options.root;
  std::vector<Tensor> ins(inputs.begin(), inputs.end());
  return Enqueue(OpType::kScatter, options.timeout,
                 [this, output, ins, n, root](const std::string& what) -> absl::Status {
                   const bool is_root = rank() == root;
                   Tensor flat;
                   if (is_root) {
                     flat = empty({size() * output.numel()}, TensorOptions(output.dtype()));
                     for (int p = 0; p < size(); ++p) {
                       flat.narrow(0, p * int64_t{n}, n).copy_(ins[p].reshape({n}));
                     }
                   }
                   Tensor out = ContiguousStaging(output);
                   const MPI_Datatype type = MpiType(output.dtype());
                   EMBER_RETURN_IF_ERROR(CallMpi(what, "MPI_Scatter", [&] {
                     return MPI_Scatter(is_root ? flat.raw_data() : nullptr, n, type,
                                        out.raw_data(), n, type, root, comm_);
                   }));
                   CopyBackFromStaging(output, out);
                   return absl::OkStatus();
                 });
}

absl::StatusOr<std::shared_ptr<Work>> MpiProcessGroup::DoReduceScatter(
    const Tensor& output, absl::Span<const Tensor> inputs, const ReduceScatterOptions& options) {
  EMBER_RETURN_IF_ERROR(RefuseAvg(OpType::kReduceScatter, options.op, "mpi"));
  EMBER_ASSIGN_OR_RETURN(const int n, Count(OpType::kReduceScatter, output.numel()));
  EMBER_RETURN_IF_ERROR(Count(OpType::kReduceScatter, output.numel() * size()).status());
  const ReduceOp op = options.op;
  std::vector<Tensor> ins(inputs.begin(), inputs.end());
  return Enqueue(OpType::kReduceScatter, options.timeout,
                 [this, output, ins, n, op](const std::string& what) -> absl::Status {
                   Tensor flat = empty({size() * output.numel()}, TensorOptions(output.dtype()));
                   for (int p = 0; p < size(); ++p) {
                     flat.narrow(0, p * int64_t{n}, n).copy_(ins[p].reshape({n}));
                   }
                   Tensor out = ContiguousStaging(output);
                   EMBER_RETURN_IF_ERROR(CallMpi(what, "MPI_Reduce_scatter_block", [&] {
                     return MPI_Reduce_scatter_block(flat.raw_data(), out.raw_data(), n,
                                                     MpiType(out.dtype()), MpiOp(op, out.dtype()),
                                                     comm_);
                   }));
                   CopyBackFromStaging(output, out);
                   return absl::OkStatus();
                 });
}

absl::StatusOr<std::shared_ptr<Work>> MpiProcessGroup::DoAllToAll(absl::Span<const Tensor> outputs,
                                                                  absl::Span<const Tensor> inputs,
                                                                  const AllToAllOptions& options) {
  std::vector<int> send_counts, send_offsets, recv_counts, recv_offsets;
  int64_t send_total = 0, recv_total = 0;
  for (const Tensor& t : inputs) {
    send_offsets.push_back(static_cast<int>(send_total));
    send_counts.push_back(static_cast<int>(t.numel()));
    send_total += t.numel();
    EMBER_RETURN_IF_ERROR(Count(OpType::kAllToAll, send_total).status());
  }
  for (const Tensor& t : outputs) {
    recv_offsets.push_back(static_cast<int>(recv_total));
    recv_counts.push_back(static_cast<int>(t.numel()));
    recv_total += t.numel();
    EMBER_RETURN_IF_ERROR(Count(OpType::kAllToAll, recv_total).status());
  }
  std::vector<Tensor> ins(inputs.begin(), inputs.end());
  std::vector<Tensor> outs(outputs.begin(), outputs.end());
  return Enqueue(
      OpType::kAllToAll, options.timeout,
      [this, ins, outs, send_counts, send_offsets, recv_counts, recv_offsets, send_total,
       recv_total](const std::string& what) -> absl::Status {
        const Dtype dtype = ins[0].dtype();
        Tensor in = empty({send_total}, TensorOptions(dtype));
        Tensor out = empty({recv_total}, TensorOptions(dtype));
        for (size_t p = 0; p < ins.size(); ++p) {
          in.narrow(0, send_offsets[p], send_counts[p]).copy_(ins[p].reshape({send_counts[p]}));
        }
        const MPI_Datatype type = MpiType(dtype);
        EMBER_RETURN_IF_ERROR(CallMpi(what, "MPI_Alltoallv", [&] {
          return MPI_Alltoallv(in.raw_data(), send_counts.data(), send_offsets.data(), type,
                               out.raw_data(), recv_counts.data(), recv_offsets.data(), type,
                               comm_);
        }));
        for (size_t p = 0; p < outs.size(); ++p) {
          outs[p].copy_(out.narrow(0, recv_offsets[p], recv_counts[p]).view(outs[p].sizes()));
        }
        return absl::OkStatus();
      });
}

absl::StatusOr<std::shared_ptr<Work>> MpiProcessGroup::DoBarrier(const BarrierOptions& options) {
  return Enqueue(OpType::kBarrier, options.timeout, [this](const std::string& what) {
    return CallMpi(what, "MPI_Barrier", [&] { return MPI_Barrier(comm_); });
  });
}

// Note [MPI monitored barriers]
// PyTorch's mpi backend has no monitored_barrier; this one is gloo's
// protocol over MPI point-to-point: every rank but 0 sends rank 0 one byte
// and waits for one back; rank 0 waits, up to the timeout, for every rank's
// byte, then answers each. Unlike MPI_Barrier, every wait here is a posted
// request tested until a deadline, so rank 0 can stop and name the ranks
// that never came; receives left unmatched are cancelled, and sends are
// from static storage, so one left posted reads valid memory for as long
// as it lives. The messages travel on a communicator of the group's own
// (duplicated when the group is made), so they never match the caller's
// sends and receives whatever their tags, and with tags from the group's
// count of monitored barriers, so a rank that arrives after rank 0 gave up
// cannot be taken for one arriving at the next barrier.
absl::StatusOr<std::shared_ptr<Work>> MpiProcessGroup::DoMonitoredBarrier(
    const MonitoredBarrierOptions& options) {
  const bool wait_all = options.wait_all_ranks;
  const absl::Duration timeout = options.timeout.value_or(this->timeout());
  const int64_t number = monitored_barriers_++;
  // The Work outlives the barrier's own waits (rank 0's timeout, the
  // others' a second more), so the error it reports is the barrier's.
  return Enqueue(OpType::kMonitoredBarrier, timeout + absl::Seconds(2),
                 [this, wait_all, timeout, number](const std::string& what) -> absl::Status {
                   return MonitoredBarrier(what, number, timeout, wait_all);
                 });
}

absl::Status MpiProcessGroup::MonitoredBarrier(const std::string& what, int64_t number,
                                               absl::Duration timeout, bool wait_all) {
  static char kByte = 0;  // what every send carries (static: see the Note)
  const int n = size(), r = rank();
  const int span = std::max(MaxTag() / 2, 1);
  const int arrive_tag = static_cast<int>(2 * (number % span));
  const int release_tag = arrive_tag + 1;
  const absl::Time deadline = absl::Now() + timeout;
  // Tests `requests` until every one completed or `until`; those not
  // completed are cancelled (receives) or freed (sends) and reported.
  auto wait_until = [&](std::vector<MPI_Request>& requests, bool receives,
                        absl::Time until) -> absl::StatusOr<std::vector<bool>> {
    std::vector<bool> done(requests.size(), false);
    absl::Duration pause = absl::Microseconds(50);
    while (true) {
      bool all = true;
      {
        absl::MutexLock mpi(&MpiLock());
        if (MpiFinalized()) return absl::FailedPreconditionError(what + ": MPI was finalized");
        for (size_t i = 0; i < requests.size(); ++i) {
          if (done[i] || requests[i] == MPI_REQUEST_NULL) {
            done[i] = true;
            continue;
          }
          int flag = 0;
          const int rc = MPI_Test(&requests[i], &flag, MPI_STATUS_IGNORE);
          if (rc != MPI_SUCCESS) return MpiStatus(rc, what, "MPI_Test");
          done[i] = flag != 0;
          all = all && done[i];
        }
        if (all || absl::Now() >= until) {
          for (size_t i = 0; i < requests.size(); ++i) {
            if (done[i]) continue;
            if (receives) {
              MPI_Cancel(&requests[i]);
              MPI_Wait(&requests[i], MPI_STATUS_IGNORE);
            } else {
              MPI_Request_free(&requests[i]);
            }
          }
          return done;
        }
      }
      absl::SleepFor(pause);
      pause = std::min(pause * 2, absl::Milliseconds(5));
    }
  };
  auto post = [&](bool receive, int peer, int tag, char* into,
                  MPI_Request* request) -> absl::Status {
    return CallMpi(what, receive ? "MPI_Irecv" : "MPI_Isend", [&] {
      return receive ? MPI_Irecv(into, 1, MPI_CHAR, peer, tag, barrier_comm_, request)
                     : MPI_Isend(&kByte, 1, MPI_CHAR, peer, tag, barrier_comm_, request);
    });
  };
  if (r != 0) {
    char ack = 0;
    std::vector<MPI_Request> sent(1, MPI_REQUEST_NULL), got(1, MPI_REQUEST_NULL);
    EMBER_RETURN_IF_ERROR(post(true, 0, release_tag, &ack, &got[0]));
    EMBER_RETURN_IF_ERROR(post(false, 0, arrive_tag, nullptr, &sent[0]));
    // Rank 0 judges who is missing; wait a little longer for its answer.
    EMBER_ASSIGN_OR_RETURN(std::vector<bool> released,
                           wait_until(got, true, deadline + absl::Seconds(1)));
    EMBER_RETURN_IF_ERROR(wait_until(sent, false, absl::Now()).status());
    if (!released[0]) {
      return absl::DeadlineExceededError(absl::StrCat(
          what, ": ", DescribePeer(0), " did not release this rank within ",
          absl::FormatDuration(timeout), " (rank 0's error names the ranks it waited for)"));
    }
    return absl::OkStatus();
  }
  std::vector<char> bytes(n);
  std::vector<MPI_Request> arrivals(n, MPI_REQUEST_NULL);
  for (int p = 1; p < n; ++p) {
    EMBER_RETURN_IF_ERROR(post(true, p, arrive_tag, &bytes[p], &arrivals[p]));
  }
  EMBER_ASSIGN_OR_RETURN(std::vector<bool> arrived, wait_until(arrivals, true, deadline));
  std::vector<int> missing;
  for (int p = 1; p < n; ++p) {
    if (!arrived[p]) missing.push_back(p);
  }
  if (!missing.empty()) {
    if (!wait_all) missing.resize(1);  // the first, as gloo's rank 0 stops there
    return MonitoredBarrierTimeout(missing, timeout);
  }
  std::vector<MPI_Request> releases(n, MPI_REQUEST_NULL);
  for (int p = 1; p < n; ++p) {
    EMBER_RETURN_IF_ERROR(post(false, p, release_tag, nullptr, &releases[p]));
  }
  return wait_until(releases, false, deadline + absl::Seconds(1)).status();
}

// --- Point-to-point ----------------------------------------------------------------

absl::StatusOr<std::shared_ptr<MpiProcessGroup::PendingP2P>> MpiProcessGroup::PostP2P(
    OpType op, const Tensor& tensor, int peer, const P2POptions& options) {
  const int max_tag = MaxTag();
  if (options.tag < 0 || options.tag > max_tag) {
    return absl::InvalidArgumentError(absl::StrCat(op_type_name(op), ": tag ", options.tag,
                                                   " is outside the tags MPI carries, [0, ",
                                                   max_tag, "]; pick a tag in range"));
  }
  EMBER_ASSIGN_OR_RETURN(const int n, Count(op, tensor.numel()));
  const bool is_recv = op == OpType::kRecv;
  auto p = std::make_shared<PendingP2P>();
  p->what = absl::StrCat(is_recv ? "recv from " : "send to ", DescribePeer(peer), " (tag ",
                         options.tag, ")");
  const absl::Time deadline = DeadlineFor(options.timeout);
  if (is_recv) {
    p->recv = std::make_shared<TimedWork<RecvWork>>(
        op, deadline, absl::StrCat(p->what, ": no message arrived within its timeout"));
    p->work = p->recv;
  } else {
    p->work = std::make_shared<TimedWork<Work>>(
        op, deadline,
        absl::StrCat(p->what,
                     ": the receiver did not take the message within its timeout (MPI cannot "
                     "cancel a send, so it stays posted)"));
  }
  p->user = tensor;
  p->staging = ContiguousStaging(tensor);
  p->count = n;
  {
    absl::MutexLock lock(&mu_);
    if (!aborted_.ok()) {
      p->work->Finish(absl::AbortedError(absl::StrCat(p->what, ": ", aborted_.message())));
      return p;
    }
  }
  const MPI_Datatype type = MpiType(tensor.dtype());
  absl::Status posted = is_recv
                            ? CallMpi(p->what, "MPI_Irecv",
                                      [&] {
                                        return MPI_Irecv(p->staging.raw_data(), n, type,
                                                         peer == kAnySource ? MPI_ANY_SOURCE : peer,
                                                         options.tag, comm_, &p->request);
                                      })
                            : CallMpi(p->what, "MPI_Isend", [&] {
                                return MPI_Isend(p->staging.raw_data(), n, type, peer, options.tag,
                                                 comm_, &p->request);
                              });
  if (!posted.ok()) {
    p->work->Finish(std::move(posted));
    return p;
  }
  absl::MutexLock lock(&mu_);
  p2p_.push_back(p);
  queue_.Wake();
  return p;
}

absl::StatusOr<std::shared_ptr<Work>> MpiProcessGroup::DoSend(const Tensor& tensor, int dst,
                                                              const P2POptions& options) {
  EMBER_ASSIGN_OR_RETURN(std::shared_ptr<PendingP2P> p,
                         PostP2P(OpType::kSend, tensor, dst, options));
  return p->work;
}

absl::StatusOr<std::shared_ptr<RecvWork>> MpiProcessGroup::DoRecv(const Tensor& tensor, int src,
                                                                  const P2POptions& options) {
  EMBER_ASSIGN_OR_RETURN(std::shared_ptr<PendingP2P> p,
                         PostP2P(OpType::kRecv, tensor, src, options));
  return p->recv;
}

EMBER_REGISTER_BACKEND(mpi, BackendInfo{.name = "mpi",
                                        .support = MpiSupportTable(),
                                        .create = [](const BackendOptions& options)
                                            -> absl::StatusOr<std::shared_ptr<ProcessGroup>> {
                                          EMBER_ASSIGN_OR_RETURN(auto pg,
                                                                 MpiProcessGroup::create(options));
                                          return std::shared_ptr<ProcessGroup>(std::move(pg));
                                        },
                                        .world_from_launcher = &MpiWorldFromLauncher});

}  // namespace ember::distributed::mpi
