// Saved-tensor hooks and checkpointing on a CUDA device: save_on_cpu sends
// saved device tensors to the host and brings them back; checkpoint() with
// dropout drawn on the device replays the device generator's state (its
// Philox offset) and leaves it where the plain run does; the recomputation
// runs on the device's worker thread (Note [Device workers] in engine.cc).
// Every case needs a GPU and skips without one, saying why.
#include <any>
#include <mutex>
#include <thread>
#include <vector>

#include "autograd/checkpoint.h"
#include "autograd/engine.h"
#include "autograd/saved_tensors_hooks.h"
#include "cuda/caching_allocator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/factories.h"
#include "tensor/testing.h"
#include "third_party/cuda/device_check.h"

namespace ember::autograd {
namespace {

using ::ember::testing::Values;

const Device kCuda0(DeviceType::kCUDA, 0);

Tensor Dropout(const Tensor& x, double p) {
  return x * (bernoulli_(empty_like(x), 1.0 - p) * (1.0 / (1.0 - p)));
}

struct Net {
  Tensor w1, w2;
  explicit Net(uint64_t seed) {
    manual_seed(seed);
    w1 = (randn({32, 64}) * 0.2).to(kCuda0).requires_grad_();
    w2 = (randn({64, 8}) * 0.2).to(kCuda0).requires_grad_();
  }
  Tensor Block(const Tensor& x) const { return Dropout(x.matmul(w1).tanh(), 0.3).matmul(w2); }
};

TEST(CheckpointCudaTest, SaveOnCpuKeepsDeviceTensorsOnTheHost) {
  EMBER_SKIP_WITHOUT_CUDA();
  const Tensor x = randn({16, 32}).to(kCuda0);
  Net plain(1);
  manual_seed(9);
  plain.Block(x).sigmoid().sum().backward();
  for (bool pin : {false, true}) {
    SCOPED_TRACE(pin);
    Net offloaded(1);
    Tensor loss;
    {
      save_on_cpu offload(pin);
      manual_seed(9);
      loss = offloaded.Block(x).sigmoid().sum();
    }
    loss.backward();
    EXPECT_TRUE(offloaded.w1.grad().is_cuda());
    EXPECT_EQ(Values(offloaded.w1.grad().cpu()), Values(plain.w1.grad().cpu()));
    EXPECT_EQ(Values(offloaded.w2.grad().cpu()), Values(plain.w2.grad().cpu()));
  }
  // The device keeps none of the saved activations: four 4 MiB outputs that
  // exp saves stay on the device in the plain run, not under save_on_cpu.
  const Tensor big = randn({1 << 20}).to(kCuda0).requires_grad_();
  auto chain = [&] { return big.exp().exp().exp().exp().sum(); };
  const int64_t base = cuda::memory_allocated(0);
  Tensor kept = chain();
  const int64_t plain_bytes = cuda::memory_allocated(0) - base;
  kept = Tensor();
  for (bool pin : {false, true}) {
    SCOPED_TRACE(pin);
    Tensor y;
    {
      save_on_cpu offload(pin);
      y = chain();
    }
    const int64_t offloaded_bytes = cuda::memory_allocated(0) - base;
    EXPECT_GE(plain_bytes, 4 * (4 << 20));
    EXPECT_LT(offloaded_bytes, plain_bytes - 3 * (4 << 20));
    y.backward();
    EXPECT_EQ(Values(big.grad().cpu()).size(), size_t{1} << 20);
    big.set_grad(Tensor());
  }
}

TEST(CheckpointCudaTest, DropoutOnTheDeviceIsReplayedBitForBit) {
  EMBER_SKIP_WITHOUT_CUDA();
  Net plain(2), checkpointed(2);
  manual_seed(3);
  const Tensor x = randn({16, 32}).to(kCuda0).requires_grad_();
  const Tensor x2 = x.detach().requires_grad_();

  manual_seed(4);
  plain.Block(x).sigmoid().sum().backward();
  const std::vector<double> cuda_state = Values(default_generator(kCuda0).get_state());

  std::mutex mutex;
  std::vector<std::thread::id> threads;
  manual_seed(4);
  Tensor y = checkpoint(
      [&](const Tensor& t) {
        {
          std::lock_guard<std::mutex> lock(mutex);
          threads.push_back(std::this_thread::get_id());
        }
        return checkpointed.Block(t);
      },
      x2);
  y.sigmoid().sum().backward();
  EXPECT_EQ(Values(checkpointed.w1.grad().cpu()), Values(plain.w1.grad().cpu()));
  EXPECT_EQ(Values(checkpointed.w2.grad().cpu()), Values(plain.w2.grad().cpu()));
  EXPECT_EQ(Values(x2.grad().cpu()), Values(x.grad().cpu()));
  EXPECT_EQ(Values(default_generator(kCuda0).get_state()), cuda_state);
  ASSERT_EQ(threads.size(), 2u);
  // The recomputation ran where the device's nodes run: its worker.
  EXPECT_NE(threads[1], threads[0]);
}

}  // namespace
}  // namespace ember::autograd
