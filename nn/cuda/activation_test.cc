// The activations (relu, gelu, tanh, sigmoid: tensor ops with CUDA kernels
// and derivatives) and dropout on cuda:0. Activations: against the CPU,
// forward and backward, and gradcheck in float64 through the device.
// Dropout: the mask is drawn on the device by its Philox generator (the CPU
// generator is untouched), is reproducible for a seed, keeps about 1 - p of
// the elements scaled by 1 / (1 - p), and the gradient flows through the same
// mask. A Linear and its activation as one cuBLASLt GEMM (Note [Linear and
// its activation]), alone and inside a Sequential. Without a device the GPU
// cases skip, saying why; the case about a generator of the wrong device
// type runs everywhere.
#include "nn/activation.h"

#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/cuda/layer_testing.h"
#include "nn/container.h"
#include "nn/dropout.h"
#include "nn/linear.h"
#include "tensor/error.h"
#include "tensor/factories.h"
#include "third_party/cuda/device_check.h"

namespace ember::nn {
namespace {

using testing::ExpectGradcheckOnDevice;
using testing::ExpectMatchesCpu;
using ::testing::HasSubstr;
using testing::HostValues;
using testing::kGpu;

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Activations() {
  return {{"ReLU", std::make_shared<ReLU>()},
          {"GELU", std::make_shared<GELU>()},
          {"Tanh", std::make_shared<Tanh>()},
          {"Sigmoid", std::make_shared<Sigmoid>()}};
}

TEST(ActivationCudaTest, MatchTheCpuForwardAndBackward) {
  EMBER_SKIP_WITHOUT_CUDA();
  for (Dtype dtype : {kFloat32, kFloat64}) {
    // Non-contiguous too (a transposed view): relu's CPU fast path does not
    // apply there, nor on the device.
    Tensor x = randn({9, 7}, TensorOptions(dtype)) * 3.0;
    for (auto& [name, act] : Activations()) {
      ExpectMatchesCpu([&](const std::vector<Tensor>& in) { return act->forward(in[0]); }, {x},
                       {true}, name + " " + std::string(dtype_name(dtype)));
      ExpectMatchesCpu([&](const std::vector<Tensor>& in) { return act->forward(in[0].t()); }, {x},
                       {true}, name + " transposed " + std::string(dtype_name(dtype)));
    }
  }
}

TEST(ActivationCudaTest, GradcheckOnTheDeviceInFloat64) {
  EMBER_SKIP_WITHOUT_CUDA();
  // Away from relu's kink at 0.
  Tensor x = tensor({-2.0, -0.7, 0.3, 1.1, 2.5, -0.2}, TensorOptions(kFloat64)).view({2, 3});
  for (auto& [name, act] : Activations()) {
    SCOPED_TRACE(name);
    ExpectGradcheckOnDevice([&](const std::vector<Tensor>& in) { return act->forward(in[0]); },
                            {x});
  }
}

// Note [Linear and its activation]: on cuda:0 a Linear and its ReLU or
// GELU("tanh") run as one cuBLASLt GEMM with the activation in its epilogue;
// values and gradients equal the CPU's two calls.
TEST(LinearActivationCudaTest, TheFusedEpiloguesMatchTheCpu) {
  EXPECT_TRUE(functional::fuses_linear_activation(kGpu));
  EMBER_SKIP_WITHOUT_CUDA();
  for (auto act : {functional::LinearActivation::kReLU, functional::LinearActivation::kGeluTanh}) {
    for (Dtype dtype : {kFloat32, kBFloat16}) {
      const bool relu = act == functional::LinearActivation::kReLU;
      ExpectMatchesCpu(
          [act](const std::vector<Tensor>& in) {
            return functional::linear_activation(in[0], in[1], in[2], act);
          },
          {randn({64, 48}).to(dtype), randn({40, 48}).to(dtype), randn({40}).to(dtype)},
          {true, true, true},
          std::string(relu ? "relu " : "gelu tanh ") + std::string(dtype_name(dtype)),
          dtype == kFloat32 ? 1e-4 : 3e-2);
    }
  }
}

// A Sequential of Linear / ReLU / Linear / GELU("tanh") / Linear fuses both
// pairs on cuda:0 (Note [Sequential fuses a Linear and its activation]) and
// gives the CPU's outputs and gradients; a hooked Linear runs unfused.
TEST(LinearActivationCudaTest, ASequentialFusesItsPairsOnTheDevice) {
  EMBER_SKIP_WITHOUT_CUDA();
  manual_seed(5);
  auto make = [] {
    auto net = std::make_shared<Sequential>();
    net->push_back(std::make_shared<Linear>(32, 64));
    net->push_back(std::make_shared<ReLU>());
    net->push_back(std::make_shared<Linear>(64, 48));
    net->push_back(std::make_shared<GELU>("tanh"));
    net->push_back(std::make_shared<Linear>(48, 8));
    return net;
  };
  std::shared_ptr<Sequential> cpu = make();
  for (bool hooked : {false, true}) {
    SCOPED_TRACE(hooked ? "a hook on the first Linear" : "fused");
    std::shared_ptr<Module> gpu = cpu->clone(kGpu);
    int calls = 0;
    if (hooked) {
      (*std::static_pointer_cast<Sequential>(gpu))[0]->register_forward_hook(
          [&calls](Module&, const Tensor&, const Tensor&) -> std::optional<Tensor> {
            ++calls;
            return std::nullopt;
          });
    }
    Tensor x = randn({16, 32});
    Tensor want = (*cpu)(x);
    Tensor got = (*gpu)(x.to(kGpu));
    testing::ExpectClose(got, want, 1e-4, "output");
    EXPECT_EQ(calls, hooked ? 1 : 0);
    want.sum().backward();
    got.sum().backward();
    const std::vector<Tensor> cpu_params = cpu->parameters(), gpu_params = gpu->parameters();
    for (size_t i = 0; i < cpu_params.size(); ++i) {
      testing::ExpectClose(gpu_params[i].grad(), cpu_params[i].grad(), 1e-4,
                           "gradient " + std::to_string(i));
    }
    cpu->zero_grad();
  }
}

TEST(DropoutCudaTest, TheMaskIsDrawnOnTheDeviceNeverOnTheHost) {
  EMBER_SKIP_WITHOUT_CUDA();
  Tensor cpu_state = default_generator().get_state();
  Generator& gpu_gen = default_generator(kGpu);
  const uint64_t offset = gpu_gen.offset();
  Tensor x = ones({1 << 16}).to(kGpu);
  Tensor y = functional::dropout(x, 0.25, /*training=*/true);
  EXPECT_TRUE(y.is_cuda());
  EXPECT_GT(gpu_gen.offset(), offset) << "the device generator did not move";
  EXPECT_EQ(HostValues(default_generator().get_state()), HostValues(cpu_state))
      << "dropout of a CUDA tensor drew from the CPU generator";
  // Each element 0 or 1 / (1 - p); about 1 - p of them kept.
  int64_t kept = 0;
  for (double v : HostValues(y)) {
    ASSERT_TRUE(v == 0.0 || std::abs(v - 1 / 0.75) < 1e-6) << v;
    kept += v != 0.0;
  }
  const double fraction = static_cast<double>(kept) / (1 << 16);
  EXPECT_NEAR(fraction, 0.75, 0.02);
}

TEST(DropoutCudaTest, ReproducibleForASeedAndTheGradientUsesTheSameMask) {
  EMBER_SKIP_WITHOUT_CUDA();
  Tensor x = randn({64, 33}).to(kGpu);
  manual_seed(1234);
  Tensor a = functional::dropout(x, 0.5, true);
  manual_seed(1234);
  Tensor leaf = x.detach().requires_grad_(true);
  Tensor b = functional::dropout(leaf, 0.5, true);
  EXPECT_EQ(HostValues(a), HostValues(b));
  b.sum().backward();
  // d(sum)/dx is the mask scaled by 2: 2 where kept, 0 where dropped.
  const std::vector<double> out = HostValues(b), in = HostValues(x), g = HostValues(leaf.grad());
  for (size_t i = 0; i < g.size(); ++i) {
    const bool dropped = out[i] == 0.0 && in[i] != 0.0;
    EXPECT_EQ(g[i], dropped ? 0.0 : 2.0) << "element " << i;
  }
  // The module in eval mode is the identity on the device.
  Dropout drop(0.5);
  drop.eval();
  EXPECT_EQ(HostValues(drop.forward(x)), HostValues(x));
}

// Runs everywhere: a CPU input's mask cannot come from a CUDA generator.
TEST(DropoutCudaTest, AGeneratorOfAnotherDeviceTypeIsRefused) {
  Generator cuda_gen(7, kGpu);
  try {
    functional::dropout(ones({4}), 0.5, true, &cuda_gen);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("expected a 'cpu' device type for generator but found 'cuda'"));
  }
}

TEST(DropoutCudaTest, ACpuGeneratorForACudaInputIsRefused) {
  EMBER_SKIP_WITHOUT_CUDA();
  Generator cpu_gen(7);
  try {
    functional::dropout(ones({4}).to(kGpu), 0.5, true, &cpu_gen);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("expected a 'cuda' device type for generator but found 'cpu'"));
  }
}

}  // namespace
}  // namespace ember::nn
