#include "parallel/zero_redundancy_optimizer.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "autograd/grad_mode.h"
#include "distributed/distributed.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"
#include "tensor/storage.h"

namespace ember::parallel {

// Note [ZeRO partition]
// Which rank updates which parameter is torch's sorted-greedy assignment,
// reproduced exactly so that a checkpoint's shares and the broadcasts line
// up with PyTorch's for the same parameters: group by group, the group's
// parameters are sorted by numel, largest first (a stable sort: equal sizes
// keep their order in the group), and each goes to the rank with the
// smallest total numel so far (the lowest such rank on a tie); the totals
// carry over from one group to the next. Every parameter is assigned,
// trainable or not, and a parameter is never split. A rank's local
// optimizer holds, for every group, the parameters assigned to it in that
// order (an empty list when none), so its state_dict indices are positions
// in that concatenation. add_param_group assigns again from scratch; the
// earlier groups come out as before, so the local optimizers only grow.
//
// Note [ZeRO buckets]
// With parameters_as_bucket_view, each rank's trainable parameters on one
// device are packed, in partition order, into one flat tensor of their
// dtype (a one-element float32 tensor when a rank has none there, as torch),
// and each parameter's memory becomes its slice of it (torch assigns
// param.data = bucket view; here the parameter's Storage is pointed at the
// slice, so the parameter tensors, their autograd identity and their
// optimizer state stay the same objects). step() then broadcasts
// world_size buckets per device instead of one tensor per parameter. A
// parameter that is not the sole, contiguous user of its whole storage (a
// view into a larger tensor) cannot be pointed like that; its slot is
// copied from it before the broadcasts (on its owner) and back after (on
// the others). Parameters that stop requiring grad leave their bucket (get
// their own copy of their memory) when step() notices, and the buckets are
// rebuilt without them, as torch's _build_param_buckets.
//
// Broadcasts write a parameter's memory without an in-place op on it, so
// step() counts a new version on every parameter another rank updated:
// kernels that cache something derived from a parameter (oneDNN's blocked
// convolution weights) key it on the version counter.
//
// Note [ZeRO state dicts]
// consolidate_state_dict(to) runs torch's protocol: for each rank r other
// than `to`, in rank order, r broadcasts its local state (a length, then one
// byte payload: torch pickles it, this packs the entries' indices, names,
// dtypes, shapes and bytes) and every rank takes part, `to` keeping it; `to`
// copies its own state. Local indices become positions over all groups
// through the partition, so state_dict() on `to` is exactly a plain
// optimizer's over all the parameters: state sorted by position, one group
// per group with the options of this rank's local optimizer (which every
// rank keeps equal by calling set_lr / load_state_dict on all of them) and
// the positions 0..n-1 in group order. load_state_dict maps the saved
// groups' parameter ids to positions as a plain optimizer does and gives
// the local optimizer the entries of the parameters this rank owns, under
// their local indices.

namespace {

using nn::optim::OptimizerStateDict;

// torch.typename of a dense tensor: "torch.FloatTensor", "torch.cuda.LongTensor", ...
std::string TypeName(const Tensor& t) {
  const char* base = "Tensor";
  switch (t.dtype()) {
    case kFloat32: base = "FloatTensor"; break;
    case kFloat64: base = "DoubleTensor"; break;
    case kFloat16: base = "HalfTensor"; break;
    case kBFloat16: base = "BFloat16Tensor"; break;
    case kInt64: base = "LongTensor"; break;
    case kInt32: base = "IntTensor"; break;
    case kInt16: base = "ShortTensor"; break;
    case kInt8: base = "CharTensor"; break;
    case kUInt8: base = "ByteTensor"; break;
    case kBool: base = "BoolTensor"; break;
  }
  return absl::StrCat("torch.", t.device().is_cuda() ? "cuda." : "", base);
}

absl::Status Annotate(const absl::Status& s, const std::string& what) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat("ZeroRedundancyOptimizer: ", what, ": ", s.message()));
}

// Whether `param`'s storage can be pointed at a bucket slice: it is the
// parameter's whole, contiguous memory.
bool CanAlias(const Tensor& param) {
  return param.is_contiguous() && param.storage_offset() == 0 && param.storage().defined() &&
         param.storage().nbytes() == param.nbytes();
}

