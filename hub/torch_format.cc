#include "hub/torch_format.h"

#include <cstring>
#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "hub/pickle.h"
#include "hub/printable.h"
#include "hub/zip.h"
#include "tensor/status_macros.h"

namespace ember::hub {

namespace {

// A legacy (pre-1.6) file: pickles, then each storage's element count
// (int64, little-endian) and bytes, in the order of the pickled key list.
absl::StatusOr<StateDict> ReadLegacyCheckpoint(absl::string_view bytes, absl::string_view source) {
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
    if (__builtin_mul_overflow(static_cast<uint64_t>(ref.numel), element_size(ref.dtype), &nbytes) ||
        __builtin_add_overflow(claimed, nbytes, &claimed) || claimed > bytes.size()) {
      return bad(absl::StrCat("storage '", escape_for_terminal(ref.key), "' claims ", ref.numel,
                              " ", std::string(dtype_name(ref.dtype)),
                              " elements, more than the file's ", bytes.size(), " bytes hold"));
    }
    Storage storage = Storage::Allocate(nbytes, GetCpuAllocator());
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
    if (nbytes > 0) std::memcpy(p.storage.data(), bytes.data() + pos, nbytes);
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

absl::StatusOr<StateDict> read_torch_checkpoint(std::string bytes, absl::string_view source) {
  if (IsLegacyTorchCheckpoint(bytes)) return ReadLegacyCheckpoint(bytes, source);
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
    Storage storage = Storage::Allocate(data.size(), GetCpuAllocator());
    if (!data.empty()) std::memcpy(storage.data(), data.data(), data.size());
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
    if (!tensor.defined() || !tensor.is_cpu()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "state_dict entry '", name, "' is ", tensor.defined() ? "not on the CPU" : "undefined",
          "; move it with .to(ember::kCPU) before saving"));
    }
    Tensor c = tensor.contiguous();
    pickled.push_back(PickledTensor{name, std::to_string(i), c.dtype(), c.numel(), 0,
                                    SizeVector(c.sizes().begin(), c.sizes().end()),
                                    SizeVector(c.strides().begin(), c.strides().end())});
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

}  // namespace ember::hub
