#include "multiprocessing/pool.h"

#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <new>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/unique_fd.h"
#include "multiprocessing/connection.h"
#include "multiprocessing/process.h"
#include "tensor/status_macros.h"

namespace ember::multiprocessing {

// Note [Pool]
// The pool's handler thread owns the workers: it starts them (so that they
// are tied to it, process.h), hands out chunks and collects results. Each
// worker has its own socket pair; the parent keeps one end, the worker gets
// the other as its entry point's argument (by fork, or sent to a spawned or
// forkserver child). The parent therefore knows which chunks each worker
// holds, and when a worker's socket hangs up or the worker is found ended,
// exactly those chunks fail (after any results it sent first are read).
// A shared task queue could not say which task a dead worker had taken.
//
// Messages, parent to worker: {"chunk": id, "fn": name, "items": [...]}
// (map: one argument per item), {"chunk": id, "fn": name, "args": [[...],
// ...]} (starmap, apply: an argument list per item) or {"stop": true};
// worker to parent: {"chunk": id, "offset": k, "results": [...]} (the
// results of items k, k+1, ... of the chunk) or {"chunk": id, "item": i,
// "error": message, "code": status code} ("item" absent when the results
// could not be sent back). A chunk or a reply too large for
// one message (kMaxMessageBytes) is split in halves until it fits.
// A worker with maxtasksperchild exits (code 0) after that many chunks; the
// handler sends it no more than that and starts a replacement when it ends.

namespace {

constexpr char kWorkerEntry[] = "ember.pool.worker";
// Chunks a worker may hold at once: one running, one waiting on its socket.
constexpr size_t kChunksPerWorker = 2;
// How often the handler looks for workers that ended without a hang-up.
constexpr absl::Duration kLivenessInterval = absl::Milliseconds(100);

std::mutex* g_functions_mu = nullptr;
std::mutex& FunctionsMu() {
  static std::mutex* const mu = [] {
    g_functions_mu = new std::mutex;
    // A worker forked while another thread of the pool's process looks a
    // function up must not inherit the lock held; nothing else runs in the
    // child yet, so it is made anew.
    ::pthread_atfork(nullptr, nullptr, [] { new (g_functions_mu) std::mutex; });
    return g_functions_mu;
  }();
  return *mu;
}
std::map<std::string, PoolFunction>& Functions() {
  static auto* m = new std::map<std::string, PoolFunction>;
  return *m;
}

absl::StatusOr<PoolFunction> FindFunction(const std::string& name) {
  std::lock_guard lock(FunctionsMu());
  auto it = Functions().find(name);
  if (it == Functions().end()) {
    return absl::NotFoundError(absl::StrCat("no pool function '", name,
                                            "' is registered in this binary; register it with "
                                            "EMBER_REGISTER_POOL_FUNCTION"));
  }
  return it->second;
}

absl::StatusOr<Value> RunGuarded(PoolFunction fn, absl::Span<const Value> args) {
  try {
    return fn(args);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("uncaught exception: ", e.what()));
  } catch (...) {
    return absl::InternalError("uncaught exception of unknown type");
  }
}

// Sends `results` (those of items `offset`... of chunk `id`), in halves
// when they do not fit one message.
absl::Status SendResults(Connection& conn, const Value& id, Value::List results, size_t offset) {
  const size_t n = results.size();
  Value reply(Value::Dict{{"chunk", id},
                          {"offset", Value(static_cast<int64_t>(offset))},
                          {"results", Value(std::move(results))}});
  absl::Status s = conn.send(reply);
  if (!absl::IsInvalidArgument(s) || n < 2) return s;
  // Too large: the results back out of the reply (ours), then two halves.
  Value::List& all = const_cast<Value::List&>(reply.find("results")->list());
  Value::List second(std::make_move_iterator(all.begin() + n / 2),
                     std::make_move_iterator(all.end()));
  all.resize(n / 2);
  EMBER_RETURN_IF_ERROR(SendResults(conn, id, std::move(all), offset));
  return SendResults(conn, id, std::move(second), offset + n / 2);
}

// What a worker process runs: args[0] its socket, args[1] maxtasksperchild
// (0: none).
absl::Status PoolWorkerEntry(int rank, absl::Span<const Value> args) {
  if (args.size() != 2) return absl::InvalidArgumentError("a pool worker takes 2 arguments");
  EMBER_ASSIGN_OR_RETURN(Connection conn, args[0].as<Connection>());
  EMBER_ASSIGN_OR_RETURN(int64_t maxtasks, args[1].as<int64_t>());
  for (int64_t done = 0; maxtasks == 0 || done < maxtasks; ++done) {
    absl::StatusOr<Value> msg = conn.recv();
    if (absl::IsUnavailable(msg.status())) return absl::OkStatus();  // the pool is gone
    EMBER_RETURN_IF_ERROR(msg.status());
    if (msg->find("stop") != nullptr) return absl::OkStatus();
    const Value* id = msg->find("chunk");
    const Value* fn_name = msg->find("fn");
    const Value* items = msg->find("items");
    const Value* arg_lists = msg->find("args");
    if (id == nullptr || fn_name == nullptr || (items == nullptr) == (arg_lists == nullptr)) {
      return absl::InvalidArgumentError("a pool worker got a malformed chunk");
    }
    absl::StatusOr<PoolFunction> fn = FindFunction(fn_name->as<std::string>().value_or(""));
    const Value::List& list = items != nullptr ? items->list() : arg_lists->list();
    Value::List results;
    results.reserve(list.size());
    for (size_t i = 0; i < list.size(); ++i) {
      absl::Span<const Value> call_args = items != nullptr ? absl::Span<const Value>(&list[i], 1)
                                                           : absl::MakeConstSpan(list[i].list());
      absl::StatusOr<Value> r = fn.ok() ? RunGuarded(*fn, call_args) : fn.status();
      if (!r.ok()) {
        std::string message(r.status().message());
        if (message.empty()) message = absl::StatusCodeToString(r.status().code());
        EMBER_RETURN_IF_ERROR(conn.send(
            Value(Value::Dict{{"chunk", *id},
                              {"item", Value(static_cast<int64_t>(i))},
                              {"error", Value(std::move(message))},
                              {"code", Value(static_cast<int64_t>(r.status().code()))}})));
        results.clear();
        break;
      }
      results.push_back(*std::move(r));
    }
    if (results.size() == list.size()) {
      absl::Status sent = SendResults(conn, *id, std::move(results), 0);
      if (absl::IsUnavailable(sent)) return absl::OkStatus();  // the pool is gone
      if (!sent.ok()) {  // e.g. a result too large for a message: the task's error
        EMBER_RETURN_IF_ERROR(conn.send(Value(Value::Dict{
            {"chunk", *id},
            {"error", Value(absl::StrCat("its result cannot be sent back: ", sent.message()))},
            {"code", Value(static_cast<int64_t>(sent.code()))}})));
      }
    }
  }
  return absl::OkStatus();
}
EMBER_REGISTER_ENTRY_POINT(kWorkerEntry, PoolWorkerEntry);

}  // namespace

