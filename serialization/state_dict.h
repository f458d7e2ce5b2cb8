// StateDict: a model's named tensors in order, what torch's state_dict()
// returns, what nn::Module::state_dict() gives and what checkpoints hold.
// The one definition: nn/, serialization/ and hub/ all use this type.
//
//   ```cpp
//   #include <filesystem>
//   #include "serialization/serialization.h"
//   #include "serialization/state_dict.h"
//   #include "tensor/factories.h"
//   ember::Tensor w = ember::randn({2, 4}), b = ember::zeros({2});
//   ember::StateDict sd = {{"fc.weight", w}, {"fc.bias", b}};
//   std::string path = std::filesystem::temp_directory_path() / "fc.pt";
//   EMBER_RETURN_IF_ERROR(ember::save(sd, path));  // serialization.h
//   ```
//
// An ordered list rather than a map: the order is the module's registration
// order and survives a round trip through either file format.
#ifndef EMBER_SERIALIZATION_STATE_DICT_H_
#define EMBER_SERIALIZATION_STATE_DICT_H_

#include <string>
#include <utility>
#include <vector>

#include "tensor/tensor.h"

namespace ember {

using StateDict = std::vector<std::pair<std::string, Tensor>>;

}  // namespace ember

namespace ember::serialization {

// The most dimensions a tensor read from a checkpoint may have (model weights
// use a handful); a file claiming more is refused as malformed.
inline constexpr int kMaxCheckpointDims = 64;

}  // namespace ember::serialization

#endif  // EMBER_SERIALIZATION_STATE_DICT_H_
