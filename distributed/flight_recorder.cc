#include "distributed/flight_recorder.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/string_view.h"

namespace ember::distributed {

// Note [Flight recorder]
// Every op that passes the checks of the layer above the backends (Note
// [ProcessGroup layers]) is recorded there: ProcessGroup records it
// (scheduled) once the backend accepted it and hands the entry to the op's
// Work; the backend marks the Work started when its worker picks the op up
// (Work::MarkStarted, the one call a backend makes for this), and finishing
// the Work completes or fails the entry. So tcp, gloo, mpi and any later
// backend are recorded alike, and a backend that never marks its ops
// started still records scheduled -> completed.
//
// The ring is a fixed array of plain entries (no heap memory per op: op and
// dtype names are static strings, the error a fixed buffer), guarded by one
// mutex that is held for a few stores per event: recording costs a lock, a
// clock read and a copy (flight_recorder_benchmark measures it). The
// collective sequence numbers count the group's collectives from 0 in call
// order, the order every rank must issue them in, so entry #n of rank a and
// entry #n of rank b are the same collective when the ranks agree; that is
// what the analyser (tools/launch/fr_trace) compares.
//
// Note [Flight recorder dumps]
// A dump is one text file per process holding every group's ring. It is
// written with write(2) from a fixed buffer and integer formatting of our
// own, so the same code runs in a signal handler: the SIGUSR1 handler (the
// launcher sends it to the surviving workers when one fails), the SIGTERM
// handler (mpirun stops the survivors of a failed job with it) and the
// fatal-signal handlers (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT) write the
// dump without locks or allocation, then hand the signal on. The path is
// computed ahead of time (when a recorder is created, or the rank is set),
// because getenv and gethostname are not async-signal-safe. Each dump goes
// to a temporary file and is renamed over the path, so a reader sees a whole
// dump or the previous one. Dumps can overlap: a signal arrives while a
// failed op's dump is being written (the launcher's SIGUSR1 reaches a rank
// that is dumping its own error), or two threads take signals at once. Each
// writer therefore claims a temporary name of its own ("<path>.tmp",
// "<path>.1.tmp", ...) with one lock-free bit of g_dump_slots; sharing one
// would let the second writer truncate the first's file and the first's
// remaining bytes land in the middle of the renamed dump. Whichever finishes
// last is the dump on disk; every one is whole.

namespace {

constexpr int kMaxRecorders = 256;
std::atomic<FlightRecorder*> g_recorders[kMaxRecorders];
absl::Mutex g_registry_mu;
std::atomic<int> g_rank{-1};
std::atomic<int> g_next_group{0};
// The dump's path, its temporary name and this host's name, precomputed for
// the signal handlers (Note [Flight recorder dumps]).
constexpr int kDumpSlots = 4;  // writers at once: the op's, and signals over it
char g_path[1024];
char g_tmp_paths[kDumpSlots][1040];
std::atomic<unsigned> g_dump_slots{0};  // bit i: g_tmp_paths[i] is being written
static_assert(std::atomic<unsigned>::is_always_lock_free, "claimed from signal handlers");
char g_host[256];

int64_t NowNanos() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// A buffered writer that only makes async-signal-safe calls.
class FdWriter {
 public:
  explicit FdWriter(int fd) : fd_(fd) {}
  ~FdWriter() { Flush(); }
  void Put(const char* s, size_t n) {
    while (n > 0) {
      if (len_ == sizeof(buf_)) Flush();
      size_t take = std::min(n, sizeof(buf_) - len_);
      memcpy(buf_ + len_, s, take);
      len_ += take;
      s += take;
      n -= take;
    }
  }
  void Str(const char* s) { Put(s, strlen(s)); }
  void Int(int64_t v) {
    char tmp[24];
    int i = sizeof(tmp);
    const bool negative = v < 0;
    uint64_t u = negative ? 0 - static_cast<uint64_t>(v) : static_cast<uint64_t>(v);
    do {
      tmp[--i] = static_cast<char>('0' + u % 10);
      u /= 10;
    } while (u != 0);
    if (negative) tmp[--i] = '-';
    Put(tmp + i, sizeof(tmp) - i);
  }
  // "text" with \" \\ \n \t and \xHH escapes: one line, whatever the text.
  void Quoted(const char* s, size_t n) {
    Put("\"", 1);
    static const char kHex[] = "0123456789abcdef";
    for (size_t i = 0; i < n; ++i) {
      const unsigned char c = static_cast<unsigned char>(s[i]);
      if (c == '"' || c == '\\') {
        const char e[2] = {'\\', static_cast<char>(c)};
        Put(e, 2);
      } else if (c == '\n') {
        Put("\\n", 2);
      } else if (c == '\t') {
        Put("\\t", 2);
      } else if (c < 0x20 || c == 0x7f) {
        const char e[4] = {'\\', 'x', kHex[c >> 4], kHex[c & 15]};
        Put(e, 4);
      } else {
        const char ch = static_cast<char>(c);
        Put(&ch, 1);
      }
    }
    Put("\"", 1);
  }
  void Flush() {
    size_t off = 0;
    while (off < len_) {
      ssize_t w = write(fd_, buf_ + off, len_ - off);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) break;
      off += static_cast<size_t>(w);
    }
    len_ = 0;
  }

