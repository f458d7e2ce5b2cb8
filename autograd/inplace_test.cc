// In-place ops under autograd (Note [In-place rules]): version counters,
// saved-tensor checks, leaf refusal and history rewriting through views.
#include <vector>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/variable.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/factories.h"
#include "tensor/testing.h"

namespace ember::autograd {
namespace {

using ::ember::testing::ErrorOf;
using ::ember::testing::Make;
using ::ember::testing::Values;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(InPlaceTest, VersionCounterIsSharedByViewsAndDetach) {
  Tensor x = zeros({3, 4});
  Tensor v = x.slice(0, 1, 2);
  Tensor d = x.detach();
  EXPECT_EQ(x.version(), 0u);  // Fresh tensors start at version 0.
  v.add_(1);
  EXPECT_EQ(x.version(), 1u);
  d.mul_(2);
  EXPECT_EQ(x.version(), 2u);
  EXPECT_EQ(v.version(), 2u);
}

TEST(InPlaceTest, ModifiedSavedTensorGivesPyTorchsMessage) {
  Tensor a = ones({3, 4}).requires_grad_();
  Tensor b = a * 2;  // MulBackward output 0, version 0.
  Tensor c = b * b;  // Saves b at version 0.
  b.add_(1);         // Version 1.
  b.add_(1);         // Version 2.
  EXPECT_THAT(ErrorOf([&] { c.sum().backward(); }),
              HasSubstr("one of the variables needed for gradient computation has been modified "
                        "by an inplace operation: [float [3, 4]], which is output 0 of "
                        "MulBackward, is at version 2; expected version 0 instead."));
}

TEST(InPlaceTest, ModifiedSavedLeafNamesNoNode) {
  Tensor a = ones({3}).requires_grad_();
  Tensor w = ones({3});
  Tensor c = a * w;  // Saves w (needed for a's gradient).
  w.add_(1);
  EXPECT_THAT(ErrorOf([&] { c.sum().backward(); }),
              HasSubstr("inplace operation: [float [3]] is at version 1; expected version 0"));
}

TEST(InPlaceTest, LeafThatRequiresGradIsRefusedBeforeModification) {
  Tensor a = Make({1, 2}).requires_grad_();
  EXPECT_THAT(ErrorOf([&] { a.add_(1); }),
              HasSubstr("a leaf Variable that requires grad is being used in an in-place "
                        "operation."));
  EXPECT_THAT(ErrorOf([&] { a.slice(0, 0, 1).mul_(3); }),
              HasSubstr("a view of a leaf Variable that requires grad is being used in an "
                        "in-place operation."));
  EXPECT_THAT(Values(a), ElementsAre(1, 2));
  EXPECT_EQ(a.version(), 0u);
}

TEST(InPlaceTest, InPlaceOnNonLeafRewritesHistory) {
  Tensor a = Make({1, 2, 3}).requires_grad_();
  Tensor c = a * 2;
  c.exp_();
  c.add_(1);
  c.sum().backward();
  std::vector<double> expected;
  for (double v : {1.0, 2.0, 3.0}) expected.push_back(2 * std::exp(2 * v));
  std::vector<double> got = Values(a.grad());
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(got[i], expected[i], 1e-3 * expected[i]);
}

TEST(InPlaceTest, SelfAliasedInPlaceOp) {
  Tensor a = Make({1, 2, 3}).requires_grad_();
  Tensor b = a * 2;
  b.mul_(b);  // (2a)^2
  EXPECT_THAT(Values(b), ElementsAre(4, 16, 36));
  b.sum().backward();
  EXPECT_THAT(Values(a.grad()), ElementsAre(8, 16, 24));  // 8a
}

TEST(InPlaceTest, InPlaceOnViewOfNonLeafReachesTheBase) {
  Tensor a = Make({1, 2, 3, 4}).requires_grad_();
  Tensor b = a * 1;
  Tensor v = b.slice(0, 1, 3);  // b[1:3]
  v.mul_(10);                   // b = [1, 20, 30, 4]
  EXPECT_THAT(Values(b), ElementsAre(1, 20, 30, 4));
  Tensor w = Make({1, 2, 3, 4});
  (b * w).sum().backward();
  EXPECT_THAT(Values(a.grad()), ElementsAre(1, 20, 30, 4));
}

TEST(InPlaceTest, CopyIntoViewOfNonLeaf) {
  Tensor a = Make({1, 2, 3, 4}).requires_grad_();
  Tensor s = Make({7, 8}).requires_grad_();
  Tensor b = a * 1;
  b.narrow(0, 0, 2).copy_(s * 2);
  EXPECT_THAT(Values(b), ElementsAre(14, 16, 3, 4));
  (b * Make({1, 2, 3, 4})).sum().backward();
  EXPECT_THAT(Values(a.grad()), ElementsAre(0, 0, 3, 4));
  EXPECT_THAT(Values(s.grad()), ElementsAre(2, 4));
}

TEST(InPlaceTest, OtherViewsSeeTheWrite) {
  Tensor a = Make({1, 2, 3, 4}).requires_grad_();
  Tensor b = a * 1;
  Tensor whole = b.view({2, 2});
  b.select(0, 0).mul_(5);
  whole.sum().backward();
  EXPECT_THAT(Values(a.grad()), ElementsAre(5, 1, 1, 1));
}

TEST(InPlaceTest, NoGradAllowsUpdatingParameters) {
  Tensor w = Make({1, 2}).requires_grad_();
  (w * w).sum().backward();
  {
    NoGradGuard no_grad;
    w.sub_(w.grad() * 0.5);
  }
  EXPECT_THAT(Values(w), ElementsAre(0, 0));
  EXPECT_TRUE(w.is_leaf());
  EXPECT_TRUE(w.requires_grad());
}

TEST(InPlaceTest, WriteIntoViewOfPlainTensorGivesTheBaseAHistory) {
  // The base requires no grad and the view was taken before anything did:
  // the write still makes the base depend on x (torch's CopySlices).
  Tensor x = Make({1, 2}).requires_grad_();
  Tensor base = zeros({3});
  base.slice(0, 0, 2).copy_(x);
  EXPECT_TRUE(base.requires_grad());
  EXPECT_FALSE(base.is_leaf());
  EXPECT_EQ(base.grad_fn()->name(), "CopySlices");
  EXPECT_THAT(Values(base), ElementsAre(1, 2, 0));
  (base * Make({10, 20, 30})).sum().backward();
  EXPECT_THAT(Values(x.grad()), ElementsAre(10, 20));
}

TEST(InPlaceTest, ViewsTakenBeforeTheWriteSeeIt) {
  Tensor x = Make({1, 2}).requires_grad_();
  Tensor base = zeros({3});
  Tensor head = base.slice(0, 0, 2);
  Tensor tail = base.slice(0, 1, 3);
  EXPECT_FALSE(tail.requires_grad());
  head.copy_(x);
  EXPECT_TRUE(tail.requires_grad());
  EXPECT_FALSE(tail.is_leaf());
  (base.sum() + tail.sum() * 10).backward();
  EXPECT_THAT(Values(x.grad()), ElementsAre(1, 11));
}

TEST(InPlaceTest, ViewsTakenWithGradModeOffKnowTheirBase) {
  Tensor x = Make({1, 2}).requires_grad_();
  Tensor base = zeros({3});
  Tensor head;
  {
    NoGradGuard no_grad;
    head = base.slice(0, 0, 2);
    head.add_(1);  // Not recorded: fine.
  }
  EXPECT_TRUE(head.is_view());
  EXPECT_TRUE(head._base().is_same(base));
  head.add_(1);  // Nothing requires grad: not recorded either.
  EXPECT_THAT(Values(base), ElementsAre(2, 2, 0));
  // Recording a write through it is ambiguous; torch refuses, before writing.
  EXPECT_THAT(ErrorOf([&] { head.copy_(x); }),
              HasSubstr("A view was created in no_grad mode and is being modified inplace with "
                        "grad mode enabled."));
  EXPECT_THAT(Values(base), ElementsAre(2, 2, 0));
  EXPECT_FALSE(base.requires_grad());
}

TEST(InPlaceTest, ViewOfLeafTakenWithGradModeOffIsStillRefused) {
  Tensor w = Make({1, 2, 3}).requires_grad_();
  Tensor v;
  {
    NoGradGuard no_grad;
    v = w.slice(0, 0, 2);
    v.mul_(2);  // An update under no_grad is allowed.
  }
  EXPECT_THAT(Values(w), ElementsAre(2, 4, 3));
  EXPECT_TRUE(v.requires_grad());  // Through its base, as torch.
  EXPECT_THAT(ErrorOf([&] { v.mul_(2); }), HasSubstr("modified inplace with grad mode enabled"));
  EXPECT_THAT(Values(w), ElementsAre(2, 4, 3));
}

}  // namespace
}  // namespace ember::autograd
