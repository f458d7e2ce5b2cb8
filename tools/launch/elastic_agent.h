// ElasticAgent: what one launcher does in an elastic job (launch
// --nnodes=MIN:MAX --rdzv_endpoint=HOST:PORT --rdzv_id=JOB), as torchrun's
// agent: meet the other launchers in the rendezvous (distributed/elastic),
// learn this node's rank and the world of each round, serve or find the
// store the round's workers rendezvous through, watch the round while the
// workers run, and restart it when a node is lost, a node waits to join or
// a local worker fails.
//
//   ElasticAgent::create -> loop { NextRound; start workers with its env;
//                                  while running: Check every monitor interval;
//                                  on a reason: stop workers, Restart }
//
// The rendezvous store is served by the launcher on the endpoint host, from
// the launcher process (the first launcher there to bind the port); every
// other launcher connects to it. Each round's workers get a store of their
// own, served by the launcher of node rank 0 of that round on a free port
// (MASTER_ADDR/MASTER_PORT, EMBER_STORE_SERVED_BY_LAUNCHER=1), so nothing a
// previous round wrote is seen by the next.
//
// Errors: absl::Status naming the node, the round and what to do; every
// blocking step has a deadline (the rendezvous's join timeout, the store's
// timeout, the exit barrier's timeout).
//
// Thread-safety: one agent per launcher, used from its supervising thread.
#ifndef EMBER_TOOLS_LAUNCH_ELASTIC_AGENT_H_
#define EMBER_TOOLS_LAUNCH_ELASTIC_AGENT_H_

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "distributed/elastic/rendezvous.h"
#include "distributed/tcp_store.h"

namespace ember::launch {

struct ElasticOptions {
  std::string endpoint_host;  // --rdzv_endpoint's host
  int endpoint_port = 29400;  // ... and port (torchrun's default)
  std::string run_id = "none";
  int min_nodes = 1;
  int max_nodes = 1;
  int nproc_per_node = 1;
  // This node's address as the other nodes reach it (for the round's worker
  // store when this node is rank 0); empty: the host name.
  std::string local_addr;
  // This launcher's name in the rendezvous; empty: "<host name>:<pid>".
  std::string node_id;
  absl::Duration join_timeout = absl::Seconds(600);
  absl::Duration last_call = absl::Seconds(30);
  absl::Duration heartbeat_timeout = absl::Seconds(15);
  absl::Duration exit_barrier_timeout = absl::Seconds(300);
  absl::Duration store_timeout = absl::Seconds(60);
};

// One round as the workers of this node see it.
struct RoundSetup {
  int64_t round = 0;
  int node_rank = 0;
  int num_nodes = 0;
  int world_size = 0;  // num_nodes * nproc_per_node
  std::string master_addr;
  int master_port = 0;
  // What each worker's environment gets besides the usual rank variables:
  // TORCHELASTIC_RUN_ID, TORCHELASTIC_RDZV_ROUND (Ember's name for the round),
  // EMBER_STORE_SERVED_BY_LAUNCHER.
  std::map<std::string, std::string> env;
};

// Why a running round must end.
struct RoundChange {
  std::string reason;
  // Only nodes waiting to join (scale-up): torchrun does not count such a
  // restart against --max_restarts.
  bool membership_only = false;
};

class ElasticAgent {
 public:
  static absl::StatusOr<std::unique_ptr<ElasticAgent>> create(ElasticOptions options);
  ~ElasticAgent();

  // Joins the next round (see ElasticRendezvous::next_round).
  absl::StatusOr<RoundSetup> NextRound();
  // While the round's workers run: a heartbeat, and why the round must
  // restart (a node lost, a node waiting, another node restarted it or
  // closed the rendezvous), or nullopt.
  absl::StatusOr<std::optional<RoundChange>> Check();
  // Ends the round for every node (this node's workers failed, or Check gave
  // a reason).
  absl::Status Restart(const std::string& reason);
  // This node's workers all succeeded: waits (bounded, heartbeating) until
  // every node of the round has said so, then closes the rendezvous.
  absl::Status Succeeded();
  // The job gives up (no restarts left): closes the rendezvous so that the
  // other nodes stop too, naming `reason`.
  void Failed(const std::string& reason);

  const std::string& node_id() const { return node_id_; }
  bool serves_endpoint() const { return endpoint_server_ != nullptr; }

 private:
  ElasticAgent(ElasticOptions options, std::string node_id)
      : options_(std::move(options)), node_id_(std::move(node_id)) {}

  ElasticOptions options_;
  std::string node_id_;
  std::unique_ptr<distributed::TcpStoreServer> endpoint_server_;  // on the endpoint host
  std::shared_ptr<distributed::Store> store_;
  std::unique_ptr<distributed::elastic::ElasticRendezvous> rdzv_;
  std::optional<distributed::elastic::RoundInfo> round_;
  std::unique_ptr<distributed::TcpStoreServer> round_server_;  // node rank 0's worker store
};

}  // namespace ember::launch

#endif  // EMBER_TOOLS_LAUNCH_ELASTIC_AGENT_H_
