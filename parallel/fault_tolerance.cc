#include "parallel/fault_tolerance.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "autograd/grad_mode.h"
#include "distributed/backend_registry.h"
#include "serialization/pickle_value.h"
#include "tensor/error.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"

namespace ember::parallel {
namespace {

namespace dist = ::ember::distributed;
namespace elastic = ::ember::distributed::elastic;
using ::ember::serialization::PickleValue;

absl::Status Wait(absl::StatusOr<std::shared_ptr<dist::Work>> work, absl::Duration timeout) {
  EMBER_RETURN_IF_ERROR(work.status());
  return (*work)->wait(timeout);
}

// `bytes` of `root` (its size, then its bytes) on every rank of `group`.
absl::StatusOr<std::string> BroadcastBytes(dist::ProcessGroup& group, const std::string& bytes,
                                           int root, absl::Duration timeout) {
  const bool is_root = group.rank() == root;
  Tensor size = tensor<int64_t>({is_root ? static_cast<int64_t>(bytes.size()) : int64_t{0}});
  EMBER_RETURN_IF_ERROR(Wait(group.broadcast(size, {.root = root}), timeout));
  const int64_t n = size.data_ptr<int64_t>()[0];
  Tensor payload = empty({n}, TensorOptions().dtype(kUInt8));
  if (is_root) std::memcpy(payload.data_ptr<uint8_t>(), bytes.data(), bytes.size());
  EMBER_RETURN_IF_ERROR(Wait(group.broadcast(payload, {.root = root}), timeout));
  return std::string(reinterpret_cast<const char*>(payload.data_ptr<uint8_t>()),
                     static_cast<size_t>(n));
}

// A quorum, or the error that stood for one, as rank 0 of a replica group
// gives it to the others.
absl::StatusOr<std::string> EncodeQuorum(const absl::StatusOr<elastic::Quorum>& q) {
  if (!q.ok()) {
    return serialization::pickle_value(PickleValue::Dict(
        {{"code", static_cast<int64_t>(q.status().code())},
         {"message", std::string(q.status().message())}}));
  }
  PickleValue::Items members;
  for (const elastic::QuorumMember& m : q->members) {
    members.push_back(PickleValue::Tuple({m.replica_id, m.address, m.step}));
  }
  return serialization::pickle_value(PickleValue::Dict({{"code", int64_t{0}},
                                                        {"quorum_id", q->quorum_id},
                                                        {"max_step", q->max_step},
                                                        {"decision", q->decision},
                                                        {"members", PickleValue::List(members)}}));
}

absl::StatusOr<elastic::Quorum> DecodeQuorum(const std::string& bytes) {
  EMBER_ASSIGN_OR_RETURN(PickleValue v, serialization::unpickle_value(bytes));
  try {
    const int64_t code = v.at("code")->as_int();
    if (code != 0) {
      return absl::Status(static_cast<absl::StatusCode>(code),
                          absl::StrCat("(rank 0 of this replica group) ",
                                       v.at("message")->as_string()));
    }
    elastic::Quorum q;
    q.quorum_id = v.at("quorum_id")->as_int();
    q.max_step = v.at("max_step")->as_int();
    q.decision = v.at("decision")->as_int();
    for (const PickleValue& m : v.at("members")->items()) {
      q.members.push_back(
          {m.items()[0].as_string(), m.items()[1].as_string(), m.items()[2].as_int()});
    }
    return q;
  } catch (const Error& e) {
    return absl::InternalError(absl::StrCat("a quorum from rank 0 of this replica group: ", e.what()));
  }
}

// The state a recovering group loads: the step, the model's state_dict and
// the optimizer's (Note [Steps that commit]).
absl::StatusOr<PickleValue> StateOf(int64_t step, nn::Module& model,
                                    const nn::optim::Optimizer* optimizer) {
  PickleValue::Pairs params;
  for (const auto& [name, t] : model.state_dict()) params.push_back({name, t.detach().contiguous()});
  PickleValue::Items state, groups;
  if (optimizer != nullptr) {
    const nn::optim::OptimizerStateDict osd = optimizer->state_dict();
    for (const auto& ps : osd.state) {
      PickleValue::Pairs values;
      for (const auto& [name, t] : ps.values) values.push_back({name, t.detach().contiguous()});
      state.push_back(PickleValue::Tuple({ps.index, PickleValue::Dict(std::move(values))}));
    }
    for (const auto& g : osd.param_groups) {
      PickleValue::Pairs options;
      for (const auto& [name, v] : g.options) options.push_back({name, v});
      PickleValue::Items indices(g.params.begin(), g.params.end());
      groups.push_back(
          PickleValue::Tuple({PickleValue::Dict(std::move(options)), PickleValue::List(indices)}));
    }
  }
  return PickleValue::Dict({{"step", step},
                            {"model", PickleValue::Dict(std::move(params))},
                            {"optimizer_state", PickleValue::List(std::move(state))},
                            {"param_groups", PickleValue::List(std::move(groups))}});
}

absl::Status LoadState(const PickleValue& v, nn::Module& model, nn::optim::Optimizer* optimizer,
                       int64_t* step) {
  try {
    *step = v.at("step")->as_int();
    StateDict sd;
    for (const auto& [name, t] : v.at("model")->pairs()) sd.push_back({name.as_string(), t.as_tensor()});
    EMBER_RETURN_IF_ERROR(model.load_state_dict(sd));
    if (optimizer == nullptr) return absl::OkStatus();
    nn::optim::OptimizerStateDict osd;
    for (const PickleValue& ps : v.at("optimizer_state")->items()) {
      nn::optim::OptimizerStateDict::ParamState one;
      one.index = ps.items()[0].as_int();
      for (const auto& [name, t] : ps.items()[1].pairs()) {
        one.values.push_back({name.as_string(), t.as_tensor()});
      }
      osd.state.push_back(std::move(one));
    }
    for (const PickleValue& g : v.at("param_groups")->items()) {
      nn::optim::OptimizerStateDict::Group group;
      for (const auto& [name, value] : g.items()[0].pairs()) {
        group.options.push_back({name.as_string(), value.kind() == PickleValue::Kind::kInt
                                                       ? static_cast<double>(value.as_int())
                                                       : value.as_float()});
      }
      for (const PickleValue& i : g.items()[1].items()) group.params.push_back(i.as_int());
      osd.param_groups.push_back(std::move(group));
    }
    return optimizer->load_state_dict(osd);
  } catch (const Error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("the state received from a peer does not fit this model: ", e.what()));
  }
}

// The same replica groups at the same store addresses.
bool SameGroups(const std::vector<elastic::QuorumMember>& a,
                const std::vector<elastic::QuorumMember>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].replica_id != b[i].replica_id || a[i].address != b[i].address) return false;
  }
  return true;
}

