// The zip container of PyTorch checkpoints, read and written by libarchive:
// a reader that takes a whole file's bytes and verifies every entry (bounds,
// CRC-32, duplicate names, sizes) before handing out views of them, and a
// writer of stored (uncompressed) entries.
//
//   ```cpp
//   #include "serialization/zip.h"
//   ember::serialization::ZipWriter out;
//   out.add("archive/version", "3\n");
//   EMBER_ASSIGN_OR_RETURN(std::string file, std::move(out).finish());
//
//   namespace ser = ember::serialization;
//   EMBER_ASSIGN_OR_RETURN(ser::ZipReader zip, ser::ZipReader::open(file, "w.pt"));
//   EMBER_ASSIGN_OR_RETURN(absl::string_view version, zip.read("archive/version"));
//   if (version != "3\n") return absl::DataLossError("the entry changed on the way");
//   ```
//
// zip64 archives (over 4 GiB, or over 65535 entries) are read and written;
// libarchive switches to zip64 records when sizes or offsets need them.
// zip_test reads a small archive written with forced zip64 records; no file
// over 4 GiB is made by the tests.
// Unlike PyTorch's writer, the writer does not pad entries so that their data
// starts on a 64-byte boundary: torch.load does not need it (see Note
// [Record alignment] in zip.cc).
//
// Thread-safety: a ZipReader is immutable after Open (reads are safe from any
// thread); a ZipWriter is thread-compatible.
#ifndef EMBER_SERIALIZATION_ZIP_H_
#define EMBER_SERIALIZATION_ZIP_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

struct archive;

namespace ember::serialization {

class ZipReader {
 public:
  // Reads the directory and every entry of `bytes`, which the reader keeps;
  // stored entries stay views into it. `source` names the file in errors.
  // Does not block beyond the CPU work. Errors: InvalidArgument for anything
  // that is not a complete, well-formed zip (truncated, corrupt, two entries
  // with one name, encrypted, or entries that expand to more bytes than the
  // file holds, as only compressed ones can); DataLoss when an entry's CRC-32
  // does not match its data.
  static absl::StatusOr<ZipReader> open(std::string bytes, std::string source);

  // Entry names in the order their data lies in the file.
  const std::vector<std::string>& names() const { return names_; }
  bool contains(absl::string_view name) const { return entries_.count(std::string(name)) > 0; }
  // The bytes of entry `name`, a view into the reader (CRC-checked by Open).
  // Errors: NotFound.
  absl::StatusOr<absl::string_view> read(absl::string_view name) const;

 private:
  struct Entry {
    // Stored entries: the data's place in bytes_. Others: their decoded bytes.
    uint64_t offset = 0;
    uint64_t size = 0;
    bool in_file = true;
    std::string decoded;
  };
  std::string bytes_;
  std::string source_;
  std::vector<std::string> names_;
  std::map<std::string, Entry> entries_;
};

class ZipWriter {
 public:
  ZipWriter();
  ZipWriter(const ZipWriter&) = delete;
  ZipWriter& operator=(const ZipWriter&) = delete;
  ~ZipWriter();

  // Appends a stored entry (a copy of `data`). A failure is kept and
  // reported by Finish; later calls then do nothing.
  void add(const std::string& name, absl::string_view data);
  // The archive's bytes (central directory appended). Errors: Internal when
  // libarchive failed to write an entry or the directory, naming the entry.
  absl::StatusOr<std::string> finish() &&;

 private:
  struct WriterDeleter {
    void operator()(struct archive* a) const;
  };
  // Declared before archive_, so destroyed after it: closing the archive
  // writes into out_.
  std::string out_;
  absl::Status status_;
  std::unique_ptr<struct archive, WriterDeleter> archive_;
};

}  // namespace ember::serialization

#endif  // EMBER_SERIALIZATION_ZIP_H_