void register_pool_function(const std::string& name, PoolFunction fn) {
  std::lock_guard lock(FunctionsMu());
  Functions()[name] = fn;
}

namespace internal {

// One apply / map / starmap call.
struct PoolJob {
  mutable std::mutex mu;
  mutable std::condition_variable cv;
  bool done = false;
  absl::StatusOr<Value> result;
  // Filled as chunks come back (handler thread, under mu).
  std::string name;     // the function
  std::string fn;       // how messages name it: 'name'
  bool single = false;  // apply: the result is the one value
  Value::List results;
  size_t chunks_left = 0;

  void Finish(absl::StatusOr<Value> r) {
    {
      std::lock_guard lock(mu);
      if (done) return;
      done = true;
      result = std::move(r);
      results.clear();
    }
    cv.notify_all();
  }
  bool is_done() const {
    std::lock_guard lock(mu);
    return done;
  }
};

struct Chunk {
  int64_t id = 0;
  std::shared_ptr<PoolJob> job;
  size_t start = 0;     // the job's index of the first item
  size_t size = 0;      // items
  size_t received = 0;  // results back so far
  bool star = false;    // "args" (argument lists) rather than "items"
  Value message;        // what the worker is sent
};

// The message for items [start, start + list.size()) of `job`.
Chunk MakeChunk(int64_t id, std::shared_ptr<PoolJob> job, size_t start, bool star,
                Value::List list) {
  Chunk c;
  c.id = id;
  c.job = std::move(job);
  c.start = start;
  c.size = list.size();
  c.star = star;
  c.message = Value(Value::Dict{{"chunk", Value(id)},
                                {"fn", Value(c.job->name)},
                                {star ? "args" : "items", Value(std::move(list))}});
  return c;
}

struct Worker {
  int index = 0;
  std::optional<Process> process;  // set once started
  Connection conn;
  std::map<int64_t, Chunk> held;  // sent and not answered
  int64_t sent = 0;               // chunks sent in its life
  bool hung_up = false;           // its socket's other end closed
};

enum class PoolRun { kRun, kClose, kTerminate };

struct PoolState {
  PoolOptions options;
  int processes = 0;
  Context context{StartMethod::kFork};
  base::UniqueFd wake;  // an eventfd: new work or a new state

