// conv2d against PyTorch: forward and the three gradients of
// torch.nn.functional.conv2d, computed at test time by /usr/bin/python3 with
// python3-torch (nn/testdata/conv2d_torch.py) for strides, padding, dilation,
// groups and the layouts oneDNN blocks, through oneDNN (float32), through
// nn's own kernels (EMBER_ONEDNN off, and float64), and from non-contiguous
// inputs; and the oneDNN path's primitive cache, weight cache, threads and
// fork. Also max_pool2d's CPU kernel against the window-by-window definition.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "autograd/grad_mode.h"
#include "gtest/gtest.h"
#include "nn/activation.h"
#include "nn/conv.h"
#include "nn/onednn.h"
#include "nn/pooling.h"
#include "nn/testing.h"
#include "tensor/factories.h"
#include "tensor/thread_pool.h"

namespace ember::nn {
namespace {

namespace onednn = internal::onednn;
using ::ember::nn::testing::Values;

struct Case {
  std::string name;
  Int2 stride, padding, dilation;
  int64_t groups = 1;
  bool bias = false;
  std::map<std::string, Tensor> t;  // float64, as PyTorch wrote them
};

// Runs the reference script into TEST_TMPDIR and parses its cases; empty
// with `skip` set when python3-torch is missing.
std::vector<Case> LoadCases(std::string* skip) {
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/conv2d_torch.txt";
  const int status = std::system(("/usr/bin/python3 nn/testdata/conv2d_torch.py " + path).c_str());
  if (WIFEXITED(status) && WEXITSTATUS(status) == 77) {
    *skip = "python3-torch is not installed (apt-get install python3-torch)";
    return {};
  }
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "conv2d_torch.py failed";
  std::ifstream in(path);
  std::vector<Case> cases;
  std::string word;
  while (in >> word) {
    if (word == "case") {
      Case c;
      int bias = 0;
      in >> c.name >> c.stride[0] >> c.stride[1] >> c.padding[0] >> c.padding[1] >> c.dilation[0] >>
          c.dilation[1] >> c.groups >> bias;
      c.bias = bias != 0;
      cases.push_back(std::move(c));
      continue;
    }
    EXPECT_EQ(word, "tensor");
    std::string name;
    int64_t rank = 0;
    in >> name >> rank;
    SizeVector sizes(rank);
    int64_t numel = 1;
    for (auto& s : sizes) {
      in >> s;
      numel *= s;
    }
    std::vector<double> values(numel);
    for (double& v : values) in >> v;
    cases.back().t[name] = tensor(values, sizes, TensorOptions(kFloat64));
  }
  return cases;
}

const std::vector<Case>& Cases(std::string* skip) {
  static std::string skipped;
  static const std::vector<Case> cases = LoadCases(&skipped);
  *skip = skipped;
  return cases;
}

// How conv2d's operands are laid out.
enum class Layout { kContiguous, kNonContiguous };

// Ember's conv2d of `c` in `dtype` and `layout`: {output, grad_input,
// grad_weight, grad_bias (undefined without bias)}.
std::vector<Tensor> RunConv(const Case& c, Dtype dtype, Layout layout) {
  // Fresh leaves (to() of a float64 tensor in float64 is the tensor itself).
  Tensor x = c.t.at("x").to(dtype).clone().requires_grad_();
  Tensor w = c.t.at("weight").to(dtype).clone().requires_grad_();
  Tensor b = c.bias ? c.t.at("bias").to(dtype).clone().requires_grad_() : Tensor();
  Tensor gy = c.t.at("grad_output").to(dtype);
  Tensor xin = x, win = w;
  if (layout == Layout::kNonContiguous) {
    // x channels-last, the weight and grad_output with H and W transposed.
    xin = x.permute({0, 2, 3, 1}).contiguous().permute({0, 3, 1, 2});
    win = w.transpose(2, 3).contiguous().transpose(2, 3);
    gy = gy.transpose(2, 3).contiguous().transpose(2, 3);
    if (x.size(2) * x.size(3) > 1) {
      EXPECT_FALSE(xin.is_contiguous()) << c.name;
    }
    if (w.size(2) * w.size(3) > 1) {
      EXPECT_FALSE(win.is_contiguous()) << c.name;
    }
  }
  Tensor y = functional::conv2d(xin, win, b, c.stride, c.padding, c.dilation, c.groups);
  y.backward(gy);
  return {y, x.grad(), w.grad(), c.bias ? b.grad() : Tensor()};
}

// |got - want| <= tol * (1 + |want|) everywhere, with tol scaled by the
// length of the sums behind each value.
void ExpectClose(const Tensor& got, const Tensor& want, const std::string& what, double tol) {
  ASSERT_TRUE(got.defined()) << what;
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const std::vector<double> g = Values(got), w = Values(want);
  int bad = 0;
  for (size_t i = 0; i < g.size() && bad < 5; ++i) {
    if (!(std::abs(g[i] - w[i]) <= tol * (1 + std::abs(w[i])))) {
      ADD_FAILURE() << what << " at " << i << ": got " << g[i] << ", PyTorch " << w[i];
      ++bad;
    }
  }
}

void ExpectMatchesTorch(const Case& c, const std::vector<Tensor>& got, const std::string& how,
                        double tol) {
  const std::string at = c.name + " (" + how + ") ";
  ExpectClose(got[0], c.t.at("output"), at + "output", tol);
  ExpectClose(got[1], c.t.at("grad_input"), at + "grad_input", tol);
  ExpectClose(got[2], c.t.at("grad_weight"), at + "grad_weight", tol);
  if (c.bias) ExpectClose(got[3], c.t.at("grad_bias"), at + "grad_bias", tol);
}

class ConvTorchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string skip;
    cases_ = &Cases(&skip);
    if (!skip.empty()) GTEST_SKIP() << skip;
    ASSERT_GE(cases_->size(), 12u);
  }
  void TearDown() override { onednn::SetEnabled(true); }
  const std::vector<Case>* cases_ = nullptr;
};

