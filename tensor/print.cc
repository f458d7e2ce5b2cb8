// Tensor::ToString and operator<<: torch-like printing.
//
//   tensor([[1.0000, 2.5000],
//           [3.0000, 4.0000]])
//   tensor([1, 2, 3], dtype=int32)
//
// Floats share one format per tensor: integers print as "1.", otherwise four
// decimals, or scientific notation when magnitudes span a wide range. Tensors
// of more than 1000 elements show the first and last 3 entries of each dim.
#include <cmath>
#include <cstdio>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "tensor/ops.h"

namespace ember {
namespace {

constexpr int64_t kThreshold = 1000;
constexpr int64_t kEdgeItems = 3;

struct Formatter {
  enum Kind { kInt, kBool, kWholeFloat, kFixed, kSci } kind = kInt;
  int width = 1;

  std::string Format(double v) const {
    switch (kind) {
      case kBool: return v != 0 ? "True" : "False";
      case kInt: return absl::StrFormat("%.0f", v);
      case kWholeFloat:
        if (!std::isfinite(v)) return std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf");
        return absl::StrFormat("%.0f.", v);
      case kFixed:
        if (!std::isfinite(v)) return std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf");
        return absl::StrFormat("%.4f", v);
      case kSci:
        if (!std::isfinite(v)) return std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf");
        return absl::StrFormat("%.4e", v);
    }
    return "";
  }
};

// Indices shown along a dim of size n (with -1 marking the "..." gap).
std::vector<int64_t> Shown(int64_t n, bool summarize) {
  std::vector<int64_t> idx;
  if (!summarize || n <= 2 * kEdgeItems) {
    for (int64_t i = 0; i < n; ++i) idx.push_back(i);
    return idx;
  }
  for (int64_t i = 0; i < kEdgeItems; ++i) idx.push_back(i);
  idx.push_back(-1);
  for (int64_t i = n - kEdgeItems; i < n; ++i) idx.push_back(i);
  return idx;
}

void Collect(const Tensor& t, bool summarize, std::vector<double>* out) {
  if (t.dim() == 0) {
    out->push_back(t.item<double>());
    return;
  }
  for (int64_t i : Shown(t.size(0), summarize)) {
    if (i >= 0) Collect(t.select(0, i), summarize, out);
  }
}

void Render(const Tensor& t, const Formatter& f, bool summarize, int indent, std::string* s) {
  if (t.dim() == 0) {
    std::string v = f.Format(t.item<double>());
    absl::StrAppend(s, std::string(f.width - std::min<int>(f.width, v.size()), ' '), v);
    return;
  }
  absl::StrAppend(s, "[");
  std::vector<int64_t> idx = Shown(t.size(0), summarize);
  for (size_t k = 0; k < idx.size(); ++k) {
    if (k > 0) {
      if (t.dim() == 1) {
        absl::StrAppend(s, ", ");
      } else {
        absl::StrAppend(s, ",", std::string(t.dim() - 1, '\n'), std::string(indent + 1, ' '));
      }
    }
    if (idx[k] < 0) {
      absl::StrAppend(s, "...");
      continue;
    }
    Render(t.select(0, idx[k]), f, summarize, indent + 1, s);
  }
  absl::StrAppend(s, "]");
}

}  // namespace

std::string Tensor::ToString() const {
  if (!defined()) return "tensor(undefined)";
  Tensor host = is_cpu() ? *this : to(kCPU);
  bool summarize = numel() > kThreshold;
  std::vector<double> values;
  if (numel() > 0) Collect(host.to(kFloat64), summarize, &values);

  Formatter f;
  if (dtype() == kBool) {
    f.kind = Formatter::kBool;
  } else if (ember::is_floating_point(dtype())) {
    bool whole = true;
    double max_abs = 0, min_abs = INFINITY;
    for (double v : values) {
      if (!std::isfinite(v)) continue;
      whole &= std::nearbyint(v) == v;
      max_abs = std::max(max_abs, std::fabs(v));
      if (v != 0) min_abs = std::min(min_abs, std::fabs(v));
    }
    bool wide = max_abs >= 1e8 || (!whole && (min_abs < 1e-4 || max_abs / min_abs > 1000));
    if (values.empty() || (whole && !wide)) {
      f.kind = Formatter::kWholeFloat;
    } else if (wide) {
      f.kind = Formatter::kSci;
    } else {
      f.kind = Formatter::kFixed;
    }
  }
  for (double v : values) f.width = std::max<int>(f.width, f.Format(v).size());

  std::string s = "tensor(";
  if (numel() == 0 && dim() > 0) {
    absl::StrAppend(&s, "[]");
  } else {
    Render(host.to(kFloat64), f, summarize, 7, &s);
  }
  bool default_dtype = dtype() == kFloat32 || dtype() == kInt64 || dtype() == kBool;
  if (numel() == 0 && dim() > 0 && sizes() != IntArrayRef{0}) {
    absl::StrAppend(&s, ", size=(", absl::StrJoin(sizes(), ", "), sizes().size() == 1 ? ",)" : ")");
  }
  if (!default_dtype) absl::StrAppend(&s, ", dtype=", std::string(dtype_name(dtype())));
  if (!is_cpu()) absl::StrAppend(&s, ", device='", device().str(), "'");
  absl::StrAppend(&s, ")");
  return s;
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.ToString(); }

}  // namespace ember
