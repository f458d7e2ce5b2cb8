#include "hub/torch_format.h"

#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "hub/pickle.h"
#include "hub/zip.h"
#include "tensor/status_macros.h"

namespace ember::hub {

absl::StatusOr<StateDict> ReadTorchCheckpoint(std::string bytes,
                                              absl::string_view source) {
  EMBER_ASSIGN_OR_RETURN(
      ZipReader zip, ZipReader::Open(std::move(bytes), std::string(source)));
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
  EMBER_ASSIGN_OR_RETURN(absl::string_view pickle,
                         zip.Read(prefix + "data.pkl"));
  StorageLoader load = [&](const StorageRef& ref) -> absl::StatusOr<Storage> {
    std::string record = absl::StrCat(prefix, "data/", ref.key);
    EMBER_ASSIGN_OR_RETURN(absl::string_view data, zip.Read(record));
    uint64_t want;
    if (__builtin_mul_overflow(static_cast<uint64_t>(ref.numel),
                               ElementSize(ref.dtype), &want) ||
        want != data.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": storage '", ref.key, "' should hold ",
                       ref.numel, " ", std::string(DtypeName(ref.dtype)),
                       " elements (", ref.numel * ElementSize(ref.dtype),
                       " bytes) but its record has ", data.size(), " bytes"));
    }
    Storage storage = Storage::Allocate(data.size(), GetCpuAllocator());
    if (!data.empty()) std::memcpy(storage.data(), data.data(), data.size());
    return storage;
  };
  return UnpickleStateDict(pickle, load, source);
}

absl::StatusOr<std::string> WriteTorchCheckpoint(const StateDict& state_dict) {
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
      return absl::InvalidArgumentError(
          absl::StrCat("state_dict entry '", name, "' is ",
                       tensor.defined() ? "not on the CPU" : "undefined",
                       "; move it with .to(ember::kCPU) before saving"));
    }
    Tensor c = tensor.contiguous();
    pickled.push_back(
        PickledTensor{name, std::to_string(i), c.dtype(), c.numel(), 0,
                      SizeVector(c.sizes().begin(), c.sizes().end()),
                      SizeVector(c.strides().begin(), c.strides().end())});
    contiguous.push_back(std::move(c));
  }
  ZipWriter zip;
  zip.Add("archive/data.pkl", PickleStateDict(pickled));
  zip.Add("archive/byteorder", "little");
  for (size_t i = 0; i < contiguous.size(); ++i) {
    const Tensor& c = contiguous[i];
    zip.Add(
        absl::StrCat("archive/data/", i),
        absl::string_view(static_cast<const char*>(c.raw_data()), c.nbytes()));
  }
  zip.Add("archive/version", "3\n");
  return std::move(zip).Finish();
}

}  // namespace ember::hub
