#include "serialization/zip.h"

#include <archive.h>
#include <archive_entry.h>

#include <cstdint>
#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "serialization/printable.h"

// Note [Record alignment]
// PyTorch's writer pads each record's local header with an "FB" extra field
// so that the record's data starts on a 64-byte boundary; libarchive's zip
// writer has no such padding. PyTorch's reader does not depend on it: it finds
// each record through the central directory and the local header and copies
// the record into a fresh storage (torch.load, weights_only or not), so
// Ember's files load as they are; serialization_test has PyTorch itself load one
// to keep this true. torch.load(mmap=True) (PyTorch 2.1 and later) maps
// records in place instead, where an unaligned record gives unaligned
// tensors; that path has not been tried against Ember's files.

namespace ember::serialization {
namespace {

struct ReaderDeleter {
  void operator()(struct archive* a) const { archive_read_free(a); }
};
struct EntryDeleter {
  void operator()(struct archive_entry* e) const { archive_entry_free(e); }
};
using Reader = std::unique_ptr<struct archive, ReaderDeleter>;
using EntryHandle = std::unique_ptr<struct archive_entry, EntryDeleter>;

std::string ErrorOf(struct archive* a) {
  const char* why = archive_error_string(a);
  return why != nullptr ? why : "unknown libarchive error";
}

// libarchive's write callback: the archive's bytes go to a std::string.
la_ssize_t AppendTo(struct archive*, void* out, const void* data, size_t n) {
  static_cast<std::string*>(out)->append(static_cast<const char*>(data), n);
  return static_cast<la_ssize_t>(n);
}

}  // namespace

absl::StatusOr<ZipReader> ZipReader::open(std::string bytes, std::string source) {
  ZipReader r;
  r.bytes_ = std::move(bytes);
  r.source_ = std::move(source);
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat(r.source_, ": not a readable checkpoint zip: ", why));
  };
  Reader a(archive_read_new());
  if (a == nullptr) return absl::ResourceExhaustedError("out of memory");
  // Only the reader that starts from the central directory: the streaming one
  // would accept a file cut off inside its directory.
  if (archive_read_support_format_zip_seekable(a.get()) != ARCHIVE_OK ||
      archive_read_open_memory(a.get(), r.bytes_.data(), r.bytes_.size()) != ARCHIVE_OK) {
    return bad(
        absl::StrCat("no complete zip directory (truncated or not a "
                     "zip?): ",
                     ErrorOf(a.get())));
  }
  // Stored entries come back as pointers into r.bytes_ (the memory reader
  // hands libarchive the whole buffer), and are kept as offsets; anything
  // else is decoded into the entry, at most as many bytes as the file holds.
  const uintptr_t base = reinterpret_cast<uintptr_t>(r.bytes_.data());
  const uint64_t file_size = r.bytes_.size();
  uint64_t decoded_total = 0;
  for (;;) {
    struct archive_entry* header = nullptr;
    int rc = archive_read_next_header(a.get(), &header);
    if (rc == ARCHIVE_EOF) break;
    if (rc != ARCHIVE_OK) {
      return bad(absl::StrCat("corrupt entry after '",
                              r.names_.empty() ? "" : escape_for_terminal(r.names_.back()),
                              "': ", ErrorOf(a.get())));
    }
    const char* path = archive_entry_pathname(header);
    std::string name = path != nullptr ? path : "";
    if (name.empty()) return bad("an entry has no name");
    if (archive_entry_is_encrypted(header))
      return bad(absl::StrCat("entry '", escape_for_terminal(name), "' is encrypted"));
    if (archive_entry_size_is_set(header) &&
        static_cast<uint64_t>(archive_entry_size(header)) > file_size) {
      return bad(absl::StrCat("entry '", escape_for_terminal(name), "' claims ",
                              archive_entry_size(header), " bytes, more than the file's ",
                              file_size,
                              "; checkpoints store their records "
                              "uncompressed"));
    }
    Entry e;
    const void* block = nullptr;
    size_t n = 0;
    la_int64_t offset = 0;
    while ((rc = archive_read_data_block(a.get(), &block, &n, &offset)) == ARCHIVE_OK) {
      if (n == 0) continue;
      if (offset < 0 || static_cast<uint64_t>(offset) != e.size)
        return bad(absl::StrCat("entry '", escape_for_terminal(name), "' has a hole"));
      const uintptr_t at = reinterpret_cast<uintptr_t>(block);
      const bool continues_view = e.in_file && at >= base && at - base <= file_size &&
                                  n <= file_size - (at - base) &&
                                  (e.size == 0 || at - base == e.offset + e.size);
      if (continues_view) {
        if (e.size == 0) e.offset = at - base;
      } else {
        if (e.in_file) {
          e.decoded.assign(r.bytes_, e.offset, e.size);
          e.in_file = false;
        }
        decoded_total += n;
        if (decoded_total > file_size) {
          return bad(absl::StrCat("entry '", escape_for_terminal(name), "' expands past ",
                                  file_size,
                                  " bytes, the file's size; checkpoints store their records "
                                  "uncompressed"));
        }
        e.decoded.append(static_cast<const char*>(block), n);
      }
      e.size += n;
    }
    if (rc != ARCHIVE_EOF) {
      std::string why = ErrorOf(a.get());
      // libarchive reports a CRC mismatch as a warning whose text says so;
      // there is no separate code for it.
      if (absl::StrContains(why, "CRC")) {
        return absl::DataLossError(absl::StrCat(r.source_, ": record '", escape_for_terminal(name),
                                                "' is corrupt (CRC mismatch): ", why));
      }
      return bad(absl::StrCat("entry '", escape_for_terminal(name), "': ", why));
    }
    if (!r.entries_.emplace(name, std::move(e)).second)
      return bad(absl::StrCat("entry '", escape_for_terminal(name), "' appears twice"));
    r.names_.push_back(std::move(name));
  }
  return r;
}

