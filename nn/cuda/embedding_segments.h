// The per-thread steps of embedding's deterministic CUDA backward
// (embedding_kernels.cu), plain C++ that runs on the device in the kernels
// and on the host in embedding_segments_test.cc. Kernel-internal.
//
// Note [Embedding backward windows]
// After the stable sort, the lookups of each weight row w form a segment of
// the sorted keys, in lookup order. Summing a segment in one thread would
// serialise a row looked up thousands of times, so the sorted positions are
// cut into windows of kWindow. Pass 1 (a thread per window and column) sums
// each run of equal keys inside its window: a run that is a whole segment
// is written to the weight's gradient at once; the run at the window's
// start that began in an earlier window goes to head[window], the run at
// its end that began in it and goes on goes to tail[window]. Pass 2 (a
// thread per window and column) finishes each segment that begins in its
// window and goes on: tail[window] + head[window + 1] + head[window + 2] +
// ... while the segment continues. Every addition happens in a fixed order,
// so the result is the same bits on every run.
#ifndef EMBER_NN_CUDA_EMBEDDING_SEGMENTS_H_
#define EMBER_NN_CUDA_EMBEDDING_SEGMENTS_H_

#include <cstdint>

#ifdef __CUDACC__
#define EMBER_NN_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define EMBER_NN_HOST_DEVICE inline
#endif

namespace ember::nn::cuda_kernels {

inline constexpr int64_t kWindow = 32;

// Sorted lookups: keys[n] (weight rows, ascending), positions[n] (the
// lookups, ascending within a key), grad [lookups, d]; gw [rows, d];
// head/tail [windows, d]. Rows equal to padding_idx are skipped.
template <typename T>
struct SegmentArgs {
  const T* grad;
  const uint64_t* keys;
  const int64_t* positions;
  T* gw;
  T* head;
  T* tail;
  int64_t n;
  int64_t d;
  int64_t padding_idx;
};

template <typename T>
EMBER_NN_HOST_DEVICE void SumWindow(const SegmentArgs<T>& a, int64_t window, int64_t col) {
  const int64_t begin = window * kWindow;
  const int64_t end = begin + kWindow < a.n ? begin + kWindow : a.n;
  int64_t s = begin;
  while (s < end) {
    const uint64_t key = a.keys[s];
    T sum = T(0);
    int64_t t = s;
    for (; t < end && a.keys[t] == key; ++t) sum += a.grad[a.positions[t] * a.d + col];
    const bool starts = s == 0 || a.keys[s - 1] != key;
    const bool ends = t == a.n || a.keys[t] != key;
    if (static_cast<int64_t>(key) != a.padding_idx) {
      if (starts && ends) {
        a.gw[static_cast<int64_t>(key) * a.d + col] = sum;
      } else if (!starts) {
        a.head[window * a.d + col] = sum;  // s == begin
      } else {
        a.tail[window * a.d + col] = sum;  // t == end
      }
    }
    s = t;
  }
}

template <typename T>
EMBER_NN_HOST_DEVICE void FinishSegment(const SegmentArgs<T>& a, int64_t window, int64_t col) {
  const int64_t begin = window * kWindow;
  const int64_t end = begin + kWindow < a.n ? begin + kWindow : a.n;
  if (end >= a.n) return;
  const uint64_t key = a.keys[end - 1];
  // The window's last segment goes on past it, and began in it.
  if (a.keys[end] != key || (begin > 0 && a.keys[begin - 1] == key)) return;
  if (static_cast<int64_t>(key) == a.padding_idx) return;
  T sum = a.tail[window * a.d + col];
  for (int64_t w = window + 1;; ++w) {
    sum += a.head[w * a.d + col];
    const int64_t w_end = (w + 1) * kWindow;
    if (w_end >= a.n || a.keys[w_end] != key) break;
  }
  a.gw[static_cast<int64_t>(key) * a.d + col] = sum;
}

}  // namespace ember::nn::cuda_kernels

#endif  // EMBER_NN_CUDA_EMBEDDING_SEGMENTS_H_
