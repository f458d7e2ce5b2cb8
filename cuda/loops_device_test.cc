// The elementwise kernels' paths (Note [CUDA loops] in loops.cuh) against the
// CPU, exactly: the vector path with and without a tail, fixed (stride 0)
// operands, rows, misaligned views that fall back to the scalar path,
// in-place ops, and tensors large enough that each thread takes several
// chunks. The ops chosen are exact in every dtype used (no rounding
// differences between devices). Without a device only the CPU halves run and
// each case reports itself skipped, saying why.
#include <cuda_runtime_api.h>

#include <functional>
#include <string>
#include <vector>

#include "cuda/device.h"
#include "gtest/gtest.h"
#include "tensor/factories.h"
#include "tensor/ops.h"
#include "tensor/testing.h"
#include "third_party/cuda/device_check.h"

namespace ember {
namespace {

using ::ember::testing::ErrorOf;
using ::ember::testing::Make;

const Device kGpu(DeviceType::kCUDA, 0);

// n values of `dtype`: negatives, zero and positives (multiples of 1/4 for
// floats, so that sums and negations are exact), never NaN.
Tensor Sample(int64_t n, Dtype dtype, int seed) {
  std::vector<double> v(n);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t k = (i * 7 + seed * 13) % 11 - 5;  // -5 .. 5
    if (dtype == kBool) {
      v[i] = k > 0;
    } else if (is_floating_point(dtype)) {
      v[i] = k * 0.25;
    } else {
      v[i] = k;
    }
  }
  return Make(v, {n}, dtype);
}

// Why the GPU halves skip ("" with a device).
const std::string& NoDevice() {
  static const std::string reason = ::ember::testing::CudaUnavailableReason();
  return reason;
}

// f on CPU tensors and on their CUDA copies: equal results (shape, dtype,
// every value). Without a device, only the CPU half runs (the case must be
// valid there).
void ExpectSame(const std::vector<Tensor>& cpu_inputs,
                const std::function<Tensor(const std::vector<Tensor>&)>& f,
                const std::string& what) {
  SCOPED_TRACE(what);
  Tensor cpu;
  ASSERT_EQ(ErrorOf([&] { cpu = f(cpu_inputs); }), "no error");
  if (!NoDevice().empty()) return;
  std::vector<Tensor> gpu_inputs;
  for (const Tensor& t : cpu_inputs) gpu_inputs.push_back(t.to(kGpu));
  const Tensor gpu = f(gpu_inputs);
  ASSERT_TRUE(gpu.is_cuda());
  const Tensor back = gpu.to(kCPU);
  ASSERT_EQ(back.sizes(), cpu.sizes());
  ASSERT_EQ(back.dtype(), cpu.dtype());
  EXPECT_TRUE(back.equal(cpu));
}

constexpr Dtype kDtypes[] = {kFloat32, kBFloat16, kFloat64, kInt8, kBool};

// Lengths around every chunk size (16 bytes: 2 to 16 elements), with and
// without a tail, and views starting 0 to 3 elements into a buffer (the
// vector path needs 16-byte alignment; the others take the scalar path).
TEST(LoopsDeviceTest, OneDimAroundChunkSizesAndAlignments) {
  for (Dtype d : kDtypes) {
    for (int64_t n : {1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 33, 100, 1027}) {
      for (int64_t start : {0, 1, 2, 3}) {
        const std::string what = std::string(dtype_name(d)) + " n=" + std::to_string(n) +
                                 " start=" + std::to_string(start);
        const Tensor x = Sample(n + 3, d, 1), y = Sample(n + 3, d, 2);
        const Tensor c = Sample(n + 3, kBool, 3);
        auto view = [n, start](const Tensor& t) { return t.narrow(0, start, n); };
        ExpectSame({x}, [&](const auto& in) { return view(in[0]).clone(); }, "copy " + what);
        ExpectSame(
            {c, x},
            [&](const auto& in) {
              return where(view(in[0]), view(in[1]), zeros({}, in[1].options()));
            },
            "where(c, x, 0) " + what);
        if (d == kBool) continue;
        ExpectSame(
            {x, y}, [&](const auto& in) { return view(in[0]).maximum(in[1].narrow(0, 0, n)); },
            "maximum " + what);
        ExpectSame({x}, [&](const auto& in) { return view(in[0]).ne(0); }, "ne 0 " + what);
        ExpectSame({x}, [&](const auto& in) { return view(in[0]).neg(); }, "neg " + what);
        ExpectSame({x}, [&](const auto& in) { return view(in[0]).relu(); }, "relu " + what);
        ExpectSame({x, y}, [&](const auto& in) { return view(in[0]).add(in[1].narrow(0, 3 - start, n)); },
                   "add " + what);
        ExpectSame({x}, [&](const auto& in) { return view(in[0]).clamp(Scalar(-1), Scalar(1)); },
                   "clamp " + what);
        ExpectSame({x}, [&](const auto& in) { return full_like(view(in[0]), 3); }, "fill " + what);
        ExpectSame(
            {x},
            [&](const auto& in) {
              const Tensor t = in[0].clone();
              view(t).fill_(3);
              return t;
            },
            "fill a view " + what);
      }
    }
  }
  if (!NoDevice().empty()) GTEST_SKIP() << "the CPU half ran; " << NoDevice();
}

// In place: the output is an input (every input of a chunk is read before
// its output is written).
TEST(LoopsDeviceTest, InPlaceOpsReadTheOldValues) {
  for (Dtype d : {kFloat32, kBFloat16, kInt8}) {
    for (int64_t n : {17, 4096 + 5}) {
      const std::string what = std::string(dtype_name(d)) + " n=" + std::to_string(n);
      const Tensor x = Sample(n, d, 1), y = Sample(n, d, 2);
      ExpectSame({x}, [](const auto& in) { return in[0].clone().relu_(); }, "relu_ " + what);
      ExpectSame({x, y}, [](const auto& in) { return in[0].clone().add_(in[1]); }, "add_ " + what);
      ExpectSame({x}, [](const auto& in) {
        const Tensor t = in[0].clone();
        return t.add_(t);
      }, "x.add_(x) " + what);
    }
  }
  if (!NoDevice().empty()) GTEST_SKIP() << "the CPU half ran; " << NoDevice();
}

// Two dims whose rows the chunks tile: a bias expanded over rows (copied and
// added), a value per channel of [N, C, H, W] (innermost stride 0), and rows
// no multiple of the chunk (the scalar path).
TEST(LoopsDeviceTest, RowsWithBroadcastOperands) {
  for (Dtype d : {kFloat32, kBFloat16, kFloat64, kInt8}) {
    for (int64_t cols : {16, 24, 12, 49}) {
      const std::string what = std::string(dtype_name(d)) + " cols=" + std::to_string(cols);
      const Tensor bias = Sample(cols, d, 1), x = Sample(37 * cols, d, 2);
      ExpectSame({bias}, [cols](const auto& in) { return in[0].expand({37, cols}).contiguous(); },
                 "expanded copy " + what);
      ExpectSame({x, bias}, [cols](const auto& in) { return in[0].view({37, cols}).add(in[1]); },
                 "bias add " + what);
      const Tensor per_channel = Sample(3, d, 3), image = Sample(2 * 3 * cols, d, 4);
      ExpectSame({image, per_channel},
                 [cols](const auto& in) {
                   return in[0].view({2, 3, cols}).mul(in[1].view({3, 1}));
                 },
                 "per channel " + what);
    }
  }
  if (!NoDevice().empty()) GTEST_SKIP() << "the CPU half ran; " << NoDevice();
}

// More chunks than the grid has threads (GridFor's cap): each thread loops.
TEST(LoopsDeviceTest, LargeTensorsLoopOverTheGrid) {
  const int64_t n = (int64_t{1} << 23) + 5;
  for (Dtype d : {kFloat32, kBFloat16}) {
    const std::string what(dtype_name(d));
    const Tensor x = Sample(n, d, 1), g = Sample(n, d, 2);
    ExpectSame({x}, [](const auto& in) { return in[0].relu(); }, "relu " + what);
    ExpectSame({x, g}, [](const auto& in) {
      return where(in[0].gt(0), in[1], zeros({}, in[1].options()));
    }, "relu backward " + what);
    const Tensor bias = Sample(1024, d, 3);
    ExpectSame({bias}, [](const auto& in) { return in[0].expand({4096, 1024}).contiguous(); },
               "expanded copy " + what);
  }
  if (!NoDevice().empty()) GTEST_SKIP() << "the CPU half ran; " << NoDevice();
}

}  // namespace
}  // namespace ember
