#include "tools/shm_manager/server.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "multiprocessing/manager_protocol.h"
#include "base/unique_fd.h"

namespace ember::shm_manager {
namespace {

using multiprocessing::EncodeFrame;
using multiprocessing::Frame;
using multiprocessing::FrameReader;
using multiprocessing::FrameType;
using base::UniqueFd;

// Note [Reaping a dead manager]
// A daemon killed outright (SIGKILL, OOM) can no longer unlink the regions of
// clients that die after it; they would stay in /dev/shm, and its directory
// in /tmp, for good. So each daemon keeps its registrations in a journal
// beside its socket, written before a registration is acknowledged (a region
// is created only after its ack, so none exists unrecorded), and holds an
// flock on a lock file for its whole life; the kernel drops the lock when the
// daemon dies, however it dies. The next daemon to start in the same parent
// directory takes the lock of each dead sibling and replays its journal.
// Each recorded region whose client is gone (a process is identified by pid
// and start time, so a reused pid is not mistaken for it) is unlinked, if
// it still exists and belongs to the client's user. One whose client still
// runs is adopted: recorded in the new journal and watched through a pidfd,
// and unlinked when that client dies, as if it had been this daemon's client
// all along. The journal is not fsync'd: a completed write() sits in the
// kernel's page cache and survives the daemon's death, the failure it is for;
// fsync would add only a machine crash, after which /dev/shm is empty anyway,
// and costs ~2.3 ms per registration on an ext4 /tmp. The lock file appears only once locked (it is
// created under another name and renamed), so a starting daemon is never taken for a dead one.
// The lock file holds the daemon's pid and pid namespace: a journal written
// in another pid namespace (another container or sandbox) names processes
// this daemon cannot see, so such a directory is left alone.

constexpr char kLockFile[] = "lock";
constexpr char kJournalFile[] = "journal";
constexpr char kJournalTemp[] = "journal.tmp";
constexpr char kSiblingPrefix[] = "ember-shm-";
// A client that sends frames faster than it reads the answers is not read
// until they drain.
constexpr size_t kMaxOutbox = 64 << 10;
// A dead predecessor's journal is read up to this size.
constexpr size_t kMaxJournalRead = 64 << 20;

std::string Dirname(const std::string& path) {
  size_t cut = path.rfind('/');
  if (cut == std::string::npos) return ".";
  return cut == 0 ? "/" : path.substr(0, cut);
}

std::string ShmPath(const std::string& name) { return "/dev/shm" + name; }

bool RegionExists(const std::string& name) {
  struct stat st;
  return ::lstat(ShmPath(name).c_str(), &st) == 0;
}

// Unlinks region `name` if it exists and belongs to `uid`.
void UnlinkIfOwnedBy(const std::string& name, uid_t uid) {
  struct stat st;
  if (::lstat(ShmPath(name).c_str(), &st) != 0) return;
  if (st.st_uid != uid) {
    std::fprintf(stderr,
                 "shm_manager: left region '%s' alone: it belongs to uid %u, "
                 "not to uid %u that registered it\n",
                 name.c_str(), st.st_uid, uid);
    return;
  }
  ::shm_unlink(name.c_str());
}

// The start time of process `pid` (field 22 of /proc/<pid>/stat, in clock
// ticks since boot), or std::nullopt when no such process runs.
std::optional<uint64_t> ProcessStartTime(pid_t pid) {
  UniqueFd fd(::open(absl::StrCat("/proc/", pid, "/stat").c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return std::nullopt;
  char buf[1024];
  ssize_t n = ::read(fd.get(), buf, sizeof(buf) - 1);
  if (n <= 0) return std::nullopt;
  std::string_view stat(buf, n);
  // The command name (field 2) may hold spaces and parentheses: fields
  // resume after the last ')'.
  size_t close = stat.rfind(')');
  if (close == std::string_view::npos) return std::nullopt;
  std::vector<std::string> fields =
      absl::StrSplit(std::string(stat.substr(close + 1)), ' ', absl::SkipEmpty());
  uint64_t start = 0;
  // fields[0] is field 3 (state), so field 22 is fields[19].
  if (fields.size() < 20 || !absl::SimpleAtoi(fields[19], &start)) return std::nullopt;
  return start;
}

// This process's pid namespace ("pid:[4026531836]"), or "" when unknown.
std::string PidNamespace() {
  char buf[64];
  ssize_t n = ::readlink("/proc/self/ns/pid", buf, sizeof(buf));
  return n > 0 ? std::string(buf, n) : std::string();
}

bool IsRunning(pid_t pid, uint64_t start_time) { return ProcessStartTime(pid) == start_time; }

// True when something accepts connections on the socket at `path`.
bool SocketAnswers(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) return false;
  std::strcpy(addr.sun_path, path.c_str());
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  return fd.valid() && ::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
}

struct Client {
  UniqueFd fd;     // the connection; invalid for an adopted client
  UniqueFd pidfd;  // adopted: readable once the process has exited
  pid_t pid = 0;   // from SO_PEERCRED
  uid_t uid = 0;
  uint64_t start_time = 0;
  bool hello = false;    // kHello received and checked
  bool goodbye = false;  // exited normally
  bool closing = false;  // flush `outbox`, then drop
  FrameReader reader;
  std::string outbox;
  std::set<std::string> regions;
};

// What the daemon knows about one registered region.
struct Record {
  Client* owner = nullptr;  // null once its client said goodbye
  pid_t pid = 0;
  uint64_t start_time = 0;
  uid_t uid = 0;
};

std::string JournalLine(const std::string& name, const Record& r) {
  return absl::StrCat("+ ", r.pid, " ", r.start_time, " ", r.uid, " ", name, "\n");
}

// Replays a journal: the regions registered and not released, in order.
std::map<std::string, Record> ReadJournal(const std::string& path) {
  std::map<std::string, Record> live;
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd.valid()) return live;
  std::string text;
  char buf[65536];
  ssize_t n;
  while (text.size() < kMaxJournalRead && (n = ::read(fd.get(), buf, sizeof(buf))) > 0) {
    text.append(buf, n);
  }
  // A line torn by the crash (no newline) is ignored, as is anything
  // malformed: the journal is a hint, every action on it is checked again.
  size_t end = text.rfind('\n');
  if (end == std::string::npos) return live;
  for (absl::string_view line : absl::StrSplit(absl::string_view(text).substr(0, end), '\n')) {
    std::vector<std::string> f = absl::StrSplit(std::string(line), ' ');
    if (f.size() == 2 && f[0] == "-") {
      live.erase(f[1]);
      continue;
    }
    Record r;
    int64_t pid = 0;
    if (f.size() != 5 || f[0] != "+" || !absl::SimpleAtoi(f[1], &pid) || pid <= 0 ||
        !absl::SimpleAtoi(f[2], &r.start_time) || !absl::SimpleAtoi(f[3], &r.uid) ||
        !multiprocessing::IsValidRegionName(f[4])) {
      continue;
    }
    r.pid = static_cast<pid_t>(pid);
    live[f[4]] = r;
  }
  return live;
}

class Server {
 public:
  explicit Server(const ServerOptions& options)
      : options_(options), dir_(Dirname(options.socket_path)) {}

