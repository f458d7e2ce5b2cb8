// SyncBatchNorm on CUDA tensors: the statistics, the all_gather and the
// backward's all_reduce on the input's device. Ranks are threads of this
// process (distributed/testing/ranks.h), so that two gloo ranks can share
// cuda:0 and the process never forks after CUDA is initialised. Every rank
// trains on its own (uneven) batch; their outputs, gradients and running
// statistics must match BatchNorm2d on the concatenated batch on the CPU
// within 1e-5 relative (fp32). The CPU side runs the same scenario over gloo
// everywhere; the GPU side (gloo with 2 ranks on cuda:0; nccl with one rank
// per GPU where 2+ are present) skips without a usable GPU, saying why.
#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "cuda/device.h"
#include "distributed/testing/ranks.h"
#include "gtest/gtest.h"
#include "nn/normalization.h"
#include "parallel/cuda_testing.h"
#include "parallel/sync_batch_norm.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"

namespace ember::parallel {
namespace {

namespace testing = ::ember::distributed::testing;
using cuda_testing::Cuda;
using cuda_testing::Guard;

constexpr int64_t kChannels = 4;
constexpr int kSteps = 3;
const int64_t kBatch[] = {3, 5, 2, 4};

Tensor RankInput(int rank, int step) {
  Generator gen(300 + 10 * step + rank);
  return randn({kBatch[rank], kChannels, 3, 3}, {}, &gen) * (1.0 + rank) + rank;
}
Tensor RankGrad(int rank, int step) {
  Generator gen(700 + 10 * step + rank);
  return randn({kBatch[rank], kChannels, 3, 3}, {}, &gen);
}

// What a rank produced at one step, on the host.
struct StepResult {
  Tensor y, gx, gw, gb, running_mean, running_var;
};

absl::Status ExpectClose(const Tensor& got, const Tensor& want, const std::string& what) {
  const double worst = ((got.cpu() - want).abs() - (want.abs() * 1e-5 + 1e-5)).max().item<double>();
  if (worst > 0) {
    return absl::InternalError(
        absl::StrCat(what, " differs by up to ", (got.cpu() - want).abs().max().item<double>()));
  }
  return absl::OkStatus();
}

// SyncBatchNorm on `world` ranks over `backend`, rank r on device_of(r),
// against BatchNorm2d on the CPU over the concatenated batch.
absl::Status TrainAndCompare(const std::string& backend, int world,
                             const std::function<Device(int)>& device_of) {
  std::vector<std::vector<StepResult>> results(world, std::vector<StepResult>(kSteps));
  testing::RunRanksOptions options;
  options.backend = backend;
  EMBER_RETURN_IF_ERROR(testing::RunRanks(
      world,
      [&](testing::Rank& me) {
        return Guard([&]() -> absl::Status {
          const Device device = device_of(me.rank);
          auto bn = std::make_shared<SyncBatchNorm>(kChannels, me.group);
          bn->to(device);
          for (int step = 0; step < kSteps; ++step) {
            Tensor x = RankInput(me.rank, step).to(device).requires_grad_();
            Tensor y = (*bn)(x);
            (y * RankGrad(me.rank, step).to(device)).sum().backward();
            results[me.rank][step] = {y.detach().cpu(),
                                      x.grad().cpu(),
                                      bn->weight().grad().cpu(),
                                      bn->bias().grad().cpu(),
                                      bn->running_mean().cpu().clone(),
                                      bn->running_var().cpu().clone()};
            bn->zero_grad();
          }
          return absl::OkStatus();
        });
      },
      options));
  nn::BatchNorm2d reference(kChannels);
  for (int step = 0; step < kSteps; ++step) {
    std::vector<Tensor> xs, gys;
    for (int r = 0; r < world; ++r) {
      xs.push_back(RankInput(r, step));
      gys.push_back(RankGrad(r, step));
    }
    Tensor x = cat(xs).requires_grad_(), gy = cat(gys);
    Tensor y = reference(x);
    (y * gy).sum().backward();
    int64_t first = 0;
    for (int r = 0; r < world; ++r) {
      const std::string at = absl::StrCat(backend, " rank ", r, " step ", step);
      const StepResult& got = results[r][step];
      // Rank r's own weight and bias gradients: its rows of gy alone.
      Tensor w = reference.weight().detach().clone().requires_grad_();
      Tensor b = reference.bias().detach().clone().requires_grad_();
      Tensor mine = zeros_like(gy);
      mine.narrow(0, first, kBatch[r]).copy_(gys[r]);
      (nn::functional::batch_norm(x.detach(), Tensor(), Tensor(), w, b, true) * mine)
          .sum()
          .backward();
      EMBER_RETURN_IF_ERROR(
          ExpectClose(got.y, y.detach().narrow(0, first, kBatch[r]), at + ": output"));
      EMBER_RETURN_IF_ERROR(
          ExpectClose(got.gx, x.grad().narrow(0, first, kBatch[r]), at + ": input gradient"));
      EMBER_RETURN_IF_ERROR(ExpectClose(got.gw, w.grad(), at + ": weight gradient"));
      EMBER_RETURN_IF_ERROR(ExpectClose(got.gb, b.grad(), at + ": bias gradient"));
      EMBER_RETURN_IF_ERROR(
          ExpectClose(got.running_mean, reference.running_mean(), at + ": running_mean"));
      EMBER_RETURN_IF_ERROR(
          ExpectClose(got.running_var, reference.running_var(), at + ": running_var"));
      first += kBatch[r];
    }
    reference.zero_grad();
  }
  return absl::OkStatus();
}

TEST(SyncBatchNormCudaTest, GlooWithTwoRanksOnOneDevice) {
  absl::Status cpu = TrainAndCompare("gloo", 2, [](int) { return Device(kCPU); });
  EXPECT_TRUE(cpu.ok()) << cpu;
  EMBER_SKIP_WITHOUT_GPUS(1);
  absl::Status s = TrainAndCompare("gloo", 2, [](int) { return Cuda(0); });
  EXPECT_TRUE(s.ok()) << s;
}

TEST(SyncBatchNormCudaTest, NcclWithOneRankPerDevice) {
  EMBER_SKIP_WITHOUT_GPUS(2);
  const int world = std::min(cuda::device_count(), 4);
  absl::Status s = TrainAndCompare("nccl", world, [](int r) { return Cuda(r); });
  EXPECT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace ember::parallel
