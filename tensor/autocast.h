// Automatic mixed precision's autocast: regions of code whose ops run in a
// lower-precision float where that is safe, as torch.autocast.
//
//   ```cpp
//   #include "tensor/autocast.h"
//   #include "tensor/factories.h"
//   ember::Tensor x = ember::randn({8, 4}), w = ember::randn({4, 3});
//   {
//     ember::autocast ac(ember::DeviceType::kCPU);  // bfloat16, the CPU's default
//     ember::Tensor y = x.mm(w);                      // bfloat16
//     ember::Tensor p = y.prod();                     // float32: prod runs in float32
//     if (y.dtype() != ember::kBFloat16 || p.dtype() != ember::kFloat32) {
//       return absl::InternalError("autocast did not apply");
//     }
//   }
//   ```
//
// Note [Autocast]
// While an `autocast` is alive on a thread, the ops of that thread whose
// tensors are on its device type follow a cast policy, PyTorch's:
//   lower precision - the ops that gain from it and keep their accuracy (mm,
//                     bmm, addmm, linear, conv2d, scaled_dot_product_attention)
//                     run in the autocast dtype: every float argument of
//                     float16, bfloat16 or float32 is cast to it;
//   float32         - the ops that need the range or accuracy (losses, prod,
//                     and on CUDA softmax, log_softmax, sum, norms, exp, log,
//                     pow, layer_norm, ...) run in float32: lower-precision
//                     arguments are cast up;
//   promote         - ops that take several inputs of possibly different
//                     floats (cat on the CPU, dot on CUDA) run in the widest;
//   none            - every other op runs in the dtype of its inputs, with the
//                     usual type promotion.
// float64 arguments, integer ones and tensors of another device type are never
// cast. The policy of every op is one row of `autocast_policies()`, per device
// type, checked against PyTorch's own (//tensor:autocast_torch_test).
//
// How it applies: tensor ops with a policy have a kAutocast kernel (Note
// [Dispatch] in tensor/dispatch.h), which casts the arguments with ordinary,
// recorded `to()` calls and runs the op below itself; nn's functions with a
// policy (linear, conv2d, the losses, ...) call `internal::MaybeAutocast` on
// entry, which does the same. Either way the op itself runs with autocast
// excluded, so ops it calls inside are not cast again, and autograd sees the
// casts: gradients reach the float32 parameters in float32.
//
// Casts of float32 leaf tensors that require grad (the parameters) to the
// autocast dtype are cached for the life of the outermost autocast region on
// the thread (cache_enabled, the default), so a weight used by several calls
// is cast once per step; the cache empties when that region ends.
//
// Regions nest: an inner `autocast(type, dtype, /*enabled=*/false)` turns it
// off for its extent, another dtype applies inside its own region. The state
// is per thread, as PyTorch's: threads started inside a region (autograd's
// device workers included) run without autocast. Run backward after the
// region ends, as PyTorch advises; the backward of every op runs in the dtype
// its forward ran in.
#ifndef EMBER_TENSOR_AUTOCAST_H_
#define EMBER_TENSOR_AUTOCAST_H_

#include <optional>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/types/span.h"
#include "tensor/device.h"
#include "tensor/dispatch.h"
#include "tensor/dtype.h"
#include "tensor/tensor.h"

namespace ember {

// An autocast region for `device_type` (torch.autocast). `dtype` defaults to
// the device type's autocast dtype (get_autocast_dtype: bfloat16 on the CPU,
// float16 on CUDA); the CPU takes bfloat16 or float16, CUDA float16 or
// bfloat16, and any other dtype is refused by name. `enabled = false` turns
// autocast off for the region. `cache_enabled` defaults to
// is_autocast_cache_enabled().
class autocast {
 public:
  explicit autocast(DeviceType device_type, std::optional<Dtype> dtype = std::nullopt,
                    bool enabled = true, std::optional<bool> cache_enabled = std::nullopt);
  ~autocast();
  autocast(const autocast&) = delete;
  autocast& operator=(const autocast&) = delete;

