#include "multiprocessing/shared_segment.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/shared_mapping.h"
#include "multiprocessing/manager_client.h"
#include "multiprocessing/manager_protocol.h"
#include "tensor/status_macros.h"

namespace ember::multiprocessing {

// Note [Segment reference counting]
// The header's count is the number of holders of a region across processes:
// one per live SharedSegment (a mapping in some process) plus one per message
// in flight. A sender takes a reference for each message (so a region
// survives its sender dropping it before the receiver maps it, as PyTorch's
// _shared_incref does); the receiver adopts it, or drops it when it already
// maps the region. fork() gives the child a copy of every mapping, so the
// prepare handler takes one reference per live segment on the child's
// behalf; a process's exit drops its references (ReleaseAllAtExit), and one
// killed outright leaves its references behind, which is what the shm manager
// is for. At zero, a file_system region is unlinked; a memfd needs nothing.
//
// Note [Segment reuse]
// Creating a region costs a memfd or shm_open, an fallocate that zeroes every
// page and an mmap; a sender of fresh tensors pays that per message. Regions
// this process created go back to a small cache when their storage dies and
// are reused once the count shows no other holder (count == 1: the cache's
// own mapping), which makes repeated sends of same-sized tensors cheap.
// Receivers likewise keep the mappings of regions whose storages died (without
// a reference or a descriptor: just the address range), so a region that
// comes back is not mapped again. Each cache holds at most
// $EMBER_SHM_CACHE_BYTES (default 256 MiB); empty_shared_memory_cache() frees
// both.
//
// Note [Dedup]
// A process maps a region once however often it receives it: descriptors are
// keyed by (device, inode), names by name, and a region already mapped here
// (received earlier, or created here) is handed out again, the message's
// reference dropped. Each received tensor gets its own Storage handle over
// the same bytes.
struct SharedSegment::Header {
  uint64_t magic;
  std::atomic<int64_t> refcount;
  uint64_t capacity;
  uint64_t reserved[5];
};

namespace {

constexpr uint64_t kSegmentMagic = 0x544E454D47455345;  // "ESEGMENT"
constexpr size_t kHeaderAlign = 64;
constexpr size_t kPage = 4096;
constexpr size_t kMaxSpareMappings = 64;

size_t HeaderOffset(size_t capacity) {
  return (capacity + kHeaderAlign - 1) / kHeaderAlign * kHeaderAlign;
}
size_t MappedBytes(size_t capacity) { return HeaderOffset(capacity) + 64; }

size_t CacheLimitFromEnv() {
  int64_t bytes = 256 << 20;
  if (const char* v = std::getenv("EMBER_SHM_CACHE_BYTES")) {
    if (!absl::SimpleAtoi(v, &bytes) || bytes < 0) bytes = 256 << 20;
  }
  return static_cast<size_t>(bytes);
}

std::string ErrnoText(int err) { return std::strerror(err); }

// How many descriptors this process has open, and its soft limit.
std::pair<long, long> DescriptorUsage() {
  rlimit rl{};
  ::getrlimit(RLIMIT_NOFILE, &rl);
  long limit = rl.rlim_cur == RLIM_INFINITY ? (1L << 20) : static_cast<long>(rl.rlim_cur);
  long open = 0;
  for (long fd = 0; fd < std::min(limit, 1L << 20); ++fd) {
    if (::fcntl(static_cast<int>(fd), F_GETFD) != -1) ++open;
  }
  return {open, limit};
}

absl::Status DescriptorLimitError(const std::string& what) {
  auto [open, limit] = DescriptorUsage();
  return absl::ResourceExhaustedError(
      absl::StrCat(what, ": this process has ", open,
                   " file descriptors open and its limit (RLIMIT_NOFILE) is ", limit,
                   ". The file_descriptor sharing strategy keeps one descriptor per shared "
                   "storage; raise "
                   "the limit (ulimit -n, setrlimit) or call "
                   "set_sharing_strategy(\"file_system\")"));
}

struct PrefixState {
  std::mutex mu;
  std::string prefix;
};
PrefixState& Prefix() {
  static PrefixState* p = [] {
    auto* s = new PrefixState;
    const char* env = std::getenv("EMBER_SHM_PREFIX");
    s->prefix = "/ember";
    if (env != nullptr && IsValidRegionName(absl::StrCat(env, "_0_0_00000000")) &&
        std::strlen(env) <= 201) {
      s->prefix = env;
    }
    return s;
  }();
  return *p;
}

}  // namespace

absl::Status SetRegionNamePrefix(std::string_view prefix) {
  if (prefix.size() > 201 ||
      !IsValidRegionName(absl::StrCat(std::string(prefix), "_0_0_00000000"))) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared-memory prefix '", std::string(prefix),
                     "' is not valid: it must be '/' followed by up to 200 of "
                     "[A-Za-z0-9_.-], e.g. '/myjob'"));
  }
  std::lock_guard lock(Prefix().mu);
  Prefix().prefix = std::string(prefix);
  return absl::OkStatus();
}

