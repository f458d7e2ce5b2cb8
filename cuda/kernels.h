// Host-side helpers of the CUDA kernels' .cc files: the geometry of tensors
// for the launchers of loops.cuh (Note [CUDA loops]), the stream a kernel
// runs on, dtype codes and scalar bits. Kernel-internal: callers are the
// registered `_out` kernels, whose composite ops have validated their
// arguments.
#ifndef EMBER_CUDA_KERNELS_H_
#define EMBER_CUDA_KERNELS_H_

#include <cuda_runtime_api.h>

#include <array>
#include <cstring>

#include "cuda/loops.cuh"
#include "cuda/status.h"
#include "tensor/ops.h"
#include "tensor/tensor.h"

namespace ember::cuda::internal {

// A tensor's data as the launchers take it.
inline char* Ptr(const Tensor& t) { return static_cast<char*>(t.raw_data()); }

// Dtype codes are ember::Dtype's values.
inline int DtypeCode(Dtype dtype) { return static_cast<int>(dtype); }

// The geometry of N operands over `sizes`, with each operand's element
// strides and element size. Throws, naming `op`, when the shape keeps more
// than kMaxDims dims after merging.
template <int N>
kernels::Geometry<N> GeometryOf(const char* op, IntArrayRef sizes,
                                const std::array<IntArrayRef, N>& strides,
                                const std::array<int64_t, N>& elem_sizes) {
  const int64_t* s[N];
  int64_t e[N];
  for (int k = 0; k < N; ++k) {
    s[k] = strides[k].data();
    e[k] = elem_sizes[k];
  }
  kernels::Geometry<N> g;
  EMBER_CHECK(kernels::MakeGeometry<N>(static_cast<int>(sizes.size()), sizes.data(), s, e, g), op,
              ": CUDA kernels handle at most ", kernels::kMaxDims,
              " dims that cannot be merged, got shape ", ShapeToString(sizes),
              "; call .contiguous() on the operands first");
  return g;
}

// The geometry of tensors that all have `ts[0]`'s shape.
template <int N>
kernels::Geometry<N> GeometryOf(const char* op, const std::array<const Tensor*, N>& ts) {
  std::array<IntArrayRef, N> strides;
  std::array<int64_t, N> elem_sizes;
  for (int k = 0; k < N; ++k) {
    strides[k] = ts[k]->strides();
    elem_sizes[k] = static_cast<int64_t>(ts[k]->element_size());
  }
  return GeometryOf<N>(op, ts[0]->sizes(), strides, elem_sizes);
}

// Throws unless every tensor is on `ts[0]`'s CUDA device.
void CheckSameDevice(const char* op, std::initializer_list<const Tensor*> ts);

// The calling thread's current stream on `device` (a CUDA device with an
// index); kernels launch on it with `device` current (a DeviceGuard).
cudaStream_t StreamOf(Device device);

// The device's multiprocessor count (cached).
int SmCount(Device device);

// Throws the launch's error, naming `op`.
void CheckLaunch(cudaError_t error, const char* op);

// `value` converted to `dtype`'s C++ type, as bits (loops.cuh ScalarBits).
kernels::ScalarBits BitsOf(const Scalar& value, Dtype dtype);

}  // namespace ember::cuda::internal

#endif  // EMBER_CUDA_KERNELS_H_