 private:
  int fd_;
  char buf_[4096];
  size_t len_ = 0;
};

void CopyTruncated(char* dst, size_t cap, absl::string_view src) {
  const size_t n = std::min(src.size(), cap - 1);
  memcpy(dst, src.data(), n);
  dst[n] = '\0';
}

int CurrentRank() {
  const int rank = g_rank.load();
  if (rank >= 0) return rank;
  for (auto& slot : g_recorders) {
    if (FlightRecorder* r = slot.load()) return r->rank();
  }
  return 0;
}

// Expands TORCH_FR_DUMP_TEMP_FILE into g_path (not signal-safe; called at
// creation and when the rank is set).
void RefreshDumpPath() {
  if (g_rank.load() < 0) {
    int rank = -1;
    const char* env = std::getenv("RANK");
    if (env != nullptr && absl::SimpleAtoi(env, &rank) && rank >= 0) g_rank.store(rank);
  }
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  const char* env = std::getenv("TORCH_FR_DUMP_TEMP_FILE");
  std::string pattern = env != nullptr && *env != '\0' ? env : "/tmp/ember_fr_trace_";
  if (pattern.find("%r") == std::string::npos) pattern += "%r.%h";
  const std::string path =
      absl::StrReplaceAll(pattern, {{"%r", absl::StrCat(CurrentRank())},
                                    {"%h", host},
                                    {"%p", absl::StrCat(getpid())}});
  absl::MutexLock lock(&g_registry_mu);
  CopyTruncated(g_host, sizeof(g_host), host);
  CopyTruncated(g_path, sizeof(g_path), path);
  for (int i = 0; i < kDumpSlots; ++i) {
    CopyTruncated(g_tmp_paths[i], sizeof(g_tmp_paths[i]),
                  i == 0 ? path + ".tmp" : absl::StrCat(path, ".", i, ".tmp"));
  }
}

// The whole dump: header, every registered recorder, "end". Signal-safe
// when !locked.
// Claims a temporary name no other writer is using; -1 when all are taken.
int ClaimDumpSlot() {
  unsigned busy = g_dump_slots.load();
  while (true) {
    int slot = 0;
    while (slot < kDumpSlots && (busy & (1u << slot)) != 0) ++slot;
    if (slot == kDumpSlots) return -1;
    if (g_dump_slots.compare_exchange_weak(busy, busy | (1u << slot))) return slot;
  }
}

bool WriteDump(const char* reason, size_t reason_len, bool locked) {
  if (g_path[0] == '\0') return false;
  const int slot = ClaimDumpSlot();
  if (slot < 0) {
    errno = EBUSY;
    return false;
  }
  const char* tmp_path = g_tmp_paths[slot];
  const int fd = open(tmp_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    g_dump_slots.fetch_and(~(1u << slot));
    return false;
  }
  {
    FdWriter w(fd);
    w.Str("# Ember flight recorder dump, format 1 (distributed/README.md, \"Flight recorder\")\n");
    w.Str("process rank=");
    w.Int(CurrentRank());
    w.Str(" host=");
    w.Str(g_host);
    w.Str(" pid=");
    w.Int(getpid());
    w.Str(" time_us=");
    w.Int(NowNanos() / 1000);
    w.Str(" reason=");
    w.Quoted(reason, reason_len);
    w.Str("\n");
    w.Flush();
    for (auto& slot : g_recorders) {
      if (FlightRecorder* r = slot.load()) r->WriteSection(fd, locked);
    }
    w.Str("end\n");
  }
  close(fd);
  const bool renamed = rename(tmp_path, g_path) == 0;
  g_dump_slots.fetch_and(~(1u << slot));
  return renamed;
}

// --- Signals --------------------------------------------------------------------

constexpr int kFatalSignals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
struct sigaction g_previous[65];
std::atomic<bool> g_in_fatal{false};

const char* SignalText(int sig) {
  switch (sig) {
    case SIGSEGV:
      return "fatal signal SIGSEGV";
    case SIGBUS:
      return "fatal signal SIGBUS";
    case SIGFPE:
      return "fatal signal SIGFPE";
    case SIGILL:
      return "fatal signal SIGILL";
    case SIGABRT:
      return "fatal signal SIGABRT";
    case SIGUSR1:
      return "SIGUSR1";
    case SIGTERM:
      return "SIGTERM";
  }
  return "signal";
}

void OnSigusr1(int sig, siginfo_t* info, void* context) {
  const int saved = errno;
  const char* reason = SignalText(sig);
  WriteDump(reason, strlen(reason), /*locked=*/false);
  const struct sigaction& prev = g_previous[sig];
  if (prev.sa_flags & SA_SIGINFO) {
    if (prev.sa_sigaction != nullptr) prev.sa_sigaction(sig, info, context);
  } else if (prev.sa_handler != SIG_DFL && prev.sa_handler != SIG_IGN &&
             prev.sa_handler != nullptr) {
    prev.sa_handler(sig);
  }
  errno = saved;
}

// SIGTERM (mpirun stopping the rest of a job after a rank died, a batch
// system, a launcher): the dump, then the action that was in place: a
// handler is called; the default is restored and the signal raised again
// (delivered when this returns), so the process still ends by SIGTERM. An
// ignored SIGTERM gets no handler (install_flight_recorder_signal_handlers).
void OnSigterm(int sig, siginfo_t* info, void* context) {
  const int saved = errno;
  WriteDump("SIGTERM", strlen("SIGTERM"), /*locked=*/false);
  const struct sigaction& prev = g_previous[sig];
  if (prev.sa_flags & SA_SIGINFO) {
    if (prev.sa_sigaction != nullptr) prev.sa_sigaction(sig, info, context);
  } else if (prev.sa_handler == SIG_DFL) {
    sigaction(sig, &prev, nullptr);
    raise(sig);
  } else if (prev.sa_handler != SIG_IGN) {
    prev.sa_handler(sig);
  }
  errno = saved;
}

void OnFatal(int sig, siginfo_t* info, void* context) {
  if (!g_in_fatal.exchange(true)) {
    const char* reason = SignalText(sig);
    WriteDump(reason, strlen(reason), /*locked=*/false);
  }
  // Hand the signal on: the earlier action comes back and the signal is
  // raised again when this handler returns (it is blocked until then).
  sigaction(sig, &g_previous[sig], nullptr);
  if (g_previous[sig].sa_handler == SIG_IGN) signal(sig, SIG_DFL);  // fatal stays fatal
  raise(sig);
}

}  // namespace

