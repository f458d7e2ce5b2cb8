#include "tensor/factories.h"

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tensor/ops.h"

namespace ember {

namespace {

// What every factory checks before allocating: only CPU tensors can be
// pinned, and only when a device backend provides pinned memory (as torch
// refuses pinning without CUDA). The pinning itself happens in Finish.
void CheckPlacement(const TensorOptions& options, const char* op) {
  if (!options.pinned_memory()) return;
  EMBER_CHECK(options.device().is_cpu(), op, ": only CPU tensors can be pinned, but the device is ",
              options.device().str(), "; drop pinned_memory(true)");
  EMBER_CHECK(GetPinnedMemoryAllocator() != nullptr, op,
              ": pinned_memory(true) needs CUDA (pinned host memory is page-locked by the CUDA "
              "runtime), and //cuda is not linked; link it (it is part of //:ember) or drop "
              "pinned_memory(true)");
}

// The factory's last step: moved to pinned memory when the options ask
// (throws when no device backend provides it), then a leaf that requires
// grad when the options say so (throws for non-floating dtypes, and when
// //autograd is not linked).
Tensor Finish(Tensor t, const TensorOptions& options) {
  if (options.pinned_memory()) t = t.pin_memory();
  if (options.requires_grad()) t.requires_grad_(true);
  return t;
}

// A fresh tensor filled with `value`. It calls the device kernel directly, so
// the new tensor starts at version 0 (its fill is not an in-place
// modification anyone could have saved a tensor before), as in torch.
Tensor Filled(IntArrayRef sizes, const TensorOptions& options, const Scalar& value,
              const char* op) {
  CheckPlacement(options, op);
  Tensor t = EmptyTensor(sizes, options.dtype(), options.device());
  if (t.numel() > 0) ops::fill_out(t, value);
  return Finish(std::move(t), options);
}

// The options of a *_like factory: the input's dtype and device, overridden
// by what `options` sets.
TensorOptions LikeOptions(const Tensor& t, const TensorOptions& options, const char* op) {
  EMBER_CHECK(t.defined(), op, ": the input tensor is undefined");
  CheckPlacement(options, op);
  return t.options().merge_in(options);
}

Dtype DefaultDtypeFor(const Scalar& v) {
  if (v.is_bool()) return kBool;
  if (v.is_integral()) return kInt64;
  return kDefaultFloatDtype;
}

}  // namespace

Tensor empty(IntArrayRef sizes, TensorOptions options) {
  CheckPlacement(options, "empty");
  return Finish(EmptyTensor(sizes, options.dtype(), options.device()), options);
}
Tensor empty_like(const Tensor& t, TensorOptions options) {
  return empty(t.sizes(), LikeOptions(t, options, "empty_like"));
}

Tensor zeros(IntArrayRef sizes, TensorOptions options) {
  return Filled(sizes, options, 0, "zeros");
}
Tensor zeros_like(const Tensor& t, TensorOptions options) {
  return zeros(t.sizes(), LikeOptions(t, options, "zeros_like"));
}
Tensor ones(IntArrayRef sizes, TensorOptions options) { return Filled(sizes, options, 1, "ones"); }
Tensor ones_like(const Tensor& t, TensorOptions options) {
  return ones(t.sizes(), LikeOptions(t, options, "ones_like"));
}

Tensor full(IntArrayRef sizes, const Scalar& value, TensorOptions options) {
  if (!options.has_dtype()) options = options.dtype(DefaultDtypeFor(value));
  return Filled(sizes, options, value, "full");
}
Tensor full_like(const Tensor& t, const Scalar& value, TensorOptions options) {
  return full(t.sizes(), value, LikeOptions(t, options, "full_like"));
}

Tensor arange(const Scalar& end, TensorOptions options) { return arange(0, end, 1, options); }

Tensor arange(const Scalar& start, const Scalar& end, const Scalar& step, TensorOptions options) {
  CheckPlacement(options, "arange");
  bool all_int =
      !start.is_floating_point() && !end.is_floating_point() && !step.is_floating_point();
  TensorOptions o =
      options.has_dtype() ? options : options.dtype(all_int ? kInt64 : kDefaultFloatDtype);
  double s = start.to_double(), e = end.to_double(), st = step.to_double();
  EMBER_CHECK(st != 0, "arange: step must be nonzero");
  EMBER_CHECK(std::isfinite(s) && std::isfinite(e), "arange: unsupported range: ", s, " -> ", e);
  EMBER_CHECK((st > 0 && e >= s) || (st < 0 && e <= s),
              "arange: upper bound and larger bound inconsistent with step sign (start ", s,
              ", end ", e, ", step ", st, ")");
  int64_t n =
      all_int ? (end.to_int() - start.to_int() + step.to_int() - (st > 0 ? 1 : -1)) / step.to_int()
              : static_cast<int64_t>(std::ceil((e - s) / st));
  Tensor out = EmptyTensor({n}, o.dtype(), kCPU);
  VisitDtype(o.dtype(), [&]<typename T>() {
    T* p = out.data_ptr<T>();
    for (int64_t i = 0; i < n; ++i) {
      if (all_int) {
        p[i] = CastTo<T>(start.to_int() + i * step.to_int());
      } else {
        p[i] = CastTo<T>(s + static_cast<double>(i) * st);
      }
    }
  });
  return Finish(out.to(o.device()), o);
}

Tensor linspace(double start, double end, int64_t steps, TensorOptions options) {
  CheckPlacement(options, "linspace");
  EMBER_CHECK(steps >= 0, "linspace: number of steps must be non-negative, got ", steps);
  Tensor out = EmptyTensor({steps}, options.dtype(), kCPU);
  double step = steps > 1 ? (end - start) / static_cast<double>(steps - 1) : 0.0;
  VisitDtype(options.dtype(), [&]<typename T>() {
    T* p = out.data_ptr<T>();
    // Fill from both ends so that the last value is exactly `end`.
    int64_t half = steps / 2;
    for (int64_t i = 0; i < steps; ++i) {
      double v = i < half ? start + step * static_cast<double>(i)
                          : end - step * static_cast<double>(steps - 1 - i);
      p[i] = CastTo<T>(v);
    }
  });
  return Finish(out.to(options.device()), options);
}

Tensor eye(int64_t n, std::optional<int64_t> m, TensorOptions options) {
  int64_t cols = m.value_or(n);
  EMBER_CHECK(n >= 0 && cols >= 0, "eye: n and m must be non-negative, got ", n, " and ", cols);
  CheckPlacement(options, "eye");
  Tensor out = zeros({n, cols}, options.requires_grad(false));
  int64_t k = std::min(n, cols);
  // The kernel directly: a fresh tensor reads version 0 (Note [Fresh tensors
  // start at version 0] in ops.h).
  if (k > 0) ops::fill_out(out.as_strided({k}, {cols + 1}, 0), 1);
  return Finish(std::move(out), options);
}

// --- Random ---------------------------------------------------------------------

Generator::Generator(uint64_t seed, Device device)
    : device_(device), engine_(static_cast<uint32_t>(seed)), seed_(seed) {}

void Generator::SeedLocked(uint64_t seed) {
  if (device_.is_cpu()) engine_.seed(static_cast<uint32_t>(seed));
  seed_ = seed;
  offset_ = 0;
  spare_normal_.reset();
}

void Generator::manual_seed(uint64_t seed) {
  std::lock_guard<std::mutex> lock(mu_);
  SeedLocked(seed);
}

uint64_t Generator::initial_seed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return seed_;
}

