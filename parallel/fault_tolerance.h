// Per-step fault tolerance (torchft's Manager): replica groups, each a full
// copy of the model, train together; each step (or every few, Note [Asking
// every few steps]) they ask the lighthouse
// (distributed/elastic/lighthouse.h) which of them take part, average
// gradients over those only, and commit the step only if every participant
// finished it. A replica group that dies is left out of the next step, the
// step it broke is discarded everywhere (never half-applied), and a group
// that joins or comes back gets the model and optimizer state over the
// network from a member that has the newest, before its first step: no job
// restart, no checkpoint read.
//
//   ```cpp compile-only
//   #include "nn/linear.h"
//   #include "nn/loss.h"
//   #include "nn/optim/sgd.h"
//   #include "parallel/fault_tolerance.h"
//   #include "tensor/factories.h"
//   namespace par = ember::parallel;
//   // One process per replica group; the lighthouse at TORCHFT_LIGHTHOUSE.
//   auto model = std::make_shared<ember::nn::Linear>(16, 4);
//   ember::nn::optim::SGD opt(model->parameters(), {.lr = 0.01, .momentum = 0.9});
//   EMBER_ASSIGN_OR_RETURN(auto ft, par::Manager::create(model, &opt, {.replica_id = "r1"}));
//   while (ft->current_step() < 1000) {
//     EMBER_RETURN_IF_ERROR(ft->start_quorum());  // may recover the state from a peer
//     ember::Generator gen(ft->current_step());   // the step's batch: this member's share
//     const int64_t rows = 96 / ft->num_participants();
//     ember::Tensor x = ember::randn({96, 16}, {}, &gen).narrow(0, ft->participant_rank() * rows, rows);
//     opt.zero_grad();
//     ember::nn::functional::mse_loss((*model)(x), ember::zeros({rows, 4})).backward();
//     ft->allreduce_gradients().IgnoreError();  // a failure here is recorded, not thrown
//     if (ft->should_commit()) opt.step();       // else the step is discarded everywhere
//   }
//   ```
//
// Note [Steps that commit]
// current_step() counts committed steps; a step is identified by it, so
// the batch a participant trains should be a function of (current_step(),
// participant_rank(), num_participants()), as parallel/quorum_data_loader.h
// makes it for a dataset: then every committed step
// trains each sample of its batch exactly once, whatever the failures, and
// a run with failures equals one without them that had the same quorums.
// start_quorum() joins the lighthouse's quorum with this group's step and
// store address; when the members changed (or the last step failed) it
// makes a new process group of the members over the first member's store
// (the backend of `options.backend`), and when some member is behind
// max_step, the first member with max_step broadcasts its state (model
// state_dict, optimizer state_dict and the step, pickled) to all, and those
// behind load it. allreduce / allreduce_gradients average over the
// participants (sum / num_participants); an error in them, or in anything
// the caller reports with report_error, makes this step fail. should_commit
// is a vote of every participant (all succeeded, and at least
// min_replicas took part); when it passes, current_step() advances and the
// caller applies the step; when it fails, or the vote itself fails, the
// caller must discard the step (zero_grad without stepping), and the next
// start_quorum makes a new group.
//
// Note [The vote in the gradients]
// When the replica group is one process and the gradients are float32 or
// float64, allreduce_gradients() carries the vote: one more element, 1 for
// a participant that failed this step so far, summed with the gradients.
// should_commit() then needs no collective of its own: it commits when
// that count was 0 and nothing failed since. A participant whose gradient
// all-reduce failed, or that fails after it, discards the step alone while
// the others may commit it; it is then behind, so the next quorum makes a
// new process group and it takes the state from a member with the newest
// step (its batch was trained by the others: nothing is lost or trained
// twice). Otherwise (gradients averaged by allreduce() calls, say DDP's
// hook, or replica groups of several ranks) should_commit() runs the vote
// as described above.
//
// Note [Overlapping the quorum]
// With options.async_quorum (the default, as torchft's use_async_quorum),
// a start_quorum() that follows a committed step asks the lighthouse on a
// background thread and returns at once, so the request's round trip (and
// the wait for the slowest group to ask) overlaps the forward and backward
// passes. Until the answer is awaited, current_step(), participant_rank()
// and num_participants() are the last quorum's: a guess that the
// membership holds. The first allreduce (or should_commit) awaits the
// answer (rank 0's, shared with its replica group there). When the quorum
// is the last one (the same members at the same addresses, nobody behind)
// the step goes on in the same process group; otherwise the new quorum is
// applied then and there (a new process group, a recovery from a peer),
// the collectives run in it so that members that asked synchronously are
// met, and the step fails (kAborted, naming both quorums): its batch was
// chosen for the old membership. So a membership change costs one
// discarded step. After a step that failed, and for the first, the quorum
// is asked synchronously, as without async_quorum.
//
// Note [Asking every few steps]
// With options.quorum_every = N > 1, start_quorum() asks the lighthouse
// only at committed steps that are multiples of N, after a step that
// failed, and for the first step; in between it keeps the last quorum (its
// members, ranks and process group) without a request. Every member has the
// same committed step, so all of them ask at the same steps. A step still
// votes (Note [The vote in the gradients]) and a dead member still fails
// the step's collectives, so failures are handled as with N = 1; what waits
// is a group that joins or comes back: it is let in at the others' next ask,
// at most N steps later. Keep N steps well inside the lighthouse's
// join_timeout, which the joining group's request would otherwise outlast
// (with min_replicas 1 it would then form a quorum alone). One case costs
// more: a member that discards a step the others commit (its own error after
// the vote) asks alone, and the others find it gone only when their next
// collective times out. On a machine whose cores the groups share, each ask
// costs every group a round trip through the lighthouse's gRPC server: with
// N = 8 the 3-group MLP job of BENCHMARKS.md ("the lighthouse asked every 8
// steps") commits about a fifth more steps per second than with N = 1.
//
// create() returns once the lighthouse has heard this group (its first
// heartbeat, waited for up to `timeout`), so a quorum decided after it
// returns waits for the group to ask; a heartbeat thread then keeps the
// group known every heartbeat_interval.
//
// Note [Replica groups of several ranks]
// A replica group may be several processes (HSDP: DDP or fully_shard over
// the group's own ranks, a copy of the model per group). Each rank makes a
// Manager with the same replica_id and options.replica_group, the group's
// process group. Rank 0 of the group alone talks to the lighthouse (its
// heartbeats and quorum requests, with its store's address) and
// broadcasts each quorum to the group's other ranks. Local rank i of every
// member group then forms its own process group across the groups (over
// the first member's store, under a prefix of the decision and i): the
// gradients (allreduce, allreduce_gradients) are averaged across groups
// there, after the group averaged or sharded them itself, and a group
// behind takes its state rank by rank from the same local rank of the
// source group, so each rank's state_dict (a shard's, under fully_shard)
// goes to its counterpart. should_commit's vote runs within the group, then
// across groups, then within the group again, so every rank of every member
// decides alike. A group whose own process group fails (a rank died) cannot
// go on: its Manager is broken from then on (start_quorum and should_commit
// fail at once, naming the first error), rank 0 stops heartbeating so the
// next quorum leaves the group out, and the group is to be restarted whole
// (launch --replica_groups restarts a failed worker; a multi-rank group is
// one launch per group, whose restart brings all its ranks back).
//
// Errors: create() and start_quorum() return absl::Status (the
// lighthouse's and the backend's; InvalidArgument for bad options, named).
// Thread-safety: one thread drives a Manager.
#ifndef EMBER_PARALLEL_FAULT_TOLERANCE_H_
#define EMBER_PARALLEL_FAULT_TOLERANCE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "distributed/elastic/lighthouse.h"
#include "distributed/process_group.h"
#include "distributed/tcp_store.h"
#include "nn/module.h"
#include "nn/optim/optimizer.h"
#include "tensor/tensor.h"