// Points `param`'s storage at `buffer`'s memory from element `offset`; the
// parameter keeps `buffer`'s storage alive.
void PointInto(const Tensor& param, const Tensor& buffer, int64_t offset) {
  Storage storage = param.storage();
  auto* holder = new Storage(buffer.storage());
  char* data = static_cast<char*>(buffer.raw_data()) +
               offset * static_cast<int64_t>(buffer.element_size());
  storage.set_data_ptr(
      DataPtr(data, holder, [](void* context) { delete static_cast<Storage*>(context); },
              buffer.device()),
      nullptr);
}

// Packs `state` into bytes (Note [ZeRO state dicts]).
class Writer {
 public:
  void Word(int64_t v) { words_.push_back(v); }
  void Name(const std::string& s) {
    Word(static_cast<int64_t>(s.size()));
    names_ += s;
  }
  void Data(const Tensor& t) {
    const Tensor c = t.cpu().contiguous();
    const char* p = static_cast<const char*>(c.raw_data());
    data_.append(p, c.nbytes());
  }
  // [number of words][words][names][data]
  Tensor Finish() const {
    const int64_t header = static_cast<int64_t>(words_.size());
    const size_t total = sizeof(int64_t) * (1 + words_.size()) + names_.size() + data_.size();
    Tensor out = empty({static_cast<int64_t>(total)}, TensorOptions().dtype(kUInt8));
    char* p = static_cast<char*>(out.raw_data());
    std::memcpy(p, &header, sizeof(header));
    p += sizeof(header);
    if (!words_.empty()) std::memcpy(p, words_.data(), sizeof(int64_t) * words_.size());
    p += sizeof(int64_t) * words_.size();
    std::memcpy(p, names_.data(), names_.size());
    p += names_.size();
    std::memcpy(p, data_.data(), data_.size());
    return out;
  }

 private:
  std::vector<int64_t> words_;
  std::string names_;
  std::string data_;
};

Tensor Pack(const std::vector<OptimizerStateDict::ParamState>& state) {
  Writer w;
  w.Word(static_cast<int64_t>(state.size()));
  for (const auto& ps : state) {
    w.Word(ps.index);
    w.Word(static_cast<int64_t>(ps.values.size()));
    for (const auto& [name, t] : ps.values) {
      w.Name(name);
      if (!t.defined()) {
        w.Word(-1);
        continue;
      }
      w.Word(t.dim());
      w.Word(static_cast<int64_t>(t.dtype()));
      for (int64_t s : t.sizes()) w.Word(s);
    }
  }
  for (const auto& ps : state) {
    for (const auto& value : ps.values) {
      if (value.second.defined()) w.Data(value.second);
    }
  }
  return w.Finish();
}

