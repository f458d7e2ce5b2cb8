#include "serialization/torch_format.h"

#include <cstring>
#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "serialization/pickle.h"
#include "serialization/printable.h"
#include "serialization/zip.h"
#include "tensor/device_guard.h"
#include "tensor/error.h"
#include "tensor/factories.h"
#include "tensor/ops.h"
#include "tensor/status_macros.h"

namespace ember::serialization {

// Note [Storage locations]
// torch.save records each storage's device as a location tag, "cpu" or
// "cuda:N" (torch.serialization.location_tag), and torch.load restores it
// there (default_restore_location), after map_location had its say: a
// device or a string sends every storage there, a dict renames location
// tags, a callable decides per storage (None: the default). A CUDA location
// is validated as torch's validate_cuda_device does, with its messages, so
// that a checkpoint saved on a GPU machine and read on a CPU-only one fails
// with the advice PyTorch users know. Ember reads each storage's bytes on
// the host and copies them to the device the storage resolves to (waiting
// for the copy); writing copies a device tensor's bytes to the host and
// tags its storage with the tensor's device.

MapLocation::MapLocation(Device device) : kind_(Kind::kDevice), device_(device.str()) {}

MapLocation::MapLocation(absl::string_view device) : kind_(Kind::kDevice), device_(device) {}

MapLocation MapLocation::Remap(std::map<std::string, std::string> locations) {
  MapLocation m;
  m.kind_ = Kind::kRemap;
  m.remap_ = std::move(locations);
  return m;
}

MapLocation MapLocation::Callable(Fn fn) {
  MapLocation m;
  m.kind_ = Kind::kCallable;
  m.fn_ = std::move(fn);
  return m;
}

namespace {

absl::StatusOr<Device> ParseLocation(absl::string_view text, absl::string_view what) {
  absl::StatusOr<Device> d = Device::parse(std::string_view(text.data(), text.size()));
  if (!d.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " '", escape_for_terminal(text),
                                                   "' names no device: ", d.status().message()));
  }
  return d;
}

// torch.serialization.validate_cuda_device, with its messages.
absl::Status ValidateDevice(Device device) {
  if (!device.is_cuda()) return absl::OkStatus();
  const int count = device_count(DeviceType::kCUDA);
  if (count == 0) {
    return absl::FailedPreconditionError(
        "Attempting to deserialize object on a CUDA device but torch.cuda.is_available() is "
        "False. If you are running on a CPU-only machine, please use torch.load with "
        "map_location=torch.device('cpu') to map your storages to the CPU. (Ember: "
        "ember::load(path, {.map_location = ember::kCPU}), or link //cuda on a machine with a "
        "GPU.)");
  }
  if (device.index() >= count) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Attempting to deserialize object on CUDA device ", device.index(),
        " but torch.cuda.device_count() is ", count,
        ". Please use torch.load with map_location to map your storages to an existing "
        "device."));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Device> MapLocation::Resolve(absl::string_view location) const {
  EMBER_ASSIGN_OR_RETURN(const Device saved, ParseLocation(location, "storage location"));
  Device device = saved;
  switch (kind_) {
    case Kind::kSaved:
      break;
    case Kind::kDevice: {
      EMBER_ASSIGN_OR_RETURN(device, ParseLocation(device_, "map_location"));
      break;
    }
    case Kind::kRemap: {
      auto it = remap_.find(std::string(location));
      if (it != remap_.end()) {
        EMBER_ASSIGN_OR_RETURN(
            device, ParseLocation(it->second, absl::StrCat("map_location['", location, "']")));
      }
      break;
    }
    case Kind::kCallable: {
      if (std::optional<Device> d = fn_(location)) device = *d;
      break;
    }
  }
  EMBER_RETURN_IF_ERROR(ValidateDevice(device));
  return device;
}

