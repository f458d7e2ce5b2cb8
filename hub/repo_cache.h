// Fetching published repositories into the hub directory.
//
//   EMBER_ASSIGN_OR_RETURN(ember::hub::RepoRef ref,
//   ember::hub::ParseRepoRef("alice/models:v1"));
//   EMBER_ASSIGN_OR_RETURN(ember::hub::FetchedRepo repo,
//   ember::hub::FetchRepo(ref));
//   // repo.dir == "<hub_dir>/alice_models_v1", holding the repository's files
//
// The archive of <owner>/<repo> at <ref> comes from
// "<base>/<owner>/<repo>/zipball/<ref>" (GitHub's archive link; any format
// libarchive reads). The base URL is FetchOptions::base_url, else the
// EMBER_HUB_BASE_URL environment variable, else https://github.com. Without a
// ref the default branch is "master", or "main" when master does not exist.
//
// A repository already in the cache is used as is, without touching the
// network, so loading works offline once fetched. force_reload fetches again
// and, once the new copy is extracted, replaces the old folder and deletes the
// weights its hubconf downloaded (checkpoints/<file name of each weights url>).
// Fetches hold "<hub_dir>/<owner>_<repo>.lock", so concurrent loaders (DDP
// ranks sharing a hub directory) download once.
//
// Thread-safety: safe from any thread and any process.
#ifndef EMBER_HUB_REPO_CACHE_H_
#define EMBER_HUB_REPO_CACHE_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "hub/download.h"
#include "hub/repo_ref.h"

namespace ember::hub {

// Environment variable overriding the default base URL (a mirror, a test
// server).
inline constexpr char kBaseUrlEnv[] = "EMBER_HUB_BASE_URL";
inline constexpr char kDefaultBaseUrl[] = "https://github.com";

struct FetchOptions {
  // Discard the cached copy and its downloaded weights; fetch again.
  bool force_reload = false;
  // Empty: $EMBER_HUB_BASE_URL, else https://github.com.
  std::string base_url;
  DownloadOptions download;
  // How long to wait for another loader fetching the same repository.
  absl::Duration lock_timeout = absl::Minutes(10);
};

struct FetchedRepo {
  std::string dir;  // the repository's root folder in the cache
  std::string ref;  // the ref used (the default branch when none was given)
};

// The base URL FetchRepo uses for `options` (see above).
std::string BaseUrl(const FetchOptions& options);

// The repository's folder in the cache, fetching it if needed (see above).
// Blocks on the network and on other loaders' locks. Errors: NotFound when the
// ref (or neither default branch) exists; the download's errors
// (download.h); the archive's (archive.h); Internal for cache file errors.
// On error the cache holds what it held before.
absl::StatusOr<FetchedRepo> FetchRepo(const RepoRef& repo,
                                      const FetchOptions& options = {});

}  // namespace ember::hub

#endif  // EMBER_HUB_REPO_CACHE_H_
