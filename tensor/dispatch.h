// The op dispatcher: how a Tensor method reaches the code that runs it.
//
// Note [Dispatch]
// Every public tensor op is an `Op` object listed once in tensor/ops.inc. An Op
// holds one kernel per DispatchKey. A call collects the keys of its tensor
// arguments (and of a TensorOptions argument, for factories) and runs the
// registered kernel of the highest-priority key among them. DispatchKey's
// values are that order, highest first:
//   kAutocast  - when autocast is on, on this thread, for the device of an
//                argument, and the op has an autocast kernel (Note [Autocast]
//                in tensor/autocast.h): the kernel casts the arguments by the
//                op's policy, then calls Redispatch below itself, so the casts
//                and the op are recorded by autograd as the user's ops;
//   kAutograd  - when an argument requires grad (the autograd layer records the
//                graph there, then calls Redispatch below itself);
//   kCUDA      - the device kernels, CUDA before CPU: a call whose arguments
//   kCPU         span devices reaches the CUDA kernel (cross-device rule below);
//   kComposite - device-independent code written in terms of other ops
//                (broadcasting, type promotion, views, allocation); every call
//                carries this key, so it is the fallback of any device.
// Kernels are registered from the libraries that implement them (tensor/cpu/,
// cuda/, autograd/) when those are linked, so tensor code never depends on
// them and new backends need no change here. This breaks what would otherwise
// be a dependency cycle between the Tensor class and its kernels.
//
//   // In a kernel library (linked with alwayslink = 1):
//   EMBER_REGISTER_KERNEL(add, kComposite, &AddImpl);
//
// Cross-device rule: a host<->device copy (copy_, to(), cpu(), cuda()) reaches
// copy_out with both device keys, and the device that is not the CPU owns it:
// its kernel moves the bytes either way (as torch's copy_ runs on the CUDA
// side). Such ops are declared EMBER_CROSS_DEVICE_OP in ops.inc. For every
// other op the dispatcher refuses to run a device kernel on arguments from
// more than one device type, naming the op and the devices, so that no kernel
// ever reads another device's memory; composite kernels, which run before it,
// move 0-dim CPU operands to the other operand's device, as torch allows.
//
// Registration happens during static initialisation; calls are thread-safe
// once main() runs.
//
// Note [Below autograd]
// The autograd kernel of an op records one graph node for the whole op, then
// runs the op's own kernels inside a BelowAutogradGuard. Composite kernels
// call other ops (var calls mean, sub and sum; to() calls copy_); the guard
// makes those inner calls skip the autograd key, so one user-level op records
// exactly one node. The guard is thread-local: other threads keep recording.
#ifndef EMBER_TENSOR_DISPATCH_H_
#define EMBER_TENSOR_DISPATCH_H_

#include <array>
#include <bit>
#include <cstdint>
#include <optional>
#include <string_view>
#include <type_traits>
#include <vector>

#include "absl/types/span.h"
#include "tensor/device.h"

namespace ember {

class Tensor;
class TensorOptions;

// In priority order, highest first (Note [Dispatch]).
enum class DispatchKey : uint8_t { kAutocast = 0, kAutograd = 1, kCUDA = 2, kCPU = 3, kComposite = 4 };
inline constexpr int kNumDispatchKeys = 5;

// A small set of keys, one bit each.
class DispatchKeySet {
 public:
  constexpr DispatchKeySet() = default;
  constexpr explicit DispatchKeySet(DispatchKey k) : bits_(Bit(k)) {}
  constexpr DispatchKeySet operator|(DispatchKeySet o) const { return FromBits(bits_ | o.bits_); }
  constexpr DispatchKeySet operator&(DispatchKeySet o) const { return FromBits(bits_ & o.bits_); }
  constexpr DispatchKeySet Remove(DispatchKey k) const { return FromBits(bits_ & ~Bit(k)); }
  // The keys of lower priority than `k` (`k` itself excluded).
  constexpr DispatchKeySet Below(DispatchKey k) const {
    return FromBits(bits_ & ~((Bit(k) << 1) - 1));
  }
  constexpr bool Has(DispatchKey k) const { return bits_ & Bit(k); }
  constexpr bool empty() const { return bits_ == 0; }
  // More than one key (without a popcount, which x86-64's baseline lacks).
  constexpr bool has_several() const { return (bits_ & (bits_ - 1)) != 0; }
  // The highest-priority key of a non-empty set.
  constexpr DispatchKey Highest() const {
    return static_cast<DispatchKey>(std::countr_zero(static_cast<unsigned>(bits_)));
  }

