// The lighthouse: the quorum service of a fault-tolerant job (torchft's
// Lighthouse). Replica groups, each training a full copy of the model, ask
// it before every step (or every few: Note [Asking every few steps] in
// parallel/fault_tolerance.h) which groups take part (the quorum);
// they keep themselves known by heartbeat, so a group that died is left out
// of the next quorum instead of being waited for. parallel/fault_tolerance.h
// (the Manager) is its client; tools/lighthouse serves one.
//
//   ```cpp compile-only
//   #include "distributed/elastic/lighthouse.h"
//   namespace elastic = ember::distributed::elastic;
//   EMBER_ASSIGN_OR_RETURN(auto server, elastic::LighthouseServer::create({.min_replicas = 2}));
//   // server->address() ("127.0.0.1:40123") goes to every replica group.
//   EMBER_ASSIGN_OR_RETURN(auto client, elastic::LighthouseClient::create(server->address()));
//   EMBER_ASSIGN_OR_RETURN(elastic::Quorum q,
//                          client->quorum({.replica_id = "a", .address = "h:1", .step = 0},
//                                         absl::Seconds(60)));
//   ```
//
// Note [Forming a quorum]
// A request joins the pending quorum. The quorum is decided, and every
// pending request answered with it, as soon as
//   - at least min_replicas groups are pending, and every group that is
//     alive (a heartbeat or a request within heartbeat_timeout) is pending:
//     nobody else is coming; or
//   - at least min_replicas are pending and join_timeout has passed since
//     the first of them arrived: the others alive are late (slow, stopped)
//     and the step goes on without them.
// Its members are the pending groups, sorted by replica id; its quorum_id
// stays the previous quorum's when the members are the same groups, and is
// the previous one plus one otherwise, so members reconfigure their process
// group exactly when the membership changed. max_step is the most committed
// steps among the members: a member behind it (a replacement) recovers the
// state from one that has it (the Manager's job). A group's request that is
// still pending when its deadline passes fails with kDeadlineExceeded and
// leaves the pending set.
//
// Errors: absl::Status; kInvalidArgument for options or requests that make
// no sense (named), kUnavailable when the server cannot be reached,
// kDeadlineExceeded when no quorum is decided in time, kCancelled
// for a call cancel() ended. Thread-safety:
// LighthouseServer serves any number of concurrent requests;
// LighthouseClient's methods may be called from several threads.
#ifndef EMBER_DISTRIBUTED_ELASTIC_LIGHTHOUSE_H_
#define EMBER_DISTRIBUTED_ELASTIC_LIGHTHOUSE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ember::distributed::elastic {

struct QuorumMember {
  std::string replica_id;
  std::string address;  // the replica group's store, "host:port"
  int64_t step = 0;     // its committed steps
};

struct Quorum {
  int64_t quorum_id = 0;
  std::vector<QuorumMember> members;  // sorted by replica_id
  int64_t max_step = 0;
  // Unique to this decision (1, 2, ...), shared by its members even when
  // quorum_id repeats: what names a process group made afresh.
  int64_t decision = 0;
};

struct LighthouseOptions {
  // "host:port" to listen on; port 0 picks a free one.
  std::string bind = "127.0.0.1:0";
  int min_replicas = 1;
  // Note [Forming a quorum].
  absl::Duration join_timeout = absl::Milliseconds(500);
  absl::Duration heartbeat_timeout = absl::Seconds(1);
};

class LighthouseServer {
 public:
  static absl::StatusOr<std::unique_ptr<LighthouseServer>> create(LighthouseOptions options);
  ~LighthouseServer();  // stops serving; pending requests fail (kUnavailable)
  LighthouseServer(const LighthouseServer&) = delete;
  LighthouseServer& operator=(const LighthouseServer&) = delete;

  // "host:port" with the port chosen.
  const std::string& address() const;
  // Quorums decided so far.
  int64_t quorums_decided() const;

  struct Impl;

 private:
  explicit LighthouseServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

class LighthouseClient {
 public:
  static absl::StatusOr<std::unique_ptr<LighthouseClient>> create(const std::string& address);
  ~LighthouseClient();
  LighthouseClient(const LighthouseClient&) = delete;
  LighthouseClient& operator=(const LighthouseClient&) = delete;

  // Joins the pending quorum; blocks until it is decided or `timeout`.
  absl::StatusOr<Quorum> quorum(const QuorumMember& me, absl::Duration timeout);
  // Tells the lighthouse `replica_id` is alive. `wait_for_ready`: a
  // lighthouse not yet reachable is waited for (up to `timeout`) instead of
  // failing at once.
  absl::Status heartbeat(const std::string& replica_id, absl::Duration timeout,
                         bool wait_for_ready = false);
  // Every call in flight now fails at once with kCancelled (later calls
  // are not affected): a caller giving up on a pending quorum.
  void cancel();

  struct Impl;

 private:
  explicit LighthouseClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ember::distributed::elastic

#endif  // EMBER_DISTRIBUTED_ELASTIC_LIGHTHOUSE_H_
