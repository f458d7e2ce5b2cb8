// Host<->device copies with non_blocking (Note [Non-blocking copies] in
// tensor/ops.h; cuda/copy_kernels.cc): from and to pinned memory they are
// queued on the device's current stream and return while it is still busy;
// from or to pageable memory they wait; a pinned block freed while its copy
// is queued is not handed out again; Tensor::to/cuda/cpu. Without a device,
// the errors; every GPU case skips, saying why.
//
// "Returns while the stream is busy" is checked behind a StreamGate
// (cuda/testing/stream_gate.h), which holds the stream until the test opens
// it, so the check cannot race the GPU; the kernels and allocations the copy
// needs are made before the gate closes (a first launch may load its module
// and synchronize the context, which would wait for the gate). "Waits" is
// checked behind a kernel that spins for a set time: a copy that returns
// only after it finished has waited.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "cuda/device.h"
#include "cuda/stream.h"
#include "cuda/testing/stream_gate.h"
#include "cuda/testing_kernels.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/factories.h"
#include "tensor/ops.h"
#include "tensor/stream.h"
#include "tensor/testing.h"
#include "third_party/cuda/device_check.h"

namespace ember::cuda {
namespace {

using ::ember::cuda::testing::StreamGate;
using ::ember::testing::ErrorOf;
using ::ember::testing::Values;
using ::testing::HasSubstr;

const Device kCuda0(DeviceType::kCUDA, 0);

// How long Occupy keeps a stream busy: a copy that returns only after that
// has waited for the stream.
constexpr int64_t kBusyNanoseconds = 300'000'000;
// How long a gate holds its stream when the test does not open it (a call
// under test waited for the stream): the test then fails instead of hanging.
constexpr absl::Duration kGateGiveUp = absl::Seconds(10);

// A device int for the spinning kernel to store into.
class DeviceSlot {
 public:
  DeviceSlot() { EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&ptr_), sizeof(int)), cudaSuccess); }
  ~DeviceSlot() { cudaFree(ptr_); }
  int* get() const { return ptr_; }

 private:
  int* ptr_ = nullptr;
};

// Puts a freed block of each size and kind in the allocators' caches, so
// that the copies under test allocate without cudaMalloc or cudaHostAlloc
// (which may synchronize the device) while the stream is kept busy.
void WarmCaches(std::initializer_list<std::pair<int64_t, TensorOptions>> blocks) {
  std::vector<Tensor> held;
  for (const auto& [n, options] : blocks) held.push_back(empty({n}, options));
}

// Keeps `stream` busy for kBusyNanoseconds.
void Occupy(const Stream& stream, const DeviceSlot& slot) {
  ASSERT_EQ(testing::LaunchSpinThenStore(stream.stream(), kBusyNanoseconds, slot.get(), 1),
            cudaSuccess);
}

Stream Current() {
  absl::StatusOr<Stream> s = current_stream(0);
  EXPECT_TRUE(s.ok()) << s.status();
  return *s;
}

TEST(CopyTest, WithoutADeviceCopiesToCudaFail) {
  if (is_available()) GTEST_SKIP() << "a CUDA device is usable: this case is for none";
  Tensor t = arange(4).to(kFloat32);
  EXPECT_NE(ErrorOf([&] { t.cuda(); }), "no error");
  EXPECT_NE(ErrorOf([&] { t.to(kCuda0, /*non_blocking=*/true); }), "no error");
  EXPECT_NE(ErrorOf([&] { t.pin_memory(); }), "no error");
  EXPECT_FALSE(ember::internal::tls_non_blocking_copy);
}