  // Takes the lock and opens the journal.
  absl::Status Prepare();
  absl::Status Listen();
  // Reaps the dead siblings of this daemon's directory.
  void ReapSiblings();
  void Loop();
  // Removes the journal, lock and directory.
  void Finish();

 private:
  void Accept();
  // Reads what is available; false when the client is gone.
  bool ReadFrom(Client& c);
  void Handle(Client& c, const Frame& f);
  void Register(Client& c, const std::string& name);
  void Unregister(Client& c, const std::string& name);
  void Reject(Client& c, const std::string& why);
  void Drop(size_t index);
  void UnlinkAll();
  void ReapDirectory(const std::string& path, const struct stat& st);
  // Adds a record and its journal line.
  void AddRecord(const std::string& name, const Record& r);
  void RemoveRecord(std::map<std::string, Record>::iterator it);
  void AppendToJournal(const std::string& line);
  void CompactJournal();

  ServerOptions options_;
  std::string dir_;
  UniqueFd listener_;
  UniqueFd lock_;
  UniqueFd journal_;
  size_t journal_bytes_ = 0;
  size_t live_bytes_ = 0;  // of the journal lines of `records_`
  std::vector<std::unique_ptr<Client>> clients_;
  std::map<std::string, Record> records_;
};

absl::Status Server::Prepare() {
  const std::string lock = absl::StrCat(dir_, "/", kLockFile);
  if (UniqueFd other(::open(lock.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW));
      other.valid() && ::flock(other.get(), LOCK_EX | LOCK_NB) != 0) {
    return absl::AlreadyExistsError(
        absl::StrCat("another shm_manager already serves '", dir_, "'"));
  }
  const std::string temp = absl::StrCat(dir_, "/", kLockFile, ".tmp");
  lock_.reset(::open(temp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!lock_.valid() || ::flock(lock_.get(), LOCK_EX | LOCK_NB) != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot create and lock '", temp, "': ", std::strerror(errno)));
  }
  const std::string owner = absl::StrCat(::getpid(), " ", PidNamespace(), "\n");
  (void)!::write(lock_.get(), owner.data(), owner.size());
  if (::rename(temp.c_str(), lock.c_str()) != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot rename '", temp, "': ", std::strerror(errno)));
  }
  const std::string journal = absl::StrCat(dir_, "/", kJournalFile);
  journal_.reset(::open(journal.c_str(),
                        O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!journal_.valid()) {
    return absl::UnavailableError(
        absl::StrCat("cannot create the journal '", journal, "': ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status Server::Listen() {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (options_.socket_path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("socket path '", options_.socket_path,
                                                   "' is longer than ", sizeof(addr.sun_path) - 1,
                                                   " bytes"));
  }
  std::strcpy(addr.sun_path, options_.socket_path.c_str());
  listener_.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!listener_.valid()) return absl::InternalError(absl::StrCat("socket: ", strerror(errno)));
  if (::bind(listener_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(listener_.get(), 128) != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on '", options_.socket_path, "': ", strerror(errno)));
  }
  return absl::OkStatus();
}

void Server::AppendToJournal(const std::string& line) {
  // A journal that cannot be written costs only the reaping after a crash
  // of this daemon; serving goes on.
  if (::write(journal_.get(), line.data(), line.size()) == static_cast<ssize_t>(line.size())) {
    journal_bytes_ += line.size();
  }
  if (journal_bytes_ > kJournalCompactBytes && journal_bytes_ > 2 * live_bytes_) CompactJournal();
}

void Server::CompactJournal() {
  const std::string temp = absl::StrCat(dir_, "/", kJournalTemp);
  UniqueFd fd(
      ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd.valid()) return;
  std::string text;
  for (const auto& [name, r] : records_) text += JournalLine(name, r);
  if (::write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size()) ||
      ::rename(temp.c_str(), absl::StrCat(dir_, "/", kJournalFile).c_str()) != 0) {
    ::unlink(temp.c_str());
    return;
  }
  journal_ = std::move(fd);
  journal_bytes_ = live_bytes_ = text.size();
}

void Server::AddRecord(const std::string& name, const Record& r) {
  records_[name] = r;
  const std::string line = JournalLine(name, r);
  live_bytes_ += line.size();
  AppendToJournal(line);
}

void Server::RemoveRecord(std::map<std::string, Record>::iterator it) {
  live_bytes_ -= std::min(live_bytes_, JournalLine(it->first, it->second).size());
  const std::string line = absl::StrCat("- ", it->first, "\n");
  records_.erase(it);
  AppendToJournal(line);
}

void Server::Accept() {
  while (true) {
    int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return;
    auto c = std::make_unique<Client>();
    c->fd.reset(fd);
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || cred.pid <= 0) {
      Reject(*c, "the daemon cannot tell who this client is (no SO_PEERCRED)");
    } else {
      c->pid = cred.pid;
      c->uid = cred.uid;
    }
    clients_.push_back(std::move(c));
  }
}

void Server::Reject(Client& c, const std::string& why) {
  std::fprintf(stderr, "shm_manager: rejected a client (pid %d): %s\n", c.pid, why.c_str());
  c.outbox += EncodeFrame(FrameType::kError, why.substr(0, multiprocessing::kMaxFramePayload));
  c.closing = true;
}

void Server::Register(Client& c, const std::string& name) {
  std::optional<multiprocessing::RegionName> parts = multiprocessing::ParseRegionName(name);
  if (!parts) {
    return Reject(c, absl::StrCat("'", name.substr(0, 300),
                                  "' is not an Ember region name "
                                  "(<prefix>_<pid>_<counter>_<8 hex digits>)"));
  }
  if (parts->pid != c.pid) {
    return Reject(
        c, absl::StrCat("region '", name, "' carries pid ", parts->pid, " but this client is pid ",
                        c.pid, ": a client registers only the regions it creates"));
  }
  if (records_.contains(name)) {
    return Reject(c, absl::StrCat("region '", name, "' is already registered"));
  }
  if (RegionExists(name)) {
    return Reject(c, absl::StrCat("region '", name,
                                  "' already exists in /dev/shm: a region is registered "
                                  "before its creator makes it, never after"));
  }
  AddRecord(name, Record{&c, c.pid, c.start_time, c.uid});
  c.regions.insert(name);
  c.outbox += EncodeFrame(FrameType::kAck);
}

void Server::Unregister(Client& c, const std::string& name) {
  auto it = records_.find(name);
  if (it == records_.end()) return;  // released twice, or never registered
  if (it->second.owner != &c && RegionExists(name)) {
    return Reject(c, absl::StrCat("region '", name, "' belongs to pid ", it->second.pid,
                                  " and still exists: a client unregisters its own regions, "
                                  "and others' only once unlinked"));
  }
  if (it->second.owner != nullptr) it->second.owner->regions.erase(name);
  RemoveRecord(it);
}

void Server::Handle(Client& c, const Frame& f) {
  if (!c.hello && f.type != FrameType::kHello) {
    return Reject(c, "the first frame must be kHello");
  }
  switch (f.type) {
    case FrameType::kHello: {
      int64_t pid = 0;
      if (c.hello || !absl::SimpleAtoi(f.payload, &pid) || pid <= 0) {
        return Reject(c, absl::StrCat("bad kHello payload '", f.payload.substr(0, 64), "'"));
      }
      if (pid != c.pid) {
        return Reject(c, absl::StrCat("kHello says pid ", pid, " but the connection is from pid ",
                                      c.pid, " (SO_PEERCRED)"));
      }
      c.hello = true;
      c.start_time = ProcessStartTime(c.pid).value_or(0);
      c.outbox += EncodeFrame(FrameType::kAck);
      return;
    }
    case FrameType::kRegister:
      return Register(c, f.payload);
    case FrameType::kUnregister:
      return Unregister(c, f.payload);
    case FrameType::kGoodbye:
      c.goodbye = true;
      return;
    case FrameType::kAck:
    case FrameType::kError:
      return Reject(c, "clients may not send kAck or kError");
  }
}

bool Server::ReadFrom(Client& c) {
  char buf[4096];
  while (c.outbox.size() < kMaxOutbox) {
    ssize_t n = ::recv(c.fd.get(), buf, sizeof(buf), MSG_DONTWAIT);
    if (n == 0) return false;
    if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
    c.reader.Append(buf, n);
    while (!c.closing) {
      absl::StatusOr<std::optional<Frame>> f = c.reader.Next();
      if (!f.ok()) {
        Reject(c, std::string(f.status().message()));
        break;
      }
      if (!f->has_value()) break;
      Handle(c, **f);
    }
    if (c.closing) return true;
  }
  return true;
}

void Server::Drop(size_t index) {
  Client& c = *clients_[index];
  for (const std::string& name : c.regions) {
    auto it = records_.find(name);
    if (it == records_.end()) continue;
    if (c.goodbye) {
      it->second.owner = nullptr;  // may still be in use by other processes
    } else {
      UnlinkIfOwnedBy(name, it->second.uid);  // its creator died: nobody will release it
      RemoveRecord(it);
    }
  }
  clients_.erase(clients_.begin() + index);
}

void Server::UnlinkAll() {
  for (const auto& [name, r] : records_) UnlinkIfOwnedBy(name, r.uid);
  records_.clear();
}

void Server::ReapDirectory(const std::string& path, const struct stat& st) {
  UniqueFd lock(
      ::open(absl::StrCat(path, "/", kLockFile).c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW));
  if (!lock.valid()) {
    // No lock: a starter that died before its daemon ran (or a daemon of an
    // older build). Only an old directory whose socket is dead is taken.
    if (errno != ENOENT || absl::FromTimeT(st.st_mtime) + kStaleDirectoryAge > absl::Now() ||
        SocketAnswers(path + "/manager.sock")) {
      return;
    }
  } else if (::flock(lock.get(), LOCK_EX | LOCK_NB) != 0) {
    return;  // its daemon is alive
  } else {
    // "<pid> <pid namespace>": the journal's pids mean something only in the
    // namespace they were recorded in.
    char owner[128] = {};
    (void)!::pread(lock.get(), owner, sizeof(owner) - 1, 0);
    std::vector<std::string> fields = absl::StrSplit(owner, absl::ByAnyChar(" \n"));
    if (fields.size() < 2 || fields[1] != PidNamespace()) return;
  }
  int unlinked = 0, adopted = 0;
  for (const auto& [name, r] : ReadJournal(absl::StrCat(path, "/", kJournalFile))) {
    if (records_.contains(name)) continue;
    UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, r.pid, 0)));
    // Checked after opening the pidfd, so the process cannot be replaced
    // between the check and the watch.
    if (pidfd.valid() && IsRunning(r.pid, r.start_time)) {
      auto c = std::make_unique<Client>();
      c->pidfd = std::move(pidfd);
      c->pid = r.pid;
      c->uid = r.uid;
      c->start_time = r.start_time;
      c->hello = true;
      c->regions.insert(name);
      Record adopted_record = r;
      adopted_record.owner = c.get();
      AddRecord(name, adopted_record);
      clients_.push_back(std::move(c));
      ++adopted;
    } else {
      UnlinkIfOwnedBy(name, r.uid);
      ++unlinked;
    }
  }
  for (const char* file : {kJournalFile, kJournalTemp, "manager.sock", "lock.tmp", kLockFile}) {
    ::unlink(absl::StrCat(path, "/", file).c_str());
  }
  ::rmdir(path.c_str());
  if (unlinked + adopted > 0) {
    std::fprintf(stderr,
                 "shm_manager: reaped '%s' left by a dead shm_manager: %d region(s) of dead "
                 "clients unlinked, %d of running clients adopted\n",
                 path.c_str(), unlinked, adopted);
  }
}

