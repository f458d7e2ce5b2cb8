// Converters between a distributed checkpoint and one torch.save file, named
// as torch.distributed.checkpoint.format_utils names them. With PyTorch's own
// converters they carry checkpoints between Ember and
// torch.distributed.checkpoint in both directions:
//
//   Ember DCP --dcp_to_torch_save--> model.pt --torch's torch_save_to_dcp--> torch DCP
//   torch DCP --torch's dcp_to_torch_save--> model.pt --torch_save_to_dcp--> Ember DCP
//
//   ```cpp compile-only
//   #include "distributed/checkpoint/format_utils.h"
//   namespace dcp = ember::distributed::checkpoint;
//   EMBER_RETURN_IF_ERROR(dcp::dcp_to_torch_save("/ckpt/step100", "/tmp/model.pt"));
//   EMBER_RETURN_IF_ERROR(dcp::torch_save_to_dcp("/tmp/model.pt", "/ckpt/from_torch"));
//   ```
//
// Why a converter and not PyTorch's directory format itself: README.md,
// "PyTorch interoperability". The torch.save side is hub's reader and writer
// (serialization/serialization.h), the one place Ember reads and writes that format; the
// checkpoint core does not depend on hub.
//
// Both functions hold the whole state dict in memory (as PyTorch's do; run
// them on one rank). Errors: read_metadata's, load's and save's; hub's
// ember::load / ember::save errors for the torch.save file.
// Thread-safety: free functions.
#ifndef EMBER_DISTRIBUTED_CHECKPOINT_FORMAT_UTILS_H_
#define EMBER_DISTRIBUTED_CHECKPOINT_FORMAT_UTILS_H_

#include <string>

#include "absl/status/status.h"

namespace ember::distributed::checkpoint {

// Writes every tensor of the checkpoint at `dcp_checkpoint_dir`, whole, into
// one torch.save file (an OrderedDict in the checkpoint's key order) that
// torch.load(weights_only=True) reads.
absl::Status dcp_to_torch_save(const std::string& dcp_checkpoint_dir,
                               const std::string& torch_save_path);

// Saves the state dict of a torch.save file (or safetensors file) as a
// distributed checkpoint of one rank at `dcp_checkpoint_dir`.
absl::Status torch_save_to_dcp(const std::string& torch_save_path,
                               const std::string& dcp_checkpoint_dir);

}  // namespace ember::distributed::checkpoint

#endif  // EMBER_DISTRIBUTED_CHECKPOINT_FORMAT_UTILS_H_