absl::StatusOr<std::vector<OptimizerStateDict::ParamState>> Unpack(const Tensor& bytes) {
  const Tensor c = bytes.cpu().contiguous();
  const char* p = static_cast<const char*>(c.raw_data());
  const size_t size = static_cast<size_t>(c.numel());
  auto corrupt = [] { return absl::DataLossError("ZeroRedundancyOptimizer: a peer's state is malformed"); };
  if (size < sizeof(int64_t)) return corrupt();
  int64_t header = 0;
  std::memcpy(&header, p, sizeof(header));
  if (header < 1 || sizeof(int64_t) * (1 + static_cast<size_t>(header)) > size) return corrupt();
  std::vector<int64_t> words(static_cast<size_t>(header));
  std::memcpy(words.data(), p + sizeof(int64_t), sizeof(int64_t) * words.size());
  size_t at_word = 0;
  auto next = [&](int64_t* v) {
    if (at_word >= words.size()) return false;
    *v = words[at_word++];
    return true;
  };
  const char* names = p + sizeof(int64_t) * (1 + words.size());
  const char* end = p + size;
  struct Spec {
    std::string name;
    int64_t dim;
    Dtype dtype;
    std::vector<int64_t> sizes;
  };
  std::vector<std::pair<int64_t, std::vector<Spec>>> specs;
  int64_t count = 0;
  if (!next(&count) || count < 0) return corrupt();
  for (int64_t e = 0; e < count; ++e) {
    int64_t index = 0, n = 0;
    if (!next(&index) || !next(&n) || n < 0) return corrupt();
    std::vector<Spec> values;
    for (int64_t v = 0; v < n; ++v) {
      Spec s;
      int64_t len = 0;
      if (!next(&len) || len < 0 || names + len > end) return corrupt();
      s.name.assign(names, static_cast<size_t>(len));
      names += len;
      if (!next(&s.dim)) return corrupt();
      if (s.dim >= 0) {
        int64_t dtype = 0;
        if (!next(&dtype) || dtype < 0 || dtype >= kNumDtypes) return corrupt();
        s.dtype = static_cast<Dtype>(dtype);
        for (int64_t d = 0; d < s.dim; ++d) {
          int64_t extent = 0;
          if (!next(&extent) || extent < 0) return corrupt();
          s.sizes.push_back(extent);
        }
      }
      values.push_back(std::move(s));
    }
    specs.emplace_back(index, std::move(values));
  }
  const char* data = names;
  std::vector<OptimizerStateDict::ParamState> out;
  for (auto& [index, values] : specs) {
    OptimizerStateDict::ParamState ps;
    ps.index = index;
    for (Spec& s : values) {
      if (s.dim < 0) {
        ps.values.emplace_back(std::move(s.name), Tensor());
        continue;
      }
      Tensor t = empty(s.sizes, TensorOptions().dtype(s.dtype));
      if (data + t.nbytes() > end) return corrupt();
      std::memcpy(t.raw_data(), data, t.nbytes());
      data += t.nbytes();
      ps.values.emplace_back(std::move(s.name), std::move(t));
    }
    out.push_back(std::move(ps));
  }
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ZeroRedundancyOptimizer>> ZeroRedundancyOptimizer::Create(
    std::vector<std::vector<Tensor>> param_groups, LocalOptimizerFactory make_local,
    ZeroRedundancyOptimizerOptions options) {
  if (options.overlap_with_ddp) {
    return absl::UnimplementedError(
        "ZeroRedundancyOptimizer: overlap_with_ddp=true is not supported; create it with "
        "overlap_with_ddp=false and call step() after backward");
  }
  if (!make_local) {
    return absl::InvalidArgumentError("ZeroRedundancyOptimizer: the local optimizer factory is empty");
  }
  std::vector<Tensor> all;
  for (size_t g = 0; g < param_groups.size(); ++g) {
    for (size_t i = 0; i < param_groups[g].size(); ++i) {
      if (!param_groups[g][i].defined()) {
        return absl::InvalidArgumentError(absl::StrCat("ZeroRedundancyOptimizer: parameter ", i,
                                                       " of group ", g, " is an undefined tensor"));
      }
      all.push_back(param_groups[g][i]);
    }
  }
  if (all.empty()) {
    return absl::InvalidArgumentError("ZeroRedundancyOptimizer got an empty parameter list");
  }
  const std::string type = TypeName(all[0]);
  for (size_t i = 1; i < all.size(); ++i) {
    const std::string other = TypeName(all[i]);
    if (other != type) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ZeroRedundancyOptimizer only supports using the same dense type for all parameters "
          "but got both ",
          type, " and ", other, " (parameters 0 and ", i, ")"));
    }
  }
  absl::flat_hash_map<const TensorImpl*, size_t> seen;
  for (size_t i = 0; i < all.size(); ++i) {
    auto [it, inserted] = seen.emplace(all[i].impl(), i);
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ZeroRedundancyOptimizer: some parameters appear in more than one parameter group or "
          "twice in one (positions ",
          it->second, " and ", i, " over all groups)"));
    }
  }
  std::shared_ptr<distributed::ProcessGroup> group = options.process_group;
  if (group == nullptr) {
    absl::StatusOr<distributed::Group> found = distributed::get_default_group();
    if (!found.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "ZeroRedundancyOptimizer: no process group was given and there is no default group; "
          "call init_process_group first or pass options.process_group (",
          found.status().message(), ")"));
    }
    group = *std::move(found);
  }

  std::unique_ptr<ZeroRedundancyOptimizer> zero(new ZeroRedundancyOptimizer());
  zero->group_ = std::move(group);
  zero->rank_ = zero->group_->rank();
  zero->world_size_ = zero->group_->size();
  zero->as_bucket_view_ = options.parameters_as_bucket_view;
  zero->default_device_ = all[0].device();
  zero->groups_ = std::move(param_groups);
  zero->all_params_ = std::move(all);
  zero->Partition();
  const std::vector<std::vector<Tensor>> shares = zero->LocalShares();
  try {
    zero->local_ = make_local(shares);
  } catch (const Error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("ZeroRedundancyOptimizer: the local optimizer could not be built: ", e.what()));
  }
  if (zero->local_ == nullptr) {
    return absl::InvalidArgumentError(
        "ZeroRedundancyOptimizer: the local optimizer factory returned null");
  }
  if (zero->local_->num_param_groups() != shares.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ZeroRedundancyOptimizer: the local optimizer has ", zero->local_->num_param_groups(),
        " parameter groups but was given ", shares.size(), " (one per group)"));
  }
  for (size_t g = 0; g < shares.size(); ++g) {
    if (zero->local_->params(g).size() != shares[g].size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ZeroRedundancyOptimizer: the local optimizer's group ", g, " has ",
          zero->local_->params(g).size(), " parameters but was given ", shares[g].size()));
    }
  }
  zero->in_bucket_.assign(zero->all_params_.size(), false);
  zero->trainable_ = zero->TrainableMask();
  if (zero->as_bucket_view_) zero->BuildBuckets();
  return zero;
}

