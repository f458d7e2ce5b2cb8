// The hub directory: where fetched repositories and downloaded weights live.
//
//   ```cpp
//   #include <filesystem>
//   #include "hub/hub_dir.h"
//   ember::hub::set_dir(std::filesystem::temp_directory_path() / "hub");  // highest precedence
//   EMBER_ASSIGN_OR_RETURN(std::string dir, ember::hub::get_dir());  // created if missing
//   ember::hub::set_dir("");  // back to the variables below
//   ```
//
// get_dir() answers, in this order (torch.hub.get_dir's variables first):
//   1. the directory given to set_dir();
//   2. $TORCH_HUB_DIR (Ember's own variable, where PyTorch's deprecated
//      $TORCH_HUB used to sit);
//   3. $TORCH_HOME/hub;
//   4. $XDG_CACHE_HOME/torch/hub;
//   5. ~/.torch/hub when that directory exists;
//   6. ~/.cache/torch/hub when that directory exists (PyTorch >= 1.1's
//      default: a PyTorch user's fetched repositories and weights stay in
//      use);
//   7. ~/.torch/hub, created (the documented fallback of the torch.hub this
//      project mirrors, and PyTorch 1.0's default).
// Note [Hub directory fallback]: 5 comes before 6 so that a directory Ember
// chose once stays chosen: once step 7 has created ~/.torch/hub, a later
// PyTorch run creating ~/.cache/torch/hub does not move Ember's cache.
// Empty variables count as unset; a leading "~/" in them means $HOME. It
// creates the directory (and its parents) when missing.
//
// Layout inside it:
//   <owner>_<repo>_<ref>/   a fetched repository (repo_cache.h)
//   checkpoints/            weights from load_state_dict_from_url.h
//
// Thread-safety: set_dir and get_dir may be called from any thread.
#ifndef EMBER_HUB_HUB_DIR_H_
#define EMBER_HUB_HUB_DIR_H_

#include <string>

#include "absl/status/statusor.h"

namespace ember::hub {

// Environment variables read by get_dir(), in its order.
inline constexpr char kHubDirEnv[] = "TORCH_HUB_DIR";
inline constexpr char kTorchHomeEnv[] = "TORCH_HOME";
inline constexpr char kXdgCacheHomeEnv[] = "XDG_CACHE_HOME";

// Makes `dir` the hub directory for this process; an empty string undoes it.
void set_dir(std::string dir);

// The hub directory (see above), created if missing. Errors: Internal naming
// the directory when it cannot be created; FailedPrecondition when nothing
// above is set and $HOME is unset.
absl::StatusOr<std::string> get_dir();

// Creates `dir` and its missing parents (mkdir -p). Errors name the path.
absl::Status make_dirs(const std::string& dir);

}  // namespace ember::hub

#endif  // EMBER_HUB_HUB_DIR_H_
