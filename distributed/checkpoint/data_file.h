// DataFileWriter: appends a checkpoint's piece bytes to one data file, with
// direct I/O where the file system takes it.
//
//   ```cpp compile-only
//   #include "distributed/checkpoint/data_file.h"
//   namespace dcp = ember::distributed::checkpoint;
//   EMBER_ASSIGN_OR_RETURN(auto file, dcp::DataFileWriter::Create("/ckpt/__0_0.distcp",
//                                                                 /*direct=*/true));
//   EMBER_RETURN_IF_ERROR(file.Append(bytes, length));  // at offset 0
//   EMBER_RETURN_IF_ERROR(file.Close(/*sync=*/true));   // file.size() bytes, fsynced
//   ```
//
// Note [Direct writes]
// A buffered write copies every byte into the page cache, which is CPU time
// of the writing thread (on the 2-core machine of BENCHMARKS.md, 64 MiB cost
// 0.22 s of kernel time buffered against 0.01 s with O_DIRECT, and the disk
// took it 5x sooner); for an asynchronous save that CPU time is taken from
// the training. A direct writer opens the file with O_DIRECT and hands the
// kernel the caller's memory where it can: a run of bytes that starts on a
// kDirectAlignment boundary of memory at a boundary of the file is written
// from where it lies (large tensors are: the CPU allocator aligns them to
// 2 MiB); any other bytes are gathered into an aligned buffer of its own and
// written from there when it fills. So the file holds exactly the bytes
// appended, in order, with no padding, the same layout a buffered writer
// makes: Close writes the last partial block padded with zeros and cuts the
// file back to size(). A file system that refuses O_DIRECT at open
// (EINVAL), or refuses a direct write of aligned bytes (EINVAL), gets
// buffered writes from then on, with the same result; direct() tells which.
//
// Thread-compatible.
#ifndef EMBER_DISTRIBUTED_CHECKPOINT_DATA_FILE_H_
#define EMBER_DISTRIBUTED_CHECKPOINT_DATA_FILE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/unique_fd.h"

namespace ember::distributed::checkpoint {

// The memory, file offset and length alignment direct writes keep: the
// largest logical block size of common disks.
inline constexpr size_t kDirectAlignment = 4096;

class DataFileWriter {
 public:
  // Creates (or truncates) `path`; with `direct`, tries O_DIRECT first
  // (Note [Direct writes]). Errors name the path and errno.
  static absl::StatusOr<DataFileWriter> Create(const std::string& path, bool direct);

  DataFileWriter(DataFileWriter&&) noexcept;
  DataFileWriter& operator=(DataFileWriter&&) noexcept;
  ~DataFileWriter();

  // Appends `n` bytes at offset size(). `data` need not stay valid after the
  // call.
  absl::Status Append(const void* data, size_t n);
  // Writes what is buffered, sets the file's length to size() and, with
  // `sync`, fsyncs it. Nothing may be appended afterwards.
  absl::Status Close(bool sync);

  // Bytes appended so far: the next Append's file offset.
  int64_t size() const { return size_; }
  // Whether writes still go around the page cache.
  bool direct() const { return direct_; }

 private:
  struct FreeAligned {
    void operator()(char* p) const;
  };
  DataFileWriter(std::string path, base::UniqueFd fd, bool direct);

  // Writes [data, data + n) at `offset`; while direct, n and offset are
  // multiples of kDirectAlignment and data is aligned to it.
  absl::Status WriteAt(const char* data, size_t n, int64_t offset);
  // Writes the buffer's `used_` bytes (padded to a block while direct).
  absl::Status Flush();

  std::string path_;
  base::UniqueFd fd_;
  bool direct_;
  int64_t size_ = 0;
  // Bytes of the file that lie in the buffer start at size_ - used_.
  std::unique_ptr<char, FreeAligned> buffer_;
  size_t used_ = 0;
};

}  // namespace ember::distributed::checkpoint

#endif  // EMBER_DISTRIBUTED_CHECKPOINT_DATA_FILE_H_