// float32 sums of a few hundred products: 1e-4 relative.
constexpr double kFloatTol = 1e-4;

TEST_F(ConvTorchTest, OneDnnMatchesPyTorch) {
  onednn::SetEnabled(true);
  for (const Case& c : *cases_) {
    ExpectMatchesTorch(c, RunConv(c, kFloat32, Layout::kContiguous), "oneDNN", kFloatTol);
  }
}

TEST_F(ConvTorchTest, OneDnnMatchesPyTorchOnNonContiguousInputs) {
  onednn::SetEnabled(true);
  for (const Case& c : *cases_) {
    ExpectMatchesTorch(c, RunConv(c, kFloat32, Layout::kNonContiguous), "oneDNN, non-contiguous",
                       kFloatTol);
  }
}

TEST_F(ConvTorchTest, OwnKernelsMatchPyTorch) {
  onednn::SetEnabled(false);
  for (const Case& c : *cases_) {
    ExpectMatchesTorch(c, RunConv(c, kFloat32, Layout::kContiguous), "im2col float32", kFloatTol);
    ExpectMatchesTorch(c, RunConv(c, kFloat32, Layout::kNonContiguous), "im2col, non-contiguous",
                       kFloatTol);
  }
}

TEST_F(ConvTorchTest, Float64MatchesPyTorch) {
  // float64 always runs nn's own kernels (oneDNN has no f64 convolution); the
  // reference was computed from the same float32-valued inputs in float32,
  // so the tolerance is float32's.
  for (const Case& c : *cases_) {
    ExpectMatchesTorch(c, RunConv(c, kFloat64, Layout::kContiguous), "float64", kFloatTol);
  }
}

