// CUDA graphs on cuda:0 (Note [Capturing a graph]): a capture replayed with
// new inputs, the private pool's memory, a pool shared by two graphs,
// random numbers that differ per replay and equal the eager draws from the
// same generator state, and the refusals (a default stream, item() during a
// capture). Without a device the GPU cases skip, saying why; the no-device
// errors run everywhere.
#include "cuda/graphs.h"

#include <stdexcept>

#include "cuda/caching_allocator.h"
#include "cuda/device.h"
#include "cuda/random.h"
#include "cuda/stream.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/error.h"
#include "tensor/factories.h"
#include "tensor/stream.h"
#include "third_party/cuda/device_check.h"

namespace ember::cuda {
namespace {

using ::testing::HasSubstr;

const Device kGpu(DeviceType::kCUDA, 0);

TEST(GraphsWithoutADeviceTest, CaptureSaysWhyItCannotBegin) {
  if (is_available()) GTEST_SKIP() << "a device is present; the GPU cases cover it";
  CUDAGraph g;
  absl::Status st = g.capture_begin();
  EXPECT_TRUE(absl::IsFailedPrecondition(st)) << st;
  EXPECT_THAT(g.replay().message(), HasSubstr("holds no finished capture"));
  EXPECT_THROW(graph scope(g), Error);
  EXPECT_NE(graph_pool_handle().second, graph_pool_handle().second);
}

class GraphsTest : public ::testing::Test {
 protected:
  void SetUp() override { EMBER_SKIP_WITHOUT_CUDA(); }
};

TEST_F(GraphsTest, AReplayRecomputesTheOutputFromTheStaticInput) {
  Tensor x = zeros({4096}, TensorOptions().device(kGpu));
  Tensor y;
  CUDAGraph g;
  {
    graph capture(g);
    y = (x * 2 + 1).exp();
  }
  ASSERT_TRUE(capture_status_of(g).ok()) << capture_status_of(g);
  absl::StatusOr<size_t> nodes = g.num_nodes();
  ASSERT_TRUE(nodes.ok()) << nodes.status();
  EXPECT_GE(*nodes, 2u);
  for (double v : {1.0, -0.5}) {
    x.fill_(v);
    ASSERT_TRUE(g.replay().ok());
    ASSERT_TRUE(synchronize().ok());
    EXPECT_TRUE(y.cpu().allclose(full({4096}, std::exp(2 * v + 1)), 1e-6, 1e-6)) << v;
  }
}

TEST_F(GraphsTest, CaptureAllocatesFromThePrivatePoolOnly) {
  Tensor x = ones({1 << 20}, TensorOptions().device(kGpu));
  ASSERT_TRUE(synchronize().ok());
  const int64_t before = memory_allocated(0);
  Tensor y;
  {
    CUDAGraph g;
    {
      graph capture(g);
      y = x * 3;
    }
    ASSERT_TRUE(capture_status_of(g).ok()) << capture_status_of(g);
    EXPECT_EQ(memory_allocated(0), before) << "the capture took the device pool's memory";
    const MemoryStats pool = internal::private_pool_stats(0, g.pool());
    EXPECT_GE(pool.allocated_bytes, int64_t{4} << 20);
    ASSERT_TRUE(g.replay().ok());
    EXPECT_TRUE(y.cpu().equal(full({1 << 20}, 3.0)));
    const MempoolId id = g.pool();
    g.reset();
    // y still holds its block: the pool lives until it is freed.
    EXPECT_TRUE(y.cpu().equal(full({1 << 20}, 3.0)));
    y = Tensor();
    EXPECT_EQ(internal::private_pool_stats(0, id).reserved_bytes, 0);
  }
}

TEST_F(GraphsTest, GraphsShareAPoolAndReplayInOrder) {
  const MempoolId shared = graph_pool_handle();
  Tensor x = ones({1024}, TensorOptions().device(kGpu));
  Tensor a, b;
  CUDAGraph first, second;
  {
    graph capture(first, shared);
    a = x + 1;
  }
  {
    graph capture(second, shared);
    b = a * 10;
  }
  ASSERT_TRUE(capture_status_of(first).ok() && capture_status_of(second).ok());
  EXPECT_TRUE(first.pool() == shared && second.pool() == shared);
  x.fill_(4.0);
  ASSERT_TRUE(first.replay().ok());
  ASSERT_TRUE(second.replay().ok());
  EXPECT_TRUE(b.cpu().equal(full({1024}, 50.0)));
}

TEST_F(GraphsTest, EachReplayDrawsNewNumbersAndAStateDrawsWhatEagerDraws) {
  Tensor out;
  CUDAGraph g;
  {
    graph capture(g);
    out = rand({1000}, TensorOptions().device(kGpu));
  }
  ASSERT_TRUE(capture_status_of(g).ok()) << capture_status_of(g);
  absl::StatusOr<Tensor> state = get_rng_state(0);
  ASSERT_TRUE(state.ok());
  ASSERT_TRUE(g.replay().ok());
  const Tensor first = out.cpu();
  ASSERT_TRUE(g.replay().ok());
  const Tensor second = out.cpu();
  EXPECT_FALSE(first.equal(second));
  // Back to the state before the first replay: eager draws the first replay's numbers.
  ASSERT_TRUE(set_rng_state(*state, 0).ok());
  EXPECT_TRUE(rand({1000}, TensorOptions().device(kGpu)).cpu().equal(first));
}

TEST_F(GraphsTest, TheDefaultStreamIsRefused) {
  CUDAGraph g;
  absl::Status st = g.capture_begin();  // the current stream is the default one
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_THAT(st.message(), HasSubstr("non-default stream"));
}

TEST_F(GraphsTest, AHostCopyDuringACaptureFailsNamingItAndTheStreamRecovers) {
  Tensor x = ones({16}, TensorOptions().device(kGpu));
  CUDAGraph g;
  try {
    graph capture(g);
    Tensor y = x * 2;
    (void)y.sum().item<float>();
    FAIL() << "item() was captured";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("item()"));
    EXPECT_THAT(e.what(), HasSubstr("capturing a CUDA graph"));
  }
  EXPECT_FALSE(is_current_stream_capturing());
  EXPECT_THAT(g.replay().message(), HasSubstr("holds no finished capture"));
  EXPECT_TRUE((x + 1).cpu().equal(full({16}, 2.0)));  // eager work runs again
}

}  // namespace
}  // namespace ember::cuda
