// ResNet-18's convolutions and training step on the CPU, each beside its
// baseline in this binary: oneDNN's primitives alone.
//
//   bazel run -c opt //nn:conv_benchmark -- --benchmark_enable_random_interleaving=true
//       --benchmark_repetitions=3    (one command line)
//
// BM_Conv/<shape>/<pass>/<path>: one convolution of torchvision's ResNet-18
// on 3x32x32 images at batch 16 (the shapes of //parallel:ddp_benchmark's
// ResNet rows; kShapes, by layer) on one thread. pass 0: forward, 1: backward
// data (nn::grad::conv2d_input), 2: backward weights (nn::grad::conv2d_weight).
// path 0: Ember's conv2d as it runs (oneDNN inside, Ember's NCHW tensors
// reordered in and out; Ember's own kernels where they measured faster:
// conv1's backward data, the weight gradients of one-pixel outputs); 1:
// the oneDNN primitive alone, built with oneDNN's preferred
// layouts and run on buffers already in them, so it holds only the
// primitive's own work; 2: Ember's own im2col + OpenBLAS kernels
// (EMBER_ONEDNN off), the path oneDNN replaced.
//
// BM_MaxPool/<batch>/<path>: ResNet-18's 3x3 stride-2 max pool (64 channels,
// 16x16 to 8x8) forward and backward on one thread. path 0: Ember's
// max_pool2d (nn's kernels, int64 indices); 1: oneDNN's pooling primitives
// on the same NCHW layout (its workspace instead of indices), the
// candidate to replace them; 2: the same primitives on oneDNN's blocked
// layout (nChw16c) without the reorders NCHW tensors would need.
//
// BM_ResNetStep/<batch>/<threads>/<path>: a training step of ResNet-18 with 10
// classes (zero_grad, forward, cross-entropy, backward, SGD lr 0.01), as
// //parallel:ddp_benchmark's one-process rows and nn/torch_resnet_step.py's
// PyTorch side. path 0: Ember; 2: Ember on its own kernels; 1: the sum of the
// step's oneDNN primitives alone: every convolution's forward, backward data
// (except the first layer's, whose input needs none) and backward weights,
// every batch norm's forward and backward and the max pool's forward and
// backward, run back to back on buffers in their preferred layouts; 3: path
// 1 plus the elementwise work it leaves out, as oneDNN primitives on NCHW
// (every ReLU's forward and backward, the residual adds, SGD's update of
// the convolution weights). Neither counts what no primitive does: zero_grad,
// the gradient accumulation into .grad, the classifier, the loss, autograd,
// and the per-step weight reorders that changing weights need. Counter
// median_ms: the median step of 30 after 5 warm-up steps (the protocol of
// ddp_benchmark and the PyTorch scripts).
#include <omp.h>

#include <algorithm>
#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "autograd/grad_mode.h"
#include "benchmark/benchmark.h"
#include "nn/models/resnet.h"
#include "nn/conv.h"
#include "nn/loss.h"
#include "nn/onednn.h"
#include "nn/optim/sgd.h"
#include "nn/pooling.h"
#include "tensor/factories.h"
#include "tensor/thread_pool.h"

