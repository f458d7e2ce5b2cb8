#include "nn/onednn.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <list>
#include <memory>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <optional>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tensor/allocator.h"
#include "tensor/error.h"
#include "tensor/thread_pool.h"

namespace ember::nn::internal::onednn {
namespace {

using dnnl::memory;
using tag = memory::format_tag;
using dt = memory::data_type;

std::atomic<bool>& EnabledFlag() {
  static std::atomic<bool> enabled{[] {
    const char* env = std::getenv("EMBER_ONEDNN");
    return env == nullptr || std::string_view(env) != "0";
  }()};
  return enabled;
}

const dnnl::engine& Engine() {
  static const dnnl::engine* engine = new dnnl::engine(dnnl::engine::kind::cpu, 0);
  return *engine;
}

// Note [Weight gradients out of OIhw16i16o]
// On AVX-512 oneDNN's backward weights writes the weight gradient as
// OIhw16i16o (o fastest in a 16x16 tile of o and i per kernel tap), and its
// reorder back to OIHW is the slowest of a training step's reorders (ResNet-18
// at batch 16: 12.9 of 29 ms of weight reorders per step; 2.2-2.4 ms for
// 512x512x3x3, where the reorder into that layout takes 0.7-1.3 ms). The
// gradient of 16 output channels and 16 input channels, row `o` holding i
// and the kernel taps (i * K + k, K = kh * kw) contiguously, is a 16 x 16K
// matrix; its transpose, 16K rows of 16 output channels, is the blocked tile
// column by column: row i * K + k is the blocked vector at (k * 16 + i) * 16.
// So UnblockOIhw16i16o loads 16 such vectors, transposes them in registers
// and stores 16 contiguous row pieces (1.0-1.4 ms for 512x512x3x3). The
// forward's weights go the other way, OIHW into OIhw16i16o, by the inverse
// (BlockOIhw16i16o: the same transposes, loads and stores swapped). Large
// copies stream their stores (Note [Streaming weight copies]). Used when the
// CPU has AVX-512 and the layout is exactly that, with O and I multiples of
// 16; other layouts take oneDNN's reorder.

// r[0..15] = their transpose, by four rounds that swap the off-diagonal b x b
// blocks of every 2b x 2b block (b = 8, 4, 2, 1).
template <int b>
__attribute__((target("avx512f"), always_inline)) inline void SwapBlocks(__m512 r[16]) {
  alignas(64) static constexpr std::array<int32_t, 16> kLow = [] {
    std::array<int32_t, 16> idx{};
    for (int j = 0; j < 16; ++j) idx[j] = (j & b) == 0 ? j : 16 + j - b;
    return idx;
  }();
  alignas(64) static constexpr std::array<int32_t, 16> kHigh = [] {
    std::array<int32_t, 16> idx{};
    for (int j = 0; j < 16; ++j) idx[j] = (j & b) == 0 ? j + b : 16 + j;
    return idx;
  }();
  const __m512i low = _mm512_load_si512(kLow.data()), high = _mm512_load_si512(kHigh.data());
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) {
    if ((i & b) != 0) continue;
    const __m512 top = r[i], bottom = r[i + b];
    r[i] = _mm512_permutex2var_ps(top, low, bottom);
    r[i + b] = _mm512_permutex2var_ps(top, high, bottom);
  }
}

// Note [Streaming weight copies]
// A layer's weights, in either layout, are copied once per training step
// (the forward's blocked copy, backward data's tile transpose of it, the
// gradient back to OIHW). A large copy does not stay in cache for the
// primitive that reads it, so ordinary stores pay to read every destination
// line before overwriting it. Copies of at least kStreamBytes with 64-byte
// aligned destinations are written with non-temporal stores instead, which
// skip that read: 512x512x3x3 into OIhw16i16o took 1.0-1.4 ms with ordinary
// stores and oneDNN's reorder 1.1-1.3 ms, against 0.4-0.6 ms streamed. With
// source and destination out of cache, as in a training step, streaming is
// faster for all three copies from 1 MiB up (blocking 2x, the tile transpose
// 1.3-1.5x, unblocking 1.2x); when the destination is already in cache (a
// buffer reused call after call, as in conv_benchmark's BM_Conv rows) the
// transpose and unblocking are up to 1.5x slower streamed, which costs
// layer3's backward weights there about 2%.
inline constexpr size_t kStreamBytes = size_t{1} << 20;

bool Streams(const void* dst, size_t bytes) {
  return bytes >= kStreamBytes && reinterpret_cast<uintptr_t>(dst) % 64 == 0;
}

// *p = v; through a non-temporal store when kStream (p 64-byte aligned).
template <bool kStream>
__attribute__((target("avx512f"), always_inline)) inline void Store(float* p, __m512 v) {
  if constexpr (kStream) {
    _mm512_stream_ps(p, v);
  } else {
    _mm512_storeu_ps(p, v);
  }
}

// plain[O][I][K] = blocked[O/16][I/16][K][16 i][16 o] (Note [Weight gradients
// out of OIhw16i16o]); O and I multiples of 16.
template <bool kStream>
__attribute__((target("avx512f"))) void UnblockOIhw16i16oTo(const float* blocked, float* plain,
                                                            int64_t o_size, int64_t i_size,
                                                            int64_t k_size) {
  const int64_t ik = i_size * k_size;
  for (int64_t ob = 0; ob < o_size / 16; ++ob) {
    for (int64_t ib = 0; ib < i_size / 16; ++ib) {
      const float* tile = blocked + (ob * (i_size / 16) + ib) * k_size * 256;
      float* rows = plain + ob * 16 * ik + ib * 16 * k_size;
      for (int64_t col = 0; col < k_size; ++col) {
        __m512 r[16];
#pragma GCC unroll 16
        for (int j = 0; j < 16; ++j) {
          const int64_t c = col * 16 + j;  // = i * K + k
          r[j] = _mm512_loadu_ps(tile + ((c % k_size) * 16 + c / k_size) * 16);
        }
        SwapBlocks<8>(r);
        SwapBlocks<4>(r);
        SwapBlocks<2>(r);
        SwapBlocks<1>(r);
#pragma GCC unroll 16
        for (int o = 0; o < 16; ++o) Store<kStream>(rows + o * ik + col * 16, r[o]);
      }
    }
  }
}

// blocked[O/16][I/16][K][16 i][16 o] = plain[O][I][K], the inverse of
// UnblockOIhw16i16o: the forward's weight layout, made once per weight
// version (Note [oneDNN weight cache]); O and I multiples of 16.
template <bool kStream>
__attribute__((target("avx512f"))) void BlockOIhw16i16oTo(const float* plain, float* blocked,
                                                          int64_t o_size, int64_t i_size,
                                                          int64_t k_size) {
  const int64_t ik = i_size * k_size;
  for (int64_t ob = 0; ob < o_size / 16; ++ob) {
    for (int64_t ib = 0; ib < i_size / 16; ++ib) {
      float* tile = blocked + (ob * (i_size / 16) + ib) * k_size * 256;
      const float* rows = plain + ob * 16 * ik + ib * 16 * k_size;
      for (int64_t col = 0; col < k_size; ++col) {
        __m512 r[16];
#pragma GCC unroll 16
        for (int o = 0; o < 16; ++o) r[o] = _mm512_loadu_ps(rows + o * ik + col * 16);
        SwapBlocks<8>(r);
        SwapBlocks<4>(r);
        SwapBlocks<2>(r);
        SwapBlocks<1>(r);
#pragma GCC unroll 16
        for (int j = 0; j < 16; ++j) {
          const int64_t c = col * 16 + j;  // = i * K + k
          Store<kStream>(tile + ((c % k_size) * 16 + c / k_size) * 16, r[j]);
        }
      }
    }
  }
}

// dst = src with every 16x16 tile transposed: OIhw16i16o <-> OIhw16o16i,
// whose tiles sit at the same offsets; `floats` a multiple of 256.
template <bool kStream>
__attribute__((target("avx512f"))) void TransposeTilesTo(const float* src, float* dst,
                                                         int64_t floats) {
  for (int64_t t = 0; t < floats; t += 256) {
    __m512 r[16];
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) r[j] = _mm512_loadu_ps(src + t + j * 16);
    SwapBlocks<8>(r);
    SwapBlocks<4>(r);
    SwapBlocks<2>(r);
    SwapBlocks<1>(r);
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) Store<kStream>(dst + t + j * 16, r[j]);
  }
}

