#include "hub/repo_cache.h"

#include <cstdlib>
#include <filesystem>
#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "hub/archive.h"
#include "hub/file_lock.h"
#include "hub/hub_dir.h"
#include "hub/hubconf_py.h"
#include "tensor/status_macros.h"

namespace ember::hub {
namespace {

namespace fs = std::filesystem;

bool IsDir(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec);
}

// A cached repository: a folder with something in it.
bool IsCached(const std::string& path) {
  std::error_code ec;
  return IsDir(path) && !fs::is_empty(path, ec) && !ec;
}

absl::Status RemoveAll(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot remove ", path, ": ", ec.message()));
  return absl::OkStatus();
}

// The folder holding the repository inside an extracted archive: GitHub wraps
// everything in one "<owner>-<repo>-<sha>/" folder; a flat archive is its own
// root.
std::string RepositoryRoot(const std::string& extracted) {
  std::vector<fs::path> children;
  for (const auto& e : fs::directory_iterator(extracted)) children.push_back(e.path());
  if (children.size() == 1 && fs::is_directory(fs::symlink_status(children[0]))) return children[0];
  return extracted;
}

// Deletes the weights that `repo_dir`'s hubconf downloaded into checkpoints/.
void DeleteDownloadedWeights(const std::string& hub_dir, const std::string& repo_dir) {
  absl::StatusOr<HubConf> conf = read_hubconf(repo_dir);
  if (!conf.ok()) return;
  for (const EntryPoint& e : conf->entry_points()) {
    if (e.weights().url().empty()) continue;
    std::string name =
        fs::path(e.weights().url().substr(0, e.weights().url().find('?'))).filename();
    std::error_code ec;
    if (!name.empty() && name != "." && name != "..")
      fs::remove(absl::StrCat(hub_dir, "/checkpoints/", name), ec);
  }
}

}  // namespace

std::string resolve_base_url(const FetchOptions& options) {
  std::string base = options.base_url;
  if (const char* env = std::getenv(kBaseUrlEnv); base.empty() && env != nullptr && *env != '\0')
    base = env;
  if (base.empty()) base = kDefaultBaseUrl;
  while (!base.empty() && base.back() == '/') base.pop_back();
  return base;
}

absl::StatusOr<FetchedRepo> fetch_repo(const RepoRef& repo, const FetchOptions& options) {
  EMBER_ASSIGN_OR_RETURN(std::string hub_dir, get_dir());
  std::vector<std::string> refs =
      repo.ref ? std::vector<std::string>{*repo.ref} : std::vector<std::string>{"master", "main"};
  auto cached = [&](const std::string& ref) {
    return absl::StrCat(hub_dir, "/", cache_dir_name(repo.owner, repo.repo, ref));
  };
  auto find_cached = [&]() -> std::optional<FetchedRepo> {
    if (options.force_reload) return std::nullopt;
    for (const std::string& ref : refs) {
      if (IsCached(cached(ref))) return FetchedRepo{cached(ref), ref};
    }
    return std::nullopt;
  };
  if (auto hit = find_cached()) return *hit;

  EMBER_ASSIGN_OR_RETURN(FileLock lock, FileLock::acquire(absl::StrCat(hub_dir, "/", repo.owner,
                                                                       "_", repo.repo, ".lock"),
                                                          options.lock_timeout));
  if (auto hit = find_cached()) return *hit;  // another loader fetched it meanwhile

  const std::string base = resolve_base_url(options);
  std::vector<std::string> tried;
  for (const std::string& ref : refs) {
    const std::string name = cache_dir_name(repo.owner, repo.repo, ref);
    const std::string url = absl::StrCat(base, "/", repo.owner, "/", repo.repo, "/zipball/", ref);
    const std::string archive = absl::StrCat(hub_dir, "/", name, ".archive");
    absl::Status got = download_url_to_file(url, archive, options.download);
    if (absl::IsNotFound(got)) {
      tried.push_back(url);
      continue;
    }
    EMBER_RETURN_IF_ERROR(got);
    const std::string staging = absl::StrCat(hub_dir, "/", name, ".extracting");
    EMBER_RETURN_IF_ERROR(RemoveAll(staging));
    absl::Status extracted = extract_archive(
        archive, staging, ExtractLimits{options.max_unpacked_bytes, options.max_unpacked_entries});
    std::error_code ec;
    fs::remove(archive, ec);
    if (!extracted.ok()) {
      RemoveAll(staging).IgnoreError();
      return extracted;
    }
    const std::string dest = cached(ref);
    if (IsDir(dest)) {
      DeleteDownloadedWeights(hub_dir, dest);
      EMBER_RETURN_IF_ERROR(RemoveAll(dest));
    }
    fs::rename(RepositoryRoot(staging), dest, ec);
    if (ec) {
      RemoveAll(staging).IgnoreError();
      return absl::InternalError(
          absl::StrCat("cannot move the fetched repository into ", dest, ": ", ec.message()));
    }
    EMBER_RETURN_IF_ERROR(RemoveAll(staging));
    return FetchedRepo{dest, ref};
  }
  return absl::NotFoundError(absl::StrCat(
      repo.owner, "/", repo.repo,
      repo.ref ? absl::StrCat(" has no tag or branch '", *repo.ref, "'")
               : std::string(" has neither a master nor a main branch"),
      " (tried ", absl::StrJoin(tried, ", "), "); check the name, or the mirror in ", kBaseUrlEnv));
}

}  // namespace ember::hub