void ZeroRedundancyOptimizer::Partition() {
  const size_t n = all_params_.size();
  partition_.assign(static_cast<size_t>(world_size_),
                    std::vector<std::vector<int64_t>>(groups_.size()));
  owner_.assign(n, 0);
  local_position_.assign(n, 0);
  std::vector<int64_t> sizes(static_cast<size_t>(world_size_), 0);
  int64_t first = 0;
  for (size_t g = 0; g < groups_.size(); ++g) {
    std::vector<int64_t> order(groups_[g].size());
    std::iota(order.begin(), order.end(), first);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return all_params_[a].numel() > all_params_[b].numel();
    });
    for (int64_t position : order) {
      const int rank =
          static_cast<int>(std::min_element(sizes.begin(), sizes.end()) - sizes.begin());
      partition_[rank][g].push_back(position);
      sizes[rank] += all_params_[position].numel();
      owner_[position] = rank;
    }
    first += static_cast<int64_t>(groups_[g].size());
  }
  for (const auto& groups : partition_) {
    int64_t index = 0;
    for (const auto& positions : groups) {
      for (int64_t position : positions) local_position_[position] = index++;
    }
  }
}

std::vector<std::vector<Tensor>> ZeroRedundancyOptimizer::LocalShares() const {
  std::vector<std::vector<Tensor>> shares;
  for (const auto& positions : partition_[rank_]) {
    std::vector<Tensor>& share = shares.emplace_back();
    for (int64_t position : positions) share.push_back(all_params_[position]);
  }
  return shares;
}

std::vector<bool> ZeroRedundancyOptimizer::TrainableMask() const {
  std::vector<bool> mask;
  mask.reserve(all_params_.size());
  for (const Tensor& p : all_params_) mask.push_back(p.requires_grad());
  return mask;
}