TEST(CopyTest, NonBlockingFromPinnedReturnsBeforeTheStreamRuns) {
  EMBER_SKIP_WITHOUT_CUDA();
  const Tensor host = arange(1 << 20).to(kFloat32).pin_memory();
  ASSERT_TRUE(host.is_pinned());
  const Stream stream = Current();
  const TensorOptions f32 = TensorOptions().device(kCuda0);
  WarmCaches({{1 << 20, f32}, {1 << 20, f32}});
  Tensor wide = empty({1 << 20}, TensorOptions(kFloat64).device(kCuda0));
  wide.copy_(host);  // loads the converting kernel while the stream is idle
  ASSERT_TRUE(stream.synchronize().ok());
  {
    StreamGate gate(kGateGiveUp);
    ASSERT_TRUE(gate.Close(stream.stream()).ok());
    const Tensor dev = host.to(kCuda0, /*non_blocking=*/true);
    EXPECT_FALSE(stream.query()) << "the copy ran before the gate opened";
    EXPECT_FALSE(gate.gave_up()) << "the copy waited for the stream";
    gate.Open();
    ASSERT_TRUE(stream.synchronize().ok());
    EXPECT_EQ(Values(dev.cpu()), Values(host));
  }

  // With a conversion on the device after it (float32 -> float64), too.
  wide.zero_();
  StreamGate gate(kGateGiveUp);
  ASSERT_TRUE(gate.Close(stream.stream()).ok());
  wide.copy_(host, /*non_blocking=*/true);
  EXPECT_FALSE(stream.query()) << "the copy ran before the gate opened";
  EXPECT_FALSE(gate.gave_up()) << "the copy or its conversion waited for the stream";
  gate.Open();
  ASSERT_TRUE(stream.synchronize().ok());
  EXPECT_EQ(Values(wide.cpu()), Values(host));
}

TEST(CopyTest, NonBlockingFromPageableWaits) {
  EMBER_SKIP_WITHOUT_CUDA();
  const Tensor host = arange(1 << 16).to(kFloat32);
  ASSERT_FALSE(host.is_pinned());
  DeviceSlot slot;
  const Stream stream = Current();
  Occupy(stream, slot);
  const Tensor dev = host.to(kCuda0, /*non_blocking=*/true);
  EXPECT_TRUE(stream.query()) << "a copy from pageable memory returned before it ran";
  EXPECT_EQ(Values(dev.cpu()), Values(host));
  // A pinned but non-contiguous source is made contiguous in pageable
  // memory first: it waits too.
  const Tensor strided = arange(64).to(kFloat32).view({8, 8}).pin_memory().t();
  Occupy(stream, slot);
  const Tensor dev2 = strided.to(kCuda0, /*non_blocking=*/true);
  EXPECT_TRUE(stream.query());
  EXPECT_EQ(Values(dev2.cpu()), Values(strided));
}

TEST(CopyTest, NonBlockingToTheHostLandsInPinnedMemoryWithoutWaiting) {
  EMBER_SKIP_WITHOUT_CUDA();
  const Tensor dev = arange(1 << 20).to(kFloat32).to(kCuda0);
  DeviceSlot slot;
  const Stream stream = Current();
  WarmCaches({{1 << 20, TensorOptions().pinned_memory(true)}});
  StreamGate gate(kGateGiveUp);
  ASSERT_TRUE(gate.Close(stream.stream()).ok());
  const Tensor host = dev.to(kCPU, /*non_blocking=*/true);
  EXPECT_TRUE(host.is_pinned());
  EXPECT_FALSE(stream.query()) << "the copy ran before the gate opened";
  EXPECT_FALSE(gate.gave_up()) << "the copy to pinned memory waited for the stream";
  gate.Open();
  ASSERT_TRUE(stream.synchronize().ok());
  EXPECT_EQ(Values(host), Values(arange(1 << 20).to(kFloat32)));

  // Blocking (cpu(), or to() without non_blocking): pageable, and done.
  Occupy(stream, slot);
  const Tensor blocking = dev.cpu();
  EXPECT_FALSE(blocking.is_pinned());
  EXPECT_TRUE(stream.query());
  // Into a caller's pageable tensor, non_blocking waits.
  Occupy(stream, slot);
  Tensor pageable = empty({1 << 20});
  pageable.copy_(dev, /*non_blocking=*/true);
  EXPECT_TRUE(stream.query());
  EXPECT_EQ(Values(pageable), Values(blocking));
}