TEST_F(ConvTorchTest, ThreadSettingsGiveTheSameResults) {
  onednn::SetEnabled(true);
  const int before = get_num_threads();
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    for (const Case& c : *cases_) {
      ExpectMatchesTorch(c, RunConv(c, kFloat32, Layout::kContiguous),
                         "threads=" + std::to_string(threads), kFloatTol);
    }
  }
  set_num_threads(before);
}

TEST_F(ConvTorchTest, ConcurrentCallsFromSeveralThreads) {
  // The primitives and their cache are shared; each thread's results must
  // still be PyTorch's.
  onednn::SetEnabled(true);
  std::vector<std::thread> threads;
  std::vector<std::vector<std::vector<Tensor>>> got(4);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 3; ++round) {
        for (const Case& c : *cases_) got[t].push_back(RunConv(c, kFloat32, Layout::kContiguous));
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) {
    ASSERT_EQ(got[t].size(), 3 * cases_->size());
    for (size_t i = 0; i < got[t].size(); ++i) {
      ExpectMatchesTorch((*cases_)[i % cases_->size()], got[t][i], "thread " + std::to_string(t),
                         kFloatTol);
    }
  }
}

// --- Primitive cache and fused forms -------------------------------------------------

TEST(ConvOneDnnTest, PrimitivesAreBuiltOncePerShape) {
  onednn::SetEnabled(true);
  manual_seed(0);
  Conv2d conv(Conv2dOptions{.in_channels = 5,
                            .out_channels = 7,
                            .kernel_size = {3, 3},
                            .stride = {1, 2},
                            .padding = {1, 1}});
  Tensor x = randn({2, 5, 9, 9}).requires_grad_();
  conv(x).sum().backward();
  const size_t after_first = onednn::CachedPrimitives();
  for (int i = 0; i < 3; ++i) conv(x).sum().backward();
  EXPECT_EQ(onednn::CachedPrimitives(), after_first);
  // A new batch size is a new shape.
  conv(randn({3, 5, 9, 9}).requires_grad_()).sum().backward();
  EXPECT_GT(onednn::CachedPrimitives(), after_first);
}

// --- Weight cache (Note [oneDNN weight cache]) -----------------------------------------

// conv2d of float32 x and w on nn's float64 kernels (no oneDNN), in float32.
Tensor Float64Conv(const Tensor& x, const Tensor& w) {
  return functional::conv2d(x.to(kFloat64), w.to(kFloat64), Tensor(), {1, 1}, {1, 1}).to(kFloat32);
}

void ExpectSame(const Tensor& got, const Tensor& want, const std::string& what) {
  ExpectClose(got, want, what, kFloatTol);
}

TEST(ConvOneDnnWeightCacheTest, RepeatedForwardsKeepOneBlockedCopy) {
  onednn::SetEnabled(true);
  autograd::NoGradGuard no_grad;
  manual_seed(1);
  Tensor x = randn({2, 32, 6, 6}), w = randn({32, 32, 3, 3});
  const size_t before = onednn::CachedWeights();
  for (int i = 0; i < 3; ++i) {
    ExpectSame(functional::conv2d(x, w, Tensor(), {1, 1}, {1, 1}), Float64Conv(x, w),
               "forward " + std::to_string(i));
  }
  EXPECT_EQ(onednn::CachedWeights(), before + 1);
  // Backward data wants its own layout: one more copy, then hits.
  Tensor gy = randn({2, 32, 6, 6});
  Tensor want = grad::conv2d_input(x.sizes(), w.to(kFloat64), gy.to(kFloat64), {1, 1}, {1, 1});
  for (int i = 0; i < 2; ++i) {
    ExpectSame(grad::conv2d_input(x.sizes(), w, gy, {1, 1}, {1, 1}), want.to(kFloat32),
               "backward data " + std::to_string(i));
  }
  EXPECT_EQ(onednn::CachedWeights(), before + 2);
}

