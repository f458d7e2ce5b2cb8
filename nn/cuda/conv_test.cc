// conv2d on cuda:0 (cuDNN) against the CPU: forward and the gradients of
// input, weight and bias, in float32 (TF32 off, and on within TF32's
// precision), float64, float16 and bfloat16 (within their precision), over
// strides, paddings, dilations, groups
// (depthwise too), rectangular kernels, non-contiguous inputs and empty
// batches; the transposed form (grad::conv2d_input) and the weight
// correlation (grad::conv2d_weight) on their own; gradcheck and second
// derivatives in float64 through the device; benchmarked (timed)
// algorithms; a side stream. Every GPU case of ConvCudaTest runs twice: on
// the legacy path and through the graph API's cached execution plans
// (set_graph_api(true), Note [cuDNN graph API]), which must build a plan in
// every direction and dtype. Without a device the GPU cases skip, saying
// why; the registration, dtype, batch-chunk, switch and cuDNN-version cases
// run everywhere.
#include "nn/conv.h"

#include <cudnn.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "autograd/engine.h"
#include "autograd/gradcheck.h"
#include "cuda/stream.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/conv_kernels.h"
#include "nn/cuda/conv_graph.h"
#include "nn/cuda/cudnn.h"
#include "nn/cuda/layer_testing.h"
#include "tensor/error.h"
#include "tensor/factories.h"
#include "tensor/stream.h"
#include "third_party/cuda/device_check.h"

namespace ember::nn {
namespace {

using testing::ExpectClose;
using testing::ExpectGradcheckOnDevice;
using testing::ExpectLowPrecisionMatchesCpu;
using testing::ExpectMatchesCpu;
using ::testing::HasSubstr;
using testing::kGpu;

// Full float32 products (TF32 off) for comparisons at float32 precision;
// restores torch's defaults (TF32 allowed, no benchmarking) and the graph-API
// setting afterwards. The parameter: whether the case runs through the graph
// API (set_graph_api).
class ConvCudaTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    graph_api_was_ = cudnn::graph_api();
    cudnn::set_allow_tf32(false);
    cudnn::set_graph_api(GetParam());
  }
  void TearDown() override {
    cudnn::set_allow_tf32(true);
    cudnn::set_benchmark(false);
    cudnn::set_graph_api(graph_api_was_);
  }

 private:
  bool graph_api_was_ = false;
};

INSTANTIATE_TEST_SUITE_P(CudnnApis, ConvCudaTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "GraphApi" : "Legacy");
                         });

double Rtol(Dtype dtype) { return dtype == kFloat64 ? 1e-10 : 1e-4; }

TEST(ConvCudaRegistrationTest, KernelsAreRegisteredForCpuAndCuda) {
  for (DeviceType type : {DeviceType::kCPU, DeviceType::kCUDA}) {
    EXPECT_TRUE(internal::conv2d_forward.has(type));
    EXPECT_TRUE(internal::conv2d_input_grad.has(type));
    EXPECT_TRUE(internal::conv2d_weight_grad.has(type));
  }
}

TEST(ConvCudaRegistrationTest, CudnnRefusesDtypesItDoesNotComputeNamingThem) {
  try {
    cudnn::internal::DataType(kInt64, "conv2d");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("conv2d: expected a float32, float64, float16 or bfloat16 "
                                    "tensor on CUDA, but got int64"));
  }
  EXPECT_EQ(cudnn::internal::DataType(kFloat64, "conv2d"), CUDNN_DATA_DOUBLE);
  EXPECT_EQ(cudnn::internal::DataType(kFloat16, "conv2d"), CUDNN_DATA_HALF);
  EXPECT_EQ(cudnn::internal::DataType(kBFloat16, "conv2d"), CUDNN_DATA_BFLOAT16);
}