void ZeroRedundancyOptimizer::BuildBuckets() {
  autograd::NoGradGuard no_grad;
  trainable_ = TrainableMask();
  bucket_devices_.clear();
  for (const auto& groups : partition_) {
    for (const auto& positions : groups) {
      for (int64_t position : positions) {
        const Device d = all_params_[position].device();
        if (std::find(bucket_devices_.begin(), bucket_devices_.end(), d) == bucket_devices_.end()) {
          bucket_devices_.push_back(d);
        }
      }
    }
  }
  buckets_.assign(bucket_devices_.size(), {});
  slots_.assign(bucket_devices_.size(), {});
  for (size_t d = 0; d < bucket_devices_.size(); ++d) {
    for (int r = 0; r < world_size_; ++r) {
      std::vector<int64_t> members;
      int64_t numel = 0;
      Dtype dtype = kFloat32;
      for (const auto& positions : partition_[r]) {
        for (int64_t position : positions) {
          const Tensor& p = all_params_[position];
          if (p.device() != bucket_devices_[d]) continue;
          dtype = p.dtype();
          if (!trainable_[position]) {
            // Leaves its bucket: its own copy of its memory.
            if (in_bucket_[position]) {
              PointInto(p, p.detach().clone(), 0);
              in_bucket_[position] = false;
            }
            continue;
          }
          members.push_back(position);
          numel += p.numel();
        }
      }
      std::vector<BucketSlot> slots;
      Tensor bucket;
      if (numel == 0) {
        bucket = zeros({1}, TensorOptions().dtype(kFloat32).device(bucket_devices_[d]));
      } else {
        bucket = empty({numel}, TensorOptions().dtype(dtype).device(bucket_devices_[d]));
        int64_t offset = 0;
        for (int64_t position : members) {
          const Tensor& p = all_params_[position];
          bucket.narrow(0, offset, p.numel()).copy_(p.detach().reshape({-1}));
          const bool aliased = CanAlias(p);
          if (aliased) PointInto(p, bucket, offset);
          in_bucket_[position] = aliased;
          slots.push_back({position, offset, aliased});
          offset += p.numel();
        }
      }
      buckets_[d].push_back(std::move(bucket));
      slots_[d].push_back(std::move(slots));
    }
  }
}

absl::Status ZeroRedundancyOptimizer::SyncParams() {
  autograd::NoGradGuard no_grad;
  if (as_bucket_view_) {
    // Slots of parameters that are not views of their bucket: this rank's
    // values in before sending.
    for (size_t d = 0; d < buckets_.size(); ++d) {
      for (const BucketSlot& s : slots_[d][rank_]) {
        if (s.aliased) continue;
        const Tensor& p = all_params_[s.position];
        buckets_[d][rank_].narrow(0, s.offset, p.numel()).copy_(p.detach().reshape({-1}));
      }
    }
  }
  std::vector<std::shared_ptr<distributed::Work>> works;
  absl::Status status;
  auto issue = [&](const Tensor& t, int root) {
    if (!status.ok()) return;
    absl::StatusOr<std::shared_ptr<distributed::Work>> work =
        group_->broadcast(t, {.root = root});
    if (!work.ok()) {
      status = Annotate(work.status(), absl::StrCat("broadcast of rank ", root, "'s parameters"));
      return;
    }
    works.push_back(*std::move(work));
  };
  for (int r = 0; r < world_size_; ++r) {
    if (as_bucket_view_) {
      for (size_t d = 0; d < buckets_.size(); ++d) issue(buckets_[d][r], r);
    } else {
      for (const auto& positions : partition_[r]) {
        for (int64_t position : positions) issue(all_params_[position].detach(), r);
      }
    }
  }
  for (const auto& work : works) {
    const absl::Status s = work->wait();
    if (status.ok() && !s.ok()) status = Annotate(s, "broadcast of the parameters");
  }
  if (!status.ok()) return status;
  // Note [ZeRO buckets]: what the other ranks updated is a new version here.
  if (as_bucket_view_) {
    for (size_t d = 0; d < buckets_.size(); ++d) {
      for (int r = 0; r < world_size_; ++r) {
        if (r == rank_) continue;
        for (const BucketSlot& s : slots_[d][r]) {
          const Tensor& p = all_params_[s.position];
          if (s.aliased) {
            p.impl()->BumpVersion();
          } else {
            p.detach().copy_(buckets_[d][r].narrow(0, s.offset, p.numel()).view(p.sizes()));
          }
        }
      }
    }
  } else {
    for (size_t position = 0; position < all_params_.size(); ++position) {
      if (owner_[position] != rank_) all_params_[position].impl()->BumpVersion();
    }
  }
  return absl::OkStatus();
}

absl::Status ZeroRedundancyOptimizer::Step() {
  // This rank still trains (Note [Join]); nothing unless this is the first
  // joinable of an enabled Join.
  absl::StatusOr<JoinNotice> notice = Join::notify_join_context(*this);
  if (!notice.ok()) return notice.status();
  if (as_bucket_view_ && TrainableMask() != trainable_) BuildBuckets();
  local_->step();
  return SyncParams();
}

