// torch.save / torch.load for state dicts: ember::save writes a StateDict in
// PyTorch's torch.save format or as safetensors; ember::load reads either
// back, its tensors placed as map_location says.
//
//   ```cpp
//   #include <filesystem>
//   #include "serialization/serialization.h"
//   #include "tensor/factories.h"
//   std::string dir = std::filesystem::temp_directory_path();
//   ember::StateDict fc = {{"weight", ember::randn({2, 4})}, {"bias", ember::zeros({2})}};
//   EMBER_RETURN_IF_ERROR(ember::save(fc, dir + "/fc.pth"));  // torch.save
//   EMBER_ASSIGN_OR_RETURN(ember::StateDict sd, ember::load(dir + "/fc.pth"));
//   EMBER_ASSIGN_OR_RETURN(ember::StateDict on_cpu,
//                          ember::load(dir + "/fc.pth", {.map_location = "cpu"}));
//   EMBER_RETURN_IF_ERROR(ember::save(sd, dir + "/copy.safetensors"));
//   ```
//
// load tells the formats apart by content (a torch.save file is a zip,
// starting "PK\3\4", or in the legacy format a pickle stream starting with
// torch.save's magic number); save picks safetensors for a ".safetensors"
// name and torch.save otherwise (.pt, .pth, .bin ...).
//
// weights_only: Ember's reader is always what torch.load(weights_only=True)
// is, PyTorch's default since 2.6: the pickle runs on a restricted unpickler
// that builds tensors, containers and numbers and nothing else (Note
// [Restricted unpickler] in pickle.cc). weights_only = false asks to run
// arbitrary pickled Python, which Ember never does; it is refused rather
// than silently ignored.
//
// Thread-safety: free functions; safe from any thread. save writes a
// temporary file beside `path` and renames it, so readers never see half a
// file.
#ifndef EMBER_SERIALIZATION_SERIALIZATION_H_
#define EMBER_SERIALIZATION_SERIALIZATION_H_

#include <string>

#include "absl/status/statusor.h"
#include "serialization/state_dict.h"
#include "serialization/torch_format.h"

namespace ember {

// torch.load's keyword arguments, with its defaults.
struct LoadOptions {
  // Where the tensors go (torch_format.h): by default where they were saved
  // (a torch.save file's storage locations; safetensors hold CPU tensors).
  serialization::MapLocation map_location;
  // Must stay true (see above): false is InvalidArgument.
  bool weights_only = true;
};

// Reads the checkpoint at `path`, placed as options.map_location says.
// Errors: NotFound / Internal naming the path; InvalidArgument for
// weights_only = false; the format readers' errors (torch_format.h,
// safetensors.h), MapLocation::Resolve's.
absl::StatusOr<StateDict> load(const std::string& path, const LoadOptions& options = {});

// Writes `state_dict` to `path` (see above); in torch.save's format, device
// tensors keep their device (torch_format.h). Errors: the writers' errors;
// Internal naming the path for file errors.
absl::Status save(const StateDict& state_dict, const std::string& path);

}  // namespace ember

#endif  // EMBER_SERIALIZATION_SERIALIZATION_H_