TEST(ConvCudaRegistrationTest, HalfPrecisionAccumulatesInFloat) {
  EXPECT_EQ(cudnn::internal::ComputeType(CUDNN_DATA_HALF), CUDNN_DATA_FLOAT);
  EXPECT_EQ(cudnn::internal::ComputeType(CUDNN_DATA_BFLOAT16), CUDNN_DATA_FLOAT);
  EXPECT_EQ(cudnn::internal::ComputeType(CUDNN_DATA_DOUBLE), CUDNN_DATA_DOUBLE);
  EXPECT_EQ(cudnn::internal::ParamDtype(kFloat16), kFloat32);
  EXPECT_EQ(cudnn::internal::ParamDtype(kBFloat16), kFloat32);
  EXPECT_EQ(cudnn::internal::ParamDtype(kFloat64), kFloat64);
}

TEST(ConvCudaRegistrationTest, TheLinkedCudnnIsTheOneOfTheHeaders) {
  // The library found at run time (the toolkit's, or a Python wheel's on a
  // GPU machine) must have the headers' major version.
  EXPECT_EQ(cudnnGetVersion() / 10000, static_cast<size_t>(CUDNN_MAJOR))
      << "cuDNN " << cudnnGetVersion() << " loaded, built against " << CUDNN_VERSION;
}

TEST(ConvCudaRegistrationTest, BatchesPastCudnnsIntDimensionsRunInChunks) {
  // Note [cuDNN batch chunks]: whole samples, each call under 2^31 elements.
  EXPECT_EQ(cudnn::internal::BatchChunk(3 * 224 * 224, "conv2d"), 14266);  // 2147483647 / 150528
  EXPECT_EQ(cudnn::internal::BatchChunk(int64_t{1} << 30, "conv2d"), 1);
  EXPECT_EQ(cudnn::internal::BatchChunk(2147483647, "conv2d"), 1);
  EXPECT_EQ(cudnn::internal::BatchChunk(0, "conv2d"), 2147483647);
  try {
    cudnn::internal::BatchChunk(int64_t{1} << 31, "conv2d");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("conv2d: one sample has 2147483648 elements"));
  }
}

TEST(ConvCudaRegistrationTest, Tf32IsAllowedByDefaultAndCanBeTurnedOff) {
  EXPECT_TRUE(cudnn::allow_tf32());
  cudnn::set_allow_tf32(false);
  EXPECT_FALSE(cudnn::allow_tf32());
  cudnn::set_allow_tf32(true);
}

TEST(ConvCudaRegistrationTest, BenchmarkIsOffByDefaultAndCanBeTurnedOn) {
  EXPECT_FALSE(cudnn::benchmark());
  cudnn::set_benchmark(true);
  EXPECT_TRUE(cudnn::benchmark());
  cudnn::set_benchmark(false);
}

TEST(ConvCudaRegistrationTest, GraphApiFollowsTheEnvironmentAndCanBeSwitched) {
  EXPECT_EQ(cudnn::graph_api(),
            cudnn::internal::GraphApiSetting(std::getenv("EMBER_CUDNN_GRAPH_API")));
  const bool was = cudnn::graph_api();
  cudnn::set_graph_api(!was);
  EXPECT_EQ(cudnn::graph_api(), !was);
  cudnn::set_graph_api(was);
  EXPECT_EQ(cudnn::graph_api(), was);
}

TEST(ConvCudaRegistrationTest, WithoutADeviceACudaInputFailsSayingWhy) {
  if (::ember::testing::CudaUnavailableReason().empty()) GTEST_SKIP() << "a CUDA device is usable";
  try {
    functional::conv2d(randn({1, 2, 4, 4}).to(kGpu), randn({3, 2, 3, 3}).to(kGpu));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("CUDA"));
  }
}

struct Case {
  std::vector<int64_t> x, w;
  Int2 stride, padding, dilation;
  int64_t groups;
  bool bias;
};

std::string Describe(const Case& c) {
  return absl::StrCat("x", ShapeToString(c.x), " w", ShapeToString(c.w), " stride ", c.stride[0],
                      ",", c.stride[1], " padding ", c.padding[0], ",", c.padding[1], " dilation ",
                      c.dilation[0], ",", c.dilation[1], " groups ", c.groups,
                      c.bias ? " bias" : "");
}

