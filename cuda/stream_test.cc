#include "cuda/stream.h"

#include <set>
#include <thread>
#include <vector>

#include "absl/strings/string_view.h"
#include "cuda/testing_kernels.h"
#include "gtest/gtest.h"
#include "tensor/device_guard.h"
#include "tensor/stream.h"
#include "third_party/cuda/device_check.h"

namespace ember::cuda {
namespace {

using testing::LaunchCopyInt;
using testing::LaunchSpinThenStore;

constexpr Device kCuda0(DeviceType::kCUDA, 0);
// Long enough that the host's next few calls surely run while it spins.
constexpr int64_t kSpinNanoseconds = 300'000'000;

bool Contains(absl::string_view text, absl::string_view part) {
  return text.find(part) != absl::string_view::npos;
}

// One int in device memory, zeroed.
class DeviceInt {
 public:
  DeviceInt() {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&ptr_), sizeof(int)), cudaSuccess);
    EXPECT_EQ(cudaMemset(ptr_, 0, sizeof(int)), cudaSuccess);
    // The pool's streams do not wait for the default stream's memset.
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  ~DeviceInt() { cudaFree(ptr_); }
  int* get() const { return ptr_; }
  int read() const {
    int value = -1;
    EXPECT_EQ(cudaMemcpy(&value, ptr_, sizeof(int), cudaMemcpyDeviceToHost), cudaSuccess);
    return value;
  }

 private:
  int* ptr_ = nullptr;
};

TEST(CudaStreamTest, WithoutADeviceStreamsAndEventsFailWithTheReason) {
  if (is_available())
    GTEST_SKIP() << "a CUDA device is usable here; this case checks the state "
                    "without one";
  // The tensor-level calls do not crash and report the reason.
  EXPECT_EQ(ember::current_stream(Device(DeviceType::kCUDA)).id(), 0);
  EXPECT_EQ(ember::current_stream(kCuda0), ember::Stream(kCuda0, 0));
  {
    ember::StreamGuard guard(ember::Stream(kCuda0, 3));  // nothing to set
    EXPECT_EQ(ember::current_stream(kCuda0).id(), 0);
  }
  absl::Status synced = ember::synchronize(ember::Stream(kCuda0, 0));
  EXPECT_EQ(synced.code(), absl::StatusCode::kFailedPrecondition) << synced;
  EXPECT_TRUE(Contains(synced.message(), unavailable_reason())) << synced;
  ember::Event event(DeviceType::kCUDA, /*enable_timing=*/true);
  absl::Status recorded = event.record(ember::Stream(kCuda0, 0));
  EXPECT_EQ(recorded.code(), absl::StatusCode::kFailedPrecondition) << recorded;
  EXPECT_TRUE(Contains(recorded.message(), unavailable_reason())) << recorded;
  EXPECT_FALSE(event.was_recorded());
  EXPECT_TRUE(event.query());
  EXPECT_TRUE(GetDeviceGuardImpl(DeviceType::kCUDA)->QueryStream(ember::Stream(kCuda0, 0)));

  // So do the cuda::Stream calls.
  for (const absl::Status& s :
       {current_stream().status(), default_stream(0).status(), get_stream_from_pool().status(),
        get_stream_from_pool(/*is_high_priority=*/true, 0).status(),
        Stream::wrap(ember::Stream(kCuda0, 0)).status()}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_TRUE(Contains(s.message(), unavailable_reason())) << s;
  }
}

TEST(CudaStreamTest, WrapRefusesStreamsOfOtherDevices) {
  absl::StatusOr<Stream> cpu = Stream::wrap(ember::Stream(kCPU, 0));
  EXPECT_EQ(cpu.status().code(), absl::StatusCode::kInvalidArgument) << cpu.status();
  EXPECT_TRUE(Contains(cpu.status().message(), "cpu default stream is not a CUDA stream"))
      << cpu.status();
}

TEST(CudaStreamTest, DefaultStreamIsIdZeroAndCurrentUntilAGuard) {
  EMBER_SKIP_WITHOUT_CUDA();
  absl::StatusOr<Stream> dflt = default_stream(0);
  ASSERT_TRUE(dflt.ok()) << dflt.status();
  EXPECT_EQ(dflt->id(), 0);
  EXPECT_EQ(dflt->stream(), nullptr);
  EXPECT_EQ(dflt->device(), kCuda0);
  EXPECT_EQ(*current_stream(0), *dflt);
  absl::StatusOr<Stream> side = get_stream_from_pool(false, 0);
  ASSERT_TRUE(side.ok()) << side.status();
  EXPECT_NE(side->id(), 0);
  EXPECT_NE(side->stream(), nullptr);
  {
    ember::StreamGuard guard(*side);
    EXPECT_EQ(*current_stream(), *side);
    EXPECT_EQ(ember::current_stream(kCuda0), side->unwrap());
    std::thread([&] {
      EXPECT_EQ(*current_stream(0), *dflt);  // current streams are per thread
    }).join();
  }
  EXPECT_EQ(*current_stream(0), *dflt);
}

