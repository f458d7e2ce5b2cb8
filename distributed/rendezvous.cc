#include "distributed/rendezvous.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "distributed/file_store.h"
#include "distributed/prefix_store.h"
#include "distributed/tcp_store.h"
#include "tensor/status_macros.h"

// Note [Rendezvous protocol]
// Every init method ends in the same join on the job's store (under
// "<group_name>/" when a group name is given):
//   1. claim "rendezvous/rank/<r>" with CompareSet and a random token; a
//      different token there means two processes were given the same rank;
//   2. agree on "rendezvous/world_size" with CompareSet, so ranks started
//      with different world sizes fail instead of waiting for each other;
//   3. Add 1 to "rendezvous/joined"; the rank that brings it to world_size
//      sets "rendezvous/complete", which every rank waits for.
// PyTorch ranks (env://, tcp://) take none of these steps: they count
// themselves in at the TcpStore's "init/" instead (a client as it connects,
// a serving rank 0 before it waits for the others). So over a TCP store
// every Ember rank counts in there too (clients as they connect, the
// serving rank in step 3), and step 3 also ends once "init/" counts
// world_size: a job whose other ranks are PyTorch processes. Steps 1 and 2
// still check the Ember ranks among themselves. A store served by a
// launcher keeps to step 3's own count ("init/" may count its agents).
// A timeout in step 3 reads the counter and the rank claims to report
// "k of N ranks joined" and which ranks are missing. The rank that serves the
// store keeps serving for a short linger after its own timeout, so that the
// ranks that started a moment later still read the count from it and report
// the same timeout, rather than a vanished server.
//
// file:// without a rank ranks by arrival: before step 1, each process adds
// 1 to "rendezvous/arrivals" (the FileStore's add is one locked
// read-modify-write of the file, so concurrent processes each get their own
// number) and takes rank number - 1; a number above world_size is an error at
// once, not a wait. "rendezvous/ranks_by" (CompareSet to "arrival" or
// "given") makes a job whose processes mix both ways fail instead of two
// processes landing on one rank.
//
// Everything a caller can get wrong (the URL, variables, world size, rank)
// is checked before the first socket or file is opened.
//
// Multicast (tcp://224.0.0.0/4 addresses): each process announces itself on
// the group by UDP every 50 ms with a random token, its group_name, world
// size and any rank it asked for, and listens to the others. Once it has
// heard world_size processes of its group it can rank them all the same way:
// requested ranks first, then the rest by token order. Rank 0 then serves a
// TcpStore on a free port and adds the port to its announcements; the others
// connect to the address those announcements came from. Announcing goes on
// until the join completes, so a process that starts late still hears
// everyone.