uint64_t Generator::seed() {
  std::random_device source;
  const uint64_t s = (static_cast<uint64_t>(source()) << 32) | source();
  manual_seed(s);
  return s;
}

void Generator::CheckCpu(const char* call) const {
  EMBER_CHECK(device_.is_cpu(), "Generator::", call, ": draws on the host belong to a CPU "
              "generator, and this one is for ", device_.str(),
              "; its kernels take philox_engine_inputs instead");
}

void Generator::CheckDevice(const char* call) const {
  EMBER_CHECK(!device_.is_cpu(), "Generator::", call,
              ": a CPU generator has no Philox offset; use a device generator "
              "(Generator(seed, device))");
}

Generator::PhiloxInputs Generator::philox_engine_inputs(uint64_t increment) {
  CheckDevice("philox_engine_inputs");
  std::lock_guard<std::mutex> lock(mu_);
  PhiloxInputs in{seed_, offset_};
  offset_ += ((increment + 3) / 4) * 4;
  return in;
}

uint64_t Generator::offset() const {
  CheckDevice("offset");
  std::lock_guard<std::mutex> lock(mu_);
  return offset_;
}

void Generator::set_offset(uint64_t offset) {
  CheckDevice("set_offset");
  EMBER_CHECK(offset % 4 == 0, "Generator::set_offset: offset must be a multiple of 4, got ",
              offset);
  std::lock_guard<std::mutex> lock(mu_);
  offset_ = offset;
}

