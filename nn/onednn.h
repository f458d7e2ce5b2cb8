// oneDNN behind nn's float32 CPU convolutions (private to nn/): forward
// (optionally with a fused ReLU), backward data and backward weights (with
// the bias gradient), on Ember's contiguous NCHW buffers.
//
//   namespace onednn = ember::nn::internal::onednn;
//   onednn::ConvGeometry g{.n = 8, .c = 64, .h = 16, .w = 16, .o = 64, .kh = 3,
//                          .kw = 3, .oh = 16, .ow = 16, .stride = {1, 1},
//                          .padding = {1, 1}, .dilation = {1, 1}, .groups = 1};
//   if (onednn::Enabled()) onednn::ConvForward(g, x, w, bias_or_null, y, false);
//
// Note [oneDNN kernels]
// nn's layers are custom autograd Functions whose kernels take contiguous
// NCHW tensors; for float32, conv2d's three kernels (nn/conv.cc) call here,
// float64 keeps nn's own loops (oneDNN has no f64 convolution). Only the
// convolutions: on NCHW tensors oneDNN's batch normalisation (its ncsp
// implementation) measured slower than nn's own kernel on ResNet-18's
// shapes (forward + backward at batch 16: 1.3x to 1.8x slower in 4 of 5
// shapes; commit 96e074f had that path), so batch_norm keeps nn's kernel;
// pooling has not been moved.
// Each call:
// - finds its primitive in a process-wide cache keyed by the operation and
//   its geometry (LRU, kPrimitiveCacheCapacity entries, guarded by a mutex;
//   a primitive, once built, is executed concurrently by any thread);
// - lets oneDNN choose its preferred (blocked) layouts, and reorders Ember's
//   NCHW / OIHW buffers into them and the results back, through reorder
//   primitives cached with it, or, for the layouts AVX-512 machines get
//   (nChw16c activations, OIhw16i16o weights), through Ember's own register
//   transposes (Notes [Activations in nChw16c], [Weight gradients out of
//   OIhw16i16o] and [Streaming weight copies] in onednn.cc); a weight whose
//   version the caller gives is reordered once per version and layout
//   (Note [oneDNN weight cache]);
// - takes every temporary buffer, oneDNN's scratchpad included (the
//   primitives are built in user scratchpad mode), from Ember's CPU allocator,
//   whose large block cache makes the per-call buffers cheap;
// - runs on as many threads as ember::get_num_threads() (one inside a
//   parallel_for body): this oneDNN is the OpenMP build, the same team of
//   threads Ember's parallel_for runs on (Note [One team for every op] in
//   tensor/thread_pool.cc), so the calling thread's OpenMP thread count is
//   set to internal::openmp_threads() before the primitive runs. That is one
//   in a child forked after the team started: GNU OpenMP's threads do not
//   survive fork() and its runtime hangs in a child that reuses them (a
//   child forked before that, and a spawned one, keeps the setting).
// EMBER_ONEDNN=0 in the environment (or SetEnabled(false)) sends every call
// back to nn's own kernels, which the benchmarks compare against.
//
// Thread-safety: every function may be called from several threads at once.
//
// Note [oneDNN weight cache]
// oneDNN's convolutions want their weights blocked (OIhw16i16o for the
// forward, OIhw16o16i for backward data on AVX-512), and reordering a
// layer's weights costs more than the convolution when the image is small
// (ResNet-18's 512x512x3x3 at 1x1: 0.7 ms to reorder, 0.24 ms to
// convolve). So the blocked copy of a weight is kept, per (tensor, layout),
// for as long as its values are unchanged: the caller names the weight by
// its version counter (shared with its views and detach() results) and
// version, and every in-place op bumps the version (an optimizer's step, a
// copy_ from a checkpoint, init's fills). A hit also needs the same data
// address and the same values at kWeightFingerprint sampled positions, so
// writes that bypass the version (a collective into the storage, FSDP
// pointing the parameter at a new gathered buffer) are caught unless they
// leave the address and every sampled value as they were. In training each
// step changes the weights, so there the forward's and backward data's
// reorders still happen once per step each (their layouts differ;
// backward data's OIhw16o16i is made from the forward's OIhw16i16o copy of
// the same version by transposing its 16x16 tiles, which reads that copy in
// order instead of gathering from OIHW); a
// sequence of forwards with unchanged weights (evaluation, several
// micro-batches per step) reorders once. Entries of freed tensors are
// dropped at the next insertion; at most kWeightCacheBytes are kept (least
// recently used dropped first).
#ifndef EMBER_NN_ONEDNN_H_
#define EMBER_NN_ONEDNN_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>

namespace ember::nn::internal::onednn {

// Entries the primitive cache keeps before dropping the least recently used.
inline constexpr size_t kPrimitiveCacheCapacity = 1024;

// Whether nn's float32 kernels use oneDNN: on unless EMBER_ONEDNN=0 was set
// at start-up or SetEnabled(false) was called.
bool Enabled();
void SetEnabled(bool enabled);

// Primitives in the cache now (for tests).
size_t CachedPrimitives();

// Bytes of blocked weights the weight cache keeps at most, and the values it
// compares on a hit (Note [oneDNN weight cache]).
inline constexpr size_t kWeightCacheBytes = size_t{256} << 20;
inline constexpr int kWeightFingerprint = 32;

// A weight's identity and version for the weight cache: the tensor's version
// counter (any shared_ptr that lives exactly as long as it) and its value
// now. A null counter: not cached.
struct WeightVersion {
  std::shared_ptr<const void> counter;
  uint32_t version = 0;
};

// Blocked weights in the weight cache now (for tests).
size_t CachedWeights();

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
// `w_version` names w for the weight cache.
void ConvForward(const ConvGeometry& g, const float* x, const float* w, const float* b, float* y,
                 bool relu, const WeightVersion& w_version = {});
// gx = the gradient of conv(x, w) with respect to x, given gy (overwritten).
void ConvBackwardData(const ConvGeometry& g, const float* gy, const float* w, float* gx,
                      const WeightVersion& w_version = {});
// gw (and gb when not null) = the gradients with respect to w and the bias,
// given x and gy (overwritten).
void ConvBackwardWeights(const ConvGeometry& g, const float* x, const float* gy, float* gw,
                         float* gb);

}  // namespace ember::nn::internal::onednn

#endif  // EMBER_NN_ONEDNN_H_
