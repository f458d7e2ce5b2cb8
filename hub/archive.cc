#include "hub/archive.h"

#include <archive.h>
#include <archive_entry.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "hub/hub_dir.h"
#include "serialization/printable.h"
#include "tensor/status_macros.h"

namespace ember::hub {

using ::ember::serialization::escape_for_terminal;

namespace {

struct ReaderDeleter {
  void operator()(struct archive* a) const { archive_read_free(a); }
};
struct WriterDeleter {
  void operator()(struct archive* a) const { archive_write_free(a); }
};
using Reader = std::unique_ptr<struct archive, ReaderDeleter>;

absl::StatusOr<Reader> Open(const std::string& path) {
  Reader r(archive_read_new());
  archive_read_support_format_all(r.get());
  archive_read_support_filter_all(r.get());
  if (archive_read_open_filename(r.get(), path.c_str(), 1 << 16) != ARCHIVE_OK) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot open archive ", path, ": ", archive_error_string(r.get())));
  }
  return r;
}

// Depth below the archive root reached by walking `path` from a folder at
// depth `start`, resolving "." and ".."; -1 when it climbs above the root.
int ResolvedDepth(int start, const std::string& path) {
  int depth = start;
  for (absl::string_view part : absl::StrSplit(path, '/', absl::SkipEmpty())) {
    if (part == ".") continue;
    depth += part == ".." ? -1 : 1;
    if (depth < 0) return -1;
  }
  return depth;
}

// The entry's path ("" when it has none).
std::string PathOf(struct archive_entry* entry) {
  const char* path = archive_entry_pathname(entry);
  return path ? path : "";
}

// Why `entry` may not be extracted, or "" when it is fine.
std::string Offence(struct archive_entry* entry) {
  std::string path = PathOf(entry);
  if (path.empty()) return "an entry has an empty path";
  if (path.front() == '/') return "absolute path";
  if (ResolvedDepth(0, path) < 0) return "path climbs out of the archive with '..'";
  for (absl::string_view part : absl::StrSplit(path, '/')) {
    if (part == "..") return "path contains '..'";
  }
  if (const char* link = archive_entry_hardlink(entry); link != nullptr) {
    std::string target = link;
    if (target.empty() || target.front() == '/' || ResolvedDepth(0, target) < 0) {
      return absl::StrCat("hard link to '", target, "' outside the archive");
    }
  }
  mode_t type = archive_entry_filetype(entry);
  if (type == AE_IFLNK) {
    std::string target = archive_entry_symlink(entry) ? archive_entry_symlink(entry) : "";
    // The target is relative to the folder holding the link.
    size_t slash = path.find_last_of('/');
    int dir_depth = slash == std::string::npos ? 0 : ResolvedDepth(0, path.substr(0, slash));
    if (target.empty() || target.front() == '/' || ResolvedDepth(dir_depth, target) < 0) {
      return absl::StrCat("symbolic link to '", target, "' points outside the archive");
    }
  } else if (type != AE_IFREG && type != AE_IFDIR) {
    return "special file (device, FIFO or socket)";
  }
  return "";
}

absl::StatusOr<uint64_t> FromEnv(const char* name, uint64_t fallback) {
  const char* env = std::getenv(name);
  if (env == nullptr || *env == '\0') return fallback;
  uint64_t v;
  if (!absl::SimpleAtoi(env, &v) || v == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, "='", escape_for_terminal(env), "' is not a positive number; unset it or give one"));
  }
  return v;
}

}  // namespace

absl::StatusOr<ExtractLimits> resolve_extract_limits(const ExtractLimits& limits) {
  ExtractLimits out = limits;
  if (out.max_bytes == 0) {
    EMBER_ASSIGN_OR_RETURN(out.max_bytes, FromEnv(kMaxUnpackedBytesEnv, kDefaultMaxUnpackedBytes));
  }
  if (out.max_entries == 0) {
    EMBER_ASSIGN_OR_RETURN(out.max_entries,
                           FromEnv(kMaxUnpackedEntriesEnv, kDefaultMaxUnpackedEntries));
  }
  return out;
}

