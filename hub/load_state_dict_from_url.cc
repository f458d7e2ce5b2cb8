#include "hub/load_state_dict_from_url.h"

#include <sys/stat.h>

#include <cstdio>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "hub/file_lock.h"
#include "hub/hub_dir.h"
#include "hub/sha256.h"
#include "serialization/serialization.h"
#include "tensor/status_macros.h"

namespace ember::hub {
namespace {

bool IsFile(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool IsLowerHex(char c) { return absl::ascii_isdigit(c) || (c >= 'a' && c <= 'f'); }

}  // namespace

std::string hash_prefix_from_file_name(const std::string& file_name) {
  // torch.hub's HASH_REGEX, r'-([a-f0-9]*)\.', searched from the left.
  for (size_t dash = file_name.find('-'); dash != std::string::npos;
       dash = file_name.find('-', dash + 1)) {
    size_t end = dash + 1;
    while (end < file_name.size() && IsLowerHex(file_name[end])) ++end;
    if (end < file_name.size() && file_name[end] == '.')
      return file_name.substr(dash + 1, end - dash - 1);
  }
  return "";
}

absl::StatusOr<std::string> download_checkpoint(const std::string& url,
                                                const LoadFromUrlOptions& options) {
  EMBER_RETURN_IF_ERROR(check_url_scheme(url));
  std::string model_dir = options.model_dir;
  if (model_dir.empty()) {
    EMBER_ASSIGN_OR_RETURN(std::string hub_dir, get_dir());
    model_dir = absl::StrCat(hub_dir, "/checkpoints");
  }
  EMBER_RETURN_IF_ERROR(make_dirs(model_dir));
  std::string name = options.file_name;
  if (name.empty()) {
    std::string path = url.substr(0, url.find_first_of("?#"));
    name = path.substr(path.find_last_of('/') + 1);
  }
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("no file name in URL ", url, "; pass LoadFromUrlOptions::file_name"));
  }
  std::string prefix;
  if (options.check_hash) {
    prefix = hash_prefix_from_file_name(name);
    if (prefix.size() < 8) {
      return absl::InvalidArgumentError(
          absl::StrCat("check_hash needs the file name to carry its SHA-256 as name-<first "
                       "8+ hex digits>.ext; '",
                       name, "' does not (rename the file, or load without check_hash)"));
    }
  }
  std::vector<std::string> prefixes = {prefix, options.sha256};
  const std::string cached = absl::StrCat(model_dir, "/", name);
  EMBER_ASSIGN_OR_RETURN(FileLock lock, FileLock::acquire(cached + ".lock", options.lock_timeout));
  if (IsFile(cached)) {
    if (prefix.empty() && options.sha256.empty()) return cached;
    EMBER_ASSIGN_OR_RETURN(std::string digest, sha256_of_file(cached));
    for (const std::string& p : prefixes) {
      if (!absl::StartsWith(digest, p)) {
        return absl::DataLossError(
            absl::StrCat("cached checkpoint ", cached, " has SHA-256 ", digest,
                         ", which does not start with '", p,
                         "': the file is corrupt or was replaced; delete it to "
                         "download it again"));
      }
    }
    return cached;
  }
  DownloadOptions download = options.download;
  download.progress = options.progress;
  // The longer of the two prefixes covers the other once both are checked
  // below.
  download.hash_prefix = prefix.size() >= options.sha256.size() ? prefix : options.sha256;
  EMBER_RETURN_IF_ERROR(download_url_to_file(url, cached, download));
  if (!prefix.empty() && !options.sha256.empty()) {
    EMBER_ASSIGN_OR_RETURN(std::string digest, sha256_of_file(cached));
    for (const std::string& p : prefixes) {
      if (!absl::StartsWith(digest, p)) {
        std::remove(cached.c_str());
        return absl::DataLossError(
            absl::StrCat("invalid hash value for ", url, ": expected the SHA-256 to start with '",
                         p, "', got '", digest, "'; the download was discarded"));
      }
    }
  }
  return cached;
}

absl::StatusOr<StateDict> load_state_dict_from_url(const std::string& url,
                                                   const LoadFromUrlOptions& options) {
  EMBER_ASSIGN_OR_RETURN(std::string path, download_checkpoint(url, options));
  return ember::load(path);
}

}  // namespace ember::hub
