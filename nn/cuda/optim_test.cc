// SGD, Adam and AdamW stepping parameters on cuda:0 through the multi-tensor
// kernels, against the same optimizer stepping copies on the CPU; the launch
// plan's cover of every chunk and the slots' registration run without a
// device too.
#include <cmath>
#include <cstdint>
#include <string>
#include <map>
#include <memory>
#include <set>
#include <type_traits>
#include <utility>
#include <vector>

#include "third_party/cuda/device_check.h"
#include "gtest/gtest.h"
#include "nn/cuda/optim_kernels.h"
#include "nn/optim/adam.h"
#include "nn/optim/fused_kernels.h"
#include "nn/optim/grad_scaler.h"
#include "nn/optim/grad_scaler_kernels.h"
#include "nn/optim/sgd.h"
#include "tensor/factories.h"
#include "tensor/tensor.h"

namespace ember::nn::cuda {
namespace {

const Device kGpu(DeviceType::kCUDA, 0);

// ---- Without a device ----

TEST(OptimKernelsTest, SlotsHaveCudaKernels) {
  EXPECT_TRUE(optim::internal::amp_unscale.has(DeviceType::kCUDA));
  EXPECT_TRUE(optim::internal::amp_update_scale.has(DeviceType::kCUDA));
  EXPECT_TRUE(optim::internal::sgd_step.has(DeviceType::kCUDA));
  EXPECT_TRUE(optim::internal::adam_step.has(DeviceType::kCUDA));
  EXPECT_TRUE(optim::internal::sgd_step.has(DeviceType::kCPU));
}

// Every (tensor, chunk) of the list is updated by exactly one block of one
// launch, and no launch exceeds its table.
struct Cover {
  int launches = 0;
  std::map<std::pair<int64_t, int32_t>, int> blocks;  // (tensor, chunk) -> times
};

Cover CoverOf(const std::vector<int64_t>& numels, int max_tensors = kernels::kMaxTensors) {
  Cover cover;
  const cudaError_t e = kernels::PlanMultiTensorLaunches(
      static_cast<int64_t>(numels.size()), numels.data(),
      [&](const kernels::LaunchPlan& plan) {
        ++cover.launches;
        EXPECT_GT(plan.num_blocks, 0);
        EXPECT_LE(plan.num_blocks, kernels::kMaxBlocks);
        EXPECT_GT(plan.num_tensors, 0);
        EXPECT_LE(plan.num_tensors, max_tensors);
        for (int b = 0; b < plan.num_blocks; ++b) {
          EXPECT_LT(plan.block_tensor[b], plan.num_tensors);
          const int64_t tensor = plan.tensors[plan.block_tensor[b]];
          EXPECT_LT(plan.block_chunk[b] * kernels::kChunkSize, numels[tensor]);
          ++cover.blocks[{tensor, plan.block_chunk[b]}];
        }
        return cudaSuccess;
      },
      max_tensors);
  EXPECT_EQ(e, cudaSuccess);
  return cover;
}

void ExpectCoversOnce(const std::vector<int64_t>& numels, const Cover& cover) {
  size_t expected = 0;
  for (size_t i = 0; i < numels.size(); ++i) {
    const int64_t chunks = (numels[i] + kernels::kChunkSize - 1) / kernels::kChunkSize;
    expected += chunks;
    for (int32_t c = 0; c < chunks; ++c) {
      auto it = cover.blocks.find({static_cast<int64_t>(i), c});
      ASSERT_NE(it, cover.blocks.end()) << "tensor " << i << " chunk " << c << " never updated";
      EXPECT_EQ(it->second, 1) << "tensor " << i << " chunk " << c;
    }
  }
  EXPECT_EQ(cover.blocks.size(), expected);
}

TEST(OptimKernelsTest, PlanCoversEveryChunkOnce) {
  // Small tensors: 36 a launch (Adam's tables, the default), so 40 take two.
  std::vector<int64_t> small(40, 5);
  Cover cover = CoverOf(small);
  ExpectCoversOnce(small, cover);
  EXPECT_EQ(cover.launches, 2);

  // Empty tensors are left out; a tensor of 65537 elements takes two blocks.
  std::vector<int64_t> mixed = {0, 1, 65536, 65537, 0, 3};
  cover = CoverOf(mixed);
  ExpectCoversOnce(mixed, cover);
  EXPECT_EQ(cover.launches, 1);
  EXPECT_EQ(cover.blocks.size(), 5u);

  // A tensor of 700 chunks runs over three tables (320 + 320 + 60 blocks),
  // and the tensors after it share the last.
  std::vector<int64_t> big = {7, 700 * kernels::kChunkSize - 1, 9, 11};
  cover = CoverOf(big);
  ExpectCoversOnce(big, cover);
  EXPECT_EQ(cover.launches, 3);

  // Nothing to do: no launch.
  cover = CoverOf({0, 0});
  EXPECT_EQ(cover.launches, 0);

  // SGD's tables (three pointers a tensor) hold 64: ResNet-18's 62
  // parameters are one launch, 65 tensors two, and a tensor cut between
  // tables continues in the next.
  std::vector<int64_t> resnet(62, 1000);
  cover = CoverOf(resnet, kernels::kMaxSgdTensors);
  ExpectCoversOnce(resnet, cover);
  EXPECT_EQ(cover.launches, 1);
  std::vector<int64_t> more(65, 5);
  cover = CoverOf(more, kernels::kMaxSgdTensors);
  ExpectCoversOnce(more, cover);
  EXPECT_EQ(cover.launches, 2);
  std::vector<int64_t> long_list(100, 3);
  long_list[10] = 400 * kernels::kChunkSize;
  cover = CoverOf(long_list, kernels::kMaxSgdTensors);
  ExpectCoversOnce(long_list, cover);
  EXPECT_EQ(cover.launches, 3);  // 10 + 310 blocks; 90 + 63; 26
}

TEST(OptimKernelsTest, PlanStopsAtTheFirstError) {
  std::vector<int64_t> numels(100, 1);
  int launches = 0;
  const cudaError_t e = kernels::PlanMultiTensorLaunches(
      static_cast<int64_t>(numels.size()), numels.data(), [&](const kernels::LaunchPlan&) {
        ++launches;
        return cudaErrorLaunchFailure;
      });
  EXPECT_EQ(e, cudaErrorLaunchFailure);
  EXPECT_EQ(launches, 1);
}

// ---- On cuda:0 ----

// Parameters of assorted shapes: a scalar-like one, a matrix, one over a
// chunk, an empty one, one non-contiguous (stepped through tensor ops), and
// 40 small ones (more than a launch's table).
std::vector<std::vector<int64_t>> Shapes() {
  std::vector<std::vector<int64_t>> shapes = {{3}, {17, 9}, {70000}, {0}, {9, 4}};
  for (int i = 0; i < 40; ++i) shapes.push_back({5 + i});
  return shapes;
}
constexpr size_t kTransposed = 4;  // Shapes()[4] is used transposed

struct Params {
  std::vector<Tensor> cpu, gpu;
};

Params MakeParams(Dtype dtype) {
  manual_seed(7);
  Params out;
  const auto shapes = Shapes();
  for (size_t i = 0; i < shapes.size(); ++i) {
    Tensor p = randn(shapes[i]).to(dtype);
    if (i == kTransposed) p = p.t();
    Tensor g = p.to(kGpu);
    if (i == kTransposed) {
      g = p.t().contiguous().to(kGpu).t();
      EXPECT_FALSE(g.is_contiguous());
    }
    out.cpu.push_back(p.detach().requires_grad_());
    out.gpu.push_back(g.detach().requires_grad_());
  }
  return out;
}

// Gives every parameter a fresh random gradient (the same on both sides);
// `skip` has none this step, so its state falls a step behind the others'.
void SetGrads(Params& params, Dtype dtype, size_t skip) {
  for (size_t i = 0; i < params.cpu.size(); ++i) {
    if (i == skip) {
      params.cpu[i].set_grad(Tensor());
      params.gpu[i].set_grad(Tensor());
      continue;
    }
    Tensor g = randn(params.cpu[i].sizes()).to(dtype);
    params.cpu[i].set_grad(g);
    params.gpu[i].set_grad(g.to(kGpu));
  }
}

void ExpectClose(const Params& params, double tolerance) {
  for (size_t i = 0; i < params.cpu.size(); ++i) {
    Tensor want = params.cpu[i].detach().to(kFloat64);
    Tensor got = params.gpu[i].detach().to(kCPU).to(kFloat64);
    ASSERT_EQ(got.sizes(), want.sizes()) << "parameter " << i;
    if (want.numel() == 0) continue;
    const double diff = (got - want).abs().max().item<double>();
    const double scale = 1.0 + want.abs().max().item<double>();
    // inf <= inf would pass: the inputs are finite, so must the results be.
    EXPECT_TRUE(std::isfinite(scale) && std::isfinite(diff))
        << "parameter " << i << ": max |cpu| " << scale - 1 << ", max |gpu - cpu| " << diff;
    EXPECT_LE(diff, tolerance * scale) << "parameter " << i << " of shape "
                                       << ShapeToString(want.sizes());
  }
}

template <typename Opt, typename Options>
void CompareSteps(const Options& options, Dtype dtype, double tolerance) {
  Params params = MakeParams(dtype);
  Opt cpu(params.cpu, options);
  Opt gpu(params.gpu, options);
  for (int step = 0; step < 4; ++step) {
    // Parameter 1 skips step 2: its step count and buffers differ from the
    // rest's from then on, a list of its own.
    SetGrads(params, dtype, step == 2 ? 1 : SIZE_MAX);
    cpu.step();
    gpu.step();
  }
  ExpectClose(params, tolerance);
}

class OptimOnCudaTest : public ::testing::Test {
 protected:
  void SetUp() override { EMBER_SKIP_WITHOUT_CUDA(); }
};

TEST_F(OptimOnCudaTest, SgdMatchesCpu) {
  using optim::SGD;
  using optim::SGDOptions;
  CompareSteps<SGD>(SGDOptions{.lr = 0.1}, kFloat32, 1e-5);
  CompareSteps<SGD>(SGDOptions{.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .weight_decay = 0.01},
                    kFloat32, 1e-5);
  CompareSteps<SGD>(SGDOptions{.lr = 0.05, .momentum = 0.9, .nesterov = true}, kFloat32, 1e-5);
  CompareSteps<SGD>(SGDOptions{.lr = 0.1, .weight_decay = 0.1, .maximize = true}, kFloat32, 1e-5);
  CompareSteps<SGD>(SGDOptions{.lr = 0.1, .momentum = 0.5, .weight_decay = 0.01}, kFloat64,
                    1e-12);
}

TEST_F(OptimOnCudaTest, AdamMatchesCpu) {
  using optim::Adam;
  using optim::AdamOptions;
  CompareSteps<Adam>(AdamOptions{.lr = 0.01}, kFloat32, 1e-5);
  CompareSteps<Adam>(AdamOptions{.lr = 0.01, .weight_decay = 0.1, .amsgrad = true}, kFloat32, 1e-5);
  CompareSteps<Adam>(AdamOptions{.lr = 0.01, .beta1 = 0.5, .maximize = true}, kFloat32, 1e-5);
  CompareSteps<Adam>(AdamOptions{.lr = 0.01, .amsgrad = true}, kFloat64, 1e-12);
}

TEST_F(OptimOnCudaTest, AdamWMatchesCpu) {
  using optim::AdamW;
  using optim::AdamWOptions;
  CompareSteps<AdamW>(AdamWOptions{.lr = 0.01}, kFloat32, 1e-5);
  CompareSteps<AdamW>(AdamWOptions{.lr = 0.01, .weight_decay = 0.1, .amsgrad = true}, kFloat32,
                      1e-5);
}

// 16-bit parameters are stepped in float on both sides, each result rounded
// once as it is stored (Note [16-bit optimizer math] in
// nn/optim/fused_kernels.cc): equal to within the dtype's rounding. The
// 70000 random float16 gradients include ones whose second moment underflows
// float16, where 16-bit arithmetic divided by a zero eps (NaN).
TEST_F(OptimOnCudaTest, SixteenBitParametersMatchCpu) {
  using optim::Adam;
  using optim::AdamOptions;
  using optim::SGD;
  using optim::SGDOptions;
  for (Dtype dtype : {kBFloat16, kFloat16}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    CompareSteps<SGD>(SGDOptions{.lr = 0.1, .momentum = 0.9}, dtype, 3e-2);
    CompareSteps<Adam>(AdamOptions{.lr = 0.01}, dtype, 3e-2);
  }
}

// Parameters at element offsets that are not 16-byte aligned step one
// element at a time, aligned ones in 16-byte vectors with an element-wise
// tail (Note [Vectorized optimizer steps] in optim_kernels.cu): both paths
// match the CPU, and the fused kernels (not a fallback) ran.
TEST_F(OptimOnCudaTest, UnalignedParametersMatchCpu) {
  using optim::Adam;
  using optim::AdamOptions;
  using optim::SGD;
  using optim::SGDOptions;
  for (Dtype dtype : {kFloat32, kBFloat16, kFloat64}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    const double tolerance = dtype == kBFloat16 ? 3e-2 : 1e-5;
    auto make = [&] {
      manual_seed(11);
      Params params;
      // Offsets 0, 1, 3 and 8 elements into a larger tensor; lengths with a
      // tail after the last whole vector, over a chunk.
      for (int64_t offset : {0, 1, 3, 8}) {
        const int64_t length = 70003 + offset;
        const Tensor base = randn({length + 16}).to(dtype);
        const Tensor gpu_base = base.to(kGpu);
        params.cpu.push_back(base.narrow(0, offset, length).detach().requires_grad_());
        params.gpu.push_back(gpu_base.narrow(0, offset, length).detach().requires_grad_());
        EXPECT_EQ(params.gpu.back().storage_offset(), offset);
        EXPECT_TRUE(params.gpu.back().is_contiguous());
      }
      return params;
    };
    // Three steps of optimizer `opt` (a std::type_identity) on both devices.
    auto compare = [&](auto opt, const auto& options, const char* name) {
      using Opt = typename decltype(opt)::type;
      Params params = make();
      Opt cpu(params.cpu, options);
      Opt gpu(params.gpu, options);
      for (int step = 0; step < 3; ++step) {
        SetGrads(params, dtype, SIZE_MAX);
        cpu.step();
        const int64_t before = kernels::StepLaunchCount();
        gpu.step();
        EXPECT_GT(kernels::StepLaunchCount(), before) << name << " step " << step;
      }
      ExpectClose(params, dtype == kFloat64 ? 1e-12 : tolerance);
    };
    compare(std::type_identity<SGD>(), SGDOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01},
            "SGD");
    compare(std::type_identity<Adam>(), AdamOptions{.lr = 0.01, .amsgrad = true}, "Adam");
  }
}

// A ResNet-sized list is a couple of launches, not a dozen per parameter.
TEST_F(OptimOnCudaTest, FewLaunchesForManyParameters) {
  std::vector<Tensor> params;
  for (int i = 0; i < 62; ++i) {
    Tensor p = randn({1000}).to(kGpu).requires_grad_();
    p.set_grad(ones({1000}).to(kGpu));
    params.push_back(p);
  }
  optim::SGD sgd(params, {.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-4});
  optim::AdamW adamw(params, {.lr = 0.1});
  for (int step = 0; step < 2; ++step) {
    const int64_t before = kernels::StepLaunchCount();
    sgd.step();
    EXPECT_EQ(kernels::StepLaunchCount() - before, 1) << "62 tensors: one SGD table of 64";
    const int64_t middle = kernels::StepLaunchCount();
    adamw.step();
    EXPECT_EQ(kernels::StepLaunchCount() - middle, 2) << "62 tensors: Adam tables of 36 + 26";
  }
}

// GradScaler on cuda:0 (the unscale and update kernels, a non-contiguous and
// a bfloat16 gradient among them) against the same iterations on the CPU:
// the same scales, skipped steps and weights.
TEST_F(OptimOnCudaTest, GradScalerMatchesCpu) {
  auto run = [](Device device) {
    manual_seed(11);
    Tensor w = randn({64, 33}).to(device).requires_grad_();
    Tensor v = randn({40}).to(device).to(kBFloat16).requires_grad_();
    optim::SGD opt({w, v}, {.lr = 0.05, .momentum = 0.9});
    optim::GradScaler scaler(device.type(), {.init_scale = 256.0, .growth_interval = 2});
    std::vector<double> scales;
    std::vector<bool> stepped;
    for (int it = 0; it < 6; ++it) {
      opt.zero_grad();
      Tensor loss = (w * w).sum() + (v.to(kFloat32) * 3).sum();
      scaler.scale(loss).backward();
      if (it == 2) w.grad().select(0, 3).select(0, 5).fill_(INFINITY);
      if (it == 4) {  // a transposed view as the gradient
        w.set_grad(w.grad().t().contiguous().t());
        v.grad().select(0, 1).fill_(NAN);
      }
      stepped.push_back(scaler.step(opt));
      scaler.update();
      scales.push_back(scaler.get_scale());
    }
    return std::make_tuple(scales, stepped, w.detach().cpu(), v.detach().to(kFloat32).cpu());
  };
  auto [cpu_scales, cpu_stepped, cpu_w, cpu_v] = run(Device(kCPU));
  auto [gpu_scales, gpu_stepped, gpu_w, gpu_v] = run(Device(DeviceType::kCUDA, 0));
  EXPECT_EQ(gpu_scales, cpu_scales);
  EXPECT_EQ(gpu_stepped, cpu_stepped);
  EXPECT_TRUE(gpu_w.allclose(cpu_w, 1e-5, 1e-6));
  EXPECT_TRUE(gpu_v.allclose(cpu_v, 1e-2, 1e-2));
}

}  // namespace
}  // namespace ember::nn::cuda
