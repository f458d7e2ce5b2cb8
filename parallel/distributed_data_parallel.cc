#include "parallel/distributed_data_parallel.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "autograd/grad_mode.h"
#include "distributed/debug.h"
#include "distributed/distributed.h"
#include "tensor/error.h"
#include "tensor/factories.h"
#include "tensor/shape.h"
#include "tensor/status_macros.h"

namespace ember::parallel {
namespace {

// What must agree across ranks about one parameter or buffer.
struct TensorSpec {
  bool buffer = false;
  int64_t dtype = 0;
  bool requires_grad = false;
  std::vector<int64_t> shape;

  bool operator==(const TensorSpec& o) const {
    return buffer == o.buffer && dtype == o.dtype && requires_grad == o.requires_grad &&
           shape == o.shape;
  }
  std::string Describe() const {
    return absl::StrCat(std::string(dtype_name(static_cast<Dtype>(dtype))), " ",
                        ShapeToString(shape),
                        buffer ? "" : (requires_grad ? "" : " (requires_grad off)"));
  }
};

// Encoded as int64s: count, then per tensor buffer, dtype, requires_grad,
// ndim, sizes.
std::vector<int64_t> Encode(const std::vector<TensorSpec>& specs) {
  std::vector<int64_t> out = {static_cast<int64_t>(specs.size())};
  for (const TensorSpec& s : specs) {
    out.insert(out.end(), {s.buffer ? 1 : 0, s.dtype, s.requires_grad ? 1 : 0,
                           static_cast<int64_t>(s.shape.size())});
    out.insert(out.end(), s.shape.begin(), s.shape.end());
  }
  return out;
}

std::vector<TensorSpec> Decode(const int64_t* data, int64_t length) {
  std::vector<TensorSpec> specs;
  int64_t at = 0;
  auto next = [&]() { return at < length ? data[at++] : int64_t{-1}; };
  const int64_t count = next();
  for (int64_t i = 0; i < count && at < length; ++i) {
    TensorSpec s;
    s.buffer = next() == 1;
    s.dtype = next();
    s.requires_grad = next() == 1;
    const int64_t ndim = next();
    for (int64_t d = 0; d < ndim; ++d) s.shape.push_back(next());
    specs.push_back(std::move(s));
  }
  return specs;
}

absl::Status Wait(const absl::StatusOr<std::shared_ptr<distributed::Work>>& work) {
  if (!work.ok()) return work.status();
  return (*work)->wait();
}

// Every rank learns every rank's specs; the first difference from rank 0
// is an error on every rank (Note [Gradient buckets] needs equal shapes).
// The exchange runs on the module's device, which the group's backend
// serves (a pure nccl group has no CPU tensors), and is read back on the host.
absl::Status VerifyAcrossRanks(distributed::ProcessGroup& group,
                               const std::vector<TensorSpec>& mine,
                               const std::vector<std::string>& names, Device device) {
  const int world = group.size();
  const TensorOptions on_device = TensorOptions().dtype(kInt64).device(device);
  const std::vector<int64_t> encoded = Encode(mine);
  Tensor length =
      full({1}, static_cast<int64_t>(encoded.size()), TensorOptions().dtype(kInt64)).to(device);
  std::vector<Tensor> lengths;
  for (int r = 0; r < world; ++r) lengths.push_back(zeros({1}, on_device));
  EMBER_RETURN_IF_ERROR(Wait(group.allgather(lengths, length)));
  int64_t longest = 0;
  for (const Tensor& l : lengths) longest = std::max(longest, l.cpu().item<int64_t>());
  Tensor padded = full({longest}, int64_t{-1}, TensorOptions().dtype(kInt64));
  std::copy(encoded.begin(), encoded.end(), padded.data_ptr<int64_t>());
  padded = padded.to(device);
  std::vector<Tensor> all;
  for (int r = 0; r < world; ++r) all.push_back(zeros({longest}, on_device));
  EMBER_RETURN_IF_ERROR(Wait(group.allgather(all, padded)));
  for (Tensor& t : all) t = t.cpu().contiguous();
  const std::vector<TensorSpec> reference = Decode(all[0].data_ptr<int64_t>(), longest);
  auto count = [](const std::vector<TensorSpec>& specs, bool buffer) {
    return std::count_if(specs.begin(), specs.end(),
                         [&](const TensorSpec& s) { return s.buffer == buffer; });
  };
  for (int r = 1; r < world; ++r) {
    const std::vector<TensorSpec> theirs = Decode(all[r].data_ptr<int64_t>(), longest);
    const size_t n = std::min(theirs.size(), reference.size());
    for (size_t i = 0; i < n; ++i) {
      if (theirs[i] == reference[i]) continue;
      const bool buffer = reference[i].buffer;
      return absl::InvalidArgumentError(absl::StrCat(
          "DistributedDataParallel: the model differs across ranks: ",
          buffer ? "buffer '" : "parameter '", i < names.size() ? names[i] : "?", "' (",
          buffer ? "buffer" : "parameter", " ", buffer ? i - count(reference, false) : i, ") is ",
          theirs[i].buffer == buffer ? theirs[i].Describe() : "of another kind", " on rank ", r,
          " but ", reference[i].Describe(),
          " on rank 0; build the same model on every rank before wrapping it"));
    }
    if (theirs.size() != reference.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "DistributedDataParallel: the model differs across ranks: rank ", r, " has ",
          count(theirs, false), " parameters and ", count(theirs, true), " buffers but rank 0 has ",
          count(reference, false), " and ", count(reference, true),
          "; build the same model on every rank before wrapping it"));
    }
  }
  return absl::OkStatus();
}

