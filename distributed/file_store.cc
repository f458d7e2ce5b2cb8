#include "distributed/file_store.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "distributed/store_util.h"
#include "tensor/status_macros.h"

// Note [FileStore format and locking]
// The file is an append-only log: an 8-byte magic, then records of
//   kind (1 byte: 'S' set, 'D' delete, 'U' user count change)
//   key length, value length (4 bytes each, little-endian), key, value.
// Every FileStore keeps the map the log describes and the offset it has read
// up to; each operation takes the file's lock, applies the records appended
// since, and (for writes) appends its own record at the end. Nothing is ever
// rewritten in place, so a reader never sees a half-updated value; a record
// cut short by a writer that died mid-append is dropped by the next writer.
//
// Locks are open-file-description locks (F_OFD_SETLK) over the whole file.
// They are byte-range locks, which NFS carries to the server (NLM or NFSv4
// locks), and unlike classic POSIX record locks they exclude other file
// descriptors of the same process, so threads and several FileStores in one
// process are serialised too. Acquiring an NFS lock also revalidates the
// client's cached pages of the file, which is why every read happens under
// the lock. Locks are taken with non-blocking attempts until the call's
// timeout, never with F_OFD_SETLKW, so a stopped lock holder cannot hang
// other ranks forever. Where OFD locks are missing (EINVAL), flock(2) stands
// in; Linux maps it onto whole-file byte-range locks on NFS as well.
//
// 'U' records count the FileStores that have the file open; the last one to
// close removes the file so that the path can serve the next job.

namespace ember::distributed {
namespace {

constexpr char kMagic[8] = {'E', 'M', 'B', 'R', 'F', 'S', '0', '1'};
constexpr int64_t kHeaderBytes = 8;
constexpr int64_t kRecordHeaderBytes = 9;

// A failed system call on the store's file, "FileStore <path>: <what>
// failed: <strerror>", worded by absl::ErrnoToStatus (which reads the errno
// text thread-safely). The code stays kUnavailable whatever the errno, not
// ErrnoToStatus's code for it: the environment's failures are kUnavailable
// (distributed/README.md "Errors"), and a path that cannot be opened (ENOENT,
// kNotFound to ErrnoToStatus) must read so (file_store_test).
absl::Status ErrnoError(std::string_view what, const std::string& path, int err) {
  return absl::UnavailableError(
      absl::ErrnoToStatus(err, absl::StrCat("FileStore ", path, ": ", std::string(what), " failed"))
          .message());
}

uint32_t ReadLe32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

void AppendLe32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

absl::Status WriteAll(int fd, const std::string& bytes, int64_t offset, const std::string& path) {
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = pwrite(fd, bytes.data() + done, bytes.size() - done, offset + done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return ErrnoError("write", path, n < 0 ? errno : EIO);
    done += n;
  }
  return absl::OkStatus();
}

}  // namespace

// Holds the whole-file lock on `fd` (OFD, or flock as a fallback) until
// destroyed.
class FileStore::Locked {
 public:
  Locked(int fd, bool is_flock) : fd_(fd), is_flock_(is_flock) {}
  Locked(Locked&& other) : fd_(std::exchange(other.fd_, -1)), is_flock_(other.is_flock_) {}
  Locked& operator=(Locked&&) = delete;
  ~Locked() {
    if (fd_ < 0) return;
    if (is_flock_) {
      flock(fd_, LOCK_UN);
      return;
    }
    struct flock lock = {};
    lock.l_type = F_UNLCK;
    lock.l_whence = SEEK_SET;
    fcntl(fd_, F_OFD_SETLK, &lock);
  }

