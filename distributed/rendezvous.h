// Rendezvous: how the processes of a job find each other and agree on a Store,
// their ranks and the world size (torch.distributed's init_method).
//
//   ```cpp compile-only
//   #include "distributed/rendezvous.h"
//   int my_rank = 0;  // 0..3, one per process
//   ember::distributed::RendezvousOptions options;
//   options.init_method = "tcp://10.0.0.1:29500";
//   options.world_size = 4;
//   options.rank = my_rank;
//   EMBER_ASSIGN_OR_RETURN(ember::distributed::RendezvousResult r,
//                          ember::distributed::rendezvous(options));
//   // r.store is shared by all ranks of the job; r.rank, r.world_size.
//   ```
//
// Init methods (as torch.distributed documents them):
//   env://                 MASTER_ADDR, MASTER_PORT, WORLD_SIZE and RANK from
//                          the environment (options may give the last two;
//                          rank 0 serves the TcpStore unless
//                          EMBER_STORE_SERVED_BY_LAUNCHER=1 (set by
//                          `launch --serve_store`) or
//                          TORCHELASTIC_USE_AGENT_STORE=True with MASTER_ADDR
//                          set (torchrun's agent): the launcher serves it
//                          then, and every rank connects).
//   tcp://host:port        rank 0 serves a TCP store on port; explicit ranks.
//   tcp://<multicast>:port ranks are assigned in the order processes arrive;
//                          group_name lets several jobs share the address.
//   file:///path           a FileStore on a file every rank can reach (NFS
//                          works); group_name keeps jobs apart within one file.
//                          Without a rank, ranks are assigned in the order
//                          processes arrive (0 first); every process of a job
//                          then passes none, or every one passes its own.
//
// Rendezvous blocks until every rank has joined or options.timeout passes.
//
// Errors (absl::Status), all reported before any network I/O where the
// mistake is in the arguments:
//   kInvalidArgument    - an unknown scheme, a malformed URL, a query field
//                         given twice, a missing or contradictory value
//                         (names the variable: WORLD_SIZE, RANK, MASTER_ADDR,
//                         MASTER_PORT, world_size, rank), world_size < 1,
//                         rank outside [0, world_size) (a negative one too,
//                         from the URL, the environment or the options), a
//                         number that does not fit an int; for file:// ranks
//                         by arrival, more processes than world_size ("this
//                         process arrived as number N+1"), or some processes
//                         of a job giving a rank and others none.
//   kUnavailable        - rank 0 cannot serve (the message names the port in
//                         use), or the store cannot be reached.
//   kDeadlineExceeded   - not every rank joined in time: "k of N ranks joined".
//
// Thread-safety: Rendezvous may be called from several threads at once (ranks
// as threads), each with its own options.
#ifndef EMBER_DISTRIBUTED_RENDEZVOUS_H_
#define EMBER_DISTRIBUTED_RENDEZVOUS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "distributed/store.h"

namespace ember::distributed {

struct RendezvousOptions {
  std::string init_method =
      "env://";         // tcp://host:port, tcp://<multicast>:port, file:///path, env://
  int world_size = -1;  // -1: from the URL/env; other values are checked
  int rank = -1;        // -1: from the URL/env, or assigned (multicast, file://)
  std::string group_name;
  absl::Duration timeout = kDefaultStoreTimeout;
};

struct RendezvousResult {
  std::shared_ptr<Store> store;  // shared by all ranks of the job
  int rank;
  int world_size;
};

// Joins the job described by `options`; see the file comment.
absl::StatusOr<RendezvousResult> rendezvous(const RendezvousOptions& options);

}  // namespace ember::distributed

#endif  // EMBER_DISTRIBUTED_RENDEZVOUS_H_
