#include "serialization/serialization.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "serialization/safetensors.h"
#include "serialization/torch_format.h"
#include "tensor/error.h"
#include "tensor/status_macros.h"

namespace ember {

using serialization::IsTorchCheckpoint;
using serialization::read_safetensors;
using serialization::read_torch_checkpoint;
using serialization::write_safetensors;
using serialization::write_torch_checkpoint;

absl::StatusOr<StateDict> load(const std::string& path, const LoadOptions& options) {
  if (!options.weights_only) {
    return absl::InvalidArgumentError(absl::StrCat(
        "load(", path,
        "): weights_only = false would run the checkpoint's pickled Python, "
        "which Ember never does; Ember reads what torch.load(weights_only=True) reads (tensors, "
        "containers, numbers): leave weights_only at its default, true"));
  }
  const serialization::MapLocation& map_location = options.map_location;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    int err = errno;
    std::string msg = absl::StrCat("cannot open checkpoint ", path, ": ", std::strerror(err));
    return err == ENOENT ? absl::NotFoundError(msg) : absl::InternalError(msg);
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return absl::InternalError(absl::StrCat("error reading ", path));
  std::string bytes = std::move(buffer).str();
  if (IsTorchCheckpoint(bytes)) return read_torch_checkpoint(std::move(bytes), path, map_location);
  if (bytes.size() >= 9 && bytes[8] == '{') {
    EMBER_ASSIGN_OR_RETURN(StateDict sd, read_safetensors(bytes, path));
    // safetensors hold CPU tensors: they go where "cpu" maps to.
    EMBER_ASSIGN_OR_RETURN(const Device device, map_location.Resolve("cpu"));
    if (device.is_cpu()) return sd;
    try {
      for (auto& [name, tensor] : sd) tensor = tensor.to(device);
    } catch (const Error& e) {
      return absl::InternalError(
          absl::StrCat(path, ": cannot move its tensors to ", device.str(), ": ", e.what()));
    }
    return sd;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      path, " is neither a torch.save checkpoint (zip or legacy) nor a safetensors file"));
}

absl::Status save(const StateDict& state_dict, const std::string& path) {
  absl::StatusOr<std::string> bytes = absl::EndsWith(path, ".safetensors")
                                          ? write_safetensors(state_dict)
                                          : write_torch_checkpoint(state_dict);
  if (!bytes.ok()) return bytes.status();
  std::string tmp = absl::StrCat(path, ".partial");
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(bytes->data(), static_cast<std::streamsize>(bytes->size()));
    out.close();
    if (!out) {
      std::remove(tmp.c_str());
      return absl::InternalError(absl::StrCat("cannot write ", tmp, ": ", std::strerror(errno)));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    std::remove(tmp.c_str());
    return absl::InternalError(absl::StrCat("cannot write ", path, ": ", std::strerror(err)));
  }
  return absl::OkStatus();
}

}  // namespace ember