namespace {

// A joined rank's share of each step of the ranks still training.
class ZeroJoinHook : public JoinHook {
 public:
  explicit ZeroJoinHook(ZeroRedundancyOptimizer* zero) : zero_(zero) {}
  absl::Status main_hook() override { return zero_->Step(); }

 private:
  ZeroRedundancyOptimizer* zero_;
};

}  // namespace

std::unique_ptr<JoinHook> ZeroRedundancyOptimizer::join_hook(const JoinOptions&) {
  return std::make_unique<ZeroJoinHook>(this);
}

void ZeroRedundancyOptimizer::step() {
  const absl::Status s = Step();
  EMBER_CHECK(s.ok(), s.message());
}

absl::Status ZeroRedundancyOptimizer::AddParamGroupImpl(
    std::vector<Tensor> params, const std::function<void(std::vector<Tensor>)>& add_local) {
  const std::string type = TypeName(all_params_[0]);
  absl::flat_hash_map<const TensorImpl*, size_t> known;
  for (size_t i = 0; i < all_params_.size(); ++i) known.emplace(all_params_[i].impl(), i);
  absl::flat_hash_map<const TensorImpl*, size_t> fresh;
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    if (!p.defined()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ZeroRedundancyOptimizer.add_param_group: parameter ", i, " is an undefined tensor"));
    }
    if (TypeName(p) != type) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ZeroRedundancyOptimizer only supports using the same dense type for all parameters "
          "but got both ",
          type, " and ", TypeName(p), " (parameter ", i, " of the new group)"));
    }
    if (auto it = known.find(p.impl()); it != known.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "some parameters appear in more than one parameter group (parameter ", i,
          " of the new group is the optimizer's parameter ", it->second, ")"));
    }
    if (auto [it, inserted] = fresh.emplace(p.impl(), i); !inserted) {
      return absl::InvalidArgumentError(absl::StrCat(
          "optimizer contains a parameter group with duplicate parameters (positions ",
          it->second, " and ", i, ")"));
    }
  }
  const size_t old_count = all_params_.size();
  groups_.push_back(params);
  for (const Tensor& p : params) all_params_.push_back(p);
  Partition();
  try {
    add_local(LocalShares().back());
  } catch (const Error& e) {
    groups_.pop_back();
    all_params_.resize(old_count);
    Partition();
    return absl::InvalidArgumentError(
        absl::StrCat("ZeroRedundancyOptimizer.add_param_group: ", e.what()));
  }
  in_bucket_.resize(all_params_.size(), false);
  trainable_ = TrainableMask();
  consolidated_.reset();
  if (as_bucket_view_) BuildBuckets();
  return absl::OkStatus();
}

absl::StatusOr<std::vector<OptimizerStateDict::ParamState>>
ZeroRedundancyOptimizer::BroadcastState(int root,
                                        const std::vector<OptimizerStateDict::ParamState>& mine) {
  const TensorOptions on_device = TensorOptions().device(default_device_);
  Tensor payload;
  Tensor length = zeros({1}, TensorOptions().dtype(kInt64));
  if (rank_ == root) {
    payload = Pack(mine);
    length.data_ptr<int64_t>()[0] = payload.numel();
  }
  length = length.to(default_device_);
  const std::string what = absl::StrCat("consolidate_state_dict: broadcast of rank ", root, "'s state");
  {
    absl::StatusOr<std::shared_ptr<distributed::Work>> work = group_->broadcast(length, {.root = root});
    if (!work.ok()) return Annotate(work.status(), what);
    EMBER_RETURN_IF_ERROR(Annotate((*work)->wait(), what));
  }
  const int64_t n = length.cpu().data_ptr<int64_t>()[0];
  if (rank_ == root) {
    payload = payload.to(default_device_);
  } else {
    payload = empty({n}, on_device.dtype(kUInt8));
  }
  {
    absl::StatusOr<std::shared_ptr<distributed::Work>> work =
        group_->broadcast(payload, {.root = root});
    if (!work.ok()) return Annotate(work.status(), what);
    EMBER_RETURN_IF_ERROR(Annotate((*work)->wait(), what));
  }
  if (rank_ == root) return std::vector<OptimizerStateDict::ParamState>();
  return Unpack(payload);
}