  std::mutex mu;  // guards the fields below
  std::condition_variable cv;
  PoolRun run = PoolRun::kRun;
  std::deque<Chunk> incoming;
  int64_t next_chunk = 0;
  bool started = false;
  absl::Status start_status;
  bool finished = false;
  std::vector<pid_t> pids;

  std::thread handler;
  std::mutex handler_join_mu;  // terminate() and join() may race to join it

  void JoinHandler() {
    std::lock_guard lock(handler_join_mu);
    if (handler.joinable()) handler.join();
  }
  void Wake() {
    uint64_t one = 1;
    (void)!::write(wake.get(), &one, sizeof(one));
  }
  void HandlerMain();
};

namespace {

std::string Items(const Chunk& c) {
  const size_t n = c.size;
  if (c.job->single) return "";
  return n == 1 ? absl::StrCat(" item ", c.start)
                : absl::StrCat(" items ", c.start, "-", c.start + n - 1);
}

// Applies a worker's reply to its chunk's job. True once the chunk is done
// with (every result back, or failed).
bool Complete(Chunk& chunk, const Value& reply, const Worker& w) {
  PoolJob& job = *chunk.job;
  if (const Value* error = reply.find("error"); error != nullptr) {
    const Value* item = reply.find("item");  // absent: not one item's
    int64_t code = reply.find("code") ? reply.find("code")->as<int64_t>().value_or(2) : 2;
    if (code <= 0 || code > 16) code = static_cast<int64_t>(absl::StatusCode::kUnknown);
    job.Finish(absl::Status(
        static_cast<absl::StatusCode>(code),
        absl::StrCat("Pool: ", job.fn,
                     job.single || item == nullptr
                         ? std::string()
                         : absl::StrCat(" of item ", chunk.start + item->as<int64_t>().value_or(0)),
                     " failed in worker ", w.index, " (pid ", w.process->pid(),
                     "): ", error->as<std::string>().value_or(""))));
    return true;
  }
  const Value* results = reply.find("results");
  const Value* offset = reply.find("offset");
  const int64_t at = offset != nullptr ? offset->as<int64_t>().value_or(-1) : -1;
  if (results == nullptr || at < 0 ||
      static_cast<size_t>(at) + results->list().size() > chunk.size) {
    job.Finish(absl::InternalError(
        absl::StrCat("Pool: worker ", w.index, " sent a malformed reply for ", job.fn)));
    return true;
  }
  chunk.received += results->list().size();
  std::unique_lock lock(job.mu);
  if (job.done) return chunk.received == chunk.size;
  Value::List& got = const_cast<Value::List&>(results->list());  // a reply of our own
  for (size_t i = 0; i < got.size(); ++i) job.results[chunk.start + at + i] = std::move(got[i]);
  if (chunk.received < chunk.size) return false;
  if (--job.chunks_left > 0) return true;
  Value v = job.single ? std::move(job.results[0]) : Value(std::move(job.results));
  lock.unlock();
  job.Finish(std::move(v));
  return true;
}

}  // namespace

void PoolState::HandlerMain() {
  std::vector<std::unique_ptr<Worker>> workers;
  std::deque<Chunk> pending;
  int next_index = 0;
  const int64_t maxtasks = options.maxtasksperchild.value_or(0);

  auto publish_pids = [&] {
    std::lock_guard lock(mu);
    pids.clear();
    for (const auto& w : workers) pids.push_back(w->process->pid());
  };
  auto start_worker = [&]() -> absl::Status {
    EMBER_ASSIGN_OR_RETURN(auto pair, Pipe(/*duplex=*/true));
    auto w = std::make_unique<Worker>();
    w->index = next_index++;
    {
      // The worker's end lives only in the worker once this scope ends
      // (Note [Pool]).
      Connection worker_end = std::move(pair.second);
      EMBER_ASSIGN_OR_RETURN(
          w->process,
          context.process(kWorkerEntry, {Value(worker_end), Value(maxtasks)}, w->index));
    }
    w->conn = std::move(pair.first);
    workers.push_back(std::move(w));
    return absl::OkStatus();
  };
  auto fail_held = [&](Worker& w, const std::string& why) {
    for (auto& [id, chunk] : w.held) {
      chunk.job->Finish(absl::AbortedError(absl::StrCat(
          "Pool: worker ", w.index, " (pid ", w.process->pid(), ") ", why, " while running ",
          chunk.job->fn, Items(chunk), " (BrokenProcessPool); the pool replaced it")));
    }
    w.held.clear();
  };
  // Reads every reply waiting on `w`'s socket. False when it hung up.
  auto drain = [&](Worker& w) {
    while (true) {
      absl::StatusOr<Value> reply = w.conn.recv(absl::ZeroDuration());
      if (absl::IsDeadlineExceeded(reply.status())) return true;
      if (!reply.ok()) return false;
      const Value* id = reply->find("chunk");
      auto it = id == nullptr ? w.held.end() : w.held.find(id->as<int64_t>().value_or(-1));
      if (it == w.held.end()) continue;
      if (Complete(it->second, *reply, w)) w.held.erase(it);
    }
  };

  {
    absl::Status s;
    for (int i = 0; i < processes && s.ok(); ++i) s = start_worker();
    if (s.ok()) publish_pids();
    std::lock_guard lock(mu);
    started = true;
    start_status = s;
    if (!s.ok()) {
      for (auto& w : workers) w->process->kill();
      workers.clear();
      finished = true;
      cv.notify_all();
      return;
    }
  }
  cv.notify_all();

  absl::Time next_liveness = absl::Now() + kLivenessInterval;
  while (true) {
    PoolRun state;
    {
      std::lock_guard lock(mu);
      state = run;
      while (!incoming.empty()) {
        pending.push_back(std::move(incoming.front()));
        incoming.pop_front();
      }
    }
    if (state == PoolRun::kTerminate) {
      for (auto& w : workers) w->process->kill();
      for (auto& w : workers) {
        (void)w->process->join(absl::Seconds(60));
        for (auto& [id, chunk] : w->held) {
          chunk.job->Finish(absl::CancelledError("Pool: the pool was terminated"));
        }
      }
      for (Chunk& c : pending) c.job->Finish(absl::CancelledError("Pool: the pool was terminated"));
      break;
    }

    // Workers that ended: what they answered first counts, what they held
    // fails; replacements while there is work to do.
    bool changed = false;
    const bool check_all = absl::Now() >= next_liveness;
    if (check_all) next_liveness = absl::Now() + kLivenessInterval;
    std::vector<pollfd> fds;
    for (size_t i = 0; i < workers.size();) {
      Worker& w = *workers[i];
      if (w.hung_up || (check_all && !w.process->is_alive())) {
        drain(w);
        absl::StatusOr<ExitStatus> end = w.process->join(absl::Seconds(5));
        std::string how = end.ok() ? absl::StrCat("ended with ", end->str()) : "stopped answering";
        if (end.ok() && !w.process->error_message().empty()) {
          absl::StrAppend(&how, " (", w.process->error_message(), ")");
        }
        if (!end.ok()) w.process->kill();
        fail_held(w, how);
        workers.erase(workers.begin() + i);
        changed = true;
        continue;
      }
      ++i;
    }
    const bool more_work = state == PoolRun::kRun || !pending.empty();
    while (more_work && static_cast<int>(workers.size()) < processes) {
      if (absl::Status s = start_worker(); !s.ok()) {
        // Work stays pending; the next round tries again.
        std::fprintf(stderr, "ember Pool: starting a worker: %s\n",
                     std::string(s.message()).c_str());
        break;
      }
      changed = true;
    }
    if (changed) publish_pids();

    // Hand out chunks, round robin, at most kChunksPerWorker each.
    for (bool progress = true; progress && !pending.empty();) {
      progress = false;
      for (auto& wp : workers) {
        Worker& w = *wp;
        while (!pending.empty() && pending.front().job->is_done()) pending.pop_front();
        if (pending.empty()) break;
        if (w.hung_up || w.held.size() >= kChunksPerWorker ||
            (maxtasks > 0 && w.sent >= maxtasks)) {
          continue;
        }
        Chunk& c = pending.front();
        absl::Status sent = w.conn.send(c.message);
        if (absl::IsUnavailable(sent)) {
          w.hung_up = true;  // it ended: handled on the next round
          continue;
        }
        if (absl::IsInvalidArgument(sent) && c.size > 1) {
          // Too large for one message: two halves in its place.
          const Value* payload = c.message.find(c.star ? "args" : "items");
          const Value::List& list = payload->list();
          const size_t half = c.size / 2;
          Chunk first = MakeChunk(c.id, c.job, c.start, c.star,
                                  Value::List(list.begin(), list.begin() + half));
          Chunk second;
          {
            std::lock_guard lock(mu);
            second = MakeChunk(next_chunk++, c.job, c.start + half, c.star,
                               Value::List(list.begin() + half, list.end()));
          }
          {
            std::lock_guard lock(c.job->mu);
            ++c.job->chunks_left;
          }
          pending.pop_front();
          pending.push_front(std::move(second));
          pending.push_front(std::move(first));
          progress = true;
          continue;
        }
        if (!sent.ok()) {
          c.job->Finish(
              absl::Status(sent.code(), absl::StrCat("Pool: sending ", c.job->fn, Items(c),
                                                     " to a worker: ", sent.message())));
          pending.pop_front();
          progress = true;
          continue;
        }
        ++w.sent;
        const int64_t id = c.id;
        w.held.emplace(id, std::move(c));
        pending.pop_front();
        progress = true;
      }
    }

    // Closed and done: stop the workers and wait for them.
    if (state == PoolRun::kClose && pending.empty()) {
      bool idle = true;
      for (auto& w : workers) idle &= w->held.empty();
      if (idle) {
        for (auto& w : workers) {
          (void)w->conn.send(Value(Value::Dict{{"stop", Value(true)}}), absl::Seconds(5));
        }
        for (auto& w : workers) {
          if (!w->process->join(absl::Seconds(60)).ok()) w->process->kill();
        }
        break;
      }
    }

    fds.clear();
    fds.push_back({wake.get(), POLLIN, 0});
    for (auto& w : workers) fds.push_back({w->conn.fd(), POLLIN, 0});
    const int wait_ms = static_cast<int>(
        std::max<int64_t>(1, absl::ToInt64Milliseconds(next_liveness - absl::Now()) + 1));
    if (::poll(fds.data(), fds.size(), wait_ms) < 0 && errno != EINTR) {
      std::fprintf(stderr, "ember Pool: poll: %s\n", std::strerror(errno));
      absl::SleepFor(absl::Milliseconds(10));
    }
    if (fds[0].revents != 0) {
      uint64_t n = 0;
      (void)!::read(wake.get(), &n, sizeof(n));
    }
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      if (!drain(*workers[i - 1])) workers[i - 1]->hung_up = true;
    }
  }
  workers.clear();
  {
    std::lock_guard lock(mu);
    pids.clear();
    finished = true;
  }
  cv.notify_all();
}

}  // namespace internal