std::string RegionNamePrefix() {
  std::lock_guard lock(Prefix().mu);
  return Prefix().prefix;
}

// The process-wide tables; never destroyed, so that segments outliving
// static destruction still find them.
struct SegmentTables {
  std::mutex mu;
  std::unordered_set<SharedSegment*> live;
  std::unordered_map<std::string, std::weak_ptr<SharedSegment>> by_key;
  std::map<std::pair<int, size_t>, std::vector<std::shared_ptr<SharedSegment>>> cache;
  size_t cached_bytes = 0;
  size_t cache_limit = CacheLimitFromEnv();
  // Mappings of received regions whose storages died, kept so that a region
  // received again is not mapped again (Note [Segment reuse]); they hold no
  // reference and no descriptor.
  struct Spare {
    std::string key;
    void* base;
    size_t mapped;
  };
  std::deque<Spare> spare;
  size_t spare_bytes = 0;
  bool exiting = false;
  uint64_t counter = 0;
  pid_t pid = ::getpid();  // getpid() is a system call; this is refreshed on fork

  // Keeps a dying mapping (holds mu). Returns the mappings to unmap.
  std::vector<Spare> AddSpare(Spare s) {
    std::vector<Spare> out;
    if (exiting || s.mapped > cache_limit) {
      out.push_back(std::move(s));
      return out;
    }
    spare_bytes += s.mapped;
    spare.push_back(std::move(s));
    // A region nobody holds any more (count 0) can never arrive again: unmap
    // it rather than keep its memory alive.
    for (auto it = spare.begin(); it != spare.end();) {
      auto* h =
          reinterpret_cast<SharedSegment::Header*>(static_cast<char*>(it->base) + it->mapped - 64);
      if (h->refcount.load(std::memory_order_acquire) <= 0) {
        spare_bytes -= it->mapped;
        out.push_back(std::move(*it));
        it = spare.erase(it);
      } else {
        ++it;
      }
    }
    while (spare.size() > kMaxSpareMappings || spare_bytes > cache_limit) {
      spare_bytes -= spare.front().mapped;
      out.push_back(std::move(spare.front()));
      spare.pop_front();
    }
    return out;
  }
  // A kept mapping of `key` with `mapped` bytes, or null (holds mu).
  void* TakeSpare(const std::string& key, size_t mapped) {
    for (auto it = spare.begin(); it != spare.end(); ++it) {
      if (it->key == key) {
        void* base = it->mapped == mapped ? it->base : nullptr;
        if (base == nullptr) ::munmap(it->base, it->mapped);
        spare_bytes -= it->mapped;
        spare.erase(it);
        return base;
      }
    }
    return nullptr;
  }

  static SegmentTables& Get() {
    static SegmentTables* t = [] {
      auto* tables = new SegmentTables;
      pthread_atfork(&PrepareFork, &AfterForkInParent, &AfterForkInChild);
      std::atexit(&SharedSegment::ReleaseAllAtExit);
      return tables;
    }();
    return *t;
  }

  // Set around the fork() of ForkToExec on the forking thread.
  static inline thread_local bool fork_to_exec = false;

  static void PrepareFork() {
    SegmentTables& t = Get();
    t.mu.lock();
    if (fork_to_exec) return;
    for (SharedSegment* s : t.live) {
      if (!s->released_) s->header()->refcount.fetch_add(1, std::memory_order_relaxed);
    }
  }
  static void AfterForkInParent() { Get().mu.unlock(); }
  static void AfterForkInChild() {
    SegmentTables& t = Get();
    t.pid = ::getpid();
    // The parent's cached regions are the parent's to reuse.
    auto cache = std::move(t.cache);
    t.cache.clear();
    t.cached_bytes = 0;
    t.mu.unlock();
    cache.clear();
  }
};

pid_t SharedSegment::ForkToExec() {
  SegmentTables::Get();  // the fork handlers are installed
  SegmentTables::fork_to_exec = true;
  const pid_t pid = ::fork();
  SegmentTables::fork_to_exec = false;
  return pid;
}