namespace {

// Note [The CPU generator's state]
// get_state() of a CPU generator is torch.get_rng_state()'s layout, 5,056
// bytes (PyTorch's CPUGeneratorImplState, little-endian x86-64): the initial
// seed (uint64 at 0), `left` and `seeded` (int32 at 8 and 12), `next`
// (uint64 at 16), the 624 engine words (each a uint64 at 24 + 8 i), the
// cached double normal (normal_y, double at 5024; normal_is_valid, int32
// at 5040; normal_x and normal_rho at 5016 and 5032 are always 0) and a
// float normal PyTorch caches (5048, valid flag at 5052), which Ember never
// has. So a state moves between Ember and PyTorch both ways. PyTorch's
// engine counts `left` down to a refill and `next` up through the words;
// std::mt19937 keeps one index p (libstdc++ writes the 624 words, then p,
// as its textual state): p = next, left = 625 - next, except right after
// seeding, where PyTorch has left 1, next 0 and std::mt19937 p = 624.
constexpr int64_t kCpuStateSize = 5056;
constexpr int kWords = 624;

template <typename T>
void PutLE(std::string& b, size_t at, T v) {
  std::memcpy(&b[at], &v, sizeof v);
}

template <typename T>
T GetLE(const std::string& b, size_t at) {
  T v;
  std::memcpy(&v, &b[at], sizeof v);
  return v;
}

// The engine's 624 words and index, from its textual state.
bool EngineWords(const std::mt19937& engine, std::vector<uint32_t>& words, size_t& index) {
  std::stringstream text;
  text << engine;
  words.resize(kWords);
  for (uint32_t& w : words) text >> w;
  text >> index;
  return static_cast<bool>(text);
}

// Whether `words` are MT19937's words right after seeding with `seed`.
bool Freshly(const std::vector<uint32_t>& words, uint32_t seed) {
  uint32_t x = seed;
  if (words[0] != x) return false;
  for (int i = 1; i < kWords; ++i) {
    x = 1812433253u * (x ^ (x >> 30)) + static_cast<uint32_t>(i);
    if (words[i] != x) return false;
  }
  return true;
}

}  // namespace

Tensor Generator::get_state() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string bytes;
  if (device_.is_cpu()) {
    // Note [The CPU generator's state].
    std::vector<uint32_t> words;
    size_t p = 0;
    EMBER_CHECK(EngineWords(engine_, words, p), "Generator::get_state: unreadable engine state");
    const bool fresh = p == kWords && Freshly(words, static_cast<uint32_t>(seed_));
    bytes.assign(kCpuStateSize, '\0');
    PutLE<uint64_t>(bytes, 0, seed_);
    PutLE<int32_t>(bytes, 8, fresh ? 1 : static_cast<int32_t>(kWords + 1 - p));
    PutLE<int32_t>(bytes, 12, 1);
    PutLE<uint64_t>(bytes, 16, fresh ? 0 : p);
    for (int i = 0; i < kWords; ++i) PutLE<uint64_t>(bytes, 24 + 8 * i, words[i]);
    PutLE<double>(bytes, 5024, spare_normal_.value_or(0.0));
    PutLE<int32_t>(bytes, 5040, spare_normal_ ? 1 : 0);
  } else {
    bytes.resize(kPhiloxStateSize);
    for (int i = 0; i < 8; ++i) {
      bytes[i] = static_cast<char>(seed_ >> (8 * i));
      bytes[8 + i] = static_cast<char>(offset_ >> (8 * i));
    }
  }
  Tensor state = EmptyTensor({static_cast<int64_t>(bytes.size())}, kUInt8, kCPU);
  if (!bytes.empty()) std::memcpy(state.raw_data(), bytes.data(), bytes.size());
  return state;
}