using internal::Chunk;
using internal::PoolJob;
using internal::PoolRun;
using internal::PoolState;

// --- AsyncResult -------------------------------------------------------------------

absl::Status AsyncResult::wait(absl::Duration timeout) const {
  std::unique_lock lock(job_->mu);
  auto done = [&] { return job_->done; };
  if (timeout == absl::InfiniteDuration()) {
    job_->cv.wait(lock, done);
  } else if (!job_->cv.wait_for(
                 lock, absl::ToChronoNanoseconds(std::max(timeout, absl::ZeroDuration())), done)) {
    return absl::DeadlineExceededError(absl::StrCat("AsyncResult: ", job_->fn, " not ready after ",
                                                    absl::FormatDuration(timeout)));
  }
  return absl::OkStatus();
}

absl::StatusOr<Value> AsyncResult::get(absl::Duration timeout) const {
  EMBER_RETURN_IF_ERROR(wait(timeout));
  std::lock_guard lock(job_->mu);
  return job_->result;
}

bool AsyncResult::ready() const { return job_->is_done(); }

absl::StatusOr<bool> AsyncResult::successful() const {
  std::lock_guard lock(job_->mu);
  if (!job_->done) {
    return absl::FailedPreconditionError(
        absl::StrCat("AsyncResult.successful: ", job_->fn, " is not ready"));
  }
  return job_->result.ok();
}

