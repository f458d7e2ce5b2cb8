// The hub directory: where fetched repositories and downloaded weights live.
//
//   ember::hub::SetDir("/data/hub");                     // highest precedence
//   EMBER_ASSIGN_OR_RETURN(std::string dir, ember::hub::GetDir());
//
// GetDir() answers, in this order: the directory given to SetDir(); the
// TORCH_HUB_DIR environment variable; ~/.torch/hub (home from $HOME). It
// creates the directory (and its parents) when missing.
//
// Layout inside it:
//   <owner>_<repo>_<ref>/   a fetched repository (repo_cache.h)
//   checkpoints/            weights from load_state_dict_from_url
//   (checkpoints.h)
//
// Thread-safety: SetDir/GetDir may be called from any thread.
#ifndef EMBER_HUB_HUB_DIR_H_
#define EMBER_HUB_HUB_DIR_H_

#include <string>

#include "absl/status/statusor.h"

namespace ember::hub {

// Environment variable naming the hub directory when SetDir() was not called.
inline constexpr char kHubDirEnv[] = "TORCH_HUB_DIR";

// Makes `dir` the hub directory for this process; an empty string undoes it.
void SetDir(std::string dir);

// The hub directory (see above), created if missing. Errors: Internal naming
// the directory when it cannot be created; FailedPrecondition when no
// directory is set and $HOME is unset.
absl::StatusOr<std::string> GetDir();

// Creates `dir` and its missing parents (mkdir -p). Errors name the path.
absl::Status MakeDirs(const std::string& dir);

}  // namespace ember::hub

#endif  // EMBER_HUB_HUB_DIR_H_
