// The safetensors format: an 8-byte little-endian header length, a JSON
// header mapping each tensor name to {"dtype", "shape", "data_offsets"} (plus
// an optional "__metadata__" of strings), then the tensors' bytes.
//
//   ```cpp
//   #include "serialization/safetensors.h"
//   #include "tensor/factories.h"
//   ember::StateDict sd = {{"weight", ember::ones({2, 2})}};
//   EMBER_ASSIGN_OR_RETURN(std::string file, ember::serialization::write_safetensors(sd));
//   EMBER_ASSIGN_OR_RETURN(ember::StateDict back,
//                          ember::serialization::read_safetensors(file, "model.safetensors"));
//   ```
//
// Reading checks what the format's specification requires: the header is
// valid JSON (and UTF-8) within the file, each byte range matches its dtype and shape,
// and the ranges cover the data exactly, without overlap or holes. Tensors
// come back in file order (their data offsets).
//
// Thread-safety: free functions; safe from any thread.
#ifndef EMBER_SERIALIZATION_SAFETENSORS_H_
#define EMBER_SERIALIZATION_SAFETENSORS_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "serialization/state_dict.h"

namespace ember::serialization {

// Parses safetensors `bytes`; `source` names the file in errors. Errors:
// InvalidArgument naming the tensor or header problem (including a header
// that is not UTF-8, a name holding NUL, more than kMaxCheckpointDims
// dimensions); Unimplemented for a dtype of the specification Ember lacks
// (C64, F8_*, U16/32/64 ...).
absl::StatusOr<StateDict> read_safetensors(absl::string_view bytes, absl::string_view source);

// The safetensors bytes of `state_dict`, in its order. Errors:
// InvalidArgument for a tensor not on the CPU or a duplicate name.
absl::StatusOr<std::string> write_safetensors(const StateDict& state_dict);

}  // namespace ember::serialization

#endif  // EMBER_SERIALIZATION_SAFETENSORS_H_
