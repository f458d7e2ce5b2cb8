#include "autograd/gradcheck.h"

#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "tensor/factories.h"
#include "tensor/testing.h"

namespace ember::autograd {
namespace {

// Row-major element `index` of `t` as a 0-dim view, outside autograd: the
// perturbations write through it with tensor ops, so inputs on any device work.
Tensor ElementAt(const Tensor& t, int64_t index) {
  int64_t offset = t.storage_offset();
  for (int64_t d = t.dim() - 1; d >= 0; --d) {
    offset += (index % t.sizes()[d]) * t.strides()[d];
    index /= t.sizes()[d];
  }
  BelowAutogradGuard below;
  return t.as_strided({}, {}, offset);
}

// Sets element `e` (from ElementAt) without recording.
void SetElement(const Tensor& e, double value) {
  NoGradGuard no_grad;
  BelowAutogradGuard below;
  e.fill_(value);
}

// The elements of `t`, read on the host.
std::vector<double> HostValues(const Tensor& t) { return testing::Values(t.to(kCPU)); }

bool SelfOverlapping(const Tensor& t) {
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.strides()[d] == 0 && t.sizes()[d] > 1) return true;
  }
  return false;
}

// The flattened values of every floating output.
std::vector<std::vector<double>> Evaluate(
    const std::function<variable_list(const variable_list&)>& fn, const variable_list& inputs) {
  NoGradGuard no_grad;
  std::vector<std::vector<double>> out;
  for (const Tensor& t : fn(inputs)) {
    out.push_back(t.defined() && t.is_floating_point() ? HostValues(t) : std::vector<double>());
  }
  return out;
}

}  // namespace

absl::Status gradcheck(const std::function<variable_list(const variable_list&)>& fn,
                       const variable_list& inputs, const GradcheckOptions& options) {
  std::vector<size_t> checked;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    if (!t.defined() || !t.requires_grad()) continue;
    if (t.dtype() != kFloat64) {
      return absl::InvalidArgumentError(
          absl::StrCat("gradcheck: input ", i, " is ", std::string(dtype_name(t.dtype())),
                       "; finite differences need float64 inputs (use .to(ember::kFloat64))"));
    }
    if (SelfOverlapping(t)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "gradcheck: input ", i, " of shape ", ShapeToString(t.sizes()), " and strides ",
          ShapeToString(t.strides()), " overlaps itself; pass a tensor that owns its elements"));
    }
    checked.push_back(i);
  }
  variable_list wrt;
  for (size_t i : checked) wrt.push_back(inputs[i]);

  variable_list outputs = fn(inputs);
  // Analytical Jacobian: analytical[o][k][c][j] = d out_o[k] / d input_c[j].
  std::vector<std::vector<std::vector<std::vector<double>>>> analytical(outputs.size());
  for (size_t o = 0; o < outputs.size(); ++o) {
    const Tensor& out = outputs[o];
    if (!out.defined() || !out.is_floating_point()) continue;
    if (!out.requires_grad()) {
      // Outside the graph: autograd says the Jacobian is zero; the finite
      // differences must agree (a backward that is not recorded fails here).
      std::vector<std::vector<double>> row;
      for (const Tensor& in : wrt) row.push_back(std::vector<double>(in.numel(), 0.0));
      analytical[o].assign(out.numel(), row);
      continue;
    }
    if (out.numel() == 0) {
      // Nothing to compare; backward must still run.
      grad({out}, wrt, {zeros_like(out)}, /*retain_graph=*/true, false, /*allow_unused=*/true);
      continue;
    }
    for (int64_t k = 0; k < out.numel(); ++k) {
      Tensor seed = zeros(out.sizes(), TensorOptions(out.dtype()).device(out.device()));
      seed.view({-1}).narrow(0, k, 1).fill_(1);
      variable_list grads = grad({out}, wrt, {seed}, /*retain_graph=*/true, false,
                                 /*allow_unused=*/true);
      std::vector<std::vector<double>> row;
      for (size_t c = 0; c < wrt.size(); ++c) {
        row.push_back(grads[c].defined() ? HostValues(grads[c])
                                         : std::vector<double>(wrt[c].numel(), 0.0));
        if (static_cast<int64_t>(row.back().size()) != wrt[c].numel()) {
          return absl::InternalError(absl::StrCat("gradcheck: the gradient of input ", checked[c],
                                                  " has ", row.back().size(),
                                                  " elements; the input has ", wrt[c].numel()));
        }
      }
      analytical[o].push_back(std::move(row));
    }
  }

  // Numerical Jacobian, one input element at a time.
  for (size_t c = 0; c < wrt.size(); ++c) {
    const Tensor& in = wrt[c];
    for (int64_t j = 0; j < in.numel(); ++j) {
      Tensor element = ElementAt(in, j);
      const double original = HostValues(element)[0];
      SetElement(element, original + options.eps);
      auto plus = Evaluate(fn, inputs);
      SetElement(element, original - options.eps);
      auto minus = Evaluate(fn, inputs);
      SetElement(element, original);
      for (size_t o = 0; o < outputs.size(); ++o) {
        if (analytical[o].empty()) continue;
        for (size_t k = 0; k < plus[o].size(); ++k) {
          const double numerical = (plus[o][k] - minus[o][k]) / (2 * options.eps);
          const double exact = analytical[o][k][c][j];
          if (std::abs(numerical - exact) > options.atol + options.rtol * std::abs(numerical)) {
            return absl::InternalError(absl::StrCat("gradcheck: Jacobian mismatch for output ", o,
                                                    " element ", k, " with respect to input ",
                                                    checked[c], " element ", j, ": numerical ",
                                                    numerical, ", analytical ", exact));
          }
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::Status gradgradcheck(const std::function<variable_list(const variable_list&)>& fn,
                           const variable_list& inputs, const GradcheckOptions& options) {
  const size_t n = inputs.size();
  variable_list all = inputs;
  {
    EnableGradGuard enable;
    for (const Tensor& out : fn(inputs)) {
      if (out.defined() && out.requires_grad()) {
        all.push_back((rand(out.sizes(), kFloat64) * 2 - 1).to(out.device()).requires_grad_());
      }
    }
  }
  auto first_derivatives = [&fn, n](const variable_list& args) {
    EnableGradGuard enable;
    variable_list in(args.begin(), args.begin() + n);
    variable_list outs, seeds, wrt;
    size_t next_seed = n;
    for (const Tensor& out : fn(in)) {
      if (!out.defined() || !out.requires_grad()) continue;
      outs.push_back(out);
      seeds.push_back(args[next_seed++].to(out.dtype()));
    }
    for (const Tensor& t : in) {
      if (t.defined() && t.requires_grad()) wrt.push_back(t);
    }
    variable_list grads = grad(outs, wrt, seeds, /*retain_graph=*/true, /*create_graph=*/true,
                               /*allow_unused=*/true);
    for (size_t c = 0; c < grads.size(); ++c) {
      if (!grads[c].defined()) grads[c] = zeros_like(wrt[c]);
    }
    return grads;
  };
  return gradcheck(first_derivatives, all, options);
}

}  // namespace ember::autograd