SharedSegment::SharedSegment(SharingStrategy strategy, void* base, size_t capacity,
                             base::UniqueFd fd, std::string name, std::string key,
                             bool created_here)
    : strategy_(strategy),
      base_(base),
      capacity_(capacity),
      fd_(std::move(fd)),
      name_(std::move(name)),
      key_(std::move(key)),
      creator_pid_(created_here ? SegmentTables::Get().pid : 0) {}

SharedSegment::Header* SharedSegment::header() const {
  static_assert(sizeof(Header) == 64);
  return reinterpret_cast<Header*>(static_cast<char*>(base_) + HeaderOffset(capacity_));
}

int64_t SharedSegment::refcount() const {
  return header()->refcount.load(std::memory_order_acquire);
}

void SharedSegment::AddMessageReference() {
  header()->refcount.fetch_add(1, std::memory_order_relaxed);
}

void SharedSegment::DropMessageReference() {
  // This mapping still holds a reference, so the count cannot reach zero.
  header()->refcount.fetch_sub(1, std::memory_order_acq_rel);
}

bool SharedSegment::Release() {
  if (released_) return false;
  released_ = true;
  return header()->refcount.fetch_sub(1, std::memory_order_acq_rel) == 1 && !name_.empty();
}

namespace {
// Called without the tables' lock (the manager client has its own).
void UnlinkRegion(const std::string& name) {
  ::shm_unlink(name.c_str());
  UnregisterRegion(name);
}
}  // namespace

SharedSegment::~SharedSegment() {
  SegmentTables& t = SegmentTables::Get();
  bool unlink;
  std::vector<SegmentTables::Spare> unmap;
  {
    std::lock_guard lock(t.mu);
    t.live.erase(this);
    if (auto it = t.by_key.find(key_); it != t.by_key.end() && it->second.expired()) {
      t.by_key.erase(it);
    }
    unlink = Release();
    SegmentTables::Spare mapping{key_, base_, MappedBytes(capacity_)};
    if (creator_pid_ == 0 && !unlink) {
      unmap = t.AddSpare(std::move(mapping));
    } else {
      unmap.push_back(std::move(mapping));
    }
  }
  for (const SegmentTables::Spare& m : unmap) ::munmap(m.base, m.mapped);
  if (unlink) UnlinkRegion(name_);
}

absl::StatusOr<std::shared_ptr<SharedSegment>> SharedSegment::Map(SharingStrategy strategy,
                                                                  base::UniqueFd fd,
                                                                  std::string name, std::string key,
                                                                  off_t size) {
  const std::string what =
      name.empty() ? std::string("received descriptor") : "region '" + name + "'";
  if (size < 64 || (size - 64) % kHeaderAlign != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " (", size, " bytes) is not an Ember shared-memory segment"));
  }
  const size_t mapped = static_cast<size_t>(size);
  void* base;
  {
    SegmentTables& t = SegmentTables::Get();
    std::lock_guard lock(t.mu);
    base = t.TakeSpare(key, mapped);
  }
  if (base == nullptr) {
    base = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    if (base == MAP_FAILED) {
      return absl::ResourceExhaustedError(
          absl::StrCat("mmap of ", mapped, " bytes of ", what, ": ", ErrnoText(errno)));
    }
  }
  return Adopt(strategy, base, mapped, std::move(fd), std::move(name), std::move(key));
}

absl::StatusOr<std::shared_ptr<SharedSegment>> SharedSegment::Adopt(SharingStrategy strategy,
                                                                    void* base, size_t mapped,
                                                                    base::UniqueFd fd,
                                                                    std::string name,
                                                                    std::string key) {
  auto* h = reinterpret_cast<Header*>(static_cast<char*>(base) + mapped - 64);
  if (h->magic != kSegmentMagic || HeaderOffset(h->capacity) + 64 != mapped) {
    ::munmap(base, mapped);
    return absl::InvalidArgumentError(
        absl::StrCat(name.empty() ? std::string("received descriptor") : "region '" + name + "'",
                     " has no valid Ember segment header"));
  }
  if (strategy == SharingStrategy::kFileSystem) fd.reset();  // the mapping is enough
  std::shared_ptr<SharedSegment> seg(
      new SharedSegment(strategy, base, h->capacity, std::move(fd), std::move(name), key, false));
  SegmentTables& t = SegmentTables::Get();
  std::lock_guard lock(t.mu);
  t.live.insert(seg.get());
  t.by_key[key] = seg;
  return seg;
}