void Generator::set_state(const Tensor& state) {
  EMBER_CHECK(state.defined() && state.is_cpu() && state.dtype() == kUInt8 && state.dim() == 1,
              "Generator::set_state: expected a 1-D uint8 CPU tensor (what get_state returns), "
              "got ",
              state.defined() ? absl::StrCat(std::string(dtype_name(state.dtype())), " ",
                                             ShapeToString(state.sizes()), " on ",
                                             state.device().str())
                              : std::string("an undefined tensor"));
  const Tensor c = state.contiguous();
  const std::string bytes(static_cast<const char*>(c.raw_data()), c.numel());
  if (!device_.is_cpu()) {
    EMBER_CHECK(c.numel() == kPhiloxStateSize, "Generator::set_state: a ",
                DeviceTypeName(device_.type()), " generator's state is ", kPhiloxStateSize,
                " bytes (seed and offset), got ", c.numel());
    uint64_t seed = 0, offset = 0;
    for (int i = 0; i < 8; ++i) {
      seed |= static_cast<uint64_t>(static_cast<uint8_t>(bytes[i])) << (8 * i);
      offset |= static_cast<uint64_t>(static_cast<uint8_t>(bytes[8 + i])) << (8 * i);
    }
    EMBER_CHECK(offset % 4 == 0, "Generator::set_state: the offset in the state (", offset,
                ") is not a multiple of 4; the tensor is not a Philox generator's state");
    std::lock_guard<std::mutex> lock(mu_);
    seed_ = seed;
    offset_ = offset;
    return;
  }
  // Note [The CPU generator's state].
  EMBER_CHECK(c.numel() == kCpuStateSize, "Generator::set_state: ", c.numel(),
              " bytes are not a CPU generator's state, which is ", kCpuStateSize,
              " bytes (torch.get_rng_state()'s layout); pass what get_state() or "
              "torch.get_rng_state() returned");
  const int32_t left = GetLE<int32_t>(bytes, 8);
  const uint64_t next = GetLE<uint64_t>(bytes, 16);
  const bool fresh = left == 1 && next == 0;
  EMBER_CHECK(
      fresh || (next >= 1 && next <= kWords && left == kWords + 1 - static_cast<int64_t>(next)),
      "Generator::set_state: the state's position (left ", left, ", next ", next,
      ") is not one an MT19937 engine can be in; the bytes are not a CPU generator's state");
  std::ostringstream text;
  for (int i = 0; i < kWords; ++i) {
    const uint64_t w = GetLE<uint64_t>(bytes, 24 + 8 * i);
    EMBER_CHECK(w <= 0xffffffffu, "Generator::set_state: engine word ", i, " (", w,
                ") does not fit 32 bits; the bytes are not a CPU generator's state");
    text << w << ' ';
  }
  text << (fresh ? kWords : next);
  std::mt19937 engine;
  std::istringstream in(text.str());
  in >> engine;
  EMBER_CHECK(static_cast<bool>(in), "Generator::set_state: the engine words could not be read");
  const bool has_spare = GetLE<int32_t>(bytes, 5040) != 0;
  std::lock_guard<std::mutex> lock(mu_);
  seed_ = GetLE<uint64_t>(bytes, 0);
  engine_ = engine;
  spare_normal_.reset();
  if (has_spare) spare_normal_ = GetLE<double>(bytes, 5024);
}

uint32_t Generator::random() {
  CheckCpu("random");
  return static_cast<uint32_t>(engine_());
}

uint64_t Generator::random64() {
  CheckCpu("random64");
  const uint64_t high = engine_();
  return (high << 32) | static_cast<uint32_t>(engine_());
}

double Generator::NextDouble() {
  constexpr uint64_t kLow53 = (uint64_t{1} << 53) - 1;
  return static_cast<double>(random64() & kLow53) * (1.0 / 9007199254740992.0);
}

double Generator::NextNormal() {
  CheckCpu("NextNormal");
  if (spare_normal_) {
    double v = *spare_normal_;
    spare_normal_.reset();
    return v;
  }
  // PyTorch's normal_distribution<double>: the first draw is the angle, the
  // second the radius (log1p(-u) is finite on [0, 1)).
  const double u1 = NextDouble();
  const double u2 = NextDouble();
  const double r = std::sqrt(-2.0 * std::log1p(-u2));
  const double theta = 2.0 * M_PI * u1;
  spare_normal_ = r * std::sin(theta);
  return r * std::cos(theta);
}

