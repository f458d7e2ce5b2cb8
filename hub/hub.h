// The hub: list, document and load the entry points a repository publishes,
// as torch.hub.list / help / load.
//
//   ```cpp compile-only
//   #include "hub/hub.h"
//   ember::hub::HubOptions opts;  // GitHub, cached, offline once fetched
//   EMBER_ASSIGN_OR_RETURN(std::vector<std::string> names,
//                          ember::hub::list("alice/models", opts));
//   EMBER_ASSIGN_OR_RETURN(std::string doc, ember::hub::help("alice/models", "resnet18", opts));
//   ```
//
// A repository is "owner/repo[:ref]" fetched into the hub directory
// (repo_cache.h), or, with source = kLocal, a directory on disk used as is
// (torch.hub's source='local'). Either way its root holds hubconf.textproto
// (hubconf.h) or a PyTorch-hub hubconf.py (hubconf_py.h). Loading models (load) lives in
// hub/load.h, which needs nn/.
//
// Errors: everything here reads the network, files or a published config, so
// failures are absl::Status (see hub/README.md for the codes).
//
// Thread-safety: safe from any thread and any process (fetches are locked).
#ifndef EMBER_HUB_HUB_H_
#define EMBER_HUB_HUB_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "hub/hubconf.h"
#include "hub/repo_cache.h"

namespace ember::hub {

enum class Source {
  kGithub,  // "owner/repo[:ref]", fetched from the base URL into the cache
  kLocal,   // a directory holding hubconf.textproto or hubconf.py
};

struct HubOptions {
  Source source = Source::kGithub;
  // Fetch the repository again even when cached (kGithub only).
  bool force_reload = false;
  // Where kGithub repositories come from; empty: $EMBER_HUB_BASE_URL or GitHub.
  std::string base_url;
  // Timeouts, retries, CA bundle and progress bar for every download.
  DownloadOptions download;
  // Caps on what a fetched repository's archive may unpack to (see
  // FetchOptions); 0: the environment's value or the default.
  uint64_t max_unpacked_bytes = 0;
  uint64_t max_unpacked_entries = 0;
};

// A repository resolved to a folder on disk, with its parsed hubconf.
struct Repository {
  std::string dir;
  HubConf conf;
};

// Fetches (or finds) `repo` and reads its hubconf. Blocks on the network when
// the repository is not cached. Errors: those of parse_repo_ref, fetch_repo and
// read_hubconf; NotFound for a kLocal directory that does not exist.
absl::StatusOr<Repository> open_repository(const std::string& repo, const HubOptions& options = {});

// The names of the entry points `repo` publishes: in file order for a
// hubconf.textproto, sorted for a hubconf.py (as torch.hub.list).
absl::StatusOr<std::vector<std::string>> list(const std::string& repo,
                                              const HubOptions& options = {});

// The doc of entry point `entry`. Errors: NotFound listing the entry points
// that exist.
absl::StatusOr<std::string> help(const std::string& repo, const std::string& entry,
                                 const HubOptions& options = {});

}  // namespace ember::hub

#endif  // EMBER_HUB_HUB_H_