TEST(ConvOneDnnWeightCacheTest, LargeWeightsAreCopiedOnSeveralThreads) {
  // A 64x512x3x3 weight (1.2 MB: streamed) is blocked, tile-transposed and
  // its gradient unblocked in parts of 16 output channels split across the
  // threads (nn/onednn.cc); every pass must still equal float64's.
  onednn::SetEnabled(true);
  autograd::NoGradGuard no_grad;
  const int before = get_num_threads();
  set_num_threads(2);
  manual_seed(3);
  Tensor x = randn({2, 512, 3, 3}), w = randn({64, 512, 3, 3}) * 0.05;
  Tensor gy = randn({2, 64, 3, 3});
  const Tensor x64 = x.to(kFloat64), w64 = w.to(kFloat64), gy64 = gy.to(kFloat64);
  ExpectSame(functional::conv2d(x, w, Tensor(), {1, 1}, {1, 1}), Float64Conv(x, w), "forward");
  ExpectSame(grad::conv2d_input(x.sizes(), w, gy, {1, 1}, {1, 1}),
             grad::conv2d_input(x.sizes(), w64, gy64, {1, 1}, {1, 1}).to(kFloat32),
             "backward data");
  ExpectSame(grad::conv2d_weight(x, w.sizes(), gy, {1, 1}, {1, 1}),
             grad::conv2d_weight(x64, w.sizes(), gy64, {1, 1}, {1, 1}).to(kFloat32),
             "backward weights");
  set_num_threads(before);
}

TEST(ConvOneDnnWeightCacheTest, InPlaceUpdatesAreSeen) {
  onednn::SetEnabled(true);
  manual_seed(2);
  Tensor x = randn({2, 32, 6, 6});
  Tensor w = randn({32, 32, 3, 3}).requires_grad_();
  Tensor first = functional::conv2d(x, w, Tensor(), {1, 1}, {1, 1});
  {
    autograd::NoGradGuard no_grad;
    w.mul_(-0.5);  // bumps w's version
    ExpectSame(functional::conv2d(x, w, Tensor(), {1, 1}, {1, 1}), Float64Conv(x, w), "after mul_");
    w.copy_(randn({32, 32, 3, 3}));
    ExpectSame(functional::conv2d(x, w, Tensor(), {1, 1}, {1, 1}), Float64Conv(x, w),
               "after copy_");
  }
  EXPECT_GT(std::abs(Values(first)[0] - Values(Float64Conv(x, w))[0]), 0.0);
}

TEST(ConvOneDnnWeightCacheTest, WritesThatBypassTheVersionAreSeen) {
  // A collective writing into a parameter's storage does not bump its
  // version; the sampled values tell the cached copy is stale.
  onednn::SetEnabled(true);
  autograd::NoGradGuard no_grad;
  manual_seed(3);
  Tensor x = randn({2, 32, 6, 6}), w = randn({32, 32, 3, 3});
  (void)functional::conv2d(x, w, Tensor(), {1, 1}, {1, 1});
  const uint32_t version = w.version();
  Tensor fresh = randn({32, 32, 3, 3});
  std::copy_n(fresh.data_ptr<float>(), fresh.numel(), w.data_ptr<float>());
  ASSERT_EQ(w.version(), version);
  ExpectSame(functional::conv2d(x, w, Tensor(), {1, 1}, {1, 1}), Float64Conv(x, fresh),
             "after a raw write");
}

TEST(ConvOneDnnWeightCacheTest, FreedAndNonContiguousWeightsLeaveNothing) {
  onednn::SetEnabled(true);
  autograd::NoGradGuard no_grad;
  manual_seed(4);
  Tensor x = randn({2, 32, 6, 6});
  const size_t before = onednn::CachedWeights();
  {
    Tensor w = randn({32, 32, 3, 3});
    (void)functional::conv2d(x, w, Tensor(), {1, 1}, {1, 1});
    EXPECT_EQ(onednn::CachedWeights(), before + 1);
  }
  EXPECT_EQ(onednn::CachedWeights(), before);
  // A transposed view is convolved through a contiguous copy: not kept.
  Tensor wt = randn({32, 32, 3, 3}).transpose(2, 3);
  ExpectSame(functional::conv2d(x, wt, Tensor(), {1, 1}, {1, 1}), Float64Conv(x, wt), "view");
  EXPECT_EQ(onednn::CachedWeights(), before);
}