double Generator::NextUniform(int mantissa_bits) {
  if (mantissa_bits >= 53) return NextDouble();
  const uint32_t mask = (uint32_t{1} << mantissa_bits) - 1;
  return static_cast<double>(random() & mask) * std::ldexp(1.0, -mantissa_bits);
}

int64_t Generator::NextInt(int64_t low, int64_t high) {
  CheckCpu("NextInt");
  const uint64_t range = static_cast<uint64_t>(high) - static_cast<uint64_t>(low);
  const uint64_t x = range >= (uint64_t{1} << 32) ? random64() : random();
  return static_cast<int64_t>(static_cast<uint64_t>(low) + x % range);
}

Generator& default_generator() {
  static Generator* gen = new Generator();
  return *gen;
}

namespace {

std::atomic<DeviceGenerators*> device_generators[kNumDeviceTypes];

}  // namespace

void SetDeviceGenerators(DeviceType type, DeviceGenerators* generators) {
  EMBER_CHECK(type != DeviceType::kCPU,
              "SetDeviceGenerators: the CPU's default generator is default_generator()");
  device_generators[static_cast<int>(type)].store(generators);
}

DeviceGenerators* GetDeviceGenerators(DeviceType type) {
  return device_generators[static_cast<int>(type)].load();
}

Generator& default_generator(Device device) {
  if (device.is_cpu()) return default_generator();
  DeviceGenerators* generators = GetDeviceGenerators(device.type());
  EMBER_CHECK(generators != nullptr, "no random number generator is registered for ",
              DeviceTypeName(device.type()), " devices; link //cuda (part of //:ember)");
  return generators->get(device.index());
}

void manual_seed(uint64_t seed) {
  default_generator().manual_seed(seed);
  for (int t = 0; t < kNumDeviceTypes; ++t) {
    if (DeviceGenerators* g = device_generators[t].load()) g->manual_seed_all(seed);
  }
}

