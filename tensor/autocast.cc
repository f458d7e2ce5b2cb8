// Autocast's state, its policy table, and the autocast kernels of the tensor
// ops that have a policy (Note [Autocast] in autocast.h).
#include "tensor/autocast.h"

#include <array>
#include <memory>

#include "absl/container/flat_hash_map.h"
#include "tensor/error.h"
#include "tensor/ops.h"

namespace ember {
namespace {

using P = CastPolicy;

// PyTorch's lists (aten/src/ATen/autocast_mode.cpp of 2.x) restricted to the
// ops Ember has; //tensor:autocast_torch_test checks every row against
// torch.autocast on the CPU and against the ops PyTorch gives an AutocastCUDA
// kernel. CUDA's "fp32_set_opt_dtype" ops (softmax, log_softmax, sum, prod)
// are kFloat32 here: with no dtype argument given they compute in float32.
constexpr AutocastPolicy kPolicies[] = {
    {"mm", P::kLowerPrecision, P::kLowerPrecision},
    {"bmm", P::kLowerPrecision, P::kLowerPrecision},
    {"addmm", P::kLowerPrecision, P::kLowerPrecision},
    {"linear", P::kLowerPrecision, P::kLowerPrecision},
    {"conv2d", P::kLowerPrecision, P::kLowerPrecision},
    {"scaled_dot_product_attention", P::kLowerPrecision, P::kLowerPrecision},
    {"dot", P::kNone, P::kPromote},
    {"cat", P::kPromote, P::kNone},
    {"softmax", P::kNone, P::kFloat32},
    {"log_softmax", P::kNone, P::kFloat32},
    {"sum", P::kNone, P::kFloat32},
    {"prod", P::kFloat32, P::kFloat32},
    {"norm", P::kNone, P::kFloat32},
    {"exp", P::kNone, P::kFloat32},
    {"expm1", P::kNone, P::kFloat32},
    {"log", P::kNone, P::kFloat32},
    {"log1p", P::kNone, P::kFloat32},
    {"log2", P::kNone, P::kFloat32},
    {"rsqrt", P::kNone, P::kFloat32},
    {"tan", P::kNone, P::kFloat32},
    {"reciprocal", P::kNone, P::kFloat32},
    {"pow", P::kNone, P::kFloat32},
    {"layer_norm", P::kNone, P::kFloat32},
    {"cross_entropy_loss", P::kFloat32, P::kFloat32},
    {"nll_loss", P::kFloat32, P::kFloat32},
    {"mse_loss", P::kFloat32, P::kFloat32},
    {"l1_loss", P::kFloat32, P::kFloat32},
    {"binary_cross_entropy_with_logits", P::kFloat32, P::kFloat32},
};

struct DeviceState {
  bool enabled;
  Dtype dtype;
};

struct CacheEntry {
  std::weak_ptr<TensorImpl> source;
  Tensor cast;
};

// This thread's state. The defaults are torch's: bfloat16 on the CPU,
// float16 on CUDA, the cache on.
thread_local std::array<DeviceState, kNumDeviceTypes> tls_state = {
    DeviceState{false, kBFloat16}, DeviceState{false, kFloat16}};
thread_local bool tls_cache_enabled = true;
thread_local int tls_nesting = 0;
thread_local absl::flat_hash_map<const TensorImpl*, CacheEntry> tls_cache;

DeviceState& StateOf(DeviceType type) { return tls_state[static_cast<int>(type)]; }

void SyncKeys() {
  DispatchKeySet keys;
  for (DeviceType type : {DeviceType::kCPU, DeviceType::kCUDA}) {
    if (StateOf(type).enabled) keys = keys | DispatchKeySet(DeviceDispatchKey(type));
  }
  internal::tls_autocast_keys = keys;
}

void CheckDtype(DeviceType type, Dtype dtype) {
  EMBER_CHECK(dtype == kBFloat16 || dtype == kFloat16, "autocast: ", DeviceTypeName(type),
              " autocast runs ops in bfloat16 or float16, got ", dtype_name(dtype),
              "; pass one of those, or enabled = false to run in the inputs' dtypes");
}

bool Eligible(const Tensor& t, DeviceType device_type) {
  if (!t.defined() || t.device().type() != device_type) return false;
  const Dtype d = t.dtype();
  return d == kFloat16 || d == kBFloat16 || d == kFloat32;
}

}  // namespace

autocast::autocast(DeviceType device_type, std::optional<Dtype> dtype, bool enabled,
                   std::optional<bool> cache_enabled)
    : device_type_(device_type),
      previous_enabled_(StateOf(device_type).enabled),
      previous_dtype_(StateOf(device_type).dtype),
      previous_cache_enabled_(tls_cache_enabled) {
  if (dtype) CheckDtype(device_type, *dtype);
  DeviceState& state = StateOf(device_type);
  state.enabled = enabled;
  if (dtype) state.dtype = *dtype;
  if (cache_enabled) tls_cache_enabled = *cache_enabled;
  ++tls_nesting;
  SyncKeys();
}

autocast::~autocast() {
  if (--tls_nesting == 0) clear_autocast_cache();
  DeviceState& state = StateOf(device_type_);
  state.enabled = previous_enabled_;
  state.dtype = previous_dtype_;
  tls_cache_enabled = previous_cache_enabled_;
  SyncKeys();
}

bool is_autocast_enabled(DeviceType device_type) { return StateOf(device_type).enabled; }

void set_autocast_enabled(DeviceType device_type, bool enabled) {
  StateOf(device_type).enabled = enabled;
  SyncKeys();
}

Dtype get_autocast_dtype(DeviceType device_type) { return StateOf(device_type).dtype; }

void set_autocast_dtype(DeviceType device_type, Dtype dtype) {
  CheckDtype(device_type, dtype);
  StateOf(device_type).dtype = dtype;
}

bool is_autocast_cache_enabled() { return tls_cache_enabled; }
void set_autocast_cache_enabled(bool enabled) { tls_cache_enabled = enabled; }
void clear_autocast_cache() { tls_cache.clear(); }

std::string_view cast_policy_name(CastPolicy policy) {
  switch (policy) {
    case CastPolicy::kNone:
      return "none";
    case CastPolicy::kLowerPrecision:
      return "lower_precision";
    case CastPolicy::kFloat32:
      return "float32";
    case CastPolicy::kPromote:
      return "promote";
  }
  return "?";
}

absl::Span<const AutocastPolicy> autocast_policies() { return kPolicies; }

CastPolicy autocast_policy(std::string_view op, DeviceType device_type) {
  for (const AutocastPolicy& row : kPolicies) {
    if (row.op == op) return device_type == DeviceType::kCUDA ? row.cuda : row.cpu;
  }
  return CastPolicy::kNone;
}

namespace internal {

std::optional<DeviceType> AutocastDeviceOf(DispatchKeySet keys) {
  const DispatchKeySet on = keys & tls_autocast_keys;
  if (on.Has(DispatchKey::kCUDA)) return DeviceType::kCUDA;
  if (on.Has(DispatchKey::kCPU)) return DeviceType::kCPU;
  return std::nullopt;
}

std::optional<Dtype> AutocastTarget(CastPolicy policy, DeviceType device_type,
                                    absl::Span<const Tensor* const> args) {
  switch (policy) {
    case CastPolicy::kNone:
      return std::nullopt;
    case CastPolicy::kLowerPrecision:
      return StateOf(device_type).dtype;
    case CastPolicy::kFloat32:
      return kFloat32;
    case CastPolicy::kPromote: {
      Dtype widest = StateOf(device_type).dtype;
      for (const Tensor* t : args) {
        if (Eligible(*t, device_type)) widest = promote_types(widest, t->dtype());
      }
      return widest;
    }
  }
  return std::nullopt;
}

Tensor AutocastCast(const Tensor& t, Dtype to, DeviceType device_type) {
  if (!Eligible(t, device_type) || t.dtype() == to) return t;
  const bool cacheable = tls_cache_enabled && tls_grad_mode && t.dtype() == kFloat32 &&
                         to == StateOf(device_type).dtype && t.requires_grad() && t.is_leaf() &&
                         !t.impl()->is_view();
  if (!cacheable) return t.to(to);
  auto it = tls_cache.find(t.impl());
  if (it != tls_cache.end()) {
    if (!it->second.source.expired() && it->second.cast.dtype() == to) return it->second.cast;
    tls_cache.erase(it);
  }
  Tensor cast = t.to(to);
  tls_cache.emplace(t.impl(), CacheEntry{t.impl_ptr(), cast});
  return cast;
}

}  // namespace internal

namespace {

// The autocast kernel of an op whose policy is its table row's: casts the
// tensor arguments (spans of tensors too) and runs the op below autocast.
const AutocastPolicy* RowOf(std::string_view op) {
  for (const AutocastPolicy& row : kPolicies) {
    if (row.op == op) return &row;
  }
  EMBER_INTERNAL_ASSERT(false, "autocast: no policy row for ", op);
  return nullptr;
}

CastPolicy PolicyOf(const AutocastPolicy* row, DeviceType type) {
  return type == DeviceType::kCUDA ? row->cuda : row->cpu;
}

template <typename T>
void Collect(const T& arg, std::vector<const Tensor*>* tensors) {
  if constexpr (std::is_same_v<T, Tensor>) {
    tensors->push_back(&arg);
  } else if constexpr (std::is_same_v<T, absl::Span<const Tensor>>) {
    for (const Tensor& t : arg) tensors->push_back(&t);
  }
}

// Runs `op` on `args` cast by `policy` for `device_type`.
template <typename OpT, typename... Args>
auto RunCast(const OpT& op, CastPolicy policy, DeviceType device_type, const Args&... args) {
  std::vector<const Tensor*> tensors;
  (Collect(args, &tensors), ...);
  const std::optional<Dtype> to = internal::AutocastTarget(policy, device_type, tensors);
  if (!to) return op.Redispatch(DispatchKey::kAutocast, args...);
  internal::ExcludeAutocastGuard exclude;
  return op.Redispatch(DispatchKey::kAutocast, internal::AutocastArg(args, *to, device_type)...);
}

template <typename... Args>
DeviceType DeviceOf(const Args&... args) {
  DispatchKeySet keys;
  ((keys = keys | internal::KeysOf(args)), ...);
  const std::optional<DeviceType> type = internal::AutocastDeviceOf(keys);
  EMBER_INTERNAL_ASSERT(type.has_value(), "autocast kernel reached without autocast on");
  return *type;
}

template <typename Sig>
struct TableKernel;
template <typename R, typename... Args>
struct TableKernel<R(Args...)> {
  template <auto& op, const std::string_view& name>
  static R Run(Args... args) {
    static const AutocastPolicy* const row = RowOf(name);
    const DeviceType type = DeviceOf(args...);
    return RunCast(op, PolicyOf(row, type), type, args...);
  }
};

template <auto& op, const std::string_view& name>
constexpr auto kTableKernel =
    &TableKernel<typename std::remove_reference_t<decltype(op)>::Signature>::template Run<op, name>;

constexpr std::string_view kMm = "mm", kBmm = "bmm", kAddmm = "addmm", kDot = "dot",
                           kSoftmax = "softmax", kLogSoftmax = "log_softmax", kNorm = "norm";

EMBER_REGISTER_KERNEL(mm, kAutocast, (kTableKernel<ops::mm, kMm>));
EMBER_REGISTER_KERNEL(bmm, kAutocast, (kTableKernel<ops::bmm, kBmm>));
EMBER_REGISTER_KERNEL(addmm, kAutocast, (kTableKernel<ops::addmm, kAddmm>));
EMBER_REGISTER_KERNEL(dot, kAutocast, (kTableKernel<ops::dot, kDot>));
EMBER_REGISTER_KERNEL(softmax, kAutocast, (kTableKernel<ops::softmax, kSoftmax>));
EMBER_REGISTER_KERNEL(log_softmax, kAutocast, (kTableKernel<ops::log_softmax, kLogSoftmax>));
EMBER_REGISTER_KERNEL(norm, kAutocast, (kTableKernel<ops::norm, kNorm>));

// cat takes a span: the cast tensors live in a vector for the call.
Tensor AutocastCat(absl::Span<const Tensor> tensors, int64_t dim) {
  static const AutocastPolicy* const row = RowOf("cat");
  const DeviceType type = DeviceOf(tensors);
  std::vector<const Tensor*> args;
  for (const Tensor& t : tensors) args.push_back(&t);
  const std::optional<Dtype> to = internal::AutocastTarget(PolicyOf(row, type), type, args);
  if (!to) return ops::cat.Redispatch(DispatchKey::kAutocast, tensors, dim);
  internal::ExcludeAutocastGuard exclude;
  std::vector<Tensor> cast;
  cast.reserve(tensors.size());
  for (const Tensor& t : tensors) cast.push_back(internal::AutocastCast(t, *to, type));
  return ops::cat.Redispatch(DispatchKey::kAutocast, cast, dim);
}
EMBER_REGISTER_KERNEL(cat, kAutocast, &AutocastCat);

// The elementwise and reduction ops take their kind as an argument; each kind
// with a policy names its row.
std::string_view UnaryName(UnaryOp op) {
  switch (op) {
    case UnaryOp::kExp:
      return "exp";
    case UnaryOp::kExpm1:
      return "expm1";
    case UnaryOp::kLog:
      return "log";
    case UnaryOp::kLog1p:
      return "log1p";
    case UnaryOp::kLog2:
      return "log2";
    case UnaryOp::kRsqrt:
      return "rsqrt";
    case UnaryOp::kTan:
      return "tan";
    case UnaryOp::kReciprocal:
      return "reciprocal";
    default:
      return {};
  }
}

Tensor AutocastUnary(UnaryOp op, const Tensor& self) {
  const DeviceType type = DeviceOf(self);
  const std::string_view name = UnaryName(op);
  const CastPolicy policy = name.empty() ? CastPolicy::kNone : autocast_policy(name, type);
  return RunCast(ops::unary, policy, type, op, self);
}
EMBER_REGISTER_KERNEL(unary, kAutocast, &AutocastUnary);

Tensor AutocastBinary(BinaryOp op, const Tensor& self, const Tensor& other) {
  const DeviceType type = DeviceOf(self, other);
  const CastPolicy policy = op == BinaryOp::kPow ? autocast_policy("pow", type) : CastPolicy::kNone;
  return RunCast(ops::binary, policy, type, op, self, other);
}
EMBER_REGISTER_KERNEL(binary, kAutocast, &AutocastBinary);

// sum and prod with a policy of float32 compute in float32 when no dtype is
// given (CUDA's fp32_set_opt_dtype); a dtype the caller gives is kept.
Tensor AutocastReduce(ReduceOp op, const Tensor& self, IntArrayRef dims, bool keepdim,
                      std::optional<Dtype> dtype) {
  const DeviceType type = DeviceOf(self);
  std::string_view name;
  if (op == ReduceOp::kSum) name = "sum";
  if (op == ReduceOp::kProd) name = "prod";
  if (!name.empty() && !dtype && autocast_policy(name, type) == CastPolicy::kFloat32 &&
      Eligible(self, type)) {
    internal::ExcludeAutocastGuard exclude;
    return ops::reduce.Redispatch(DispatchKey::kAutocast, op, self, dims, keepdim, kFloat32);
  }
  return ops::reduce.Redispatch(DispatchKey::kAutocast, op, self, dims, keepdim, dtype);
}
EMBER_REGISTER_KERNEL(reduce, kAutocast, &AutocastReduce);

}  // namespace
}  // namespace ember