std::string DeviceList(const std::vector<Device>& devices) {
  return absl::StrCat("[", absl::StrJoin(devices, ", ", [](std::string* out, const Device& d) {
                        out->append(d.str());
                      }),
                      "]");
}

// The one device of the module's tensors, checked against device_ids and
// output_device as torch's DDP takes them (one device per process).
absl::StatusOr<Device> ModuleDevice(const nn::Module& module,
                                    const DistributedDataParallelOptions& options) {
  std::vector<Device> devices;
  std::vector<std::string> first_names;
  auto note = [&](const std::string& name, const Tensor& t) {
    if (std::find(devices.begin(), devices.end(), t.device()) != devices.end()) return;
    devices.push_back(t.device());
    first_names.push_back(name);
  };
  for (const auto& [name, p] : module.named_parameters()) note(name, p);
  for (const auto& [name, b] : module.named_buffers()) note(name, b);
  if (devices.size() > 1) {
    std::vector<std::string> where;
    for (size_t i = 0; i < devices.size(); ++i) {
      where.push_back(absl::StrCat("'", first_names[i], "' on ", devices[i].str()));
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "DistributedDataParallel: the module's parameters and buffers span devices ",
        DeviceList(devices), " (", absl::StrJoin(where, ", "),
        "); DistributedDataParallel takes a module on one device, one device per process: "
        "move the whole module there (module->to(device)) before wrapping it"));
  }
  const Device device = devices.empty() ? Device(kCPU) : devices.front();
  const std::string got =
      absl::StrCat("device_ids ", DeviceList(options.device_ids), ", output_device ",
                   options.output_device ? options.output_device->str() : "unset");
  if (device.is_cpu()) {
    if (!options.device_ids.empty() || options.output_device.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "DistributedDataParallel: device_ids and output_device only work with a module on "
          "one GPU, but got ",
          got, " for a module on ", device.str(), "; leave both unset for a CPU module"));
    }
    return device;
  }
  if (options.device_ids.size() > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DistributedDataParallel: device_ids can only be empty or hold a single device (one "
        "device per process), got ",
        DeviceList(options.device_ids), "; for replicas on several GPUs of one process use "
        "DataParallel, or start one process per GPU"));
  }
  if (!options.device_ids.empty() && options.device_ids.front() != device) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DistributedDataParallel: device_ids ", DeviceList(options.device_ids),
        " does not match the module's device ", device.str(),
        "; move the module to device_ids[0] (module->to(device)) or pass device_ids = [",
        device.str(), "]"));
  }
  if (options.output_device.has_value() && options.output_device->is_cuda() &&
      options.output_device->index() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DistributedDataParallel: output_device ", options.output_device->str(),
        " has no index; name the device (cuda:N)"));
  }
  return device;
}