namespace {

// `nbytes` bytes of storage on `device` (a fresh tensor's, so a device
// index is made current while allocating).
absl::StatusOr<Storage> AllocateOn(Device device, size_t nbytes) {
  if (device.is_cpu()) return Storage::Allocate(nbytes, GetCpuAllocator());
  try {
    return EmptyTensor({static_cast<int64_t>(nbytes)}, kUInt8, device).storage();
  } catch (const Error& e) {
    return absl::InternalError(
        absl::StrCat("cannot allocate ", nbytes, " bytes on ", device.str(), ": ", e.what()));
  }
}

// Copies `data` into the start of `storage` (host memory or a device's).
absl::Status FillStorage(const Storage& storage, absl::string_view data) {
  if (data.empty()) return absl::OkStatus();
  if (storage.device().is_cpu()) {
    std::memcpy(storage.data(), data.data(), data.size());
    return absl::OkStatus();
  }
  try {
    const int64_t n = static_cast<int64_t>(data.size());
    Tensor dst(MakeTensorImpl(storage, kUInt8, SizeVector{n}, SizeVector{1}, 0));
    dst.copy_(from_blob(const_cast<char*>(data.data()), {n}, TensorOptions(kUInt8)));
  } catch (const Error& e) {
    return absl::InternalError(absl::StrCat("cannot copy ", data.size(), " bytes to ",
                                            storage.device().str(), ": ", e.what()));
  }
  return absl::OkStatus();
}

// A legacy (pre-1.6) file: pickles, then each storage's element count
// (int64, little-endian) and bytes, in the order of the pickled key list.
absl::StatusOr<StateDict> ReadLegacyCheckpoint(absl::string_view bytes, absl::string_view source,
                                               const MapLocation& map_location) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": not a readable legacy torch.save file: ", why));
  };
  struct Pending {
    StorageRef ref;
    Storage storage;
    bool filled = false;
  };
  std::map<std::string, Pending> storages;
  uint64_t claimed = 0;  // bytes all storages need; the file must hold them
  StorageLoader load = [&](const StorageRef& ref) -> absl::StatusOr<Storage> {
    uint64_t nbytes;
    if (__builtin_mul_overflow(static_cast<uint64_t>(ref.numel), element_size(ref.dtype),
                               &nbytes) ||
        __builtin_add_overflow(claimed, nbytes, &claimed) || claimed > bytes.size()) {
      return bad(absl::StrCat("storage '", escape_for_terminal(ref.key), "' claims ", ref.numel,
                              " ", std::string(dtype_name(ref.dtype)),
                              " elements, more than the file's ", bytes.size(), " bytes hold"));
    }
    EMBER_ASSIGN_OR_RETURN(const Device device, map_location.Resolve(ref.location));
    EMBER_ASSIGN_OR_RETURN(Storage storage, AllocateOn(device, nbytes));
    storages.emplace(ref.key, Pending{ref, storage});
    return storage;
  };
  EMBER_ASSIGN_OR_RETURN(LegacyPickles pickles, unpickle_legacy_checkpoint(bytes, load, source));
  size_t pos = pickles.data_offset;
  for (const std::string& key : pickles.storage_keys) {
    auto it = storages.find(key);
    if (it == storages.end()) {
      return bad(
          absl::StrCat("storage '", escape_for_terminal(key), "' is listed but no tensor uses it"));
    }
    Pending& p = it->second;
    if (p.filled)
      return bad(absl::StrCat("storage '", escape_for_terminal(key), "' is listed twice"));
    int64_t numel;
    if (bytes.size() - pos < sizeof(numel)) return bad("truncated in its storage records");
    std::memcpy(&numel, bytes.data() + pos, sizeof(numel));
    pos += sizeof(numel);
    if (numel != p.ref.numel) {
      return bad(absl::StrCat("storage '", escape_for_terminal(key), "' should hold ", p.ref.numel,
                              " elements but its record says ", numel));
    }
    const size_t nbytes = p.storage.nbytes();
    if (bytes.size() - pos < nbytes) {
      return bad(
          absl::StrCat("truncated in the bytes of storage '", escape_for_terminal(key), "'"));
    }
    EMBER_RETURN_IF_ERROR(FillStorage(p.storage, bytes.substr(pos, nbytes)));
    pos += nbytes;
    p.filled = true;
  }
  for (const auto& [key, p] : storages) {
    if (!p.filled)
      return bad(absl::StrCat("storage '", escape_for_terminal(key), "' has no record"));
  }
  if (pos != bytes.size()) {
    return bad(absl::StrCat(bytes.size() - pos, " bytes follow the last storage record"));
  }
  return std::move(pickles.state_dict);
}

}  // namespace

