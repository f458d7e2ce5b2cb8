// The CUDA kernels of every device `_out` op against the CPU kernels: all
// dtypes where meaningful, non-contiguous and broadcast inputs, and copies
// between host and device both ways. Without a device the GPU cases skip,
// saying why, and the no-device case checks that a CUDA tensor cannot be
// created and that the error carries the runtime's reason.
#include "cuda/kernels.h"

#include <cuda_runtime_api.h>

#include <array>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "cuda/caching_allocator.h"
#include "cuda/device.h"
#include "cuda/host_allocator.h"
#include "cuda/loops.cuh"
#include "cuda/reduce_plan.h"
#include "cuda/testing/stream_gate.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/factories.h"
#include "tensor/ops.h"
#include "tensor/testing.h"
#include "third_party/cuda/device_check.h"

namespace ember {
namespace {

using ::ember::testing::ErrorOf;
using ::ember::testing::Make;
using ::ember::testing::Values;
using ::testing::HasSubstr;

const Device kGpu(DeviceType::kCUDA, 0);

Tensor Gpu(const Tensor& t) { return t.to(kGpu); }
Tensor Host(const Tensor& t) { return t.to(kCPU); }

// Tolerances for comparing a CUDA result with the CPU one (summation order
// and the device's math functions differ in the last bits).
double Rtol(Dtype d) {
  switch (d) {
    case kFloat16:
      return 2e-3;
    case kBFloat16:
      return 2e-2;
    case kFloat32:
      return 1e-5;
    case kFloat64:
      return 1e-12;
    default:
      return 0;
  }
}

// Same shape and dtype, and values equal (integers, bools) or close (floats,
// NaN matching NaN).
void ExpectMatches(const Tensor& gpu, const Tensor& cpu, const std::string& what,
                   double tol_scale = 1) {
  SCOPED_TRACE(what);
  ASSERT_TRUE(gpu.is_cuda());
  const Tensor back = Host(gpu);
  ASSERT_EQ(back.sizes(), cpu.sizes());
  ASSERT_EQ(back.dtype(), cpu.dtype());
  const std::vector<double> g = Values(back), c = Values(cpu);
  const double rtol = Rtol(cpu.dtype()) * tol_scale;
  for (size_t i = 0; i < g.size(); ++i) {
    if (std::isnan(c[i])) {
      EXPECT_TRUE(std::isnan(g[i])) << "element " << i;
    } else if (rtol == 0 || std::isinf(c[i])) {
      EXPECT_EQ(g[i], c[i]) << "element " << i;
    } else {
      EXPECT_NEAR(g[i], c[i], rtol * (1 + std::abs(c[i]))) << "element " << i;
    }
  }
}

// Runs `f` on CPU inputs and on their CUDA copies: both throw or the results
// match.
void ExpectSameAsCpu(const std::vector<Tensor>& cpu_inputs,
                     const std::function<Tensor(const std::vector<Tensor>&)>& f,
                     const std::string& what, double tol_scale = 1) {
  std::vector<Tensor> gpu_inputs;
  for (const Tensor& t : cpu_inputs) gpu_inputs.push_back(Gpu(t));
  Tensor cpu;
  std::string cpu_error = ErrorOf([&] { cpu = f(cpu_inputs); });
  if (cpu_error != "no error") {
    EXPECT_NE(ErrorOf([&] { f(gpu_inputs); }), "no error")
        << what << ": the CPU said " << cpu_error;
    return;
  }
  Tensor gpu;
  std::string gpu_error = ErrorOf([&] { gpu = f(gpu_inputs); });
  ASSERT_EQ(gpu_error, "no error") << what;
  ExpectMatches(gpu, cpu, what, tol_scale);
}

// As ExpectSameAsCpu, for a case that must compute: the CPU may not throw.
void ExpectComputesSameAsCpu(const std::vector<Tensor>& cpu_inputs,
                             const std::function<Tensor(const std::vector<Tensor>&)>& f,
                             const std::string& what, double tol_scale = 1) {
  ASSERT_EQ(ErrorOf([&] { f(cpu_inputs); }), "no error") << what << " must be valid on the CPU";
  ExpectSameAsCpu(cpu_inputs, f, what, tol_scale);
}

// The matmul layouts cuBLAS takes transposed: column-major views (a
// transposed contiguous tensor), for the left, the right or both operands.
Tensor ColumnMajor(const Tensor& m) { return m.t().contiguous().t(); }
Tensor MmBothColumnMajor(const std::vector<Tensor>& in) {
  return ops::mm(ColumnMajor(in[0]), ColumnMajor(in[1]));
}
Tensor MmLeftColumnMajor(const std::vector<Tensor>& in) {
  return ops::mm(ColumnMajor(in[0]), in[1]);
}
Tensor MmRightColumnMajor(const std::vector<Tensor>& in) {
  return ops::mm(in[0], ColumnMajor(in[1]));
}

// The float16 split-row sum: values in [0, 0.02) make rows of 2^21 sum to
// about 2e4, inside float16's range (65504), and large enough that the
// split path's partial sums matter.
Tensor SplitRowsHalfInput() { return rand({1 << 22}).mul(0.02).to(kFloat16); }
Tensor SplitRowsHalfSum(const std::vector<Tensor>& in) { return in[0].view({2, 1 << 21}).sum({1}); }

// The ReduceArgs that reduce_out (reduce_kernels.cc) builds to sum a
// contiguous tensor of `sizes` over `dims`, for `sm_count` SMs.
cuda::kernels::ReduceArgs SumArgs(const SizeVector& sizes, const std::vector<int64_t>& dims,
                                  Dtype dtype, int sm_count) {
  cuda::kernels::ReduceArgs a;
  a.op = cuda::kernels::kSum;
  a.dtype = cuda::internal::DtypeCode(dtype);
  a.sm_count = sm_count;
  const int64_t es = cuda::kernels::ElementSize(a.dtype);
  SizeVector out_sizes = sizes, reduced_sizes = sizes;
  for (int64_t d : dims) out_sizes[d] = 1;
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (out_sizes[d] != 1) reduced_sizes[d] = 1;
  }
  const SizeVector self_strides = ContiguousStrides(sizes);
  const SizeVector out_strides = ContiguousStrides(out_sizes);
  const int ndim = static_cast<int>(sizes.size());
  const int64_t* kept_strides[2] = {out_strides.data(), self_strides.data()};
  const int64_t* reduced_strides[1] = {self_strides.data()};
  EXPECT_TRUE(
      cuda::kernels::MakeGeometry<2>(ndim, out_sizes.data(), kept_strides, {es, es}, a.kept));
  EXPECT_TRUE(
      cuda::kernels::MakeGeometry<1>(ndim, reduced_sizes.data(), reduced_strides, {es}, a.reduced));
  return a;
}

// The SM count of cuda:0, which LaunchReduce plans for.
int DeviceSmCount() {
  cudaDeviceProp prop;
  EXPECT_EQ(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
  return prop.multiProcessorCount;
}

// Input of a column-split reduction: few outputs (below the SMs' threads),
// many rows.
Tensor ColumnInput(Dtype dtype) { return randn({2048, 1024}).to(dtype); }
Tensor ColumnSum(const std::vector<Tensor>& in) { return in[0].sum({0}); }

// A [rows, cols] tensor of `dtype` with varied values (negatives, zero,
// fractions for floats; small magnitudes so products stay exact).
Tensor Sample(SizeVector shape, Dtype dtype, int seed = 0) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  std::vector<double> v(n);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t k = (i * 7 + seed * 13) % 11 - 5;  // -5 .. 5
    if (dtype == kBool) {
      v[i] = k > 0;
    } else if (dtype == kUInt8) {
      v[i] = k + 5;
    } else if (is_floating_point(dtype)) {
      v[i] = k * 0.375 + 0.125 * (i % 3);
    } else {
      v[i] = k;
    }
  }
  return Make(v, shape, dtype);
}

