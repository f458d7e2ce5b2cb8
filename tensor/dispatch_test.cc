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

TEST(DispatchTest, KeySetOperations) {
  DispatchKeySet s = DispatchKeySet(DispatchKey::kCPU) | DispatchKeySet(DispatchKey::kAutograd);
  EXPECT_TRUE(s.Has(DispatchKey::kCPU));
  EXPECT_TRUE(s.Has(DispatchKey::kAutograd));
  EXPECT_FALSE(s.Has(DispatchKey::kCUDA));
  EXPECT_FALSE(s.Remove(DispatchKey::kAutograd).Has(DispatchKey::kAutograd));
  EXPECT_TRUE(DispatchKeySet().empty());
}

}  // namespace
}  // namespace ember
