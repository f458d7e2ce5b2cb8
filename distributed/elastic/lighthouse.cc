#include "distributed/elastic/lighthouse.h"

#include <algorithm>
#include <map>
#include <set>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "distributed/elastic/lighthouse.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace ember::distributed::elastic {
namespace {

namespace pb = ::ember::distributed::elastic::proto;

absl::Status FromGrpc(const grpc::Status& s, const std::string& what) {
  if (s.ok()) return absl::OkStatus();
  const std::string message = absl::StrCat(what, ": ", s.error_message());
  switch (s.error_code()) {
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return absl::DeadlineExceededError(message);
    case grpc::StatusCode::INVALID_ARGUMENT:
      return absl::InvalidArgumentError(message);
    case grpc::StatusCode::UNAVAILABLE:
      return absl::UnavailableError(message);
    case grpc::StatusCode::CANCELLED:
      return absl::CancelledError(message);
    default:
      return absl::InternalError(message);
  }
}

std::chrono::system_clock::time_point Deadline(absl::Duration timeout) {
  return absl::ToChronoTime(absl::Now() + timeout);
}

}  // namespace

// Note [Forming a quorum] in lighthouse.h.
struct LighthouseServer::Impl final : pb::Lighthouse::Service {
  LighthouseOptions options;
  std::string address;
  std::unique_ptr<grpc::Server> server;

  mutable absl::Mutex mu;
  std::map<std::string, absl::Time> last_seen ABSL_GUARDED_BY(mu);
  // A request waiting for the quorum; `token` tells a replica's newer
  // request from an older one still unwinding.
  struct Pending {
    QuorumMember member;
    grpc::ServerContext* context = nullptr;
    absl::Time deadline;
    int64_t token = 0;
  };
  std::map<std::string, Pending> pending ABSL_GUARDED_BY(mu);
  int64_t next_token ABSL_GUARDED_BY(mu) = 0;
  absl::Time first_pending ABSL_GUARDED_BY(mu);
  int64_t generation ABSL_GUARDED_BY(mu) = 0;  // quorums decided
  std::set<std::string> previous_members ABSL_GUARDED_BY(mu);
  int64_t quorum_id ABSL_GUARDED_BY(mu) = 0;
  elastic::Quorum decided ABSL_GUARDED_BY(mu);
  bool stopping ABSL_GUARDED_BY(mu) = false;
  // Re-checks the timeouts (join, heartbeats, deadlines)
  // every kTick for all pending requests at once; the requests themselves
  // only wait for their answer, so a tick costs one pass over the pending
  // set however many there are.
  std::thread ticker;
  static constexpr absl::Duration kTick = absl::Milliseconds(5);

  void Tick() {
    absl::MutexLock lock(&mu);
    while (!mu.AwaitWithTimeout(absl::Condition(&stopping), kTick)) MaybeDecide(absl::Now());
  }

  // The wait of one pending request: over once a quorum was decided, the
  // request left the pending set (its deadline, its caller gone, or a newer
  // request of the same group), or the server stops.
  struct Waiter {
    Impl* impl;
    const std::string* id;
    int64_t token;
    int64_t generation;
    static bool Done(Waiter* w) ABSL_NO_THREAD_SAFETY_ANALYSIS {  // called under mu
      if (w->impl->generation != w->generation || w->impl->stopping) return true;
      auto it = w->impl->pending.find(*w->id);
      return it == w->impl->pending.end() || it->second.token != w->token;
    }
  };

  // Whether Note [Forming a quorum] decides the pending set now.
  bool Ready(absl::Time now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (static_cast<int>(pending.size()) < options.min_replicas) return false;
    if (now - first_pending >= options.join_timeout) return true;
    for (const auto& [id, seen] : last_seen) {
      if (now - seen <= options.heartbeat_timeout && pending.count(id) == 0) return false;
    }
    return true;  // every group alive is pending
  }