// ---- No device ----

TEST(KernelsTest, WithoutDeviceCreatingCudaTensorThrowsTheReason) {
  // The CPU side runs everywhere.
  const Tensor a = Sample({3, 4}, kFloat32);
  EXPECT_EQ(Values(a.add(a).sum()), Values(a.sum().mul(2)));
  if (cuda::is_available()) GTEST_SKIP() << "a CUDA device is usable";
  const std::string error = ErrorOf([] { empty({2, 3}, TensorOptions(kFloat32).device(kGpu)); });
  EXPECT_THAT(error, HasSubstr(cuda::unavailable_reason()));
  EXPECT_THAT(ErrorOf([&] { a.to(kGpu); }), HasSubstr(cuda::unavailable_reason()));
}

// ---- Copies ----

TEST(KernelsTest, CopiesRoundTripEveryDtype) {
  EMBER_SKIP_WITHOUT_CUDA();
  for (Dtype d : kAllDtypes) {
    SCOPED_TRACE(dtype_name(d));
    const Tensor x = Sample({5, 7}, d);
    const Tensor g = Gpu(x);
    EXPECT_TRUE(g.is_cuda());
    EXPECT_TRUE(Host(g).equal(x));
    EXPECT_TRUE(Host(Gpu(x.t())).equal(x.t()));          // strided host source
    EXPECT_TRUE(Host(g.t()).equal(x.t()));               // strided device source
    EXPECT_TRUE(Host(g.t().contiguous()).equal(x.t()));  // device to device, strided
    // Into a strided host destination.
    Tensor host = empty({7, 5}, TensorOptions(d)).t();
    host.copy_(g);
    EXPECT_TRUE(host.equal(x));
    // Into a strided device destination, from the host.
    Tensor dev = empty({7, 5}, TensorOptions(d).device(kGpu)).t();
    dev.copy_(x);
    EXPECT_TRUE(Host(dev).equal(x));
  }
}

TEST(KernelsTest, CopiesConvertBetweenEveryPairOfDtypes) {
  EMBER_SKIP_WITHOUT_CUDA();
  for (Dtype s : kAllDtypes) {
    for (Dtype d : kAllDtypes) {
      const Tensor x = Sample({4, 6}, s);
      const std::string what = std::string(dtype_name(s)) + " to " + std::string(dtype_name(d));
      ExpectMatches(Gpu(x).to(d), x.to(d), what + " on the device");
      ExpectMatches(Gpu(x.t()).to(d), x.t().to(d), what + ", strided");
      Tensor host = empty({4, 6}, TensorOptions(d));
      host.copy_(Gpu(x));
      EXPECT_TRUE(host.equal(x.to(d))) << what << ", device to host";
      Tensor dev = empty({4, 6}, TensorOptions(d).device(kGpu));
      dev.copy_(x);
      EXPECT_TRUE(Host(dev).equal(x.to(d))) << what << ", host to device";
    }
  }
}

TEST(KernelsTest, CopiesBroadcastTheSource) {
  EMBER_SKIP_WITHOUT_CUDA();
  const Tensor row = Sample({4}, kFloat32);
  Tensor expected = empty({3, 4});
  expected.copy_(row);
  Tensor dev = zeros({3, 4}, TensorOptions(kFloat32).device(kGpu));
  dev.copy_(Gpu(row));
  EXPECT_TRUE(Host(dev).equal(expected));
  Tensor dev2 = zeros({3, 4}, TensorOptions(kFloat64).device(kGpu));
  dev2.copy_(row);  // host source, broadcast and converted
  EXPECT_TRUE(Host(dev2).equal(expected.to(kFloat64)));
}