std::string FromEnv(const std::string& given, const char* name) {
  if (!given.empty()) return given;
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Manager>> Manager::create(std::shared_ptr<nn::Module> model,
                                                         nn::optim::Optimizer* optimizer,
                                                         ManagerOptions options) {
  if (model == nullptr) return absl::InvalidArgumentError("Manager: model is null");
  options.lighthouse = FromEnv(options.lighthouse, "TORCHFT_LIGHTHOUSE");
  options.replica_id = FromEnv(options.replica_id, "REPLICA_GROUP_ID");
  if (options.lighthouse.empty()) {
    return absl::InvalidArgumentError(
        "Manager: no lighthouse; set ManagerOptions.lighthouse or TORCHFT_LIGHTHOUSE "
        "(host:port of tools/lighthouse)");
  }
  if (options.replica_id.empty()) {
    return absl::InvalidArgumentError(
        "Manager: no replica_id; set ManagerOptions.replica_id or REPLICA_GROUP_ID");
  }
  if (options.min_replicas < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("Manager: min_replicas must be at least 1, got ", options.min_replicas));
  }
  if (options.quorum_every < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Manager: quorum_every must be at least 1 (1: ask the lighthouse every step), got ",
        options.quorum_every));
  }
  EMBER_RETURN_IF_ERROR(dist::find_backend(options.backend).status());
  std::unique_ptr<Manager> m(new Manager());
  m->model_ = std::move(model);
  m->optimizer_ = optimizer;
  m->options_ = options;
  if (options.replica_group != nullptr) {
    m->group_rank_ = options.replica_group->rank();
    m->group_size_ = options.replica_group->size();
  }
  // Note [Replica groups of several ranks]: rank 0 alone meets the lighthouse.
  if (m->group_rank_ != 0) return m;
  EMBER_ASSIGN_OR_RETURN(m->own_store_, dist::TcpStore::create({.host = options.host,
                                                                .port = 0,
                                                                .is_server = true,
                                                                .timeout = options.timeout}));
  m->address_ = absl::StrCat(options.host, ":", m->own_store_->port());
  EMBER_ASSIGN_OR_RETURN(m->lighthouse_, elastic::LighthouseClient::create(options.lighthouse));
  // The first beat before returning: a quorum decided after create() counts
  // this group alive and waits (its join timeout) for it to ask.
  if (absl::Status s = m->lighthouse_->heartbeat(options.replica_id, options.timeout,
                                                 /*wait_for_ready=*/true);
      !s.ok()) {
    return absl::UnavailableError(absl::StrCat(
        "Manager: the lighthouse at ", options.lighthouse, " did not answer within ",
        absl::FormatDuration(options.timeout), " (", s.message(),
        "); start tools/lighthouse there, or fix ManagerOptions.lighthouse / TORCHFT_LIGHTHOUSE"));
  }
  Manager* self = m.get();
  m->heartbeat_ = std::thread([self] {
    do {
      // A lighthouse that is down or slow is retried at the next beat.
      if (!self->beating_.load()) continue;
      self->lighthouse_->heartbeat(self->options_.replica_id, self->options_.heartbeat_interval * 5)
          .IgnoreError();
    } while (!self->stop_.WaitForNotificationWithTimeout(self->options_.heartbeat_interval));
  });
  return m;
}