 private:
  DeviceType device_type_;
  bool previous_enabled_;
  Dtype previous_dtype_;
  bool previous_cache_enabled_;
};

// This thread's autocast state (torch.is_autocast_enabled(device_type), ...).
// Setting it directly is for code that manages regions itself; prefer the
// `autocast` scope, which also keeps the cast cache.
bool is_autocast_enabled(DeviceType device_type);
void set_autocast_enabled(DeviceType device_type, bool enabled);
Dtype get_autocast_dtype(DeviceType device_type);
void set_autocast_dtype(DeviceType device_type, Dtype dtype);
bool is_autocast_cache_enabled();
void set_autocast_cache_enabled(bool enabled);
// Drops this thread's cached casts (done when the outermost region ends).
void clear_autocast_cache();

// Note [Autocast]'s policies.
enum class CastPolicy : uint8_t { kNone, kLowerPrecision, kFloat32, kPromote };
std::string_view cast_policy_name(CastPolicy policy);

// One op's policy on each device type; `op` is the op's name as PyTorch's
// aten names it ("mm", "softmax", "exp", "cross_entropy_loss", ...).
struct AutocastPolicy {
  std::string_view op;
  CastPolicy cpu;
  CastPolicy cuda;
};

// Every op with a policy on some device type; ops not listed are kNone.
absl::Span<const AutocastPolicy> autocast_policies();
CastPolicy autocast_policy(std::string_view op, DeviceType device_type);

namespace internal {

// Excludes autocast on this thread while alive (the op under an autocast
// kernel runs with it; Note [Autocast]).
class ExcludeAutocastGuard {
 public:
  ExcludeAutocastGuard() : previous_(tls_autocast_keys) { tls_autocast_keys = DispatchKeySet(); }
  ~ExcludeAutocastGuard() { tls_autocast_keys = previous_; }
  ExcludeAutocastGuard(const ExcludeAutocastGuard&) = delete;
  ExcludeAutocastGuard& operator=(const ExcludeAutocastGuard&) = delete;

 private:
  DispatchKeySet previous_;
};

// The device type whose autocast applies to an op with arguments of `keys`
// (CUDA before the CPU), or nullopt when none does.
std::optional<DeviceType> AutocastDeviceOf(DispatchKeySet keys);

// The dtype `policy` runs an op in for the tensor arguments `args` on
// `device_type` (nullopt for kNone: leave the arguments as they are).
std::optional<Dtype> AutocastTarget(CastPolicy policy, DeviceType device_type,
                                    absl::Span<const Tensor* const> args);

// `t` cast to `to` when autocast casts it at all: a defined float16, bfloat16
// or float32 tensor of `device_type` (cached per Note [Autocast]).
Tensor AutocastCast(const Tensor& t, Dtype to, DeviceType device_type);

template <typename T>
const T& AutocastArg(const T& arg, Dtype, DeviceType) {
  return arg;
}
inline Tensor AutocastArg(const Tensor& t, Dtype to, DeviceType device_type) {
  return AutocastCast(t, to, device_type);
}

template <typename T>
void CollectTensor(const T& arg, std::vector<const Tensor*>* tensors, DispatchKeySet* keys) {
  if constexpr (std::is_same_v<T, Tensor>) {
    tensors->push_back(&arg);
    *keys = *keys | KeysOf(arg);
  }
}

// For nn's functions with a policy: when autocast applies to `args` and the
// op's policy on their device type casts, returns fn(args cast by it...) run
// with autocast excluded; otherwise nullopt, and the caller goes on with its
// own arguments (an op of policy kNone runs as if it had no autocast kernel).
//
//   Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b) {
//     if (auto r = internal::MaybeAutocast("linear", &linear, x, w, b)) return *std::move(r);
//     ...
template <typename Fn, typename... Args>
std::optional<Tensor> MaybeAutocast(std::string_view op, Fn&& fn, const Args&... args) {
  if (tls_autocast_keys.empty()) return std::nullopt;
  std::vector<const Tensor*> tensors;
  DispatchKeySet keys;
  (CollectTensor(args, &tensors, &keys), ...);
  const std::optional<DeviceType> device_type = AutocastDeviceOf(keys);
  if (!device_type) return std::nullopt;
  const std::optional<Dtype> to =
      AutocastTarget(autocast_policy(op, *device_type), *device_type, tensors);
  if (!to) return std::nullopt;
  ExcludeAutocastGuard exclude;
  return std::forward<Fn>(fn)(AutocastArg(args, *to, *device_type)...);
}

}  // namespace internal
}  // namespace ember

#endif  // EMBER_TENSOR_AUTOCAST_H_
