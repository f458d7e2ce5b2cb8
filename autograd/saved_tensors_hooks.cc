// The thread-local stack of saved-tensor hooks and the scopes that change it
// (Note [Saved-tensor hooks] in saved_tensors_hooks.h).
#include "autograd/saved_tensors_hooks.h"

#include <utility>

#include "tensor/device_guard.h"
#include "tensor/error.h"
#include "tensor/factories.h"

namespace ember::autograd {
namespace internal {
namespace {

// The innermost scope's state on this thread; each scope keeps the one it
// replaced, so the stack is the chain of scopes themselves.
thread_local std::shared_ptr<const SavedTensorHooksState> t_state;

// Replaces this thread's state and returns the one it replaced.
std::shared_ptr<const SavedTensorHooksState> Exchange(
    std::shared_ptr<const SavedTensorHooksState> state) {
  std::swap(t_state, state);
  return state;
}

}  // namespace

const std::shared_ptr<const SavedTensorHooksState>& CurrentSavedTensorHooksState() {
  return t_state;
}

const SavedTensorHooks* CurrentSavedTensorHooks() {
  const SavedTensorHooksState* state = t_state.get();
  return state == nullptr ? nullptr : state->hooks.get();
}

ScopedSavedTensorHooksState::ScopedSavedTensorHooksState(
    std::shared_ptr<const SavedTensorHooksState> state) {
  if (state == t_state) return;
  previous_ = Exchange(std::move(state));
  swapped_ = true;
}

ScopedSavedTensorHooksState::~ScopedSavedTensorHooksState() {
  if (swapped_) Exchange(std::move(previous_));
}

}  // namespace internal

saved_tensors_hooks::saved_tensors_hooks(PackHook pack_hook, UnpackHook unpack_hook) {
  const internal::SavedTensorHooksState* current = internal::t_state.get();
  if (current != nullptr && current->disabled_message.has_value()) {
    EMBER_FAIL(*current->disabled_message);
  }
  EMBER_CHECK(pack_hook != nullptr && unpack_hook != nullptr,
              "saved_tensors_hooks: both a pack hook and an unpack hook are needed (got ",
              pack_hook != nullptr ? "a pack hook" : "no pack hook", " and ",
              unpack_hook != nullptr ? "an unpack hook" : "no unpack hook", ")");
  auto state = std::make_shared<internal::SavedTensorHooksState>();
  state->hooks = std::make_shared<const internal::SavedTensorHooks>(
      internal::SavedTensorHooks{std::move(pack_hook), std::move(unpack_hook)});
  previous_ = internal::Exchange(std::move(state));
}

saved_tensors_hooks::~saved_tensors_hooks() { internal::Exchange(std::move(previous_)); }

namespace {

// Whether host copies can be pinned: a pinned allocator is registered and
// `device_type`'s backend has a device (torch pins only when
// torch.<device_type>.is_available()).
bool CanPin(DeviceType device_type) {
  if (GetPinnedMemoryAllocator() == nullptr) return false;
  DeviceGuardImpl* impl = GetDeviceGuardImpl(device_type);
  return impl != nullptr && impl->DeviceCount() > 0;
}

// What save_on_cpu keeps for a tensor: where it was, and its host copy.
struct OnCpu {
  Device device;
  Tensor tensor;
};

}  // namespace

save_on_cpu::save_on_cpu(bool pin_memory, DeviceType device_type)
    : saved_tensors_hooks(
          [pin = pin_memory && CanPin(device_type)](const Tensor& t) -> std::any {
            if (!pin) return OnCpu{t.device(), t.cpu()};
            Tensor host = empty(t.sizes(), TensorOptions(t.dtype()).pinned_memory(true));
            host.copy_(t);
            return OnCpu{t.device(), host};
          },
          [pin = pin_memory && CanPin(device_type)](const std::any& packed) {
            const OnCpu& saved = std::any_cast<const OnCpu&>(packed);
            return saved.tensor.to(saved.device, /*non_blocking=*/pin);
          }) {}

disable_saved_tensors_hooks::disable_saved_tensors_hooks(std::string error_message) {
  const internal::SavedTensorHooksState* current = internal::t_state.get();
  // As torch: disabling inside an active scope fails at once, with the
  // message that entering one would have given.
  EMBER_CHECK(current == nullptr || current->hooks == nullptr, error_message);
  auto state = std::make_shared<internal::SavedTensorHooksState>();
  state->disabled_message = std::move(error_message);
  previous_ = internal::Exchange(std::move(state));
}

disable_saved_tensors_hooks::~disable_saved_tensors_hooks() {
  internal::Exchange(std::move(previous_));
}

}  // namespace ember::autograd