namespace ember::nn {
namespace {

namespace onednn = internal::onednn;
using dnnl::memory;
using tag = memory::format_tag;
using dt = memory::data_type;

constexpr int64_t kImage = 32;
constexpr int64_t kClasses = 10;

// One convolution of ResNet-18: channels in and out, kernel, stride,
// padding, input size, and how many of it the network has.
struct Shape {
  const char* name;
  int64_t c, o, k, stride, pad, h, count;
};

// At 3x32x32 input: conv1 gives 16x16, the max pool 8x8.
constexpr Shape kShapes[] = {
    {"conv1_7x7s2_3-64_32", 3, 64, 7, 2, 3, 32, 1},
    {"layer1_3x3_64-64_8", 64, 64, 3, 1, 1, 8, 4},
    {"layer2.0_3x3s2_64-128_8", 64, 128, 3, 2, 1, 8, 1},
    {"layer2.0.down_1x1s2_64-128_8", 64, 128, 1, 2, 0, 8, 1},
    {"layer2_3x3_128-128_4", 128, 128, 3, 1, 1, 4, 3},
    {"layer3.0_3x3s2_128-256_4", 128, 256, 3, 2, 1, 4, 1},
    {"layer3.0.down_1x1s2_128-256_4", 128, 256, 1, 2, 0, 4, 1},
    {"layer3_3x3_256-256_2", 256, 256, 3, 1, 1, 2, 3},
    {"layer4.0_3x3s2_256-512_2", 256, 512, 3, 2, 1, 2, 1},
    {"layer4.0.down_1x1s2_256-512_2", 256, 512, 1, 2, 0, 2, 1},
    {"layer4_3x3_512-512_1", 512, 512, 3, 1, 1, 1, 3},
};
constexpr int kNumShapes = sizeof(kShapes) / sizeof(kShapes[0]);

int64_t OutSize(const Shape& s) { return (s.h + 2 * s.pad - s.k) / s.stride + 1; }

const dnnl::engine& Engine() {
  static dnnl::engine* e = new dnnl::engine(dnnl::engine::kind::cpu, 0);
  return *e;
}

// A primitive with buffers in its own layouts, ready to run.
struct Bound {
  dnnl::primitive primitive;
  std::unordered_map<int, memory> args;
  void Run(dnnl::stream& s) const { primitive.execute(s, args); }
};

memory Filled(const memory::desc& md) {
  memory m(md, Engine());
  float* p = static_cast<float*>(m.get_data_handle());
  const size_t n = md.get_size() / sizeof(float);
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<float>((i * 7919) % 13) * 0.1f - 0.6f;
  return m;
}

// The three primitives of one convolution at batch n, in preferred layouts.
std::vector<Bound> ConvPrimitives(const Shape& sh, int64_t n) {
  const int64_t oh = OutSize(sh);
  memory::desc src({n, sh.c, sh.h, sh.h}, dt::f32, tag::any);
  memory::desc wei({sh.o, sh.c, sh.k, sh.k}, dt::f32, tag::any);
  memory::desc dst({n, sh.o, oh, oh}, dt::f32, tag::any);
  const memory::dims st{sh.stride, sh.stride}, dil{0, 0}, pad{sh.pad, sh.pad};
  dnnl::convolution_forward::primitive_desc fwd(
      dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training,
                                      dnnl::algorithm::convolution_direct, src, wei, dst, st, dil,
                                      pad, pad),
      Engine());
  dnnl::convolution_backward_data::primitive_desc bwd_data(
      dnnl::convolution_backward_data::desc(dnnl::algorithm::convolution_direct, src, wei, dst, st,
                                            dil, pad, pad),
      Engine(), fwd);
  dnnl::convolution_backward_weights::primitive_desc bwd_weights(
      dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, src, wei, dst,
                                               st, dil, pad, pad),
      Engine(), fwd);
  std::vector<Bound> out(3);
  out[0] = {dnnl::convolution_forward(fwd),
            {{DNNL_ARG_SRC, Filled(fwd.src_desc())},
             {DNNL_ARG_WEIGHTS, Filled(fwd.weights_desc())},
             {DNNL_ARG_DST, Filled(fwd.dst_desc())}}};
  out[1] = {dnnl::convolution_backward_data(bwd_data),
            {{DNNL_ARG_DIFF_DST, Filled(bwd_data.diff_dst_desc())},
             {DNNL_ARG_WEIGHTS, Filled(bwd_data.weights_desc())},
             {DNNL_ARG_DIFF_SRC, Filled(bwd_data.diff_src_desc())}}};
  out[2] = {dnnl::convolution_backward_weights(bwd_weights),
            {{DNNL_ARG_SRC, Filled(bwd_weights.src_desc())},
             {DNNL_ARG_DIFF_DST, Filled(bwd_weights.diff_dst_desc())},
             {DNNL_ARG_DIFF_WEIGHTS, Filled(bwd_weights.diff_weights_desc())}}};
  return out;
}