namespace ember::distributed {
namespace {

constexpr absl::Duration kAnnounceEvery = absl::Milliseconds(50);
constexpr char kAnnounceMagic[] = "ember-rendezvous-1";
// Set to 1 by `launch --serve_store`: the launcher serves the TcpStore, so
// rank 0 connects to it like every other rank.
constexpr char kServedByLauncherEnv[] = "EMBER_STORE_SERVED_BY_LAUNCHER";
// Set to True by torchrun's agent (and `launch --serve_store`), which then
// serves the store at MASTER_ADDR:MASTER_PORT.
constexpr char kAgentStoreEnv[] = "TORCHELASTIC_USE_AGENT_STORE";

std::string RandomToken() {
  std::random_device device;
  return absl::StrFormat("%08x%08x%08x-%d", device(), device(), device(), getpid());
}

absl::Status Invalid(const RendezvousOptions& options, std::string_view problem) {
  return absl::InvalidArgumentError(
      absl::StrCat("init_method '", options.init_method, "': ", std::string(problem)));
}

// An integer value named `name` (an environment variable or query field).
absl::StatusOr<int> ParseInt(const RendezvousOptions& options, std::string_view name,
                             std::string_view text) {
  const absl::string_view digits(text.data(), text.size());
  int value = 0;
  if (absl::SimpleAtoi(digits, &value)) return value;
  int64_t wide = 0;
  if (absl::SimpleAtoi(digits, &wide)) {
    return Invalid(options, absl::StrCat(std::string(name), "=", wide, " is out of range (at most ",
                                         std::numeric_limits<int>::max(), ")"));
  }
  return Invalid(options,
                 absl::StrCat(std::string(name), "='", std::string(text), "' is not an integer"));
}

// A rank or world size, if one was given, and the name it was given under
// (an option, a query field or an environment variable), for messages.
struct Given {
  std::optional<int> value;
  std::string name;
};

// What the options say: -1 (the default) is "not given"; any other value is
// given, and checked later like a value from the URL or the environment.
Given FromOptions(int value, std::string_view name) {
  return Given{value == -1 ? std::nullopt : std::optional<int>(value), std::string(name)};
}

// Combines `first` with a value found in the URL or the environment under
// `source_name`; disagreeing values are an error.
absl::StatusOr<Given> Merge(const RendezvousOptions& options, const Given& first,
                            std::string_view source_name, std::optional<int> from_source) {
  if (first.value.has_value() && from_source.has_value() && *from_source != *first.value) {
    return Invalid(options, absl::StrCat(std::string(source_name), "=", *from_source,
                                         " contradicts ", first.name, "=", *first.value,
                                         "; give one value, or the same in both places"));
  }
  if (first.value.has_value()) return first;
  return Given{from_source, std::string(source_name)};
}

// What the URL and environment say, checked, before any I/O.
struct Plan {
  enum class Kind { kTcp, kMulticast, kFile } kind;
  std::string host;  // kTcp, kMulticast
  int port = 0;      // kTcp, kMulticast
  std::string path;  // kFile
  int rank = -1;     // -1: to be assigned (multicast)
  int world_size = -1;
  std::string where;              // for messages: "tcp://host:port", "file:///path"
  bool served_elsewhere = false;  // env:// under `launch --serve_store`
};

// Checks the rank and world size and puts them in `plan`. `rank_name` and
// `world_size_name` are what to set when a value is missing.
absl::Status CheckRankAndWorldSize(const RendezvousOptions& options, const Given& rank,
                                   const Given& world_size, bool rank_may_be_assigned,
                                   std::string_view rank_name, std::string_view world_size_name,
                                   Plan& plan) {
  if (!world_size.value.has_value()) {
    return Invalid(options,
                   absl::StrCat("the world size is missing; set ", std::string(world_size_name)));
  }
  if (*world_size.value < 1) {
    return Invalid(options, absl::StrCat(world_size.name, "=", *world_size.value,
                                         ": the world size must be at least 1"));
  }
  if (!rank.value.has_value() && !rank_may_be_assigned) {
    return Invalid(options, absl::StrCat("the rank is missing; set ", std::string(rank_name)));
  }
  if (rank.value.has_value() && (*rank.value < 0 || *rank.value >= *world_size.value)) {
    return Invalid(options, absl::StrCat(rank.name, "=", *rank.value, " is not in [0, ",
                                         world_size.name, "=", *world_size.value, ")"));
  }
  plan.world_size = *world_size.value;
  plan.rank = rank.value.value_or(-1);
  return absl::OkStatus();
}

absl::StatusOr<int> ParsePort(const RendezvousOptions& options, std::string_view name,
                              std::string_view text) {
  EMBER_ASSIGN_OR_RETURN(int port, ParseInt(options, name, text));
  if (port < 1 || port > 65535) {
    return Invalid(options,
                   absl::StrCat(std::string(name), "=", port, " is not a port in [1, 65535]"));
  }
  return port;
}

// An IPv4 (224.0.0.0/4) or IPv6 (ff00::/8) multicast group address.
bool IsMulticast(const std::string& host) {
  in_addr v4;
  in6_addr v6;
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return IN_MULTICAST(ntohl(v4.s_addr));
  return inet_pton(AF_INET6, host.c_str(), &v6) == 1 && IN6_IS_ADDR_MULTICAST(&v6);
}

// "host:port" or "[v6]:port" into its parts.
absl::Status SplitHostPort(const RendezvousOptions& options, std::string_view authority,
                           Plan& plan) {
  size_t colon = authority.rfind(':');
  if (colon == std::string_view::npos || colon == 0) {
    return Invalid(options, "expected tcp://host:port (for example tcp://10.0.0.1:29500)");
  }
  std::string_view host = authority.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  if (host.empty()) return Invalid(options, "the host is empty; expected tcp://host:port");
  plan.host = std::string(host);
  EMBER_ASSIGN_OR_RETURN(plan.port, ParsePort(options, "port", authority.substr(colon + 1)));
  return absl::OkStatus();
}

absl::StatusOr<Plan> MakePlan(const RendezvousOptions& options) {
  const std::string& url = options.init_method;
  size_t scheme_end = url.find("://");
  if (scheme_end == std::string::npos) {
    return Invalid(options, "not a URL; use env://, tcp://host:port or file:///path");
  }
  std::string scheme = url.substr(0, scheme_end);
  std::string_view rest = std::string_view(url).substr(scheme_end + 3);
  // Query fields rank= and world_size= (as torch.distributed accepts them),
  // each at most once.
  std::optional<int> query_rank, query_world_size;
  if (size_t q = rest.find('?'); q != std::string_view::npos) {
    std::map<std::string, std::string> seen;
    for (absl::string_view field : absl::StrSplit(
             absl::string_view(rest.data() + q + 1, rest.size() - q - 1), '&', absl::SkipEmpty())) {
      std::pair<std::string, std::string> kv = absl::StrSplit(field, absl::MaxSplits('=', 1));
      if (auto [it, fresh] = seen.emplace(kv.first, kv.second); !fresh) {
        return Invalid(options, absl::StrCat("query field '", kv.first, "' is given twice (",
                                             kv.first, "=", it->second, ", then ", kv.first, "=",
                                             kv.second, "); give it once"));
      }
      if (kv.first == "rank") {
        EMBER_ASSIGN_OR_RETURN(query_rank, ParseInt(options, "rank", kv.second));
      } else if (kv.first == "world_size") {
        EMBER_ASSIGN_OR_RETURN(query_world_size, ParseInt(options, "world_size", kv.second));
      } else {
        return Invalid(options, absl::StrCat("unknown query field '", kv.first,
                                             "'; only rank and world_size"));
      }
    }
    rest = rest.substr(0, q);
  }
  // The options and the URL's query together; they must agree.
  EMBER_ASSIGN_OR_RETURN(Given given_world_size,
                         Merge(options, FromOptions(options.world_size, "world_size"), "world_size",
                               query_world_size));
  EMBER_ASSIGN_OR_RETURN(Given given_rank,
                         Merge(options, FromOptions(options.rank, "rank"), "rank", query_rank));
  Plan plan;
  if (scheme == "env") {
    if (!rest.empty())
      return Invalid(options, "env:// takes nothing after the scheme but ?rank=&world_size=");
    auto env = [](const char* name) -> std::optional<std::string> {
      const char* value = std::getenv(name);
      if (value == nullptr || *value == '\0') return std::nullopt;
      return std::string(value);
    };
    std::optional<std::string> addr = env("MASTER_ADDR"), port = env("MASTER_PORT");
    std::optional<std::string> world = env("WORLD_SIZE"), rank = env("RANK");
    // Rank 0 serves the store itself, so it may leave MASTER_ADDR unset (as
    // torch documents) and reaches its own store over loopback.
    const bool rank_zero = rank ? *rank == "0" : given_rank.value == 0;
    if (!addr && !rank_zero)
      return Invalid(options,
                     "environment variable MASTER_ADDR is not set (the address of rank 0; only "
                     "rank 0 may leave it unset)");
    if (!port)
      return Invalid(options,
                     "environment variable MASTER_PORT is not set (a free port on rank 0)");
    std::optional<int> env_world, env_rank;
    if (world) {
      EMBER_ASSIGN_OR_RETURN(env_world, ParseInt(options, "WORLD_SIZE", *world));
    }
    if (rank) {
      EMBER_ASSIGN_OR_RETURN(env_rank, ParseInt(options, "RANK", *rank));
    }
    if (!world && !given_world_size.value) {
      return Invalid(options,
                     "environment variable WORLD_SIZE is not set (and no world_size was given)");
    }
    if (!rank && !given_rank.value) {
      return Invalid(options, "environment variable RANK is not set (and no rank was given)");
    }
    plan.kind = Plan::Kind::kTcp;
    plan.host = addr.value_or("127.0.0.1");
    EMBER_ASSIGN_OR_RETURN(plan.port, ParsePort(options, "MASTER_PORT", *port));
    EMBER_ASSIGN_OR_RETURN(Given world_size,
                           Merge(options, given_world_size, "WORLD_SIZE", env_world));
    EMBER_ASSIGN_OR_RETURN(Given rank_given, Merge(options, given_rank, "RANK", env_rank));
    plan.where = absl::StrCat("env:// (MASTER_ADDR=", addr.value_or("unset, rank 0"),
                              " MASTER_PORT=", plan.port, ")");
    // Under torchrun (or `launch --serve_store`) the agent serves the store
    // at MASTER_ADDR:MASTER_PORT: TORCHELASTIC_USE_AGENT_STORE=True, as
    // PyTorch reads it.
    plan.served_elsewhere = env(kServedByLauncherEnv).value_or("0") == "1" ||
                            (addr.has_value() && env(kAgentStoreEnv).value_or("") == "True");
    EMBER_RETURN_IF_ERROR(
        CheckRankAndWorldSize(options, rank_given, world_size, false, "RANK", "WORLD_SIZE", plan));
    return plan;
  }
  if (scheme == "tcp") {
    EMBER_RETURN_IF_ERROR(SplitHostPort(options, rest, plan));
    plan.kind = IsMulticast(plan.host) ? Plan::Kind::kMulticast : Plan::Kind::kTcp;
    plan.where = absl::StrCat("tcp://", std::string(rest));
    EMBER_RETURN_IF_ERROR(CheckRankAndWorldSize(options, given_rank, given_world_size,
                                                plan.kind == Plan::Kind::kMulticast, "rank",
                                                "world_size", plan));
    return plan;
  }
  if (scheme == "file") {
    if (rest.empty())
      return Invalid(options, "the path is empty; expected file:///path/to/shared/file");
    plan.kind = Plan::Kind::kFile;
    plan.path = std::string(rest);
    plan.where = "file://" + plan.path;
    // Without a rank, ranks go by arrival (Note [Rendezvous protocol]).
    EMBER_RETURN_IF_ERROR(CheckRankAndWorldSize(options, given_rank, given_world_size, true,
                                                "rank", "world_size", plan));
    return plan;
  }
  return Invalid(options, absl::StrCat("unknown scheme '", scheme,
                                       "'; use env://, tcp://host:port or file:///path"));
}

absl::Duration Remaining(absl::Time deadline) {
  return std::max(deadline - absl::Now(), absl::ZeroDuration());
}

// How long the serving rank keeps its store up after its join timed out (Note
// [Rendezvous protocol]): at most a second, and never longer than the timeout.
absl::Status LingerIfServing(absl::Status join, bool serving, absl::Duration timeout) {
  if (serving && join.code() == absl::StatusCode::kDeadlineExceeded) {
    absl::SleepFor(std::min(timeout, absl::Seconds(1)));
  }
  return join;
}

// See Note [Rendezvous protocol].
// `workers`, for a TCP store (env://, tcp://), is the job's TcpStore itself,
// outside any group prefix, where PyTorch ranks count themselves in; `serving`
// says this rank serves it.
absl::Status Join(Store& store, Plan& plan, const RendezvousOptions& options, absl::Time deadline,
                  TcpStore* workers = nullptr, bool serving = false) {
  const std::string token = RandomToken();
  if (plan.kind == Plan::Kind::kFile) {
    // Step 0 for file://: every process of the job ranks itself the same way.
    const std::string mode = plan.rank < 0 ? "arrival" : "given";
    EMBER_ASSIGN_OR_RETURN(std::string agreed_mode,
                           store.compare_set("rendezvous/ranks_by", "", mode));
    if (agreed_mode != mode) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rendezvous at ", plan.where, ": ",
          plan.rank < 0 ? "this process gave no rank, but another gave one"
                        : absl::StrCat("this process gave rank ", plan.rank,
                                       ", but another gave none"),
          "; give every process of the job its rank, or none (ranks then go by arrival)"));
    }
  }
  if (plan.rank < 0) {
    // The store's add is atomic across processes: each arrival gets its own
    // number, 1, 2, ...
    EMBER_ASSIGN_OR_RETURN(int64_t arrival, store.add("rendezvous/arrivals", 1));
    if (arrival > plan.world_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rendezvous at ", plan.where, ": this process arrived as number ", arrival,
          ", but world_size is ", plan.world_size,
          ": more processes joined than the job has ranks; start world_size processes, give "
          "each job its own file or group_name, or, if an earlier job crashed, delete ",
          plan.path));
    }
    plan.rank = static_cast<int>(arrival - 1);
  }
  const std::string rank_key = absl::StrCat("rendezvous/rank/", plan.rank);
  EMBER_ASSIGN_OR_RETURN(std::string holder, store.compare_set(rank_key, "", token));
  if (holder != token) {
    return absl::InvalidArgumentError(
        absl::StrCat("rendezvous at ", plan.where, ": rank ", plan.rank,
                     " joined twice; give every process its own rank",
                     plan.kind == Plan::Kind::kFile
                         ? " (or, if an earlier job crashed, delete " + plan.path + ")"
                         : ""));
  }
  std::string world = std::to_string(plan.world_size);
  EMBER_ASSIGN_OR_RETURN(std::string agreed, store.compare_set("rendezvous/world_size", "", world));
  if (agreed != world) {
    return absl::InvalidArgumentError(
        absl::StrCat("rendezvous at ", plan.where, ": rank ", plan.rank, " has world_size ",
                     plan.world_size, " but another rank joined with world_size ", agreed));
  }
  // The serving rank counts itself in at "init/" as a PyTorch rank 0 does
  // (its clients did when they connected).
  if (workers != nullptr && serving) EMBER_RETURN_IF_ERROR(workers->add_to_worker_count(1).status());
  EMBER_ASSIGN_OR_RETURN(int64_t joined, store.add("rendezvous/joined", 1));
  if (joined == plan.world_size) EMBER_RETURN_IF_ERROR(store.set("rendezvous/complete", "1"));
  absl::Status done;
  if (workers == nullptr) {
    done = store.wait({"rendezvous/complete"}, Remaining(deadline));
  } else {
    // Step 3 with PyTorch ranks: they never add to "rendezvous/joined", but
    // every rank of the job counts itself in at "init/".
    absl::Duration pause = absl::Microseconds(500);
    for (;;) {
      EMBER_ASSIGN_OR_RETURN(bool complete, store.check({"rendezvous/complete"}));
      if (complete) return absl::OkStatus();
      EMBER_ASSIGN_OR_RETURN(int64_t counted, workers->add_to_worker_count(0));
      if (counted >= plan.world_size) return absl::OkStatus();
      if (absl::Now() >= deadline) {
        done = absl::DeadlineExceededError("timed out");
        break;
      }
      absl::SleepFor(std::min(pause, Remaining(deadline)));
      pause = std::min(pause * 2, absl::Milliseconds(20));
    }
  }
  if (done.code() != absl::StatusCode::kDeadlineExceeded) return done;
  int64_t count = store.add("rendezvous/joined", 0).value_or(-1);
  std::vector<int> missing;
  for (int r = 0; r < plan.world_size && r < 256; ++r) {
    if (!store.get(absl::StrCat("rendezvous/rank/", r), absl::ZeroDuration()).ok())
      missing.push_back(r);
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "rendezvous at ", plan.where, ": ", count, " of ", plan.world_size, " ranks joined within ",
      absl::FormatDuration(options.timeout), "; missing ranks: ", absl::StrJoin(missing, ", ")));
}

