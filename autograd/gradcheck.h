// Gradient checking (testonly): compares the Jacobian that autograd computes
// with one from central finite differences in float64, as
// torch.autograd.gradcheck does.
//
//   ```cpp
//   #include "autograd/gradcheck.h"
//   #include "tensor/factories.h"
//   using ember::autograd::variable_list;
//   ember::Tensor x = ember::randn({3, 4}, ember::kFloat64).requires_grad_();
//   EMBER_RETURN_IF_ERROR(ember::autograd::gradcheck(
//       [](const variable_list& in) { return variable_list{in[0].tanh()}; }, {x}));
//   ```
//
// For each input that requires grad and each of its elements, the input is
// perturbed by +-eps in place (through its strides, so non-contiguous inputs
// work) and `fn` re-run without grad; for each output element, autograd's
// grad() gives one row of the analytical Jacobian. Entries must agree within
// atol + rtol * |numerical|. A floating output that does not require grad
// has a zero analytical Jacobian, which the differences must confirm. Empty
// inputs and outputs are run through forward and backward too (nothing to
// compare, but nothing may fail).
//
// Inputs may live on any device: elements are perturbed with tensor ops
// (a no-grad fill_ of a 0-dim view) and values are read back on the host, so
// the same check runs on cuda:N (nn/device_ops_test.cc).
// Inputs must be float64 (float32 differences are too coarse) and must not
// overlap themselves (an expanded tensor would perturb several elements at
// once); violations are reported as InvalidArgument. A mismatch is reported
// as an Internal error naming the output, input, element and both values.
// Blocking: calls fn and backward on the calling thread (device nodes run on
// their device's worker, Note [Engine]).
#ifndef EMBER_AUTOGRAD_GRADCHECK_H_
#define EMBER_AUTOGRAD_GRADCHECK_H_

#include <functional>

#include "absl/status/status.h"
#include "autograd/node.h"
#include "tensor/tensor.h"

namespace ember::autograd {

struct GradcheckOptions {
  double eps = 1e-6;
  double atol = 1e-5;
  double rtol = 1e-3;
};

absl::Status gradcheck(const std::function<variable_list(const variable_list&)>& fn,
                       const variable_list& inputs, const GradcheckOptions& options = {});

// Second derivatives, as torch.autograd.gradgradcheck: fixed random float64
// gradients are drawn for `fn`'s differentiable outputs, and Gradcheck is run
// on the function (inputs, output gradients) -> first derivatives of `fn`
// computed with create_graph. So the backward of every backward formula is
// checked, with respect to the inputs and to the incoming gradients. Same
// input rules and errors as Gradcheck.
absl::Status gradgradcheck(const std::function<variable_list(const variable_list&)>& fn,
                           const variable_list& inputs, const GradcheckOptions& options = {});

}  // namespace ember::autograd

#endif  // EMBER_AUTOGRAD_GRADCHECK_H_
