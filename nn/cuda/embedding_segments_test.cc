// The windowed segment sums of embedding's CUDA backward (Note [Embedding
// backward windows] in embedding_segments.h), run on the host: every
// (window, column) step of both passes over sorted keys, against the plain
// sum of each row's lookups. Gradients are small integers, so every order of
// addition gives the exact sum and the comparison is exact. Runs without a
// device, in every build.
#include "nn/cuda/embedding_segments.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace ember::nn::cuda_kernels {
namespace {

// Runs both passes on the host for lookups `keys` (any order; sorted here
// stably, as the radix sort does) and returns the weight gradient
// [num_weights, d], the rows never written left at 0.
std::vector<double> WindowedSums(const std::vector<uint64_t>& lookups,
                                 const std::vector<double>& grad, int64_t num_weights, int64_t d,
                                 int64_t padding_idx) {
  const int64_t n = static_cast<int64_t>(lookups.size());
  std::vector<int64_t> positions(n);
  for (int64_t i = 0; i < n; ++i) positions[i] = i;
  std::stable_sort(positions.begin(), positions.end(),
                   [&](int64_t a, int64_t b) { return lookups[a] < lookups[b]; });
  std::vector<uint64_t> keys(n);
  for (int64_t i = 0; i < n; ++i) keys[i] = lookups[positions[i]];
  const int64_t windows = (n + kWindow - 1) / kWindow;
  std::vector<double> gw(num_weights * d, 0.0);
  // Unwritten partial sums are NaN: reading one would show.
  std::vector<double> head(windows * d, NAN), tail(windows * d, NAN);
  const SegmentArgs<double> args{grad.data(), keys.data(), positions.data(),
                                 gw.data(),   head.data(), tail.data(),
                                 n,           d,           padding_idx};
  for (int64_t w = 0; w < windows; ++w) {
    for (int64_t j = 0; j < d; ++j) SumWindow<double>(args, w, j);
  }
  for (int64_t w = 0; w < windows; ++w) {
    for (int64_t j = 0; j < d; ++j) FinishSegment<double>(args, w, j);
  }
  return gw;
}

std::vector<double> PlainSums(const std::vector<uint64_t>& lookups, const std::vector<double>& grad,
                              int64_t num_weights, int64_t d, int64_t padding_idx) {
  std::vector<double> gw(num_weights * d, 0.0);
  for (size_t i = 0; i < lookups.size(); ++i) {
    if (static_cast<int64_t>(lookups[i]) == padding_idx) continue;
    for (int64_t j = 0; j < d; ++j) gw[lookups[i] * d + j] += grad[i * d + j];
  }
  return gw;
}

void ExpectWindowedEqualsPlain(const std::vector<uint64_t>& lookups, int64_t num_weights, int64_t d,
                               int64_t padding_idx, const std::string& what) {
  SCOPED_TRACE(what);
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> value(-8, 8);
  std::vector<double> grad(lookups.size() * d);
  for (double& g : grad) g = value(rng);
  EXPECT_EQ(WindowedSums(lookups, grad, num_weights, d, padding_idx),
            PlainSums(lookups, grad, num_weights, d, padding_idx));
}

std::vector<uint64_t> Repeat(uint64_t key, int count) { return std::vector<uint64_t>(count, key); }

std::vector<uint64_t> Concat(std::initializer_list<std::vector<uint64_t>> parts) {
  std::vector<uint64_t> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

TEST(EmbeddingSegmentsTest, SegmentsInsideOneWindow) {
  ExpectWindowedEqualsPlain({3, 1, 3, 0, 2, 3, 1}, 5, 4, -1, "fewer lookups than a window");
  ExpectWindowedEqualsPlain({0, 1, 2, 3, 4, 5, 6, 7}, 8, 3, -1, "every row once");
}

TEST(EmbeddingSegmentsTest, SegmentsAcrossWindows) {
  // Sorted: row 0 x 10 (window 0), row 1 x 200 (windows 0 to 6), row 2 x 5,
  // row 3 x 32 (crosses 6/7), row 4 x 1.
  ExpectWindowedEqualsPlain(
      Concat({Repeat(1, 200), Repeat(0, 10), Repeat(3, 32), Repeat(2, 5), Repeat(4, 1)}), 6, 3, -1,
      "long and short segments");
  // A segment exactly covering windows 1 and 2, one ending at a window end.
  ExpectWindowedEqualsPlain(Concat({Repeat(0, 32), Repeat(1, 64), Repeat(2, 32)}), 3, 2, -1,
                            "segments aligned with windows");
  ExpectWindowedEqualsPlain(Concat({Repeat(0, 33), Repeat(1, 31), Repeat(2, 65)}), 3, 5, -1,
                            "segments one off the windows");
  ExpectWindowedEqualsPlain(Repeat(5, 1000), 9, 2, -1, "one row looked up 1000 times");
}

TEST(EmbeddingSegmentsTest, PaddingRowsGetNothing) {
  ExpectWindowedEqualsPlain(Concat({Repeat(2, 100), Repeat(0, 40), Repeat(1, 3)}), 3, 2, 2,
                            "padding spans windows");
  ExpectWindowedEqualsPlain(Concat({Repeat(0, 5), Repeat(1, 70), Repeat(2, 5)}), 3, 2, 1,
                            "padding in the middle");
}

TEST(EmbeddingSegmentsTest, RandomLookups) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 50; ++trial) {
    const int64_t rows = 1 + static_cast<int64_t>(rng() % 20);
    const int64_t n = 1 + static_cast<int64_t>(rng() % 400);
    // Skewed: half the lookups go to row 0.
    std::vector<uint64_t> lookups(n);
    for (auto& k : lookups) k = rng() % 2 ? 0 : rng() % rows;
    const int64_t pad = trial % 3 == 0 ? static_cast<int64_t>(rng() % rows) : -1;
    ExpectWindowedEqualsPlain(lookups, rows, 1 + static_cast<int64_t>(rng() % 4), pad,
                              "trial " + std::to_string(trial));
  }
}

}  // namespace
}  // namespace ember::nn::cuda_kernels
