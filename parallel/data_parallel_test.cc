// DataParallel on CPU replicas (kCPU listed once per replica) against the
// plain module: same outputs and gradients, PyTorch's checks and messages.
#include "parallel/data_parallel.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "autograd/grad_mode.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/activation.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "nn/normalization.h"
#include "tensor/factories.h"
#include "tensor/testing.h"

namespace ember::parallel {
namespace {

using ::ember::testing::ErrorOf;
using ::testing::HasSubstr;
using ::testing::Optional;

// An MLP with a buffer, reading its batch from `batch_dim` (0: [N, 8]; 1:
// [8, N]) and writing its output the same way.
class Model : public nn::Cloneable<Model> {
 public:
  explicit Model(int64_t batch_dim) : batch_dim_(batch_dim) { reset(); }
  void reset() override {
    mlp = register_module("mlp",
                          std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
                              std::make_shared<nn::Linear>(8, 16), std::make_shared<nn::ReLU>(),
                              std::make_shared<nn::Linear>(16, 16), std::make_shared<nn::ReLU>(),
                              std::make_shared<nn::Linear>(16, 4)}));
    register_buffer("shift", arange(4, kFloat32) * 0.5);
  }
  Tensor forward(const Tensor& x) override {
    Tensor rows = batch_dim_ == 0 ? x : x.t();
    Tensor y = (*mlp)(rows) + buffer("shift");
    return batch_dim_ == 0 ? y : y.t();
  }
  std::shared_ptr<nn::Sequential> mlp;

 private:
  int64_t batch_dim_;
};

std::vector<Device> Cpus(int n) { return std::vector<Device>(n, kCPU); }

// Equal within 1e-6 of the larger of 1 and b's largest magnitude: float32
// sums over shares of the batch round differently from one sum.
void ExpectClose(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.sizes(), b.sizes()) << what;
  const float scale = std::max(1.0f, b.abs().max().item<float>());
  EXPECT_LE((a - b).abs().max().item<float>(), 1e-6f * scale) << what;
}

TEST(DataParallelTest, OutputsAndGradientsEqualThePlainModules) {
  for (int64_t dim : {0, 1}) {
    for (int replicas = 1; replicas <= 4; ++replicas) {
      SCOPED_TRACE("dim " + std::to_string(dim) + ", " + std::to_string(replicas) + " replicas");
      manual_seed(7);
      auto plain = std::make_shared<Model>(dim);
      auto wrapped = std::static_pointer_cast<Model>(plain->clone());
      DataParallel dp(wrapped, {.device_ids = Cpus(replicas), .dim = dim});
      Tensor x = dim == 0 ? randn({10, 8}) : randn({8, 10});  // 10 rows: uneven shares
      Tensor target = randn(dim == 0 ? SizeVector{10, 4} : SizeVector{4, 10});
      Tensor expected = (*plain)(x);
      Tensor got = dp(x);
      ExpectClose(got, expected, "output");
      ((expected - target) * (expected - target)).sum().backward();
      ((got - target) * (got - target)).sum().backward();
      std::vector<Tensor> pp = plain->parameters(), wp = wrapped->parameters();
      ASSERT_EQ(pp.size(), wp.size());
      for (size_t i = 0; i < pp.size(); ++i) {
        ASSERT_TRUE(wp[i].grad().defined()) << i;
        ExpectClose(wp[i].grad(), pp[i].grad(), "gradient " + std::to_string(i));
      }
    }
  }
}

TEST(DataParallelTest, NoGradForwardRecordsNothing) {
  auto model = std::make_shared<Model>(0);
  DataParallel dp(model, {.device_ids = Cpus(2)});
  autograd::NoGradGuard no_grad;
  Tensor y = dp(randn({4, 8}));
  EXPECT_FALSE(y.requires_grad());
  EXPECT_EQ(y.size(0), 4);
}

TEST(DataParallelTest, FirstReplicaUpdatesTheModulesBuffers) {
  manual_seed(3);
  auto bn = std::make_shared<nn::BatchNorm1d>(3);
  auto reference = std::static_pointer_cast<nn::BatchNorm1d>(bn->clone());
  DataParallel dp(bn, {.device_ids = Cpus(2)});
  Tensor x = randn({6, 3});
  dp(x);
  (*reference)(x.narrow(0, 0, 3));  // the first share only, as in PyTorch
  ExpectClose(bn->buffer("running_mean"), reference->buffer("running_mean"), "running_mean");
  ExpectClose(bn->buffer("running_var"), reference->buffer("running_var"), "running_var");
}

TEST(DataParallelTest, ForwardHooksRunOncePerReplica) {
  auto model = std::make_shared<Model>(0);
  std::atomic<int> calls = 0;
  model->register_forward_hook([&](nn::Module&, const Tensor&, const Tensor&) {
    ++calls;
    return std::optional<Tensor>();
  });
  DataParallel dp(model, {.device_ids = Cpus(3)});
  dp(randn({6, 8}));
  EXPECT_EQ(calls, 3);
  dp(randn({2, 8}));  // two rows: two replicas
  EXPECT_EQ(calls, 5);
}

