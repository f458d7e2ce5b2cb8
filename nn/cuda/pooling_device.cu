// Device side of nn's CUDA pooling (pooling_device.h): one thread per output
// element (per input element for the backwards), grid-stride,
// for float and double, accumulating in the element type as the CPU kernels
// do.
#include <cuda_runtime.h>

#include "nn/cuda/pooling_device.h"

namespace ember::nn::pooling_device {
namespace {

constexpr int kThreads = 256;

unsigned BlocksFor(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < (int64_t{1} << 20) ? blocks : (int64_t{1} << 20));
}

#define EMBER_GRID_STRIDE(i, n)                                                          \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

template <typename T>
__global__ void MaxPoolKernel(PoolShape s, MaxWindow win, const T* x, T* out, int64_t* indices) {
  const int64_t total = s.planes * s.oh * s.ow;
  EMBER_GRID_STRIDE(o, total) {
    const int64_t ox = o % s.ow, oy = (o / s.ow) % s.oh, plane = o / (s.ow * s.oh);
    const T* in = x + plane * s.h * s.w;
    T best = -INFINITY;
    int64_t best_index = -1;
    for (int64_t ki = 0; ki < win.kernel[0]; ++ki) {
      const int64_t iy = oy * win.stride[0] - win.padding[0] + ki * win.dilation[0];
      if (iy < 0 || iy >= s.h) continue;
      for (int64_t kj = 0; kj < win.kernel[1]; ++kj) {
        const int64_t ix = ox * win.stride[1] - win.padding[1] + kj * win.dilation[1];
        if (ix < 0 || ix >= s.w) continue;
        const T v = in[iy * s.w + ix];
        if (best_index < 0 || v > best || isnan(v)) {
          best = v;
          best_index = iy * s.w + ix;
          if (isnan(v)) break;
        }
      }
      if (best_index >= 0 && isnan(best)) break;
    }
    out[o] = best;
    indices[o] = best_index;
  }
}

// The outputs along one dimension whose windows may hold input position
// `i`: o * stride - padding + k * dilation == i for some k < kernel, so
// o in [ceil((i + padding - (kernel - 1) * dilation) / stride),
// floor((i + padding) / stride)], clamped to [0, n).
template <typename I>
__device__ __forceinline__ void WindowsHolding(I i, I kernel, I stride, I padding, I dilation, I n,
                                               I* first, I* last) {
  const I low = i + padding - (kernel - 1) * dilation;
  *first = low <= 0 ? 0 : (low + stride - 1) / stride;
  const I high = (i + padding) / stride;
  *last = high < n - 1 ? high : n - 1;
}

// One thread per input element: the sum, in output order, of the gradients
// of the outputs whose argmax it is (the CPU's order; no atomics). Index
// arithmetic in I: int32_t when every index fits (LaunchMaxPoolBackward),
// which spares the 64-bit divisions that dominated the kernel's time.
template <typename T, typename I>
__global__ void MaxPoolBackwardKernel(PoolShape s64, MaxWindow w64, const T* g,
                                      const int64_t* indices, T* gx) {
  const I h = static_cast<I>(s64.h), w = static_cast<I>(s64.w);
  const I oh = static_cast<I>(s64.oh), ow = static_cast<I>(s64.ow);
  const I total = static_cast<I>(s64.planes) * h * w;
  I k[2], st[2], pad[2], dil[2];
  for (int d = 0; d < 2; ++d) {
    k[d] = static_cast<I>(w64.kernel[d]);
    st[d] = static_cast<I>(w64.stride[d]);
    pad[d] = static_cast<I>(w64.padding[d]);
    dil[d] = static_cast<I>(w64.dilation[d]);
  }
  const I step = static_cast<I>(gridDim.x) * static_cast<I>(blockDim.x);
  for (I i = static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + static_cast<I>(threadIdx.x);
       i < total; i += step) {
    const I row = i / w, ix = i - row * w;
    const I plane = row / h, iy = row - plane * h;
    const int64_t here = static_cast<int64_t>(iy) * w + ix;
    const I base = plane * oh * ow;
    I oy0, oy1, ox0, ox1;
    WindowsHolding<I>(iy, k[0], st[0], pad[0], dil[0], oh, &oy0, &oy1);
    WindowsHolding<I>(ix, k[1], st[1], pad[1], dil[1], ow, &ox0, &ox1);
    T sum = 0;
    for (I oy = oy0; oy <= oy1; ++oy) {
      for (I ox = ox0; ox <= ox1; ++ox) {
        const I o = base + oy * ow + ox;
        if (__ldg(indices + o) == here) sum += __ldg(g + o);
      }
    }
    gx[i] = sum;
  }
}

template <typename T>
__global__ void MaxPoolGatherKernel(PoolShape s, const T* x, const int64_t* indices, T* out) {
  const int64_t l = s.oh * s.ow, total = s.planes * l;
  EMBER_GRID_STRIDE(o, total) {
    const int64_t idx = indices[o];
    out[o] = idx >= 0 ? x[(o / l) * s.h * s.w + idx] : T(0);
  }
}

template <typename T>
__global__ void AvgPoolKernel(PoolShape s, const int64_t* plan, const T* x, T* out) {
  const int64_t *ys = plan, *ye = ys + s.oh, *yc = ye + s.oh;
  const int64_t *xs = yc + s.oh, *xe = xs + s.ow, *xc = xe + s.ow;
  const int64_t total = s.planes * s.oh * s.ow;
  EMBER_GRID_STRIDE(o, total) {
    const int64_t ox = o % s.ow, oy = (o / s.ow) % s.oh, plane = o / (s.ow * s.oh);
    const T* in = x + plane * s.h * s.w;
    T sum = 0;
    for (int64_t iy = ys[oy]; iy < ye[oy]; ++iy) {
      for (int64_t ix = xs[ox]; ix < xe[ox]; ++ix) sum += in[iy * s.w + ix];
    }
    const int64_t count = yc[oy] * xc[ox];
    out[o] = count > 0 ? sum / static_cast<T>(count) : T(0);
  }
}

// The first of `n` non-decreasing `ends` greater than `v` (n if none).
__device__ int64_t FirstEndAfter(const int64_t* ends, int64_t n, int64_t v) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (ends[mid] > v) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

template <typename T>
__global__ void AvgPoolAdjointKernel(PoolShape s, const int64_t* plan, const T* g, T* gx) {
  const int64_t *ys = plan, *ye = ys + s.oh, *yc = ye + s.oh;
  const int64_t *xs = yc + s.oh, *xe = xs + s.ow, *xc = xe + s.ow;
  const int64_t total = s.planes * s.h * s.w;
  EMBER_GRID_STRIDE(i, total) {
    const int64_t ix = i % s.w, iy = (i / s.w) % s.h, plane = i / (s.w * s.h);
    const T* go = g + plane * s.oh * s.ow;
    T sum = 0;
    const int64_t ox0 = FirstEndAfter(xe, s.ow, ix);
    for (int64_t oy = FirstEndAfter(ye, s.oh, iy); oy < s.oh && ys[oy] <= iy; ++oy) {
      for (int64_t ox = ox0; ox < s.ow && xs[ox] <= ix; ++ox) {
        const int64_t count = yc[oy] * xc[ox];
        if (count > 0) sum += go[oy * s.ow + ox] / static_cast<T>(count);
      }
    }
    gx[i] = sum;
  }
}

}  // namespace