// The three weight copies, streamed where Streams() says so, split across
// Ember's threads in parts of 16 output channels (of one 16x16 tile for
// TransposeTiles). CopyInParts runs copy(kStream, first float, parts) on
// each thread's share and fences its streaming stores before it finishes.
inline constexpr int64_t kCopyGrain = kDefaultGrainSize * 4;  // floats per share

template <typename Copy>
void CopyInParts(int64_t parts, int64_t part_floats, bool stream, const Copy& copy) {
  parallel_for(0, parts, std::max<int64_t>(1, kCopyGrain / part_floats), [&](int64_t b, int64_t e) {
    if (stream) {
      copy(std::true_type{}, b * part_floats, e - b);
      _mm_sfence();
    } else {
      copy(std::false_type{}, b * part_floats, e - b);
    }
  });
}

void UnblockOIhw16i16o(const float* blocked, float* plain, int64_t o, int64_t i, int64_t k) {
  CopyInParts(o / 16, 16 * i * k, Streams(plain, sizeof(float) * o * i * k),
              [&](auto stream, int64_t at, int64_t parts) {
                UnblockOIhw16i16oTo<stream()>(blocked + at, plain + at, parts * 16, i, k);
              });
}
void BlockOIhw16i16o(const float* plain, float* blocked, int64_t o, int64_t i, int64_t k) {
  CopyInParts(o / 16, 16 * i * k, Streams(blocked, sizeof(float) * o * i * k),
              [&](auto stream, int64_t at, int64_t parts) {
                BlockOIhw16i16oTo<stream()>(plain + at, blocked + at, parts * 16, i, k);
              });
}
void TransposeTiles(const float* src, float* dst, int64_t floats) {
  CopyInParts(floats / 256, 256, Streams(dst, sizeof(float) * floats),
              [&](auto stream, int64_t at, int64_t parts) {
                TransposeTilesTo<stream()>(src + at, dst + at, parts * 256);
              });
}

