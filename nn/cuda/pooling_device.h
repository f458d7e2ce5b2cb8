// The device code of nn's CUDA pooling kernels (pooling_device.cu), launched
// by nn/cuda/pooling.cc on a stream of the current device. Each launcher
// returns the launch's error (cudaSuccess for nothing to do); `is_double`
// picks float64 over float32. Tensors are contiguous [planes, H, W] inputs and
// [planes, OH, OW] outputs; indices are int64 positions in a plane
// (iy * W + ix, -1 for none), as nn/pooling_kernels.h describes.
// Kernel-internal.
#ifndef EMBER_NN_CUDA_POOLING_DEVICE_H_
#define EMBER_NN_CUDA_POOLING_DEVICE_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace ember::nn::pooling_device {

// The geometry of a pool: planes of h x w pooled to oh x ow.
struct PoolShape {
  int64_t planes, h, w, oh, ow;
};

// The window of a max pool along rows ([0]) and columns ([1]).
struct MaxWindow {
  int64_t kernel[2], stride[2], padding[2], dilation[2];
};

// out and indices: each window's maximum (the first NaN if it holds one, the
// first of equal maxima otherwise) and its index.
cudaError_t LaunchMaxPool(cudaStream_t stream, bool is_double, const PoolShape& s,
                          const MaxWindow& win, const void* x, void* out, int64_t* indices);

// gx = the scatter of g to the indices (windows may share an argmax),
// gathered per input element from the outputs whose windows (`win`) may
// hold it, summed in output order: deterministic, no atomics, every element
// of gx written.
cudaError_t LaunchMaxPoolBackward(cudaStream_t stream, bool is_double, const PoolShape& s,
                                  const MaxWindow& win, const void* g, const int64_t* indices,
                                  void* gx);

// out = x at the indices (0 for -1).
cudaError_t LaunchMaxPoolGather(cudaStream_t stream, bool is_double, const PoolShape& s,
                                const void* x, const int64_t* indices, void* out);

// `plan` (device memory): ys, ye, yc (oh values each), then xs, xe, xc (ow
// values each), as nn::internal::AvgPlan holds them. The average of each
// output's window.
cudaError_t LaunchAvgPool(cudaStream_t stream, bool is_double, const PoolShape& s,
                          const int64_t* plan, const void* x, void* out);

// Its adjoint, gathered per input element (deterministic, no atomics): the
// windows holding a row (column) are a contiguous range of outputs, since
// starts and ends never decrease.
cudaError_t LaunchAvgPoolAdjoint(cudaStream_t stream, bool is_double, const PoolShape& s,
                                 const int64_t* plan, const void* g, void* gx);

}  // namespace ember::nn::pooling_device

#endif  // EMBER_NN_CUDA_POOLING_DEVICE_H_
