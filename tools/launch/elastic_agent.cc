#include "tools/launch/elastic_agent.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <set>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "tensor/status_macros.h"

namespace ember::launch {

namespace {

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

std::string Numeric(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (sa->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, buf, sizeof(buf));
  } else if (sa->sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, buf, sizeof(buf));
  }
  return buf;
}

// Whether `host` names this machine: one of its interfaces' addresses.
bool IsLocal(const std::string& host) {
  std::set<std::string> mine;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) == 0) {
    for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
      if (a->ifa_addr != nullptr) mine.insert(Numeric(a->ifa_addr));
    }
    freeifaddrs(list);
  }
  addrinfo hints = {};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0) return false;
  bool local = false;
  for (addrinfo* a = found; a != nullptr && !local; a = a->ai_next) {
    local = mine.contains(Numeric(a->ai_addr));
  }
  freeaddrinfo(found);
  return local;
}

// Whether a listening socket could bind `port` on every address now (so
// that a launcher that cannot serve finds out before it starts serving).
bool PortFree(int port) {
  int fd = socket(AF_INET6, SOCK_STREAM, 0);
  if (fd < 0) return false;
  int yes = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  sockaddr_in6 addr = {};
  addr.sin6_family = AF_INET6;
  addr.sin6_addr = in6addr_any;
  addr.sin6_port = htons(static_cast<uint16_t>(port));
  const bool free = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return free;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ElasticAgent>> ElasticAgent::create(ElasticOptions options) {
  const std::string endpoint = absl::StrCat(options.endpoint_host, ":", options.endpoint_port);
  std::string node_id =
      options.node_id.empty() ? absl::StrCat(HostName(), ":", getpid()) : options.node_id;
  auto agent = std::unique_ptr<ElasticAgent>(new ElasticAgent(std::move(options), node_id));
  const ElasticOptions& o = agent->options_;
  if (IsLocal(o.endpoint_host) && PortFree(o.endpoint_port)) {
    // The first launcher on the endpoint host serves the rendezvous; a
    // second one there finds the port taken and joins as a client.
    absl::StatusOr<std::unique_ptr<distributed::TcpStoreServer>> server =
        distributed::TcpStoreServer::start({.port = o.endpoint_port});
    if (server.ok()) agent->endpoint_server_ = std::move(*server);
  }
  absl::StatusOr<std::unique_ptr<distributed::TcpStore>> store = distributed::TcpStore::create(
      {.host = o.endpoint_host, .port = o.endpoint_port, .timeout = o.store_timeout});
  if (!store.ok()) {
    return absl::UnavailableError(absl::StrCat(
        "node ", node_id, ": cannot reach the rendezvous endpoint ", endpoint, " within ",
        absl::FormatDuration(o.store_timeout), " (", store.status().message(),
        "); the launcher on the endpoint host serves it: start it, or check --rdzv_endpoint"));
  }
  agent->store_ = std::shared_ptr<distributed::Store>(std::move(*store));
  EMBER_ASSIGN_OR_RETURN(agent->rdzv_, distributed::elastic::ElasticRendezvous::create(
                                           {.store = agent->store_,
                                            .run_id = o.run_id,
                                            .node_id = node_id,
                                            .min_nodes = o.min_nodes,
                                            .max_nodes = o.max_nodes,
                                            .join_timeout = o.join_timeout,
                                            .last_call = o.last_call,
                                            .heartbeat_timeout = o.heartbeat_timeout}));
  return agent;
}

ElasticAgent::~ElasticAgent() = default;

absl::StatusOr<RoundSetup> ElasticAgent::NextRound() {
  round_server_.reset();  // the previous round's worker store
  EMBER_ASSIGN_OR_RETURN(distributed::elastic::RoundInfo info, rdzv_->next_round());
  round_ = info;
  RoundSetup setup;
  setup.round = info.round;
  setup.node_rank = info.node_rank;
  setup.num_nodes = info.num_nodes;
  setup.world_size = info.num_nodes * options_.nproc_per_node;
  const std::string key = absl::StrCat(info.prefix, "master");
  if (info.node_rank == 0) {
    EMBER_ASSIGN_OR_RETURN(round_server_, distributed::TcpStoreServer::start({.port = 0}));
    setup.master_addr = options_.local_addr.empty() ? HostName() : options_.local_addr;
    setup.master_port = round_server_->port();
    EMBER_RETURN_IF_ERROR(
        store_->set(key, absl::StrCat(setup.master_addr, " ", setup.master_port)));
  } else {
    absl::StatusOr<std::string> master = store_->get(key, options_.store_timeout);
    if (!master.ok()) {
      return absl::Status(master.status().code(),
                          absl::StrCat("node ", node_id_, ", round ", info.round,
                                       ": node rank 0 (", info.nodes[0],
                                       ") did not publish its worker store: ",
                                       master.status().message()));
    }
    std::vector<std::string> parts = absl::StrSplit(*master, ' ');
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[1], &setup.master_port)) {
      return absl::DataLossError(absl::StrCat("round ", info.round, ": bad worker store address '",
                                              *master, "' under ", key));
    }
    setup.master_addr = parts[0];
  }
  setup.env["TORCHELASTIC_RUN_ID"] = options_.run_id;
  setup.env["EMBER_RDZV_ROUND"] = std::to_string(info.round);
  setup.env["EMBER_STORE_SERVED_BY_LAUNCHER"] = "1";
  return setup;
}

