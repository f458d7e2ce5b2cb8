// The dispatcher's priority order (Note [Dispatch]) on an Op defined here.
#include "tensor/dispatch.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/factories.h"
#include "tensor/tensor.h"

namespace ember {
namespace {

using ::testing::HasSubstr;

constinit Op<int(const Tensor&)> probe{"probe"};

int Composite(const Tensor&) { return 1; }
int Cpu(const Tensor&) { return 2; }
int Autograd(const Tensor& t) { return 10 + probe.Redispatch(DispatchKey::kAutograd, t); }

struct RequiresGrad : AutogradMetaInterface {
  bool requires_grad() const override { return true; }
};

TEST(DispatchTest, PicksHighestPriorityRegisteredKernel) {
  Tensor t = zeros({2});
  EXPECT_THROW(probe(t), Error);
  try {
    probe(t);
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("probe: no kernel registered for device(s) cpu"));
  }
  probe.SetKernel(DispatchKey::kComposite, &Composite);
  EXPECT_EQ(probe(t), 1);
  probe.SetKernel(DispatchKey::kCPU, &Cpu);
  EXPECT_EQ(probe(t), 2);
  probe.SetKernel(DispatchKey::kAutograd, &Autograd);
  EXPECT_EQ(probe(t), 2);  // No input requires grad.
  Tensor g = zeros({2});
  g.impl()->set_autograd_meta(std::make_unique<RequiresGrad>());
  EXPECT_EQ(probe(g), 12);  // Autograd, then redispatch to the cpu kernel.
  {
    BelowAutogradGuard below;
    EXPECT_EQ(probe(g), 2);  // Note [Below autograd]: the autograd key is skipped.
    {
      BelowAutogradGuard nested;
    }
    EXPECT_EQ(probe(g), 2);  // Still below after a nested guard ends.
  }
  EXPECT_EQ(probe(g), 12);
}

// A tensor on cuda:0 with no elements: no CUDA memory is needed to carry the
// key, so the rules below are checked on any machine.
Tensor EmptyCudaTensor() {
  Storage storage(DataPtr(nullptr, nullptr, nullptr, Device(DeviceType::kCUDA, 0)), 0);
  return Tensor(MakeTensorImpl(std::move(storage), kFloat32, std::vector<int64_t>{0},
                               std::vector<int64_t>{1}, 0));
}

constinit Op<int(const Tensor&, const Tensor&)> pair{"pair"};
constinit Op<int(const Tensor&, const Tensor&)> transfer{"transfer", /*cross_device=*/true};

int PairCpu(const Tensor&, const Tensor&) { return 2; }
int PairCuda(const Tensor&, const Tensor&) { return 3; }
int PairComposite(const Tensor&, const Tensor&) { return 1; }

TEST(DispatchTest, CudaOutranksCpuAndOwnsCrossDeviceOps) {
  Tensor cpu = zeros({0});
  Tensor cuda = EmptyCudaTensor();
  ASSERT_TRUE(cuda.device().is_cuda());
  transfer.SetKernel(DispatchKey::kCPU, &PairCpu);
  EXPECT_EQ(transfer(cpu, cuda), 2);  // only the CPU kernel exists: it decides (and refuses)
  transfer.SetKernel(DispatchKey::kCUDA, &PairCuda);
  EXPECT_EQ(transfer(cpu, cuda), 3);
  EXPECT_EQ(transfer(cuda, cpu), 3);
  EXPECT_EQ(transfer(cpu, cpu), 2);
  EXPECT_EQ(transfer.Redispatch(DispatchKey::kCUDA, cpu, cuda), 2);  // below CUDA: the CPU kernel
}

TEST(DispatchTest, MixedDevicesReachNoDeviceKernelOfAnOrdinaryOp) {
  Tensor cpu = zeros({0});
  Tensor cuda = EmptyCudaTensor();
  pair.SetKernel(DispatchKey::kCPU, &PairCpu);
  pair.SetKernel(DispatchKey::kCUDA, &PairCuda);
  EXPECT_EQ(pair(cuda, cuda), 3);
  try {
    pair(cpu, cuda);
    ADD_FAILURE() << "a cpu and a cuda tensor reached a device kernel";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("pair: expected all tensors to be on the same device, but "
                                    "found tensors on cpu and cuda"));
  }
  // A composite kernel (which may move a 0-dim operand) still runs first.
  pair.SetKernel(DispatchKey::kCUDA, nullptr);
  pair.SetKernel(DispatchKey::kCPU, nullptr);
  pair.SetKernel(DispatchKey::kComposite, &PairComposite);
  EXPECT_FALSE(pair.HasKernel(DispatchKey::kCPU));
  EXPECT_EQ(pair(cpu, cuda), 1);
}

TEST(DispatchTest, KeySetOperations) {
  DispatchKeySet s = DispatchKeySet(DispatchKey::kCPU) | DispatchKeySet(DispatchKey::kAutograd);
  EXPECT_TRUE(s.Has(DispatchKey::kCPU));
  EXPECT_TRUE(s.Has(DispatchKey::kAutograd));
  EXPECT_FALSE(s.Has(DispatchKey::kCUDA));
  EXPECT_FALSE(s.Remove(DispatchKey::kAutograd).Has(DispatchKey::kAutograd));
  EXPECT_TRUE(DispatchKeySet().empty());
  EXPECT_TRUE(s.has_several());
  EXPECT_FALSE(DispatchKeySet(DispatchKey::kCPU).has_several());
  EXPECT_EQ(s.Highest(), DispatchKey::kAutograd);
  DispatchKeySet all =
      s | DispatchKeySet(DispatchKey::kCUDA) | DispatchKeySet(DispatchKey::kComposite);
  EXPECT_EQ(all.Below(DispatchKey::kAutograd).Highest(), DispatchKey::kCUDA);
  EXPECT_EQ(all.Below(DispatchKey::kCUDA).Highest(), DispatchKey::kCPU);
  EXPECT_TRUE(all.Below(DispatchKey::kComposite).empty());
}

}  // namespace
}  // namespace ember