namespace ember::parallel {

struct ManagerOptions {
  // The lighthouse, "host:port"; empty: $TORCHFT_LIGHTHOUSE.
  std::string lighthouse;
  // This replica group's name, unique in the job; empty: $REPLICA_GROUP_ID.
  std::string replica_id;
  // The backend of the groups across replicas ("gloo", "tcp").
  std::string backend = "gloo";
  // The host other replica groups reach this one's store at.
  std::string host = "127.0.0.1";
  // Fewer participants than this: steps do not commit (torchft's
  // min_replica_size).
  int min_replicas = 1;
  // Each collective and the state transfer; start_quorum's wait.
  absl::Duration timeout = absl::Seconds(60);
  absl::Duration quorum_timeout = absl::Seconds(60);
  absl::Duration heartbeat_interval = absl::Milliseconds(100);
  // The ranks of this replica group, when it has several (Note [Replica
  // groups of several ranks]); null: the group is this process.
  std::shared_ptr<distributed::ProcessGroup> replica_group;
  // Note [Overlapping the quorum].
  bool async_quorum = true;
  // Note [Asking every few steps]: ask the lighthouse at committed steps
  // that are multiples of this (and after any step that failed); 1, every
  // step, as torchft.
  int quorum_every = 1;
};

class Manager {
 public:
  // Starts this group's store server and heartbeats. `optimizer` may be
  // null (then only the model's state is recovered).
  static absl::StatusOr<std::unique_ptr<Manager>> create(std::shared_ptr<nn::Module> model,
                                                         nn::optim::Optimizer* optimizer,
                                                         ManagerOptions options);
  ~Manager();
  Manager(const Manager&) = delete;
  Manager& operator=(const Manager&) = delete;