TEST(CopyTest, APinnedBlockFreedWhileItsCopyIsQueuedIsNotReused) {
  EMBER_SKIP_WITHOUT_CUDA();
  const int64_t n = 1 << 18;
  Tensor dev = empty({n}, TensorOptions().device(kCuda0));
  const Stream stream = Current();
  const TensorOptions pinned_options = TensorOptions().pinned_memory(true);
  WarmCaches({{n, pinned_options}, {n, pinned_options}});  // `pinned`, then `next`
  Tensor pinned = full({n}, 7.0, pinned_options);
  Tensor next_values = full({n}, 9.0);
  StreamGate gate(kGateGiveUp);
  ASSERT_TRUE(gate.Close(stream.stream()).ok());
  const void* freed = pinned.raw_data();
  dev.copy_(pinned, /*non_blocking=*/true);
  pinned = Tensor();  // freed while the copy still waits behind the gate
  Tensor next = empty({n}, pinned_options);
  EXPECT_NE(next.raw_data(), freed) << "the pinned block was handed out with its copy queued";
  next.copy_(next_values);  // what reusing the block would have let into the copy
  EXPECT_FALSE(gate.gave_up()) << "a call waited for the stream";
  gate.Open();
  ASSERT_TRUE(stream.synchronize().ok());
  EXPECT_EQ(Values(dev.cpu()), std::vector<double>(n, 7.0));
}

TEST(CopyTest, CopiesRunOnTheCurrentStream) {
  EMBER_SKIP_WITHOUT_CUDA();
  absl::StatusOr<Stream> side = get_stream_from_pool(false, 0);
  ASSERT_TRUE(side.ok());
  absl::StatusOr<Stream> main_stream = default_stream(0);
  ASSERT_TRUE(main_stream.ok());
  const Tensor host = arange(1 << 16).to(kFloat32).pin_memory();
  StreamGate gate(kGateGiveUp);
  Tensor dev;
  {
    StreamGuard guard(*side);
    WarmCaches({{1 << 16, TensorOptions().device(kCuda0)}});  // cached for the side stream
    ASSERT_TRUE(gate.Close(side->stream()).ok());
    dev = host.to(kCuda0, /*non_blocking=*/true);
  }
  EXPECT_FALSE(side->query()) << "the copy did not queue behind the side stream's gate";
  EXPECT_TRUE(main_stream->query()) << "the copy ran on the default stream";
  EXPECT_FALSE(gate.gave_up()) << "the copy waited for the side stream";
  gate.Open();
  ASSERT_TRUE(side->synchronize().ok());
  EXPECT_EQ(Values(dev.cpu()), Values(host));
}

TEST(CopyTest, CudaAndCpuMoveTensorsAsTorchDoes) {
  EMBER_SKIP_WITHOUT_CUDA();
  const Tensor host = arange(6).to(kFloat64).view({2, 3});
  const Tensor dev = host.cuda();
  EXPECT_EQ(dev.device(), Device(DeviceType::kCUDA, current_device()));
  EXPECT_TRUE(dev.cuda().is_same(dev));
  EXPECT_TRUE(dev.to(Device(DeviceType::kCUDA)).is_same(dev));
  EXPECT_EQ(dev.cuda(0).device(), kCuda0);
  const Tensor back = dev.cpu();
  EXPECT_TRUE(back.is_cpu());
  EXPECT_EQ(Values(back), Values(host));
  EXPECT_THAT(ErrorOf([&] { host.cuda(device_count()); }), HasSubstr("invalid device ordinal"));
}

}  // namespace
}  // namespace ember::cuda