TEST(DataParallelTest, FullBackwardHooksRunOncePerReplicaOnItsShare) {
  auto model = std::make_shared<Model>(0);
  std::mutex mu;
  std::vector<Tensor> grad_inputs;  // one per replica, in completion order
  model->register_full_backward_hook(
      [&](nn::Module&, const Tensor& grad_input, const Tensor& grad_output) {
        EXPECT_EQ(grad_input.size(0), grad_output.size(0));
        std::lock_guard<std::mutex> lock(mu);
        grad_inputs.push_back(grad_input.detach().clone());
        return std::optional<Tensor>();
      });
  DataParallel dp(model, {.device_ids = Cpus(3)});
  Tensor x = randn({7, 8}).requires_grad_();  // chunk gives the replicas 3, 3 and 1 rows
  dp(x).sum().backward();
  ASSERT_EQ(grad_inputs.size(), 3u);
  // The replicas' grad_inputs are the shares of the plain module's input
  // gradient: together they hold every row once.
  int64_t rows = 0;
  for (const Tensor& g : grad_inputs) rows += g.size(0);
  EXPECT_EQ(rows, 7);
  Tensor plain_x = x.detach().clone().requires_grad_();
  (*model)(plain_x).sum().backward();  // the hook runs a fourth time here
  ASSERT_EQ(grad_inputs.size(), 4u);
  ExpectClose(x.grad(), plain_x.grad(), "input gradient");
  // Each replica's grad_input is one share (rows 0-2, 3-5 or 6) of the plain
  // module's input gradient, and each share is met once.
  std::vector<int> met(3, 0);
  for (int r = 0; r < 3; ++r) {
    const Tensor& g = grad_inputs[r];
    for (int share = 0; share < 3; ++share) {
      const int64_t start = share * 3, length = share < 2 ? 3 : 1;
      if (g.size(0) == length && g.allclose(plain_x.grad().narrow(0, start, length), 1e-5, 1e-6)) {
        ++met[share];
      }
    }
  }
  EXPECT_THAT(met, ::testing::ElementsAre(1, 1, 1));
}

TEST(DataParallelTest, WithoutDevicesTheModuleRunsAsIs) {
  // No accelerator: device_ids left unset means none.
  if (device_count(DeviceType::kCUDA) > 0) {
    GTEST_SKIP() << "a CUDA device is usable here; this case is for a machine without one";
  }
  auto model = std::make_shared<Model>(0);
  DataParallel dp(model);
  EXPECT_TRUE(dp.device_ids().empty());
  Tensor x = randn({3, 8});
  EXPECT_TRUE(dp(x).equal((*model)(x)));
  EXPECT_EQ(dp.state_dict()[1].first, "module.mlp.0.weight");
}

TEST(DataParallelTest, ParametersOffDeviceIdsZeroGivePyTorchsError) {
  auto model = std::make_shared<Model>(0);
  DataParallel dp(model, {.device_ids = std::vector<Device>{Device(DeviceType::kCUDA, 0),
                                                            Device(DeviceType::kCUDA, 1)}});
  EXPECT_THAT(ErrorOf([&] {
                dp(randn({4, 8}));
              }),
              HasSubstr("module must have its parameters and buffers on device cuda:0 "
                        "(device_ids[0]) but found one of them on device: cpu"));
  EXPECT_THAT(ErrorOf([&] { DataParallel(model, {.device_ids = std::vector<Device>{}}); }),
              HasSubstr("device_ids is empty"));
  EXPECT_THAT(ErrorOf([&] {
                DataParallel(
                    model, {.device_ids = std::vector<Device>{kCPU, Device(DeviceType::kCUDA, 0)}});
              }),
              HasSubstr("device_ids mixes cpu and cuda:0"));
}

TEST(DataParallelTest, AFailingReplicaNamesItsDevice) {
  auto model = std::make_shared<nn::Linear>(8, 4);
  DataParallel dp(model, {.device_ids = Cpus(2), .dim = 1});  // splits the features
  EXPECT_THAT(ErrorOf([&] {
                dp(randn({2, 8}));
              }),
              HasSubstr("Caught ember::Error in replica 0 on device cpu.\nOriginal message: "));
}

TEST(DataParallelTest, DataParallelFunctionTakesArgumentsAndKeywords) {
  auto model = std::make_shared<nn::Linear>(8, 4);
  Tensor x = randn({6, 8}), scale = randn({6, 1});
  ReplicaForward forward = [](nn::Module& m, const Value::List& args, const Value::Dict& kwargs) {
    Tensor y = m(*args[0].get_if<Tensor>()) * *kwargs.at("scale").get_if<Tensor>();
    return Value(Value::Dict{{"y", Value(y)}, {"n", Value()}});
  };
  Value out = data_parallel(model, Value(Value::List{Value(x)}), Cpus(3), std::nullopt, 0,
                            {{"scale", Value(scale)}}, forward);
  ExpectClose(*out.find("y")->get_if<Tensor>(), (*model)(x)*scale, "y");
  EXPECT_TRUE(out.find("n")->is_none());
  if (device_count(DeviceType::kCUDA) == 0) {  // device_ids unset: every GPU, here none
    EXPECT_THAT(ErrorOf([&] { data_parallel(model, Value(x)); }),
                HasSubstr("no available devices were found"));
  }
}

TEST(DataParallelTest, ImbalanceRuleNamesBothDevices) {
  std::vector<Device> ids = {Device(DeviceType::kCUDA, 0), Device(DeviceType::kCUDA, 1),
                             Device(DeviceType::kCUDA, 2)};
  auto props = [](int64_t memory, int64_t sms) {
    return DeviceProperties{.name = "gpu", .total_memory = memory, .multi_processor_count = sms};
  };
  EXPECT_EQ(check_balance(ids, {props(80, 100), props(80, 100), props(60, 75)}), std::nullopt);
  EXPECT_THAT(check_balance(ids, {props(80, 100), props(59, 100), props(80, 100)}),
              Optional(HasSubstr("There is an imbalance between your GPUs. You may want to "
                                 "exclude GPU 1 which has less than 75% of the memory or cores "
                                 "of GPU 0.")));
  EXPECT_THAT(check_balance(ids, {props(80, 100), props(80, 100), props(80, 74)}),
              Optional(HasSubstr("exclude GPU 2 which has less than 75% of the memory or cores "
                                 "of GPU 0")));
}

}  // namespace
}  // namespace ember::parallel
