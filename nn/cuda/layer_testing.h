// Test helpers for nn's layers on CUDA (testonly): run a layer on cuda:0 and
// on the CPU from the same inputs and output gradient and compare the
// outputs and every input's gradient; check gradients through the device in
// float64.
//
//   EMBER_SKIP_WITHOUT_CUDA();
//   ExpectMatchesCpu([](const std::vector<Tensor>& in) { return in[0].tanh(); },
//                    {randn({4, 5})}, {true}, "tanh");
//   ExpectGradcheckOnDevice([](const std::vector<Tensor>& in) { return in[0].tanh(); },
//                           {randn({3, 4}, TensorOptions(kFloat64))});
//
// ExpectGradcheckOnDevice runs autograd's checker (autograd/gradcheck.h) on
// float64 CPU leaves whose function copies them to cuda:0, runs `fn` there
// and copies the result back: the perturbations happen on the host, every
// derivative of `fn` runs on the device (the copies' derivatives are copies).
#ifndef EMBER_NN_CUDA_LAYER_TESTING_H_
#define EMBER_NN_CUDA_LAYER_TESTING_H_

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "autograd/gradcheck.h"
#include "gtest/gtest.h"
#include "tensor/factories.h"
#include "tensor/tensor.h"

namespace ember::nn::testing {

inline const Device kGpu(DeviceType::kCUDA, 0);

using LayerFn = std::function<Tensor(const std::vector<Tensor>&)>;

// The elements of a tensor (any device) in row-major order, as doubles; an
// undefined tensor (a gradient that never arrived) fails the test.
inline std::vector<double> HostValues(const Tensor& t) {
  if (!t.defined()) {
    ADD_FAILURE() << "expected a defined tensor";
    return {};
  }
  Tensor c = t.detach().to(kCPU).to(kFloat64).contiguous();
  const double* p = c.data_ptr<double>();
  return std::vector<double>(p, p + c.numel());
}

// `gpu` (on cuda:0) equals `cpu` in shape and dtype, and in value within
// rtol * (1 + |cpu|); NaN must match NaN.
inline void ExpectClose(const Tensor& gpu, const Tensor& cpu, double rtol,
                        const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(gpu.defined(), cpu.defined());
  if (!cpu.defined()) return;
  EXPECT_TRUE(gpu.is_cuda()) << "on " << gpu.device().str();
  ASSERT_EQ(gpu.sizes(), cpu.sizes());
  ASSERT_EQ(gpu.dtype(), cpu.dtype());
  const std::vector<double> g = HostValues(gpu), c = HostValues(cpu);
  for (size_t i = 0; i < c.size(); ++i) {
    if (std::isnan(c[i])) {
      EXPECT_TRUE(std::isnan(g[i])) << "element " << i;
    } else {
      EXPECT_NEAR(g[i], c[i], rtol * (1 + std::abs(c[i]))) << "element " << i;
    }
  }
}

// The default tolerance of a device result against the CPU's.
inline double RtolOf(Dtype dtype) { return dtype == kFloat64 ? 1e-10 : 1e-5; }

// Runs fn on cuda:0 and on the CPU from copies of `inputs` (CPU tensors);
// inputs with `differentiable[i]` are leaves that require grad. Backward
// from the same random output gradient; compares the outputs and the
// gradients.
inline void ExpectMatchesCpu(const LayerFn& fn, const std::vector<Tensor>& inputs,
                             const std::vector<bool>& differentiable, const std::string& what,
                             double rtol = 0) {
  SCOPED_TRACE(what);
  ASSERT_EQ(inputs.size(), differentiable.size());
  auto leaves = [&](Device device) {
    std::vector<Tensor> out;
    for (size_t i = 0; i < inputs.size(); ++i) {
      Tensor t = inputs[i].defined() ? inputs[i].detach().to(device) : Tensor();
      if (t.defined() && differentiable[i]) t.requires_grad_(true);
      out.push_back(t);
    }
    return out;
  };
  std::vector<Tensor> on_cpu = leaves(kCPU), on_gpu = leaves(kGpu);
  Tensor out_cpu = fn(on_cpu), out_gpu = fn(on_gpu);
  const double tol = rtol > 0 ? rtol : RtolOf(out_cpu.dtype());
  ExpectClose(out_gpu, out_cpu, tol, "output");
  if (!out_cpu.requires_grad()) return;
  Tensor seed = randn(out_cpu.sizes(), TensorOptions(out_cpu.dtype()));
  out_cpu.backward(seed);
  out_gpu.backward(seed.to(kGpu));
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!differentiable[i] || !inputs[i].defined()) continue;
    ExpectClose(on_gpu[i].grad(), on_cpu[i].grad(), tol, "gradient of input " + std::to_string(i));
  }
}

