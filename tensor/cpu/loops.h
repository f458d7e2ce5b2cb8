// Elementwise loop machinery for CPU kernels.
//
// ForEachStrided walks N operands of the same shape (inputs already broadcast
// to the output's shape, e.g. with expand(), so a broadcast dim has stride 0)
// and hands the body runs of the innermost dimension:
//
//   body(char* ptrs[N], const int64_t byte_strides[N], int64_t n)
//
// Dims of size 1 are dropped and adjacent dims that are contiguous for every
// operand are merged, so a contiguous tensor is one run. Large iterations are
// split over the intra-op thread pool (tensor/thread_pool.h).
//
// Map builds on it for typed kernels: out[i] = f(in0[i], in1[i], ...), with a
// plain indexed loop when every operand is contiguous (the compiler vectorises
// it), the same loop over chunks when some inputs are broadcast along the run
// (their value copied into a chunk-sized buffer), and a strided loop
// otherwise.
//
//   ember::cpu::Map<float, float, float>(out, {a, b},
//       [](float x, float y) { return x + y; });
//
// Kernel-internal: callers have validated shapes and dtypes. Thread-safe for
// distinct outputs.
#ifndef EMBER_TENSOR_CPU_LOOPS_H_
#define EMBER_TENSOR_CPU_LOOPS_H_

#include <algorithm>
#include <array>
#include <cstdint>
#include <tuple>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "tensor/tensor.h"
#include "tensor/thread_pool.h"

namespace ember::cpu {

template <int N, typename Body>
void ForEachStrided(IntArrayRef sizes, const std::array<char*, N>& base,
                    const std::array<IntArrayRef, N>& elem_strides,
                    const std::array<int64_t, N>& elem_sizes, Body&& body,
                    int64_t grain = kDefaultGrainSize) {
  // Coalesced geometry, innermost dim last; strides in bytes.
  absl::InlinedVector<int64_t, 6> dims;
  absl::InlinedVector<std::array<int64_t, N>, 6> strides;
  int64_t numel = 1;
  for (size_t d = 0; d < sizes.size(); ++d) {
    numel *= sizes[d];
    if (sizes[d] == 1) continue;
    std::array<int64_t, N> s;
    for (int k = 0; k < N; ++k) s[k] = elem_strides[k][d] * elem_sizes[k];
    if (!dims.empty()) {
      bool merge = true;
      for (int k = 0; k < N; ++k) merge &= strides.back()[k] == s[k] * sizes[d];
      if (merge) {
        dims.back() *= sizes[d];
        strides.back() = s;
        continue;
      }
    }
    dims.push_back(sizes[d]);
    strides.push_back(s);
  }
  if (numel == 0) return;
  if (dims.empty()) {  // One element.
    std::array<char*, N> p = base;
    std::array<int64_t, N> zero{};
    body(p.data(), zero.data(), int64_t{1});
    return;
  }
  const int64_t nd = static_cast<int64_t>(dims.size());
  const int64_t inner = dims.back();
  parallel_for(0, numel, grain, [&](int64_t begin, int64_t end) {
    // Multi-index of `begin`.
    absl::InlinedVector<int64_t, 6> idx(nd);
    int64_t rem = begin;
    for (int64_t d = nd - 1; d >= 0; --d) {
      idx[d] = rem % dims[d];
      rem /= dims[d];
    }
    std::array<char*, N> p;
    for (int k = 0; k < N; ++k) {
      int64_t off = 0;
      for (int64_t d = 0; d < nd; ++d) off += idx[d] * strides[d][k];
      p[k] = base[k] + off;
    }
    const std::array<int64_t, N>& inner_strides = strides[nd - 1];
    int64_t pos = begin;
    while (pos < end) {
      int64_t n = std::min(inner - idx[nd - 1], end - pos);
      body(p.data(), inner_strides.data(), n);
      pos += n;
      // Advance to the next run: bump the inner index, then carry.
      idx[nd - 1] += n;
      for (int k = 0; k < N; ++k) p[k] += n * inner_strides[k];
      for (int64_t d = nd - 1; d > 0 && idx[d] == dims[d]; --d) {
        idx[d] = 0;
        ++idx[d - 1];
        for (int k = 0; k < N; ++k) p[k] += strides[d - 1][k] - dims[d] * strides[d][k];
      }
    }
  });
}

namespace internal {

template <typename Out, typename... In, typename F, size_t... I>
inline void MapRun(char** p, const int64_t* s, int64_t n, F& f, std::index_sequence<I...>) {
  Out* out = reinterpret_cast<Out*>(p[0]);
  constexpr int64_t kOutSize = sizeof(Out);
  const bool contiguous = s[0] == kOutSize && ((s[I + 1] == int64_t{sizeof(In)}) && ...);
  if (contiguous) {
    std::tuple<const In*...> in{reinterpret_cast<const In*>(p[I + 1])...};
    for (int64_t i = 0; i < n; ++i) out[i] = f(std::get<I>(in)[i]...);
    return;
  }
  // Inputs broadcast along the run (stride 0: a 0-dim scalar, an expanded
  // dim) beside contiguous ones: each broadcast value is copied into a
  // chunk-sized buffer once per run, so every chunk is the contiguous loop
  // above, which the compiler vectorises.
  const bool dense_or_broadcast =
      s[0] == kOutSize && ((s[I + 1] == int64_t{sizeof(In)} || s[I + 1] == 0) && ...);
  if (dense_or_broadcast) {
    constexpr int64_t kChunk = 256;
    std::tuple<std::array<In, kChunk>...> held;
    ((s[I + 1] == 0 ? std::get<I>(held).fill(*reinterpret_cast<const In*>(p[I + 1])) : void()),
     ...);
    for (int64_t start = 0; start < n; start += kChunk) {
      const int64_t len = std::min(kChunk, n - start);
      std::tuple<const In*...> in{(s[I + 1] == 0
                                       ? std::get<I>(held).data()
                                       : reinterpret_cast<const In*>(p[I + 1]) + start)...};
      Out* o = out + start;
      for (int64_t i = 0; i < len; ++i) o[i] = f(std::get<I>(in)[i]...);
    }
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    *reinterpret_cast<Out*>(p[0] + i * s[0]) =
        f(*reinterpret_cast<const In*>(p[I + 1] + i * s[I + 1])...);
  }
}

}  // namespace internal

// out[i] = f(ins[0][i], ins[1][i], ...). `out` must have the iteration shape;
// each input must have that shape too (broadcast with expand() first) and the
// dtype matching its template type.
template <typename Out, typename... In, typename F>
void Map(const Tensor& out, const std::array<Tensor, sizeof...(In)>& ins, F&& f,
         int64_t grain = kDefaultGrainSize) {
  constexpr int N = 1 + sizeof...(In);
  std::array<char*, N> base;
  std::array<IntArrayRef, N> strides;
  base[0] = static_cast<char*>(out.raw_data());
  strides[0] = out.strides();
  for (size_t k = 0; k < sizeof...(In); ++k) {
    base[k + 1] = static_cast<char*>(ins[k].raw_data());
    strides[k + 1] = ins[k].strides();
  }
  std::array<int64_t, N> elem_sizes{int64_t{sizeof(Out)}, int64_t{sizeof(In)}...};
  ForEachStrided<N>(
      out.sizes(), base, strides, elem_sizes,
      [&](char** p, const int64_t* s, int64_t n) {
        internal::MapRun<Out, In...>(p, s, n, f, std::index_sequence_for<In...>{});
      },
      grain);
}

}  // namespace ember::cpu

#endif  // EMBER_TENSOR_CPU_LOOPS_H_
