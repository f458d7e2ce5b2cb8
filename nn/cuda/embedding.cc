// embedding's CUDA backward (nn/embedding_kernels.h): the host side of
// embedding_kernels.cu (a stable sort of the indices, then sums per index
// in a fixed order: deterministic), registered as the kCUDA kernel of
// embedding's slot when the library is loaded. Asynchronous on the current
// stream of the gradient's device. float16 and bfloat16 gradients go through
// float32 (Note [float16 and bfloat16 through float32] in low_precision.h).
#include "cuda/kernels.h"
#include "nn/cuda/embedding_launch.h"
#include "nn/cuda/low_precision.h"
#include "nn/embedding_kernels.h"
#include "nn/kernel_util.h"
#include "tensor/device_guard.h"
#include "tensor/factories.h"

namespace ember::nn::cuda_kernels {
namespace {

Tensor EmbeddingBackwardCuda(const Tensor& g, const Tensor& indices, int64_t num_weights,
                             int64_t padding_idx) {
  if (IsLowPrecision(g)) {
    return EmbeddingBackwardCuda(ToFloat(g), indices, num_weights, padding_idx).to(g.dtype());
  }
  DeviceGuard guard(g.device());
  const int64_t d = g.size(1);
  const int64_t n = indices.numel();
  Tensor gw = zeros({num_weights, d}, g.options());
  // The sort's workspace, from the caching allocator (stream-ordered).
  Tensor workspace =
      empty({static_cast<int64_t>(EmbeddingBackwardWorkspaceBytes(n, d, num_weights))},
            TensorOptions(kUInt8).device(g.device()));
  internal::VisitNnDtype(g.dtype(), "embedding backward", [&]<typename T>() {
    ::ember::cuda::internal::CheckLaunch(
        LaunchEmbeddingBackward<T>(::ember::cuda::internal::StreamOf(g.device()), g.data_ptr<T>(),
                                   indices.data_ptr<int64_t>(), gw.data_ptr<T>(), n, d, num_weights,
                                   padding_idx, workspace.raw_data()),
        "embedding backward kernels");
  });
  return gw;
}

EMBER_REGISTER_NN_KERNEL(internal::embedding_backward, DeviceType::kCUDA, &EmbeddingBackwardCuda);

}  // namespace
}  // namespace ember::nn::cuda_kernels
