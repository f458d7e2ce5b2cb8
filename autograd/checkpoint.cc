// Non-reentrant activation checkpointing on saved-tensor hooks (Note
// [Activation checkpointing] in checkpoint.h).
#include "autograd/checkpoint.h"

#include <algorithm>
#include <any>
#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/saved_tensors_hooks.h"
#include "autograd/saved_variable.h"
#include "autograd/variable.h"
#include "tensor/factories.h"

namespace ember::autograd {
namespace {

using Function = std::function<variable_list(const variable_list&)>;

// Unpacks outside any backward run (a custom Function's saved tensors read
// directly) recompute each time, under ids of their own.
constexpr uint64_t kOutsideBackward = uint64_t{1} << 63;
std::atomic<uint64_t> g_outside_backward_runs{0};

// --- RNG states (torch.random.fork_rng) --------------------------------------

// The devices of `inputs` whose backend registered default generators (each
// once), whose states checkpoint records besides the CPU's.
std::vector<Device> GeneratorDevices(const variable_list& inputs) {
  std::vector<Device> devices;
  for (const Tensor& t : inputs) {
    if (!t.defined() || t.is_cpu() || GetDeviceGenerators(t.device().type()) == nullptr) continue;
    if (std::find(devices.begin(), devices.end(), t.device()) == devices.end()) {
      devices.push_back(t.device());
    }
  }
  return devices;
}

struct RngStates {
  Tensor cpu;
  std::vector<std::pair<Device, Tensor>> devices;

  static RngStates Capture(const std::vector<Device>& devices) {
    RngStates states;
    states.cpu = default_generator().get_state();
    for (const Device& d : devices)
      states.devices.emplace_back(d, default_generator(d).get_state());
    return states;
  }
  void Restore() const {
    default_generator().set_state(cpu);
    for (const auto& [d, state] : devices) default_generator(d).set_state(state);
  }
};

// For its lifetime, the generators hold `forward`'s states; the states they
// had before come back at the end.
class ForkRng {
 public:
  ForkRng(const RngStates& forward, const std::vector<Device>& devices)
      : outside_(RngStates::Capture(devices)) {
    forward.Restore();
  }
  ~ForkRng() { outside_.Restore(); }
  ForkRng(const ForkRng&) = delete;
  ForkRng& operator=(const ForkRng&) = delete;

 private:
  RngStates outside_;
};

// --- The frame of one checkpoint() call ---------------------------------------

// What the forward pass keeps for one saved tensor: the recomputed tensor of
// each backward run (graph task id) that has not taken it yet. Owned by the
// SavedVariable (as its packed value), so it dies with the graph; guarded by
// its frame's mutex.
struct Holder {
  std::vector<std::pair<uint64_t, Tensor>> recomputed;
};

// Thrown by the recomputation's pack hook once every holder is filled
// (early_stop); caught by the frame that threw it. Not an ember::Error, so
// that code catching those lets it through.
struct StopRecomputation {
  const void* frame;
};

class CheckpointFrame : public std::enable_shared_from_this<CheckpointFrame> {
 public:
  CheckpointFrame(Function function, const CheckpointOptions& options, const variable_list& inputs)
      : function_(std::move(function)), options_(options) {
    if (options_.preserve_rng_state) {
      rng_devices_ = GeneratorDevices(inputs);
      rng_ = RngStates::Capture(rng_devices_);
    }
    // Saved as any node saves a tensor: the hooks around this checkpoint
    // (an outer checkpoint's, save_on_cpu) apply to them.
    inputs_.reserve(inputs.size());
    for (const Tensor& t : inputs) inputs_.emplace_back(t, /*is_output=*/false);
  }

  void FinishForward() {
    std::lock_guard<std::mutex> lock(mutex_);
    forward_completed_ = true;
  }

  // The forward pass's pack hook: a placeholder and the tensor's description.
  std::any PackForward(const Tensor& t) {
    auto holder = std::make_shared<Holder>();
    std::lock_guard<std::mutex> lock(mutex_);
    holders_.push_back(holder);
    metadata_.push_back({SizeVector(t.sizes().begin(), t.sizes().end()), t.dtype(), t.device()});
    return holder;
  }