absl::StatusOr<std::optional<RoundChange>> ElasticAgent::Check() {
  if (!round_) return absl::FailedPreconditionError("Check before NextRound");
  EMBER_RETURN_IF_ERROR(rdzv_->keep_alive());
  EMBER_ASSIGN_OR_RETURN(distributed::elastic::Health h, rdzv_->health(*round_));
  if (h.closed) return RoundChange{.reason = "the rendezvous was closed by another node"};
  if (h.must_restart()) {
    return RoundChange{.reason = absl::StrCat("round ", round_->round, ": ", h.reason),
                       .membership_only = !h.round_changed && h.lost.empty()};
  }
  return std::optional<RoundChange>();
}

absl::Status ElasticAgent::Restart(const std::string& reason) {
  if (!round_) return absl::OkStatus();
  return rdzv_->restart_round(*round_, absl::StrCat(node_id_, ": ", reason));
}

absl::Status ElasticAgent::Succeeded() {
  if (!round_) return absl::OkStatus();
  const std::string key = absl::StrCat(round_->prefix, "done");
  EMBER_ASSIGN_OR_RETURN(int64_t done, store_->add(key, 1));
  const absl::Time give_up = absl::Now() + options_.exit_barrier_timeout;
  while (done < round_->num_nodes) {
    if (absl::Now() >= give_up) {
      return absl::DeadlineExceededError(absl::StrCat(
          "node ", node_id_, ": this node's workers finished round ", round_->round, ", but only ",
          done, " of ", round_->num_nodes, " nodes did within ",
          absl::FormatDuration(options_.exit_barrier_timeout)));
    }
    EMBER_RETURN_IF_ERROR(rdzv_->keep_alive());
    EMBER_ASSIGN_OR_RETURN(distributed::elastic::Health h, rdzv_->health(*round_));
    if (h.round_changed) {
      return absl::AbortedError(absl::StrCat("node ", node_id_, ": round ", round_->round,
                                             " was restarted after this node's workers finished"));
    }
    absl::SleepFor(absl::Milliseconds(100));
    EMBER_ASSIGN_OR_RETURN(done, store_->add(key, 0));
  }
  if (round_->node_rank == 0) (void)rdzv_->close("the job finished");
  // The launcher that serves the endpoint leaves last: its store goes with
  // it, and the others may still be reading it to leave the barrier.
  const std::string left = absl::StrCat(round_->prefix, "left");
  absl::StatusOr<int64_t> gone = store_->add(left, 1);
  while (serves_endpoint() && gone.ok() && *gone < round_->num_nodes &&
         absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(50));
    gone = store_->add(left, 0);
  }
  return absl::OkStatus();
}

void ElasticAgent::Failed(const std::string& reason) {
  (void)rdzv_->close(absl::StrCat("node ", node_id_, " gave up: ", reason));
}

}  // namespace ember::launch