// --- Pool ----------------------------------------------------------------------------

absl::StatusOr<Pool> Pool::create(PoolOptions options) {
  int processes = 0;
  if (options.processes.has_value()) {
    processes = *options.processes;
    if (processes < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("Pool: processes must be at least 1, got ", processes));
    }
  } else {
    processes = std::max(1, static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN)));
  }
  if (options.maxtasksperchild.has_value() && *options.maxtasksperchild < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Pool: maxtasksperchild must be at least 1 (or unset), got ", *options.maxtasksperchild));
  }
  EMBER_ASSIGN_OR_RETURN(Context context, get_context(options.start_method));
  base::UniqueFd wake(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake.valid()) {
    return absl::ResourceExhaustedError(absl::StrCat("Pool: eventfd: ", std::strerror(errno)));
  }
  Pool pool;
  pool.state_ = std::make_unique<PoolState>();
  PoolState& s = *pool.state_;
  s.options = std::move(options);
  s.processes = processes;
  s.context = context;
  s.wake = std::move(wake);
  s.handler = std::thread([&s] { s.HandlerMain(); });
  std::unique_lock lock(s.mu);
  s.cv.wait(lock, [&] { return s.started; });
  if (!s.start_status.ok()) {
    absl::Status status = s.start_status;
    lock.unlock();
    s.handler.join();
    return absl::Status(status.code(),
                        absl::StrCat("Pool: starting its workers: ", status.message()));
  }
  return pool;
}