// Batch norm forward (training) and backward over [n, c, h, h] (NCHW, the
// layout the network's tensors have).
std::vector<Bound> BatchNormPrimitives(int64_t n, int64_t c, int64_t h) {
  memory::desc data({n, c, h, h}, dt::f32, tag::nchw);
  const auto flags = dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift;
  dnnl::batch_normalization_forward::primitive_desc fwd(
      dnnl::batch_normalization_forward::desc(dnnl::prop_kind::forward_training, data, 1e-5f,
                                              flags),
      Engine());
  dnnl::batch_normalization_backward::primitive_desc bwd(
      dnnl::batch_normalization_backward::desc(dnnl::prop_kind::backward, data, data, 1e-5f, flags),
      Engine(), fwd);
  const memory::desc per_channel({c}, dt::f32, tag::x);
  std::vector<Bound> out(2);
  out[0] = {dnnl::batch_normalization_forward(fwd),
            {{DNNL_ARG_SRC, Filled(data)},
             {DNNL_ARG_SCALE, Filled(per_channel)},
             {DNNL_ARG_SHIFT, Filled(per_channel)},
             {DNNL_ARG_DST, Filled(data)},
             {DNNL_ARG_MEAN, Filled(fwd.mean_desc())},
             {DNNL_ARG_VARIANCE, Filled(fwd.variance_desc())}}};
  out[1] = {dnnl::batch_normalization_backward(bwd),
            {{DNNL_ARG_SRC, Filled(data)},
             {DNNL_ARG_DIFF_DST, Filled(data)},
             {DNNL_ARG_SCALE, Filled(per_channel)},
             {DNNL_ARG_SHIFT, Filled(per_channel)},
             {DNNL_ARG_MEAN, Filled(bwd.mean_desc())},
             {DNNL_ARG_VARIANCE, Filled(bwd.variance_desc())},
             {DNNL_ARG_DIFF_SRC, Filled(data)},
             {DNNL_ARG_DIFF_SCALE, Filled(per_channel)},
             {DNNL_ARG_DIFF_SHIFT, Filled(per_channel)}}};
  return out;
}

// The 3x3 stride-2 max pool forward and backward in `layout`.
std::vector<Bound> MaxPoolPrimitives(int64_t n, int64_t c, int64_t h, tag layout) {
  memory::desc src({n, c, h, h}, dt::f32, layout);
  memory::desc dst({n, c, h / 2, h / 2}, dt::f32, layout);
  dnnl::pooling_forward::primitive_desc fwd(
      dnnl::pooling_forward::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::pooling_max,
                                  src, dst, {2, 2}, {3, 3}, {1, 1}, {1, 1}),
      Engine());
  dnnl::pooling_backward::primitive_desc bwd(
      dnnl::pooling_backward::desc(dnnl::algorithm::pooling_max, src, dst, {2, 2}, {3, 3}, {1, 1},
                                   {1, 1}),
      Engine(), fwd);
  memory workspace = Filled(fwd.workspace_desc());
  std::vector<Bound> out(2);
  out[0] = {
      dnnl::pooling_forward(fwd),
      {{DNNL_ARG_SRC, Filled(src)}, {DNNL_ARG_DST, Filled(dst)}, {DNNL_ARG_WORKSPACE, workspace}}};
  out[1] = {dnnl::pooling_backward(bwd),
            {{DNNL_ARG_DIFF_DST, Filled(dst)},
             {DNNL_ARG_DIFF_SRC, Filled(src)},
             {DNNL_ARG_WORKSPACE, workspace}}};
  return out;
}

// Sets Ember's and OpenMP's thread counts (oneDNN fixes a primitive's count
// when it is built, so this comes first).
void SetThreads(int n) {
  set_num_threads(n);
  omp_set_num_threads(n);
}

// --- One convolution --------------------------------------------------------------------

constexpr int64_t kConvBatch = 16;

