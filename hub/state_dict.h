// StateDict: a model's named tensors in order, what torch's state_dict()
// returns and what checkpoints hold.
//
//   ```cpp
//   #include <filesystem>
//   #include "hub/checkpoint.h"
//   #include "hub/state_dict.h"
//   #include "tensor/factories.h"
//   ember::Tensor w = ember::randn({2, 4}), b = ember::zeros({2});
//   ember::hub::StateDict sd = {{"fc.weight", w}, {"fc.bias", b}};
//   std::string path = std::filesystem::temp_directory_path() / "fc.pt";
//   EMBER_RETURN_IF_ERROR(ember::hub::save_checkpoint(sd, path));  // checkpoint.h
//   ```
//
// An ordered list rather than a map: the order is the module's registration
// order and survives a round trip through either file format.
#ifndef EMBER_HUB_STATE_DICT_H_
#define EMBER_HUB_STATE_DICT_H_

#include <string>
#include <utility>
#include <vector>

#include "tensor/tensor.h"

namespace ember::hub {

using StateDict = std::vector<std::pair<std::string, Tensor>>;

// The most dimensions a tensor read from a checkpoint may have (model weights
// use a handful); a file claiming more is refused as malformed.
inline constexpr int kMaxCheckpointDims = 64;

}  // namespace ember::hub

#endif  // EMBER_HUB_STATE_DICT_H_