// A UDP socket on a multicast group, IPv4 or IPv6 (the group's address
// says which); see Note [Rendezvous protocol].
class MulticastChannel {
 public:
  static absl::StatusOr<std::unique_ptr<MulticastChannel>> Open(const Plan& plan) {
    auto fail = [&](std::string_view what) {
      return absl::UnavailableError(absl::StrCat("multicast rendezvous on ", plan.where, ": ",
                                                 std::string(what), " failed: ", strerror(errno),
                                                 " (does this host have a multicast route?)"));
    };
    in6_addr v6 = {};
    const bool ipv6 = inet_pton(AF_INET6, plan.host.c_str(), &v6) == 1;
    int fd = socket(ipv6 ? AF_INET6 : AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return fail("socket");
    auto channel = std::unique_ptr<MulticastChannel>(new MulticastChannel(fd));
    channel->where_ = plan.where;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one));
    if (ipv6) {
      sockaddr_in6 bind_addr = {};
      bind_addr.sin6_family = AF_INET6;
      bind_addr.sin6_port = htons(plan.port);
      bind_addr.sin6_addr = in6addr_any;
      if (bind(fd, reinterpret_cast<sockaddr*>(&bind_addr), sizeof(bind_addr)) != 0)
        return fail("bind");
      ipv6_mreq membership = {};
      membership.ipv6mr_multiaddr = v6;
      membership.ipv6mr_interface = 0;  // the interface of the default route
      if (setsockopt(fd, IPPROTO_IPV6, IPV6_JOIN_GROUP, &membership, sizeof(membership)) != 0) {
        return fail("joining the group");
      }
      int loop = 1, hops = 1;
      setsockopt(fd, IPPROTO_IPV6, IPV6_MULTICAST_LOOP, &loop, sizeof(loop));
      setsockopt(fd, IPPROTO_IPV6, IPV6_MULTICAST_HOPS, &hops, sizeof(hops));
      bind_addr.sin6_addr = v6;
      std::memcpy(&channel->group_, &bind_addr, sizeof(bind_addr));
      channel->group_len_ = sizeof(bind_addr);
      return channel;
    }
    sockaddr_in bind_addr = {};
    bind_addr.sin_family = AF_INET;
    bind_addr.sin_port = htons(plan.port);
    bind_addr.sin_addr.s_addr = htonl(INADDR_ANY);
    if (bind(fd, reinterpret_cast<sockaddr*>(&bind_addr), sizeof(bind_addr)) != 0)
      return fail("bind");
    ip_mreq membership = {};
    inet_pton(AF_INET, plan.host.c_str(), &membership.imr_multiaddr);
    membership.imr_interface.s_addr = htonl(INADDR_ANY);
    if (setsockopt(fd, IPPROTO_IP, IP_ADD_MEMBERSHIP, &membership, sizeof(membership)) != 0) {
      return fail("joining the group");
    }
    unsigned char loop = 1, ttl = 1;
    setsockopt(fd, IPPROTO_IP, IP_MULTICAST_LOOP, &loop, sizeof(loop));
    setsockopt(fd, IPPROTO_IP, IP_MULTICAST_TTL, &ttl, sizeof(ttl));
    bind_addr.sin_addr = membership.imr_multiaddr;
    std::memcpy(&channel->group_, &bind_addr, sizeof(bind_addr));
    channel->group_len_ = sizeof(bind_addr);
    return channel;
  }
  ~MulticastChannel() { close(fd_); }

  absl::Status Send(const std::string& message) {
    if (sendto(fd_, message.data(), message.size(), 0, reinterpret_cast<const sockaddr*>(&group_),
               group_len_) < 0) {
      return absl::UnavailableError(absl::StrCat("multicast rendezvous on ", where_,
                                                 ": sending failed: ", strerror(errno),
                                                 " (does this host have a multicast route?)"));
    }
    return absl::OkStatus();
  }

  // One datagram and its sender's address (the numeric IPv4 or IPv6
  // address the others connect to), or nullopt after `wait`.
  std::optional<std::pair<std::string, std::string>> Receive(absl::Duration wait) {
    pollfd p = {fd_, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(wait))) <= 0) return std::nullopt;
    char buffer[2048];
    sockaddr_storage from = {};
    socklen_t len = sizeof(from);
    ssize_t n = recvfrom(fd_, buffer, sizeof(buffer), 0, reinterpret_cast<sockaddr*>(&from), &len);
    if (n <= 0) return std::nullopt;
    char ip[INET6_ADDRSTRLEN] = {};
    if (from.ss_family == AF_INET6) {
      inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&from)->sin6_addr, ip, sizeof(ip));
    } else {
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&from)->sin_addr, ip, sizeof(ip));
    }
    return std::make_pair(std::string(buffer, n), std::string(ip));
  }

 private:
  explicit MulticastChannel(int fd) : fd_(fd) {}
  int fd_;
  sockaddr_storage group_ = {};
  socklen_t group_len_ = 0;
  std::string where_;
};