  // Drops the requests whose deadline passed, and with `cancelled` those
  // whose caller gave up (asking gRPC polls, so it is done once per
  // decision rather than per request or tick).
  void DropGone(absl::Time now, bool cancelled) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    for (auto it = pending.begin(); it != pending.end();) {
      if (it->second.deadline <= now || (cancelled && it->second.context->IsCancelled())) {
        it = pending.erase(it);
      } else {
        ++it;
      }
    }
  }

  // Decides the pending quorum when Note [Forming a quorum] says so. A
  // request whose caller gave up is no member.
  void MaybeDecide(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    DropGone(now, /*cancelled=*/false);
    if (!Ready(now)) return;
    DropGone(now, /*cancelled=*/true);
    if (!Ready(now)) return;
    elastic::Quorum q;
    std::set<std::string> ids;
    for (const auto& [id, p] : pending) {
      q.members.push_back(p.member);
      ids.insert(id);
      q.max_step = std::max(q.max_step, p.member.step);
    }
    if (ids != previous_members || generation == 0) ++quorum_id;
    q.quorum_id = quorum_id;
    previous_members = std::move(ids);
    decided = std::move(q);
    pending.clear();
    ++generation;
    decided.decision = generation;
  }

  grpc::Status Quorum(grpc::ServerContext* context, const pb::QuorumRequest* request,
                      pb::QuorumResponse* response) override {
    const pb::Member& m = request->member();
    if (m.replica_id().empty()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "empty replica_id");
    }
    absl::MutexLock lock(&mu);
    const absl::Time now = absl::Now();
    last_seen[m.replica_id()] = now;
    if (pending.empty()) first_pending = now;
    const int64_t token = ++next_token;
    pending[m.replica_id()] = {.member = {m.replica_id(), m.address(), m.step()},
                               .context = context,
                               .deadline = absl::FromChrono(context->deadline()),
                               .token = token};
    const int64_t mine = generation;  // decided when generation moves past it
    MaybeDecide(now);
    Waiter waiter{this, &m.replica_id(), token, mine};
    mu.Await(absl::Condition(&Waiter::Done, &waiter));
    if (generation == mine && !stopping) {  // dropped, or superseded
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                          absl::StrCat("no quorum with ", m.replica_id(), " decided in time"));
    }
    if (generation == mine) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the lighthouse is stopping");
    }
    response->set_quorum_id(decided.quorum_id);
    response->set_max_step(decided.max_step);
    response->set_decision(decided.decision);
    for (const QuorumMember& member : decided.members) {
      pb::Member* out = response->add_members();
      out->set_replica_id(member.replica_id);
      out->set_address(member.address);
      out->set_step(member.step);
    }
    return grpc::Status::OK;
  }

  grpc::Status Heartbeat(grpc::ServerContext*, const pb::HeartbeatRequest* request,
                         pb::HeartbeatResponse*) override {
    absl::MutexLock lock(&mu);
    last_seen[request->replica_id()] = absl::Now();
    return grpc::Status::OK;
  }
};

LighthouseServer::LighthouseServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

LighthouseServer::~LighthouseServer() {
  {
    absl::MutexLock lock(&impl_->mu);
    impl_->stopping = true;
  }
  impl_->server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
  impl_->ticker.join();
}

absl::StatusOr<std::unique_ptr<LighthouseServer>> LighthouseServer::create(
    LighthouseOptions options) {
  if (options.min_replicas < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("LighthouseOptions.min_replicas must be at least 1, got ",
                     options.min_replicas));
  }
  if (options.join_timeout < absl::ZeroDuration() ||
      options.heartbeat_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("LighthouseOptions: join_timeout (", absl::FormatDuration(options.join_timeout),
                     ") must not be negative and heartbeat_timeout (",
                     absl::FormatDuration(options.heartbeat_timeout), ") must be positive"));
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.bind, grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(impl.get());
  impl->server = builder.BuildAndStart();
  if (impl->server == nullptr || port == 0) {
    return absl::UnavailableError(
        absl::StrCat("the lighthouse cannot listen on ", options.bind,
                     " (in use, or not an address of this host)"));
  }
  const std::string host = options.bind.substr(0, options.bind.rfind(':'));
  impl->address = absl::StrCat(host, ":", port);
  impl->ticker = std::thread([p = impl.get()] { p->Tick(); });
  return std::unique_ptr<LighthouseServer>(new LighthouseServer(std::move(impl)));
}