const char* flight_state_name(FlightState state) {
  switch (state) {
    case FlightState::kScheduled:
      return "scheduled";
    case FlightState::kStarted:
      return "started";
    case FlightState::kCompleted:
      return "completed";
    case FlightState::kFailed:
      return "failed";
  }
  return "?";
}

int FlightRecorder::CapacityFromEnv() {
  const char* v = std::getenv("TORCH_FR_BUFFER_SIZE");
  int n = 0;
  if (v == nullptr || !absl::SimpleAtoi(v, &n) || n < 0) return kDefaultCapacity;
  return std::min(n, 1 << 22);
}

FlightRecorder::FlightRecorder(std::string group, std::string backend, int rank, int size,
                               int capacity)
    : backend_(std::move(backend)), rank_(rank), size_(size), capacity_(std::max(capacity, 0)) {
  CopyTruncated(group_, sizeof(group_), group);
  if (capacity_ == 0) return;
  ring_ = std::make_unique<FlightEntry[]>(capacity_);
  {
    absl::MutexLock lock(&g_registry_mu);
    for (int i = 0; i < kMaxRecorders; ++i) {
      FlightRecorder* expected = nullptr;
      if (g_recorders[i].compare_exchange_strong(expected, this)) {
        slot_ = i;
        break;
      }
    }
  }
  RefreshDumpPath();
  const char* signals = std::getenv("EMBER_FR_SIGNALS");
  if (signals == nullptr || std::string_view(signals) != "0") {
    install_flight_recorder_signal_handlers();
  }
}