cudaError_t LaunchMaxPool(cudaStream_t stream, bool is_double, const PoolShape& s,
                          const MaxWindow& win, const void* x, void* out, int64_t* indices) {
  const int64_t n = s.planes * s.oh * s.ow;
  if (n == 0) return cudaSuccess;
  if (is_double) {
    MaxPoolKernel<double><<<BlocksFor(n), kThreads, 0, stream>>>(
        s, win, static_cast<const double*>(x), static_cast<double*>(out), indices);
  } else {
    MaxPoolKernel<float><<<BlocksFor(n), kThreads, 0, stream>>>(
        s, win, static_cast<const float*>(x), static_cast<float*>(out), indices);
  }
  return cudaGetLastError();
}

cudaError_t LaunchMaxPoolBackward(cudaStream_t stream, bool is_double, const PoolShape& s,
                                  const MaxWindow& win, const void* g, const int64_t* indices,
                                  void* gx) {
  const int64_t n = s.planes * s.h * s.w;
  if (n == 0) return cudaSuccess;
  // 32-bit indices when the input, the outputs and a grid's worth of
  // overshoot past either stay below 2^31.
  const int64_t limit = (int64_t{1} << 31) - int64_t{BlocksFor(n)} * kThreads;
  const bool narrow = n < limit && s.planes * s.oh * s.ow < limit;
  auto launch = [&](auto t, auto i) {
    using T = decltype(t);
    using I = decltype(i);
    MaxPoolBackwardKernel<T, I><<<BlocksFor(n), kThreads, 0, stream>>>(
        s, win, static_cast<const T*>(g), indices, static_cast<T*>(gx));
  };
  if (is_double) {
    narrow ? launch(double{}, int32_t{}) : launch(double{}, int64_t{});
  } else {
    narrow ? launch(float{}, int32_t{}) : launch(float{}, int64_t{});
  }
  return cudaGetLastError();
}

cudaError_t LaunchMaxPoolGather(cudaStream_t stream, bool is_double, const PoolShape& s,
                                const void* x, const int64_t* indices, void* out) {
  const int64_t n = s.planes * s.oh * s.ow;
  if (n == 0) return cudaSuccess;
  if (is_double) {
    MaxPoolGatherKernel<double><<<BlocksFor(n), kThreads, 0, stream>>>(
        s, static_cast<const double*>(x), indices, static_cast<double*>(out));
  } else {
    MaxPoolGatherKernel<float><<<BlocksFor(n), kThreads, 0, stream>>>(
        s, static_cast<const float*>(x), indices, static_cast<float*>(out));
  }
  return cudaGetLastError();
}

cudaError_t LaunchAvgPool(cudaStream_t stream, bool is_double, const PoolShape& s,
                          const int64_t* plan, const void* x, void* out) {
  const int64_t n = s.planes * s.oh * s.ow;
  if (n == 0) return cudaSuccess;
  if (is_double) {
    AvgPoolKernel<double><<<BlocksFor(n), kThreads, 0, stream>>>(
        s, plan, static_cast<const double*>(x), static_cast<double*>(out));
  } else {
    AvgPoolKernel<float><<<BlocksFor(n), kThreads, 0, stream>>>(
        s, plan, static_cast<const float*>(x), static_cast<float*>(out));
  }
  return cudaGetLastError();
}

cudaError_t LaunchAvgPoolAdjoint(cudaStream_t stream, bool is_double, const PoolShape& s,
                                 const int64_t* plan, const void* g, void* gx) {
  const int64_t n = s.planes * s.h * s.w;
  if (n == 0) return cudaSuccess;
  if (is_double) {
    AvgPoolAdjointKernel<double><<<BlocksFor(n), kThreads, 0, stream>>>(
        s, plan, static_cast<const double*>(g), static_cast<double*>(gx));
  } else {
    AvgPoolAdjointKernel<float><<<BlocksFor(n), kThreads, 0, stream>>>(
        s, plan, static_cast<const float*>(g), static_cast<float*>(gx));
  }
  return cudaGetLastError();
}

}  // namespace ember::nn::pooling_device