const std::vector<Case>& Cases() {
  static const std::vector<Case> cases = {
      {{2, 3, 8, 8}, {4, 3, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1, true},     // same padding
      {{2, 3, 15, 13}, {8, 3, 7, 7}, {2, 2}, {3, 3}, {1, 1}, 1, false},  // ResNet's conv1
      {{3, 4, 9, 9}, {6, 2, 3, 3}, {1, 1}, {0, 0}, {1, 1}, 2, true},     // groups
      {{2, 6, 10, 10}, {6, 1, 3, 3}, {2, 2}, {1, 1}, {1, 1}, 6, true},   // depthwise
      {{1, 2, 11, 12}, {3, 2, 3, 2}, {2, 1}, {2, 1}, {2, 3}, 1, true},   // dilation, rectangles
      {{4, 8, 5, 5}, {16, 8, 1, 1}, {1, 1}, {0, 0}, {1, 1}, 1, false},   // 1x1
      {{2, 4, 7, 6}, {4, 2, 2, 3}, {3, 2}, {1, 0}, {1, 2}, 2, true},     // everything at once
  };
  return cases;
}

TEST_P(ConvCudaTest, MatchesTheCpuForwardAndBackward) {
  EMBER_SKIP_WITHOUT_CUDA();
  for (Dtype dtype : {kFloat32, kFloat64}) {
    for (const Case& c : Cases()) {
      Tensor x = randn(IntArrayRef(c.x), TensorOptions(dtype));
      Tensor w = randn(IntArrayRef(c.w), TensorOptions(dtype));
      Tensor b = c.bias ? randn({c.w[0]}, TensorOptions(dtype)) : Tensor();
      ExpectMatchesCpu(
          [&](const std::vector<Tensor>& in) {
            return functional::conv2d(in[0], in[1], in[2], c.stride, c.padding, c.dilation,
                                      c.groups);
          },
          {x, w, b}, {true, true, c.bias}, std::string(dtype_name(dtype)) + " " + Describe(c),
          Rtol(dtype));
    }
  }
}

// float16 and bfloat16 on the tensor cores against float32 on the CPU from
// the same rounded values: within the output dtype's rounding (8 and 11
// mantissa bits) of sums accumulated in float.
TEST_P(ConvCudaTest, HalfAndBfloat16MatchTheCpuWithinTheirPrecision) {
  EMBER_SKIP_WITHOUT_CUDA();
  for (auto [dtype, rtol] : {std::pair{kFloat16, 4e-3}, std::pair{kBFloat16, 3e-2}}) {
    for (const Case& c : Cases()) {
      Tensor b = c.bias ? randn({c.w[0]}) : Tensor();
      ExpectLowPrecisionMatchesCpu(
          [&](const std::vector<Tensor>& in) {
            return functional::conv2d(in[0], in[1], in[2], c.stride, c.padding, c.dilation,
                                      c.groups);
          },
          {randn(IntArrayRef(c.x)), randn(IntArrayRef(c.w)), b}, {true, true, c.bias}, dtype,
          rtol, Describe(c));
    }
  }
}

TEST_P(ConvCudaTest, NonContiguousInputAndWeight) {
  EMBER_SKIP_WITHOUT_CUDA();
  // x is stored [N, W, H, C] and weight [kw, kh, O, C]; the layer sees
  // permuted views of them.
  Tensor x = randn({2, 9, 7, 3});
  Tensor w = randn({3, 3, 5, 3});
  ExpectMatchesCpu(
      [](const std::vector<Tensor>& in) {
        return functional::conv2d(in[0].permute({0, 3, 2, 1}), in[1].permute({2, 3, 1, 0}),
                                  Tensor(), {2, 1}, {1, 1});
      },
      {x, w}, {true, true}, "permuted", Rtol(kFloat32));
}

TEST_P(ConvCudaTest, OperandsOffsetFromTheirAllocationMatchTheCpu) {
  EMBER_SKIP_WITHOUT_CUDA();
  // Contiguous views one element into their storage, so their pointers are
  // aligned to the element only (the graph API's plans are per alignment).
  auto offset = [](const Tensor& storage, IntArrayRef sizes) {
    return storage.narrow(0, 1, storage.numel() - 1).view(sizes);
  };
  for (Dtype dtype : {kFloat32, kFloat64}) {
    const TensorOptions opts(dtype);
    const std::string what(dtype_name(dtype));
    const Tensor xs = randn({1 + 2 * 3 * 9 * 9}, opts), ws = randn({1 + 4 * 3 * 3 * 3}, opts);
    const Tensor gs = randn({1 + 2 * 4 * 9 * 9}, opts);
    const Tensor x_cpu = offset(xs, {2, 3, 9, 9}), w_cpu = offset(ws, {4, 3, 3, 3});
    const Tensor go_cpu = offset(gs, {2, 4, 9, 9});
    const Tensor x = offset(xs.to(kGpu), {2, 3, 9, 9}), w = offset(ws.to(kGpu), {4, 3, 3, 3});
    const Tensor go = offset(gs.to(kGpu), {2, 4, 9, 9});
    ExpectClose(functional::conv2d(x, w, Tensor(), {1, 1}, {1, 1}),
                functional::conv2d(x_cpu, w_cpu, Tensor(), {1, 1}, {1, 1}), Rtol(dtype),
                what + " forward");
    ExpectClose(grad::conv2d_input({2, 3, 9, 9}, w, go, {1, 1}, {1, 1}),
                grad::conv2d_input({2, 3, 9, 9}, w_cpu, go_cpu, {1, 1}, {1, 1}), Rtol(dtype),
                what + " input gradient");
    ExpectClose(grad::conv2d_weight(x, {4, 3, 3, 3}, go, {1, 1}, {1, 1}),
                grad::conv2d_weight(x_cpu, {4, 3, 3, 3}, go_cpu, {1, 1}, {1, 1}), Rtol(dtype),
                what + " weight gradient");
  }
}

TEST_P(ConvCudaTest, ThreeDimensionalInputAndEmptyBatch) {
  EMBER_SKIP_WITHOUT_CUDA();
  ExpectMatchesCpu(
      [](const std::vector<Tensor>& in) { return functional::conv2d(in[0], in[1], in[2]); },
      {randn({3, 6, 6}), randn({2, 3, 3, 3}), randn({2})}, {true, true, true}, "[C, H, W]",
      Rtol(kFloat32));
  Tensor x = zeros({0, 3, 6, 6}).to(kGpu);
  x.requires_grad_(true);
  Tensor w = randn({2, 3, 3, 3}).to(kGpu);
  w.requires_grad_(true);
  Tensor b = randn({2}).to(kGpu);
  b.requires_grad_(true);
  Tensor y = functional::conv2d(x, w, b);
  EXPECT_EQ(std::vector<int64_t>(y.sizes().begin(), y.sizes().end()),
            (std::vector<int64_t>{0, 2, 4, 4}));
  y.sum().backward();
  ExpectClose(w.grad(), zeros({2, 3, 3, 3}), 0, "weight gradient of an empty batch");
  ExpectClose(b.grad(), zeros({2}), 0, "bias gradient of an empty batch");
}

TEST_P(ConvCudaTest, TransposedFormAndWeightCorrelationMatchTheCpu) {
  EMBER_SKIP_WITHOUT_CUDA();
  for (const Case& c : Cases()) {
    const int64_t oh =
        (c.x[2] + 2 * c.padding[0] - c.dilation[0] * (c.w[2] - 1) - 1) / c.stride[0] + 1;
    const int64_t ow =
        (c.x[3] + 2 * c.padding[1] - c.dilation[1] * (c.w[3] - 1) - 1) / c.stride[1] + 1;
    Tensor go = randn({c.x[0], c.w[0], oh, ow}, TensorOptions(kFloat64));
    Tensor w = randn(IntArrayRef(c.w), TensorOptions(kFloat64));
    Tensor x = randn(IntArrayRef(c.x), TensorOptions(kFloat64));
    ExpectMatchesCpu(
        [&](const std::vector<Tensor>& in) {
          return grad::conv2d_input(c.x, in[1], in[0], c.stride, c.padding, c.dilation, c.groups);
        },
        {go, w}, {true, true}, "conv2d_input " + Describe(c), Rtol(kFloat64));
    ExpectMatchesCpu(
        [&](const std::vector<Tensor>& in) {
          return grad::conv2d_weight(in[0], c.w, in[1], c.stride, c.padding, c.dilation, c.groups);
        },
        {x, go}, {true, true}, "conv2d_weight " + Describe(c), Rtol(kFloat64));
  }
}

TEST_P(ConvCudaTest, GradcheckOnTheDeviceInFloat64) {
  EMBER_SKIP_WITHOUT_CUDA();
  const TensorOptions f64(kFloat64);
  ExpectGradcheckOnDevice(
      [](const std::vector<Tensor>& in) {
        return functional::conv2d(in[0], in[1], in[2], {2, 1}, {1, 2}, {1, 2}, 2);
      },
      {randn({2, 4, 5, 6}, f64), randn({4, 2, 2, 3}, f64), randn({4}, f64)});
}

TEST_P(ConvCudaTest, SecondDerivativesOnTheDeviceInFloat64) {
  EMBER_SKIP_WITHOUT_CUDA();
  // Note [Convolution double backward]: every derivative is one of the three
  // kernels, here all on the device.
  const TensorOptions f64(kFloat64);
  Tensor x = randn({2, 2, 4, 5}, f64).requires_grad_(true);
  Tensor w = randn({2, 1, 2, 2}, f64).requires_grad_(true);
  absl::Status s = autograd::gradgradcheck(
      [](const std::vector<Tensor>& in) {
        Tensor y =
            functional::conv2d(in[0].to(kGpu), in[1].to(kGpu), Tensor(), {1, 2}, {1, 0}, {1, 1}, 2);
        return std::vector<Tensor>{y.to(kCPU)};
      },
      {x, w});
  EXPECT_TRUE(s.ok()) << s;
}

TEST_P(ConvCudaTest, BenchmarkedAlgorithmsMatchTheCpu) {
  EMBER_SKIP_WITHOUT_CUDA();
  // Timed choices (cudnnFind*AlgorithmEx) for shapes no other case used.
  cudnn::set_benchmark(true);
  for (Dtype dtype : {kFloat32, kFloat64}) {
    ExpectMatchesCpu(
        [](const std::vector<Tensor>& in) {
          return functional::conv2d(in[0], in[1], in[2], {2, 2}, {1, 1}, {1, 1}, 2);
        },
        {randn({3, 4, 11, 10}, TensorOptions(dtype)), randn({6, 2, 3, 3}, TensorOptions(dtype)),
         randn({6}, TensorOptions(dtype))},
        {true, true, true}, std::string("benchmark ") + std::string(dtype_name(dtype)),
        Rtol(dtype));
  }
  cudnn::set_benchmark(false);
}

TEST_P(ConvCudaTest, Tf32StaysWithinItsPrecision) {
  EMBER_SKIP_WITHOUT_CUDA();
  cudnn::set_allow_tf32(true);
  ExpectMatchesCpu(
      [](const std::vector<Tensor>& in) {
        return functional::conv2d(in[0], in[1], in[2], {1, 1}, {1, 1});
      },
      {randn({4, 16, 12, 12}), randn({32, 16, 3, 3}), randn({32})}, {true, true, true},
      "TF32 allowed", 3e-2);
}

TEST_P(ConvCudaTest, OnASideStreamAsOnTheDefaultStream) {
  EMBER_SKIP_WITHOUT_CUDA();
  Tensor x = randn({2, 3, 9, 9}).to(kGpu), w = randn({4, 3, 3, 3}).to(kGpu);
  Tensor expected = functional::conv2d(x, w, Tensor(), {1, 1}, {1, 1});
  absl::StatusOr<ember::cuda::Stream> side = ember::cuda::get_stream_from_pool();
  ASSERT_TRUE(side.ok()) << side.status();
  absl::StatusOr<ember::cuda::Stream> main = ember::cuda::current_stream();
  ASSERT_TRUE(main.ok()) << main.status();
  ASSERT_TRUE(side->wait_stream(*main).ok());
  Tensor y;
  {
    StreamGuard guard(*side);
    y = functional::conv2d(x, w, Tensor(), {1, 1}, {1, 1});
  }
  ASSERT_TRUE(side->synchronize().ok());
  ExpectClose(y, expected.to(kCPU), 1e-6, "side stream");
}

TEST_P(ConvCudaTest, ThreadsOnStreamsOfTheirOwn) {
  EMBER_SKIP_WITHOUT_CUDA();
  // Note [cuDNN handles and workspaces]: each thread its handle per stream.
  Tensor x = randn({2, 3, 9, 9}).to(kGpu), w = randn({4, 3, 3, 3}).to(kGpu);
  const Tensor expected = functional::conv2d(x, w, Tensor(), {1, 1}, {1, 1}).to(kCPU);
  std::vector<Tensor> results(4);
  std::vector<std::string> errors(results.size(), "no result");
  std::vector<std::thread> threads;
  for (size_t t = 0; t < results.size(); ++t) {
    threads.emplace_back([&, t] {
      try {
        absl::StatusOr<ember::cuda::Stream> side = ember::cuda::get_stream_from_pool();
        if (!side.ok()) {
          errors[t] = side.status().ToString();
          return;
        }
        StreamGuard guard(*side);
        Tensor y;
        for (int i = 0; i < 5; ++i) y = functional::conv2d(x, w, Tensor(), {1, 1}, {1, 1});
        absl::Status synced = side->synchronize();
        if (!synced.ok()) {
          errors[t] = synced.ToString();
          return;
        }
        results[t] = y.to(kCPU);
      } catch (const std::exception& e) {
        errors[t] = e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (size_t t = 0; t < results.size(); ++t) {
    ASSERT_TRUE(results[t].defined()) << "thread " << t << ": " << errors[t];
    const std::vector<double> got = testing::HostValues(results[t]);
    const std::vector<double> want = testing::HostValues(expected);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_NEAR(got[i], want[i], 1e-6 * (1 + std::abs(want[i]))) << "thread " << t;
    }
  }
}

TEST_P(ConvCudaTest, AWeightOnAnotherDeviceIsRefusedNamingBoth) {
  EMBER_SKIP_WITHOUT_CUDA();
  try {
    functional::conv2d(randn({1, 2, 4, 4}).to(kGpu), randn({3, 2, 3, 3}));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("conv2d: expected weight on cuda:0"));
    EXPECT_THAT(e.what(), HasSubstr("it is on cpu"));
  }
}

// Turns the graph API on for a scope; restores it, and TF32, afterwards.
class GraphApiOn {
 public:
  GraphApiOn() : was_(cudnn::graph_api()) { cudnn::set_graph_api(true); }
  ~GraphApiOn() {
    cudnn::set_graph_api(was_);
    cudnn::set_allow_tf32(true);
  }

 private:
  bool was_;
};

// The graph API must build its own plans (not leave every shape to the
// legacy path, which would pass the cases above as well): one per direction
// for an ungrouped convolution in each dtype, float32 with TF32 off and on.
TEST(ConvCudaGraphApiTest, BuildsAPlanInEveryDirectionAndDtype) {
  EMBER_SKIP_WITHOUT_CUDA();
  GraphApiOn on;
  struct Run {
    Dtype dtype;
    bool tf32;
    int64_t channels;  // A shape no other case uses, so its plans are new.
  };
  for (const Run& run : {Run{kFloat32, false, 5}, Run{kFloat32, true, 6}, Run{kFloat64, false, 7},
                         Run{kFloat16, false, 8}, Run{kBFloat16, false, 9}}) {
    cudnn::set_allow_tf32(run.tf32);
    const std::string what =
        std::string(dtype_name(run.dtype)) + (run.tf32 ? " (TF32 allowed)" : "");
    const cudnn::internal::GraphPlanStats before = cudnn::internal::GraphStats();
    Tensor x = randn({3, run.channels, 13, 11}).to(run.dtype).to(kGpu).requires_grad_(true);
    Tensor w = randn({7, run.channels, 3, 3}).to(run.dtype).to(kGpu).requires_grad_(true);
    functional::conv2d(x, w, Tensor(), {1, 1}, {1, 1}).sum().backward();
    const cudnn::internal::GraphPlanStats after = cudnn::internal::GraphStats();
    EXPECT_EQ(after.fallbacks, before.fallbacks)
        << what << ": a shape was left to the legacy path: " << after.last_fallback;
    EXPECT_EQ(after.plans - before.plans, 3) << what << "; last fallback: " << after.last_fallback;
    ASSERT_TRUE(x.grad().defined() && w.grad().defined()) << what;
  }
}

// Note [cuDNN batch chunks]: a weight gradient's later chunks add to it
// (beta 1), a plan of its own; batches large enough to chunk are too large
// for a test, so the call is made directly.
TEST(ConvCudaGraphApiTest, AWeightGradientChunkAddsToWhatTheGradientHolds) {
  EMBER_SKIP_WITHOUT_CUDA();
  GraphApiOn on;
  const TensorOptions f64(kFloat64);
  const Tensor x = randn({2, 3, 7, 6}, f64), go = randn({2, 4, 5, 4}, f64);
  const Tensor prior = randn({4, 3, 3, 3}, f64);
  const Tensor expected = prior + grad::conv2d_weight(x, {4, 3, 3, 3}, go);
  Tensor xd = x.to(kGpu), god = go.to(kGpu), gw = prior.to(kGpu);
  const ::ember::nn::internal::ConvParams p{{1, 1}, {0, 0}, {1, 1}, 1};
  ASSERT_TRUE(cudnn::internal::GraphConvolution(
      cudnn::internal::ConvDirection::kWeightGrad, cudnn::internal::Handle(kGpu), kGpu, kFloat64,
      {2, 3, 7, 6}, {4, 3, 3, 3}, {2, 4, 5, 4}, p, xd.raw_data(), gw.raw_data(), god.raw_data(),
      /*accumulate=*/true))
      << cudnn::internal::GraphStats().last_fallback;
  ExpectClose(gw, expected, Rtol(kFloat64), "prior + weight gradient");
}

// A plan is looked up, not rebuilt: the same call again adds no plan.
TEST(ConvCudaGraphApiTest, ASecondCallOfAShapeReusesItsPlan) {
  EMBER_SKIP_WITHOUT_CUDA();
  GraphApiOn on;
  Tensor x = randn({2, 3, 10, 10}).to(kGpu), w = randn({4, 3, 5, 5}).to(kGpu);
  const Tensor first = functional::conv2d(x, w, Tensor(), {2, 2}, {2, 2}).to(kCPU);
  const cudnn::internal::GraphPlanStats built = cudnn::internal::GraphStats();
  const Tensor second = functional::conv2d(x, w, Tensor(), {2, 2}, {2, 2}).to(kCPU);
  const cudnn::internal::GraphPlanStats again = cudnn::internal::GraphStats();
  EXPECT_EQ(again.plans, built.plans);
  EXPECT_EQ(again.fallbacks, built.fallbacks);
  ExpectClose(second, first, 0, "the same plan twice");
}

}  // namespace
}  // namespace ember::nn
