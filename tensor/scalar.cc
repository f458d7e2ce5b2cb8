#include "tensor/scalar.h"

#include "absl/strings/str_cat.h"

namespace ember {

std::string Scalar::str() const {
  if (kind_ == kBool) return i_ ? "True" : "False";
  if (kind_ == kInt64) return absl::StrCat(i_);
  return absl::StrCat(d_);
}

}  // namespace ember
