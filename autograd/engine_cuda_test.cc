// The engine on CUDA devices (Note [Device workers], Note [Backward streams]
// in engine.cc): device nodes run on their device's worker thread, on the
// stream their forward ran on; results are ready on the caller's current
// stream; errors on a device worker reach the caller. Every case needs a GPU
// (two for the two-device case) and skips without one, saying why.
#include <cmath>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "autograd/engine.h"
#include "autograd/function.h"
#include "cuda/stream.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/device_guard.h"
#include "tensor/stream.h"
#include "tensor/testing.h"
#include "third_party/cuda/device_check.h"

namespace ember::autograd {
namespace {

using ::ember::testing::ErrorOf;
using ::ember::testing::Values;
using ::testing::DoubleNear;
using ::testing::HasSubstr;
using ::testing::Pointwise;

const Device kCuda0(DeviceType::kCUDA, 0);
const Device kCuda1(DeviceType::kCUDA, 1);

// Where each backward of Probe ran: thread and current stream of its device.
struct ProbeLog {
  std::mutex mutex;
  std::vector<std::thread::id> threads;
  std::vector<Stream> streams;
};
ProbeLog* g_log = nullptr;

// y = x * 2, recording where its backward runs.
struct Probe : Function<Probe> {
  static Tensor forward(AutogradContext*, const Tensor& x) { return x * 2.0; }
  static variable_list backward(AutogradContext*, variable_list grads) {
    if (g_log != nullptr) {
      std::lock_guard<std::mutex> lock(g_log->mutex);
      g_log->threads.push_back(std::this_thread::get_id());
      g_log->streams.push_back(current_stream(grads[0].device()));
    }
    return {grads[0] * 2.0};
  }
};

struct FailsOnDevice : Function<FailsOnDevice> {
  static Tensor forward(AutogradContext*, const Tensor& x) { return x.clone(); }
  static variable_list backward(AutogradContext*, variable_list grads) {
    EMBER_FAIL("device backward failed on ", grads[0].device().str());
  }
};

TEST(EngineCudaTest, BackwardRunsOnTheForwardsStreamOnTheDeviceWorker) {
  EMBER_SKIP_WITHOUT_CUDA();
  absl::StatusOr<cuda::Stream> side = cuda::get_stream_from_pool(false, 0);
  ASSERT_TRUE(side.ok()) << side.status();
  ASSERT_NE(side->id(), 0) << "a pool stream is not the default stream";
  const Tensor host = randn({256, 64}, TensorOptions(kFloat64));
  Tensor x = host.to(kCuda0).requires_grad_();
  ASSERT_TRUE(cuda::current_stream(0)->synchronize().ok());
  Tensor loss;
  {
    StreamGuard guard(*side);  // the forward runs on the side stream
    loss = (Probe::apply(x).tanh() * 3.0).sum();
  }
  ProbeLog log;
  g_log = &log;
  loss.backward();  // called on the default stream
  g_log = nullptr;
  ASSERT_EQ(log.threads.size(), 1u);
  EXPECT_NE(log.threads[0], std::this_thread::get_id()) << "device nodes run on cuda:0's worker";
  EXPECT_EQ(log.streams[0], side->unwrap()) << "backward runs on the forward's stream";
  // Read on the caller's (default) stream with no explicit synchronisation:
  // the engine made it wait for the side stream.
  Tensor expected = (host.mul(2.0).tanh().pow(2) * -1.0 + 1.0) * 6.0;
  EXPECT_THAT(Values(x.grad().cpu()), Pointwise(DoubleNear(1e-12), Values(expected)));
}

TEST(EngineCudaTest, ResultsAreReadyOnTheCallersCurrentStream) {
  EMBER_SKIP_WITHOUT_CUDA();
  absl::StatusOr<cuda::Stream> forward_stream = cuda::get_stream_from_pool(false, 0);
  absl::StatusOr<cuda::Stream> caller_stream = cuda::get_stream_from_pool(true, 0);
  ASSERT_TRUE(forward_stream.ok() && caller_stream.ok());
  const Tensor host = randn({1024, 1024}, TensorOptions(kFloat64));
  Tensor x = host.to(kCuda0).requires_grad_();
  ASSERT_TRUE(cuda::current_stream(0)->synchronize().ok());
  Tensor loss;
  {
    StreamGuard guard(*forward_stream);
    Tensor y = x;
    for (int i = 0; i < 8; ++i) y = y.mm(x.t()).mul(1e-3);  // slow enough to be in flight
    loss = y.sum();
  }
  std::vector<double> seen;
  {
    StreamGuard guard(*caller_stream);
    variable_list g = grad({loss}, {x});
    // Work queued on the caller's stream, synchronised alone, sees the
    // finished gradient: the engine made the caller's stream wait.
    Tensor copy = g[0].clone();
    ASSERT_TRUE(caller_stream->synchronize().ok());
    seen = Values(copy.cpu());
  }
  ASSERT_TRUE(forward_stream->synchronize().ok());
  // Against the same gradient computed with everything on the default stream.
  Tensor x2 = host.to(kCuda0).requires_grad_();
  Tensor y2 = x2;
  for (int i = 0; i < 8; ++i) y2 = y2.mm(x2.t()).mul(1e-3);
  variable_list g2 = grad({y2.sum()}, {x2});
  const std::vector<double> reference = Values(g2[0].cpu());
  ASSERT_EQ(seen.size(), reference.size());
  for (size_t i = 0; i < seen.size(); ++i) {
    ASSERT_NEAR(seen[i], reference[i], 1e-9 * (1 + std::abs(reference[i]))) << "element " << i;
  }
}

TEST(EngineCudaTest, AnErrorOnADeviceWorkerReachesTheCaller) {
  EMBER_SKIP_WITHOUT_CUDA();
  Tensor x = randn({8}, TensorOptions(kFloat64)).to(kCuda0).requires_grad_();
  Tensor y = (FailsOnDevice::apply(x) * 2.0 + x).sum();
  EXPECT_THAT(ErrorOf([&] { y.backward(); }), HasSubstr("device backward failed on cuda:0"));
  // The worker keeps serving.
  Tensor z = randn({8}, TensorOptions(kFloat64)).to(kCuda0).requires_grad_();
  (z * 3.0).sum().backward();
  EXPECT_THAT(Values(z.grad().cpu()), Pointwise(DoubleNear(0), std::vector<double>(8, 3.0)));
}

// Returns its gradient on the CPU: an error for a tensor with dimensions, a
// scalar is moved to the input's device (as torch does).
struct GradOnTheCpu : Function<GradOnTheCpu> {
  static Tensor forward(AutogradContext*, const Tensor& x) { return x.clone(); }
  static variable_list backward(AutogradContext*, variable_list grads) {
    return {grads[0].cpu()};
  }
};

TEST(EngineCudaTest, AGradientOnAnotherDeviceIsRefusedUnlessItIsAScalar) {
  EMBER_SKIP_WITHOUT_CUDA();
  Tensor x = randn({4}, TensorOptions(kFloat64)).to(kCuda0).requires_grad_();
  EXPECT_THAT(ErrorOf([&] { GradOnTheCpu::apply(x).sum().backward(); }),
              HasSubstr("returned an invalid gradient at index 0 - expected device cuda:0 but "
                        "got cpu"));
  Tensor s = tensor({2.5}, TensorOptions(kFloat64)).view({}).to(kCuda0).requires_grad_();
  (GradOnTheCpu::apply(s) * 3.0).backward();
  ASSERT_TRUE(s.grad().defined());
  EXPECT_TRUE(s.grad().is_cuda());
  EXPECT_THAT(Values(s.grad().cpu()), Pointwise(DoubleNear(0), std::vector<double>{3.0}));
}

TEST(EngineCudaTest, CpuNodesStayOnTheCallingThread) {
  EMBER_SKIP_WITHOUT_CUDA();
  Tensor w = randn({4}, TensorOptions(kFloat64)).requires_grad_();
  ProbeLog log;
  g_log = &log;
  // CPU Probe -> to(cuda:0) -> device ops: the device part runs on the
  // worker, the CPU Probe on this thread.
  Tensor loss = (Probe::apply(w).to(kCuda0) * 5.0).sum();
  loss.backward();
  g_log = nullptr;
  ASSERT_EQ(log.threads.size(), 1u);
  EXPECT_EQ(log.threads[0], std::this_thread::get_id());
  EXPECT_THAT(Values(w.grad()), Pointwise(DoubleNear(0), std::vector<double>(4, 10.0)));
}

TEST(EngineCudaTest, TwoDevicesRunOnTheirOwnWorkers) {
  EMBER_SKIP_WITHOUT_CUDA();
  if (device_count(DeviceType::kCUDA) < 2) {
    GTEST_SKIP() << "needs two CUDA devices; this machine has "
                 << device_count(DeviceType::kCUDA);
  }
  const Tensor host = randn({16}, TensorOptions(kFloat64));
  Tensor x = host.to(kCuda0).requires_grad_();
  ProbeLog log;
  g_log = &log;
  Tensor on1 = Probe::apply(Probe::apply(x).to(kCuda1));  // Probe on cuda:0, then on cuda:1
  on1.sum().backward();
  g_log = nullptr;
  ASSERT_EQ(log.threads.size(), 2u);
  EXPECT_NE(log.threads[0], log.threads[1]) << "one worker per device";
  EXPECT_NE(log.threads[0], std::this_thread::get_id());
  EXPECT_NE(log.threads[1], std::this_thread::get_id());
  EXPECT_EQ(log.streams[0].device(), kCuda1) << "the later op's backward runs first";
  EXPECT_EQ(log.streams[1].device(), kCuda0);
  EXPECT_EQ(x.grad().device(), kCuda0);
  EXPECT_THAT(Values(x.grad().cpu()), Pointwise(DoubleNear(0), std::vector<double>(16, 4.0)));
}

}  // namespace
}  // namespace ember::autograd