struct Announcement {
  std::string token;
  int world_size = 0;
  int requested_rank = -1;
  int store_port = 0;
  std::string group_name;
  std::string sender_ip;
};

std::string Encode(const Announcement& a) {
  return absl::StrCat(kAnnounceMagic, "\n", a.token, "\n", a.world_size, "\n", a.requested_rank,
                      "\n", a.store_port, "\n", a.group_name);
}

std::optional<Announcement> Decode(const std::string& bytes, const std::string& sender_ip) {
  std::vector<std::string> parts = absl::StrSplit(bytes, absl::MaxSplits('\n', 5));
  Announcement a;
  if (parts.size() != 6 || parts[0] != kAnnounceMagic || parts[1].empty() ||
      !absl::SimpleAtoi(parts[2], &a.world_size) ||
      !absl::SimpleAtoi(parts[3], &a.requested_rank) ||
      !absl::SimpleAtoi(parts[4], &a.store_port)) {
    return std::nullopt;
  }
  a.token = parts[1];
  a.group_name = parts[5];
  a.sender_ip = sender_ip;
  return a;
}

// Ranks for every token heard: requested ranks first, the rest in token order.
absl::StatusOr<std::map<std::string, int>> AssignRanks(
    const std::map<std::string, Announcement>& heard, const Plan& plan) {
  std::map<std::string, int> ranks;
  std::set<int> taken;
  for (const auto& [token, a] : heard) {
    if (a.requested_rank < 0) continue;
    if (!taken.insert(a.requested_rank).second) {
      return absl::InvalidArgumentError(absl::StrCat("multicast rendezvous on ", plan.where,
                                                     ": two processes asked for rank ",
                                                     a.requested_rank));
    }
    ranks[token] = a.requested_rank;
  }
  int next = 0;
  for (const auto& [token, a] : heard) {  // std::map: token order
    if (a.requested_rank >= 0) continue;
    while (taken.contains(next)) ++next;
    ranks[token] = next++;
  }
  return ranks;
}

