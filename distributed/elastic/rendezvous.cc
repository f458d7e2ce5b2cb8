#include "distributed/elastic/rendezvous.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/str_replace.h"
#include "tensor/status_macros.h"

namespace ember::distributed::elastic {

// Note [Elastic rendezvous]
// The whole state of a rendezvous (round number, whether it is complete, the
// participants in join order, the nodes waiting for the next round, whether
// it is closed) is one value under "rdzv/<run_id>/state", changed only by
// compare_set: a launcher reads it, computes the next state and swaps it in
// if nobody changed it meanwhile, else reads again. So concurrent joins,
// restarts and closes never lose an update, and every launcher that sees a
// complete round sees the same participants in the same order, which is
// what makes node ranks agree.
//
// Liveness is not in that value: each launcher bumps its own counter,
// "rdzv/<run_id>/hb/<node>", every keep_alive. A node is lost when its
// counter has not moved for heartbeat_timeout as measured on the observing
// launcher's own clock, so clocks that disagree across hosts do not matter.
// An open round drops lost participants as soon as anyone notices (a node
// that joined and died must not hold the round below MIN or above MAX); a
// complete round is never edited: its participants notice through health()
// and restart it, and the next round forms from whoever joins.
//
// The state is served by the launcher on the endpoint host, from its own
// process, so the loss of any worker, and of any node but that one, leaves
// it intact. It is not replicated: replication needs a consensus protocol
// (etcd, as torchrun's etcd backend), which Ember does not bring; a job that
// must survive the loss of the endpoint host runs its rendezvous store
// elsewhere (any Store works here).

namespace internal {

namespace {
std::string Escape(const std::string& s) { return absl::StrReplaceAll(s, {{"\n", " "}}); }
}  // namespace

std::string Encode(const State& s) {
  return absl::StrCat("ember-rdzv-v1\n", s.round, "\n", s.complete ? 1 : 0, "\n",
                      s.last_call_until_us, "\n", s.closed ? 1 : 0, "\n", Escape(s.closed_reason),
                      "\n", absl::StrJoin(s.participants, ","), "\n",
                      absl::StrJoin(s.waiting, ","));
}

absl::StatusOr<State> Decode(const std::string& bytes) {
  std::vector<std::string> lines = absl::StrSplit(bytes, '\n');
  auto bad = [&](const std::string& what) {
    return absl::DataLossError(
        absl::StrCat("the elastic rendezvous state is not readable (", what,
                     "); is another program using the same --rdzv_id on this store?"));
  };
  if (lines.size() != 8 || lines[0] != "ember-rdzv-v1") return bad("header");
  State s;
  int complete = 0, closed = 0;
  if (!absl::SimpleAtoi(lines[1], &s.round) || !absl::SimpleAtoi(lines[2], &complete) ||
      !absl::SimpleAtoi(lines[3], &s.last_call_until_us) || !absl::SimpleAtoi(lines[4], &closed)) {
    return bad("numbers");
  }
  s.complete = complete != 0;
  s.closed = closed != 0;
  s.closed_reason = lines[5];
  if (!lines[6].empty()) s.participants = absl::StrSplit(lines[6], ',');
  if (!lines[7].empty()) s.waiting = absl::StrSplit(lines[7], ',');
  return s;
}

}  // namespace internal

namespace {

using internal::State;

bool Contains(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

}  // namespace

ElasticRendezvous::ElasticRendezvous(RendezvousOptions options)
    : options_(std::move(options)), prefix_(absl::StrCat("rdzv/", options_.run_id, "/")) {}

absl::StatusOr<std::unique_ptr<ElasticRendezvous>> ElasticRendezvous::create(
    RendezvousOptions options) {
  if (options.store == nullptr) return absl::InvalidArgumentError("elastic rendezvous: no store");
  if (options.run_id.empty() || options.run_id.find('/') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("elastic rendezvous: run id '", options.run_id,
                                                   "' must be non-empty and contain no '/'"));
  }
  if (options.node_id.empty() || options.node_id.find_first_of(",;\n") != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "elastic rendezvous: node id '", options.node_id, "' must be non-empty without ',' ';' or newlines"));
  }
  if (options.min_nodes < 1 || options.max_nodes < options.min_nodes) {
    return absl::InvalidArgumentError(
        absl::StrCat("elastic rendezvous: --nnodes=", options.min_nodes, ":", options.max_nodes,
                     " needs 1 <= MIN <= MAX"));
  }
  auto r = std::unique_ptr<ElasticRendezvous>(new ElasticRendezvous(std::move(options)));
  EMBER_RETURN_IF_ERROR(r->keep_alive());
  return r;
}