void BM_Conv(benchmark::State& state) {
  const Shape& sh = kShapes[state.range(0)];
  const int pass = static_cast<int>(state.range(1));
  const int path = static_cast<int>(state.range(2));
  SetThreads(1);
  state.SetLabel(sh.name);
  if (path == 1) {
    std::vector<Bound> prims = ConvPrimitives(sh, kConvBatch);
    dnnl::stream stream(Engine());
    for (auto _ : state) {
      prims[pass].Run(stream);
      stream.wait();
    }
    return;
  }
  onednn::SetEnabled(path == 0);
  autograd::NoGradGuard no_grad;
  manual_seed(0);
  const int64_t oh = OutSize(sh);
  Tensor x = randn({kConvBatch, sh.c, sh.h, sh.h});
  Tensor w = randn({sh.o, sh.c, sh.k, sh.k});
  Tensor gy = randn({kConvBatch, sh.o, oh, oh});
  const Int2 st{sh.stride, sh.stride}, pad{sh.pad, sh.pad};
  for (auto _ : state) {
    Tensor r = pass == 0   ? functional::conv2d(x, w, Tensor(), st, pad)
               : pass == 1 ? grad::conv2d_input(x.sizes(), w, gy, st, pad)
                           : grad::conv2d_weight(x, w.sizes(), gy, st, pad);
    benchmark::DoNotOptimize(r.data_ptr<float>());
  }
  onednn::SetEnabled(true);
}

void ConvArgs(benchmark::internal::Benchmark* b) {
  for (int s = 0; s < kNumShapes; ++s) {
    for (int pass = 0; pass < 3; ++pass) {
      for (int path : {0, 1, 2}) b->Args({s, pass, path});
    }
  }
}
BENCHMARK(BM_Conv)->Apply(ConvArgs)->Unit(benchmark::kMicrosecond)->UseRealTime();

// --- Max pool ----------------------------------------------------------------------------