TEST(KernelsTest, FillWritesEveryDtypeAndStridedViews) {
  EMBER_SKIP_WITHOUT_CUDA();
  for (Dtype d : kAllDtypes) {
    SCOPED_TRACE(dtype_name(d));
    ExpectMatches(full({3, 5}, 3, TensorOptions(d).device(kGpu)), full({3, 5}, 3, TensorOptions(d)),
                  "full");
    Tensor g = zeros({4, 6}, TensorOptions(d).device(kGpu));
    Tensor c = zeros({4, 6}, TensorOptions(d));
    g.slice(1, 0, 6, 2).fill_(1);
    c.slice(1, 0, 6, 2).fill_(1);
    ExpectMatches(g, c, "strided fill");
  }
}

// ---- Elementwise ----

constexpr Dtype kArithDtypes[] = {kFloat32, kFloat64, kFloat16, kBFloat16, kInt64,
                                  kInt32,   kInt16,   kInt8,    kUInt8,    kBool};

TEST(KernelsTest, UnaryOpsMatchTheCpu) {
  EMBER_SKIP_WITHOUT_CUDA();
  for (int op = 0; op <= static_cast<int>(UnaryOp::kLogicalNot); ++op) {
    const UnaryOp u = static_cast<UnaryOp>(op);
    for (Dtype d : kArithDtypes) {
      const std::string what = std::string(UnaryOpName(u)) + " " + std::string(dtype_name(d));
      // Positive values for the ops with a restricted domain.
      Tensor x = Sample({6, 5}, d);
      if (is_floating_point(d)) x = x.abs().add(0.25);
      ExpectSameAsCpu(
          {x}, [u](const auto& in) { return ops::unary(u, in[0]); }, what);
      ExpectSameAsCpu(
          {x}, [u](const auto& in) { return ops::unary(u, in[0].t()); }, what + ", transposed");
    }
  }
}

TEST(KernelsTest, BinaryOpsMatchTheCpuWithBroadcastAndStrides) {
  EMBER_SKIP_WITHOUT_CUDA();
  for (int op = 0; op <= static_cast<int>(BinaryOp::kLogicalXor); ++op) {
    const BinaryOp b = static_cast<BinaryOp>(op);
    for (Dtype d : kArithDtypes) {
      const std::string what = std::string(BinaryOpName(b)) + " " + std::string(dtype_name(d));
      Tensor x = Sample({4, 6}, d, 1), y = Sample({4, 6}, d, 2);
      if ((b == BinaryOp::kDiv || b == BinaryOp::kPow) && d != kBool) y = y.abs().add(1).to(d);
      ExpectSameAsCpu(
          {x, y}, [b](const auto& in) { return ops::binary(b, in[0], in[1]); }, what);
      // [6, 4] (transposed) with a [4] row broadcast over it, and a column.
      ExpectSameAsCpu(
          {x, y}, [b](const auto& in) { return ops::binary(b, in[0].t(), in[1].select(1, 2)); },
          what + ", transposed and broadcast row", 4);
      ExpectSameAsCpu(
          {x, y},
          [b](const auto& in) { return ops::binary(b, in[0].select(1, 1).unsqueeze(1), in[1]); },
          what + ", broadcast column", 4);
    }
  }
}

TEST(KernelsTest, AddAndSubWithAlphaMatchTheCpu) {
  EMBER_SKIP_WITHOUT_CUDA();
  for (Dtype d : kArithDtypes) {
    for (BinaryOp b : {BinaryOp::kAdd, BinaryOp::kSub}) {
      const std::string what = std::string(BinaryOpName(b)) + " " + std::string(dtype_name(d));
      const Tensor x = Sample({3, 5}, d, 1), y = Sample({3, 5}, d, 2);
      ExpectSameAsCpu(
          {x, y}, [b](const auto& in) { return ops::binary_alpha(b, in[0], in[1].t().t(), 3); },
          what);
    }
  }
}

TEST(KernelsTest, WhereAndClampMatchTheCpu) {
  EMBER_SKIP_WITHOUT_CUDA();
  for (Dtype d : kArithDtypes) {
    const std::string what(dtype_name(d));
    const Tensor c = Sample({4, 5}, kBool, 3), x = Sample({4, 5}, d, 1), y = Sample({5}, d, 2);
    ExpectSameAsCpu(
        {c, x, y}, [](const auto& in) { return ops::where(in[0], in[1].t().t(), in[2]); },
        "where " + what);
    if (d == kBool) continue;
    ExpectSameAsCpu(
        {x}, [](const auto& in) { return ops::clamp(in[0].t(), Scalar(-2), Scalar(3)); },
        "clamp " + what);
    ExpectSameAsCpu(
        {x}, [](const auto& in) { return ops::clamp(in[0], Scalar(1), std::nullopt); },
        "clamp min " + what);
    ExpectSameAsCpu(
        {x}, [](const auto& in) { return ops::clamp(in[0], std::nullopt, Scalar(0)); },
        "clamp max " + what);
    ExpectSameAsCpu(
        {x}, [](const auto& in) { return ops::clamp(in[0], Scalar(3), Scalar(-1)); },
        "clamp min > max " + what);
  }
}

// ---- Indexing ----