namespace {

// The generator a random op on `t` draws from: the caller's, or the default
// one of t's device; it must belong to t's device type (torch's "Expected a
// 'cuda' device type for generator").
Generator* GeneratorFor(const Tensor& t, Generator* gen, const char* op) {
  Generator* g = gen != nullptr ? gen : &default_generator(t.device());
  EMBER_CHECK(g->device().type() == t.device().type(), op, ": expected a '",
              DeviceTypeName(t.device().type()), "' device type for generator but found '",
              DeviceTypeName(g->device().type()),
              "'; pass a generator of the tensor's device (Generator(seed, device)) or none");
  return g;
}

// A fresh tensor filled by `fill` (a dispatched *_out op), at version 0.
template <typename Fill>
Tensor FreshRandom(IntArrayRef sizes, const TensorOptions& options, Generator* gen,
                   const char* op, Fill fill) {
  CheckPlacement(options, op);
  Tensor t = EmptyTensor(sizes, options.dtype(), options.device());
  if (t.numel() > 0) fill(t, GeneratorFor(t, gen, op));
  ResetFreshVersion(t);
  return Finish(std::move(t), options);
}

// The in-place ops: drawn into a fresh tensor on t's device, then copied into
// `t` as any in-place write is (version bump, autograd's checks).
template <typename Fill>
Tensor FillRandom(const Tensor& t, Generator* gen, const char* op, Fill fill) {
  EMBER_CHECK(t.defined(), op, ": the tensor is undefined");
  Generator* g = GeneratorFor(t, gen, op);
  Tensor fresh = EmptyTensor(t.sizes(), t.dtype(), t.device());
  if (fresh.numel() > 0) fill(fresh, g);
  return t.copy_(fresh);
}

void CheckFloating(Dtype dtype, const char* op) {
  EMBER_CHECK(is_floating_point(dtype), op, ": expected a floating point dtype, got ",
              dtype_name(dtype), "; use randint for integers");
}

// --- CPU kernels: drawn on the host in row-major order ---------------------

template <typename Source>
void DrawCpu(const Tensor& out, Generator* gen, Source source) {
  const Tensor host = out.is_contiguous() ? out : EmptyTensor(out.sizes(), out.dtype(), kCPU);
  VisitDtype(host.dtype(), [&]<typename T>() {
    T* p = host.data_ptr<T>();
    std::lock_guard<std::mutex> lock(gen->mutex());
    for (int64_t i = 0; i < host.numel(); ++i) p[i] = CastTo<T>(source(*gen));
  });
  if (!host.is_same(out)) ops::copy_out(out, host);
}

// The significand bits PyTorch's uniform draw keeps for a dtype: 53 of a
// 64-bit draw for float64, else as many as the dtype's significand holds of
// a 32-bit draw (24 float32, 11 float16, 8 bfloat16).
int UniformBits(Dtype dtype) {
  switch (dtype) {
    case kFloat64:
      return 53;
    case kFloat16:
      return 11;
    case kBFloat16:
      return 8;
    default:
      return 24;
  }
}

// Note [PyTorch's CPU draws]
// uniform_ and normal_ on the CPU draw what PyTorch's CPU kernels draw for
// the same generator state, so a seed gives PyTorch's numbers (float64
// exactly; float32 normals within an ulp or two, PyTorch computing log, sin
// and cos with vectorised approximations). uniform: a draw of the dtype's
// significand bits (UniformBits) scaled into [from, to), the arithmetic in
// float64 as PyTorch's CPU accumulate type. normal: for a contiguous output
// of at least 16 elements, every element first gets a uniform draw of its
// dtype, then each block of 16 becomes 16 normals by Box-Muller in the
// dtype's own arithmetic (element j and j + 8 from one pair), the last,
// partial block redrawn as a whole block ending at the last element;
// smaller or non-contiguous outputs take one float64 normal per element
// (NextNormal, which keeps the second of each pair for the next call).
void UniformCpu(const Tensor& out, double from, double to, Generator* gen) {
  const int bits = UniformBits(out.dtype());
  // PyTorch holds the bounds in the dtype and subtracts them there (float16
  // and bfloat16 through float, rounded back).
  double lo = from, span = to - from;
  VisitDtype(out.dtype(), [&]<typename T>() {
    lo = CastTo<double>(CastTo<T>(from));
    if constexpr (std::is_floating_point_v<T>) {
      span = static_cast<double>(CastTo<T>(to) - CastTo<T>(from));
    } else {
      span = CastTo<double>(CastTo<T>(CastTo<float>(CastTo<T>(to)) - CastTo<float>(CastTo<T>(from))));
    }
  });
  DrawCpu(out, gen, [&](Generator& g) { return g.NextUniform(bits) * span + lo; });
}

template <typename T>
void NormalFill(T* data, int64_t n, double mean, double std, Generator& g, int bits) {
  using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
  std::vector<A> u(static_cast<size_t>(n));
  for (A& x : u) x = static_cast<A>(g.NextUniform(bits));
  const A m = static_cast<A>(mean), s = static_cast<A>(std);
  auto block = [&](int64_t at) {
    for (int64_t j = 0; j < 8; ++j) {
      const A u1 = A(1) - u[at + j];
      const A u2 = u[at + j + 8];
      const A radius = std::sqrt(A(-2) * std::log(u1));
      const A theta = static_cast<A>(2.0 * M_PI) * u2;
      u[at + j] = radius * std::cos(theta) * s + m;
      u[at + j + 8] = radius * std::sin(theta) * s + m;
    }
  };
  for (int64_t at = 0; at + 16 <= n; at += 16) block(at);
  if (n % 16 != 0) {
    for (int64_t j = n - 16; j < n; ++j) u[j] = static_cast<A>(g.NextUniform(bits));
    block(n - 16);
  }
  for (int64_t i = 0; i < n; ++i) data[i] = CastTo<T>(u[i]);
}

void NormalCpu(const Tensor& out, double mean, double std, Generator* gen) {
  if (out.numel() < 16 || !out.is_contiguous()) {
    DrawCpu(out, gen, [&](Generator& g) { return mean + std * g.NextNormal(); });
    return;
  }
  const int bits = UniformBits(out.dtype());
  VisitDtype(out.dtype(), [&]<typename T>() {
    std::lock_guard<std::mutex> lock(gen->mutex());
    NormalFill(out.data_ptr<T>(), out.numel(), mean, std, *gen, bits);
  });
}

void RandomCpu(const Tensor& out, int64_t low, int64_t high, Generator* gen) {
  DrawCpu(out, gen, [&](Generator& g) { return g.NextInt(low, high); });
}

void BernoulliCpu(const Tensor& out, double p, Generator* gen) {
  DrawCpu(out, gen, [&](Generator& g) { return g.NextDouble() < p ? 1 : 0; });
}

EMBER_REGISTER_KERNEL(uniform_out, kCPU, &UniformCpu);
EMBER_REGISTER_KERNEL(normal_out, kCPU, &NormalCpu);
EMBER_REGISTER_KERNEL(random_out, kCPU, &RandomCpu);
EMBER_REGISTER_KERNEL(bernoulli_out, kCPU, &BernoulliCpu);

}  // namespace