// BroadcastFromRank0 is shared with FullyShardedDataParallel (parallel/reducer.h).

}  // namespace

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<nn::Module> module,
                                                 std::shared_ptr<distributed::ProcessGroup> group,
                                                 DistributedDataParallelOptions options)
    : group_(std::move(group)), options_(std::move(options)) {
  module_ = register_module("module", std::move(module));
}

absl::StatusOr<std::shared_ptr<DistributedDataParallel>> DistributedDataParallel::create(
    std::shared_ptr<nn::Module> module, DistributedDataParallelOptions options) {
  if (module == nullptr) {
    return absl::InvalidArgumentError("DistributedDataParallel: the module is null");
  }
  if (!(options.bucket_cap_mb > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DistributedDataParallel: bucket_cap_mb must be positive, got ", options.bucket_cap_mb));
  }
  std::shared_ptr<distributed::ProcessGroup> group = options.process_group;
  if (group == nullptr) {
    absl::StatusOr<distributed::Group> found = distributed::get_default_group();
    if (!found.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "DistributedDataParallel: no process group was given and there is no default group; "
          "call init_process_group first or pass options.process_group (",
          found.status().message(), ")"));
    }
    group = *std::move(found);
  }
  EMBER_ASSIGN_OR_RETURN(const Device device, ModuleDevice(*module, options));
  const auto params = module->named_parameters();
  const auto buffers = module->named_buffers();
  if (std::none_of(params.begin(), params.end(),
                   [](const auto& p) { return p.second.requires_grad(); })) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DistributedDataParallel is not needed when a module doesn't have any parameter that "
        "requires a gradient (",
        module->name(), " has ", params.size(),
        " parameters, none "
        "requiring grad)"));
  }
  std::vector<TensorSpec> specs;
  std::vector<std::string> names;
  std::vector<Tensor> state;
  for (const auto& [name, p] : params) {
    specs.push_back({false, static_cast<int64_t>(p.dtype()), p.requires_grad(),
                     std::vector<int64_t>(p.sizes().begin(), p.sizes().end())});
    names.push_back(name);
    state.push_back(p);
  }
  for (const auto& [name, b] : buffers) {
    specs.push_back({true, static_cast<int64_t>(b.dtype()), false,
                     std::vector<int64_t>(b.sizes().begin(), b.sizes().end())});
    names.push_back(name);
    state.push_back(b);
  }
  EMBER_RETURN_IF_ERROR(VerifyAcrossRanks(*group, specs, names, device));
  EMBER_RETURN_IF_ERROR(BroadcastFromRank0(*group, state));

  std::shared_ptr<DistributedDataParallel> ddp(
      new DistributedDataParallel(std::move(module), group, options));
  ddp->device_ = device;
  const auto cap = static_cast<int64_t>(options.bucket_cap_mb * 1024 * 1024);
  ddp->reducer_ = Reducer::Create(ddp->module_->named_parameters(), group,
                                  {.bucket_cap_bytes = std::max<int64_t>(cap, 1),
                                   .find_unused_parameters = options.find_unused_parameters,
                                   .gradient_as_bucket_view = options.gradient_as_bucket_view,
                                   .static_graph = options.static_graph});
  // TORCH_DISTRIBUTED_DEBUG=INFO: the construction log PyTorch prints.
  if (distributed::debug_level_from_env() != distributed::DebugLevel::kOff) {
    std::fprintf(stderr,
                 "[rank %d] DDP Initialized with: backend: %s, world_size: %d, bucket_cap_bytes: "
                 "%lld, bucket_sizes: [%s], find_unused_parameters: %d, "
                 "gradient_as_bucket_view: %d, broadcast_buffers: %d, static_graph: %d\n",
                 group->rank(), group->backend().c_str(), group->size(),
                 static_cast<long long>(std::max<int64_t>(cap, 1)),
                 absl::StrJoin(ddp->reducer_->bucket_bytes(), ", ").c_str(),
                 options.find_unused_parameters, options.gradient_as_bucket_view,
                 options.broadcast_buffers, options.static_graph);
  }
  return ddp;
}