absl::StatusOr<RendezvousResult> MulticastRendezvous(const RendezvousOptions& options, Plan plan,
                                                     absl::Time deadline) {
  EMBER_ASSIGN_OR_RETURN(std::unique_ptr<MulticastChannel> channel, MulticastChannel::Open(plan));
  Announcement me;
  me.token = RandomToken();
  me.world_size = plan.world_size;
  me.requested_rank = plan.rank;
  me.group_name = options.group_name;
  std::map<std::string, Announcement> heard;  // by token, this group only
  std::unique_ptr<TcpStore> store;
  absl::Time next_send = absl::InfinitePast();
  auto listen = [&](absl::Duration wait) -> absl::Status {
    if (absl::Now() >= next_send) {
      EMBER_RETURN_IF_ERROR(channel->Send(Encode(me)));
      next_send = absl::Now() + kAnnounceEvery;
    }
    auto datagram = channel->Receive(std::min(wait, Remaining(next_send)));
    if (!datagram) return absl::OkStatus();
    std::optional<Announcement> a = Decode(datagram->first, datagram->second);
    if (!a || a->group_name != options.group_name) return absl::OkStatus();
    if (a->world_size != plan.world_size) {
      // Announce once more: the other process is listening (it has sent),
      // and may not have heard us yet; it then fails the same way.
      (void)channel->Send(Encode(me));
      return absl::InvalidArgumentError(
          absl::StrCat("multicast rendezvous on ", plan.where, " (group_name '", options.group_name,
                       "'): world_size ", plan.world_size, " here but ", a->world_size, " at ",
                       a->sender_ip, "; use one world_size, or a different group_name per job"));
    }
    heard[a->token] = *a;
    return absl::OkStatus();
  };

  // Hear everyone (including our own looped-back announcement).
  std::map<std::string, int> ranks;
  while (true) {
    EMBER_RETURN_IF_ERROR(listen(absl::Milliseconds(10)));
    if (static_cast<int>(heard.size()) > plan.world_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "multicast rendezvous on ", plan.where, ": more than world_size=", plan.world_size,
          " processes announced group_name '", options.group_name,
          "'; give each job its own group_name"));
    }
    if (static_cast<int>(heard.size()) == plan.world_size && heard.contains(me.token)) {
      EMBER_ASSIGN_OR_RETURN(ranks, AssignRanks(heard, plan));
      break;
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "multicast rendezvous on ", plan.where, ": ", heard.size(), " of ", plan.world_size,
          " ranks joined within ", absl::FormatDuration(options.timeout)));
    }
  }
  plan.rank = ranks[me.token];
  std::string leader;
  for (const auto& [token, rank] : ranks) {
    if (rank == 0) leader = token;
  }
  TcpStoreOptions store_options;
  store_options.timeout = options.timeout;
  if (plan.rank == 0) {
    store_options.is_server = true;
    store_options.port = 0;
    EMBER_ASSIGN_OR_RETURN(store, TcpStore::create(store_options));
    me.store_port = store->port();
  } else {
    while (heard[leader].store_port == 0) {
      EMBER_RETURN_IF_ERROR(listen(absl::Milliseconds(10)));
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat("multicast rendezvous on ", plan.where,
                                                        ": rank 0 never announced its store"));
      }
    }
    store_options.host = heard[leader].sender_ip;
    store_options.port = heard[leader].store_port;
    store_options.timeout = Remaining(deadline);
    EMBER_ASSIGN_OR_RETURN(store, TcpStore::create(store_options));
    store->set_timeout(options.timeout);
  }
  // Keep announcing while the others join.
  std::shared_ptr<Store> shared = std::move(store);
  if (!options.group_name.empty())
    shared = std::make_shared<PrefixStore>(options.group_name, shared);
  std::atomic<bool> joined{false};
  std::thread announcer([&] {
    while (!joined) {
      (void)listen(absl::Milliseconds(20));
    }
  });
  absl::Status status = Join(*shared, plan, options, deadline);
  joined = true;
  announcer.join();
  EMBER_RETURN_IF_ERROR(LingerIfServing(std::move(status), plan.rank == 0, options.timeout));
  return RendezvousResult{shared, plan.rank, plan.world_size};
}

}  // namespace