Manager::~Manager() {
  if (asker_.joinable()) {
    absl::MutexLock lock(&ask_mu_);
    asker_stop_ = true;
    // A quorum nobody awaits: cancelled until the call returns (a call
    // that had not started when cancel() ran is cancelled by the next).
    while (asking_) {
      ask_mu_.Unlock();
      lighthouse_->cancel();
      ask_mu_.Lock();
      ask_mu_.AwaitWithTimeout(absl::Condition(+[](bool* asking) { return !*asking; }, &asking_),
                               absl::Milliseconds(10));
    }
  }
  if (asker_.joinable()) asker_.join();
  stop_.Notify();
  if (heartbeat_.joinable()) heartbeat_.join();
  if (group_ != nullptr) group_->abort();
}

absl::Status Manager::broken() const { return broken_; }

absl::Status Manager::Break(const absl::Status& error) {
  if (broken_.ok()) {
    broken_ = absl::Status(error.code(),
                           absl::StrCat("replica group ", options_.replica_id, " lost a rank (",
                                        error.message(), "); restart the whole group"));
    beating_ = false;  // the next quorum leaves this group out
    if (group_ != nullptr) group_->abort();
  }
  return broken_;
}

absl::StatusOr<elastic::Quorum> Manager::ShareQuorum(absl::StatusOr<elastic::Quorum> mine) {
  if (options_.replica_group == nullptr) return mine;
  std::string bytes;
  if (group_rank_ == 0) {
    EMBER_ASSIGN_OR_RETURN(bytes, EncodeQuorum(mine));
  }
  // Rank 0 waits for the lighthouse up to quorum_timeout; the others wait
  // for rank 0 as long, and a little more.
  absl::StatusOr<std::string> got = BroadcastBytes(*options_.replica_group, bytes, /*root=*/0,
                                                   options_.quorum_timeout + options_.timeout);
  if (!got.ok()) return Break(got.status());
  return group_rank_ == 0 ? std::move(mine) : DecodeQuorum(*got);
}