Tensor uniform_(const Tensor& t, double from, double to, Generator* gen) {
  CheckFloating(t.dtype(), "uniform_");
  EMBER_CHECK(from <= to, "uniform_: expects from <= to, but got from=", from, " > to=", to);
  return FillRandom(t, gen, "uniform_",
                    [&](const Tensor& out, Generator* g) { ops::uniform_out(out, from, to, g); });
}

Tensor normal_(const Tensor& t, double mean, double std, Generator* gen) {
  CheckFloating(t.dtype(), "normal_");
  EMBER_CHECK(std >= 0, "normal_: expects std >= 0.0, but found std ", std);
  return FillRandom(t, gen, "normal_",
                    [&](const Tensor& out, Generator* g) { ops::normal_out(out, mean, std, g); });
}

Tensor bernoulli_(const Tensor& t, double p, Generator* gen) {
  EMBER_CHECK(p >= 0.0 && p <= 1.0, "bernoulli_: expects 0 <= p <= 1, but got p=", p);
  return FillRandom(t, gen, "bernoulli_",
                    [&](const Tensor& out, Generator* g) { ops::bernoulli_out(out, p, g); });
}

Tensor bernoulli(const Tensor& probs, Generator* gen) {
  EMBER_CHECK(probs.defined(), "bernoulli: the probabilities tensor is undefined");
  CheckFloating(probs.dtype(), "bernoulli");
  return rand(probs.sizes(), TensorOptions(probs.dtype()).device(probs.device()), gen)
      .lt(probs)
      .to(probs.dtype());
}

Tensor rand(IntArrayRef sizes, TensorOptions options, Generator* gen) {
  CheckFloating(options.dtype(), "rand");
  return FreshRandom(sizes, options, gen, "rand",
                     [](const Tensor& out, Generator* g) { ops::uniform_out(out, 0.0, 1.0, g); });
}
Tensor rand_like(const Tensor& t, TensorOptions options, Generator* gen) {
  return rand(t.sizes(), LikeOptions(t, options, "rand_like"), gen);
}

Tensor randn(IntArrayRef sizes, TensorOptions options, Generator* gen) {
  CheckFloating(options.dtype(), "randn");
  return FreshRandom(sizes, options, gen, "randn",
                     [](const Tensor& out, Generator* g) { ops::normal_out(out, 0.0, 1.0, g); });
}
Tensor randn_like(const Tensor& t, TensorOptions options, Generator* gen) {
  return randn(t.sizes(), LikeOptions(t, options, "randn_like"), gen);
}

Tensor randint(int64_t low, int64_t high, IntArrayRef sizes, TensorOptions options,
               Generator* gen) {
  EMBER_CHECK(low < high, "randint: expects low < high, but got low=", low, ", high=", high);
  if (!options.has_dtype()) options = options.dtype(kInt64);
  return FreshRandom(sizes, options, gen, "randint", [&](const Tensor& out, Generator* g) {
    ops::random_out(out, low, high, g);
  });
}

Tensor randperm(int64_t n, TensorOptions options, Generator* gen) {
  EMBER_CHECK(n >= 0, "randperm: n must be non-negative, got ", n);
  CheckPlacement(options, "randperm");
  if (!options.has_dtype()) options = options.dtype(kInt64);
  Generator* g = gen != nullptr ? gen : &default_generator();
  EMBER_CHECK(g->device().is_cpu(), "randperm: draws on a CPU generator, and this one is for ",
              g->device().str(), "; pass a CPU Generator or none");
  std::vector<int64_t> p(static_cast<size_t>(n));
  std::iota(p.begin(), p.end(), int64_t{0});
  {
    // PyTorch's CPU kernel: a 32-bit draw per swap below 2^32 / 20
    // elements, a 64-bit one above.
    std::lock_guard<std::mutex> lock(g->mutex());
    const bool wide = n >= static_cast<int64_t>(std::numeric_limits<uint32_t>::max() / 20);
    for (int64_t i = 0; i + 1 < n; ++i) {
      const uint64_t rest = static_cast<uint64_t>(n - i);
      const int64_t z = static_cast<int64_t>((wide ? g->random64() : g->random()) % rest);
      std::swap(p[i], p[i + z]);
    }
  }
  Tensor out = tensor(p);
  if (options.dtype() != kInt64) out = out.to(options.dtype());
  return Finish(options.device().is_cpu() ? std::move(out) : out.to(options.device()), options);
}