absl::Status ZeroRedundancyOptimizer::consolidate_state_dict(int to) {
  if (to < 0 || to >= world_size_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ZeroRedundancyOptimizer.consolidate_state_dict: to=", to,
        " is not a rank of the group (its size is ", world_size_, ")"));
  }
  // This rank's state under overall positions.
  std::vector<int64_t> local_to_position;
  for (const auto& positions : partition_[rank_]) {
    local_to_position.insert(local_to_position.end(), positions.begin(), positions.end());
  }
  std::vector<OptimizerStateDict::ParamState> mine = local_->state_dict().state;
  for (auto& ps : mine) {
    if (ps.index < 0 || ps.index >= static_cast<int64_t>(local_to_position.size())) {
      return absl::InternalError(absl::StrCat(
          "ZeroRedundancyOptimizer: the local optimizer has state for parameter ", ps.index,
          " but holds ", local_to_position.size()));
    }
    ps.index = local_to_position[ps.index];
  }
  consolidated_.reset();
  std::vector<OptimizerStateDict::ParamState> all;
  for (int r = 0; r < world_size_; ++r) {
    if (r == to) {
      if (rank_ == to) {
        for (const auto& ps : mine) {
          OptimizerStateDict::ParamState copy{ps.index, {}};
          for (const auto& [name, t] : ps.values) {
            copy.values.emplace_back(name, t.defined() ? t.detach().cpu().clone() : Tensor());
          }
          all.push_back(std::move(copy));
        }
      }
      continue;
    }
    EMBER_ASSIGN_OR_RETURN(std::vector<OptimizerStateDict::ParamState> got,
                           BroadcastState(r, mine));
    if (rank_ == to) {
      for (auto& ps : got) all.push_back(std::move(ps));
    }
  }
  if (rank_ == to) {
    std::stable_sort(all.begin(), all.end(),
                     [](const auto& a, const auto& b) { return a.index < b.index; });
    consolidated_ = std::move(all);
  }
  return absl::OkStatus();
}

OptimizerStateDict ZeroRedundancyOptimizer::state_dict() const {
  EMBER_CHECK(consolidated_.has_value(),
              "Optimizer state has not been consolidated on this rank. Please call "
              "`consolidate_state_dict(to=",
              rank_, ")` on all ranks beforehand if you meant to save the global state.");
  const OptimizerStateDict local = local_->state_dict();
  OptimizerStateDict out;
  int64_t position = 0;
  for (size_t g = 0; g < groups_.size(); ++g) {
    OptimizerStateDict::Group group{local.param_groups.at(g).options, {}};
    for (size_t i = 0; i < groups_[g].size(); ++i) group.params.push_back(position++);
    out.param_groups.push_back(std::move(group));
  }
  out.state = *consolidated_;
  return out;
}

absl::Status ZeroRedundancyOptimizer::load_state_dict(const OptimizerStateDict& state) {
  if (state.param_groups.size() != groups_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "loaded state dict has a different number of parameter groups (",
        state.param_groups.size(), " vs ", groups_.size(), ")"));
  }
  absl::flat_hash_map<int64_t, int64_t> id_to_position;
  OptimizerStateDict local;
  int64_t position = 0;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const auto& saved = state.param_groups[g];
    if (saved.params.size() != groups_[g].size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "loaded state dict contains a parameter group that doesn't match the size of "
          "optimizer's group (group ",
          g, ": ", saved.params.size(), " vs ", groups_[g].size(), " parameters)"));
    }
    for (int64_t id : saved.params) id_to_position[id] = position++;
    OptimizerStateDict::Group group{saved.options, {}};
    const auto& share = partition_[rank_][g];
    for (int64_t p : share) group.params.push_back(local_position_[p]);
    local.param_groups.push_back(std::move(group));
  }
  for (const auto& ps : state.state) {
    auto it = id_to_position.find(ps.index);
    if (it == id_to_position.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "loaded state dict has state for parameter ", ps.index,
          ", which none of its parameter groups lists"));
    }
    if (owner_[it->second] != rank_) continue;
    local.state.push_back({local_position_[it->second], ps.values});
  }
  return Annotate(local_->load_state_dict(local), "load_state_dict");
}

}  // namespace ember::parallel