const std::string& LighthouseServer::address() const { return impl_->address; }

int64_t LighthouseServer::quorums_decided() const {
  absl::MutexLock lock(&impl_->mu);
  return impl_->generation;
}

struct LighthouseClient::Impl {
  std::string address;
  std::unique_ptr<pb::Lighthouse::Stub> stub;
  absl::Mutex mu;
  std::set<grpc::ClientContext*> calls ABSL_GUARDED_BY(mu);  // in flight, for cancel()

  // Keeps `context` in `calls` while it lives.
  struct InFlight {
    Impl* impl;
    grpc::ClientContext* context;
    InFlight(Impl* i, grpc::ClientContext* c) : impl(i), context(c) {
      absl::MutexLock lock(&impl->mu);
      impl->calls.insert(context);
    }
    ~InFlight() {
      absl::MutexLock lock(&impl->mu);
      impl->calls.erase(context);
    }
  };
};

LighthouseClient::LighthouseClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
LighthouseClient::~LighthouseClient() = default;

absl::StatusOr<std::unique_ptr<LighthouseClient>> LighthouseClient::create(
    const std::string& address) {
  if (address.empty() || address.find(':') == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("lighthouse address '", address, "' is not host:port"));
  }
  auto impl = std::make_unique<Impl>();
  impl->address = address;
  grpc::ChannelArguments args;
  // Reconnect quickly after the lighthouse restarts.
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  impl->stub = pb::Lighthouse::NewStub(
      grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
  return std::unique_ptr<LighthouseClient>(new LighthouseClient(std::move(impl)));
}

absl::StatusOr<Quorum> LighthouseClient::quorum(const QuorumMember& me, absl::Duration timeout) {
  grpc::ClientContext context;
  context.set_deadline(Deadline(timeout));
  context.set_wait_for_ready(true);  // a lighthouse still starting is waited for
  const Impl::InFlight in_flight(impl_.get(), &context);
  pb::QuorumRequest request;
  request.mutable_member()->set_replica_id(me.replica_id);
  request.mutable_member()->set_address(me.address);
  request.mutable_member()->set_step(me.step);
  pb::QuorumResponse response;
  const grpc::Status s = impl_->stub->Quorum(&context, request, &response);
  if (!s.ok()) {
    return FromGrpc(s, absl::StrCat("quorum of ", me.replica_id, " at lighthouse ",
                                    impl_->address));
  }
  Quorum q;
  q.quorum_id = response.quorum_id();
  q.max_step = response.max_step();
  q.decision = response.decision();
  for (const pb::Member& m : response.members()) {
    q.members.push_back({m.replica_id(), m.address(), m.step()});
  }
  return q;
}

absl::Status LighthouseClient::heartbeat(const std::string& replica_id, absl::Duration timeout,
                                        bool wait_for_ready) {
  grpc::ClientContext context;
  context.set_deadline(Deadline(timeout));
  context.set_wait_for_ready(wait_for_ready);
  const Impl::InFlight in_flight(impl_.get(), &context);
  pb::HeartbeatRequest request;
  request.set_replica_id(replica_id);
  pb::HeartbeatResponse response;
  return FromGrpc(impl_->stub->Heartbeat(&context, request, &response),
                  absl::StrCat("heartbeat of ", replica_id, " to lighthouse ", impl_->address));
}

void LighthouseClient::cancel() {
  absl::MutexLock lock(&impl_->mu);
  for (grpc::ClientContext* context : impl_->calls) context->TryCancel();
}

}  // namespace ember::distributed::elastic