absl::StatusOr<elastic::Quorum> Manager::Ask() {
  if (group_rank_ != 0) return absl::UnknownError("not asked (rank 0 of the group asks)");
  return lighthouse_->quorum({.replica_id = options_.replica_id, .address = address_, .step = step_},
                             options_.quorum_timeout);
}

void Manager::AskLoop() {
  while (true) {
    {
      absl::MutexLock lock(&ask_mu_);
      ask_mu_.Await(absl::Condition(
          +[](Manager* m) ABSL_EXCLUSIVE_LOCKS_REQUIRED(m->ask_mu_) {
            return m->ask_wanted_ || m->asker_stop_;
          },
          this));
      if (asker_stop_) return;
      ask_wanted_ = false;
      asking_ = true;
    }
    absl::StatusOr<elastic::Quorum> q = Ask();
    absl::MutexLock lock(&ask_mu_);
    answer_ = std::move(q);
    asking_ = false;
  }
}

absl::Status Manager::start_quorum() {
  Await();  // a quorum left pending by the last call
  error_ = absl::OkStatus();
  group_ready_ = false;
  voted_ = false;
  absl::Status s = broken_;
  if (s.ok() && group_ != nullptr && !last_failed_ && step_ % options_.quorum_every != 0) {
    // Note [Asking every few steps]: the last quorum, without asking.
    group_ready_ = true;
    return absl::OkStatus();
  }
  if (s.ok() && options_.async_quorum && group_ != nullptr && !last_failed_) {
    // Note [Overlapping the quorum]: answered on a thread, applied by Await.
    if (group_rank_ == 0) {
      if (!asker_.joinable()) asker_ = std::thread([this] { AskLoop(); });
      absl::MutexLock lock(&ask_mu_);
      answer_.reset();
      ask_wanted_ = true;
      asked_ = true;
    }
    awaiting_ = true;
    group_ready_ = true;  // the guess, until Await says otherwise
    return absl::OkStatus();
  }
  if (s.ok()) s = Apply(ShareQuorum(Ask()));
  // The next quorum makes a new group; this step cannot commit.
  if (!s.ok()) Fail(s);
  return s;
}

void Manager::Await() {
  if (!awaiting_) return;
  awaiting_ = false;
  // Rank 0's answer from asker_; the others' Ask() only says they did not ask.
  absl::StatusOr<elastic::Quorum> mine = absl::UnknownError("not asked");
  if (asked_) {
    absl::MutexLock lock(&ask_mu_);
    ask_mu_.Await(absl::Condition(
        +[](Manager* m) ABSL_EXCLUSIVE_LOCKS_REQUIRED(m->ask_mu_) { return m->answer_.has_value(); },
        this));
    mine = *std::move(answer_);
    answer_.reset();
    asked_ = false;
  } else {
    mine = Ask();
  }
  absl::StatusOr<elastic::Quorum> q = ShareQuorum(std::move(mine));
  absl::Status s = q.status();
  bool held = false;
  if (s.ok()) {
    // The guess held: the same members at the same addresses, none behind.
    held = SameGroups(q->members, members_) && q->max_step == step_;
    for (const elastic::QuorumMember& m : q->members) held = held && m.step == step_;
    if (!held) last_failed_ = true;  // a process group of its own for the new quorum
    const int64_t guessed = quorum_id_;
    const int guessed_size = size_;
    const int64_t step = step_;
    s = Apply(*std::move(q));
    if (s.ok() && !held) {
      report_error(absl::AbortedError(absl::StrCat(
          "replica group ", options_.replica_id, ": the quorum changed while step ", step,
          " ran (it guessed quorum ", guessed, " of ", guessed_size, " groups; it is quorum ",
          quorum_id_, " of ", size_, "); the step is discarded, the next one runs in the new "
          "quorum")));
    }
  }
  if (!s.ok()) Fail(s);
}

absl::Status Manager::Apply(absl::StatusOr<elastic::Quorum> asked) {
  EMBER_ASSIGN_OR_RETURN(const elastic::Quorum q, std::move(asked));
  EMBER_RETURN_IF_ERROR(Reconfigure(q));
  EMBER_RETURN_IF_ERROR(Recover(q));
  group_ready_ = true;
  return absl::OkStatus();
}

