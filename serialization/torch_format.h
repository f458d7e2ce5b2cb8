// PyTorch's torch.save format for state_dicts: a zip holding
// <archive>/data.pkl (the pickled OrderedDict), <archive>/data/<key> (one
// record of raw little-endian bytes per storage) and <archive>/version.
// The legacy format (before PyTorch 1.6, or _use_new_zipfile_serialization=
// False) is read too: a sequence of pickles (magic number, protocol version,
// sys_info, the OrderedDict, its storage keys), then each storage's int64
// element count and bytes.
//
//   ```cpp
//   #include "serialization/torch_format.h"
//   #include "tensor/factories.h"
//   ember::StateDict sd = {{"fc.bias", ember::zeros({10})}};
//   EMBER_ASSIGN_OR_RETURN(std::string file, ember::serialization::write_torch_checkpoint(sd));
//   EMBER_ASSIGN_OR_RETURN(ember::StateDict back,
//                          ember::serialization::read_torch_checkpoint(file, "resnet18.pth"));
//   ```
//
// Reading never executes anything: data.pkl runs on a restricted unpickler
// (Note [Restricted unpickler] in pickle.cc) and every tensor is checked
// against its storage record. Tensors that share a storage in the file share
// one Storage after loading, as in PyTorch. What Ember writes,
// torch.load(path, weights_only=True) reads (checked against python3-torch by
// serialization_test).
//
// Devices: as torch.save, each storage keeps the device it was saved from
// in its location tag ("cpu", "cuda:1"), and reading puts it back there
// unless a MapLocation (torch.load's map_location) says otherwise. A CUDA
// location needs a usable CUDA device (//cuda linked) of that index, or
// reading fails with PyTorch's message (Note [Storage locations] in
// torch_format.cc).
//
// Thread-safety: free functions; safe from any thread. MapLocation is a
// value type; its callable, if any, must be safe to call from the reading
// thread.
#ifndef EMBER_SERIALIZATION_TORCH_FORMAT_H_
#define EMBER_SERIALIZATION_TORCH_FORMAT_H_

#include <functional>
#include <map>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "serialization/state_dict.h"
#include "tensor/device.h"

namespace ember::serialization {

// Where a checkpoint's storages go when it is read (torch.load's
// map_location), in the forms torch.load takes:
//
//   ember::load(path)                                  // where they were saved
//   ember::load(path, {.map_location = ember::kCPU})   // torch.device('cpu')
//   ember::load(path, {.map_location = "cuda:1"})      // map_location='cuda:1'
//   ember::load(path, {.map_location = MapLocation::Remap({{"cuda:1", "cuda:0"}})})  // a dict
//   ember::load(path, {.map_location = MapLocation::Callable(  // a callable
//       [](absl::string_view location) -> std::optional<ember::Device> {
//         return ember::kCPU;  // std::nullopt: where it was saved
//       })});
class MapLocation {
 public:
  using Fn = std::function<std::optional<Device>(absl::string_view location)>;

  // Each storage to the device it was saved from.
  MapLocation() = default;
  // Every storage to `device`.
  MapLocation(Device device);  // NOLINT: as torch.load(map_location=device)
  // Every storage to the device `device` names ("cpu", "cuda", "cuda:N");
  // a string that names none is an InvalidArgument error when reading.
  MapLocation(absl::string_view device);                                       // NOLINT
  MapLocation(const char* device) : MapLocation(absl::string_view(device)) {}  // NOLINT
  // Storages saved at a key's location go to its value's; others stay
  // where they were saved.
  static MapLocation Remap(std::map<std::string, std::string> locations);
  // `fn(location)` says where each storage goes; nullopt keeps its own.
  static MapLocation Callable(Fn fn);

  // Where a storage saved at `location` goes, checked: InvalidArgument for
  // a location (or mapped string) that names no device; for a CUDA device,
  // FailedPrecondition when CUDA is not usable, InvalidArgument for an index
  // past the device count (PyTorch's messages).
  absl::StatusOr<Device> Resolve(absl::string_view location) const;

 private:
  enum class Kind { kSaved, kDevice, kRemap, kCallable };
  Kind kind_ = Kind::kSaved;
  std::string device_;  // kDevice
  std::map<std::string, std::string> remap_;
  Fn fn_;
};

// Whether `bytes` starts as a torch.save file (zip or legacy).
bool IsTorchCheckpoint(absl::string_view bytes);

// Parses a torch.save file (zip or legacy) held in `bytes`; `source` names
// it in errors. Errors: InvalidArgument (not a checkpoint, truncated,
// malformed pickle, geometry outside its storage, storage record of the
// wrong size); PermissionDenied (a global, callable or opcode a state_dict
// does not need); Unimplemented (a dtype or layout Ember lacks, such as
// complex64); DataLoss (a zip record's CRC does not match).
// Each storage goes where `map_location` says; MapLocation::Resolve's
// errors, and the device's when copying to it fails (kInternal).
absl::StatusOr<StateDict> read_torch_checkpoint(std::string bytes, absl::string_view source,
                                                const MapLocation& map_location = {});

// The torch.save bytes of `state_dict`, each tensor saved contiguous in its
// own storage, with its device as the storage's location ("cuda:0"; the
// bytes of a device tensor are copied to the host, waiting for them).
// Errors: InvalidArgument for an undefined tensor or a duplicate name;
// OutOfRange above 4 GiB (zip64 is not written).
absl::StatusOr<std::string> write_torch_checkpoint(const StateDict& state_dict);

}  // namespace ember::serialization

#endif  // EMBER_SERIALIZATION_TORCH_FORMAT_H_
