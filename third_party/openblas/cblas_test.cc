// Proves cblas_sgemm / cblas_dgemm link to OpenBLAS and match a plain loop.
#include <cblas.h>

#include <vector>

#include "gtest/gtest.h"

namespace {

TEST(CblasTest, GemmMatchesNaiveLoop) {
  const int m = 5, k = 7, n = 3;
  std::vector<double> a(m * k), b(k * n), c(m * n, 0.0), ref(m * n, 0.0);
  for (int i = 0; i < m * k; ++i) a[i] = (i % 5) - 2.0;
  for (int i = 0; i < k * n; ++i) b[i] = (i % 3) * 0.5;
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j)
      for (int p = 0; p < k; ++p) ref[i * n + j] += a[i * k + p] * b[p * n + j];
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0, a.data(),
              k, b.data(), n, 0.0, c.data(), n);
  for (int i = 0; i < m * n; ++i) EXPECT_DOUBLE_EQ(c[i], ref[i]) << i;

  std::vector<float> af(a.begin(), a.end()), bf(b.begin(), b.end()), cf(m * n);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f,
              af.data(), k, bf.data(), n, 0.0f, cf.data(), n);
  for (int i = 0; i < m * n; ++i) EXPECT_FLOAT_EQ(cf[i], ref[i]) << i;
}

}  // namespace