int DistributedDataParallel::FindCommonRank(bool candidate) {
  Tensor rank = full({1}, static_cast<int64_t>(candidate ? group_->rank() : -1),
                     TensorOptions().dtype(kInt64).device(device_));
  const absl::Status status = WaitFor(group_->allreduce(rank, {.op = distributed::ReduceOp::kMax}));
  if (!status.ok()) {
    EMBER_FAIL("DistributedDataParallel: agreeing on the rank to broadcast from failed: ",
               status.ToString());
  }
  const int64_t common = rank.cpu().item<int64_t>();
  EMBER_CHECK(common >= 0, "DistributedDataParallel: no rank was a candidate to broadcast from");
  return static_cast<int>(common);
}

void DistributedDataParallel::BroadcastBuffers(int root) {
  const std::vector<Tensor> buffers = module_->buffers();
  if (buffers.empty()) return;
  const absl::Status status = BroadcastFrom(*group_, root, buffers);
  if (!status.ok()) {
    EMBER_FAIL("DistributedDataParallel: broadcasting the buffers from rank ", root,
               " failed: ", status.ToString());
  }
}

Tensor DistributedDataParallel::forward(const Tensor& input) {
  const bool sync = autograd::GradMode::is_enabled() && require_backward_grad_sync_;
  const bool joining = join_config().enable;
  JoinNotice notice;
  if (joining) {
    // Note [Join] in parallel/join.h: this rank is still training.
    absl::StatusOr<JoinNotice> notified = Join::notify_join_context(*this);
    if (!notified.ok()) {
      EMBER_FAIL(notified.status().message(), " [",
                 absl::StatusCodeToString(notified.status().code()), "]");
    }
    notice = *std::move(notified);
  }
  const bool sync_buffers = options_.broadcast_buffers && group_->size() > 1 &&
                            require_forward_param_sync_ && !module_->buffers().empty();
  if (sync_buffers) {
    // Under a Join rank 0 may have joined with stale buffers: the highest
    // rank still training is the authority (torch's _sync_buffers).
    BroadcastBuffers(joining ? FindCommonRank(true) : 0);
  }
  if (joining) {
    // Tells the joined ranks whether to shadow this iteration's backward;
    // nobody here needs the sum, so it is not waited for until the next
    // forward replaces it.
    if (sync_flag_.work != nullptr) (void)sync_flag_.work->wait();
    sync_flag_.count =
        full({1}, sync ? 1.0f : 0.0f, TensorOptions().dtype(kFloat32).device(device_));
    absl::StatusOr<std::shared_ptr<distributed::Work>> flag =
        group_->allreduce(sync_flag_.count, {.op = distributed::ReduceOp::kSum});
    if (!flag.ok()) {
      EMBER_FAIL(
          "DistributedDataParallel: telling the joined ranks whether to synchronise "
          "failed: ",
          flag.status().ToString());
    }
    sync_flag_.work = *std::move(flag);
  }
  // torch's DDP moves the inputs to device_ids[0] when device_ids is given.
  const bool move_input = !options_.device_ids.empty() && input.defined() &&
                          input.device() != options_.device_ids.front();
  Tensor output = (*module_)(move_input ? input.to(options_.device_ids.front()) : input);
  if (options_.output_device.has_value() && output.defined() &&
      output.device() != *options_.output_device) {
    output = output.to(*options_.output_device);
  }
  require_forward_param_sync_ = sync;
  if (sync) {
    int divisor = group_->size();
    if (notice.work != nullptr && !divide_by_initial_world_size_) {
      // Divide by the ranks still training (Join's divide_by_initial_world_size = false).
      const absl::Status counted = notice.work->wait();
      if (!counted.ok()) {
        EMBER_FAIL("DistributedDataParallel: counting the ranks still training failed: ",
                   counted.ToString());
      }
      divisor = static_cast<int>(notice.count.cpu().item<float>() + 0.5f);
    }
    if (absl::Status set = reducer_->SetDivisor(divisor); !set.ok()) EMBER_FAIL(set.message());
    // TORCH_DISTRIBUTED_DEBUG=INFO: timing statistics at PyTorch's sampled
    // iterations (10, 20, 50, 100, then every 100).
    const ReducerStats stats = reducer_->stats();
    const int64_t it = stats.iterations;
    if ((it == 10 || it == 20 || it == 50 || (it > 0 && it % 100 == 0)) &&
        distributed::debug_level_from_env() != distributed::DebugLevel::kOff) {
      std::fprintf(stderr,
                   "[rank %d] DDP iteration %lld: avg backward compute time: %s, avg backward "
                   "comm wait time: %s\n",
                   group_->rank(), static_cast<long long>(it),
                   absl::FormatDuration(stats.backward_compute_time / it).c_str(),
                   absl::FormatDuration(stats.backward_comm_wait_time / it).c_str());
    }
    reducer_->PrepareForBackward(output);
  } else {
    reducer_->DisarmHooks();
  }
  return output;
}