absl::StatusOr<RendezvousResult> rendezvous(const RendezvousOptions& options) {
  EMBER_ASSIGN_OR_RETURN(Plan plan, MakePlan(options));
  if (options.timeout <= absl::ZeroDuration()) {
    return Invalid(options, absl::StrCat("timeout ", absl::FormatDuration(options.timeout),
                                         " must be positive"));
  }
  absl::Time deadline = absl::Now() + options.timeout;
  if (plan.kind == Plan::Kind::kMulticast)
    return MulticastRendezvous(options, std::move(plan), deadline);

  std::shared_ptr<Store> store;
  TcpStore* workers = nullptr;  // `store`'s TcpStore, for Join's count of PyTorch ranks
  const bool serving = plan.kind != Plan::Kind::kFile && plan.rank == 0 && !plan.served_elsewhere;
  if (plan.kind == Plan::Kind::kFile) {
    EMBER_ASSIGN_OR_RETURN(store, FileStore::open(plan.path, options.timeout));
  } else {
    TcpStoreOptions store_options;
    store_options.host = plan.host;
    store_options.port = plan.port;
    store_options.is_server = serving;
    store_options.timeout = options.timeout;
    // A client counts itself in at torch's "init/", as PyTorch's env:// and
    // tcp:// ranks do: a PyTorch rank 0 serving the store waits for that
    // count. The serving rank here does not wait on it; the join below is
    // its wait, with its own report of who is missing.
    if (!serving) store_options.num_workers = plan.world_size;
    EMBER_ASSIGN_OR_RETURN(std::unique_ptr<TcpStore> tcp, TcpStore::create(store_options));
    // Under a launcher's store (served elsewhere), "init/" may also count the
    // launcher's own agents; the join there keeps to Ember's count.
    if (!plan.served_elsewhere) workers = tcp.get();
    store = std::move(tcp);
  }
  store->set_timeout(options.timeout);
  if (!options.group_name.empty()) store = std::make_shared<PrefixStore>(options.group_name, store);
  EMBER_RETURN_IF_ERROR(LingerIfServing(Join(*store, plan, options, deadline, workers, serving),
                                        serving, options.timeout));
  return RendezvousResult{store, plan.rank, plan.world_size};
}

}  // namespace ember::distributed