  // The forward pass's unpack hook: recomputes once per backward run, then
  // hands out this holder's tensor.
  Tensor UnpackForward(const std::any& packed) {
    const auto& holder = std::any_cast<const std::shared_ptr<Holder>&>(packed);
    const uint64_t task = internal::CurrentGraphTaskId();
    const uint64_t run = task != 0 ? task : kOutsideBackward | g_outside_backward_runs++;
    EMBER_CHECK(recomputing_thread_.load() != std::this_thread::get_id(),
                "checkpoint: a tensor saved inside the checkpointed function was needed while "
                "that function was being recomputed for the backward pass (a backward inside "
                "the function through its own saved tensors?); this is not supported");
    std::lock_guard<std::mutex> lock(mutex_);
    if (!recomputed_runs_.contains(run)) {
      try {
        recomputing_thread_ = std::this_thread::get_id();
        struct Done {
          std::atomic<std::thread::id>& thread;
          ~Done() { thread = std::thread::id(); }
        } done{recomputing_thread_};
        Recompute(run);
        CheckRecomputed(run);
      } catch (...) {
        ForgetLocked(run);
        throw;
      }
      recomputed_runs_.insert(run);
      if (task != 0) {
        // The tensors of this run that no node took (nodes grad() did not
        // need) are freed when the run ends.
        queue_callback([weak = weak_from_this(), run] {
          if (std::shared_ptr<CheckpointFrame> frame = weak.lock()) frame->Forget(run);
        });
      }
    }
    auto it = std::find_if(holder->recomputed.begin(), holder->recomputed.end(),
                           [run](const auto& entry) { return entry.first == run; });
    if (it == holder->recomputed.end()) {
      throw CheckpointError(
          "checkpoint: a tensor saved inside the checkpointed function was unpacked a second "
          "time in one backward pass; each is handed out once per backward (a custom "
          "Function's backward should call get_saved_variables() once)");
    }
    Tensor t = std::move(it->second);
    holder->recomputed.erase(it);
    if (task == 0) ForgetLocked(run);
    return t;
  }

 private:
  struct Metadata {
    SizeVector shape;
    Dtype dtype;
    Device device;
    bool operator==(const Metadata& o) const {
      return shape == o.shape && dtype == o.dtype && device == o.device;
    }
    std::string str() const {
      return ::ember::internal::Concat(DescribeTensor(dtype, shape), " on ", device.str());
    }
  };

  // Runs the function again (mutex_ held), filling the holders in order.
  void Recompute(uint64_t run) {
    variable_list args;
    {
      // With grad mode on, saved inputs come back with their history (when
      // saved under outer hooks too), so the same ops record and save.
      EnableGradGuard grad_mode;
      args.reserve(inputs_.size());
      for (const SavedVariable& s : inputs_) args.push_back(s.Unpack());
    }
    recompute_run_ = run;
    recompute_count_ = 0;
    std::optional<ForkRng> fork;
    if (options_.preserve_rng_state) fork.emplace(rng_, rng_devices_);
    try {
      saved_tensors_hooks hooks([this](const Tensor& t) { return PackRecomputed(t); },
                                [](const std::any& p) { return std::any_cast<Tensor>(p); });
      EnableGradGuard grad_mode;
      function_(args);
    } catch (const StopRecomputation& stop) {
      if (stop.frame != this) throw;
    }
  }

  // The recomputation's pack hook (mutex_ held by this thread): the next
  // holder gets the tensor. The tensor is also what the recomputed graph
  // keeps, so a backward inside the function works during recomputation.
  std::any PackRecomputed(const Tensor& t) {
    Tensor kept = t.requires_grad() ? t.detach() : t;
    const size_t index = recompute_count_++;
    if (index >= holders_.size()) {
      if (!forward_completed_) {
        // A backward inside the function during its forward, without
        // early stop: the forward has not saved everything yet.
        ignore_mismatch_ = true;
        return kept;
      }
      throw CheckpointError(::ember::internal::Concat(
          "checkpoint: the recomputation saved more tensors than the original forward pass (",
          holders_.size(), "): the function must run the same ops both times"));
    }
    if (std::shared_ptr<Holder> holder = holders_[index].lock()) {
      holder->recomputed.emplace_back(recompute_run_, kept);
    }
    if (options_.early_stop && recompute_count_ == holders_.size()) throw StopRecomputation{this};
    return kept;
  }