absl::Status Manager::Reconfigure(const elastic::Quorum& q) {
  int rank = -1;
  for (size_t i = 0; i < q.members.size(); ++i) {
    if (q.members[i].replica_id == options_.replica_id) rank = static_cast<int>(i);
  }
  if (rank < 0) {
    return absl::InternalError(absl::StrCat("the lighthouse's quorum ", q.quorum_id,
                                            " does not list this replica group (",
                                            options_.replica_id, ")"));
  }
  const bool same = group_ != nullptr && q.quorum_id == quorum_id_ && !last_failed_ &&
                    SameGroups(q.members, members_);
  quorum_id_ = q.quorum_id;
  rank_ = rank;
  size_ = static_cast<int>(q.members.size());
  members_ = q.members;
  if (same) return absl::OkStatus();
  if (group_ != nullptr) group_->abort();
  group_.reset();
  // Every member meets at the first member's store, under this decision's
  // prefix, so a group made again for the same members never sees old keys.
  const std::string& leader = q.members[0].address;
  const size_t colon = leader.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(leader.substr(colon + 1), &port)) {
    return absl::InternalError(absl::StrCat("bad store address '", leader, "' in the quorum"));
  }
  EMBER_ASSIGN_OR_RETURN(std::unique_ptr<dist::TcpStore> store,
                         dist::TcpStore::create({.host = leader.substr(0, colon),
                                                 .port = port,
                                                 .timeout = options_.timeout}));
  group_store_ = std::move(store);
  EMBER_ASSIGN_OR_RETURN(const dist::BackendInfo* backend, dist::find_backend(options_.backend));
  EMBER_ASSIGN_OR_RETURN(group_, backend->create({.store = group_store_,
                                                  .store_prefix = absl::StrCat("ft/", q.decision, "/",
                                                                               group_rank_, "/"),
                                                  .rank = rank_,
                                                  .size = size_,
                                                  .timeout = options_.timeout}));
  decision_ = q.decision;
  last_failed_ = false;
  return absl::OkStatus();
}

absl::Status Manager::Recover(const elastic::Quorum& q) {
  bool anyone_behind = false;
  int source = -1;
  for (size_t i = 0; i < q.members.size(); ++i) {
    if (q.members[i].step < q.max_step) anyone_behind = true;
    if (source < 0 && q.members[i].step == q.max_step) source = static_cast<int>(i);
  }
  if (!anyone_behind) return absl::OkStatus();
  // The source's state, pickled (this local rank's part of it, Note
  // [Replica groups of several ranks]).
  std::string bytes;
  if (rank_ == source) {
    EMBER_ASSIGN_OR_RETURN(PickleValue state, StateOf(step_, *model_, optimizer_));
    EMBER_ASSIGN_OR_RETURN(bytes, serialization::pickle_value(state));
  }
  EMBER_ASSIGN_OR_RETURN(bytes, BroadcastBytes(*group_, bytes, source, options_.timeout));
  if (step_ == q.max_step) return absl::OkStatus();
  EMBER_ASSIGN_OR_RETURN(PickleValue state, serialization::unpickle_value(bytes));
  autograd::NoGradGuard no_grad;
  EMBER_RETURN_IF_ERROR(LoadState(state, *model_, optimizer_, &step_));
  ++recoveries_;
  return absl::OkStatus();
}

void Manager::report_error(const absl::Status& error) {
  if (error_.ok() && !error.ok()) error_ = error;
}

void Manager::Fail(const absl::Status& error) {
  report_error(error);
  last_failed_ = true;
  group_ready_ = false;
  // gloo and tcp tell a peer of a failure only when it waits on this
  // member's connection; aborting closes them, so a member still waiting
  // for this one fails at once instead of at its timeout.
  if (group_ != nullptr) group_->abort();
}

absl::Status Manager::SumAcross(Tensor& t) {
  Await();
  if (group_ == nullptr || !group_ready_) {
    const absl::Status s = absl::FailedPreconditionError(
        "allreduce without a quorum: call start_quorum first (or it failed)");
    report_error(s);
    return s;
  }
  // Even after an error of this step the collective runs: the others wait
  // for it, and the vote discards the step.
  absl::Status s = Wait(group_->allreduce(t, {.op = dist::ReduceOp::kSum}), options_.timeout);
  if (!s.ok()) Fail(s);
  return s;
}