TEST(CudaStreamTest, PoolStreamsAreDistinctAndReusedRoundRobin) {
  EMBER_SKIP_WITHOUT_CUDA();
  std::vector<Stream> normal;
  std::set<int64_t> ids;
  std::set<cudaStream_t> handles;
  for (int i = 0; i < kStreamsPerPool; ++i) {
    absl::StatusOr<Stream> s = get_stream_from_pool();
    ASSERT_TRUE(s.ok()) << s.status();
    normal.push_back(*s);
    ids.insert(s->id());
    handles.insert(s->stream());
  }
  EXPECT_EQ(ids.size(), kStreamsPerPool);
  EXPECT_EQ(handles.size(), kStreamsPerPool);
  EXPECT_EQ(*get_stream_from_pool(), normal.front());  // the pool wrapped around

  int least = 0, greatest = 0;
  ASSERT_EQ(cudaDeviceGetStreamPriorityRange(&least, &greatest), cudaSuccess);
  for (int i = 0; i < kStreamsPerPool; ++i) {
    absl::StatusOr<Stream> high = get_stream_from_pool(/*is_high_priority=*/true);
    ASSERT_TRUE(high.ok()) << high.status();
    EXPECT_TRUE(ids.insert(high->id()).second) << high->id();
    EXPECT_TRUE(handles.insert(high->stream()).second);
    EXPECT_EQ(high->priority(), greatest);
    int priority = 1;
    ASSERT_EQ(cudaStreamGetPriority(high->stream(), &priority), cudaSuccess);
    EXPECT_EQ(priority, greatest);
  }
  EXPECT_EQ(normal.front().priority(), 0);
  EXPECT_EQ(*Stream::wrap(normal.back().unwrap()), normal.back());
  absl::StatusOr<Stream> unknown = Stream::wrap(ember::Stream(kCuda0, 999));
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument) << unknown.status();
  EXPECT_TRUE(Contains(unknown.status().message(), "cuda:0 has no stream 999")) << unknown.status();
}

// tensor/stream.h's device-generic get_stream_from_pool reaches the same
// pools through the registered guard: distinct pool streams, the
// high-priority pool when asked, the current device for a device without
// an index.
TEST(CudaStreamTest, TheGenericPoolIsTheDevicesPool) {
  EMBER_SKIP_WITHOUT_CUDA();
  absl::StatusOr<ember::Stream> a = ember::get_stream_from_pool(kCuda0);
  absl::StatusOr<ember::Stream> b = ember::get_stream_from_pool(Device(DeviceType::kCUDA));
  absl::StatusOr<ember::Stream> high = ember::get_stream_from_pool(kCuda0, true);
  ASSERT_TRUE(a.ok() && b.ok() && high.ok()) << a.status() << b.status() << high.status();
  EXPECT_NE(*a, *b);
  EXPECT_NE(a->id(), 0);
  EXPECT_EQ(b->device(), kCuda0);
  absl::StatusOr<Stream> wrapped = Stream::wrap(*high);
  ASSERT_TRUE(wrapped.ok()) << wrapped.status();
  int least = 0, greatest = 0;
  ASSERT_EQ(cudaDeviceGetStreamPriorityRange(&least, &greatest), cudaSuccess);
  EXPECT_EQ(wrapped->priority(), greatest);
}