TEST(ConvOneDnnWeightCacheTest, TrainingStepsMatchNnsOwnKernels) {
  // SGD steps update the weights in place between forwards: oneDNN's path,
  // with the cache, must follow the same trajectory as nn's kernels.
  auto train = [](bool use_onednn) {
    onednn::SetEnabled(use_onednn);
    manual_seed(5);
    Conv2d conv(Conv2dOptions{
        .in_channels = 16, .out_channels = 32, .kernel_size = {3, 3}, .padding = {1, 1}});
    Tensor x = randn({2, 16, 5, 5});
    std::vector<double> losses;
    for (int step = 0; step < 4; ++step) {
      conv.zero_grad();
      Tensor loss = conv(x).pow(2).mean();
      loss.backward();
      losses.push_back(Values(loss)[0]);
      autograd::NoGradGuard no_grad;
      for (const Tensor& p : conv.parameters()) p.sub_(p.grad() * 0.1);
    }
    onednn::SetEnabled(true);
    return losses;
  };
  const std::vector<double> own = train(false), dnnl = train(true);
  ASSERT_EQ(own.size(), dnnl.size());
  for (size_t i = 0; i < own.size(); ++i) {
    EXPECT_NEAR(dnnl[i], own[i], 1e-4 * (1 + std::abs(own[i]))) << "step " << i;
  }
  EXPECT_LT(own.back(), own.front());  // the steps change the weights
}

// --- max_pool2d's CPU kernel ---------------------------------------------------------
// Its kernel runs tap by tap over output rows (nn/pooling.cc); these check it
// against the window-by-window definition for every geometry option, with
// ties (the first maximum wins) and NaNs (the first NaN wins, and
// propagates), through the values and where the gradient lands.

// PyTorch's max pool, window by window: {values, the plane index each came
// from}.
std::pair<std::vector<double>, std::vector<int64_t>> ReferenceMaxPool(const std::vector<double>& x,
                                                                      int64_t planes, int64_t h,
                                                                      int64_t w,
                                                                      const MaxPool2dOptions& o,
                                                                      int64_t oh, int64_t ow) {
  std::vector<double> values;
  std::vector<int64_t> where;
  for (int64_t p = 0; p < planes; ++p) {
    for (int64_t oy = 0; oy < oh; ++oy) {
      for (int64_t ox = 0; ox < ow; ++ox) {
        double best = 0;
        int64_t at = -1;
        for (int64_t ki = 0; ki < o.kernel_size[0]; ++ki) {
          for (int64_t kj = 0; kj < o.kernel_size[1]; ++kj) {
            const int64_t iy = oy * o.stride[0] - o.padding[0] + ki * o.dilation[0];
            const int64_t ix = ox * o.stride[1] - o.padding[1] + kj * o.dilation[1];
            if (iy < 0 || iy >= h || ix < 0 || ix >= w) continue;
            const double v = x[(p * h + iy) * w + ix];
            if (at >= 0 && std::isnan(best)) continue;
            if (at < 0 || v > best || std::isnan(v)) best = v, at = iy * w + ix;
          }
        }
        values.push_back(best);
        where.push_back(at);
      }
    }
  }
  return {values, where};
}