// Runs fn on cuda:0 in `dtype` (float16 or bfloat16) and on the CPU in
// float32 from the same values: `inputs` (float32 CPU tensors) and the
// output gradient are first rounded to `dtype`, so the two sides differ only
// by the device's roundings. Compares the output and every differentiable
// input's gradient as float32 within rtol * (1 + |cpu|), and checks that
// they come back in `dtype`.
inline void ExpectLowPrecisionMatchesCpu(const LayerFn& fn, const std::vector<Tensor>& inputs,
                                         const std::vector<bool>& differentiable, Dtype dtype,
                                         double rtol, const std::string& what) {
  SCOPED_TRACE(std::string(dtype_name(dtype)) + " " + what);
  ASSERT_EQ(inputs.size(), differentiable.size());
  std::vector<Tensor> on_cpu, on_gpu;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined()) {
      on_cpu.emplace_back();
      on_gpu.emplace_back();
      continue;
    }
    Tensor rounded = inputs[i].detach().to(dtype);
    on_cpu.push_back(rounded.to(kFloat32));
    on_gpu.push_back(rounded.to(kGpu));
    if (differentiable[i]) {
      on_cpu.back().requires_grad_(true);
      on_gpu.back().requires_grad_(true);
    }
  }
  Tensor out_cpu = fn(on_cpu), out_gpu = fn(on_gpu);
  EXPECT_EQ(out_gpu.dtype(), dtype) << "output";
  ExpectClose(out_gpu.to(kFloat32), out_cpu, rtol, "output");
  Tensor seed = randn(out_cpu.sizes()).to(dtype);
  out_cpu.backward(seed.to(kFloat32));
  out_gpu.backward(seed.to(kGpu));
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!differentiable[i] || !inputs[i].defined()) continue;
    const std::string which = "gradient of input " + std::to_string(i);
    ASSERT_TRUE(on_gpu[i].grad().defined()) << which;
    EXPECT_EQ(on_gpu[i].grad().dtype(), dtype) << which;
    ExpectClose(on_gpu[i].grad().to(kFloat32), on_cpu[i].grad(), rtol, which);
  }
}

// gradcheck of fn on cuda:0 in float64 (inputs: float64 CPU tensors).
inline void ExpectGradcheckOnDevice(const LayerFn& fn, std::vector<Tensor> inputs) {
  for (Tensor& t : inputs) {
    t = t.detach().clone();
    t.requires_grad_(true);
  }
  absl::Status s = autograd::gradcheck(
      [&](const std::vector<Tensor>& in) {
        std::vector<Tensor> on_gpu;
        for (const Tensor& t : in) on_gpu.push_back(t.to(kGpu));
        Tensor out = fn(on_gpu);
        EXPECT_TRUE(out.is_cuda()) << "the layer's output is on " << out.device().str();
        return std::vector<Tensor>{out.to(kCPU)};
      },
      inputs);
  EXPECT_TRUE(s.ok()) << "gradient check on " << kGpu.str() << " failed: " << s;
}

}  // namespace ember::nn::testing

#endif  // EMBER_NN_CUDA_LAYER_TESTING_H_