 private:
  static constexpr uint8_t Bit(DispatchKey k) {
    return static_cast<uint8_t>(1u << static_cast<int>(k));
  }
  static constexpr DispatchKeySet FromBits(uint8_t b) {
    DispatchKeySet s;
    s.bits_ = b;
    return s;
  }
  uint8_t bits_ = 0;
};

// The keys of device kernels.
inline constexpr DispatchKeySet kDeviceKeys =
    DispatchKeySet(DispatchKey::kCUDA) | DispatchKeySet(DispatchKey::kCPU);

DispatchKey DeviceDispatchKey(DeviceType type);

namespace internal {

// The keys one argument contributes; defined in tensor.cc.
DispatchKeySet KeysOf(const Tensor& t);
DispatchKeySet KeysOf(const TensorOptions& options);
DispatchKeySet KeysOf(absl::Span<const Tensor> ts);
inline DispatchKeySet KeysOf(const std::vector<Tensor>& ts) {
  return KeysOf(absl::Span<const Tensor>(ts));
}
template <typename T>
DispatchKeySet KeysOf(const T&) {
  return {};
}

[[noreturn]] void ThrowNoKernel(std::string_view op, DispatchKeySet keys);
[[noreturn]] void ThrowMixedDevices(std::string_view op, DispatchKeySet keys);

// True inside a BelowAutogradGuard on this thread (Note [Below autograd]).
extern thread_local constinit bool tls_below_autograd;

// Grad mode of this thread (autograd/grad_mode.h reads and sets it: GradMode,
// NoGradGuard). It lives in the tensor layer, as torch keeps it in its core,
// because the view ops record it in their outputs (Note [View tracking] in
// tensor/tensor.h).
inline thread_local constinit bool tls_grad_mode = true;

// The device keys whose autocast is on for this thread's ops (Note [Autocast]
// in tensor/autocast.h sets it; empty while an autocast kernel runs the op
// below it, so the op's inner calls are not cast again).
inline thread_local constinit DispatchKeySet tls_autocast_keys;

}  // namespace internal

// While alive, ops called on this thread skip their autograd kernels (Note
// [Below autograd]). Nests; restores the previous state on destruction.
class BelowAutogradGuard {
 public:
  BelowAutogradGuard() : previous_(internal::tls_below_autograd) {
    internal::tls_below_autograd = true;
  }
  ~BelowAutogradGuard() { internal::tls_below_autograd = previous_; }
  BelowAutogradGuard(const BelowAutogradGuard&) = delete;
  BelowAutogradGuard& operator=(const BelowAutogradGuard&) = delete;

 private:
  bool previous_;
};

template <typename Signature>
class Op;

template <typename R, typename... Args>
class Op<R(Args...)> {
 public:
  using Signature = R(Args...);
  using Kernel = R (*)(Args...);

  constexpr explicit Op(std::string_view name, bool cross_device = false)
      : name_(name), cross_device_(cross_device) {}
  Op(const Op&) = delete;
  Op& operator=(const Op&) = delete;

  std::string_view name() const { return name_; }
  void SetKernel(DispatchKey key, Kernel kernel) {
    kernels_[static_cast<int>(key)] = kernel;
    registered_ = kernel != nullptr ? registered_ | DispatchKeySet(key) : registered_.Remove(key);
  }
  bool HasKernel(DispatchKey key) const { return registered_.Has(key); }

  // Runs the highest-priority kernel for the arguments (Note [Dispatch]).
  R operator()(Args... args) const {
    DispatchKeySet keys;
    ((keys = keys | internal::KeysOf(args)), ...);
    // Only ops with an autocast kernel read autocast's thread-local.
    if (registered_.Has(DispatchKey::kAutocast) && !(keys & internal::tls_autocast_keys).empty()) {
      keys = keys | DispatchKeySet(DispatchKey::kAutocast);
    }
    return Call(keys, std::forward<Args>(args)...);
  }

  // Runs the op as if `below` and every key of higher priority were absent:
  // the autograd kernel calls Redispatch(kAutograd, ...) to reach the device
  // or composite kernel, the autocast kernel Redispatch(kAutocast, ...) to
  // reach the autograd one. Ops the composite kernel calls in turn still see the
  // autograd key unless a BelowAutogradGuard is alive (Note [Below autograd]).
  R Redispatch(DispatchKey below, Args... args) const {
    DispatchKeySet keys;
    ((keys = keys | internal::KeysOf(args)), ...);
    return Call(keys.Below(below), std::forward<Args>(args)...);
  }

 private:
  R Call(DispatchKeySet keys, Args... args) const {
    keys = keys | DispatchKeySet(DispatchKey::kComposite);
    DispatchKeySet runnable = keys & registered_;
    // The thread-local is read only when it matters: it costs a call in
    // position-independent code.
    if (runnable.Has(DispatchKey::kAutograd) && internal::tls_below_autograd) {
      runnable = runnable.Remove(DispatchKey::kAutograd);
    }
    if (runnable.empty()) internal::ThrowNoKernel(name_, keys);
    const DispatchKey key = runnable.Highest();
    if (!cross_device_ && kDeviceKeys.Has(key) && (keys & kDeviceKeys).has_several()) {
      internal::ThrowMixedDevices(name_, keys);
    }
    return kernels_[static_cast<int>(key)](std::forward<Args>(args)...);
  }

  std::string_view name_;
  bool cross_device_;
  std::array<Kernel, kNumDispatchKeys> kernels_{};
  DispatchKeySet registered_;
};

namespace internal {
// Registers at static-initialisation time.
struct KernelRegistrar {
  template <typename OpT, typename Fn>
  KernelRegistrar(OpT& op, DispatchKey key, Fn fn) {
    op.SetKernel(key, fn);
  }
};
}  // namespace internal

#define EMBER_REGISTER_CONCAT_INNER_(a, b) a##b
#define EMBER_REGISTER_CONCAT_(a, b) EMBER_REGISTER_CONCAT_INNER_(a, b)

// Registers `fn` as the `key` kernel of ops::`op` (see Note [Dispatch]).
#define EMBER_REGISTER_KERNEL(op, key, fn)                          \
  static ::ember::internal::KernelRegistrar EMBER_REGISTER_CONCAT_( \
      ember_registrar_##op##_, __COUNTER__)(::ember::ops::op, ::ember::DispatchKey::key, fn)

}  // namespace ember

#endif  // EMBER_TENSOR_DISPATCH_H_
