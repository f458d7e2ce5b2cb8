// oneDNN behind nn's float32 CPU kernels (private to nn/): convolution
// forward (optionally with a fused ReLU), backward data and backward weights
// (with the bias gradient), and batch normalisation forward and backward, on
// Ember's contiguous NCHW buffers.
//
//   namespace onednn = ember::nn::internal::onednn;
//   onednn::ConvGeometry g{.n = 8, .c = 64, .h = 16, .w = 16, .o = 64, .kh = 3,
//                          .kw = 3, .oh = 16, .ow = 16, .stride = {1, 1},
//                          .padding = {1, 1}, .dilation = {1, 1}, .groups = 1};
//   if (onednn::Enabled()) onednn::ConvForward(g, x, w, bias_or_null, y, false);
//
// Note [oneDNN kernels]
// nn's layers are custom autograd Functions whose kernels take contiguous
// NCHW tensors (nn/conv.cc, nn/normalization.cc); for float32 those kernels
// call here, float64 keeps nn's own loops (oneDNN has no f64 convolution).
// Each call:
// - finds its primitive in a process-wide cache keyed by the operation and
//   its geometry (LRU, kPrimitiveCacheCapacity entries, guarded by a mutex;
//   a primitive, once built, is executed concurrently by any thread);
// - lets oneDNN choose its preferred (blocked) layouts, and reorders Ember's
//   NCHW / OIHW buffers into them and the results back, through reorder
//   primitives cached with it;
// - takes every temporary buffer, oneDNN's scratchpad included (the
//   primitives are built in user scratchpad mode), from Ember's CPU allocator,
//   whose large block cache makes the per-call buffers cheap;
// - runs on as many threads as ember::get_num_threads() (one inside a
//   parallel_for body): this oneDNN is the OpenMP build, so the calling
//   thread's OpenMP thread count is set to that before the primitive runs.
//   GNU OpenMP's threads do not survive fork() and its runtime hangs in a
//   child that reuses them, so a child forked after this process ran a
//   primitive on several threads runs its primitives on one (a child forked
//   before that, and a spawned one, keeps the setting).
// EMBER_ONEDNN=0 in the environment (or SetEnabled(false)) sends every call
// back to nn's own kernels, which the benchmarks compare against.
//
// Thread-safety: every function may be called from several threads at once.
#ifndef EMBER_NN_ONEDNN_H_
#define EMBER_NN_ONEDNN_H_

#include <array>
#include <cstddef>
#include <cstdint>

namespace ember::nn::internal::onednn {

// Entries the primitive cache keeps before dropping the least recently used.
inline constexpr size_t kPrimitiveCacheCapacity = 1024;

// Whether nn's float32 kernels use oneDNN: on unless EMBER_ONEDNN=0 was set
// at start-up or SetEnabled(false) was called.
bool Enabled();
void SetEnabled(bool enabled);

// Primitives in the cache now (for tests).
size_t CachedPrimitives();

// One convolution's shapes: input [n, c, h, w], weight [o, c / groups, kh,
// kw], output [n, o, oh, ow]; dilation as PyTorch's (1: none).
struct ConvGeometry {
  int64_t n = 0, c = 0, h = 0, w = 0;
  int64_t o = 0, kh = 0, kw = 0;
  int64_t oh = 0, ow = 0;
  std::array<int64_t, 2> stride{1, 1}, padding{0, 0}, dilation{1, 1};
  int64_t groups = 1;
};

// y = conv(x, w) + b (b may be null), then max(y, 0) when `relu`. Every
// pointer is a contiguous float32 buffer of the geometry's shape.
void ConvForward(const ConvGeometry& g, const float* x, const float* w, const float* b, float* y,
                 bool relu);
// gx = the gradient of conv(x, w) with respect to x, given gy (overwritten).
void ConvBackwardData(const ConvGeometry& g, const float* gy, const float* w, float* gx);
// gw (and gb when not null) = the gradients with respect to w and the bias,
// given x and gy (overwritten).
void ConvBackwardWeights(const ConvGeometry& g, const float* x, const float* gy, float* gw,
                         float* gb);

// Batch normalisation of x [n, c, s] (s: the product of the spatial dims)
// with batch statistics: writes y, and the batch mean and biased variance
// [c]. scale / shift [c] may be null (1 and 0).
void BatchNormForwardTraining(int64_t n, int64_t c, int64_t s, double eps, const float* x,
                              const float* scale, const float* shift, float* y, float* mean,
                              float* variance);
// The same with given statistics (mean, variance [c]).
void BatchNormForwardInference(int64_t n, int64_t c, int64_t s, double eps, const float* x,
                               const float* mean, const float* variance, const float* scale,
                               const float* shift, float* y);
// The gradients of BatchNormForwardTraining (or, when `training` is false, of
// the inference form): gx (may be null when not needed), gscale and gshift
// [c] (both null, or both given).
void BatchNormBackward(int64_t n, int64_t c, int64_t s, double eps, bool training,
                       const float* x, const float* gy, const float* mean, const float* variance,
                       const float* scale, float* gx, float* gscale, float* gshift);

}  // namespace ember::nn::internal::onednn

#endif  // EMBER_NN_ONEDNN_H_