bool IsTorchCheckpoint(absl::string_view bytes) {
  return absl::StartsWith(bytes, "PK\x03\x04") || IsLegacyTorchCheckpoint(bytes);
}

absl::StatusOr<StateDict> read_torch_checkpoint(std::string bytes, absl::string_view source,
                                                const MapLocation& map_location) {
  if (IsLegacyTorchCheckpoint(bytes)) return ReadLegacyCheckpoint(bytes, source, map_location);
  EMBER_ASSIGN_OR_RETURN(ZipReader zip, ZipReader::open(std::move(bytes), std::string(source)));
  // Records live under one top folder, named after the file torch.save wrote.
  std::string prefix;
  for (const std::string& name : zip.names()) {
    size_t slash = name.find('/');
    if (slash != std::string::npos && name.substr(slash + 1) == "data.pkl") {
      prefix = name.substr(0, slash + 1);
      break;
    }
  }
  if (prefix.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source,
                     ": no <archive>/data.pkl record; this is a zip but not a "
                     "torch.save checkpoint"));
  }
  EMBER_ASSIGN_OR_RETURN(absl::string_view pickle, zip.read(prefix + "data.pkl"));
  StorageLoader load = [&](const StorageRef& ref) -> absl::StatusOr<Storage> {
    std::string record = absl::StrCat(prefix, "data/", ref.key);
    EMBER_ASSIGN_OR_RETURN(absl::string_view data, zip.read(record));
    uint64_t want;
    if (__builtin_mul_overflow(static_cast<uint64_t>(ref.numel), element_size(ref.dtype), &want) ||
        want != data.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": storage '", ref.key, "' should hold ", ref.numel, " ",
          std::string(dtype_name(ref.dtype)), " elements (", ref.numel * element_size(ref.dtype),
          " bytes) but its record has ", data.size(), " bytes"));
    }
    EMBER_ASSIGN_OR_RETURN(const Device device, map_location.Resolve(ref.location));
    EMBER_ASSIGN_OR_RETURN(Storage storage, AllocateOn(device, data.size()));
    EMBER_RETURN_IF_ERROR(FillStorage(storage, data));
    return storage;
  };
  return unpickle_state_dict(pickle, load, source);
}

absl::StatusOr<std::string> write_torch_checkpoint(const StateDict& state_dict) {
  std::vector<PickledTensor> pickled;
  std::vector<Tensor> contiguous;
  std::set<std::string> names;
  for (size_t i = 0; i < state_dict.size(); ++i) {
    const auto& [name, tensor] = state_dict[i];
    if (!names.insert(name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("state_dict entry '", name, "' appears twice"));
    }
    if (!tensor.defined()) {
      return absl::InvalidArgumentError(absl::StrCat("state_dict entry '", name, "' is undefined"));
    }
    // The bytes on the host; the location tag keeps the device (Note
    // [Storage locations]).
    Tensor c;
    try {
      c = tensor.contiguous().cpu();
    } catch (const Error& e) {
      return absl::InternalError(absl::StrCat("state_dict entry '", name, "' on ",
                                              tensor.device().str(),
                                              " could not be copied to the host: ", e.what()));
    }
    pickled.push_back(PickledTensor{name, std::to_string(i), c.dtype(), c.numel(), 0,
                                    SizeVector(c.sizes().begin(), c.sizes().end()),
                                    SizeVector(c.strides().begin(), c.strides().end()),
                                    tensor.device().str()});
    contiguous.push_back(std::move(c));
  }
  ZipWriter zip;
  zip.add("archive/data.pkl", pickle_state_dict(pickled));
  zip.add("archive/byteorder", "little");
  for (size_t i = 0; i < contiguous.size(); ++i) {
    const Tensor& c = contiguous[i];
    zip.add(absl::StrCat("archive/data/", i),
            absl::string_view(static_cast<const char*>(c.raw_data()), c.nbytes()));
  }
  zip.add("archive/version", "3\n");
  return std::move(zip).finish();
}

}  // namespace ember::serialization