  // Note [Steps that commit].
  absl::Status start_quorum();
  // Averages `tensor` in place over the participants; errors are recorded
  // (and returned). Runs the collective while this step's process group
  // is usable even after an error, so that the other participants are not
  // kept waiting; the result then is not to be used.
  absl::Status allreduce(Tensor& tensor);
  // Every parameter's gradient averaged, in one flat buffer.
  absl::Status allreduce_gradients();
  // Makes the current step fail.
  void report_error(const absl::Status& error);
  bool should_commit();

  // While an overlapped quorum is pending, the last quorum's (Note
  // [Overlapping the quorum]).
  int64_t current_step() const { return step_; }
  int participant_rank() const { return rank_; }
  int num_participants() const { return size_; }
  int64_t quorum_id() const { return quorum_id_; }
  const std::string& replica_id() const { return options_.replica_id; }
  // Times this group loaded the state from a peer, and steps discarded.
  int64_t recoveries() const { return recoveries_; }
  int64_t discarded_steps() const { return discarded_; }
  // This process's rank in its replica group and the group's size (0 and 1
  // without options.replica_group).
  int group_rank() const { return group_rank_; }
  int group_size() const { return group_size_; }
  // Not OK once the replica group lost a rank: the group must restart.
  absl::Status broken() const;

 private:
  Manager() = default;
  // This group's quorum request (rank 0 asks; the others get UnknownError).
  absl::StatusOr<distributed::elastic::Quorum> Ask();
  // Applies an answer (shared with the group): the process group, a
  // recovery.
  absl::Status Apply(absl::StatusOr<distributed::elastic::Quorum> asked);
  // Applies the overlapped quorum, if one is pending.
  void Await();
  absl::Status Reconfigure(const distributed::elastic::Quorum& quorum);
  absl::Status Recover(const distributed::elastic::Quorum& quorum);
  // Rank 0's quorum (or its error), given to every rank of the group.
  absl::StatusOr<distributed::elastic::Quorum> ShareQuorum(
      absl::StatusOr<distributed::elastic::Quorum> mine);
  // The sum of `t` over the participants (Fail on an error of the
  // collective); the collective's status.
  absl::Status SumAcross(Tensor& t);
  // Fails this step on `error` of the process group across replica groups
  // (aborted, so the next quorum makes a new one).
  void Fail(const absl::Status& error);
  // Marks the group broken by `error` (an op of its own process group).
  absl::Status Break(const absl::Status& error);

  std::shared_ptr<nn::Module> model_;
  nn::optim::Optimizer* optimizer_ = nullptr;
  ManagerOptions options_;
  std::unique_ptr<distributed::TcpStore> own_store_;  // serves; peers reach it
  std::string address_;
  std::unique_ptr<distributed::elastic::LighthouseClient> lighthouse_;
  std::shared_ptr<distributed::Store> group_store_;
  std::shared_ptr<distributed::ProcessGroup> group_;
  int64_t decision_ = -1;  // the quorum decision group_ was made for
  std::vector<distributed::elastic::QuorumMember> members_;  // of group_'s quorum
  bool group_ready_ = false;  // group_ is this step's (quorum applied)
  bool awaiting_ = false;     // an overlapped quorum is to be applied
  // Rank 0's overlapped requests run on asker_, one thread for the
  // Manager's life (so a step starts no thread): start_quorum sets
  // ask_wanted_, the thread asks and leaves the answer in answer_.
  void AskLoop();
  absl::Mutex ask_mu_;
  bool ask_wanted_ ABSL_GUARDED_BY(ask_mu_) = false;
  bool asker_stop_ ABSL_GUARDED_BY(ask_mu_) = false;
  bool asking_ ABSL_GUARDED_BY(ask_mu_) = false;  // Ask() runs on asker_
  std::optional<absl::StatusOr<distributed::elastic::Quorum>> answer_ ABSL_GUARDED_BY(ask_mu_);
  bool asked_ = false;  // a request of start_quorum's is on asker_
  std::thread asker_;
  int64_t quorum_id_ = -1;
  int64_t step_ = 0;
  int rank_ = 0;
  int size_ = 1;
  bool last_failed_ = false;
  absl::Status error_;  // this step's first error
  // Note [The vote in the gradients]: this step's vote was taken, counting
  // voted_failed_ failed participants; whether this member had failed then.
  bool voted_ = false;
  int64_t voted_failed_ = 0;
  bool failed_before_vote_ = false;
  int64_t recoveries_ = 0;
  int64_t discarded_ = 0;
  int group_rank_ = 0;
  int group_size_ = 1;
  absl::Status broken_;
  std::atomic<bool> beating_{true};  // rank 0's heartbeats; off once broken
  absl::Notification stop_;
  std::thread heartbeat_;
};

}  // namespace ember::parallel

#endif  // EMBER_PARALLEL_FAULT_TOLERANCE_H_
