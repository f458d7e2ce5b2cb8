// Record files: a large dataset as one file of packed samples and an index,
// read by memory mapping, so every worker reads the same pages of the page
// cache and the dataset lives in memory once however many workers read it.
//
//   ```cpp
//   #include "data/record_file.h"
//   #include "tensor/status_macros.h"
//   namespace data = ember::data;
//   const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/doc.records";
//   EMBER_ASSIGN_OR_RETURN(data::RecordWriter w, data::RecordWriter::create(path));
//   EMBER_RETURN_IF_ERROR(w.append("first sample's bytes", /*label=*/3));
//   EMBER_RETURN_IF_ERROR(w.append("second", 1));
//   EMBER_RETURN_IF_ERROR(w.close());
//   EMBER_ASSIGN_OR_RETURN(auto records, data::RecordDataset::open(path));
//   EMBER_ASSIGN_OR_RETURN(data::Sample s, records->get(1));  // [uint8 bytes, label 1]
//   if (s.list()[0].get_if<ember::Tensor>()->numel() != 6) return absl::InternalError("size");
//   ```
//
// Note [Record files]
// A record file is, in this order: the 8 bytes "EMBREC01"; the records'
// bytes, one after another; the index, one entry per record of three
// little-endian 64-bit integers (offset from the file's start, length,
// label); then a 24-byte footer: the number of records, the index's offset
// and again "EMBREC01". Writing appends records as they come and the index
// last, to `path`.partial, renamed to `path` by close(), so a file that is
// there is whole. Reading maps the whole file read-only and shared; a
// record is a uint8 tensor viewing its bytes in the mapping (no copy), which
// keeps the mapping alive.
//
// Errors are Statuses naming the file: NotFound, InvalidArgument for a file
// that is not a record file (its magic), DataLoss for one whose index or
// records reach past its end.
#ifndef EMBER_DATA_RECORD_FILE_H_
#define EMBER_DATA_RECORD_FILE_H_

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "data/dataset.h"

namespace ember::data {

class RecordWriter {
 public:
  // Starts `path`.partial (Unavailable naming it when it cannot be made).
  static absl::StatusOr<RecordWriter> create(const std::string& path);
  RecordWriter(RecordWriter&& other) noexcept;
  RecordWriter& operator=(RecordWriter&&) = delete;
  // Removes the partial file unless close() succeeded.
  ~RecordWriter();
  absl::Status append(std::string_view bytes, int64_t label = -1);
  // Writes the index and renames the file into place.
  absl::Status close();
  int64_t size() const { return static_cast<int64_t>(index_.size()); }

 private:
  RecordWriter(std::string path, FILE* file);
  std::string path_;
  FILE* file_ = nullptr;
  uint64_t offset_ = 0;
  std::vector<uint64_t> index_;  // offset, length, label per record
};

// The records of a file: sample i is [its bytes as a uint8 tensor, its
// label].
class RecordDataset : public Dataset {
 public:
  static absl::StatusOr<std::shared_ptr<RecordDataset>> open(const std::string& path);
  int64_t size() const override { return count_; }
  absl::StatusOr<Sample> get(int64_t index) override;
  // Opens the same file again.
  std::optional<Recipe> recipe() const override;
  // The record's bytes (a view of the mapping) and its label.
  absl::StatusOr<std::string_view> bytes(int64_t index) const;
  int64_t label(int64_t index) const;
  const std::string& path() const { return path_; }

 private:
  struct Mapping;
  RecordDataset() = default;
  std::string path_;
  std::shared_ptr<Mapping> mapping_;
  const uint8_t* index_ = nullptr;
  int64_t count_ = 0;
};

}  // namespace ember::data

#endif  // EMBER_DATA_RECORD_FILE_H_
