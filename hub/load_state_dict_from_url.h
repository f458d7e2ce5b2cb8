// load_state_dict_from_url: PyTorch's way of fetching pretrained weights.
//
//   ```cpp compile-only
//   #include "hub/load_state_dict_from_url.h"
//   ember::hub::LoadFromUrlOptions opts;
//   opts.check_hash = true;  // "resnet18-f37072fd.pth": the SHA-256 starts f37072fd
//   EMBER_ASSIGN_OR_RETURN(
//       ember::StateDict sd,
//       ember::hub::load_state_dict_from_url(
//           "https://download.pytorch.org/models/resnet18-f37072fd.pth", opts));
//   ```
//
// The file is cached as <model_dir>/<file name> (model_dir defaults to
// <hub_dir>/checkpoints, see hub_dir.h) and reused while present. With
// check_hash, the hex digits after the first '-' and before the next '.' of
// the file name must begin the file's SHA-256: checked on download (a
// mismatch leaves no cache entry) and again before loading a cached file (a
// mismatch is an error and leaves the file for inspection). A lock file per
// checkpoint keeps concurrent loaders from downloading it twice.
//
// Thread-safety: safe from any thread and any process.
#ifndef EMBER_HUB_LOAD_STATE_DICT_FROM_URL_H_
#define EMBER_HUB_LOAD_STATE_DICT_FROM_URL_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "hub/download.h"
#include "serialization/state_dict.h"

namespace ember::hub {

struct LoadFromUrlOptions {
  // Where checkpoints are cached; empty: <hub_dir>/checkpoints.
  std::string model_dir;
  // A progress bar on stderr (only when it is a terminal).
  bool progress = true;
  // Check the SHA-256 prefix carried in the file name (see above).
  bool check_hash = false;
  // The cached file's name; empty: the last path component of the URL.
  std::string file_name;
  // When set, the file's SHA-256 must also start with this (hubconf weights).
  std::string sha256;
  DownloadOptions download;  // its progress and hash_prefix are set from the above
  absl::Duration lock_timeout = absl::Minutes(10);
};

// The hash prefix torch.hub reads from a file name ("name-<hex>.ext"), or ""
// when the name carries none.
std::string hash_prefix_from_file_name(const std::string& file_name);

// Downloads `url` into the cache unless already there and returns the cached
// file's path. Blocks on the network and on other loaders' locks. Errors:
// InvalidArgument (check_hash without a hash in the name, a URL with no file
// name, a scheme other than https/http, checked before the cache is looked
// at); DataLoss (hash mismatch, on download or of the cached file); the
// download's errors (download.h).
absl::StatusOr<std::string> download_checkpoint(const std::string& url,
                                                const LoadFromUrlOptions& options = {});

// download_checkpoint, then ember::load (serialization/serialization.h) on the file.
absl::StatusOr<StateDict> load_state_dict_from_url(const std::string& url,
                                                   const LoadFromUrlOptions& options = {});

}  // namespace ember::hub

#endif  // EMBER_HUB_LOAD_STATE_DICT_FROM_URL_H_
