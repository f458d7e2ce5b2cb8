// Proves oneDNN links and runs here: a small convolution primitive (stride,
// padding) against a plain loop, and the version the headers promise.
#include <oneapi/dnnl/dnnl.hpp>

#include <vector>

#include "gtest/gtest.h"

namespace {

TEST(DnnlTest, VersionMatchesHeaders) {
  const dnnl_version_t* v = dnnl::version();
  EXPECT_EQ(v->major, DNNL_VERSION_MAJOR);
  EXPECT_EQ(v->minor, DNNL_VERSION_MINOR);
}

TEST(DnnlTest, ConvolutionMatchesNaiveLoop) {
  using tag = dnnl::memory::format_tag;
  using dt = dnnl::memory::data_type;
  const int n = 2, c = 3, h = 5, w = 4, o = 2, k = 3, stride = 2, pad = 1;
  const int oh = (h + 2 * pad - k) / stride + 1, ow = (w + 2 * pad - k) / stride + 1;
  std::vector<float> x(n * c * h * w), wt(o * c * k * k), y(n * o * oh * ow), ref(y.size(), 0.f);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 7) - 3.f;
  for (size_t i = 0; i < wt.size(); ++i) wt[i] = static_cast<float>(i % 5) * 0.25f - 0.5f;
  for (int b = 0; b < n; ++b)
    for (int oc = 0; oc < o; ++oc)
      for (int oy = 0; oy < oh; ++oy)
        for (int ox = 0; ox < ow; ++ox) {
          float s = 0;
          for (int ic = 0; ic < c; ++ic)
            for (int ky = 0; ky < k; ++ky)
              for (int kx = 0; kx < k; ++kx) {
                const int iy = oy * stride - pad + ky, ix = ox * stride - pad + kx;
                if (iy < 0 || iy >= h || ix < 0 || ix >= w) continue;
                s += x[((b * c + ic) * h + iy) * w + ix] * wt[((oc * c + ic) * k + ky) * k + kx];
              }
          ref[((b * o + oc) * oh + oy) * ow + ox] = s;
        }

  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream strm(eng);
  dnnl::memory::desc xd({n, c, h, w}, dt::f32, tag::nchw);
  dnnl::memory::desc wd({o, c, k, k}, dt::f32, tag::oihw);
  dnnl::memory::desc yd({n, o, oh, ow}, dt::f32, tag::nchw);
  dnnl::convolution_forward::desc d(dnnl::prop_kind::forward_inference,
                                    dnnl::algorithm::convolution_direct, xd, wd, yd,
                                    {stride, stride}, {pad, pad}, {pad, pad});
  dnnl::convolution_forward::primitive_desc pd(d, eng);
  dnnl::memory xm(xd, eng, x.data()), wm(wd, eng, wt.data()), ym(yd, eng, y.data());
  dnnl::convolution_forward(pd).execute(
      strm, {{DNNL_ARG_SRC, xm}, {DNNL_ARG_WEIGHTS, wm}, {DNNL_ARG_DST, ym}});
  strm.wait();
  for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], ref[i], 1e-5f) << i;
}

}  // namespace