// Note [Activations in nChw16c]
// oneDNN's convolutions on AVX-512 read and write activations as nChw16c
// (16 channels fastest), and nn's tensors are NCHW, so each call reorders
// its input in and its output back. For a block of 16 channels that is a
// transpose of a 16 x HW matrix (16 planes) into HW x 16, done here 16
// columns at a time in registers (masked at the end of a plane), in place of
// oneDNN's reorder: as fast as it on planes of 16 pixels or more (16x64x8x8:
// 6.6 us both ways), 1.3-2.5x faster on 2x2 planes (16x256x2x2: 2.5 against
// 3.5 us in, 6.1 against 15.4 us back). With a 1x1 plane the two layouts are
// the same bytes and nothing is copied at all. Used when the CPU has AVX-512
// and C is a multiple of 16; otherwise oneDNN's reorder runs.

// blocked[b][p][16] = plain[b * 16 + j][p] for `blocks` blocks of 16 planes
// of `hw` floats (n * C / 16 blocks: NCHW -> nChw16c), or the reverse.
template <bool kToBlocked>
__attribute__((target("avx512f"))) void TransposePlanes(const float* src, float* dst,
                                                        int64_t blocks, int64_t hw) {
  for (int64_t b = 0; b < blocks; ++b) {
    const float* in = src + b * 16 * hw;
    float* out = dst + b * 16 * hw;
    for (int64_t p = 0; p < hw; p += 16) {
      const int m = static_cast<int>(std::min<int64_t>(16, hw - p));
      const __mmask16 mask = static_cast<__mmask16>((1u << m) - 1);
      __m512 r[16];
#pragma GCC unroll 16
      for (int j = 0; j < 16; ++j) {
        if constexpr (kToBlocked) {
          r[j] = _mm512_maskz_loadu_ps(mask, in + j * hw + p);
        } else {
          r[j] = j < m ? _mm512_loadu_ps(in + (p + j) * 16) : _mm512_setzero_ps();
        }
      }
      SwapBlocks<8>(r);
      SwapBlocks<4>(r);
      SwapBlocks<2>(r);
      SwapBlocks<1>(r);
#pragma GCC unroll 16
      for (int j = 0; j < 16; ++j) {
        if constexpr (kToBlocked) {
          if (j < m) _mm512_storeu_ps(out + (p + j) * 16, r[j]);
        } else {
          _mm512_mask_storeu_ps(out + j * hw + p, mask, r[j]);
        }
      }
    }
  }
}

// TransposePlanes over `blocks` blocks, split across Ember's threads.
template <bool kToBlocked>
void TransposePlanesParallel(const float* src, float* dst, int64_t blocks, int64_t hw) {
  const int64_t grain = std::max<int64_t>(1, kDefaultGrainSize / (16 * hw));
  parallel_for(0, blocks, grain, [&](int64_t begin, int64_t end) {
    TransposePlanes<kToBlocked>(src + begin * 16 * hw, dst + begin * 16 * hw, end - begin, hw);
  });
}

bool HasAvx512() {
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  return avx512;
}

// Whether `inner` is nChw16c over the plain NCHW `user`, dense, with C a
// multiple of 16 (Note [Activations in nChw16c]).
bool IsNChw16c(const memory::desc& user, const memory::desc& inner) {
  if (user.data.ndims != 4) return false;
  const memory::dims d = user.dims();
  return d[1] % 16 == 0 && user == memory::desc(d, dt::f32, tag::nchw) &&
         inner == memory::desc(d, dt::f32, tag::nChw16c);
}