TEST(KernelsTest, IndexSelectMatchesTheCpuAndChecksIndices) {
  EMBER_SKIP_WITHOUT_CUDA();
  for (Dtype d : kAllDtypes) {
    for (Dtype id : {kInt64, kInt32}) {
      const std::string what = std::string(dtype_name(d)) + " by " + std::string(dtype_name(id));
      const Tensor x = Sample({5, 6, 3}, d), idx = Make({4, 0, 4, 2}, id);
      for (int64_t dim : {0, 1, 2}) {
        const Tensor i = dim == 2 ? Make({2, 0}, id) : idx;
        ExpectSameAsCpu(
            {x, i}, [dim](const auto& in) { return ops::index_select(in[0], dim, in[1]); },
            what + " dim " + std::to_string(dim));
        ExpectSameAsCpu(
            {x, i},
            [dim](const auto& in) { return ops::index_select(in[0].transpose(0, 2), dim, in[1]); },
            what + " transposed, dim " + std::to_string(dim));
      }
    }
  }
  const Tensor x = Gpu(Sample({3, 2}, kFloat32));
  EXPECT_THAT(ErrorOf([&] {
                ops::index_select(x, 0, Gpu(Make({0, 7, 1}, kInt64)));
              }),
              HasSubstr("index 7 is out of bounds for dimension 0 with size 3"));
  EXPECT_THAT(ErrorOf([&] { ops::index_select(x, 1, Gpu(Make({-1}, kInt32))); }),
              HasSubstr("index -1 is out of bounds for dimension 1 with size 2"));
}

// ---- Reductions ----

TEST(KernelsTest, ReductionsMatchTheCpu) {
  EMBER_SKIP_WITHOUT_CUDA();
  const std::vector<std::vector<int64_t>> dim_sets = {{}, {0}, {1}, {2}, {0, 2}, {1, 2}};
  for (ReduceOp op :
       {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMean, ReduceOp::kAmax, ReduceOp::kAmin}) {
    for (Dtype d : kArithDtypes) {
      for (const auto& dims : dim_sets) {
        const std::string what = std::string(ReduceOpName(op)) + " " + std::string(dtype_name(d)) +
                                 " over " + std::to_string(dims.size()) + " dims";
        // Products of 70 small values overflow float16; use values near 1.
        Tensor x = Sample({3, 5, 7}, d);
        if (op == ReduceOp::kProd && is_floating_point(d)) x = x.mul(0.1).add(1).to(d);
        ExpectSameAsCpu(
            {x}, [&](const auto& in) { return ops::reduce(op, in[0], dims, false, std::nullopt); },
            what, 8);
        ExpectSameAsCpu(
            {x},
            [&](const auto& in) {
              return ops::reduce(op, in[0].transpose(0, 2), dims, true, std::nullopt);
            },
            what + ", transposed, keepdim", 8);
      }
    }
  }
}

TEST(KernelsTest, LargeReductionsTakeEachPathAndMatchTheCpu) {
  EMBER_SKIP_WITHOUT_CUDA();
  const Tensor big = rand({1 << 22});
  // A full sum (cub::DeviceReduce), a mean, and a max of a long row.
  ExpectSameAsCpu(
      {big}, [](const auto& in) { return in[0].sum(); }, "full sum", 10);
  ExpectSameAsCpu(
      {big}, [](const auto& in) { return in[0].mean(); }, "full mean", 10);
  ExpectSameAsCpu(
      {big}, [](const auto& in) { return in[0].amax({}); }, "full amax");
  // Few long outputs: each split over several blocks.
  ExpectSameAsCpu(
      {big},
      [](const auto& in) {
        return in[0].view({4, 1 << 20}).sum({1});
      },
      "split rows", 10);
  ExpectComputesSameAsCpu({SplitRowsHalfInput()}, &SplitRowsHalfSum, "split rows float16", 10);
  // Many outputs, strided reduction: one thread per output.
  ExpectSameAsCpu(
      {big},
      [](const auto& in) {
        return in[0].view({64, 1 << 16}).sum({0});
      },
      "outer reduction", 10);
  ExpectSameAsCpu(
      {big.mul(10).to(kInt32)},
      [](const auto& in) {
        return in[0].view({64, 1 << 16}).sum({0});
      },
      "outer integer reduction");
  // Fewer outputs than the device's threads, adjacent in the input: each
  // output's rows cut into ranges, one thread each, folded in order.
  const int sms = DeviceSmCount();
  ASSERT_EQ(cuda::kernels::PlanReduce(SumArgs({2048, 1024}, {0}, kBFloat16, sms)).path,
            cuda::kernels::ReducePath::kColumns);
  for (Dtype d : {kFloat32, kBFloat16, kFloat16, kFloat64}) {
    const std::string what(dtype_name(d));
    ExpectComputesSameAsCpu({ColumnInput(d)}, &ColumnSum, "column sum " + what, 10);
    ExpectSameAsCpu(
        {ColumnInput(d)}, [](const auto& in) { return in[0].mean({0}); }, "column mean " + what,
        10);
    ExpectSameAsCpu(
        {ColumnInput(d)}, [](const auto& in) { return in[0].amax({0}); }, "column amax " + what);
  }
  ExpectSameAsCpu(
      {big.mul(10).to(kInt32)},
      [](const auto& in) {
        return in[0].view({4096, 1024}).sum({0});
      },
      "column integer sum");
  ExpectSameAsCpu(
      {big.mul(0.1).add(1)},
      [](const auto& in) {
        return in[0].view({1024, 4096}).prod(0);
      },
      "column prod");
  // Reduced dims that do not merge, kept dims in two parts, an
  // output count that is not a multiple of a block, and a range shorter than
  // the unrolled loads.
  ExpectSameAsCpu(
      {big},
      [](const auto& in) {
        return in[0].narrow(0, 0, 8 * 1024 * 96).view({8, 1024, 96}).narrow(1, 0, 500).sum({0, 1});
      },
      "column sum over two dims");
  ExpectSameAsCpu(
      {big},
      [](const auto& in) {
        return in[0].narrow(0, 0, 16 * 300 * 40).view({16, 300, 40}).sum({1});
      },
      "column sum, kept dims apart");
  ExpectSameAsCpu(
      {big},
      [](const auto& in) {
        return in[0].narrow(0, 0, 20 * 1000).view({20, 1000}).sum({0});
      },
      "short columns");
  ExpectSameAsCpu(
      {big},
      [](const auto& in) {
        return in[0].view({4096, 1024}).t().contiguous().t().sum({1});
      },
      "column sum of a transposed input");
}

