// Checkpoint files: state dicts read from and written to disk in PyTorch's
// torch.save format or safetensors.
//
//   ```cpp
//   #include <filesystem>
//   #include "hub/checkpoint.h"
//   #include "tensor/factories.h"
//   std::string dir = std::filesystem::temp_directory_path();
//   ember::hub::StateDict fc = {{"weight", ember::randn({2, 4})}, {"bias", ember::zeros({2})}};
//   EMBER_RETURN_IF_ERROR(ember::hub::save_checkpoint(fc, dir + "/fc.pth"));  // torch.save
//   EMBER_ASSIGN_OR_RETURN(ember::hub::StateDict sd, ember::hub::load_checkpoint(dir + "/fc.pth"));
//   EMBER_RETURN_IF_ERROR(ember::hub::save_checkpoint(sd, dir + "/copy.safetensors"));
//   ```
//
// load_checkpoint tells the formats apart by content (a torch.save file is a
// zip, starting "PK\3\4", or in the legacy format a pickle stream starting
// with torch.save's magic number); save_checkpoint picks safetensors for a
// ".safetensors" name and torch.save otherwise (.pt, .pth, .bin ...).
//
// Thread-safety: free functions; safe from any thread. save_checkpoint writes a
// temporary file beside `path` and renames it, so readers never see half a
// file.
#ifndef EMBER_HUB_CHECKPOINT_H_
#define EMBER_HUB_CHECKPOINT_H_

#include <string>

#include "absl/status/statusor.h"
#include "hub/state_dict.h"
#include "hub/torch_format.h"

namespace ember::hub {

// Reads the checkpoint at `path`, its tensors placed as `map_location`
// says (torch.load's map_location; torch_format.h): by default where they
// were saved (a torch.save file's storage locations; safetensors hold CPU
// tensors). Errors: NotFound / Internal naming the path; the format readers'
// errors (torch_format.h, safetensors.h), MapLocation::Resolve's.
absl::StatusOr<StateDict> load_checkpoint(const std::string& path,
                                          const MapLocation& map_location = {});

// Writes `state_dict` to `path` (see above); in torch.save's format, device
// tensors keep their device (torch_format.h). Errors: the writers' errors;
// Internal naming the path for file errors.
absl::Status save_checkpoint(const StateDict& state_dict, const std::string& path);

}  // namespace ember::hub

#endif  // EMBER_HUB_CHECKPOINT_H_
