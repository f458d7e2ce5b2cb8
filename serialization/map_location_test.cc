// Storage locations and map_location (Note [Storage locations] in
// torch_format.cc) on a machine without a GPU: checkpoints whose storages
// say "cuda:0" (crafted by Ember's pickler, and written by PyTorch itself
// with its location tag redirected) load to the CPU with each form of
// map_location, and without one fail with PyTorch's own message; Ember's
// "cuda:0" files read back in PyTorch. The GPU side is
// checkpoint_cuda_test's.
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "serialization/pickle.h"
#include "serialization/serialization.h"
#include "serialization/torch_format.h"
#include "serialization/zip.h"
#include "tensor/factories.h"
#include "tensor/testing.h"

namespace ember::serialization {
namespace {

using ::ember::testing::Make;
using ::ember::testing::Values;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

constexpr char kScript[] = "/usr/bin/python3 serialization/testdata/cuda_location.py ";
constexpr char kNoCuda[] =
    "Attempting to deserialize object on a CUDA device but torch.cuda.is_available() is False. "
    "If you are running on a CPU-only machine, please use torch.load with "
    "map_location=torch.device('cpu') to map your storages to the CPU.";

std::string TmpPath(const std::string& name) {
  return std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

// What cuda_location.py's tensors() holds.
StateDict Expected() {
  return {{"w", Make({0, 1, 2, 3, 4, 5}, {2, 3}, kFloat32)}, {"b", Make({1.5, -2.0}, kFloat64)}};
}

// A torch.save zip of Expected() whose storages say `location`, as
// write_torch_checkpoint writes one for tensors on that device.
std::string CraftCheckpoint(const std::string& location) {
  std::vector<PickledTensor> pickled;
  ZipWriter zip;
  const StateDict sd = Expected();
  for (size_t i = 0; i < sd.size(); ++i) {
    const Tensor& t = sd[i].second;
    pickled.push_back(PickledTensor{sd[i].first, std::to_string(i), t.dtype(), t.numel(), 0,
                                    SizeVector(t.sizes().begin(), t.sizes().end()),
                                    SizeVector(t.strides().begin(), t.strides().end()), location});
  }
  zip.add("archive/data.pkl", pickle_state_dict(pickled));
  zip.add("archive/byteorder", "little");
  for (size_t i = 0; i < sd.size(); ++i) {
    const Tensor& t = sd[i].second;
    zip.add("archive/data/" + std::to_string(i),
            absl::string_view(static_cast<const char*>(t.raw_data()), t.nbytes()));
  }
  zip.add("archive/version", "3\n");
  absl::StatusOr<std::string> bytes = std::move(zip).finish();
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  return *bytes;
}

void ExpectCpuExpected(const absl::StatusOr<StateDict>& sd) {
  ASSERT_TRUE(sd.ok()) << sd.status();
  const StateDict want = Expected();
  ASSERT_EQ(sd->size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ((*sd)[i].first, want[i].first);
    EXPECT_TRUE((*sd)[i].second.is_cpu());
    EXPECT_EQ((*sd)[i].second.dtype(), want[i].second.dtype());
    EXPECT_EQ((*sd)[i].second.sizes(), want[i].second.sizes());
    EXPECT_EQ(Values((*sd)[i].second), Values(want[i].second));
  }
}

// Runs cuda_location.py; its exit status (77: no python3-torch), and what it
// printed in `out`.
int RunScript(const std::string& args, std::string* out = nullptr) {
  const std::string printed = TmpPath("script.out");
  const std::string cmd = kScript + args + " > " + printed;
  const int status = std::system(cmd.c_str());
  if (out != nullptr) {
    std::ifstream in(printed);
    std::stringstream s;
    s << in.rdbuf();
    *out = s.str();
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(MapLocationTest, EmberWritesTheDeviceOfEachStorage) {
  // A CPU tensor's storage says "cpu"; the crafted one "cuda:0", in the pickle.
  absl::StatusOr<std::string> cpu = write_torch_checkpoint(Expected());
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  absl::StatusOr<ZipReader> zip = ZipReader::open(*cpu, "cpu.pt");
  ASSERT_TRUE(zip.ok());
  absl::StatusOr<absl::string_view> pkl = zip->read("archive/data.pkl");
  ASSERT_TRUE(pkl.ok());
  EXPECT_THAT(std::string(*pkl), HasSubstr("cpu"));
  EXPECT_THAT(std::string(*pkl), Not(HasSubstr("cuda")));

  absl::StatusOr<ZipReader> cuda = ZipReader::open(CraftCheckpoint("cuda:0"), "cuda.pt");
  ASSERT_TRUE(cuda.ok());
  absl::StatusOr<absl::string_view> cuda_pkl = cuda->read("archive/data.pkl");
  ASSERT_TRUE(cuda_pkl.ok());
  // BINUNICODE: 'X', the length 6 as a little-endian uint32, then the tag.
  EXPECT_THAT(std::string(*cuda_pkl), HasSubstr(std::string("X\x06\x00\x00\x00", 5) + "cuda:0"));
}

TEST(MapLocationTest, WithoutAGpuACudaCheckpointNeedsAMapLocation) {
  const std::string path = TmpPath("cuda0.pt");
  WriteFile(path, CraftCheckpoint("cuda:0"));
  absl::StatusOr<StateDict> sd = ember::load(path);
  EXPECT_EQ(sd.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(sd.status().message()), StartsWith(kNoCuda));
  // A map that leaves cuda:0 alone, and a callable that declines, too.
  EXPECT_THAT(
      std::string(ember::load(path, {.map_location = MapLocation::Remap({{"cuda:1", "cpu"}})})
                      .status()
                      .message()),
      StartsWith(kNoCuda));
  EXPECT_THAT(
      std::string(ember::load(path, {.map_location = MapLocation::Callable([](absl::string_view) {
                                       return std::optional<Device>();
                                     })})
                      .status()
                      .message()),
      StartsWith(kNoCuda));
}

TEST(MapLocationTest, EveryFormOfMapLocationLoadsToTheCpu) {
  const std::string path = TmpPath("cuda0_forms.pt");
  WriteFile(path, CraftCheckpoint("cuda:0"));
  ExpectCpuExpected(ember::load(path, {.map_location = "cpu"}));
  ExpectCpuExpected(ember::load(path, {.map_location = kCPU}));
  ExpectCpuExpected(ember::load(path, {.map_location = MapLocation::Remap({{"cuda:0", "cpu"}})}));
  std::vector<std::string> asked;
  ExpectCpuExpected(ember::load(
      path, {.map_location =
                 MapLocation::Callable([&](absl::string_view location) -> std::optional<Device> {
                   asked.emplace_back(location);
                   return kCPU;
                 })}));
  EXPECT_EQ(asked, (std::vector<std::string>{"cuda:0", "cuda:0"}));  // once per storage
  // A CPU checkpoint with no map_location, and with "cpu".
  absl::StatusOr<std::string> cpu = write_torch_checkpoint(Expected());
  ASSERT_TRUE(cpu.ok());
  ExpectCpuExpected(read_torch_checkpoint(*cpu, "cpu.pt"));
  ExpectCpuExpected(read_torch_checkpoint(*cpu, "cpu.pt", "cpu"));
}

TEST(MapLocationTest, MappingToCudaWithoutAGpuFailsAsPyTorchDoes) {
  absl::StatusOr<std::string> cpu = write_torch_checkpoint(Expected());
  ASSERT_TRUE(cpu.ok());
  for (const MapLocation& m : {MapLocation("cuda:1"), MapLocation(Device(DeviceType::kCUDA, 0)),
                               MapLocation::Remap({{"cpu", "cuda"}})}) {
    absl::Status s = read_torch_checkpoint(*cpu, "cpu.pt", m).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(s.message()), StartsWith(kNoCuda));
  }
  // So does a safetensors file mapped to CUDA; mapped to the CPU it loads.
  const std::string st = TmpPath("w.safetensors");
  ASSERT_TRUE(ember::save(Expected(), st).ok());
  EXPECT_THAT(std::string(ember::load(st, {.map_location = "cuda:0"}).status().message()),
              StartsWith(kNoCuda));
  ExpectCpuExpected(ember::load(st, {.map_location = "cpu"}));
}

TEST(MapLocationTest, StringsThatNameNoDeviceAreRefused) {
  const std::string bytes = CraftCheckpoint("cuda:0");
  absl::Status s = read_torch_checkpoint(bytes, "c.pt", "tpu").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("map_location 'tpu' names no device"));
  s = read_torch_checkpoint(bytes, "c.pt", MapLocation::Remap({{"cuda:0", "cuda:x"}})).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("map_location['cuda:0'] 'cuda:x' names no device"));
  s = read_torch_checkpoint(CraftCheckpoint("cuda:one"), "c.pt", "cpu").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("storage location 'cuda:one' names no device"));
}

TEST(MapLocationTest, PyTorchWrittenCudaCheckpointsMatchPyTorchsBehaviour) {
  for (const char* legacy : {"0", "1"}) {
    SCOPED_TRACE(std::string("legacy=") + legacy);
    const std::string path = TmpPath(std::string("torch_cuda_") + legacy + ".pt");
    const int rc = RunScript(std::string("save ") + path + " " + legacy);
    if (rc == 77) GTEST_SKIP() << "python3-torch is not installed";
    ASSERT_EQ(rc, 0);
    // PyTorch's own error for this file on this machine is Ember's.
    std::string torch_error;
    ASSERT_EQ(RunScript("load_error " + path, &torch_error), 0) << torch_error;
    while (!torch_error.empty() && torch_error.back() == '\n') torch_error.pop_back();
    EXPECT_EQ(torch_error, kNoCuda);
    absl::StatusOr<StateDict> sd = ember::load(path);
    EXPECT_EQ(sd.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(sd.status().message()), StartsWith(torch_error));
    ExpectCpuExpected(ember::load(path, {.map_location = "cpu"}));
    ExpectCpuExpected(ember::load(path, {.map_location = MapLocation::Remap({{"cuda:0", "cpu"}})}));
  }
}

TEST(MapLocationTest, PyTorchReadsEmbersCudaCheckpointsToTheCpu) {
  const std::string path = TmpPath("ember_cuda0.pt");
  WriteFile(path, CraftCheckpoint("cuda:0"));
  std::string printed;
  const int rc = RunScript("load_cpu " + path, &printed);
  if (rc == 77) GTEST_SKIP() << "python3-torch is not installed";
  EXPECT_EQ(rc, 0) << printed;
  std::string torch_error;
  ASSERT_EQ(RunScript("load_error " + path, &torch_error), 0) << torch_error;
  EXPECT_THAT(torch_error, StartsWith(kNoCuda));
}

}  // namespace
}  // namespace ember::serialization
