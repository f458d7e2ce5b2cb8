#include "hub/hub.h"

#include <sys/stat.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "hub/hubconf_py.h"
#include "hub/repo_ref.h"
#include "serialization/printable.h"
#include "tensor/status_macros.h"

namespace ember::hub {

absl::StatusOr<Repository> open_repository(const std::string& repo, const HubOptions& options) {
  Repository r;
  if (options.source == Source::kLocal) {
    struct stat st;
    if (stat(repo.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      return absl::NotFoundError(absl::StrCat("local repository ", repo, " is not a directory"));
    }
    r.dir = repo;
  } else {
    EMBER_ASSIGN_OR_RETURN(RepoRef ref, parse_repo_ref(repo));
    FetchOptions fetch;
    fetch.force_reload = options.force_reload;
    fetch.base_url = options.base_url;
    fetch.download = options.download;
    fetch.max_unpacked_bytes = options.max_unpacked_bytes;
    fetch.max_unpacked_entries = options.max_unpacked_entries;
    EMBER_ASSIGN_OR_RETURN(FetchedRepo fetched, fetch_repo(ref, fetch));
    r.dir = fetched.dir;
  }
  EMBER_ASSIGN_OR_RETURN(r.conf, read_hubconf(r.dir));
  return r;
}

absl::StatusOr<std::vector<std::string>> list(const std::string& repo, const HubOptions& options) {
  EMBER_ASSIGN_OR_RETURN(Repository r, open_repository(repo, options));
  std::vector<std::string> names;
  for (const EntryPoint& e : r.conf.entry_points()) names.push_back(e.name());
  return names;
}

absl::StatusOr<std::string> help(const std::string& repo, const std::string& entry,
                                 const HubOptions& options) {
  EMBER_ASSIGN_OR_RETURN(Repository r, open_repository(repo, options));
  EMBER_ASSIGN_OR_RETURN(const EntryPoint* e, get_entry_point(r.conf, entry, r.dir));
  return e->doc();
}

}  // namespace ember::hub