void BM_MaxPool(benchmark::State& state) {
  const int64_t batch = state.range(0);
  const int path = static_cast<int>(state.range(1));
  SetThreads(1);
  constexpr int64_t kChannels = 64, kSize = kImage / 2;
  if (path != 0) {
    std::vector<Bound> prims =
        MaxPoolPrimitives(batch, kChannels, kSize, path == 1 ? tag::nchw : tag::nChw16c);
    dnnl::stream stream(Engine());
    for (auto _ : state) {
      for (const Bound& b : prims) b.Run(stream);
      stream.wait();
    }
    return;
  }
  manual_seed(0);
  Tensor x = randn({batch, kChannels, kSize, kSize}).requires_grad_();
  Tensor gy = randn({batch, kChannels, kSize / 2, kSize / 2});
  const MaxPool2dOptions options{.kernel_size = {3, 3}, .stride = {2, 2}, .padding = {1, 1}};
  for (auto _ : state) {
    functional::max_pool2d(x, options).backward(gy);
    x.set_grad(Tensor());
  }
}
BENCHMARK(BM_MaxPool)
    ->ArgsProduct({{16, 64}, {0, 1, 2}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// --- ResNet-18 training step ---------------------------------------------------------------

double MedianMs(std::vector<double> ms) {
  if (ms.size() > 5) ms.erase(ms.begin(), ms.begin() + 5);
  std::sort(ms.begin(), ms.end());
  return ms.empty() ? 0 : ms[ms.size() / 2];
}

// Every oneDNN primitive of one training step at batch n (see the top).
std::vector<Bound> StepPrimitives(int64_t n) {
  std::vector<Bound> all;
  for (const Shape& sh : kShapes) {
    std::vector<Bound> conv = ConvPrimitives(sh, n);
    const int64_t oh = OutSize(sh);
    std::vector<Bound> bn = BatchNormPrimitives(n, sh.o, oh);
    for (int64_t i = 0; i < sh.count; ++i) {
      all.push_back(conv[0]);
      if (sh.c != 3) all.push_back(conv[1]);  // the image needs no gradient
      all.push_back(conv[2]);
      all.push_back(bn[0]);
      all.push_back(bn[1]);
    }
  }
  for (Bound& b : MaxPoolPrimitives(n, 64, kImage / 2, tag::nchw)) all.push_back(b);
  return all;
}

// The step's elementwise work as oneDNN primitives on NCHW, which
// StepPrimitives leaves out: every ReLU's forward and backward (after each
// batch norm but the downsamples'), each residual block's add, and SGD's
// update of every convolution weight (w += -lr * g, a sum primitive).
std::vector<Bound> ElementwisePrimitives(int64_t n) {
  std::vector<Bound> all;
  int64_t params = 0;
  for (const Shape& sh : kShapes) {
    params += sh.o * sh.c * sh.k * sh.k * sh.count;
    const int64_t oh = OutSize(sh);
    memory::desc data({n, sh.o, oh, oh}, dt::f32, tag::nchw);
    if (sh.k != 1) {  // ReLU after this convolution's batch norm
      dnnl::eltwise_forward::primitive_desc fwd(
          dnnl::eltwise_forward::desc(dnnl::prop_kind::forward_training,
                                      dnnl::algorithm::eltwise_relu, data, 0.0f),
          Engine());
      dnnl::eltwise_backward::primitive_desc bwd(
          dnnl::eltwise_backward::desc(dnnl::algorithm::eltwise_relu, data, data, 0.0f), Engine(),
          fwd);
      Bound f{dnnl::eltwise_forward(fwd),
              {{DNNL_ARG_SRC, Filled(data)}, {DNNL_ARG_DST, Filled(data)}}};
      Bound b{dnnl::eltwise_backward(bwd),
              {{DNNL_ARG_SRC, Filled(data)},
               {DNNL_ARG_DIFF_DST, Filled(data)},
               {DNNL_ARG_DIFF_SRC, Filled(data)}}};
      for (int64_t i = 0; i < sh.count; ++i) {
        all.push_back(f);
        all.push_back(b);
      }
    }
    if (sh.k == 3 && sh.stride == 1) {  // the blocks' residual adds (two per stage)
      dnnl::binary::primitive_desc add(
          dnnl::binary::desc(dnnl::algorithm::binary_add, data, data, data), Engine());
      Bound a{dnnl::binary(add),
              {{DNNL_ARG_SRC_0, Filled(data)},
               {DNNL_ARG_SRC_1, Filled(data)},
               {DNNL_ARG_DST, Filled(data)}}};
      for (int i = 0; i < 2; ++i) all.push_back(a);
    }
  }
  memory::desc flat({params}, dt::f32, tag::x);
  dnnl::sum::primitive_desc sgd({1.0f, -0.01f}, {flat, flat}, Engine());
  memory weights = Filled(flat);
  all.push_back({dnnl::sum(sgd),
                 {{DNNL_ARG_MULTIPLE_SRC, weights},
                  {DNNL_ARG_MULTIPLE_SRC + 1, Filled(flat)},
                  {DNNL_ARG_DST, weights}}});
  return all;
}

void BM_ResNetStep(benchmark::State& state) {
  const int64_t batch = state.range(0);
  const int threads = static_cast<int>(state.range(1));
  const int path = static_cast<int>(state.range(2));
  SetThreads(threads);
  std::vector<double> ms;
  if (path == 1 || path == 3) {
    std::vector<Bound> prims = StepPrimitives(batch);
    if (path == 3) {
      for (Bound& b : ElementwisePrimitives(batch)) prims.push_back(b);
    }
    dnnl::stream stream(Engine());
    for (auto _ : state) {
      const absl::Time start = absl::Now();
      for (const Bound& b : prims) b.Run(stream);
      stream.wait();
      ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
    }
  } else {
    onednn::SetEnabled(path == 0);
    manual_seed(0);
    auto net = std::make_shared<nn::models::ResNet18>(nn::models::ResNetOptions{.num_classes = kClasses});
    optim::SGD opt(net->parameters(), {.lr = 0.01});
    Tensor x = randn({batch, 3, kImage, kImage});
    Tensor y = randint(0, kClasses, {batch});
    for (auto _ : state) {
      const absl::Time start = absl::Now();
      opt.zero_grad(/*set_to_none=*/false);
      functional::cross_entropy((*net)(x), y).backward();
      opt.step();
      ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
    }
    onednn::SetEnabled(true);
  }
  state.counters["median_ms"] = MedianMs(ms);
}

void StepArgs(benchmark::internal::Benchmark* b) {
  for (int64_t batch : {16, 64}) {
    for (int threads : {1, 2}) {
      for (int path : {0, 1, 2, 3}) b->Args({batch, threads, path});
    }
  }
}
BENCHMARK(BM_ResNetStep)
    ->Apply(StepArgs)
    ->Iterations(30)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace ember::nn
