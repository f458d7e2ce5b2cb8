// Safe extraction of repository archives (zip, tar, tar.gz, ... through
// libarchive).
//
//   ```cpp
//   #include <filesystem>
//   #include <fstream>
//   #include "hub/archive.h"
//   #include "serialization/zip.h"
//   ember::serialization::ZipWriter zip;  // a repository archive, as GitHub serves one
//   zip.add("models-1.0/hubconf.textproto", "entry_points { name: \"mlp\" builder: \"mlp\" }\n");
//   EMBER_ASSIGN_OR_RETURN(std::string bytes, std::move(zip).finish());
//   std::string dir = std::filesystem::temp_directory_path() / "x";
//   std::ofstream(dir + ".zip", std::ios::binary) << bytes;
//   EMBER_RETURN_IF_ERROR(ember::hub::extract_archive(dir + ".zip", dir + ".extract"));
//   ```
//
// Every entry is checked before anything is written: an entry whose path is
// absolute or climbs out with "..", a symbolic link whose target is absolute
// or leads outside the archive's root, a hard link to such a path, and device
// or FIFO entries make the whole archive refused. Extraction then runs with
// libarchive's own guards on too (no "..", no writing through symlinks), so
// nothing is ever written outside `dest_dir`.
//
// An archive must hold at least one file, and may unpack to at most
// ExtractLimits' bytes and entries (a few MiB of compressed zeros unpack to
// gigabytes): the sizes its headers declare are checked before anything is
// written, and the bytes actually written are counted while extracting.
//
// Thread-safety: safe from any thread; concurrent extractions into the same
// directory are the caller's to prevent (repo_cache.h holds a FileLock).
#ifndef EMBER_HUB_ARCHIVE_H_
#define EMBER_HUB_ARCHIVE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ember::hub {

// Environment variables overriding the default limits (decimal numbers).
inline constexpr char kMaxUnpackedBytesEnv[] = "EMBER_HUB_MAX_UNPACKED_BYTES";
inline constexpr char kMaxUnpackedEntriesEnv[] = "EMBER_HUB_MAX_UNPACKED_ENTRIES";
inline constexpr uint64_t kDefaultMaxUnpackedBytes = uint64_t{2} << 30;  // 2 GiB
inline constexpr uint64_t kDefaultMaxUnpackedEntries = 100000;

struct ExtractLimits {
  // Total size of the files written; 0: $EMBER_HUB_MAX_UNPACKED_BYTES, else
  // kDefaultMaxUnpackedBytes.
  uint64_t max_bytes = 0;
  // Entries (files, folders, links); 0: $EMBER_HUB_MAX_UNPACKED_ENTRIES, else
  // kDefaultMaxUnpackedEntries.
  uint64_t max_entries = 0;
};

// `limits` with its zeros replaced by the environment's values or the
// defaults. Errors: InvalidArgument naming an environment variable that is
// not a positive number.
absl::StatusOr<ExtractLimits> resolve_extract_limits(const ExtractLimits& limits);

// Extracts `archive_path` into `dest_dir` (created if missing). Errors:
// PermissionDenied naming the first offending entry and why (nothing is
// written then); InvalidArgument for an unreadable or unsupported archive,
// or one that holds no file; ResourceExhausted when it unpacks past
// `limits` (naming the limit and how to raise it); Internal for local file
// errors. After an error during the writing pass, `dest_dir` may hold part
// of the archive; the caller removes it.
absl::Status extract_archive(const std::string& archive_path, const std::string& dest_dir,
                             const ExtractLimits& limits = {});

}  // namespace ember::hub

#endif  // EMBER_HUB_ARCHIVE_H_