TEST(KernelsTest, MaxAndMinAlongADimMatchTheCpuWithTiesAndNans) {
  EMBER_SKIP_WITHOUT_CUDA();
  for (Dtype d : kArithDtypes) {
    const Tensor x = Sample({6, 40}, d);  // many ties
    for (int64_t dim : {0, 1}) {
      for (bool is_max : {true, false}) {
        const std::string what = std::string(is_max ? "max " : "min ") +
                                 std::string(dtype_name(d)) + " dim " + std::to_string(dim);
        auto run = [&](const Tensor& t) {
          return is_max ? ops::max_dim(t, dim, false) : ops::min_dim(t, dim, false);
        };
        const MinMaxResult c = run(x), c_t = run(x.t().contiguous().t());
        const MinMaxResult g = run(Gpu(x)), g_t = run(Gpu(x).t().contiguous().t());
        ExpectMatches(g.values, c.values, what);
        ExpectMatches(g.indices, c.indices, what + " indices");
        ExpectMatches(g_t.values, c_t.values, what + " strided");
        ExpectMatches(g_t.indices, c_t.indices, what + " strided indices");
      }
    }
  }
  Tensor x = Make({1, 5, NAN, 5, NAN, 0}, {6}, kFloat32);
  const MinMaxResult g = ops::max_dim(Gpu(x), 0, false);
  EXPECT_TRUE(std::isnan(Values(Host(g.values))[0]));
  EXPECT_EQ(Values(Host(g.indices))[0], 2) << "the first NaN";
  const Tensor long_row = rand({3, 5000});
  ExpectMatches(ops::max_dim(Gpu(long_row), 1, false).indices,
                ops::max_dim(long_row, 1, false).indices, "long rows");
}

TEST(KernelsTest, SoftmaxAndLogSoftmaxMatchTheCpu) {
  EMBER_SKIP_WITHOUT_CUDA();
  for (Dtype d : {kFloat32, kFloat64, kFloat16, kBFloat16}) {
    const Tensor x = randn({5, 300}).mul(4).to(d);
    for (int64_t dim : {0, 1}) {
      const std::string what = std::string(dtype_name(d)) + " dim " + std::to_string(dim);
      ExpectSameAsCpu(
          {x}, [dim](const auto& in) { return ops::softmax(in[0], dim); }, "softmax " + what, 4);
      ExpectSameAsCpu(
          {x}, [dim](const auto& in) { return ops::log_softmax(in[0].t(), dim); },
          "log_softmax transposed " + what, 4);
    }
  }
  const Tensor nan_row = Make({1, NAN, 2, 3, 4, 5}, {2, 3}, kFloat32);
  ExpectMatches(ops::softmax(Gpu(nan_row), 1), ops::softmax(nan_row, 1), "NaN row");
}

// ---- Matrix products ----