bool ElasticRendezvous::Lost(const std::string& node) {
  absl::StatusOr<std::string> v =
      options_.store->get(absl::StrCat(prefix_, "hb/", node), absl::ZeroDuration());
  int64_t value = -1;
  if (v.ok()) (void)absl::SimpleAtoi(*v, &value);
  const absl::Time now = absl::Now();
  Seen& s = seen_[node];
  if (s.moved == absl::InfinitePast() || value != s.value) {
    s = {value, now};
    return false;
  }
  return now - s.moved > options_.heartbeat_timeout;
}

absl::Status ElasticRendezvous::keep_alive() {
  absl::StatusOr<int64_t> n = options_.store->add(absl::StrCat(prefix_, "hb/", options_.node_id), 1);
  if (!n.ok()) {
    return absl::Status(n.status().code(),
                        absl::StrCat("elastic rendezvous '", options_.run_id,
                                     "': cannot reach its store (the launcher on the rendezvous "
                                     "endpoint serves it; is that host gone?): ",
                                     n.status().message()));
  }
  return absl::OkStatus();
}

namespace {

// The state and the raw bytes it was read from (for compare_set).
struct Read {
  State state;
  std::string raw;
};

absl::StatusOr<Read> ReadState(Store& store, const std::string& key) {
  absl::StatusOr<std::string> raw = store.get(key, absl::ZeroDuration());
  if (!raw.ok()) {
    if (raw.status().code() == absl::StatusCode::kDeadlineExceeded ||
        raw.status().code() == absl::StatusCode::kNotFound) {
      return Read{State{}, ""};  // nobody has written it yet: round 0, open
    }
    return raw.status();
  }
  EMBER_ASSIGN_OR_RETURN(State s, internal::Decode(*raw));
  return Read{std::move(s), std::move(*raw)};
}

}  // namespace

absl::StatusOr<RoundInfo> ElasticRendezvous::next_round() {
  Store& store = *options_.store;
  const std::string key = absl::StrCat(prefix_, "state");
  const std::string& me = options_.node_id;
  const absl::Time give_up = absl::Now() + options_.join_timeout;
  absl::Time next_beat = absl::InfinitePast();
  int64_t last_round = -1;
  size_t last_count = 0;
  while (true) {
    if (absl::Now() >= next_beat) {
      EMBER_RETURN_IF_ERROR(keep_alive());
      next_beat = absl::Now() + options_.heartbeat_timeout / 5;
    }
    EMBER_ASSIGN_OR_RETURN(Read read, ReadState(store, key));
    const State& now = read.state;
    if (now.closed) {
      return absl::FailedPreconditionError(absl::StrCat("elastic rendezvous '", options_.run_id,
                                                        "' was closed: ", now.closed_reason));
    }
    State next = now;
    auto lost = [&](const std::string& node) {
      return node != me && Lost(node);
    };
    std::erase_if(next.waiting, lost);
    if (now.complete && now.round == last_returned_round_ && Contains(now.participants, me)) {
      RoundInfo done;
      done.round = now.round;
      EMBER_RETURN_IF_ERROR(
          restart_round(done, absl::StrCat(me, " asked for a new round")));
      continue;
    }
    if (now.complete) {
      if (Contains(now.participants, me)) {
        RoundInfo info;
        info.round = now.round;
        info.nodes = now.participants;
        info.num_nodes = static_cast<int>(now.participants.size());
        info.node_rank = static_cast<int>(
            std::find(now.participants.begin(), now.participants.end(), me) -
            now.participants.begin());
        info.prefix = absl::StrCat(prefix_, "round/", now.round, "/");
        last_returned_round_ = now.round;
        return info;
      }
      if (!Contains(next.waiting, me)) next.waiting.push_back(me);
    } else {
      std::erase_if(next.participants, lost);
      if (!Contains(next.participants, me) &&
          static_cast<int>(next.participants.size()) < options_.max_nodes) {
        next.participants.push_back(me);
        std::erase(next.waiting, me);
      }
      const int n = static_cast<int>(next.participants.size());
      const int64_t now_us = absl::ToUnixMicros(absl::Now());
      if (n >= options_.max_nodes) {
        next.complete = true;
      } else if (n >= options_.min_nodes) {
        if (next.last_call_until_us == 0) {
          next.last_call_until_us = now_us + absl::ToInt64Microseconds(options_.last_call);
        } else if (now_us >= next.last_call_until_us) {
          next.complete = true;
        }
      } else {
        next.last_call_until_us = 0;
      }
      if (next.complete) next.waiting.clear();
    }
    const std::string desired = internal::Encode(next);
    if (desired != read.raw) {
      EMBER_ASSIGN_OR_RETURN(std::string stored, store.compare_set(key, read.raw, desired));
      if (stored != desired) continue;  // someone else changed it first: read again
      continue;                          // ours went in: look at it again (maybe complete)
    }
    last_round = now.round;
    last_count = now.participants.size();
    if (absl::Now() >= give_up) {
      return absl::DeadlineExceededError(absl::StrCat(
          "elastic rendezvous '", options_.run_id, "' round ", last_round, ": ", last_count,
          " node(s) joined within ", absl::FormatDuration(options_.join_timeout),
          ", but --nnodes needs at least ", options_.min_nodes,
          (now.complete ? " (this node waited for the next round, which never opened)" : ""),
          "; start more nodes or lower MIN"));
    }
    absl::SleepFor(options_.poll_interval);
  }
}