// Whether `inner` is OIhw16i16o over the plain OIHW `user`, dense, with O
// and I multiples of 16, on a CPU with AVX-512.
bool IsOIhw16i16o(const memory::desc& user, const memory::desc& inner) {
  const bool avx512 = HasAvx512();
  const dnnl_memory_desc_t& u = user.data;
  const dnnl_memory_desc_t& d = inner.data;
  if (!avx512 || d.ndims != 4 || u.ndims != 4 || d.format_kind != dnnl_blocked || d.offset0 != 0 ||
      user != memory::desc(user.dims(), dt::f32, tag::oihw)) {
    return false;
  }
  const dnnl_blocking_desc_t& b = d.format_desc.blocking;
  const int64_t o = d.dims[0], i = d.dims[1], kh = d.dims[2], kw = d.dims[3];
  for (int k = 0; k < 4; ++k) {
    if (d.padded_dims[k] != d.dims[k] || d.padded_offsets[k] != 0) return false;
  }
  return o % 16 == 0 && i % 16 == 0 && b.inner_nblks == 2 && b.inner_blks[0] == 16 &&
         b.inner_blks[1] == 16 && b.inner_idxs[0] == 1 && b.inner_idxs[1] == 0 &&
         b.strides[3] == 256 && b.strides[2] == kw * 256 && b.strides[1] == kh * kw * 256 &&
         b.strides[0] == (i / 16) * kh * kw * 256;
}

// One argument of a cached primitive in Ember's layout (`user`) and in the
// primitive's (`inner`), with the reorder between them when they differ.
struct Arg {
  int id = 0;
  memory::desc user, inner;
  std::optional<dnnl::reorder> reorder;  // user -> inner for inputs, back for outputs
  // Who copies between the layouts: oneDNN's reorder, or Ember's transposes
  // (Note [Weight gradients out of OIhw16i16o], Note [Activations in
  // nChw16c]), which then run instead of it.
  enum class Copy { kReorder, kOIhw16i16o, kNChw16c } copy = Copy::kReorder;
  // For an OIhw16o16i input: the OIhw16i16o layout whose cached copy it may
  // be transposed from.
  std::optional<memory::desc> sibling;
};

// A primitive with its arguments.
struct Entry {
  dnnl::primitive primitive;
  size_t scratchpad_bytes = 0;
  std::vector<Arg> inputs, outputs;
};

dnnl::primitive_attr UserScratchpad() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

Arg MakeArg(int id, const memory::desc& user, const memory::desc& inner, bool input) {
  Arg a{id, user, inner, std::nullopt, Arg::Copy::kReorder, std::nullopt};
  if (IsOIhw16i16o(user, inner)) a.copy = Arg::Copy::kOIhw16i16o;
  if (HasAvx512() && IsNChw16c(user, inner)) {
    a.copy = Arg::Copy::kNChw16c;
    // One pixel per plane: nChw16c is NCHW's bytes; the primitive reads and
    // writes Ember's buffer itself.
    if (user.dims()[2] * user.dims()[3] == 1) a.user = inner;
  }
  if (input && user.data.ndims == 4) {
    // OIhw16o16i is OIhw16i16o with every tile transposed.
    const memory::desc twin(user.dims(), dt::f32, tag::ABcd16b16a);
    if (IsOIhw16i16o(user, twin) && inner == memory::desc(user.dims(), dt::f32, tag::ABcd16a16b)) {
      a.sibling = twin;
    }
  }
  if (a.user != inner) {
    const dnnl::primitive_attr attr;  // reorders of plain tensors need no scratchpad
    a.reorder =
        input ? dnnl::reorder(dnnl::reorder::primitive_desc(Engine(), user, Engine(), inner, attr))
              : dnnl::reorder(dnnl::reorder::primitive_desc(Engine(), inner, Engine(), user, attr));
  }
  return a;
}

// Sets the calling thread's OpenMP thread count to the team Ember's ops may
// use here (internal::openmp_threads(): one inside a parallel_for body and
// in a child forked after the team started) and returns it. oneDNN fixes a
// primitive's thread count when it builds it, so the count is part of every
// cache key.
int64_t MatchThreads() {
  int n = ember::internal::openmp_threads();
  if (omp_get_max_threads() != n) omp_set_num_threads(n);
  return n;
}

// The process's primitive cache (Note [oneDNN kernels]).
class Cache {
 public:
  using Key = std::vector<int64_t>;

