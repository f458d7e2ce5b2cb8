// Checkpoint files: state dicts read from and written to disk in PyTorch's
// torch.save format or safetensors.
//
//   EMBER_ASSIGN_OR_RETURN(ember::hub::StateDict sd,
//   ember::hub::load_checkpoint("resnet18.pth"));
//   EMBER_RETURN_IF_ERROR(ember::hub::save_checkpoint(sd,
//   "/tmp/copy.safetensors"));
//
// LoadCheckpoint tells the formats apart by content (a torch.save file is a
// zip, starting "PK\3\4"); SaveCheckpoint picks safetensors for a
// ".safetensors" name and torch.save otherwise (.pt, .pth, .bin ...).
//
// Thread-safety: free functions; safe from any thread. SaveCheckpoint writes a
// temporary file beside `path` and renames it, so readers never see half a
// file.
#ifndef EMBER_HUB_CHECKPOINT_H_
#define EMBER_HUB_CHECKPOINT_H_

#include <string>

#include "absl/status/statusor.h"
#include "hub/state_dict.h"

namespace ember::hub {

// Reads the checkpoint at `path`. Errors: NotFound / Internal naming the path;
// the format readers' errors (torch_format.h, safetensors.h).
absl::StatusOr<StateDict> load_checkpoint(const std::string& path);

// Writes `state_dict` to `path` (see above). Errors: the writers' errors;
// Internal naming the path for file errors.
absl::Status save_checkpoint(const StateDict& state_dict,
                            const std::string& path);

}  // namespace ember::hub

#endif  // EMBER_HUB_CHECKPOINT_H_