void Server::ReapSiblings() {
  const std::string parent = Dirname(dir_);
  const std::string own = dir_.substr(dir_.rfind('/') + 1);
  DIR* d = ::opendir(parent.c_str());
  if (d == nullptr) return;
  std::vector<std::string> names;
  while (dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (name.starts_with(kSiblingPrefix) && name != own) names.push_back(std::move(name));
  }
  ::closedir(d);
  for (const std::string& name : names) {
    const std::string path = parent + "/" + name;
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid()) {
      continue;
    }
    ReapDirectory(path, st);
  }
}

void Server::Loop() {
  absl::Time idle_since = absl::Now();
  bool ever_connected = !clients_.empty();
  while (true) {
    std::vector<pollfd> fds;
    fds.push_back({listener_.get(), POLLIN, 0});
    for (const auto& c : clients_) {
      if (!c->fd.valid()) {
        fds.push_back({c->pidfd.get(), POLLIN, 0});
        continue;
      }
      short events = c->outbox.size() < kMaxOutbox ? POLLIN : 0;
      if (!c->outbox.empty()) events |= POLLOUT;
      fds.push_back({c->fd.get(), events, 0});
    }
    int timeout_ms = -1;
    if (clients_.empty()) {
      const absl::Duration idle_limit =
          ever_connected ? options_.grace : std::max(options_.grace, options_.first_client_timeout);
      absl::Duration left = idle_since + idle_limit - absl::Now();
      if (left <= absl::ZeroDuration()) break;
      timeout_ms = static_cast<int>(absl::ToInt64Milliseconds(left)) + 1;
    }
    if (::poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) break;
    // Clients first (indices match `fds`), newest last; then new connections.
    for (size_t i = clients_.size(); i-- > 0;) {
      Client& c = *clients_[i];
      short revents = fds[i + 1].revents;
      bool alive = true;
      if (!c.fd.valid()) {
        alive = revents == 0;  // an adopted client's pidfd: it exited
      } else {
        if (revents & (POLLIN | POLLHUP | POLLERR)) alive = ReadFrom(c);
        if (alive && !c.outbox.empty()) {
          ssize_t n =
              ::send(c.fd.get(), c.outbox.data(), c.outbox.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
          if (n > 0) c.outbox.erase(0, n);
          if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) alive = false;
        }
      }
      if (!alive || (c.closing && c.outbox.empty())) {
        Drop(i);
        if (clients_.empty()) idle_since = absl::Now();
      }
    }
    if (fds[0].revents & POLLIN) {
      Accept();
      ever_connected |= !clients_.empty();
    }
  }
  // Stop accepting before cleaning up, so a late client starts a new daemon
  // rather than registering with one that is leaving.
  listener_.reset();
  ::unlink(options_.socket_path.c_str());
  UnlinkAll();
}

void Server::Finish() {
  journal_.reset();
  ::unlink(absl::StrCat(dir_, "/", kJournalFile).c_str());
  ::unlink(absl::StrCat(dir_, "/", kJournalTemp).c_str());
  // The lock goes last, still held: a daemon starting now sees either a
  // locked directory or one without a lock that is too young to reap.
  ::unlink(absl::StrCat(dir_, "/", kLockFile).c_str());
  ::rmdir(dir_.c_str());  // the private directory, if now empty
  lock_.reset();
}

}  // namespace

absl::Status RunServer(const ServerOptions& options) {
  Server server(options);
  absl::Status listening = server.Prepare();
  if (listening.ok()) listening = server.Listen();
  if (options.ready_fd >= 0) {
    std::string msg = listening.ok() ? "ok\n" : std::string(listening.message()) + "\n";
    (void)!::write(options.ready_fd, msg.data(), msg.size());
    ::close(options.ready_fd);
  }
  if (!listening.ok()) {
    if (!absl::IsAlreadyExists(listening)) server.Finish();
    return listening;
  }
  server.ReapSiblings();
  server.Loop();
  server.Finish();
  return absl::OkStatus();
}

}  // namespace ember::shm_manager
