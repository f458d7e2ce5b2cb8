// Safe extraction of repository archives (zip, tar, tar.gz, ... through
// libarchive).
//
//   EMBER_RETURN_IF_ERROR(ember::hub::ExtractArchive("/hub/x.zip",
//   "/hub/x.extract"));
//
// Every entry is checked before anything is written: an entry whose path is
// absolute or climbs out with "..", a symbolic link whose target is absolute
// or leads outside the archive's root, a hard link to such a path, and device
// or FIFO entries make the whole archive refused. Extraction then runs with
// libarchive's own guards on too (no "..", no writing through symlinks), so
// nothing is ever written outside `dest_dir`.
//
// Thread-safety: safe from any thread; concurrent extractions into the same
// directory are the caller's to prevent (repo_cache.h holds a FileLock).
#ifndef EMBER_HUB_ARCHIVE_H_
#define EMBER_HUB_ARCHIVE_H_

#include <string>

#include "absl/status/status.h"

namespace ember::hub {

// Extracts `archive_path` into `dest_dir` (created if missing). Errors:
// PermissionDenied naming the first offending entry and why (nothing is
// written then); InvalidArgument for an unreadable or unsupported archive;
// Internal for local file errors. After an error during the writing pass,
// `dest_dir` may hold part of the archive; the caller removes it.
absl::Status ExtractArchive(const std::string& archive_path,
                            const std::string& dest_dir);

}  // namespace ember::hub

#endif  // EMBER_HUB_ARCHIVE_H_
