// Distributed checkpoints of CUDA tensors (Note [Device tensors in
// checkpoints]): saved from cuda:0, loaded into CUDA and CPU tensors, and a
// CPU checkpoint loaded into CUDA tensors. Expected values are the global
// tensors the test builds (arange), never the code under test's. Without a
// usable device the cases skip, saying why.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "distributed/checkpoint/checkpoint.h"
#include "gtest/gtest.h"
#include "tensor/factories.h"
#include "third_party/cuda/device_check.h"

namespace ember::distributed::checkpoint {
namespace {

namespace fs = std::filesystem;

const Device kCuda0(DeviceType::kCUDA, 0);

std::string FreshDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  fs::path dir = fs::path(base ? base : "/tmp") / absl::StrCat("dcp_cuda_", ::getpid()) / name;
  fs::remove_all(dir);
  fs::create_directories(dir.parent_path());
  return dir.string();
}

Tensor Global(IntArrayRef shape, double start) {
  return arange(Numel(shape), kFloat64).add(start).view(shape).to(kFloat32);
}

TEST(CheckpointCudaTest, SavesCudaTensorsAndLoadsThemIntoCudaAndCpuTensors) {
  EMBER_SKIP_WITHOUT_CUDA();
  const Tensor weight = Global({6, 4}, 1.0);
  const Tensor bias = Global({6}, 100.0);
  const std::string dir = FreshDir("to_cuda_and_cpu");
  // The weight as a flat range (as fully_shard's flat parameters hold it),
  // read from a non-contiguous CUDA view; the bias whole.
  const Tensor w_cuda = weight.to(kCuda0).t().contiguous().t();
  ASSERT_FALSE(w_cuda.is_contiguous());
  const StateDict saved = {{"w", shard(w_cuda, {6, 4}, {0, 0})},
                           {"b", replicated(bias.to(kCuda0))}};
  ASSERT_TRUE(save(saved, {.path = dir}).ok());

  Tensor w_back = zeros({6, 4}, TensorOptions().device(kCuda0));
  Tensor b_back = zeros({6}, TensorOptions().device(kCuda0));
  ASSERT_TRUE(load({{"w", shard(w_back, {6, 4}, {0, 0})}, {"b", replicated(b_back)}},
                   {.path = dir})
                  .ok());
  EXPECT_TRUE(w_back.device() == kCuda0);
  EXPECT_TRUE(w_back.cpu().equal(weight));
  EXPECT_TRUE(b_back.cpu().equal(bias));

  // Rows [3, 6) of the weight into a CPU tensor.
  Tensor rows = zeros({3, 4});
  ASSERT_TRUE(load({{"w", shard(rows, {6, 4}, {3, 0})}}, {.path = dir}).ok());
  EXPECT_TRUE(rows.equal(weight.narrow(0, 3, 3)));
}

TEST(CheckpointCudaTest, LoadsACpuCheckpointIntoAShardOfACudaTensor) {
  EMBER_SKIP_WITHOUT_CUDA();
  const Tensor weight = Global({8, 3}, -5.0);
  const std::string dir = FreshDir("from_cpu");
  ASSERT_TRUE(save({{"w", replicated(weight)}}, {.path = dir}).ok());
  // Elements [7, 19) of the flattening, into a view of a larger CUDA buffer
  // whose other elements must stay as they are.
  Tensor buffer = full({30}, 42.0, TensorOptions().device(kCuda0));
  ASSERT_TRUE(load({{"w", flat_shard(buffer.narrow(0, 5, 12), {8, 3}, 7)}}, {.path = dir}).ok());
  const Tensor host = buffer.cpu();
  EXPECT_TRUE(host.narrow(0, 5, 12).equal(weight.view({24}).narrow(0, 7, 12)));
  EXPECT_TRUE(host.narrow(0, 0, 5).equal(full({5}, 42.0)));
  EXPECT_TRUE(host.narrow(0, 17, 13).equal(full({13}, 42.0)));
}

}  // namespace
}  // namespace ember::distributed::checkpoint
