// PyTorch's torch.save format for state_dicts: a zip holding
// <archive>/data.pkl (the pickled OrderedDict), <archive>/data/<key> (one
// record of raw little-endian bytes per storage) and <archive>/version.
// The legacy format (before PyTorch 1.6, or _use_new_zipfile_serialization=
// False) is read too: a sequence of pickles (magic number, protocol version,
// sys_info, the OrderedDict, its storage keys), then each storage's int64
// element count and bytes.
//
//   ```cpp
//   #include "hub/torch_format.h"
//   #include "tensor/factories.h"
//   ember::hub::StateDict sd = {{"fc.bias", ember::zeros({10})}};
//   EMBER_ASSIGN_OR_RETURN(std::string file, ember::hub::write_torch_checkpoint(sd));
//   EMBER_ASSIGN_OR_RETURN(ember::hub::StateDict back,
//                          ember::hub::read_torch_checkpoint(file, "resnet18.pth"));
//   ```
//
// Reading never executes anything: data.pkl runs on a restricted unpickler
// (Note [Restricted unpickler] in pickle.cc) and every tensor is checked
// against its storage record. Tensors that share a storage in the file share
// one Storage after loading, as in PyTorch. What Ember writes,
// torch.load(path, weights_only=True) reads (checked against python3-torch by
// checkpoint_test).
//
// Thread-safety: free functions; safe from any thread.
#ifndef EMBER_HUB_TORCH_FORMAT_H_
#define EMBER_HUB_TORCH_FORMAT_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "hub/state_dict.h"

namespace ember::hub {

// Whether `bytes` starts as a torch.save file (zip or legacy).
bool IsTorchCheckpoint(absl::string_view bytes);

// Parses a torch.save file (zip or legacy) held in `bytes`; `source` names
// it in errors. Errors: InvalidArgument (not a checkpoint, truncated,
// malformed pickle, geometry outside its storage, storage record of the
// wrong size); PermissionDenied (a global, callable or opcode a state_dict
// does not need); Unimplemented (a dtype or layout Ember lacks, such as
// complex64); DataLoss (a zip record's CRC does not match).
absl::StatusOr<StateDict> read_torch_checkpoint(std::string bytes, absl::string_view source);

// The torch.save bytes of `state_dict`, each tensor saved contiguous in its
// own storage. Errors: InvalidArgument for a tensor that is not on the CPU or
// a duplicate name; OutOfRange above 4 GiB (zip64 is not written).
absl::StatusOr<std::string> write_torch_checkpoint(const StateDict& state_dict);

}  // namespace ember::hub

#endif  // EMBER_HUB_TORCH_FORMAT_H_
