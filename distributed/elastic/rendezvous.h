// The elastic rendezvous: how the launchers of a job whose size may change
// (launch --nnodes=MIN:MAX) meet, agree on who takes part in each round and
// with which node rank, notice lost and new nodes, and start over
// (torch.distributed.elastic's dynamic rendezvous over a c10d store).
//
//   ```cpp compile-only
//   #include "distributed/elastic/rendezvous.h"
//   namespace elastic = ember::distributed::elastic;
//   EMBER_ASSIGN_OR_RETURN(auto rdzv, elastic::ElasticRendezvous::create(
//       {.store = store, .run_id = "job7", .node_id = "node3:4711",
//        .min_nodes = 2, .max_nodes = 3}));
//   EMBER_ASSIGN_OR_RETURN(elastic::RoundInfo round, rdzv->next_round());
//   // round.node_rank of round.num_nodes; start the workers, then watch:
//   EMBER_RETURN_IF_ERROR(rdzv->keep_alive());
//   EMBER_ASSIGN_OR_RETURN(elastic::Health h, rdzv->health(round));
//   if (h.must_restart()) EMBER_RETURN_IF_ERROR(rdzv->restart_round(round, h.reason));
//   ```
//
// Rounds (Note [Elastic rendezvous] in rendezvous.cc): a round is open until
// MAX nodes have joined, or MIN have and the last-call period has passed
// since the MIN-th joined; then it is complete and its participants are
// ranked in the order they joined. A node that arrives while a round is
// complete waits for the next one (scale-up: health() reports it to the
// participants, which restart the round to admit it). A participant whose
// heartbeat is older than the heartbeat timeout is lost: health() reports it,
// and restart_round() opens the next round for the nodes that are left. Every
// restart counts against the launcher's max_restarts, as in torchrun.
//
// Where the state lives: in the Store the caller gives, which launch serves
// from the launcher on the rendezvous endpoint host (not from a worker), so
// it survives any worker and any other node. If the endpoint host is lost
// the store is gone and every other launcher fails with an error naming the
// endpoint; the state is not replicated (why: in the Note).
//
// Errors: absl::Status; every blocking call has a deadline. DeadlineExceeded
// when a round does not reach MIN nodes within the join timeout (naming the
// run id, the round, how many joined and MIN); FailedPrecondition when the
// rendezvous was closed (naming why); InvalidArgument for bad options.
//
// Thread-safety: an ElasticRendezvous is used by one thread (its launcher's
// monitor loop); any number of processes share one rendezvous.
#ifndef EMBER_DISTRIBUTED_ELASTIC_RENDEZVOUS_H_
#define EMBER_DISTRIBUTED_ELASTIC_RENDEZVOUS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "distributed/store.h"

namespace ember::distributed::elastic {

struct RendezvousOptions {
  std::shared_ptr<Store> store;
  std::string run_id;   // the job (--rdzv_id); keys live under "rdzv/<run_id>/"
  std::string node_id;  // unique per launcher, e.g. "<host>:<pid>"; no ',' ';' or '\n'
  int min_nodes = 1;
  int max_nodes = 1;
  // How long next_round waits for a round with this node to complete
  // (torchrun's join_timeout, 600 s).
  absl::Duration join_timeout = absl::Seconds(600);
  // How long a round with at least MIN nodes stays open for more (torchrun's
  // last_call_timeout, 30 s).
  absl::Duration last_call = absl::Seconds(30);
  // A node whose last heartbeat is older than this is lost (torchrun keeps
  // nodes alive every 5 s and gives up after 3 missed beats).
  absl::Duration heartbeat_timeout = absl::Seconds(15);
  // How often next_round polls the state while it waits.
  absl::Duration poll_interval = absl::Milliseconds(50);
};

// One completed round as this node sees it.
struct RoundInfo {
  int64_t round = 0;
  int node_rank = 0;  // in join order
  int num_nodes = 0;
  std::vector<std::string> nodes;  // node ids by node rank
  // A store prefix for what the round's workers share, e.g.
  // "rdzv/job7/round/3/" (each round's groups start afresh).
  std::string prefix;
};

// What the monitor loop learns about a running round.
struct Health {
  bool round_changed = false;             // another node restarted the round
  std::vector<std::string> lost;          // participants with stale heartbeats
  int waiting = 0;                        // nodes waiting to join (scale-up)
  bool closed = false;
  std::string reason;                     // why the round must restart, in words
  bool must_restart() const { return round_changed || !lost.empty() || waiting > 0; }
};

class ElasticRendezvous {
 public:
  // Checks the options and writes this node's first heartbeat.
  static absl::StatusOr<std::unique_ptr<ElasticRendezvous>> create(RendezvousOptions options);

  // Joins the current round, or the next one when the current one is
  // complete without this node, and returns once it is complete with this
  // node in it. Heartbeats while it waits. Called again while the round it
  // returned is still current, it restarts that round first (asking for a
  // new round ends the old one for everyone, as a restart does).
  absl::StatusOr<RoundInfo> next_round();

  // Records that this node is alive (call at least every heartbeat_timeout / 3).
  absl::Status keep_alive();

  // Whether `round` must be restarted, and why.
  absl::StatusOr<Health> health(const RoundInfo& round);

  // Opens round `round.round + 1` for everyone (a no-op if another node has
  // already moved past `round`). The participants notice through health()
  // and call next_round() again.
  absl::Status restart_round(const RoundInfo& round, const std::string& reason);

  // Ends the rendezvous: every later next_round() (on any node) fails with
  // FailedPrecondition naming `reason`.
  absl::Status close(const std::string& reason);

  const RendezvousOptions& options() const { return options_; }

 private:
  explicit ElasticRendezvous(RendezvousOptions options);
  // True when `node`'s heartbeat counter has not moved for the heartbeat
  // timeout of this process's clock (a node seen the first time is alive).
  bool Lost(const std::string& node);

  // A heartbeat counter's last value and when this process saw it move.
  struct Seen {
    int64_t value = -1;
    absl::Time moved = absl::InfinitePast();
  };

  RendezvousOptions options_;
  std::map<std::string, Seen> seen_;
  std::string prefix_;  // "rdzv/<run_id>/"
  int64_t last_returned_round_ = -1;
};

namespace internal {

// The shared state of a rendezvous, as one value in the store (changed only
// through compare_set, so concurrent launchers never lose an update).
struct State {
  int64_t round = 0;
  bool complete = false;
  int64_t last_call_until_us = 0;  // 0: no last call running
  bool closed = false;
  std::string closed_reason;
  std::vector<std::string> participants;  // join order
  std::vector<std::string> waiting;       // arrived while complete
};
std::string Encode(const State& state);
absl::StatusOr<State> Decode(const std::string& bytes);

}  // namespace internal

}  // namespace ember::distributed::elastic

#endif  // EMBER_DISTRIBUTED_ELASTIC_RENDEZVOUS_H_