 private:
  int fd_;
  bool is_flock_;
};

absl::StatusOr<FileStore::Locked> FileStore::Lock(bool exclusive, absl::Duration timeout) {
  struct flock lock = {};
  lock.l_type = exclusive ? F_WRLCK : F_RDLCK;
  lock.l_whence = SEEK_SET;  // l_start = l_len = 0: the whole file
  absl::Time deadline = absl::Now() + timeout;
  absl::Duration pause = absl::Microseconds(100);
  while (true) {
    if (use_flock_) {
      if (flock(fd_, (exclusive ? LOCK_EX : LOCK_SH) | LOCK_NB) == 0) return Locked(fd_, true);
    } else {
      if (fcntl(fd_, F_OFD_SETLK, &lock) == 0) return Locked(fd_, false);
      if (errno == EINVAL) {
        // A kernel or file system without OFD locks: flock, which Linux
        // also maps onto byte-range locks on NFS.
        use_flock_ = true;
        continue;
      }
    }
    if (errno != EAGAIN && errno != EACCES && errno != EINTR && errno != EWOULDBLOCK) {
      return ErrnoError("locking", path_, errno);
    }
    if (absl::Now() >= deadline) {
      return absl::UnavailableError(absl::StrCat(
          "FileStore ", path_, ": could not lock the file within ", absl::FormatDuration(timeout),
          "; another process holds its lock (is one stopped?)"));
    }
    absl::SleepFor(pause);
    pause = std::min(pause * 2, absl::Milliseconds(10));
  }
}

absl::Status FileStore::Refresh(bool may_truncate) {
  struct stat st;
  if (fstat(fd_, &st) != 0) return ErrnoError("stat", path_, errno);
  int64_t size = st.st_size;
  if (size <= read_offset_) return absl::OkStatus();
  std::string bytes(size - read_offset_, '\0');
  size_t got = 0;
  while (got < bytes.size()) {
    ssize_t n = pread(fd_, bytes.data() + got, bytes.size() - got, read_offset_ + got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoError("read", path_, errno);
    if (n == 0) break;
    got += n;
  }
  bytes.resize(got);
  size_t pos = 0;
  if (read_offset_ == 0) {
    if (bytes.size() < kHeaderBytes) {
      // A creator died before writing the magic: start the log afresh.
      if (may_truncate && ftruncate(fd_, 0) != 0) return ErrnoError("truncate", path_, errno);
      return absl::OkStatus();
    }
    if (std::memcmp(bytes.data(), kMagic, kHeaderBytes) != 0) {
      return absl::DataLossError(
          absl::StrCat("FileStore ", path_,
                       ": the file is not a FileStore log (bad magic); pass a path "
                       "that does not exist yet or that a FileStore created"));
    }
    pos = kHeaderBytes;
  }
  while (pos + kRecordHeaderBytes <= bytes.size()) {
    char kind = bytes[pos];
    uint64_t key_len = ReadLe32(&bytes[pos + 1]);
    uint64_t value_len = ReadLe32(&bytes[pos + 5]);
    if (pos + kRecordHeaderBytes + key_len + value_len > bytes.size()) break;
    std::string key = bytes.substr(pos + kRecordHeaderBytes, key_len);
    std::string_view value(bytes.data() + pos + kRecordHeaderBytes + key_len, value_len);
    switch (kind) {
      case 'S':
        data_.insert_or_assign(std::move(key), std::string(value));
        break;
      case 'D':
        data_.erase(key);
        break;
      case 'U': {
        EMBER_ASSIGN_OR_RETURN(int64_t delta, internal::ParseCounter("<users>", value));
        users_ += delta;
        break;
      }
      default:
        return absl::DataLossError(absl::StrCat("FileStore ", path_, ": corrupt record kind ",
                                                static_cast<int>(kind), " at offset ",
                                                read_offset_ + pos));
    }
    pos += kRecordHeaderBytes + key_len + value_len;
  }
  read_offset_ += pos;
  if (pos < bytes.size() && may_truncate) {
    // A writer died mid-append; drop its partial record.
    if (ftruncate(fd_, read_offset_) != 0) return ErrnoError("truncate", path_, errno);
  }
  return absl::OkStatus();
}

absl::Status FileStore::Append(char kind, std::string_view key, std::string_view value) {
  // Refresh has read the whole log under the exclusive lock, so read_offset_
  // is the end of the file; an empty file gets the magic first.
  std::string record;
  if (read_offset_ == 0) record.append(kMagic, kHeaderBytes);
  record.push_back(kind);
  AppendLe32(record, key.size());
  AppendLe32(record, value.size());
  record.append(key);
  record.append(value);
  EMBER_RETURN_IF_ERROR(WriteAll(fd_, record, read_offset_, path_));
  // Apply our own record as Refresh would.
  return Refresh(/*may_truncate=*/true);
}

FileStore::FileStore(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}

absl::StatusOr<std::unique_ptr<FileStore>> FileStore::open(const std::string& path,
                                                           absl::Duration timeout) {
  if (path.empty())
    return absl::InvalidArgumentError("FileStore: empty path; pass the file every rank can reach");
  absl::Time deadline = absl::Now() + timeout;
  while (true) {
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return ErrnoError("open", path, errno);
    std::unique_ptr<FileStore> store(new FileStore(path, fd));
    absl::MutexLock lock(&store->mu_);
    store->set_timeout(timeout);
    EMBER_ASSIGN_OR_RETURN(
        Locked locked, store->Lock(true, std::max(deadline - absl::Now(), absl::ZeroDuration())));
    // The last user of an earlier job may have removed the file between our
    // open and our lock; then open the new one.
    struct stat by_fd, by_path;
    if (fstat(fd, &by_fd) != 0) return ErrnoError("stat", path, errno);
    if (stat(path.c_str(), &by_path) != 0 || by_fd.st_ino != by_path.st_ino ||
        by_fd.st_dev != by_path.st_dev) {
      if (absl::Now() >= deadline)
        return ErrnoError("open (the file keeps being replaced)", path, ESTALE);
      continue;
    }
    EMBER_RETURN_IF_ERROR(store->Refresh(/*may_truncate=*/true));
    EMBER_RETURN_IF_ERROR(store->Append('U', "", "1"));
    store->registered_ = true;
    return store;
  }
}

FileStore::~FileStore() {
  absl::MutexLock lock(&mu_);
  if (registered_) {
    absl::StatusOr<Locked> locked = Lock(true, std::min(timeout(), absl::Seconds(10)));
    if (locked.ok() && Refresh(true).ok() && Append('U', "", "-1").ok() && users_ <= 0) {
      unlink(path_.c_str());
    }
  }
  close(fd_);
}

template <typename F>
auto FileStore::Update(F update) {
  absl::MutexLock lock(&mu_);
  using Result = decltype(update());
  absl::StatusOr<Locked> locked = Lock(true, timeout());
  if (!locked.ok()) return Result(locked.status());
  if (absl::Status s = Refresh(true); !s.ok()) return Result(s);
  return update();
}

absl::Status FileStore::set(std::string_view key, std::string_view value) {
  EMBER_RETURN_IF_ERROR(internal::CheckKey(key));
  return Update([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return Append('S', key, value); });
}

absl::StatusOr<int64_t> FileStore::add(std::string_view key, int64_t delta) {
  EMBER_RETURN_IF_ERROR(internal::CheckKey(key));
  return Update([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS -> absl::StatusOr<int64_t> {
    int64_t value = 0;
    if (auto it = data_.find(key); it != data_.end()) {
      EMBER_ASSIGN_OR_RETURN(value, internal::ParseCounter(key, it->second));
    }
    EMBER_ASSIGN_OR_RETURN(value, internal::AddToCounter(key, value, delta));
    EMBER_RETURN_IF_ERROR(Append('S', key, std::to_string(value)));
    return value;
  });
}

absl::StatusOr<std::string> FileStore::compare_set(std::string_view key, std::string_view expected,
                                                  std::string_view desired) {
  EMBER_RETURN_IF_ERROR(internal::CheckKey(key));
  return Update([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS -> absl::StatusOr<std::string> {
    auto it = data_.find(key);
    if (it == data_.end() && !expected.empty()) return std::string(expected);
    if (it != data_.end() && it->second != expected) return it->second;
    EMBER_RETURN_IF_ERROR(Append('S', key, desired));
    return std::string(desired);
  });
}

absl::Status FileStore::append(std::string_view key, std::string_view value) {
  EMBER_RETURN_IF_ERROR(internal::CheckKey(key));
  return Update([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    auto it = data_.find(key);
    std::string combined = it == data_.end() ? std::string() : it->second;
    combined.append(value);
    return Append('S', key, combined);
  });
}

absl::StatusOr<bool> FileStore::delete_key(std::string_view key) {
  EMBER_RETURN_IF_ERROR(internal::CheckKey(key));
  return Update([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS -> absl::StatusOr<bool> {
    if (!data_.contains(key)) return false;
    EMBER_RETURN_IF_ERROR(Append('D', key, ""));
    return true;
  });
}

absl::StatusOr<int64_t> FileStore::num_keys() {
  absl::MutexLock lock(&mu_);
  EMBER_ASSIGN_OR_RETURN(Locked locked, Lock(false, timeout()));
  EMBER_RETURN_IF_ERROR(Refresh(false));
  return static_cast<int64_t>(data_.size());
}

// The shortest wait for the file's lock inside wait(), however little of
// the caller's timeout is left.
constexpr absl::Duration kMinLockWait = absl::Milliseconds(50);

absl::Status FileStore::wait(absl::Span<const std::string> keys, absl::Duration timeout) {
  for (const std::string& key : keys) EMBER_RETURN_IF_ERROR(internal::CheckKey(key));
  absl::Time deadline = absl::Now() + timeout;
  absl::Duration pause = absl::Milliseconds(1);
  while (true) {
    std::vector<std::string> missing;
    {
      absl::MutexLock lock(&mu_);
      // Near the deadline the lock still gets kMinLockWait: another process
      // holding it for a few milliseconds (a loaded machine) is not an
      // error, only a wait that ends without the keys.
      const absl::Duration left = deadline - absl::Now();
      absl::StatusOr<Locked> locked = Lock(false, std::max(left, kMinLockWait));
      if (!locked.ok()) {
        if (absl::IsUnavailable(locked.status()) && left < kMinLockWait) {
          return internal::MissingKeysError("FileStore " + path_,
                                            keys,
                                            timeout);
        }
        return locked.status();
      }
      EMBER_RETURN_IF_ERROR(Refresh(false));
      for (const std::string& key : keys) {
        if (!data_.contains(key)) missing.push_back(key);
      }
    }
    if (missing.empty()) return absl::OkStatus();
    if (absl::Now() >= deadline)
      return internal::MissingKeysError("FileStore " + path_, missing, timeout);
    absl::SleepFor(std::min(pause, std::max(deadline - absl::Now(), absl::ZeroDuration())));
    pause = std::min(pause * 2, absl::Milliseconds(50));
  }
}

absl::StatusOr<std::string> FileStore::get(std::string_view key, absl::Duration timeout) {
  EMBER_RETURN_IF_ERROR(internal::CheckKey(key));
  std::string owned(key);
  EMBER_RETURN_IF_ERROR(wait(absl::MakeConstSpan(&owned, 1), timeout));
  absl::MutexLock lock(&mu_);
  auto it = data_.find(key);
  if (it == data_.end()) return internal::MissingKeysError("FileStore " + path_, {owned}, timeout);
  return it->second;
}

}  // namespace ember::distributed