// --- Caller memory ----------------------------------------------------------------

Tensor from_blob(void* data, IntArrayRef sizes, TensorOptions options,
                 std::function<void(void*)> deleter) {
  return from_blob(data, sizes, ContiguousStrides(sizes), options, std::move(deleter));
}

Tensor from_blob(void* data, IntArrayRef sizes, IntArrayRef strides, TensorOptions options,
                 std::function<void(void*)> deleter) {
  EMBER_CHECK(sizes.size() == strides.size(), "from_blob: got ", sizes.size(), " sizes but ",
              strides.size(), " strides");
  EMBER_CHECK(!options.pinned_memory(),
              "from_blob: pinned_memory(true) does not apply: the memory is the caller's, and "
              "from_blob neither copies nor pins it; drop pinned_memory(true)");
  int64_t extent = 0;
  for (size_t d = 0; d < sizes.size(); ++d) {
    EMBER_CHECK(sizes[d] >= 0 && strides[d] >= 0, "from_blob: sizes ", ShapeToString(sizes),
                " and strides ", ShapeToString(strides), " must be non-negative");
    extent += sizes[d] == 0 ? 0 : (sizes[d] - 1) * strides[d];
  }
  size_t nbytes = Numel(sizes) == 0 ? 0 : (extent + 1) * element_size(options.dtype());
  EMBER_CHECK(data != nullptr || nbytes == 0, "from_blob: null data for a non-empty tensor");
  DataPtr ptr;
  if (deleter) {
    struct Context {
      void* data;
      std::function<void(void*)> deleter;
    };
    auto* ctx = new Context{data, std::move(deleter)};
    ptr = DataPtr(
        data, ctx,
        [](void* c) {
          auto* context = static_cast<Context*>(c);
          context->deleter(context->data);
          delete context;
        },
        options.device());
  } else {
    ptr = DataPtr(data, nullptr, nullptr, options.device());
  }
  Tensor t(MakeTensorImpl(Storage(std::move(ptr), nbytes), options.dtype(), sizes, strides, 0));
  return Finish(std::move(t), options);
}

namespace internal {
Tensor copy_from_host(const void* data, size_t count, Dtype dtype, IntArrayRef sizes,
                    const TensorOptions& options) {
  EMBER_CHECK(Numel(sizes) == static_cast<int64_t>(count), "tensor: ", count,
              " values do not fill shape ", ShapeToString(sizes), " (", Numel(sizes), " elements)");
  CheckPlacement(options, "tensor");
  Tensor out = EmptyTensor(sizes, dtype, kCPU);
  if (count > 0) std::memcpy(out.raw_data(), data, count * element_size(dtype));
  out = out.to(options.dtype_opt().value_or(dtype)).to(options.device());
  return Finish(std::move(out), options);
}
}  // namespace internal

Tensor tensor(std::initializer_list<float> v, TensorOptions options) {
  return tensor(std::vector<float>(v), options);
}
Tensor tensor(std::initializer_list<double> v, TensorOptions options) {
  return tensor(std::vector<double>(v), options);
}
Tensor tensor(std::initializer_list<int64_t> v, TensorOptions options) {
  return tensor(std::vector<int64_t>(v), options);
}
Tensor tensor(std::initializer_list<int> v, TensorOptions options) {
  return tensor(std::vector<int64_t>(v.begin(), v.end()), options);
}
Tensor tensor(std::initializer_list<bool> v, TensorOptions options) {
  return tensor(std::vector<bool>(v), options);
}

Tensor scalar_tensor(const Scalar& value, TensorOptions options) {
  return full({}, value, options);
}

}  // namespace ember