absl::Status extract_archive(const std::string& archive_path, const std::string& dest_dir,
                             const ExtractLimits& requested) {
  EMBER_ASSIGN_OR_RETURN(const ExtractLimits limits, resolve_extract_limits(requested));
  auto too_big = [&](absl::string_view what) {
    return absl::ResourceExhaustedError(
        absl::StrCat("refusing archive ", archive_path, ": it unpacks to more than ", what,
                     "; nothing was kept (raise the limit with ExtractLimits / FetchOptions, or ",
                     kMaxUnpackedBytesEnv, " and ", kMaxUnpackedEntriesEnv, ")"));
  };
  const std::string bytes_limit = absl::StrCat(limits.max_bytes, " bytes");
  const std::string entries_limit = absl::StrCat(limits.max_entries, " entries");
  // Pass 1: check every entry and the sizes headers declare; nothing is
  // written.
  {
    absl::StatusOr<Reader> r = Open(archive_path);
    if (!r.ok()) return r.status();
    struct archive_entry* entry;
    int rc;
    uint64_t entries = 0, files = 0, declared = 0;
    while ((rc = archive_read_next_header(r->get(), &entry)) == ARCHIVE_OK) {
      if (std::string why = Offence(entry); !why.empty()) {
        return absl::PermissionDeniedError(absl::StrCat(
            "refusing archive ", archive_path, ": entry '", escape_for_terminal(PathOf(entry)),
            "': ", why, "; nothing was extracted"));
      }
      if (++entries > limits.max_entries) return too_big(entries_limit);
      if (archive_entry_filetype(entry) == AE_IFREG) {
        ++files;
        if (archive_entry_size_is_set(entry) &&
            (archive_entry_size(entry) < 0 ||
             __builtin_add_overflow(declared, static_cast<uint64_t>(archive_entry_size(entry)),
                                    &declared) ||
             declared > limits.max_bytes)) {
          return too_big(bytes_limit);
        }
      }
    }
    if (rc != ARCHIVE_EOF) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot read archive ", archive_path, ": ", archive_error_string(r->get())));
    }
    if (files == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("archive ", archive_path, " holds no files (", entries,
                       " entries; an empty or cut download?); nothing was extracted"));
    }
  }
  // Pass 2: extract below dest_dir with libarchive's guards on.
  if (absl::Status s = make_dirs(dest_dir); !s.ok()) return s;
  std::error_code ec;
  const std::string root = std::filesystem::canonical(dest_dir, ec).string();
  if (ec) return absl::InternalError(absl::StrCat("cannot resolve ", dest_dir, ": ", ec.message()));
  absl::StatusOr<Reader> r = Open(archive_path);
  if (!r.ok()) return r.status();
  std::unique_ptr<struct archive, WriterDeleter> w(archive_write_disk_new());
  // Entries were checked to be relative; their written paths are absolute
  // only through the (canonical) destination prefix, so the no-absolute-path
  // guard cannot be used here, but the others can.
  archive_write_disk_set_options(w.get(), ARCHIVE_EXTRACT_SECURE_SYMLINKS |
                                              ARCHIVE_EXTRACT_SECURE_NODOTDOT |
                                              ARCHIVE_EXTRACT_TIME);
  struct archive_entry* entry;
  int rc;
  uint64_t written = 0;  // bytes of the entries done so far
  while ((rc = archive_read_next_header(r->get(), &entry)) == ARCHIVE_OK) {
    std::string name = PathOf(entry);
    auto failed = [&](struct archive* a) {
      return absl::InternalError(absl::StrCat("cannot extract '", escape_for_terminal(name),
                                              "' from ", archive_path, " into ", dest_dir, ": ",
                                              archive_error_string(a)));
    };
    archive_entry_set_pathname(entry, absl::StrCat(root, "/", name).c_str());
    if (const char* link = archive_entry_hardlink(entry); link != nullptr) {
      archive_entry_set_hardlink(entry, absl::StrCat(root, "/", link).c_str());
    }
    archive_entry_set_perm(entry,
                           archive_entry_perm(entry) & 0755);  // no setuid/setgid/world-write
    if (archive_write_header(w.get(), entry) != ARCHIVE_OK) return failed(w.get());
    const void* block;
    size_t size;
    la_int64_t offset;
    int data_rc;
    uint64_t end = 0;  // the entry's size so far (holes included)
    while ((data_rc = archive_read_data_block(r->get(), &block, &size, &offset)) == ARCHIVE_OK) {
      // Headers may understate sizes (or leave them out): count what is
      // written.
      uint64_t block_end;
      if (offset < 0 || __builtin_add_overflow(static_cast<uint64_t>(offset), size, &block_end) ||
          std::max(end, block_end) > limits.max_bytes - written) {
        return too_big(bytes_limit);
      }
      end = std::max(end, block_end);
      if (archive_write_data_block(w.get(), block, size, offset) != ARCHIVE_OK)
        return failed(w.get());
    }
    written += end;
    if (data_rc != ARCHIVE_EOF) return failed(r->get());
    if (archive_write_finish_entry(w.get()) != ARCHIVE_OK) return failed(w.get());
  }
  if (rc != ARCHIVE_EOF) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read archive ", archive_path, ": ", archive_error_string(r->get())));
  }
  if (archive_write_close(w.get()) != ARCHIVE_OK) {
    return absl::InternalError(absl::StrCat("cannot finish extracting ", archive_path, ": ",
                                            archive_error_string(w.get())));
  }
  return absl::OkStatus();
}

}  // namespace ember::hub