Pool::Pool(Pool&&) noexcept = default;

Pool& Pool::operator=(Pool&& other) noexcept {
  if (this != &other) {
    if (state_ != nullptr) terminate();
    state_ = std::move(other.state_);
  }
  return *this;
}

Pool::~Pool() {
  if (state_ != nullptr) terminate();
}

absl::StatusOr<AsyncResult> Pool::Submit(const std::string& fn, Value::List payload, bool star,
                                         int chunksize, bool single) {
  const char* what = single ? "apply" : star ? "starmap" : "map";
  if (absl::StatusOr<PoolFunction> f = FindFunction(fn); !f.ok()) {
    return absl::NotFoundError(absl::StrCat("Pool.", what, ": ", f.status().message()));
  }
  if (chunksize < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Pool.", what, ": chunksize must be >= 1 (0: the default), got ", chunksize));
  }
  PoolState& s = *state_;
  const size_t n = payload.size();
  if (chunksize == 0) {
    const size_t per = static_cast<size_t>(s.processes) * 4;
    chunksize = static_cast<int>(std::max<size_t>(1, (n + per - 1) / per));
  }
  auto job = std::make_shared<PoolJob>();
  job->name = fn;
  job->fn = absl::StrCat("'", fn, "'");
  job->single = single;
  job->results.resize(n);
  job->chunks_left = (n + chunksize - 1) / chunksize;
  AsyncResult result;
  result.job_ = job;
  if (n == 0) {
    job->Finish(Value(Value::List{}));
    return result;
  }
  // The messages are built here, off the handler thread.
  std::vector<Value::List> slices;
  for (size_t start = 0; start < n; start += chunksize) {
    const size_t end = std::min(n, start + chunksize);
    slices.emplace_back(std::make_move_iterator(payload.begin() + start),
                        std::make_move_iterator(payload.begin() + end));
  }
  {
    std::lock_guard lock(s.mu);
    if (s.run != PoolRun::kRun) {
      return absl::FailedPreconditionError(
          absl::StrCat("Pool.", what,
                       ": the pool is not running (close() or terminate() was "
                       "called)"));
    }
    size_t start = 0;
    for (Value::List& slice : slices) {
      const size_t size = slice.size();
      s.incoming.push_back(MakeChunk(s.next_chunk++, job, start, star, std::move(slice)));
      start += size;
    }
  }
  s.Wake();
  return result;
}