absl::Status DistributedDataParallel::register_comm_hook(CommHook hook) {
  return reducer_->RegisterCommHook(std::move(hook));
}

// Note [Join] in parallel/join.h: a joined rank's side of each iteration of
// the ranks still training, in the order their forward and backward issue
// it.
class DistributedDataParallel::DdpJoinHook : public JoinHook {
 public:
  explicit DdpJoinHook(DistributedDataParallel* ddp) : ddp_(ddp) {}

  absl::Status main_hook() override {
    return Guard([&] {
      DistributedDataParallel& ddp = *ddp_;
      if (ddp.options_.broadcast_buffers && ddp.group_->size() > 1 &&
          ddp.require_forward_param_sync_ && !ddp.module_->buffers().empty()) {
        ddp.BroadcastBuffers(ddp.FindCommonRank(false));
      }
      Tensor flag = zeros({1}, TensorOptions().dtype(kFloat32).device(ddp.device_));
      absl::Status status =
          WaitFor(ddp.group_->allreduce(flag, {.op = distributed::ReduceOp::kSum}));
      if (!status.ok()) return status;
      const bool some_rank_syncs = flag.cpu().item<float>() != 0;
      ddp.require_forward_param_sync_ = some_rank_syncs;
      if (!some_rank_syncs) return absl::OkStatus();
      return ddp.reducer_->ShadowBackward();
    });
  }

  absl::Status post_hook(bool is_last_joiner) override {
    return Guard([&] {
      DistributedDataParallel& ddp = *ddp_;
      const int root = ddp.FindCommonRank(is_last_joiner);
      std::vector<Tensor> state = ddp.module_->parameters();
      if (ddp.options_.broadcast_buffers) {
        for (const Tensor& b : ddp.module_->buffers()) state.push_back(b);
      }
      autograd::NoGradGuard no_grad;
      return BroadcastFrom(*ddp.group_, root, state);
    });
  }

 private:
  // The DDP helpers throw ember::Error; a hook reports a Status.
  template <typename F>
  static absl::Status Guard(F&& f) {
    try {
      return f();
    } catch (const Error& e) {
      return absl::InternalError(e.what());
    }
  }

  DistributedDataParallel* ddp_;
};

std::unique_ptr<JoinHook> DistributedDataParallel::join_hook(const JoinOptions& options) {
  divide_by_initial_world_size_ = options.divide_by_initial_world_size;
  return std::make_unique<DdpJoinHook>(this);
}

absl::StatusOr<std::unique_ptr<Join>> DistributedDataParallel::join(JoinOptions options) {
  return Join::create({std::static_pointer_cast<DistributedDataParallel>(shared_from_this())},
                      options);
}

DdpLoggingData DistributedDataParallel::get_ddp_logging_data() const {
  return {.world_size = group_->size(),
          .bucket_bytes = reducer_->bucket_bytes(),
          .stats = reducer_->stats()};
}

}  // namespace ember::parallel
