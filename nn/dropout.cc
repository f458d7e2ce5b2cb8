#include "nn/dropout.h"

#include "absl/strings/str_cat.h"
#include "tensor/error.h"

namespace ember::nn {
namespace {

void CheckP(double p) {
  EMBER_CHECK(p >= 0.0 && p <= 1.0, "dropout probability has to be between 0 and 1, but got ", p);
}

}  // namespace

namespace functional {

Tensor dropout(const Tensor& input, double p, bool training, Generator* gen) {
  CheckP(p);
  if (!training || p == 0.0) return input;
  EMBER_CHECK(input.is_floating_point(), "dropout: expected a floating point input, got ",
              dtype_name(input.dtype()));
  if (p == 1.0) return input * 0.0;
  // The mask is drawn where the input lives (Note [Random numbers] in
  // tensor/factories.h): on a CUDA device by its Philox generator.
  Tensor keep = bernoulli_(empty_like(input), 1.0 - p, gen);
  return input * (keep * (1.0 / (1.0 - p)));
}

}  // namespace functional

Dropout::Dropout(double p) : p_(p) { CheckP(p); }

std::string Dropout::extra_repr() const { return absl::StrCat("p=", p_, ", inplace=False"); }

}  // namespace ember::nn
