// The pickle programs inside torch.save checkpoints (archive/data.pkl of the
// zip format; the sequence of pickles of the legacy format), read by a
// restricted unpickler and written by a small pickler. Internal to
// torch_format.cc; see Note [Restricted unpickler] and Note [Pickle values
// without recursion] in pickle.cc.
//
// Thread-safety: free functions; safe from any thread.
#ifndef EMBER_SERIALIZATION_PICKLE_H_
#define EMBER_SERIALIZATION_PICKLE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "serialization/state_dict.h"
#include "tensor/dtype.h"
#include "tensor/shape.h"
#include "tensor/storage.h"

namespace ember::serialization {

// The deepest nesting of tuples, lists and dicts a pickle may build (a
// state_dict nests a few levels; Python's own pickler stops near 1000, its
// recursion limit). Deeper programs are an InvalidArgument error.
inline constexpr int kMaxPickleNesting = 1000;

// A storage a checkpoint's pickle refers to by persistent id.
struct StorageRef {
  std::string key;  // record archive/data/<key>
  Dtype dtype;
  int64_t numel;         // elements, as the pickle claims
  std::string location;  // where it was saved: "cpu", "cuda:0" (torch's location tag)
};

// Returns the storage `ref` names, with exactly numel * element_size(dtype)
// bytes; called once per distinct key.
using StorageLoader = std::function<absl::StatusOr<Storage>(const StorageRef& ref)>;

// Runs the restricted unpickler over `pickle` and returns the state dict it
// builds. Errors: PermissionDenied naming a refused global, callable or
// opcode; Unimplemented naming a dtype or tensor layout Ember lacks
// (complex64, quantized, sparse); InvalidArgument for malformed programs,
// nesting past kMaxPickleNesting, more than kMaxCheckpointDims dimensions,
// geometry that does not fit its storage, or a result that is not a mapping
// of names to tensors; whatever `load` returns. `source` names the file in
// messages.
absl::StatusOr<StateDict> unpickle_state_dict(absl::string_view pickle, const StorageLoader& load,
                                              absl::string_view source);

// Whether `bytes` starts as a legacy (pre-1.6, non-zip) torch.save file:
// a pickled magic number 0x1950a86a20f9469cfc6c.
bool IsLegacyTorchCheckpoint(absl::string_view bytes);

// The pickles of a legacy torch.save file, which precede its storages' bytes.
struct LegacyPickles {
  StateDict state_dict;                   // views of the storages `load` returned
  std::vector<std::string> storage_keys;  // in the order their bytes follow
  size_t data_offset = 0;                 // where the first storage's record starts
};

// Reads the magic number, protocol version (1001), sys_info (little-endian
// only), the pickled state dict (persistent ids ('storage', type, key,
// location, numel, None)) and the list of storage keys, with the same rules
// as unpickle_state_dict. `load` is called once per distinct storage, before
// any of their bytes are read. Errors: as unpickle_state_dict; Unimplemented
// for big-endian files and storage views (PyTorch before 0.4).
absl::StatusOr<LegacyPickles> unpickle_legacy_checkpoint(absl::string_view bytes,
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
  std::string location = "cpu";  // the storage's device, as torch's location tag
};

// The protocol-2 pickle of an OrderedDict of `tensors`, as torch.save writes
// a state_dict.
std::string pickle_state_dict(const std::vector<PickledTensor>& tensors);

}  // namespace ember::serialization

#endif  // EMBER_SERIALIZATION_PICKLE_H_
