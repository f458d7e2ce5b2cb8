#include "distributed/checkpoint/data_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ember::distributed::checkpoint {
namespace {

// The gathering buffer: a multiple of kDirectAlignment.
constexpr size_t kBufferBytes = size_t{4} << 20;
// The most one write call is given.
constexpr size_t kMaxWrite = size_t{1} << 30;

bool Aligned(uint64_t x) { return x % kDirectAlignment == 0; }

}  // namespace

void DataFileWriter::FreeAligned::operator()(char* p) const { std::free(p); }

DataFileWriter::DataFileWriter(std::string path, base::UniqueFd fd, bool direct)
    : path_(std::move(path)), fd_(std::move(fd)), direct_(direct) {}
DataFileWriter::DataFileWriter(DataFileWriter&&) noexcept = default;
DataFileWriter& DataFileWriter::operator=(DataFileWriter&&) noexcept = default;
DataFileWriter::~DataFileWriter() = default;

absl::StatusOr<DataFileWriter> DataFileWriter::Create(const std::string& path, bool direct) {
  constexpr int kFlags = O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC;
  base::UniqueFd fd;
  if (direct) {
    fd.reset(::open(path.c_str(), kFlags | O_DIRECT, 0644));
    // EINVAL: this file system has no direct I/O (Note [Direct writes]).
    if (fd.get() < 0 && errno != EINVAL) {
      return absl::ErrnoToStatus(errno, absl::StrCat("cannot create ", path));
    }
  }
  const bool opened_direct = fd.valid();
  if (!opened_direct) {
    fd.reset(::open(path.c_str(), kFlags, 0644));
    if (fd.get() < 0) return absl::ErrnoToStatus(errno, absl::StrCat("cannot create ", path));
  }
  return DataFileWriter(path, std::move(fd), opened_direct);
}

absl::Status DataFileWriter::WriteAt(const char* data, size_t n, int64_t offset) {
  while (n > 0) {
    const ssize_t w = ::pwrite(fd_.get(), data, std::min(n, kMaxWrite), offset);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EINVAL && direct_) {
        // The file system took O_DIRECT at open but not these aligned bytes:
        // buffered from now on (Note [Direct writes]).
        const int flags = ::fcntl(fd_.get(), F_GETFL);
        if (flags >= 0 && ::fcntl(fd_.get(), F_SETFL, flags & ~O_DIRECT) == 0) {
          direct_ = false;
          continue;
        }
      }
      return absl::ErrnoToStatus(errno, absl::StrCat("cannot write ", path_, " at offset ",
                                                     offset));
    }
    data += w;
    n -= static_cast<size_t>(w);
    offset += w;
  }
  return absl::OkStatus();
}

absl::Status DataFileWriter::Flush() {
  if (used_ == 0) return absl::OkStatus();
  size_t n = used_;
  if (direct_) {
    n = (used_ + kDirectAlignment - 1) / kDirectAlignment * kDirectAlignment;
    std::memset(buffer_.get() + used_, 0, n - used_);
  }
  absl::Status written = WriteAt(buffer_.get(), n, size_ - static_cast<int64_t>(used_));
  used_ = 0;
  return written;
}

absl::Status DataFileWriter::Append(const void* data, size_t n) {
  if (!fd_.valid()) {
    return absl::FailedPreconditionError(absl::StrCat("data file ", path_, " is closed"));
  }
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    if (!direct_) {
      absl::Status flushed = Flush();
      if (!flushed.ok()) return flushed;
      absl::Status written = WriteAt(p, n, size_);
      if (!written.ok()) return written;
      size_ += static_cast<int64_t>(n);
      return absl::OkStatus();
    }
    // From the caller's memory: the buffer is empty (so size_ is on a block)
    // and the bytes start on a block.
    if (used_ == 0 && Aligned(reinterpret_cast<uintptr_t>(p)) && n >= kDirectAlignment) {
      const size_t m = n / kDirectAlignment * kDirectAlignment;
      absl::Status written = WriteAt(p, m, size_);
      if (!written.ok()) return written;
      size_ += static_cast<int64_t>(m);
      p += m;
      n -= m;
      continue;
    }
    if (buffer_ == nullptr) {
      buffer_.reset(static_cast<char*>(std::aligned_alloc(kDirectAlignment, kBufferBytes)));
      if (buffer_ == nullptr) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "cannot allocate the ", kBufferBytes, "-byte write buffer of ", path_));
      }
    }
    const size_t c = std::min(n, kBufferBytes - used_);
    std::memcpy(buffer_.get() + used_, p, c);
    used_ += c;
    size_ += static_cast<int64_t>(c);
    p += c;
    n -= c;
    if (used_ == kBufferBytes) {
      absl::Status flushed = Flush();
      if (!flushed.ok()) return flushed;
    }
  }
  return absl::OkStatus();
}

absl::Status DataFileWriter::Close(bool sync) {
  if (!fd_.valid()) {
    return absl::FailedPreconditionError(absl::StrCat("data file ", path_, " is closed"));
  }
  absl::Status status = Flush();
  // A padded last block leaves the file longer than what was appended.
  if (status.ok() && ::ftruncate(fd_.get(), size_) != 0) {
    status = absl::ErrnoToStatus(errno, absl::StrCat("cannot truncate ", path_, " to ", size_,
                                                     " bytes"));
  }
  if (status.ok() && sync && ::fsync(fd_.get()) != 0) {
    status = absl::ErrnoToStatus(errno, absl::StrCat("cannot fsync ", path_));
  }
  fd_.reset();
  buffer_.reset();
  return status;
}

}  // namespace ember::distributed::checkpoint