TEST(KernelsTest, MatmulsMatchTheCpuForEveryFloatingDtype) {
  EMBER_SKIP_WITHOUT_CUDA();
  for (Dtype d : {kFloat32, kFloat64, kFloat16, kBFloat16}) {
    const std::string what(dtype_name(d));
    const Tensor a = randn({33, 17}).to(d), b = randn({17, 9}).to(d), c = randn({33, 9}).to(d);
    const double tol = d == kFloat32 ? 20 : 4;  // k = 17 terms, different order
    ExpectSameAsCpu(
        {a, b}, [](const auto& in) { return ops::mm(in[0], in[1]); }, "mm " + what, tol);
    ExpectComputesSameAsCpu({a, b}, &MmBothColumnMajor, "mm of column-major operands " + what, tol);
    ExpectComputesSameAsCpu({a, b}, &MmLeftColumnMajor, "mm, column-major left " + what, tol);
    ExpectComputesSameAsCpu({a, b}, &MmRightColumnMajor, "mm, column-major right " + what, tol);
    ExpectComputesSameAsCpu(
        {a, b}, [](const auto& in) { return ops::mm(ColumnMajor(in[1]).t(), in[0].t()); },
        "mm of transposed views (9x17 @ 17x33) " + what, tol);
    ExpectSameAsCpu(
        {c, a, b}, [](const auto& in) { return ops::addmm(in[0], in[1], in[2], 0.5, 2); },
        "addmm " + what, tol);
    // A Linear's forward: a bias on every row, the weight transposed (Note
    // [Bias epilogue]: cuBLASLt's bias epilogue), and row-major.
    const Tensor bias = randn({9}).to(d), w = randn({9, 17}).to(d);
    ExpectSameAsCpu(
        {bias, a, w}, [](const auto& in) { return ops::addmm(in[0], in[1], in[2].t(), 1, 1); },
        "addmm with a bias row, weight transposed " + what, tol);
    ExpectSameAsCpu(
        {bias, a, b}, [](const auto& in) { return ops::addmm(in[0], in[1], in[2], 1, 1); },
        "addmm with a bias row " + what, tol);
    // A Linear's weight and bias gradients (Note [Bias epilogue]: the
    // bias-gradient epilogue): a^T @ c and c's column sums.
    const auto bias_grad = [](const auto& in) {
      Tensor out = empty({in[0].sizes()[1], in[1].sizes()[1]},
                         TensorOptions().dtype(in[0].dtype()).device(in[0].device()));
      Tensor sums = empty({in[1].sizes()[1]},
                          TensorOptions().dtype(in[0].dtype()).device(in[0].device()));
      ops::gemm_bias_grad_out(out, sums, in[0].t(), in[1], /*of_a=*/false);
      return cat({out, sums.unsqueeze(0)}, 0);
    };
    ExpectComputesSameAsCpu({a, c}, bias_grad, "gemm_bias_grad_out " + what, 40);
    // nn::Linear's: g^T @ x and g's column sums (the rows of g^T).
    const auto bias_grad_of_a = [](const auto& in) {
      Tensor out = empty({in[1].sizes()[1], in[0].sizes()[1]},
                         TensorOptions().dtype(in[0].dtype()).device(in[0].device()));
      Tensor sums = empty({in[1].sizes()[1]},
                          TensorOptions().dtype(in[0].dtype()).device(in[0].device()));
      ops::gemm_bias_grad_out(out, sums, in[1].t(), in[0], /*of_a=*/true);
      return cat({out, sums.unsqueeze(1)}, 1);
    };
    ExpectComputesSameAsCpu({a, c}, bias_grad_of_a, "gemm_bias_grad_out of_a " + what, 40);
    // A Linear and its activation (cuBLASLt's RELU_BIAS and GELU_AUX_BIAS
    // epilogues); the pre-activation GELU keeps beside the output.
    for (GemmActivation act : {GemmActivation::kReLU, GemmActivation::kGeluTanh}) {
      const auto linear_act = [act](const auto& in) {
        const TensorOptions o = TensorOptions().dtype(in[0].dtype()).device(in[0].device());
        Tensor out = empty({in[1].sizes()[0], in[0].sizes()[0]}, o);
        Tensor pre = act == GemmActivation::kReLU ? Tensor() : empty(out.sizes(), o);
        ops::gemm_bias_act_out(out, pre, in[1], in[2].t(), in[0], static_cast<int64_t>(act));
        return pre.defined() ? cat({out, pre}, 0) : out;
      };
      ExpectComputesSameAsCpu({bias, a, w}, linear_act,
                              std::string("gemm_bias_act_out ") +
                                  (act == GemmActivation::kReLU ? "relu " : "gelu ") + what,
                              tol);
    }
    const Tensor ba = randn({3, 8, 5}).to(d), bb = randn({3, 5, 4}).to(d);
    ExpectSameAsCpu(
        {ba, bb}, [](const auto& in) { return ops::bmm(in[0], in[1]); }, "bmm " + what, tol);
    ExpectSameAsCpu(
        {ba, bb},
        [](const auto& in) {
          return ops::bmm(in[0], in[1].select(0, 1).unsqueeze(0).expand({3, 5, 4}));
        },
        "bmm with a shared operand " + what, tol);
    ExpectSameAsCpu(
        {ba, bb},
        [](const auto& in) { return ops::bmm(in[0].narrow(2, 0, 0), in[1].narrow(1, 0, 0)); },
        "bmm with k = 0 " + what);
  }
  const Tensor i = Gpu(Sample({2, 2}, kInt64));
  EXPECT_THAT(ErrorOf([&] { ops::mm(i, i); }), HasSubstr("not supported on CUDA"));
}

// ---- The CPU sides of the GPU cases ----