  // The entry for `key` on the calling thread's thread count (which this
  // sets, Note [oneDNN kernels]), built by `make` on a miss.
  template <typename Make>
  std::shared_ptr<const Entry> Get(Key key, Make make) {
    key.push_back(MatchThreads());
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (auto it = map_.find(key); it != map_.end()) {
        lru_.splice(lru_.begin(), lru_, it->second.second);
        return it->second.first;
      }
    }
    // Built outside the lock (it may take milliseconds); a racing builder of
    // the same key loses harmlessly.
    std::shared_ptr<const Entry> entry = make();
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = map_.find(key); it != map_.end()) return it->second.first;
    lru_.push_front(key);
    map_.emplace(key, std::make_pair(entry, lru_.begin()));
    while (map_.size() > kPrimitiveCacheCapacity) {
      map_.erase(lru_.back());
      lru_.pop_back();
    }
    return entry;
  }

  size_t size() {
    std::lock_guard<std::mutex> lock(mu_);
    return map_.size();
  }

  static Cache& Get() {
    static Cache* cache = new Cache();
    return *cache;
  }

 private:
  struct Hash {
    size_t operator()(const Key& k) const {
      size_t h = 1469598103934665603ull;
      for (int64_t v : k) h = (h ^ static_cast<size_t>(v)) * 1099511628211ull;
      return h;
    }
  };
  std::mutex mu_;
  std::list<Key> lru_;
  std::unordered_map<Key, std::pair<std::shared_ptr<const Entry>, std::list<Key>::iterator>, Hash>
      map_;
};

using Fingerprint = std::array<uint32_t, kWeightFingerprint>;

// The bits of kWeightFingerprint values spread over `bytes` of float32 at
// `data` (Note [oneDNN weight cache]).
Fingerprint FingerprintOf(const void* data, size_t bytes) {
  Fingerprint f{};
  const size_t n = bytes / sizeof(float);
  if (n == 0) return f;
  const auto* words = static_cast<const uint32_t*>(data);
  for (size_t i = 0; i < f.size(); ++i) f[i] = words[i * (n - 1) / (f.size() - 1)];
  return f;
}

// The blocked copies of weights (Note [oneDNN weight cache]): one entry per
// weight tensor and layout, searched linearly (a network has tens).
class WeightCache {
 public:
  using Block = std::shared_ptr<const DataPtr>;

  // The copy of the weight `v` names, whose values are the `plain_bytes` at
  // `plain`, in `layout`; on a miss a fresh buffer filled by fill(buffer).
  template <typename Fill>
  Block Get(const WeightVersion& v, const void* plain, size_t plain_bytes,
            const memory::desc& layout, Fill fill) {
    const Fingerprint fingerprint = FingerprintOf(plain, plain_bytes);
    if (Block hit = Find(v, plain, fingerprint, layout)) return hit;
    auto block = std::make_shared<DataPtr>(GetCpuAllocator()->Allocate(layout.get_size()));
    fill(block->get());
    std::lock_guard<std::mutex> lock(mu_);
    // Drop this weight's entry of another version, and those of freed weights.
    std::erase_if(items_, [&](const Item& item) {
      const bool drop =
          item.owner.expired() || (item.counter == v.counter.get() && item.layout == layout);
      if (drop) bytes_ -= item.bytes;
      return drop;
    });
    items_.push_back(Item{v.counter, v.counter.get(), layout, v.version, plain, fingerprint, block,
                          layout.get_size(), ++clock_});
    bytes_ += layout.get_size();
    while (bytes_ > kWeightCacheBytes && items_.size() > 1) {
      auto lru =
          std::min_element(items_.begin(), items_.end() - 1,
                           [](const Item& a, const Item& b) { return a.last_use < b.last_use; });
      bytes_ -= lru->bytes;
      items_.erase(lru);
    }
    if (bytes_ > kWeightCacheBytes) {  // this one alone is too big to keep
      bytes_ = 0;
      items_.clear();
    }
    return block;
  }

  // The copy Get would return without filling one, or null.
  Block Find(const WeightVersion& v, const void* plain, const Fingerprint& fingerprint,
             const memory::desc& layout) {
    std::lock_guard<std::mutex> lock(mu_);
    for (Item& item : items_) {
      if (item.counter == v.counter.get() && !item.owner.expired() && item.version == v.version &&
          item.data == plain && item.fingerprint == fingerprint && item.layout == layout) {
        item.last_use = ++clock_;
        return item.block;
      }
    }
    return nullptr;
  }

  size_t size() {
    std::lock_guard<std::mutex> lock(mu_);
    std::erase_if(items_, [&](const Item& item) {
      if (item.owner.expired()) bytes_ -= item.bytes;
      return item.owner.expired();
    });
    return items_.size();
  }

  static WeightCache& Get() {
    static WeightCache* cache = new WeightCache();
    return *cache;
  }