  // Torch's determinism check: the same number of saved tensors, each with
  // the forward's shape, dtype and device.
  void CheckRecomputed(uint64_t run) {
    if (ignore_mismatch_) return;
    if (recompute_count_ != holders_.size()) {
      throw CheckpointError(::ember::internal::Concat(
          "checkpoint: a different number of tensors was saved during the original forward "
          "pass and during the recomputation (forward: ",
          holders_.size(), ", recomputation: ", recompute_count_,
          "); the function given to checkpoint must run the same ops both times"));
    }
    if (options_.determinism_check == DeterminismCheck::kNone) return;
    std::string differing;
    for (size_t i = 0; i < holders_.size(); ++i) {
      std::shared_ptr<Holder> holder = holders_[i].lock();
      if (holder == nullptr) continue;  // freed: no node needs it any more
      for (const auto& [r, t] : holder->recomputed) {
        if (r != run) continue;
        Metadata now{SizeVector(t.sizes().begin(), t.sizes().end()), t.dtype(), t.device()};
        if (now == metadata_[i]) continue;
        differing +=
            ::ember::internal::Concat("\n  saved tensor ", i, ": ", metadata_[i].str(),
                                      " in the forward pass, ", now.str(), " when recomputed");
      }
    }
    if (!differing.empty()) {
      throw CheckpointError(::ember::internal::Concat(
          "checkpoint: the recomputation differed from the forward pass; these saved tensors "
          "were recomputed with another shape, dtype or device:",
          differing,
          "\nThe function given to checkpoint must compute the same way both times (no state "
          "that changes between calls); DeterminismCheck::kNone turns this check off."));
    }
  }

  void Forget(uint64_t run) {
    std::lock_guard<std::mutex> lock(mutex_);
    ForgetLocked(run);
  }
  // Frees what `run` recomputed and no node took.
  void ForgetLocked(uint64_t run) {
    recomputed_runs_.erase(run);
    for (const std::weak_ptr<Holder>& weak : holders_) {
      std::shared_ptr<Holder> holder = weak.lock();
      if (holder == nullptr) continue;
      auto& entries = holder->recomputed;
      entries.erase(std::remove_if(entries.begin(), entries.end(),
                                   [run](const auto& entry) { return entry.first == run; }),
                    entries.end());
    }
  }

  const Function function_;
  const CheckpointOptions options_;
  std::vector<SavedVariable> inputs_;
  std::vector<Device> rng_devices_;
  RngStates rng_;

  std::mutex mutex_;  // guards everything below and the holders' contents
  std::vector<std::weak_ptr<Holder>> holders_;
  std::vector<Metadata> metadata_;  // one per holder
  bool forward_completed_ = false;
  bool ignore_mismatch_ = false;
  absl::flat_hash_set<uint64_t> recomputed_runs_;
  uint64_t recompute_run_ = 0;
  size_t recompute_count_ = 0;
  std::atomic<std::thread::id> recomputing_thread_{};
};

}  // namespace

variable_list checkpoint(const std::function<variable_list(const variable_list&)>& function,
                         const variable_list& inputs, const CheckpointOptions& options) {
  EMBER_CHECK(function != nullptr, "checkpoint: the function is empty");
  if (!GradMode::is_enabled()) return function(inputs);
  auto frame = std::make_shared<CheckpointFrame>(function, options, inputs);
  variable_list outputs;
  {
    // The hooks (and with them the frame) live as long as a tensor saved
    // under them.
    saved_tensors_hooks hooks([frame](const Tensor& t) { return frame->PackForward(t); },
                              [frame](const std::any& p) { return frame->UnpackForward(p); });
    outputs = function(inputs);
  }
  frame->FinishForward();
  return outputs;
}

Tensor checkpoint(const std::function<Tensor(const Tensor&)>& function, const Tensor& input,
                  const CheckpointOptions& options) {
  EMBER_CHECK(function != nullptr, "checkpoint: the function is empty");
  variable_list outputs =
      checkpoint([function](const variable_list& in) { return variable_list{function(in[0])}; },
                 variable_list{input}, options);
  return outputs[0];
}

}  // namespace ember::autograd