// The GPU cases above compare with the CPU; these check, on any machine,
// that what they compare is worth comparing.
TEST(KernelsTest, TransposedMatmulCasesComputeOnTheCpu) {
  const Tensor a = randn({33, 17}), b = randn({17, 9});
  EXPECT_EQ(ColumnMajor(a).strides(), (SizeVector{1, 33})) << "a column-major view";
  EXPECT_EQ(ColumnMajor(b).strides(), (SizeVector{1, 17}));
  const Tensor expected = ops::mm(a, b);
  ASSERT_EQ(expected.sizes(), (SizeVector{33, 9}));
  for (const auto& f : {&MmBothColumnMajor, &MmLeftColumnMajor, &MmRightColumnMajor}) {
    const Tensor got = f({a, b});
    ASSERT_EQ(got.sizes(), expected.sizes());
    const std::vector<double> g = Values(got), e = Values(expected);
    for (size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(g[i], e[i], 1e-4 * (1 + std::abs(e[i])));
  }
}

TEST(KernelsTest, SplitRowsFloat16SumsAreFiniteAndLarge) {
  const std::vector<double> sums = Values(SplitRowsHalfSum({SplitRowsHalfInput()}));
  ASSERT_EQ(sums.size(), 2u);
  for (double v : sums) {
    EXPECT_TRUE(std::isfinite(v)) << v;
    EXPECT_GT(v, 1e4);
    EXPECT_LT(v, 65504.0 / 2);
  }
}

// ---- The kernels' iteration scheme (host-side, runs everywhere) ----

// Element strides for `ndim` dims of size 2 that no coalescing can merge:
// 3^(ndim-1-d), never the next inner stride times 2.
std::vector<int64_t> UnmergeableStrides(int ndim) {
  std::vector<int64_t> strides(ndim);
  int64_t s = 1;
  for (int d = ndim - 1; d >= 0; --d, s *= 3) strides[d] = s;
  return strides;
}

TEST(KernelsTest, GeometryKeepsTwentyFiveUnmergeableDimsAsTorch) {
  static_assert(cuda::kernels::kMaxDims == 25, "torch's MAX_DIMS");
  for (int ndim : {12, 13, 25}) {
    SCOPED_TRACE(ndim);
    const std::vector<int64_t> sizes(ndim, 2);
    const std::vector<int64_t> src = UnmergeableStrides(ndim);
    const SizeVector out = ContiguousStrides(sizes);
    const int64_t* strides[2] = {out.data(), src.data()};
    cuda::kernels::Geometry<2> g;
    ASSERT_TRUE(cuda::kernels::MakeGeometry<2>(ndim, sizes.data(), strides, {4, 2}, g));
    EXPECT_EQ(g.ndim, ndim);
    EXPECT_EQ(g.numel, int64_t{1} << ndim);
    EXPECT_FALSE(g.contiguous);
    // OffsetsOf (the kernels' own code, here on the host) against the
    // offsets unravelled from the shape, outermost first, at random elements.
    std::mt19937_64 rng(ndim);
    for (int trial = 0; trial < 2000; ++trial) {
      const int64_t i = static_cast<int64_t>(rng() % static_cast<uint64_t>(g.numel));
      int64_t expected_out = 0, expected_src = 0, rest = i;
      for (int d = ndim - 1; d >= 0; --d) {
        const int64_t index = rest % sizes[d];
        rest /= sizes[d];
        expected_out += index * out[d] * 4;
        expected_src += index * src[d] * 2;
      }
      int64_t off[2];
      cuda::kernels::OffsetsOf<2>(g, i, off);
      ASSERT_EQ(off[0], expected_out) << "element " << i;
      ASSERT_EQ(off[1], expected_src) << "element " << i;
    }
  }
}

TEST(KernelsTest, GeometryRefusesTwentySixUnmergeableDimsNamingTheLimit) {
  const std::vector<int64_t> sizes(26, 2);
  const std::vector<int64_t> src = UnmergeableStrides(26);
  const SizeVector out = ContiguousStrides(sizes);
  const int64_t* strides[2] = {out.data(), src.data()};
  cuda::kernels::Geometry<2> g;
  EXPECT_FALSE(cuda::kernels::MakeGeometry<2>(26, sizes.data(), strides, {4, 4}, g));
  const std::string error = ErrorOf([&] {
    cuda::internal::GeometryOf<2>("copy_", sizes, {IntArrayRef(out), IntArrayRef(src)}, {4, 4});
  });
  EXPECT_THAT(error, HasSubstr("copy_: CUDA kernels handle at most 25 dims"));
  // Mergeable dims do not count: 26 dims of one contiguous tensor are one.
  const int64_t* contiguous[2] = {out.data(), out.data()};
  ASSERT_TRUE(cuda::kernels::MakeGeometry<2>(26, sizes.data(), contiguous, {4, 4}, g));
  EXPECT_EQ(g.ndim, 1);
  EXPECT_TRUE(g.contiguous);
}

// ---- The reductions' plan (host-side, runs everywhere) ----

TEST(KernelsTest, ReducePlanCutsOuterReductionsWithFewOutputsIntoColumnRanges) {
  using cuda::kernels::PlanReduce;
  using cuda::kernels::ReducePath;
  // A Linear's bias gradient on 132 SMs: 4096 outputs want 132 * 1024 / 4096
  // = 33 ranges of ceil(4096 / 33) = 125 rows (the last 96).
  const auto bias = PlanReduce(SumArgs({4096, 4096}, {0}, kBFloat16, 132));
  EXPECT_EQ(bias.path, ReducePath::kColumns);
  EXPECT_EQ(bias.splits, 33);
  EXPECT_EQ(bias.chunk, 125);
  // Kept dims in two parts ([16, 300, 40] over dim 1: 640 outputs, 40
  // adjacent): 212 ranges by threads, at most 300 / 16 = 18 by rows; 17 rows
  // each.
  const auto apart = PlanReduce(SumArgs({16, 300, 40}, {1}, kFloat32, 132));
  EXPECT_EQ(apart.path, ReducePath::kColumns);
  EXPECT_EQ(apart.splits, 18);
  EXPECT_EQ(apart.chunk, 17);
  // Too few rows to share: one range.
  const auto short_rows = PlanReduce(SumArgs({20, 1000}, {0}, kFloat32, 132));
  EXPECT_EQ(short_rows.path, ReducePath::kColumns);
  EXPECT_EQ(short_rows.splits, 1);
  EXPECT_EQ(short_rows.chunk, 20);
  // Very few adjacent outputs over very many rows: at most 1024 ranges.
  const auto capped = PlanReduce(SumArgs({1 << 22, 32}, {0}, kFloat32, 132));
  EXPECT_EQ(capped.path, ReducePath::kColumns);
  EXPECT_EQ(capped.splits, 1024);
  EXPECT_EQ(capped.chunk, 4096);
  // Enough outputs to fill 132 SMs of 256 threads: one thread per output,
  // every row.
  const auto many = PlanReduce(SumArgs({64, 1 << 16}, {0}, kFloat32, 132));
  EXPECT_EQ(many.path, ReducePath::kThreadPerOutput);
  EXPECT_EQ(many.splits, 1);
  // Under a warp of adjacent outputs, and conv2d's bias gradient (the
  // innermost reduced dim is contiguous): blocks, as before. [32, 64, 28,
  // 28] over {0, 2, 3}: 64 outputs, min(ceil(528 / 64), 25088 / 4096) = 6
  // blocks each.
  EXPECT_EQ(PlanReduce(SumArgs({100000, 8}, {0}, kFloat32, 132)).path, ReducePath::kBlocks);
  const auto conv = PlanReduce(SumArgs({32, 64, 28, 28}, {0, 2, 3}, kFloat32, 132));
  EXPECT_EQ(conv.path, ReducePath::kBlocks);
  EXPECT_EQ(conv.splits, 6);
  // Full sums: CUB for float32 and float64, blocks otherwise.
  EXPECT_EQ(PlanReduce(SumArgs({1000, 1000}, {0, 1}, kFloat32, 132)).path, ReducePath::kCub);
  EXPECT_EQ(PlanReduce(SumArgs({1000, 1000}, {0, 1}, kBFloat16, 132)).path, ReducePath::kBlocks);
  // Every column plan covers the rows with non-empty ranges.
  for (int64_t rows : {1, 15, 16, 17, 100, 4095, 4096, 100003}) {
    for (int64_t cols : {32, 33, 1000, 33791}) {
      for (int sms : {1, 108, 132}) {
        const auto plan = PlanReduce(SumArgs({rows, cols}, {0}, kFloat32, sms));
        SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(cols) + " on " +
                     std::to_string(sms) + " SMs");
        if (cols >= sms * 256) {
          EXPECT_EQ(plan.path, ReducePath::kThreadPerOutput);
          continue;
        }
        ASSERT_EQ(plan.path, ReducePath::kColumns);
        EXPECT_GE(plan.splits, 1);
        EXPECT_LE(plan.splits, 1024);
        EXPECT_GE(plan.splits * plan.chunk, rows);
        EXPECT_LT((plan.splits - 1) * plan.chunk, rows);
        if (plan.splits > 1) {
          EXPECT_GE(plan.chunk, 16);
        }
      }
    }
  }
}