 private:
  struct Item {
    std::weak_ptr<const void> owner;  // the version counter
    const void* counter;
    memory::desc layout;
    uint32_t version;
    const void* data;
    Fingerprint fingerprint;
    Block block;
    size_t bytes;
    uint64_t last_use;
  };
  std::mutex mu_;
  std::vector<Item> items_;
  size_t bytes_ = 0;
  uint64_t clock_ = 0;
};

// Fills `buffer` with input `a` in the primitive's layout from Ember's
// `plain` buffer.
void CopyIn(const Arg& a, dnnl::stream& stream, const void* plain, void* buffer) {
  const auto* from = static_cast<const float*>(plain);
  auto* to = static_cast<float*>(buffer);
  const memory::dims d = a.user.dims();
  switch (a.copy) {
    case Arg::Copy::kOIhw16i16o:
      BlockOIhw16i16o(from, to, d[0], d[1], d[2] * d[3]);
      return;
    case Arg::Copy::kNChw16c:
      TransposePlanesParallel<true>(from, to, d[0] * d[1] / 16, d[2] * d[3]);
      return;
    case Arg::Copy::kReorder:
      break;
  }
  const dnnl::engine& eng = Engine();
  memory user(a.user, eng, const_cast<void*>(plain)), inner(a.inner, eng, buffer);
  a.reorder->execute(stream, user, inner);
  stream.wait();
}

// CopyIn's way back: fills Ember's `plain` buffer with output `a` from
// `buffer`, where the primitive wrote it in its layout.
void CopyOut(const Arg& a, dnnl::stream& stream, const void* buffer, void* plain) {
  const auto* from = static_cast<const float*>(buffer);
  auto* to = static_cast<float*>(plain);
  const memory::dims d = a.user.dims();
  switch (a.copy) {
    case Arg::Copy::kOIhw16i16o:
      UnblockOIhw16i16o(from, to, d[0], d[1], d[2] * d[3]);
      return;
    case Arg::Copy::kNChw16c:
      TransposePlanesParallel<false>(from, to, d[0] * d[1] / 16, d[2] * d[3]);
      return;
    case Arg::Copy::kReorder:
      break;
  }
  const dnnl::engine& eng = Engine();
  memory inner(a.inner, eng, const_cast<void*>(buffer)), user(a.user, eng, plain);
  a.reorder->execute(stream, inner, user);
}

// Runs `e` on Ember's buffers: `in[i]` for e.inputs[i], `out[i]` for
// e.outputs[i], reordering where the layouts differ; temporaries and the
// scratchpad come from Ember's CPU allocator. Input `weight`, when `version`
// names it, comes from the weight cache.
void Execute(const Entry& e, const std::vector<const void*>& in, const std::vector<void*>& out,
             size_t weight = 0, const WeightVersion& version = {}) {
  const dnnl::engine& eng = Engine();
  dnnl::stream stream(eng);
  Allocator* alloc = GetCpuAllocator();
  std::vector<DataPtr> temps;
  std::vector<WeightCache::Block> blocks;
  std::unordered_map<int, memory> args;
  for (size_t i = 0; i < e.inputs.size(); ++i) {
    const Arg& a = e.inputs[i];
    if (!a.reorder) {
      args.emplace(a.id, memory(a.user, eng, const_cast<void*>(in[i])));
      continue;
    }
    if (i == weight && version.counter != nullptr) {
      WeightCache& cache = WeightCache::Get();
      blocks.push_back(cache.Get(version, in[i], a.user.get_size(), a.inner, [&](void* buffer) {
        // Backward data's OIhw16o16i from the forward's OIhw16i16o copy of
        // this version, when there is one (Note [oneDNN weight cache]).
        if (a.sibling) {
          const WeightCache::Block forward =
              cache.Find(version, in[i], FingerprintOf(in[i], a.user.get_size()), *a.sibling);
          if (forward != nullptr) {
            TransposeTiles(static_cast<const float*>(forward->get()), static_cast<float*>(buffer),
                           static_cast<int64_t>(a.inner.get_size() / sizeof(float)));
            return;
          }
        }
        CopyIn(a, stream, in[i], buffer);
      }));
      args.emplace(a.id, memory(a.inner, eng, const_cast<void*>(blocks.back()->get())));
      continue;
    }
    temps.push_back(alloc->Allocate(a.inner.get_size()));
    CopyIn(a, stream, in[i], temps.back().get());
    args.emplace(a.id, memory(a.inner, eng, temps.back().get()));
  }
  std::vector<void*> inner_out(e.outputs.size(), nullptr);  // where each output lands first
  for (size_t i = 0; i < e.outputs.size(); ++i) {
    const Arg& a = e.outputs[i];
    if (!a.reorder) {
      args.emplace(a.id, memory(a.user, eng, out[i]));
      continue;
    }
    temps.push_back(alloc->Allocate(a.inner.get_size()));
    inner_out[i] = temps.back().get();
    args.emplace(a.id, memory(a.inner, eng, inner_out[i]));
  }
  if (e.scratchpad_bytes > 0) {
    temps.push_back(alloc->Allocate(e.scratchpad_bytes));
    args.emplace(DNNL_ARG_SCRATCHPAD,
                 memory(memory::desc({static_cast<int64_t>(e.scratchpad_bytes)}, dt::u8, tag::x),
                        eng, temps.back().get()));
  }
  try {
    e.primitive.execute(stream, args);
    stream.wait();
    for (size_t i = 0; i < e.outputs.size(); ++i) {
      if (e.outputs[i].reorder) CopyOut(e.outputs[i], stream, inner_out[i], out[i]);
    }
    stream.wait();
  } catch (const dnnl::error& err) {
    const char* impl = nullptr;
    dnnl_primitive_desc_query(e.primitive.get_primitive_desc(), dnnl_query_impl_info_str, 0, &impl);
    EMBER_FAIL("oneDNN failed to run ", impl != nullptr ? impl : "a primitive", ": ", err.what(),
               " (status ", static_cast<int>(err.status),
               "); EMBER_ONEDNN=0 runs nn's own kernels");
  }
}

