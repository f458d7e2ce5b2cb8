// CUDA kernels of uniform_out, normal_out, random_out and bernoulli_out: the
// numbers are drawn on the tensor's device from its Philox generator (Note
// [Random numbers] in tensor/factories.h), asynchronously on the current
// stream; nothing is drawn on the host.
#include "cuda/random_kernels.h"

#include "cuda/graphs.h"
#include "cuda/kernels.h"
#include "tensor/device_guard.h"
#include "tensor/factories.h"

namespace ember::cuda {
namespace {

// Fills `out` (any layout) with `p`'s distribution: contiguous memory is
// written in place, anything else through a contiguous buffer on the same
// device, then copied. The generator's offset moves on by one launch's.
void Draw(const Tensor& out, Generator* gen, const kernels::RandomParams& p, const char* op) {
  if (out.numel() == 0) return;
  EMBER_CHECK(
      gen != nullptr && gen->device().is_cuda(), op,
      ": expected a 'cuda' device type for generator but found '",
      gen == nullptr ? std::string("none") : std::string(DeviceTypeName(gen->device().type())),
      "'");
  DeviceGuard guard(out.device());
  const Tensor dense =
      out.is_contiguous() ? out : EmptyTensor(out.sizes(), out.dtype(), out.device());
  const cudaStream_t stream = internal::StreamOf(out.device());
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  unsigned long long capture_id = 0;
  if (cudaStreamGetCaptureInfo(stream, &capture, &capture_id) == cudaSuccess &&
      capture == cudaStreamCaptureStatusActive) {
    const internal::CapturedPhilox in =
        internal::CapturedDraw(capture_id, gen, kernels::kOffsetIncrement);
    internal::CheckLaunch(kernels::LaunchRandom(stream, internal::Ptr(dense),
                                                internal::DtypeCode(dense.dtype()), dense.numel(),
                                                0, in.offset, p, in.state),
                          op);
  } else {
    const Generator::PhiloxInputs in = gen->philox_engine_inputs(kernels::kOffsetIncrement);
    internal::CheckLaunch(
        kernels::LaunchRandom(stream, internal::Ptr(dense), internal::DtypeCode(dense.dtype()),
                              dense.numel(), in.seed, in.offset, p),
        op);
  }
  if (!dense.is_same(out)) ops::copy_out(out, dense);
}

void UniformOut(const Tensor& out, double from, double to, Generator* gen) {
  kernels::RandomParams p;
  p.distribution = kernels::kUniformDistribution;
  p.a = from;
  p.b = to;
  Draw(out, gen, p, "uniform_ kernel");
}

void NormalOut(const Tensor& out, double mean, double std, Generator* gen) {
  kernels::RandomParams p;
  p.distribution = kernels::kNormalDistribution;
  p.a = mean;
  p.b = std;
  Draw(out, gen, p, "normal_ kernel");
}

void RandomOut(const Tensor& out, int64_t low, int64_t high, Generator* gen) {
  kernels::RandomParams p;
  p.distribution = kernels::kIntegerDistribution;
  p.low = low;
  p.range = static_cast<uint64_t>(high) - static_cast<uint64_t>(low);
  Draw(out, gen, p, "random_ kernel");
}

void BernoulliOut(const Tensor& out, double prob, Generator* gen) {
  kernels::RandomParams p;
  p.distribution = kernels::kBernoulliDistribution;
  p.a = prob;
  Draw(out, gen, p, "bernoulli_ kernel");
}

EMBER_REGISTER_KERNEL(uniform_out, kCUDA, &UniformOut);
EMBER_REGISTER_KERNEL(normal_out, kCUDA, &NormalOut);
EMBER_REGISTER_KERNEL(random_out, kCUDA, &RandomOut);
EMBER_REGISTER_KERNEL(bernoulli_out, kCUDA, &BernoulliOut);

}  // namespace
}  // namespace ember::cuda