FlightRecorder::~FlightRecorder() {
  if (slot_ < 0) return;
  absl::MutexLock lock(&g_registry_mu);
  g_recorders[slot_].store(nullptr);
}

std::string FlightRecorder::group_name() const {
  absl::MutexLock lock(&mu_);
  return group_;
}

void FlightRecorder::set_group_name(std::string_view name) {
  absl::MutexLock lock(&mu_);
  CopyTruncated(group_, sizeof(group_), absl::string_view(name.data(), name.size()));
}

int64_t FlightRecorder::Record(const FlightOp& op, int64_t created_ns) {
  if (capacity_ == 0) return -1;
  absl::MutexLock lock(&mu_);
  const int64_t id = next_id_++;
  FlightEntry& e = ring_[id % capacity_];
  e.id = id;
  e.seq = op.collective ? next_collective_++ : next_p2p_++;
  e.collective = op.collective;
  e.op = op.op;
  e.dtype = op.dtype;
  e.in_numel = op.in_numel;
  e.out_numel = op.out_numel;
  e.nbytes = op.nbytes;
  e.peer = op.peer;
  e.tag = op.tag;
  e.timeout_ms = op.timeout_ms;
  e.state = FlightState::kScheduled;
  e.created_ns = created_ns;
  e.started_ns = 0;
  e.finished_ns = 0;
  e.error[0] = '\0';
  if (op.collective) {
    last_enqueued_.store(e.seq, std::memory_order_relaxed);
    last_op_.store(op.op, std::memory_order_relaxed);
  }
  recorded_.store(id + 1, std::memory_order_relaxed);
  return id;
}

FlightEntry* FlightRecorder::Find(int64_t id) {
  if (id < 0 || capacity_ == 0) return nullptr;
  FlightEntry& e = ring_[id % capacity_];
  return e.id == id ? &e : nullptr;
}

void FlightRecorder::Started(int64_t id, int64_t ns) {
  absl::MutexLock lock(&mu_);
  FlightEntry* e = Find(id);
  if (e == nullptr || e->state != FlightState::kScheduled) return;
  e->state = FlightState::kStarted;
  e->started_ns = ns;
  if (e->collective && e->seq > last_started_.load(std::memory_order_relaxed)) {
    last_started_.store(e->seq, std::memory_order_relaxed);
  }
}

bool FlightRecorder::Finished(int64_t id, const absl::Status& status, int64_t ns) {
  absl::MutexLock lock(&mu_);
  FlightEntry* e = Find(id);
  if (e != nullptr) {
    e->finished_ns = ns;
    if (status.ok()) {
      e->state = FlightState::kCompleted;
      if (e->collective && e->seq > last_completed_.load(std::memory_order_relaxed)) {
        last_completed_.store(e->seq, std::memory_order_relaxed);
      }
    } else {
      e->state = FlightState::kFailed;
      CopyTruncated(e->error, sizeof(e->error), status.message());
    }
  }
  if (status.ok() || failed_) return false;
  failed_ = true;
  return true;
}

int64_t FlightRecorder::CollectiveSeq(int64_t id) const {
  if (id < 0 || capacity_ == 0) return -1;
  absl::MutexLock lock(&mu_);
  const FlightEntry& e = ring_[id % capacity_];
  return e.id == id && e.collective ? e.seq : -1;
}

std::vector<FlightEntry> FlightRecorder::entries() const {
  std::vector<FlightEntry> out;
  if (capacity_ == 0) return out;
  absl::MutexLock lock(&mu_);
  const int64_t first = std::max<int64_t>(0, next_id_ - capacity_);
  out.reserve(next_id_ - first);
  for (int64_t id = first; id < next_id_; ++id) out.push_back(ring_[id % capacity_]);
  return out;
}