// 25 dims that cannot be merged made contiguous on the device (torch's
// limit; 12 were the most before).
TEST(KernelsTest, TwentyFiveUnmergeableDimsBecomeContiguousOnTheDevice) {
  EMBER_SKIP_WITHOUT_CUDA();
  // Strides alternate 0 and 1 over a 13-element storage: no two neighbours
  // merge. 2^25 elements, compared exactly (a copy).
  const SizeVector sizes(25, 2);
  SizeVector strides(25);
  for (int d = 0; d < 25; ++d) strides[d] = d % 2;
  const Tensor base = arange(13, kFloat32);
  const Tensor cpu = base.as_strided(sizes, strides, 0).contiguous();
  Tensor gpu;
  ASSERT_EQ(ErrorOf([&] { gpu = Gpu(base).as_strided(sizes, strides, 0).contiguous(); }),
            "no error");
  ASSERT_TRUE(gpu.is_cuda());
  EXPECT_TRUE(gpu.is_contiguous());
  EXPECT_TRUE(Host(gpu).equal(cpu));
}

// ---- Devices, streams and pinned memory around the kernels ----

TEST(KernelsTest, ATensorOnADeviceThatDoesNotExistIsInvalidDeviceOrdinal) {
  EMBER_SKIP_WITHOUT_CUDA();
  const Device missing(DeviceType::kCUDA, cuda::device_count());
  const std::string error = ErrorOf([&] { empty({4}, TensorOptions(kFloat32).device(missing)); });
  EXPECT_THAT(error, HasSubstr("CUDA error: invalid device ordinal"));
  EXPECT_THAT(ErrorOf([&] {
                Sample({2, 2}, kFloat32).to(missing);
              }),
              HasSubstr("CUDA error: invalid device ordinal"));
}

// Every device's default stream is the same null handle: cuBLAS's workspace
// is per (device, stream), so a thread multiplying on two devices gives each
// its own (device 1 working in device 0's memory fails or corrupts).
TEST(KernelsTest, MatmulsOnTwoDevicesInOneThreadUseTheirOwnWorkspaces) {
  EMBER_SKIP_WITHOUT_CUDA();
  if (cuda::device_count() < 2) GTEST_SKIP() << "needs 2 devices; " << cuda::device_count();
  const Device gpu1(DeviceType::kCUDA, 1);
  const Tensor a = randn({64, 48}), b = randn({48, 32});
  const Tensor expected = ops::mm(a, b);
  ExpectMatches(ops::mm(Gpu(a), Gpu(b)), expected, "mm on cuda:0", 20);
  const int64_t before = cuda::memory_allocated(1);
  const Tensor on1 = ops::mm(a.to(gpu1), b.to(gpu1));
  EXPECT_EQ(on1.device(), gpu1);
  EXPECT_GE(cuda::memory_allocated(1) - before, int64_t{32} << 20)
      << "cuda:1 got a workspace of its own";
  const std::vector<double> got = Values(Host(on1)), want = Values(expected);
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], 1e-4 * (1 + std::abs(want[i])));
  ASSERT_TRUE(cuda::synchronize(1).ok());
}

// A pinned host tensor that a copy used is recorded against the copy's
// stream: freed while that stream still has work queued, its block is not
// handed out again until the work is done.
TEST(KernelsTest, PinnedBlocksOfACopyWaitForTheCopysStream) {
  EMBER_SKIP_WITHOUT_CUDA();
  for (bool to_device : {true, false}) {
    SCOPED_TRACE(to_device ? "host to device" : "device to host");
    Tensor pinned = arange(1024, kFloat32).pin_memory();
    ASSERT_TRUE(pinned.is_pinned());
    void* const block = pinned.raw_data();
    Tensor dev = empty({1024}, TensorOptions(kFloat32).device(kGpu));
    if (to_device) {
      dev.copy_(pinned);
    } else {
      pinned.copy_(dev);
    }
    ::ember::cuda::testing::StreamGate gate;  // Work queued on the copy's stream after the copy.
    ASSERT_TRUE(gate.Close(cudaStreamLegacy).ok());
    pinned = Tensor();  // Freed: an event on the default stream guards it.
    const Tensor next = empty({1024}, TensorOptions(kFloat32).pinned_memory(true));
    EXPECT_NE(next.raw_data(), block) << "reused while the copy's stream had work queued";
    EXPECT_FALSE(gate.gave_up());
    gate.Open();
    ASSERT_EQ(cudaStreamSynchronize(cudaStreamLegacy), cudaSuccess);
    const Tensor later = empty({1024}, TensorOptions(kFloat32).pinned_memory(true));
    EXPECT_EQ(later.raw_data(), block) << "reused once the stream's work finished";
  }
}

}  // namespace
}  // namespace ember
