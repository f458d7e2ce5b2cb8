// A whole training step captured into a CUDA graph on cuda:0 and replayed
// (Note [Capturing a graph] in cuda/graphs.h, Note [Capturable steps] in
// nn/optim/fused_kernels.h): zero_grad, forward, cross-entropy, backward and
// a capturable Adam step with a StepLR schedule between replays give the
// parameters of the same steps run eagerly, bit for bit (the same kernels in
// the same order). Without a device it skips, saying why.
#include <memory>
#include <vector>

#include "cuda/graphs.h"
#include "gtest/gtest.h"
#include "nn/activation.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "nn/loss.h"
#include "nn/optim/adam.h"
#include "nn/optim/lr_scheduler.h"
#include "tensor/factories.h"
#include "third_party/cuda/device_check.h"

namespace ember::nn {
namespace {

const Device kGpu(DeviceType::kCUDA, 0);

std::shared_ptr<Sequential> Mlp() {
  manual_seed(5);
  auto m = std::make_shared<Sequential>();
  m->push_back(std::make_shared<Linear>(32, 64));
  m->push_back(std::make_shared<ReLU>());
  m->push_back(std::make_shared<Linear>(64, 10));
  m->to(kGpu);
  return m;
}

TEST(GraphedStepTest, ReplayedStepsEqualEagerSteps) {
  EMBER_SKIP_WITHOUT_CUDA();
  constexpr int kWarmup = 2, kSteps = 6;
  manual_seed(9);
  std::vector<Tensor> xs, ys;
  for (int s = 0; s < kWarmup + kSteps; ++s) {
    xs.push_back(randn({16, 32}).to(kGpu));
    ys.push_back(randint(0, 10, {16}).to(kGpu));
  }
  auto eager = Mlp();
  optim::Adam eager_opt(eager->parameters(), {.lr = 0.01, .capturable = true});
  optim::StepLR eager_schedule(eager_opt, 2, 0.5);
  auto graphed = Mlp();
  optim::Adam opt(graphed->parameters(), {.lr = 0.01, .capturable = true});
  optim::StepLR schedule(opt, 2, 0.5);
  auto step = [](Sequential& m, optim::Adam& o, const Tensor& x, const Tensor& y) {
    o.zero_grad();
    functional::cross_entropy(m.forward(x), y).backward();
    o.step();
  };
  Tensor static_x = xs[0].clone(), static_y = ys[0].clone();
  for (int s = 0; s < kWarmup; ++s) {  // makes the optimizer's state before the capture
    step(*eager, eager_opt, xs[s], ys[s]);
    step(*graphed, opt, xs[s], ys[s]);
  }
  cuda::CUDAGraph g;
  {
    cuda::graph capture(g);
    step(*graphed, opt, static_x, static_y);
  }
  ASSERT_TRUE(cuda::capture_status_of(g).ok()) << cuda::capture_status_of(g);
  for (int s = kWarmup; s < kWarmup + kSteps; ++s) {
    static_x.copy_(xs[s]);
    static_y.copy_(ys[s]);
    ASSERT_TRUE(g.replay().ok());
    schedule.step();
    step(*eager, eager_opt, xs[s], ys[s]);
    eager_schedule.step();
  }
  const auto a = graphed->parameters(), b = eager->parameters();
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(a[i].detach().cpu().equal(b[i].detach().cpu())) << i;
  }
}

}  // namespace
}  // namespace ember::nn
