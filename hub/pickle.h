// The pickle program inside a torch.save checkpoint (archive/data.pkl), read
// by a restricted unpickler and written by a small pickler. Internal to
// torch_format.cc; see Note [Restricted unpickler] in pickle.cc.
//
// Thread-safety: free functions; safe from any thread.
#ifndef EMBER_HUB_PICKLE_H_
#define EMBER_HUB_PICKLE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "hub/state_dict.h"
#include "tensor/dtype.h"
#include "tensor/shape.h"
#include "tensor/storage.h"

namespace ember::hub {

// A storage a checkpoint's pickle refers to by persistent id.
struct StorageRef {
  std::string key;  // record archive/data/<key>
  Dtype dtype;
  int64_t numel;  // elements, as the pickle claims
};

// Returns the storage `ref` names, with exactly numel * ElementSize(dtype)
// bytes; called once per distinct key.
using StorageLoader =
    std::function<absl::StatusOr<Storage>(const StorageRef& ref)>;

// Runs the restricted unpickler over `pickle` and returns the state dict it
// builds. Errors: PermissionDenied naming a refused global, callable or
// opcode; InvalidArgument for malformed programs, geometry that does not fit
// its storage, or a result that is not a mapping of names to tensors;
// whatever `load` returns. `source` names the file in messages.
absl::StatusOr<StateDict> UnpickleStateDict(absl::string_view pickle,
                                            const StorageLoader& load,
                                            absl::string_view source);

// One tensor as torch.save records it.
struct PickledTensor {
  std::string name;
  std::string storage_key;
  Dtype dtype;
  int64_t storage_numel;
  int64_t storage_offset;
  SizeVector sizes;
  SizeVector strides;
};

// The protocol-2 pickle of an OrderedDict of `tensors`, as torch.save writes
// a state_dict.
std::string PickleStateDict(const std::vector<PickledTensor>& tensors);

}  // namespace ember::hub

#endif  // EMBER_HUB_PICKLE_H_