absl::Status Manager::allreduce(Tensor& t) {
  SumAcross(t).IgnoreError();  // error_ holds it
  if (!error_.ok()) return error_;
  autograd::NoGradGuard no_grad;
  t.div_(static_cast<double>(size_));
  return absl::OkStatus();
}

absl::Status Manager::allreduce_gradients() {
  std::vector<Tensor> grads;
  int64_t total = 0;
  for (const Tensor& p : model_->parameters()) {
    if (p.grad().defined()) {
      grads.push_back(p.grad());
      total += p.grad().numel();
    }
  }
  Await();
  if (grads.empty()) return error_;
  autograd::NoGradGuard no_grad;
  // Note [The vote in the gradients]: one more element, this member's
  // failure, where the sum of small integers is exact.
  const Dtype dtype = grads[0].dtype();
  const bool fold = options_.replica_group == nullptr && group_ != nullptr && group_ready_ &&
                    (dtype == kFloat32 || dtype == kFloat64);
  Tensor flat = empty({total + (fold ? 1 : 0)}, TensorOptions().dtype(dtype));
  int64_t offset = 0;
  for (const Tensor& g : grads) {
    flat.narrow(0, offset, g.numel()).copy_(g.reshape({-1}));
    offset += g.numel();
  }
  if (fold) {
    flat.narrow(0, total, 1).fill_(error_.ok() ? 0.0 : 1.0);
    failed_before_vote_ = !error_.ok();
  }
  const absl::Status summed = SumAcross(flat);
  if (fold) {
    voted_ = true;
    voted_failed_ = summed.ok() ? std::llround(flat.narrow(0, total, 1).item<double>()) : 1;
  }
  if (!error_.ok()) return error_;
  flat.narrow(0, 0, total).div_(static_cast<double>(size_));
  offset = 0;
  for (Tensor& g : grads) {
    g.copy_(flat.narrow(0, offset, g.numel()).view(g.sizes()));
    offset += g.numel();
  }
  return absl::OkStatus();
}

bool Manager::should_commit() {
  Await();
  // The vote: the count of ranks that failed, within this replica group,
  // across the groups, then within the group again so that its ranks agree
  // (Note [Replica groups of several ranks]).
  auto within_group = [&](int64_t failed) -> int64_t {
    if (options_.replica_group == nullptr || !broken_.ok()) return failed + (broken_.ok() ? 0 : 1);
    Tensor t = tensor<int64_t>({failed});
    const absl::Status s =
        Wait(options_.replica_group->allreduce(t, {.op = dist::ReduceOp::kSum}), options_.timeout);
    if (!s.ok()) {
      Break(s).IgnoreError();  // broken_ holds it
      return failed + 1;
    }
    return t.data_ptr<int64_t>()[0];
  };
  int64_t failed = within_group(error_.ok() ? 0 : 1);
  if (voted_) {
    // Taken in allreduce_gradients; an error since is this member's alone.
    failed = voted_failed_ + (!error_.ok() && !failed_before_vote_ ? 1 : 0);
  } else if (group_ != nullptr && broken_.ok()) {
    Tensor t = tensor<int64_t>({failed});
    const absl::Status s =
        Wait(group_->allreduce(t, {.op = dist::ReduceOp::kSum}), options_.timeout);
    if (!s.ok()) Fail(s);
    failed = s.ok() ? t.data_ptr<int64_t>()[0] : failed + 1;
  }
  if (options_.replica_group != nullptr) failed = within_group(failed);
  const bool ok = failed == 0 && broken_.ok() && size_ >= options_.min_replicas && group_ != nullptr;
  if (ok) {
    ++step_;
  } else {
    ++discarded_;
    last_failed_ = true;
  }
  error_ = absl::OkStatus();
  voted_ = false;
  return ok;
}

}  // namespace ember::parallel