// A user stream runs a long kernel; the default stream waits on an event
// recorded after it, so the default stream's copy sees the kernel's store.
TEST(CudaStreamTest, DefaultStreamWaitsOnAnEventOfAUserStream) {
  EMBER_SKIP_WITHOUT_CUDA();
  DeviceInt x, y;
  absl::StatusOr<Stream> side = get_stream_from_pool();
  absl::StatusOr<Stream> dflt = default_stream();
  ASSERT_TRUE(side.ok() && dflt.ok());
  ASSERT_EQ(LaunchSpinThenStore(side->stream(), kSpinNanoseconds, x.get(), 7), cudaSuccess);
  ember::Event done(DeviceType::kCUDA);
  ASSERT_TRUE(side->record_event(done).ok());
  ASSERT_TRUE(dflt->wait_event(done).ok());
  ASSERT_EQ(LaunchCopyInt(dflt->stream(), x.get(), y.get()), cudaSuccess);
  EXPECT_FALSE(side->query());  // still spinning
  EXPECT_FALSE(done.query());
  EXPECT_FALSE(dflt->query());  // its copy waits for the event
  ASSERT_TRUE(dflt->synchronize().ok());
  EXPECT_EQ(y.read(), 7);  // the copy ran after the store
  EXPECT_TRUE(side->query());
  EXPECT_TRUE(done.query());
}

TEST(CudaStreamTest, WaitStreamOrdersTwoPoolStreams) {
  EMBER_SKIP_WITHOUT_CUDA();
  DeviceInt x, y;
  absl::StatusOr<Stream> a = get_stream_from_pool();
  absl::StatusOr<Stream> b = get_stream_from_pool();
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_NE(a->stream(), b->stream());
  ASSERT_EQ(LaunchSpinThenStore(a->stream(), kSpinNanoseconds, x.get(), 9), cudaSuccess);
  ASSERT_TRUE(b->wait_stream(*a).ok());
  ASSERT_EQ(LaunchCopyInt(b->stream(), x.get(), y.get()), cudaSuccess);
  EXPECT_FALSE(b->query());
  ASSERT_TRUE(b->synchronize().ok());
  EXPECT_EQ(y.read(), 9);
}

TEST(CudaStreamTest, DeviceSynchronizeWaitsForEveryStream) {
  EMBER_SKIP_WITHOUT_CUDA();
  DeviceInt x;
  absl::StatusOr<Stream> side = get_stream_from_pool(/*is_high_priority=*/true);
  ASSERT_TRUE(side.ok()) << side.status();
  ASSERT_EQ(LaunchSpinThenStore(side->stream(), kSpinNanoseconds, x.get(), 5), cudaSuccess);
  ASSERT_TRUE(synchronize(0).ok());
  EXPECT_TRUE(side->query());
  EXPECT_EQ(x.read(), 5);
}

TEST(CudaStreamTest, ElapsedTimeOfATimedKernel) {
  EMBER_SKIP_WITHOUT_CUDA();
  DeviceInt x;
  absl::StatusOr<Stream> s = get_stream_from_pool();
  ASSERT_TRUE(s.ok()) << s.status();
  ember::Event start(DeviceType::kCUDA, /*enable_timing=*/true);
  ember::Event end(DeviceType::kCUDA, /*enable_timing=*/true);
  ember::Event untimed(DeviceType::kCUDA);
  ASSERT_TRUE(s->record_event(start).ok());
  ASSERT_EQ(LaunchSpinThenStore(s->stream(), kSpinNanoseconds, x.get(), 1), cudaSuccess);
  ASSERT_TRUE(s->record_event(end).ok());
  ASSERT_TRUE(s->record_event(untimed).ok());
  absl::StatusOr<double> early = start.elapsed_time(end);
  EXPECT_EQ(early.status().code(), absl::StatusCode::kFailedPrecondition) << early.status();
  EXPECT_TRUE(Contains(early.status().message(), "have not both completed")) << early.status();
  ASSERT_TRUE(end.synchronize().ok());
  absl::StatusOr<double> ms = start.elapsed_time(end);
  ASSERT_TRUE(ms.ok()) << ms.status();
  EXPECT_GT(*ms, 0);
  // The kernel spun for kSpinNanoseconds of the GPU's own clock.
  EXPECT_GE(*ms, 0.9 * kSpinNanoseconds / 1e6);
  absl::StatusOr<double> no_timing = start.elapsed_time(untimed);
  EXPECT_EQ(no_timing.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(CudaStreamTest, ErrorsNameTheStream) {
  EMBER_SKIP_WITHOUT_CUDA();
  absl::Status s = ember::synchronize(ember::Stream(kCuda0, -4));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(Contains(s.message(), "cuda:0 has no stream -4")) << s;
  ember::Event event(DeviceType::kCUDA);
  absl::Status recorded = event.record(ember::Stream(Device(DeviceType::kCUDA, 99), 0));
  EXPECT_EQ(recorded.code(), absl::StatusCode::kInvalidArgument) << recorded;
  EXPECT_TRUE(Contains(recorded.message(), "device index 99")) << recorded;
}

}  // namespace
}  // namespace ember::cuda
