// Checkpoints of CUDA tensors (Note [Storage locations] in torch_format.cc)
// with //cuda linked: saved with their device, loaded back there or where
// map_location says, shared storages kept shared on the device. Without a
// device: what PyTorch says on a machine without one; every GPU case skips,
// saying why.
#include <cstdlib>
#include <string>
#include <vector>

#include "cuda/device.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "serialization/serialization.h"
#include "serialization/torch_format.h"
#include "serialization/zip.h"
#include "tensor/factories.h"
#include "tensor/testing.h"
#include "third_party/cuda/device_check.h"

namespace ember::serialization {
namespace {

using ::ember::testing::Make;
using ::ember::testing::Values;
using ::testing::HasSubstr;
using ::testing::StartsWith;

const Device kCuda0(DeviceType::kCUDA, 0);

std::string TmpPath(const std::string& name) {
  return std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
}

TEST(CheckpointCudaTest, WithoutADeviceCudaMapLocationsFailAsPyTorchDoes) {
  if (cuda::is_available()) GTEST_SKIP() << "a CUDA device is usable: this case is for none";
  const std::string path = TmpPath("cpu.pt");
  ASSERT_TRUE(ember::save({{"w", Make({1, 2})}}, path).ok());
  absl::Status s = ember::load(path, {.map_location = "cuda:0"}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()),
              StartsWith("Attempting to deserialize object on a CUDA device but "
                         "torch.cuda.is_available() is False."));
}

TEST(CheckpointCudaTest, CudaTensorsKeepTheirDevice) {
  EMBER_SKIP_WITHOUT_CUDA();
  const Tensor w = Make({1, 2, 3, 4, 5, 6}, {2, 3}, kFloat32).to(kCuda0);
  const Tensor b = Make({0.5, -1}, kFloat64).to(kCuda0);
  const std::string path = TmpPath("cuda.pt");
  ASSERT_TRUE(ember::save({{"w", w}, {"b", b}, {"wt", w.t()}}, path).ok());

  absl::StatusOr<std::string> bytes = write_torch_checkpoint({{"w", w}});
  ASSERT_TRUE(bytes.ok());
  absl::StatusOr<ZipReader> zip = ZipReader::open(*bytes, "w.pt");
  ASSERT_TRUE(zip.ok());
  absl::StatusOr<absl::string_view> pkl = zip->read("archive/data.pkl");
  ASSERT_TRUE(pkl.ok());
  EXPECT_THAT(std::string(*pkl), HasSubstr("cuda:0"));

  absl::StatusOr<StateDict> back = ember::load(path);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size(), 3u);
  for (const auto& [name, t] : *back) EXPECT_EQ(t.device(), kCuda0) << name;
  EXPECT_EQ(Values((*back)[0].second.cpu()), Values(w.cpu()));
  EXPECT_EQ(Values((*back)[1].second.cpu()), Values(b.cpu()));
  EXPECT_EQ((*back)[2].second.sizes(), (IntArrayRef{3, 2}));
  EXPECT_EQ(Values((*back)[2].second.cpu()), Values(w.t().cpu()));

  absl::StatusOr<StateDict> on_cpu = ember::load(path, {.map_location = "cpu"});
  ASSERT_TRUE(on_cpu.ok()) << on_cpu.status();
  EXPECT_TRUE((*on_cpu)[0].second.is_cpu());
  EXPECT_EQ(Values((*on_cpu)[0].second), Values(w.cpu()));
}

TEST(CheckpointCudaTest, CpuCheckpointsMapToADeviceWithSharedStoragesShared) {
  EMBER_SKIP_WITHOUT_CUDA();
  // PyTorch's fixtures (zip and legacy formats): view.rows and
  // view.transposed share one storage.
  for (const std::string path :
       {"serialization/testdata/tensors.pt", "serialization/testdata/tensors_legacy.pt"}) {
    SCOPED_TRACE(path);
    absl::StatusOr<StateDict> sd = ember::load(path, {.map_location = kCuda0});
    ASSERT_TRUE(sd.ok()) << sd.status();
    absl::StatusOr<StateDict> host = ember::load(path);
    ASSERT_TRUE(host.ok());
    const Tensor* rows = nullptr;
    const Tensor* transposed = nullptr;
    for (size_t i = 0; i < sd->size(); ++i) {
      EXPECT_EQ((*sd)[i].second.device(), kCuda0) << (*sd)[i].first;
      EXPECT_EQ(Values((*sd)[i].second.cpu()), Values((*host)[i].second)) << (*sd)[i].first;
      if ((*sd)[i].first == "view.rows") rows = &(*sd)[i].second;
      if ((*sd)[i].first == "view.transposed") transposed = &(*sd)[i].second;
    }
    ASSERT_TRUE(rows != nullptr && transposed != nullptr);
    EXPECT_TRUE(rows->storage().is_alias_of(transposed->storage()));
  }
}

TEST(CheckpointCudaTest, IndicesPastTheDeviceCountFailAsPyTorchDoes) {
  EMBER_SKIP_WITHOUT_CUDA();
  const int count = cuda::device_count();
  const std::string path = TmpPath("past.pt");
  ASSERT_TRUE(ember::save({{"w", Make({1, 2})}}, path).ok());
  absl::Status s = ember::load(path, {.map_location = Device(DeviceType::kCUDA, count)}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(s.message()),
            "Attempting to deserialize object on CUDA device " + std::to_string(count) +
                " but torch.cuda.device_count() is " + std::to_string(count) +
                ". Please use torch.load with map_location to map your storages to an existing "
                "device.");
}

TEST(CheckpointCudaTest, RemapMovesBetweenDevices) {
  EMBER_SKIP_WITHOUT_CUDA();
  if (cuda::device_count() < 2) {
    GTEST_SKIP() << "needs two CUDA devices, this machine has " << cuda::device_count();
  }
  const std::string path = TmpPath("remap.pt");
  const Tensor w = Make({7, 8, 9}).to(kCuda0);
  ASSERT_TRUE(ember::save({{"w", w}}, path).ok());
  absl::StatusOr<StateDict> sd =
      ember::load(path, {.map_location = MapLocation::Remap({{"cuda:0", "cuda:1"}})});
  ASSERT_TRUE(sd.ok()) << sd.status();
  EXPECT_EQ((*sd)[0].second.device(), Device(DeviceType::kCUDA, 1));
  EXPECT_EQ(Values((*sd)[0].second.cpu()), Values(w.cpu()));
}

}  // namespace
}  // namespace ember::serialization
