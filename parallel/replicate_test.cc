#include "parallel/replicate.h"

#include <memory>
#include <vector>

#include "autograd/grad_mode.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "nn/normalization.h"
#include "tensor/factories.h"

namespace ember::parallel {
namespace {

std::shared_ptr<nn::Sequential> Model() {
  return std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(4, 3), std::make_shared<nn::BatchNorm1d>(3)});
}

TEST(ReplicateTest, FirstReplicaSharesStorageAndOthersOwnCopies) {
  auto model = Model();
  auto replicas = replicate(model, std::vector<Device>(3, kCPU));
  ASSERT_EQ(replicas.size(), 3u);
  std::vector<Tensor> params = model->parameters(), buffers = model->buffers();
  for (size_t d = 0; d < 3; ++d) {
    std::vector<Tensor> rp = replicas[d]->parameters(), rb = replicas[d]->buffers();
    ASSERT_EQ(rp.size(), params.size());
    ASSERT_EQ(rb.size(), buffers.size());
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_FALSE(rp[i].is_leaf());
      EXPECT_EQ(rp[i].grad_fn()->name(), "BroadcastBackward");
      EXPECT_TRUE(rp[i].equal(params[i]));
      EXPECT_EQ(rp[i].raw_data() == params[i].raw_data(), d == 0) << d << " " << i;
    }
    for (size_t i = 0; i < buffers.size(); ++i) {
      EXPECT_EQ(rb[i].raw_data() == buffers[i].raw_data(), d == 0) << d << " " << i;
    }
  }
  EXPECT_NE(replicas[0].get(), model.get());
  EXPECT_TRUE(replicate(model, {}).empty());
}

TEST(ReplicateTest, GradientsOfEveryReplicaAreSummedIntoTheOriginal) {
  auto model = std::make_shared<nn::Linear>(4, 2);
  std::vector<Tensor> xs = {randn({3, 4}), randn({5, 4})};
  auto replicas = replicate(model, std::vector<Device>(2, kCPU));
  ((*replicas[0])(xs[0]).sum() + (*replicas[1])(xs[1]).sum()).backward();
  Tensor replicated_grad = model->weight().grad().clone();
  model->zero_grad();
  (*model)(cat(xs, 0)).sum().backward();
  EXPECT_TRUE(replicated_grad.allclose(model->weight().grad(), 1e-6, 1e-6));
}

TEST(ReplicateTest, DetachRecordsNothing) {
  auto model = Model();
  auto replicas = replicate(model, std::vector<Device>(2, kCPU), /*detach=*/true);
  for (const Tensor& p : replicas[1]->parameters()) {
    EXPECT_FALSE(p.requires_grad());
    EXPECT_EQ(p.grad_fn(), nullptr);
  }
}

}  // namespace
}  // namespace ember::parallel