// --- Convolution --------------------------------------------------------------------

struct ConvDescs {
  memory::desc src, weights, dst, bias;  // Ember's layouts
  memory::desc src_any, weights_any, dst_any;
  memory::dims strides, dilates, pad_l, pad_r;
};

ConvDescs DescsOf(const ConvGeometry& g) {
  ConvDescs d;
  d.src = memory::desc({g.n, g.c, g.h, g.w}, dt::f32, tag::nchw);
  d.dst = memory::desc({g.n, g.o, g.oh, g.ow}, dt::f32, tag::nchw);
  d.bias = memory::desc({g.o}, dt::f32, tag::x);
  if (g.groups == 1) {
    d.weights = memory::desc({g.o, g.c, g.kh, g.kw}, dt::f32, tag::oihw);
  } else {
    d.weights =
        memory::desc({g.groups, g.o / g.groups, g.c / g.groups, g.kh, g.kw}, dt::f32, tag::goihw);
  }
  d.src_any = memory::desc(d.src.dims(), dt::f32, tag::any);
  d.dst_any = memory::desc(d.dst.dims(), dt::f32, tag::any);
  d.weights_any = memory::desc(d.weights.dims(), dt::f32, tag::any);
  d.strides = {g.stride[0], g.stride[1]};
  d.dilates = {g.dilation[0] - 1, g.dilation[1] - 1};
  d.pad_l = {g.padding[0], g.padding[1]};
  // The right padding that makes oneDNN's output size PyTorch's: the last
  // window ends at or before the padded edge.
  d.pad_r = {
      (g.oh - 1) * g.stride[0] + g.dilation[0] * (g.kh - 1) + 1 - g.h - g.padding[0],
      (g.ow - 1) * g.stride[1] + g.dilation[1] * (g.kw - 1) + 1 - g.w - g.padding[1],
  };
  return d;
}

dnnl::convolution_forward::primitive_desc ForwardPd(const ConvGeometry& g, const ConvDescs& d,
                                                    bool bias, bool relu) {
  dnnl::primitive_attr attr = UserScratchpad();
  if (relu) {
    dnnl::post_ops ops;
    ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
    attr.set_post_ops(ops);
  }
  auto desc =
      bias ? dnnl::convolution_forward::desc(
                 dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct, d.src_any,
                 d.weights_any, d.bias, d.dst_any, d.strides, d.dilates, d.pad_l, d.pad_r)
           : dnnl::convolution_forward::desc(
                 dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct, d.src_any,
                 d.weights_any, d.dst_any, d.strides, d.dilates, d.pad_l, d.pad_r);
  return dnnl::convolution_forward::primitive_desc(desc, attr, Engine());
}

Cache::Key ConvKey(int kind, const ConvGeometry& g, bool bias, bool relu) {
  return {kind,          g.n,         g.c,          g.h,          g.w,
          g.o,           g.kh,        g.kw,         g.oh,         g.ow,
          g.stride[0],   g.stride[1], g.padding[0], g.padding[1], g.dilation[0],
          g.dilation[1], g.groups,    bias,         relu};
}

enum Kind : int64_t {
  kConvForward = 1,
  kConvBackwardData = 2,
  kConvBackwardWeights = 3,
};

}  // namespace

bool Enabled() { return EnabledFlag().load(std::memory_order_relaxed); }
void SetEnabled(bool enabled) { EnabledFlag().store(enabled, std::memory_order_relaxed); }
size_t CachedPrimitives() { return Cache::Get().size(); }
size_t CachedWeights() { return WeightCache::Get().size(); }

