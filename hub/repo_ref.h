// RepoRef: a repository named as "owner/repo[:ref]", as torch.hub names them.
//
//   ```cpp
//   #include "hub/repo_ref.h"
//   EMBER_ASSIGN_OR_RETURN(ember::hub::RepoRef r, ember::hub::parse_repo_ref("alice/models:v1"));
//   // r.owner == "alice", r.repo == "models", *r.ref == "v1" (none: the default branch)
//   std::string dir = ember::hub::cache_dir_name(r.owner, r.repo, r.ref.value_or("master"));
//   // dir == "alice_models_v1"
//   ```
//
// `ref` is a tag or a branch. Without one, the loader uses the default branch
// "master", falling back to "main" when the repository has no master (see
// repo_cache.h). A bare commit hash is refused: torch.hub resolves refs
// against the repository's branches and tags, and a commit may come from a
// fork; publish a tag instead.
//
// Thread-safety: free functions on values; safe from any thread.
#ifndef EMBER_HUB_REPO_REF_H_
#define EMBER_HUB_REPO_REF_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ember::hub {

struct RepoRef {
  std::string owner;
  std::string repo;
  std::optional<std::string> ref;  // none: the default branch
};

// Parses "owner/repo[:ref]". Errors: InvalidArgument naming the text and the
// expected form, or saying that commits are not accepted.
absl::StatusOr<RepoRef> parse_repo_ref(absl::string_view text);

// The folder name of a fetched repository inside the hub directory:
// "<owner>_<repo>_<ref>", with any '/' of the ref (branch "feature/x")
// replaced by '_'.
std::string cache_dir_name(absl::string_view owner, absl::string_view repo, absl::string_view ref);

}  // namespace ember::hub

#endif  // EMBER_HUB_REPO_REF_H_