absl::StatusOr<Health> ElasticRendezvous::health(const RoundInfo& round) {
  Store& store = *options_.store;
  EMBER_ASSIGN_OR_RETURN(Read read, ReadState(store, absl::StrCat(prefix_, "state")));
  Health h;
  h.closed = read.state.closed;
  std::vector<std::string> reasons;
  if (read.state.round != round.round) {
    h.round_changed = true;
    reasons.push_back(absl::StrCat("round ", round.round, " was restarted by another node"));
  }
  for (const std::string& node : round.nodes) {
    if (node == options_.node_id) continue;
    if (Lost(node)) h.lost.push_back(node);
  }
  if (!h.lost.empty()) {
    reasons.push_back(absl::StrCat("node(s) ", absl::StrJoin(h.lost, ", "),
                                   " sent no heartbeat for ",
                                   absl::FormatDuration(options_.heartbeat_timeout)));
  }
  if (round.num_nodes < options_.max_nodes) {
    for (const std::string& node : read.state.waiting) {
      if (!Lost(node)) ++h.waiting;
    }
    if (h.waiting > 0) {
      reasons.push_back(absl::StrCat(h.waiting, " node(s) waiting to join"));
    }
  }
  h.reason = absl::StrJoin(reasons, "; ");
  return h;
}

absl::Status ElasticRendezvous::restart_round(const RoundInfo& round, const std::string& reason) {
  Store& store = *options_.store;
  const std::string key = absl::StrCat(prefix_, "state");
  while (true) {
    EMBER_ASSIGN_OR_RETURN(Read read, ReadState(store, key));
    if (read.state.round != round.round || read.state.closed) return absl::OkStatus();
    State next;
    next.round = round.round + 1;
    next.waiting = read.state.waiting;
    const std::string desired = internal::Encode(next);
    EMBER_ASSIGN_OR_RETURN(std::string stored, store.compare_set(key, read.raw, desired));
    if (stored == desired) {
      return store.set(absl::StrCat(prefix_, "restart/", next.round),
                       absl::StrCat(options_.node_id, ": ", reason));
    }
  }
}

absl::Status ElasticRendezvous::close(const std::string& reason) {
  Store& store = *options_.store;
  const std::string key = absl::StrCat(prefix_, "state");
  while (true) {
    EMBER_ASSIGN_OR_RETURN(Read read, ReadState(store, key));
    if (read.state.closed) return absl::OkStatus();
    State next = read.state;
    next.closed = true;
    next.closed_reason = absl::StrCat(reason, " (closed by ", options_.node_id, ")");
    const std::string desired = internal::Encode(next);
    EMBER_ASSIGN_OR_RETURN(std::string stored, store.compare_set(key, read.raw, desired));
    if (stored == desired) return absl::OkStatus();
  }
}

}  // namespace ember::distributed::elastic