absl::StatusOr<std::shared_ptr<SharedSegment>> SharedSegment::Create(SharingStrategy strategy,
                                                                     size_t capacity) {
  SegmentTables& t = SegmentTables::Get();
  const size_t mapped = MappedBytes(capacity);
  base::UniqueFd fd;
  std::string name;
  if (strategy == SharingStrategy::kFileDescriptor) {
    fd.reset(::memfd_create("ember_shm", MFD_CLOEXEC));
    if (!fd.valid()) {
      if (errno == EMFILE || errno == ENFILE) {
        return DescriptorLimitError("cannot create a shared-memory descriptor");
      }
      return absl::ResourceExhaustedError(absl::StrCat("memfd_create: ", ErrnoText(errno)));
    }
  } else {
    uint32_t random = 0;
    (void)!::getrandom(&random, sizeof(random), 0);
    uint64_t n;
    {
      std::lock_guard lock(t.mu);
      n = t.counter++;
    }
    name = FormatRegionName({RegionNamePrefix(), ::getpid(), n, random});
    // Registered before it exists, so that no crash can leave it unrecorded.
    EMBER_RETURN_IF_ERROR(RegisterRegion(name));
    fd.reset(::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600));
    if (!fd.valid()) {
      int err = errno;
      UnregisterRegion(name);
      if (err == EMFILE || err == ENFILE) {
        return DescriptorLimitError(absl::StrCat("cannot open shared-memory region '", name, "'"));
      }
      return absl::UnavailableError(
          absl::StrCat("shm_open('", name, "') in /dev/shm: ", ErrnoText(err)));
    }
  }
  auto fail = [&](absl::Status s) {
    if (!name.empty()) {
      ::shm_unlink(name.c_str());
      UnregisterRegion(name);
    }
    return s;
  };
  const std::string what = absl::StrCat("a storage of ", capacity, " bytes (",
                                        name.empty() ? "memfd" : "/dev/shm" + name, ")");
  if (absl::Status s = base::reserve_pages(fd.get(), mapped, what); !s.ok()) return fail(s);
  absl::StatusOr<void*> mapping = base::map_shared(fd.get(), mapped, what);
  if (!mapping.ok()) return fail(mapping.status());
  void* base = *mapping;
  auto* h = reinterpret_cast<Header*>(static_cast<char*>(base) + HeaderOffset(capacity));
  h->capacity = capacity;
  h->refcount.store(1, std::memory_order_relaxed);
  h->magic = kSegmentMagic;
  std::string key;
  if (strategy == SharingStrategy::kFileDescriptor) {
    struct stat st {};
    ::fstat(fd.get(), &st);
    key = absl::StrCat("fd:", st.st_dev, ":", st.st_ino);
  } else {
    key = "name:" + name;
    fd.reset();
  }
  std::shared_ptr<SharedSegment> seg(
      new SharedSegment(strategy, base, capacity, std::move(fd), std::move(name), key, true));
  std::lock_guard lock(t.mu);
  t.live.insert(seg.get());
  t.by_key[key] = seg;
  return seg;
}

absl::StatusOr<std::shared_ptr<SharedSegment>> SharedSegment::Acquire(SharingStrategy strategy,
                                                                      size_t nbytes) {
  const size_t capacity = (nbytes + kPage - 1) / kPage * kPage;
  SegmentTables& t = SegmentTables::Get();
  {
    std::lock_guard lock(t.mu);
    auto it = t.cache.find({static_cast<int>(strategy), capacity});
    if (it != t.cache.end()) {
      auto& list = it->second;
      for (size_t i = 0; i < list.size(); ++i) {
        // Free when no process but this one holds it and nothing here uses
        // the mapping (a received storage may share it: Note [Dedup]).
        if (list[i].use_count() == 1 && list[i]->refcount() == 1) {
          std::shared_ptr<SharedSegment> seg = std::move(list[i]);
          list.erase(list.begin() + i);
          t.cached_bytes -= capacity;
          return seg;
        }
      }
    }
  }
  return Create(strategy, capacity);
}

absl::StatusOr<std::shared_ptr<SharedSegment>> SharedSegment::ImportFd(base::UniqueFd fd) {
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("received an unusable descriptor: ", ErrnoText(errno)));
  }
  std::string key = absl::StrCat("fd:", st.st_dev, ":", st.st_ino);
  SegmentTables& t = SegmentTables::Get();
  {
    std::lock_guard lock(t.mu);
    if (auto it = t.by_key.find(key); it != t.by_key.end()) {
      if (std::shared_ptr<SharedSegment> seg = it->second.lock()) {
        seg->DropMessageReference();
        return seg;
      }
    }
  }
  return Map(SharingStrategy::kFileDescriptor, std::move(fd), "", key, st.st_size);
}

