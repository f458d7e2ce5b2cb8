// DataParallel and its building blocks on GPUs: comm's coalesced broadcast
// and reduction through the CUDA transport (NCCL inside the process, peer
// copies for what NCCL lacks), scatter from the host on side streams,
// DataParallel with device_ids=[cuda:0] and across GPUs against the plain
// module, and the balance rule on the devices' real properties. The CPU side
// of each case runs everywhere (CPU "devices", values worked out here); the
// GPU side skips without a GPU, and the multi-GPU side with fewer than two,
// saying so.
#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "autograd/grad_mode.h"
#include "cuda/device.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/activation.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "parallel/cuda_testing.h"
#include "parallel/comm.h"
#include "parallel/data_parallel.h"
#include "tensor/device_guard.h"
#include "tensor/factories.h"
#include "tensor/testing.h"

namespace ember::parallel {
namespace {

using ::ember::testing::Values;

using cuda_testing::Cuda;

// Inputs worked out by hand: float32 and float16 (NCCL carries both) and
// int16 (which NCCL lacks: peer copies), on `device`.
std::vector<Tensor> Inputs(Device device, double scale = 1) {
  return {(tensor(std::vector<float>{1, 2, 3, 4, 5, 6}) * scale).view({2, 3}).to(device),
          (tensor(std::vector<float>{7, 8}) * scale).to(kFloat16).to(device),
          (tensor(std::vector<float>{9, 10, 11}) * scale).to(kInt16).to(device),
          (tensor(std::vector<float>{12}) * scale).to(device)};
}

void ExpectCoalescedComm(Device source, Device other) {
  // A 16-byte buffer: several chunks per dtype.
  const std::vector<Tensor> in = Inputs(source);
  const auto out = comm::broadcast_coalesced(in, {source, other, other}, /*buffer_size=*/16);
  ASSERT_EQ(out.size(), 3u);
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_TRUE(out[0][i].is_same(in[i])) << "the source's entry is the input itself, " << i;
    for (int d : {1, 2}) {
      EXPECT_EQ(out[d][i].device(), other) << i;
      EXPECT_EQ(out[d][i].dtype(), in[i].dtype()) << i;
      EXPECT_EQ(out[d][i].sizes(), in[i].sizes()) << i;
      EXPECT_EQ(Values(out[d][i].cpu()), Values(in[i].cpu())) << "device entry " << d << ", " << i;
    }
    EXPECT_NE(out[1][i].raw_data(), out[2][i].raw_data()) << "entries 1 and 2 share memory";
  }
  // Sums: in + 10 * in = 11 * in, onto the source, the other device and the host.
  const std::vector<Tensor> tens = Inputs(other, 10);
  for (Device destination : {source, other, Device(kCPU)}) {
    const std::vector<Tensor> sums =
        comm::reduce_add_coalesced({in, tens}, destination, /*buffer_size=*/16);
    ASSERT_EQ(sums.size(), in.size());
    const std::vector<Tensor> expected = Inputs(kCPU, 11);
    for (size_t i = 0; i < in.size(); ++i) {
      EXPECT_EQ(sums[i].device().type(), destination.type()) << i;
      EXPECT_EQ(sums[i].dtype(), in[i].dtype()) << i;
      EXPECT_EQ(Values(sums[i].cpu()), Values(expected[i])) << "onto " << destination << ", " << i;
    }
  }
}

TEST(DataParallelCudaTest, CoalescedBroadcastAndReduceAcrossGpus) {
  ExpectCoalescedComm(kCPU, kCPU);
  // The CUDA transport registers itself in every build with CUDA, GPU or not.
  EXPECT_NE(comm::GetDeviceTransport(DeviceType::kCUDA), nullptr);
  EMBER_SKIP_WITHOUT_GPUS(2);
  ExpectCoalescedComm(Cuda(0), Cuda(1));
  ExpectCoalescedComm(Cuda(1), Cuda(0));
}

TEST(DataParallelCudaTest, ScatterFromTheHostAndGatherBack) {
  const Tensor x = arange(12, kFloat32).view({6, 2});
  auto check = [&](const std::vector<Device>& devices, Device destination) {
    const std::vector<Tensor> pieces = comm::scatter(x, devices);
    ASSERT_EQ(pieces.size(), devices.size());
    for (size_t i = 0; i < pieces.size(); ++i) {
      EXPECT_EQ(pieces[i].device(), devices[i]);
      // Read on the device's current stream (which waited for the side stream).
      EXPECT_EQ(Values((pieces[i] * 1.0).cpu()), Values(x.narrow(0, 2 * i, 2))) << i;
    }
    const Tensor whole = comm::gather(pieces, 0, destination);
    EXPECT_EQ(whole.device(), destination);
    EXPECT_EQ(Values(whole.cpu()), Values(x));
  };
  check({kCPU, kCPU, kCPU}, kCPU);
  EMBER_SKIP_WITHOUT_GPUS(1);
  check({Cuda(0), Cuda(0), Cuda(0)}, Cuda(0));
  check({Cuda(0), Cuda(0), Cuda(0)}, kCPU);
  if (cuda::device_count() < 2) {
    GTEST_SKIP() << "one GPU passed; scattering across GPUs needs 2, this machine has 1";
  }
  check({Cuda(0), Cuda(1), Cuda(0)}, Cuda(1));
}

std::shared_ptr<nn::Sequential> Mlp() {
  manual_seed(3);
  return std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(8, 16), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(16, 4)});
}