void FlightRecorder::WriteSection(int fd, bool locked) const {
  if (capacity_ == 0) return;
  if (locked) mu_.Lock();
  FdWriter w(fd);
  w.Str("group name=");
  w.Str(group_);
  w.Str(" backend=");
  w.Str(backend_.c_str());
  w.Str(" rank=");
  w.Int(rank_);
  w.Str(" size=");
  w.Int(size_);
  w.Str(" capacity=");
  w.Int(capacity_);
  const int64_t recorded = recorded_.load(std::memory_order_relaxed);
  w.Str(" recorded=");
  w.Int(recorded);
  w.Str(" last_enqueued=");
  w.Int(last_enqueued());
  w.Str(" last_started=");
  w.Int(last_started());
  w.Str(" last_completed=");
  w.Int(last_completed());
  w.Str("\n");
  const int64_t first = std::max<int64_t>(0, recorded - capacity_);
  for (int64_t id = first; id < recorded; ++id) {
    const FlightEntry& e = ring_[id % capacity_];
    if (e.id != id) continue;  // being overwritten (a signal-time dump)
    w.Str("op group=");
    w.Str(group_);
    w.Str(" id=");
    w.Int(e.id);
    w.Str(" seq=");
    w.Int(e.seq);
    w.Str(e.collective ? " kind=collective op=" : " kind=p2p op=");
    w.Str(e.op);
    w.Str(" dtype=");
    w.Str(e.dtype[0] != '\0' ? e.dtype : "-");
    w.Str(" in_numel=");
    w.Int(e.in_numel);
    w.Str(" out_numel=");
    w.Int(e.out_numel);
    w.Str(" bytes=");
    w.Int(e.nbytes);
    w.Str(" peer=");
    w.Int(e.peer);
    w.Str(" tag=");
    w.Int(e.tag);
    w.Str(" timeout_ms=");
    w.Int(e.timeout_ms);
    w.Str(" state=");
    w.Str(flight_state_name(e.state));
    w.Str(" created_us=");
    w.Int(e.created_ns / 1000);
    w.Str(" started_us=");
    w.Int(e.started_ns / 1000);
    w.Str(" finished_us=");
    w.Int(e.finished_ns / 1000);
    w.Str(" error=");
    w.Quoted(e.error, strnlen(e.error, sizeof(e.error)));
    w.Str("\n");
  }
  w.Flush();
  if (locked) mu_.Unlock();
}

std::string next_flight_group_name() { return absl::StrCat(g_next_group.fetch_add(1)); }

void set_flight_recorder_rank(int rank) {
  g_rank.store(rank);
  RefreshDumpPath();
}

std::string flight_recorder_dump_path() {
  RefreshDumpPath();
  absl::MutexLock lock(&g_registry_mu);
  return g_path;
}

absl::StatusOr<std::string> dump_flight_recorders(std::string_view reason) {
  RefreshDumpPath();
  absl::MutexLock lock(&g_registry_mu);
  if (!WriteDump(reason.data(), reason.size(), /*locked=*/true)) {
    return absl::UnavailableError(absl::StrCat(
        "cannot write the flight recorder dump to '", g_path, "': ", strerror(errno),
        "; set TORCH_FR_DUMP_TEMP_FILE to a writable path pattern"));
  }
  return std::string(g_path);
}

void install_flight_recorder_signal_handlers() {
  static absl::Mutex mu(absl::kConstInit);
  absl::MutexLock lock(&mu);
  // A handler installed after ours (or before the first group) becomes the
  // one chained to.
  auto install = [](int sig, void (*handler)(int, siginfo_t*, void*), int flags) {
    struct sigaction current {};
    if (sigaction(sig, nullptr, &current) != 0) return;
    if ((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == handler) return;
    // An ignored SIGTERM stays ignored (and so stays ignored in programs
    // this one execs, as nohup arranges).
    if (sig == SIGTERM && !(current.sa_flags & SA_SIGINFO) && current.sa_handler == SIG_IGN) {
      return;
    }
    struct sigaction action {};
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_SIGINFO | flags;
    action.sa_sigaction = handler;
    g_previous[sig] = current;
    sigaction(sig, &action, nullptr);
  };
  install(SIGUSR1, &OnSigusr1, SA_RESTART);
  install(SIGTERM, &OnSigterm, SA_RESTART);
  for (int sig : kFatalSignals) install(sig, &OnFatal, SA_ONSTACK);
}

}  // namespace ember::distributed