absl::StatusOr<std::shared_ptr<SharedSegment>> SharedSegment::ImportName(const std::string& name) {
  if (!IsValidRegionName(name)) {
    return absl::InvalidArgumentError(absl::StrCat("'", name, "' is not a region name"));
  }
  std::string key = "name:" + name;
  SegmentTables& t = SegmentTables::Get();
  SegmentTables::Spare kept{};
  {
    std::lock_guard lock(t.mu);
    if (auto it = t.by_key.find(key); it != t.by_key.end()) {
      if (std::shared_ptr<SharedSegment> seg = it->second.lock()) {
        seg->DropMessageReference();
        return seg;
      }
    }
    // A region mapped before (and reused by its sender) needs no shm_open:
    // names are never reused, so the kept mapping is that region.
    for (auto it = t.spare.begin(); it != t.spare.end(); ++it) {
      if (it->key == key) {
        kept = *it;
        t.spare_bytes -= it->mapped;
        t.spare.erase(it);
        break;
      }
    }
  }
  if (kept.base != nullptr) {
    return Adopt(SharingStrategy::kFileSystem, kept.base, kept.mapped, base::UniqueFd(), name, key);
  }
  // Keep the daemon alive while this process maps regions.
  EMBER_RETURN_IF_ERROR(ConnectToManager());
  base::UniqueFd fd(::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0));
  if (!fd.valid()) {
    if (errno == EMFILE || errno == ENFILE) {
      return DescriptorLimitError(absl::StrCat("cannot open shared-memory region '", name, "'"));
    }
    return absl::NotFoundError(
        absl::StrCat("shared-memory region '", name, "' cannot be opened (", ErrnoText(errno),
                     "): it was released, or its creator was killed before the "
                     "message was received"));
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    return absl::InternalError(absl::StrCat("fstat of region '", name, "': ", ErrnoText(errno)));
  }
  return Map(SharingStrategy::kFileSystem, std::move(fd), name, key, st.st_size);
}

void SharedSegment::Recycle(std::shared_ptr<SharedSegment> segment) {
  SegmentTables& t = SegmentTables::Get();
  std::vector<std::shared_ptr<SharedSegment>> evicted;
  {
    std::lock_guard lock(t.mu);
    const size_t cap = segment->capacity_;
    // Another storage of this process still maps it (Note [Dedup]): the
    // last one to die recycles it, so that the cache holds each region once.
    if (segment.use_count() > 1) return;
    if (t.exiting || segment->released_ || segment->creator_pid_ != t.pid || cap > t.cache_limit) {
      // Freed below, outside the lock.
    } else {
      // Make room by evicting regions no other process holds.
      for (auto it = t.cache.begin(); it != t.cache.end() && t.cached_bytes + cap > t.cache_limit;
           ++it) {
        auto& list = it->second;
        for (size_t i = list.size(); i-- > 0 && t.cached_bytes + cap > t.cache_limit;) {
          if (list[i].use_count() == 1 && list[i]->refcount() == 1) {
            t.cached_bytes -= list[i]->capacity_;
            evicted.push_back(std::move(list[i]));
            list.erase(list.begin() + i);
          }
        }
      }
      if (t.cached_bytes + cap <= t.cache_limit) {
        t.cached_bytes += cap;
        t.cache[{static_cast<int>(segment->strategy_), cap}].push_back(std::move(segment));
      }
    }
  }
  // `segment` (if not cached) and `evicted` are destroyed here, unlocked.
}

void SharedSegment::EmptyCache() {
  SegmentTables& t = SegmentTables::Get();
  std::map<std::pair<int, size_t>, std::vector<std::shared_ptr<SharedSegment>>> cache;
  std::deque<SegmentTables::Spare> spare;
  {
    std::lock_guard lock(t.mu);
    cache.swap(t.cache);
    t.cached_bytes = 0;
    spare.swap(t.spare);
    t.spare_bytes = 0;
  }
  for (const SegmentTables::Spare& m : spare) ::munmap(m.base, m.mapped);
}

void SharedSegment::ReleaseAllAtExit() {
  SegmentTables& t = SegmentTables::Get();
  std::vector<std::string> unlink;
  {
    std::lock_guard lock(t.mu);
    t.exiting = true;
    for (SharedSegment* s : t.live) {
      if (s->Release()) unlink.push_back(s->name_);
    }
  }
  for (const std::string& name : unlink) UnlinkRegion(name);
  DisconnectFromManager();
}

}  // namespace ember::multiprocessing
