// Helpers for optimizers' state_dict conversions (private to nn/optim).
#ifndef EMBER_NN_OPTIM_STATE_UTIL_H_
#define EMBER_NN_OPTIM_STATE_UTIL_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tensor/tensor.h"

namespace ember::nn::optim::internal {

// Sets `*field` from `value` when `key` matches `name`; returns whether it did.
inline bool Assign(const std::string& key, double value, const char* name, double* field) {
  if (key != name) return false;
  *field = value;
  return true;
}
inline bool Assign(const std::string& key, double value, const char* name, bool* field) {
  if (key != name) return false;
  *field = value != 0.0;
  return true;
}

inline absl::Status UnknownOption(const std::string& key, const char* optimizer) {
  return absl::InvalidArgumentError(
      absl::StrCat("loaded state dict has an unknown ", optimizer, " option \"", key, "\""));
}

// A copy of a saved state tensor for `param`: same shape required, converted
// to the parameter's dtype and device.
inline absl::Status LoadStateTensor(const std::string& key, const Tensor& saved,
                                    const Tensor& param, Tensor* out) {
  if (!saved.defined() || saved.sizes() != param.sizes()) {
    return absl::InvalidArgumentError(
        absl::StrCat("loaded optimizer state \"", key, "\" has shape ",
                     saved.defined() ? ShapeToString(saved.sizes()) : std::string("(undefined)"),
                     " but its parameter has shape ", ShapeToString(param.sizes())));
  }
  *out = saved.detach().to(param.device()).to(param.dtype()).clone();
  return absl::OkStatus();
}

}  // namespace ember::nn::optim::internal

#endif  // EMBER_NN_OPTIM_STATE_UTIL_H_
