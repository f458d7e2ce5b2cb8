#include "distributed/checkpoint/format_utils.h"

#include "distributed/checkpoint/checkpoint.h"
#include "serialization/serialization.h"
#include "serialization/state_dict.h"
#include "tensor/status_macros.h"

namespace ember::distributed::checkpoint {

absl::Status dcp_to_torch_save(const std::string& dcp_checkpoint_dir,
                               const std::string& torch_save_path) {
  EMBER_ASSIGN_OR_RETURN(ember::StateDict sd, load_full_state_dict(dcp_checkpoint_dir));
  return ember::save(sd, torch_save_path);
}

absl::Status torch_save_to_dcp(const std::string& torch_save_path,
                               const std::string& dcp_checkpoint_dir) {
  EMBER_ASSIGN_OR_RETURN(ember::StateDict sd, ember::load(torch_save_path));
  StateDict items;
  items.reserve(sd.size());
  for (auto& [key, tensor] : sd) items.push_back({key, replicated(tensor)});
  return save(items, {.path = dcp_checkpoint_dir});
}

}  // namespace ember::distributed::checkpoint