// Within 1e-5 of the larger of 1 and b's largest magnitude.
void ExpectClose(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.sizes(), b.sizes()) << what;
  const Tensor ha = a.cpu(), hb = b.cpu();
  const float scale = std::max(1.0f, hb.abs().max().item<float>());
  EXPECT_LE((ha - hb).abs().max().item<float>(), 1e-5f * scale) << what;
}

// DataParallel over `devices` (module on devices[0]) against the plain module
// on the CPU: outputs (on `output_device`; with one device the module's own
// output, as torch's DataParallel) and gradients.
void ExpectMatchesPlainModule(const std::vector<Device>& devices,
                              std::optional<Device> output_device) {
  auto plain = Mlp();
  auto module = std::static_pointer_cast<nn::Sequential>(plain->clone(devices[0]));
  auto dp = std::make_shared<DataParallel>(
      module, DataParallelOptions{.device_ids = devices, .output_device = output_device});
  const Tensor x = randn({10, 8});
  const Tensor y_plain = (*plain)(x);
  const Tensor y = (*dp)(x.to(devices[0]));
  EXPECT_EQ(y.device(), devices.size() == 1 ? devices[0] : output_device.value_or(devices[0]));
  ExpectClose(y, y_plain, "output");
  (y * y).sum().backward();
  (y_plain * y_plain).sum().backward();
  const auto got = module->named_parameters();
  const auto want = plain->named_parameters();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(got[i].second.grad().defined()) << got[i].first;
    EXPECT_EQ(got[i].second.grad().device(), devices[0]) << got[i].first;
    ExpectClose(got[i].second.grad(), want[i].second.grad(), "gradient of " + got[i].first);
  }
}

TEST(DataParallelCudaTest, DeviceIdsZeroWithTheModuleOnCuda0) {
  ExpectMatchesPlainModule({kCPU, kCPU}, std::nullopt);
  EMBER_SKIP_WITHOUT_GPUS(1);
  ExpectMatchesPlainModule({Cuda(0)}, std::nullopt);
  ExpectMatchesPlainModule({Cuda(0)}, Device(kCPU));
}

TEST(DataParallelCudaTest, ReplicasAcrossGpus) {
  ExpectMatchesPlainModule({kCPU, kCPU, kCPU}, Device(kCPU));
  EMBER_SKIP_WITHOUT_GPUS(2);
  std::vector<Device> all;
  for (int i = 0; i < cuda::device_count(); ++i) all.push_back(Cuda(i));
  ExpectMatchesPlainModule({Cuda(0), Cuda(1)}, std::nullopt);
  ExpectMatchesPlainModule({Cuda(0), Cuda(1)}, Cuda(1));
  ExpectMatchesPlainModule(all, Device(kCPU));
  // The functional form, and a forward without grad mode.
  auto module = std::static_pointer_cast<nn::Sequential>(Mlp()->clone(Cuda(0)));
  const Tensor x = randn({6, 8});
  const Tensor alone = (*module)(x.to(Cuda(0)));
  autograd::NoGradGuard no_grad;
  const Value out = data_parallel(module, Value(x.to(Cuda(0))), std::vector<Device>{Cuda(0), Cuda(1)});
  ASSERT_TRUE(out.is<Tensor>());
  ExpectClose(*out.get_if<Tensor>(), alone, "data_parallel");
  EXPECT_FALSE(out.get_if<Tensor>()->requires_grad());
}

TEST(DataParallelCudaTest, BalanceRuleOnRealDeviceProperties) {
  // The CPU side: the rule on properties made up here.
  const DeviceProperties big{.name = "big", .total_memory = 80, .multi_processor_count = 132};
  const DeviceProperties small{.name = "small", .total_memory = 40, .multi_processor_count = 132};
  EXPECT_EQ(check_balance({Cuda(0), Cuda(1)}, {big, big}), std::nullopt);
  EXPECT_THAT(check_balance({Cuda(0), Cuda(1)}, {big, small}),
              ::testing::Optional(::testing::HasSubstr("exclude GPU 1 which has less than 75% "
                                                       "of the memory or cores of GPU 0")));
  EMBER_SKIP_WITHOUT_GPUS(1);
  const std::optional<DeviceProperties> p = get_device_properties(Cuda(0));
  ASSERT_TRUE(p.has_value());
  EXPECT_GT(p->total_memory, int64_t{1} << 30) << p->name;
  EXPECT_GT(p->multi_processor_count, 0) << p->name;
  EXPECT_FALSE(p->name.empty());
  // One device listed twice is balanced with itself.
  EXPECT_EQ(check_balance({Cuda(0), Cuda(0)}, {*p, *p}), std::nullopt);
}

}  // namespace
}  // namespace ember::parallel