void ConvForward(const ConvGeometry& g, const float* x, const float* w, const float* b, float* y,
                 bool relu, const WeightVersion& w_version) {
  const bool bias = b != nullptr;
  auto entry = Cache::Get().Get(ConvKey(kConvForward, g, bias, relu), [&] {
    const ConvDescs d = DescsOf(g);
    auto pd = ForwardPd(g, d, bias, relu);
    auto e = std::make_shared<Entry>();
    e->primitive = dnnl::convolution_forward(pd);
    e->scratchpad_bytes = pd.scratchpad_desc().get_size();
    e->inputs.push_back(MakeArg(DNNL_ARG_SRC, d.src, pd.src_desc(), true));
    e->inputs.push_back(MakeArg(DNNL_ARG_WEIGHTS, d.weights, pd.weights_desc(), true));
    if (bias) e->inputs.push_back(MakeArg(DNNL_ARG_BIAS, d.bias, pd.bias_desc(), true));
    e->outputs.push_back(MakeArg(DNNL_ARG_DST, d.dst, pd.dst_desc(), false));
    return e;
  });
  std::vector<const void*> in{x, w};
  if (bias) in.push_back(b);
  Execute(*entry, in, {y}, /*weight=*/1, w_version);
}

void ConvBackwardData(const ConvGeometry& g, const float* gy, const float* w, float* gx,
                      const WeightVersion& w_version) {
  auto entry = Cache::Get().Get(ConvKey(kConvBackwardData, g, false, false), [&] {
    const ConvDescs d = DescsOf(g);
    auto hint = ForwardPd(g, d, false, false);
    dnnl::convolution_backward_data::desc desc(dnnl::algorithm::convolution_direct, d.src_any,
                                               d.weights_any, d.dst_any, d.strides, d.dilates,
                                               d.pad_l, d.pad_r);
    dnnl::convolution_backward_data::primitive_desc pd(desc, UserScratchpad(), Engine(), hint);
    auto e = std::make_shared<Entry>();
    e->primitive = dnnl::convolution_backward_data(pd);
    e->scratchpad_bytes = pd.scratchpad_desc().get_size();
    e->inputs.push_back(MakeArg(DNNL_ARG_DIFF_DST, d.dst, pd.diff_dst_desc(), true));
    e->inputs.push_back(MakeArg(DNNL_ARG_WEIGHTS, d.weights, pd.weights_desc(), true));
    e->outputs.push_back(MakeArg(DNNL_ARG_DIFF_SRC, d.src, pd.diff_src_desc(), false));
    return e;
  });
  Execute(*entry, {gy, w}, {gx}, /*weight=*/1, w_version);
}

void ConvBackwardWeights(const ConvGeometry& g, const float* x, const float* gy, float* gw,
                         float* gb) {
  const bool bias = gb != nullptr;
  auto entry = Cache::Get().Get(ConvKey(kConvBackwardWeights, g, bias, false), [&] {
    const ConvDescs d = DescsOf(g);
    auto hint = ForwardPd(g, d, bias, false);
    auto desc = bias ? dnnl::convolution_backward_weights::desc(
                           dnnl::algorithm::convolution_direct, d.src_any, d.weights_any, d.bias,
                           d.dst_any, d.strides, d.dilates, d.pad_l, d.pad_r)
                     : dnnl::convolution_backward_weights::desc(
                           dnnl::algorithm::convolution_direct, d.src_any, d.weights_any, d.dst_any,
                           d.strides, d.dilates, d.pad_l, d.pad_r);
    dnnl::convolution_backward_weights::primitive_desc pd(desc, UserScratchpad(), Engine(), hint);
    auto e = std::make_shared<Entry>();
    e->primitive = dnnl::convolution_backward_weights(pd);
    e->scratchpad_bytes = pd.scratchpad_desc().get_size();
    e->inputs.push_back(MakeArg(DNNL_ARG_SRC, d.src, pd.src_desc(), true));
    e->inputs.push_back(MakeArg(DNNL_ARG_DIFF_DST, d.dst, pd.diff_dst_desc(), true));
    e->outputs.push_back(MakeArg(DNNL_ARG_DIFF_WEIGHTS, d.weights, pd.diff_weights_desc(), false));
    if (bias) {
      e->outputs.push_back(MakeArg(DNNL_ARG_DIFF_BIAS, d.bias, pd.diff_bias_desc(), false));
    }
    return e;
  });
  std::vector<void*> out{gw};
  if (bias) out.push_back(gb);
  Execute(*entry, {x, gy}, out);
}

}  // namespace ember::nn::internal::onednn