absl::StatusOr<Value> Pool::Take(AsyncResult& r, absl::Duration timeout) {
  EMBER_RETURN_IF_ERROR(r.wait(timeout));
  std::lock_guard lock(r.job_->mu);
  return std::move(r.job_->result);
}

absl::StatusOr<Value::List> Pool::TakeList(AsyncResult& r, absl::Duration timeout) {
  EMBER_ASSIGN_OR_RETURN(Value v, Take(r, timeout));
  if (!v.is<Value::List>()) return absl::InternalError("Pool: a map's result is not a list");
  return std::move(const_cast<Value::List&>(v.list()));  // `v` is ours to empty
}

absl::StatusOr<AsyncResult> Pool::apply_async(const std::string& fn, Value::List args) {
  Value::List one;
  one.push_back(Value(std::move(args)));
  return Submit(fn, std::move(one), /*star=*/true, 1, /*single=*/true);
}

absl::StatusOr<Value> Pool::apply(const std::string& fn, Value::List args, absl::Duration timeout) {
  EMBER_ASSIGN_OR_RETURN(AsyncResult r, apply_async(fn, std::move(args)));
  return Take(r, timeout);
}

absl::StatusOr<AsyncResult> Pool::map_async(const std::string& fn, Value::List items,
                                            int chunksize) {
  return Submit(fn, std::move(items), /*star=*/false, chunksize, /*single=*/false);
}

absl::StatusOr<Value::List> Pool::map(const std::string& fn, Value::List items, int chunksize,
                                      absl::Duration timeout) {
  EMBER_ASSIGN_OR_RETURN(AsyncResult r, map_async(fn, std::move(items), chunksize));
  return TakeList(r, timeout);
}

absl::StatusOr<AsyncResult> Pool::starmap_async(const std::string& fn,
                                                std::vector<Value::List> arg_lists, int chunksize) {
  Value::List payload;
  payload.reserve(arg_lists.size());
  for (Value::List& a : arg_lists) payload.push_back(Value(std::move(a)));
  return Submit(fn, std::move(payload), /*star=*/true, chunksize, /*single=*/false);
}

absl::StatusOr<Value::List> Pool::starmap(const std::string& fn, std::vector<Value::List> arg_lists,
                                          int chunksize, absl::Duration timeout) {
  EMBER_ASSIGN_OR_RETURN(AsyncResult r, starmap_async(fn, std::move(arg_lists), chunksize));
  return TakeList(r, timeout);
}

void Pool::close() {
  {
    std::lock_guard lock(state_->mu);
    if (state_->run == PoolRun::kRun) state_->run = PoolRun::kClose;
  }
  state_->Wake();
}

void Pool::terminate() {
  {
    std::lock_guard lock(state_->mu);
    state_->run = PoolRun::kTerminate;
  }
  state_->Wake();
  state_->JoinHandler();
}

absl::Status Pool::join(absl::Duration timeout) {
  PoolState& s = *state_;
  {
    std::unique_lock lock(s.mu);
    if (s.run == PoolRun::kRun) {
      return absl::FailedPreconditionError(
          "Pool.join: the pool is still running; call close() or terminate() first");
    }
    auto finished = [&] { return s.finished; };
    if (timeout == absl::InfiniteDuration()) {
      s.cv.wait(lock, finished);
    } else if (!s.cv.wait_for(lock,
                              absl::ToChronoNanoseconds(std::max(timeout, absl::ZeroDuration())),
                              finished)) {
      return absl::DeadlineExceededError(absl::StrCat(
          "Pool.join: the workers are still working after ", absl::FormatDuration(timeout)));
    }
  }
  s.JoinHandler();
  return absl::OkStatus();
}

int Pool::processes() const { return state_->processes; }

std::vector<pid_t> Pool::pids() const {
  std::lock_guard lock(state_->mu);
  return state_->pids;
}

}  // namespace ember::multiprocessing