TEST(MaxPoolKernelTest, MatchesTheWindowDefinition) {
  struct Geometry {
    Int2 kernel, stride, padding, dilation;
    bool ceil_mode;
  };
  const Geometry geometries[] = {
      {{3, 3}, {2, 2}, {1, 1}, {1, 1}, false},  // ResNet's
      {{2, 3}, {1, 2}, {0, 1}, {1, 1}, false}, {{3, 2}, {2, 3}, {1, 1}, {2, 1}, true},
      {{2, 2}, {3, 3}, {1, 0}, {1, 2}, true},  {{5, 5}, {1, 1}, {2, 2}, {1, 1}, false},
  };
  // The second size has planes enough to split across three threads.
  struct Size {
    int64_t n, c, h, w;
    int threads;
  };
  const int before = get_num_threads();
  manual_seed(6);
  for (const Size& size : {Size{2, 3, 9, 11, 1}, Size{2, 48, 32, 32, 3}}) {
    set_num_threads(size.threads);
    for (Dtype dtype : {kFloat32, kFloat64}) {
      for (const Geometry& g : geometries) {
        const int64_t n = size.n, c = size.c, h = size.h, w = size.w;
        // Values from a small set, so that windows hold ties; some NaNs.
        Tensor x = randint(0, 5, {n, c, h, w}).to(dtype);
        std::vector<double> xs = Values(x);
        for (int64_t i : {7, 50, 51, 140, 300}) xs[i] = std::nan("");
        x = tensor(xs, SizeVector{n, c, h, w}, TensorOptions(kFloat64)).to(dtype).requires_grad_();
        const MaxPool2dOptions o{.kernel_size = g.kernel,
                                 .stride = g.stride,
                                 .padding = g.padding,
                                 .dilation = g.dilation,
                                 .ceil_mode = g.ceil_mode};
        Tensor y = functional::max_pool2d(x, o);
        const auto [want, where] = ReferenceMaxPool(xs, n * c, h, w, o, y.size(2), y.size(3));
        const std::vector<double> got = Values(y);
        ASSERT_EQ(got.size(), want.size());
        for (size_t i = 0; i < got.size(); ++i) {
          ASSERT_TRUE(std::isnan(got[i]) == std::isnan(want[i]) &&
                      (std::isnan(got[i]) || got[i] == want[i]))
              << "output " << i << ": got " << got[i] << ", want " << want[i];
        }
        // The gradient of output i lands at where[i], scaled by i + 1.
        const int64_t out_numel = static_cast<int64_t>(got.size());
        Tensor gy = arange(1, out_numel + 1).to(dtype).view(y.sizes());
        y.backward(gy);
        std::vector<double> want_grad(xs.size(), 0.0);
        const int64_t plane_out = y.size(2) * y.size(3);
        for (int64_t i = 0; i < out_numel; ++i) {
          want_grad[(i / plane_out) * h * w + where[i]] += static_cast<double>(i + 1);
        }
        EXPECT_EQ(Values(x.grad()), want_grad);
      }
    }
  }
  set_num_threads(before);
}

TEST(ConvOneDnnTest, ForkedChildConvolvesWithSeveralThreads) {
  // The parent's OpenMP threads do not exist in a forked child; its
  // convolutions must still finish and agree with the parent's (Note [oneDNN
  // kernels]: they run on one thread there).
  onednn::SetEnabled(true);
  const int before = get_num_threads();
  set_num_threads(2);
  manual_seed(0);
  Tensor x = randn({4, 32, 8, 8}), w = randn({32, 32, 3, 3});
  Tensor want = functional::conv2d(x, w, Tensor(), {1, 1}, {1, 1});
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    alarm(60);  // a hang fails the test instead of stalling it
    Tensor got = functional::conv2d(x, w, Tensor(), {1, 1}, {1, 1});
    const std::vector<double> a = Values(got), b = Values(want);
    for (size_t i = 0; i < a.size(); ++i) {
      if (std::abs(a[i] - b[i]) > 1e-5 * (1 + std::abs(b[i]))) _exit(2);
    }
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  set_num_threads(before);
  ASSERT_TRUE(WIFEXITED(status)) << "the child was killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace ember::nn
