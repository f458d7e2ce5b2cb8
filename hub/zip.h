// The zip container of PyTorch checkpoints: a reader of stored (uncompressed)
// entries that checks every offset against the file, and a writer that
// aligns each entry's data to 64 bytes as PyTorch's writer does.
//
//   EMBER_ASSIGN_OR_RETURN(ember::hub::ZipReader zip,
//   ember::hub::ZipReader::Open(bytes, "w.pt"));
//   EMBER_ASSIGN_OR_RETURN(absl::string_view pkl,
//   zip.Read("archive/data.pkl"));
//
//   ember::hub::ZipWriter out;
//   out.Add("archive/version", "3\n");
//   std::string file = std::move(out).Finish();
//
// Compressed entries and zip64 (archives over 4 GiB) are refused with an
// error saying so: torch.save writes neither for checkpoints of that size.
//
// Thread-safety: a ZipReader is immutable after Open (reads are safe from any
// thread); a ZipWriter is thread-compatible.
#ifndef EMBER_HUB_ZIP_H_
#define EMBER_HUB_ZIP_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ember::hub {

class ZipReader {
 public:
  // Parses the central directory of `bytes`, which the reader keeps. `source`
  // names the file in errors. Errors: InvalidArgument for anything that is not
  // a complete zip of stored entries (truncated, corrupt, compressed, zip64).
  static absl::StatusOr<ZipReader> Open(std::string bytes, std::string source);

  // Entry names in directory order.
  const std::vector<std::string>& names() const { return names_; }
  bool Contains(absl::string_view name) const {
    return entries_.count(std::string(name)) > 0;
  }
  // The bytes of entry `name` (a view into the reader), CRC-checked. Errors:
  // NotFound; DataLoss when the CRC does not match.
  absl::StatusOr<absl::string_view> Read(absl::string_view name) const;

 private:
  struct Entry {
    uint64_t offset = 0;
    uint64_t size = 0;
    uint32_t crc = 0;
  };
  std::string bytes_;
  std::string source_;
  std::vector<std::string> names_;
  std::map<std::string, Entry> entries_;
};

class ZipWriter {
 public:
  // Appends a stored entry.
  void Add(const std::string& name, absl::string_view data);
  // The archive's bytes (central directory appended).
  std::string Finish() &&;

 private:
  struct Entry {
    std::string name;
    uint64_t header_offset;
    uint64_t size;
    uint32_t crc;
  };
  std::string out_;
  std::vector<Entry> entries_;
};

// CRC-32 (zip's polynomial) of `data`.
uint32_t Crc32(absl::string_view data);

}  // namespace ember::hub

#endif  // EMBER_HUB_ZIP_H_
