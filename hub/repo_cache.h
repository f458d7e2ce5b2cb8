// Fetching published repositories into the hub directory.
//
//   ```cpp compile-only
//   #include "hub/repo_cache.h"
//   EMBER_ASSIGN_OR_RETURN(ember::hub::RepoRef ref, ember::hub::parse_repo_ref("alice/models:v1"));
//   EMBER_ASSIGN_OR_RETURN(ember::hub::FetchedRepo repo, ember::hub::fetch_repo(ref));
//   // repo.dir == "<hub_dir>/alice_models_v1", holding the repository's files
//   ```
//
// The archive of <owner>/<repo> at <ref> comes from
// "<base>/<owner>/<repo>/zipball/<ref>" (GitHub's archive link; any format
// libarchive reads). The base URL is FetchOptions::base_url, else the
// EMBER_HUB_BASE_URL environment variable, else https://github.com. Without a
// ref the default branch is "master", or "main" when master does not exist.
//
// A repository already in the cache is used as is, without touching the
// network, so loading works offline once fetched (an empty folder there, left
// by an older version, is fetched again). An archive that holds no file, or
// unpacks past the limits, is an error and leaves no cache entry. force_reload fetches again
// and, once the new copy is extracted, replaces the old folder and deletes the
// weights its hubconf downloaded (checkpoints/<file name of each weights url>).
// Fetches hold "<hub_dir>/<owner>_<repo>.lock", so concurrent loaders (DDP
// ranks sharing a hub directory) download once.
//
// Thread-safety: safe from any thread and any process.
#ifndef EMBER_HUB_REPO_CACHE_H_
#define EMBER_HUB_REPO_CACHE_H_

#include <cstdint>
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
  // Caps on what the repository's archive may unpack to (archive.h); 0:
  // $EMBER_HUB_MAX_UNPACKED_BYTES / $EMBER_HUB_MAX_UNPACKED_ENTRIES, else 2 GiB
  // and 100,000 entries.
  uint64_t max_unpacked_bytes = 0;
  uint64_t max_unpacked_entries = 0;
};

struct FetchedRepo {
  std::string dir;  // the repository's root folder in the cache
  std::string ref;  // the ref used (the default branch when none was given)
};

// The base URL fetch_repo uses for `options` (see above).
std::string resolve_base_url(const FetchOptions& options);

// The repository's folder in the cache, fetching it if needed (see above).
// Blocks on the network and on other loaders' locks. Errors: NotFound when the
// ref (or neither default branch) exists; the download's errors
// (download.h); the archive's (archive.h: PermissionDenied for refused
// entries, InvalidArgument for an empty or unreadable archive,
// ResourceExhausted past the unpacking limits); Internal for cache file
// errors.
// On error the cache holds what it held before.
absl::StatusOr<FetchedRepo> fetch_repo(const RepoRef& repo, const FetchOptions& options = {});

}  // namespace ember::hub

#endif  // EMBER_HUB_REPO_CACHE_H_