absl::StatusOr<absl::string_view> ZipReader::read(absl::string_view name) const {
  auto it = entries_.find(std::string(name));
  if (it == entries_.end()) {
    return absl::NotFoundError(absl::StrCat(source_, ": no record '", name, "' in the checkpoint"));
  }
  const Entry& e = it->second;
  if (!e.in_file) return absl::string_view(e.decoded);
  return absl::string_view(bytes_.data() + e.offset, e.size);
}

void ZipWriter::WriterDeleter::operator()(struct archive* a) const { archive_write_free(a); }

ZipWriter::ZipWriter() : archive_(archive_write_new()) {
  struct archive* a = archive_.get();
  if (a == nullptr) {
    status_ = absl::ResourceExhaustedError("out of memory");
    return;
  }
  // Unblocked output (no padding after the directory), stored entries.
  if (archive_write_set_format_zip(a) != ARCHIVE_OK ||
      archive_write_zip_set_compression_store(a) != ARCHIVE_OK ||
      archive_write_set_bytes_per_block(a, 0) != ARCHIVE_OK ||
      archive_write_open2(a, &out_, nullptr, &AppendTo, nullptr, nullptr) != ARCHIVE_OK) {
    status_ = absl::InternalError(absl::StrCat("cannot start a zip archive: ", ErrorOf(a)));
  }
}

ZipWriter::~ZipWriter() = default;

void ZipWriter::add(const std::string& name, absl::string_view data) {
  if (!status_.ok()) return;
  struct archive* a = archive_.get();
  const size_t size = data.size();
  auto fail = [&] {
    status_ = absl::InternalError(
        absl::StrCat("cannot write zip entry '", name, "' (", size, " bytes): ", ErrorOf(a)));
  };
  EntryHandle entry(archive_entry_new());
  if (entry == nullptr) {
    status_ = absl::ResourceExhaustedError("out of memory");
    return;
  }
  archive_entry_set_pathname(entry.get(), name.c_str());
  archive_entry_set_filetype(entry.get(), AE_IFREG);
  archive_entry_set_perm(entry.get(), 0644);
  archive_entry_set_size(entry.get(), static_cast<la_int64_t>(data.size()));
  if (archive_write_header(a, entry.get()) != ARCHIVE_OK) return fail();
  while (!data.empty()) {
    la_ssize_t wrote = archive_write_data(a, data.data(), data.size());
    if (wrote <= 0) return fail();
    data.remove_prefix(static_cast<size_t>(wrote));
  }
  if (archive_write_finish_entry(a) != ARCHIVE_OK) return fail();
}

absl::StatusOr<std::string> ZipWriter::finish() && {
  if (status_.ok() && archive_write_close(archive_.get()) != ARCHIVE_OK) {
    status_ = absl::InternalError(
        absl::StrCat("cannot write the zip directory: ", ErrorOf(archive_.get())));
  }
  if (!status_.ok()) return status_;
  return std::move(out_);
}

}  // namespace ember::serialization
