#include "distributed/checkpoint/format_utils.h"

#include "distributed/checkpoint/checkpoint.h"
#include "hub/checkpoint.h"
#include "hub/state_dict.h"
#include "tensor/status_macros.h"

namespace ember::distributed::checkpoint {

absl::Status dcp_to_torch_save(const std::string& dcp_checkpoint_dir,
                               const std::string& torch_save_path) {
  EMBER_ASSIGN_OR_RETURN(hub::StateDict sd, load_full_state_dict(dcp_checkpoint_dir));
  return hub::save_checkpoint(sd, torch_save_path);
}

absl::Status torch_save_to_dcp(const std::string& torch_save_path,
                               const std::string& dcp_checkpoint_dir) {
  EMBER_ASSIGN_OR_RETURN(hub::StateDict sd, hub::load_checkpoint(torch_save_path));
  StateDict items;
  items.reserve(sd.size());
  for (auto& [key, tensor] : sd) items.push_back({key, replicated(tensor)});
  return save(items, {.path = dcp_checkpoint_dir});
}

}  // namespace ember::distributed::checkpoint
