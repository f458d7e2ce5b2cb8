// The host-side decisions of the CUDA kernels' iteration scheme (Note [CUDA
// loops] in loops.cuh), checked on the host, where they are the same code
// the kernels run: when 32-bit indexing is allowed, that the 32-bit offsets
// agree with the 64-bit ones and with offsets unravelled from the shape, when
// the vector path is taken, and that its chunks are what it assumes (V
// consecutive elements, dense or fixed in each operand). Needs no device.
#include "cuda/loops.cuh"

#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace ember::cuda::kernels {
namespace {

constexpr int64_t k2To31 = int64_t{1} << 31;

// A geometry of N operands built by MakeGeometry from outermost-first sizes
// and element strides.
template <int N>
Geometry<N> Make(const std::vector<int64_t>& sizes,
                 const std::vector<std::vector<int64_t>>& element_strides,
                 const int64_t (&elem_sizes)[N]) {
  const int64_t* strides[N];
  for (int k = 0; k < N; ++k) strides[k] = element_strides[k].data();
  Geometry<N> g;
  EXPECT_TRUE(MakeGeometry<N>(static_cast<int>(sizes.size()), sizes.data(), strides, elem_sizes, g));
  return g;
}

// The element strides of a contiguous tensor of `sizes` (outermost first).
std::vector<int64_t> ContiguousStrides(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> strides(sizes.size());
  int64_t s = 1;
  for (int d = static_cast<int>(sizes.size()) - 1; d >= 0; --d) {
    strides[d] = s;
    s *= sizes[d];
  }
  return strides;
}

// Byte offsets of element i, unravelled from the outermost-first shape.
std::vector<int64_t> Unravel(int64_t i, const std::vector<int64_t>& sizes,
                             const std::vector<std::vector<int64_t>>& element_strides,
                             const std::vector<int64_t>& elem_sizes) {
  std::vector<int64_t> off(element_strides.size(), 0);
  for (int d = static_cast<int>(sizes.size()) - 1; d >= 0; --d) {
    const int64_t index = i % sizes[d];
    i /= sizes[d];
    for (size_t k = 0; k < off.size(); ++k) off[k] += index * element_strides[k][d] * elem_sizes[k];
  }
  return off;
}

TEST(LoopsTest, Index32AtTheLimitsOfNumelAndByteExtent) {
  // 2^31 - 1 bytes: the last byte's offset is 2^31 - 2.
  EXPECT_TRUE(Make<2>({k2To31 - 1}, {{1}, {1}}, {1, 1}).index32);
  // 2^31 elements: an index plus the grid's stride could pass 2^32.
  EXPECT_FALSE(Make<2>({k2To31}, {{1}, {1}}, {1, 1}).index32);
  // 2^29 floats end exactly at 2^31 bytes; one more does not fit.
  EXPECT_TRUE(Make<2>({int64_t{1} << 29}, {{1}, {1}}, {4, 4}).index32);
  EXPECT_FALSE(Make<2>({(int64_t{1} << 29) + 1}, {{1}, {1}}, {4, 4}).index32);
  // The extent counts, not numel: 2 elements 2^31 bytes apart.
  EXPECT_FALSE(Make<2>({2}, {{1}, {int64_t{1} << 29}}, {4, 4}).index32);
  EXPECT_TRUE(Make<2>({2}, {{1}, {(int64_t{1} << 29) - 1}}, {4, 4}).index32);
  // A broadcast operand (stride 0) spans one element however large numel is.
  EXPECT_TRUE(Make<3>({1 << 20, 1 << 8}, {{1 << 8, 1}, {0, 0}, {0, 1}}, {4, 8, 2}).index32);
  // A negative stride keeps the 64-bit path.
  EXPECT_FALSE(Make<2>({4}, {{1}, {-1}}, {4, 4}).index32);
  // A single element.
  EXPECT_TRUE(Make<1>({}, {{}}, {8}).index32);
}

TEST(LoopsTest, Offsets32AgreeWithOffsetsOfAndTheShapeOnRandomGeometries) {
  std::mt19937_64 rng(7);
  int checked = 0;
  for (int trial = 0; trial < 400; ++trial) {
    SCOPED_TRACE(trial);
    const int ndim = 1 + static_cast<int>(rng() % 5);
    std::vector<int64_t> sizes(ndim);
    for (auto& s : sizes) s = 1 + static_cast<int64_t>(rng() % 9);
    // Operand 0 contiguous; the others permuted, broadcast or spread out.
    std::vector<std::vector<int64_t>> strides(3, std::vector<int64_t>(ndim));
    strides[0] = ContiguousStrides(sizes);
    for (int k = 1; k < 3; ++k) {
      for (int d = 0; d < ndim; ++d) {
        const uint64_t kind = rng() % 4;
        strides[k][d] = kind == 0 ? 0 : static_cast<int64_t>(rng() % (trial < 300 ? 50 : 20000000));
      }
    }
    const std::vector<int64_t> elem_sizes = {4, 2, 8};
    const Geometry<3> g = Make<3>(sizes, strides, {4, 2, 8});
    if (!g.index32) continue;  // Extent past 2^31: only the 64-bit path applies.
    for (int e = 0; e < 50; ++e) {
      const int64_t i = static_cast<int64_t>(rng() % static_cast<uint64_t>(g.numel));
      int64_t off64[3];
      uint32_t off32[3], linear[3];
      OffsetsOf<3>(g, i, off64);
      OffsetsOf32<3>(g, static_cast<uint32_t>(i), off32);
      ElementOffsets<uint32_t, 3>(g, static_cast<uint32_t>(i), linear);
      const std::vector<int64_t> expected = Unravel(i, sizes, strides, elem_sizes);
      for (int k = 0; k < 3; ++k) {
        ASSERT_EQ(off64[k], expected[k]) << "element " << i << " operand " << k;
        ASSERT_EQ(int64_t{off32[k]}, expected[k]) << "element " << i << " operand " << k;
        ASSERT_EQ(int64_t{linear[k]}, expected[k]) << "element " << i << " operand " << k;
      }
      ++checked;
    }
  }
  EXPECT_GT(checked, 10000);
}

// Offsets near 2^31 in 32 bits (where a signed type would overflow).
TEST(LoopsTest, Offsets32NearTheLimit) {
  // [2, 2^28] floats, the outer dim's stride 2^28 + 5 elements in operand 1:
  // its last element ends at 4 * (2^29 + 5 + 2^28 - 1) + 4 bytes > 2^31.
  const int64_t n = int64_t{1} << 28;
  EXPECT_FALSE(Make<2>({2, n}, {{n, 1}, {n + 5, 1}}, {4, 4}).index32);
  // Bytes: the same shape in 1-byte elements, 2^30 elements apart.
  const Geometry<2> g = Make<2>({2, n}, {{n, 1}, {int64_t{1} << 30, 1}}, {1, 1});
  ASSERT_TRUE(g.index32);
  for (int64_t i : {int64_t{0}, n - 1, n, 2 * n - 1}) {
    uint32_t off32[2];
    int64_t off64[2];
    OffsetsOf32<2>(g, static_cast<uint32_t>(i), off32);
    OffsetsOf<2>(g, i, off64);
    EXPECT_EQ(int64_t{off32[0]}, i);
    EXPECT_EQ(int64_t{off32[1]}, (i / n) * (int64_t{1} << 30) + i % n);
    EXPECT_EQ(int64_t{off32[1]}, off64[1]);
  }
}

// Suitably aligned stand-in addresses (never dereferenced).
const void* At(uintptr_t address) { return reinterpret_cast<const void*>(address); }

TEST(LoopsTest, VectorPathForDenseAndBroadcastOperandsWhenAligned) {
  const int64_t sizes2[2] = {2, 2};  // bfloat16 in and out: 8 per chunk.
  const Geometry<2> dense = Make<2>({4096, 4096}, {{4096, 1}, {4096, 1}}, {2, 2});
  EXPECT_EQ(dense.ndim, 1);
  EXPECT_TRUE(UsesVectorPath<2>(dense, {At(0x1000), At(0x2000)}, sizes2, 8));
  // An input or the output off a 16-byte boundary: scalar.
  EXPECT_FALSE(UsesVectorPath<2>(dense, {At(0x1000), At(0x2002)}, sizes2, 8));
  EXPECT_FALSE(UsesVectorPath<2>(dense, {At(0x1008), At(0x2000)}, sizes2, 8));
  // A 1-D length that is no multiple of the chunk: vector, with a tail.
  EXPECT_TRUE(UsesVectorPath<2>(Make<2>({13}, {{1}, {1}}, {2, 2}), {At(0), At(0)}, sizes2, 8));

  // where(cond, a, 0): cond bool, a float, the 0 a 0-dim tensor.
  const int64_t where_sizes[4] = {4, 1, 4, 4};
  const Geometry<4> w = Make<4>({64, 1000}, {{1000, 1}, {1000, 1}, {1000, 1}, {0, 0}},
                                {4, 1, 4, 4});
  EXPECT_EQ(w.ndim, 1);
  EXPECT_FALSE(w.contiguous);  // The scalar operand: stride 0.
  EXPECT_TRUE(UsesVectorPath<4>(w, {At(0x100), At(0x204), At(0x300), At(0x7)}, where_sizes, 4));
  // The bool condition's chunk is 4 bytes: at 0x202 it straddles one.
  EXPECT_FALSE(UsesVectorPath<4>(w, {At(0x100), At(0x202), At(0x300), At(0x7)}, where_sizes, 4));

  // The output broadcast (stride 0) never takes it.
  const Geometry<2> fixed_out = Make<2>({16}, {{0}, {1}}, {2, 2});
  EXPECT_FALSE(UsesVectorPath<2>(fixed_out, {At(0), At(0)}, sizes2, 8));
  // Nor a strided innermost dim.
  const Geometry<2> strided = Make<2>({16}, {{1}, {2}}, {2, 2});
  EXPECT_FALSE(UsesVectorPath<2>(strided, {At(0), At(0)}, sizes2, 8));
  // Nor a single element (no dims).
  EXPECT_FALSE(UsesVectorPath<2>(Make<2>({}, {{}, {}}, {2, 2}), {At(0), At(0)}, sizes2, 8));
}

TEST(LoopsTest, VectorPathForRowsWhenChunksStayInARow) {
  const int64_t sizes2[2] = {2, 2};
  // A bias expanded over rows, copied: source stride 0 on the outer dim.
  const Geometry<2> bias = Make<2>({4096, 4096}, {{4096, 1}, {0, 1}}, {2, 2});
  ASSERT_EQ(bias.ndim, 2);
  EXPECT_TRUE(UsesVectorPath<2>(bias, {At(0x1000), At(0x2000)}, sizes2, 8));
  // Rows of 12 bfloat16: a chunk of 8 would straddle two rows.
  const Geometry<2> short_rows = Make<2>({5, 12}, {{12, 1}, {0, 1}}, {2, 2});
  EXPECT_FALSE(UsesVectorPath<2>(short_rows, {At(0), At(0)}, sizes2, 8));
  // Rows of 16 in a buffer whose rows are 20 apart: row 1 starts 40 bytes
  // in, off a 16-byte boundary.
  const Geometry<2> padded = Make<2>({5, 16}, {{16, 1}, {20, 1}}, {2, 2});
  EXPECT_FALSE(UsesVectorPath<2>(padded, {At(0), At(0)}, sizes2, 8));
  // A value per row (innermost stride 0), as a [N, C, H, W] tensor plus a
  // [C, 1, 1] one: one value for the chunk.
  const int64_t sizes3[3] = {4, 4, 4};
  const Geometry<3> per_channel =
      Make<3>({2, 3, 8, 8}, {{192, 64, 8, 1}, {192, 64, 8, 1}, {0, 1, 0, 0}}, {4, 4, 4});
  ASSERT_EQ(per_channel.ndim, 3);
  EXPECT_TRUE(UsesVectorPath<3>(per_channel, {At(0), At(0), At(0x4)}, sizes3, 4));
  // 7x7 planes: 49 is no multiple of 4.
  const Geometry<3> odd_planes =
      Make<3>({2, 3, 7, 7}, {{147, 49, 7, 1}, {147, 49, 7, 1}, {0, 1, 0, 0}}, {4, 4, 4});
  EXPECT_FALSE(UsesVectorPath<3>(odd_planes, {At(0), At(0), At(0)}, sizes3, 4));
  // Past 32-bit indexing: scalar.
  Geometry<2> large = bias;
  large.index32 = false;
  EXPECT_FALSE(UsesVectorPath<2>(large, {At(0x1000), At(0x2000)}, sizes2, 8));
}

// What the vector path relies on, over random geometries that take it: the
// V elements of chunk c are c*V .. c*V+V-1, at the chunk's offset plus j
// elements in a dense operand and at the chunk's offset in one whose
// innermost stride is 0; and the chunk's offset is aligned to its bytes.
TEST(LoopsTest, VectorChunksAreConsecutiveElementsOnRandomGeometries) {
  std::mt19937_64 rng(11);
  constexpr int V = 4;
  const int64_t elem[3] = {4, 4, 1};
  int taken = 0;
  for (int trial = 0; trial < 500; ++trial) {
    SCOPED_TRACE(trial);
    const int ndim = 1 + static_cast<int>(rng() % 4);
    std::vector<int64_t> sizes(ndim);
    for (auto& s : sizes) s = 1 + static_cast<int64_t>(rng() % 6);
    sizes[ndim - 1] = V * (1 + static_cast<int64_t>(rng() % 4)) + (rng() % 3 == 0 ? 1 : 0);
    std::vector<std::vector<int64_t>> strides(3, std::vector<int64_t>(ndim));
    strides[0] = ContiguousStrides(sizes);
    for (int k = 1; k < 3; ++k) {
      const bool fixed_inner = rng() % 3 == 0;
      int64_t s = 1;
      for (int d = ndim - 1; d >= 0; --d) {
        if (d == ndim - 1) {
          strides[k][d] = fixed_inner ? 0 : 1;
        } else {
          strides[k][d] = rng() % 3 == 0 ? 0 : s * V * (1 + static_cast<int64_t>(rng() % 3));
          s = strides[k][d] > 0 ? strides[k][d] * sizes[d] : s;
        }
      }
    }
    const Geometry<3> g = Make<3>(sizes, strides, {4, 4, 1});
    if (!UsesVectorPath<3>(g, {At(0), At(0x40), At(0x80)}, elem, V)) continue;
    ++taken;
    const std::vector<int64_t> elem_sizes = {4, 4, 1};
    for (int64_t c = 0; c < g.numel / V; ++c) {
      uint32_t chunk[3];
      ElementOffsets<uint32_t, 3>(g, static_cast<uint32_t>(c * V), chunk);
      for (int k = 0; k < 3; ++k) {
        if (g.strides[k][0] != 0) {
          ASSERT_EQ(chunk[k] % (V * elem[k]), 0u) << "chunk " << c << " operand " << k;
        }
      }
      for (int j = 0; j < V; ++j) {
        const std::vector<int64_t> expected = Unravel(c * V + j, sizes, strides, elem_sizes);
        for (int k = 0; k < 3; ++k) {
          const int64_t step = g.strides[k][0] == 0 ? 0 : j * elem[k];
          ASSERT_EQ(int64_t{chunk[k]} + step, expected[k])
              << "chunk " << c << " element " << j << " operand " << k;
        }
      }
    }
    // The tail (numel % V elements) exists only with one dim.
    if (g.ndim > 1) {
      EXPECT_EQ(g.numel % V, 0);
    }
  }
  EXPECT_GT(taken, 50);
}

}  // namespace
}  // namespace ember::cuda::kernels
