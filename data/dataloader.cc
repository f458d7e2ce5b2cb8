#include "data/dataloader.h"

#include <sys/statvfs.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "multiprocessing/process.h"
#include "multiprocessing/queue.h"
#include "multiprocessing/sharing.h"
#include "tensor/status_macros.h"

namespace ember::data {

namespace mp = ::ember::multiprocessing;

// Note [DataLoader workers]
// A pool is num_workers forked processes, an index queue each and one
// result queue (SimpleQueues created before the forks, so every process
// holds both ends). The loop sends tasks [token, task id, indices] round
// robin to the workers that are still active, at most prefetch_factor *
// num_workers outstanding; a worker answers each with a dict carrying the
// same token and task id and one of: "batch" (collated into shared memory,
// so the message carries descriptors or region names, not bytes), "error"
// (with "code" and "index": the batch failed, the worker goes on), "end"
// (its stream is exhausted: an iterable dataset) or "fatal" (worker_init_fn
// failed: it exits). The token is the epoch's: persistent workers outlive
// an iterator that was dropped mid-epoch, and the results still in flight
// for it carry an old token, so the next epoch drops them; a worker that
// sees a new token restarts its stream. The loop waits for results in
// slices of kStatusCheckInterval and, between slices, checks that every
// worker is alive, so a killed worker is reported within one slice and
// never hangs the loop (a batch whose regions vanished with its killed
// worker reports that death too). None on an index queue stops its worker;
// workers still running a moment later are killed, and the result queue is
// drained, releasing the regions of batches nobody took. Process (multiprocessing/) sets
// PR_SET_PDEATHSIG, so workers die with the process that started them.
namespace {

constexpr absl::Duration kStatusCheckInterval = absl::Milliseconds(100);
// The entry point of workers started by spawn or forkserver.
constexpr char kWorkerEntryPoint[] = "ember.data.worker";
constexpr absl::Duration kStopGrace = absl::Seconds(1);

absl::Status Annotate(const absl::Status& s, const std::string& where) {
  return absl::Status(s.code(), absl::StrCat(where, ": ", s.message()));
}

// Runs `fn`, turning a thrown exception into Internal.
template <typename F>
auto Guarded(F&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("threw: ", e.what()));
  }
}

// torch's hint for a full shared memory, with this machine's figures.
absl::Status ExplainShm(const absl::Status& s) {
  if (s.code() != absl::StatusCode::kResourceExhausted) return s;
  struct statvfs fs;
  const std::string free = ::statvfs("/dev/shm", &fs) == 0
                               ? absl::StrCat(static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize,
                                              " bytes free in /dev/shm")
                               : std::string("/dev/shm unreadable");
  return absl::Status(
      s.code(),
      absl::StrCat(s.message(), " (", free, ", sharing strategy ", mp::get_sharing_strategy(),
                   "); use a smaller batch_size, fewer workers or a smaller "
                   "prefetch_factor, or give the machine or container more shared "
                   "memory (docker run --shm-size)"));
}

// Copies every tensor of `batch` into pinned host memory.
Sample PinAll(const Sample& batch) {
  if (const Tensor* t = batch.get_if<Tensor>()) return Sample(t->pin_memory());
  if (batch.is<Sample::List>()) {
    Sample::List out;
    for (const Sample& s : batch.list()) out.push_back(PinAll(s));
    return Sample(std::move(out));
  }
  if (batch.is<Sample::Dict>()) {
    Sample::Dict out;
    for (const auto& [k, v] : batch.dict()) out.emplace(k, PinAll(v));
    return Sample(std::move(out));
  }
  return batch;
}

int64_t IntOf(const Sample& dict, const char* key) {
  const Sample* v = dict.find(key);
  return v != nullptr && v->is<int64_t>() ? *v->get_if<int64_t>() : -1;
}

}  // namespace

struct WorkerPool {
  std::vector<mp::Process> processes;
  std::vector<mp::SimpleQueue> index_queues;
  mp::SimpleQueue results;
  uint64_t base_seed = 0;
  int64_t token = 0;
  absl::Status failure;  // a worker died or failed to start: the pool is done

  ~WorkerPool() { Stop(); }

  void Stop() {
    for (mp::SimpleQueue& q : index_queues)
      q.put(mp::Value(), absl::Milliseconds(100)).IgnoreError();
    const absl::Time deadline = absl::Now() + kStopGrace;
    for (mp::Process& p : processes) {
      p.join(std::max(absl::ZeroDuration(), deadline - absl::Now())).IgnoreError();
    }
    processes.clear();  // kills and reaps any still running
    index_queues.clear();
    // Batches still in the result queue hold references to their shared
    // regions (file_system: named files in /dev/shm); receiving and dropping
    // them releases those, so nothing is left behind. A batch whose creator
    // was killed may be gone already; that is an error to skip, not to stop.
    if (processes_stopped_once_) return;
    processes_stopped_once_ = true;
    for (int n = 0; n < kMaxDrained; ++n) {
      absl::StatusOr<mp::Value> left = results.get(absl::ZeroDuration());
      if (!left.ok() && left.status().code() == absl::StatusCode::kDeadlineExceeded) break;
    }
  }

  static constexpr int kMaxDrained = 1 << 16;
  bool processes_stopped_once_ = false;
};

struct LoaderState {
  std::shared_ptr<Dataset> map;
  std::shared_ptr<IterableDataset> iterable;
  DataLoaderOptions options;
  std::shared_ptr<Sampler> sampler;             // map-style
  std::shared_ptr<BatchSampler> batch_sampler;  // map-style with batching
  std::shared_ptr<WorkerPool> persistent;
  bool pin_memory = false;

  // Progress through the epoch, for state_dict (Note [Resuming a loader]).
  Tensor epoch_generator_state;  // the generator's, when the epoch began
  bool in_epoch = false;
  int64_t batches_taken = 0;  // of the order the epoch drew
  int64_t samples_taken = 0;
  std::vector<std::string> worker_rng;  // after each worker's last batch taken
  std::optional<StateDict> resume;      // loaded, for the next iter()
  bool resume_by_sampler = false;       // the sampler leaves out what was taken

  Generator& generator() {
    return options.generator != nullptr ? *options.generator : default_generator();
  }
  Sampler* IndexSampler() const {
    return batch_sampler != nullptr ? batch_sampler->sampler().get() : sampler.get();
  }

  bool batching() const { return options.batch_size.has_value() || batch_sampler != nullptr; }

  absl::StatusOr<Sample> Collate(std::vector<Sample> samples) {
    if (options.collate_fn) return Guarded([&] { return options.collate_fn(std::move(samples)); });
    if (!batching()) return std::move(samples[0]);
    return default_collate(std::move(samples));
  }

  // The batch of `indices` (map-style), or the next of `stream` (nullopt at
  // its end). Errors name the sample index where there is one.
  absl::StatusOr<std::optional<Sample>> Fetch(const std::vector<int64_t>& indices,
                                              SampleStream* stream) {
    std::vector<Sample> samples;
    if (map != nullptr) {
      for (int64_t i : indices) {
        absl::StatusOr<Sample> s = Guarded([&] { return map->get(i); });
        if (!s.ok()) return Annotate(s.status(), absl::StrCat("sample ", i));
        samples.push_back(*std::move(s));
      }
    } else {
      const int64_t want = batching() ? *options.batch_size : 1;
      while (static_cast<int64_t>(samples.size()) < want) {
        absl::StatusOr<std::optional<Sample>> s = Guarded([&] { return (*stream)(); });
        if (!s.ok()) return Annotate(s.status(), "the stream");
        if (!s->has_value()) break;
        samples.push_back(**std::move(s));
      }
      if (samples.empty() ||
          (options.drop_last && batching() && static_cast<int64_t>(samples.size()) < want)) {
        return std::nullopt;
      }
    }
    absl::StatusOr<Sample> batch = Collate(std::move(samples));
    if (!batch.ok()) return Annotate(ExplainShm(batch.status()), "collate");
    return std::optional<Sample>(*std::move(batch));
  }

  Sample Pin(Sample batch) {
    if (!pin_memory) return batch;
    try {
      return PinAll(batch);
    } catch (const std::exception& e) {
      std::fprintf(stderr,
                   "DataLoader: pin_memory=true but pinned memory is not available (%s); "
                   "batches stay in pageable memory\n",
                   e.what());
      pin_memory = false;
      return batch;
    }
  }
};

namespace {

// A worker's life: Note [DataLoader workers].
absl::Status WorkerLoop(LoaderState& state, int id, uint64_t base_seed, mp::SimpleQueue in,
                        mp::SimpleQueue out) {
  const uint64_t seed = base_seed + static_cast<uint64_t>(id);
  internal::set_worker_info({.id = id,
                             .num_workers = state.options.num_workers,
                             .seed = seed,
                             .dataset = state.map.get(),
                             .iterable_dataset = state.iterable.get()});
  manual_seed(seed);
  if (state.options.worker_init_fn) {
    absl::Status init = Guarded([&] { return state.options.worker_init_fn(id); });
    if (!init.ok()) {
      out.put(mp::Value::Dict{{"fatal", std::string(init.message())}, {"worker", id}},
              absl::Seconds(10))
          .IgnoreError();
      return init;
    }
  }
  int64_t token = -1;
  SampleStream stream;
  bool ended = false;
  absl::Status stream_error;  // the dataset's iter() failed this epoch
  while (true) {
    absl::StatusOr<mp::Value> task = in.get();
    if (!task.ok()) return task.status();
    if (task->is_none()) return absl::OkStatus();
    const mp::Value::List& parts = task->list();
    const int64_t task_token = *parts[0].get_if<int64_t>();
    const int64_t task_id = *parts[1].get_if<int64_t>();
    std::vector<int64_t> indices;
    for (const mp::Value& v : parts[2].list()) indices.push_back(*v.get_if<int64_t>());
    if (parts.size() > 3) {
      // A resumed epoch: where this worker's generator stood after its
      // last batch the loop took (Note [Resuming a loader]).
      const std::string& rng = *parts[3].get_if<std::string>();
      Tensor bytes = empty({static_cast<int64_t>(rng.size())}, kUInt8);
      std::memcpy(bytes.raw_data(), rng.data(), rng.size());
      default_generator().set_state(bytes);
    }
    if (state.iterable != nullptr && task_token != token) {
      absl::StatusOr<SampleStream> fresh =
          Guarded([&]() -> absl::StatusOr<SampleStream> { return state.iterable->iter(); });
      ended = false;
      stream_error =
          fresh.ok() ? absl::OkStatus() : Annotate(fresh.status(), "the dataset's iter()");
      if (fresh.ok()) stream = *std::move(fresh);
    }
    token = task_token;
    mp::Value::Dict reply{{"token", token}, {"task", task_id}, {"worker", id}};
    absl::StatusOr<std::optional<Sample>> batch = std::optional<Sample>();
    if (!stream_error.ok()) {
      batch = stream_error;
      stream_error = absl::OkStatus();  // reported once; then the stream is over
      ended = true;
    } else if (!ended) {
      batch = state.Fetch(indices, &stream);
    }
    if (!batch.ok()) {
      reply["error"] = std::string(batch.status().message());
      reply["code"] = static_cast<int64_t>(batch.status().code());
    } else if (!batch->has_value()) {
      ended = true;
      reply["end"] = true;
    } else {
      reply["batch"] = **std::move(batch);
    }
    const Tensor rng = default_generator().get_state();
    reply["rng"] = std::string(static_cast<const char*>(rng.raw_data()), rng.numel());
    absl::Status sent = out.put(mp::Value(std::move(reply)));
    if (!sent.ok()) {
      // The batch could not cross (e.g. shared memory or descriptors ran
      // out while sending): report that instead.
      absl::Status explained = ExplainShm(sent);
      EMBER_RETURN_IF_ERROR(out.put(
          mp::Value::Dict{{"token", token},
                          {"task", task_id},
                          {"worker", id},
                          {"error", absl::StrCat("sending the batch: ", explained.message())},
                          {"code", static_cast<int64_t>(explained.code())}}));
    }
  }
}

absl::StatusOr<std::shared_ptr<WorkerPool>> StartPool(const std::shared_ptr<LoaderState>& state,
                                                      uint64_t base_seed) {
  auto pool = std::make_shared<WorkerPool>();
  pool->base_seed = base_seed;
  EMBER_ASSIGN_OR_RETURN(pool->results, mp::SimpleQueue::create());
  for (int id = 0; id < state->options.num_workers; ++id) {
    EMBER_ASSIGN_OR_RETURN(mp::SimpleQueue q, mp::SimpleQueue::create());
    pool->index_queues.push_back(q);
  }
  const std::string& method = state->options.multiprocessing_context;
  for (int id = 0; id < state->options.num_workers; ++id) {
    mp::SimpleQueue in = pool->index_queues[id];
    mp::SimpleQueue out = pool->results;
    absl::StatusOr<mp::Process> p = absl::UnknownError("no start method");
    if (method.empty() || method == "fork") {
      LoaderState* st = state.get();
      p = mp::Process::start(
          [st, id, base_seed, in, out] { return WorkerLoop(*st, id, base_seed, in, out); });
    } else {
      // A fresh process rebuilds the dataset from its recipe (checked by
      // create()) and gets what its loop needs of the options.
      const Recipe recipe = *state->map->recipe();
      std::vector<mp::Value> args = {mp::Value(recipe.factory),
                                     recipe.args,
                                     mp::Value(state->options.num_workers),
                                     mp::Value(static_cast<int64_t>(base_seed)),
                                     mp::Value(state->batching()),
                                     mp::Value(in),
                                     mp::Value(out)};
      p = method == "spawn" ? mp::Process::start_spawn(kWorkerEntryPoint, id, std::move(args))
                            : mp::Process::start_forkserver(kWorkerEntryPoint, id, std::move(args));
    }
    if (!p.ok()) return Annotate(p.status(), absl::StrCat("DataLoader: starting worker ", id));
    pool->processes.push_back(*std::move(p));
  }
  return pool;
}

// A worker started by spawn or forkserver (the arguments StartPool sends).
absl::Status SpawnedWorker(int id, absl::Span<const mp::Value> args) {
  if (args.size() != 7) return absl::InvalidArgumentError("DataLoader worker: bad arguments");
  EMBER_ASSIGN_OR_RETURN(std::string factory, args[0].as<std::string>());
  EMBER_ASSIGN_OR_RETURN(int64_t num_workers, args[2].as<int64_t>());
  EMBER_ASSIGN_OR_RETURN(int64_t base_seed, args[3].as<int64_t>());
  EMBER_ASSIGN_OR_RETURN(bool batching, args[4].as<bool>());
  EMBER_ASSIGN_OR_RETURN(mp::SimpleQueue in, args[5].as<mp::SimpleQueue>());
  EMBER_ASSIGN_OR_RETURN(mp::SimpleQueue out, args[6].as<mp::SimpleQueue>());
  LoaderState state;
  absl::StatusOr<std::shared_ptr<Dataset>> dataset = rebuild_dataset({factory, args[1]});
  if (!dataset.ok()) {
    const absl::Status why = Annotate(dataset.status(), "rebuilding the dataset");
    out.put(mp::Value::Dict{{"fatal", std::string(why.message())}, {"worker", id}},
            absl::Seconds(10))
        .IgnoreError();
    return why;
  }
  state.map = *std::move(dataset);
  state.options.num_workers = static_cast<int>(num_workers);
  if (!batching) state.options.batch_size.reset();
  return WorkerLoop(state, id, static_cast<uint64_t>(base_seed), in, out);
}
EMBER_REGISTER_ENTRY_POINT(kWorkerEntryPoint, SpawnedWorker);

}  // namespace

// Note [Resuming a loader]
// state_dict() records where the loop stands in the order the epoch drew:
// the state of the loader's generator when the epoch began (before the
// base seed), the batches and samples the loop took, and each worker's
// generator state after the last batch the loop took from it (workers put
// their generator's state in every reply). load_state_dict() keeps it for
// the next iter(), which sets the generator back and draws the same base
// seed and order, then leaves out the taken batches without fetching them.
// Tasks go round the workers as the uninterrupted epoch sent them (batch k
// to worker k % num_workers), and each worker's first task carries its
// saved generator state, so a batch drawn with random numbers in a worker
// (augmentations) is the one the uninterrupted run made. Batches that
// were prefetched and not taken are simply made again. A sampler may resume
// by itself instead (Sampler::load_state): DistributedSampler leaves out
// the epoch's positions every rank took and splits the rest over the new
// world size, so the loader skips nothing.

// --- One epoch ------------------------------------------------------------------

struct DataLoaderIterator::Epoch {
  std::shared_ptr<LoaderState> state;
  // Map-style: each task's indices, in sampler order.
  std::vector<std::vector<int64_t>> tasks;
  // Without workers, an iterable's stream.
  SampleStream stream;
  bool done = false;
  int64_t next_task = 0;  // without workers: the next task to fetch

  // With workers.
  std::shared_ptr<WorkerPool> pool;
  bool persistent = false;
  int64_t token = 0;
  int64_t sent = 0;      // tasks sent so far (their ids are 0..sent-1)
  int64_t to_yield = 0;  // in order: the next task id to return
  int next_worker = 0;
  std::vector<bool> active;             // workers still given tasks
  std::vector<std::string> resume_rng;  // per worker, sent with its first task
  std::map<int64_t, int> outstanding;   // task id -> worker
  // A worker's answer to a task: a batch, an error, or the end of its
  // stream (nothing to return).
  struct Result {
    bool end = false;
    absl::StatusOr<Sample> batch;
    int worker = -1;
    std::string rng;  // the worker's generator state after this batch
  };
  std::map<int64_t, Result> ready;  // results not yet returned
  std::deque<int64_t> arrival;      // their ids as they came
  absl::Status failure;

  ~Epoch() {
    if (pool != nullptr && !persistent) pool->Stop();
  }

  bool MoreTasks() const {
    if (state->map != nullptr) return sent < static_cast<int64_t>(tasks.size());
    return std::find(active.begin(), active.end(), true) != active.end();
  }

  absl::Status SendTasks() {
    const int limit = state->options.prefetch_factor.value_or(2) * state->options.num_workers;
    while (static_cast<int>(outstanding.size()) < limit && MoreTasks()) {
      const int n = static_cast<int>(active.size());
      int w = next_worker;
      for (int k = 0; k < n && !active[w]; ++k) w = (w + 1) % n;
      if (!active[w]) break;
      next_worker = (w + 1) % n;
      mp::Value::List indices;
      if (state->map != nullptr) {
        for (int64_t i : tasks[sent]) indices.emplace_back(i);
      }
      mp::Value::List message{mp::Value(token), mp::Value(sent), mp::Value(std::move(indices))};
      if (w < static_cast<int>(resume_rng.size()) && !resume_rng[w].empty()) {
        message.emplace_back(std::move(resume_rng[w]));
        resume_rng[w].clear();
      }
      EMBER_RETURN_IF_ERROR(pool->index_queues[w].put(mp::Value(std::move(message))));
      outstanding[sent++] = w;
    }
    return absl::OkStatus();
  }

  // Stops the pool and remembers why.
  absl::Status Fail(absl::Status why) {
    failure = why;
    pool->failure = why;
    pool->Stop();
    return why;
  }

  absl::Status CheckWorkers() {
    for (size_t i = 0; i < pool->processes.size(); ++i) {
      mp::Process& p = pool->processes[i];
      if (p.is_alive()) continue;
      absl::StatusOr<mp::ExitStatus> end = p.join(absl::ZeroDuration());
      const std::string how = end.ok() ? end->str() : std::string(end.status().message());
      return Fail(absl::AbortedError(absl::StrCat(
          "DataLoader worker ", i, " (pid ", p.pid(), ") exited unexpectedly with ", how,
          p.error_message().empty() ? "" : absl::StrCat(" (", p.error_message(), ")"),
          "; the other workers were stopped")));
    }
    return absl::OkStatus();
  }

  // Waits for one result of this epoch until `deadline`.
  absl::Status ReceiveOne(absl::Time deadline, int64_t waiting_for) {
    while (true) {
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) {
        auto w = outstanding.find(waiting_for);
        return absl::DeadlineExceededError(absl::StrCat(
            "DataLoader timed out after ", absl::FormatDuration(state->options.timeout),
            " waiting for batch ", waiting_for,
            w != outstanding.end() ? absl::StrCat(" from worker ", w->second) : std::string()));
      }
      absl::StatusOr<mp::Value> got = pool->results.get(std::min(left, kStatusCheckInterval));
      if (!got.ok()) {
        if (got.status().code() != absl::StatusCode::kDeadlineExceeded) {
          // A batch can fail to arrive because its worker died meanwhile
          // (its regions went with it, unlinked as its connections closed,
          // a moment before it can be reaped): the death is the error to
          // report, when there is one within a grace.
          const absl::Time until = absl::Now() + kStopGrace;
          do {
            EMBER_RETURN_IF_ERROR(CheckWorkers());
            absl::SleepFor(absl::Milliseconds(10));
          } while (absl::IsNotFound(got.status()) && absl::Now() < until);
          return Fail(Annotate(got.status(), "DataLoader: receiving a batch"));
        }
        EMBER_RETURN_IF_ERROR(CheckWorkers());
        continue;
      }
      if (const mp::Value* fatal = got->find("fatal")) {
        return Fail(absl::AbortedError(
            absl::StrCat("DataLoader worker ", IntOf(*got, "worker"), ": worker_init_fn failed: ",
                         fatal->is<std::string>() ? *fatal->get_if<std::string>() : "",
                         "; the other workers were stopped")));
      }
      if (IntOf(*got, "token") != token) continue;  // a dropped epoch's
      const int64_t task = IntOf(*got, "task");
      const int64_t worker = IntOf(*got, "worker");
      outstanding.erase(task);
      Result r{.batch = Sample(), .worker = static_cast<int>(worker)};
      if (const mp::Value* rng = got->find("rng"); rng != nullptr && rng->is<std::string>()) {
        r.rng = *rng->get_if<std::string>();
      }
      if (got->find("end") != nullptr) {
        if (worker >= 0 && worker < static_cast<int64_t>(active.size())) active[worker] = false;
        r.end = true;
      } else if (const mp::Value* error = got->find("error")) {
        const auto code = static_cast<absl::StatusCode>(IntOf(*got, "code"));
        r.batch = absl::Status(
            code, absl::StrCat("DataLoader worker ", worker, ", ", *error->get_if<std::string>()));
      } else {
        r.batch = *got->find("batch");
      }
      ready[task] = std::move(r);
      arrival.push_back(task);
      return absl::OkStatus();
    }
  }

  absl::StatusOr<std::optional<Sample>> NextFromWorkers() {
    const absl::Time deadline = state->options.timeout > absl::ZeroDuration()
                                    ? absl::Now() + state->options.timeout
                                    : absl::InfiniteFuture();
    while (true) {
      EMBER_RETURN_IF_ERROR(SendTasks());
      // A result to hand out?
      std::optional<int64_t> pick;
      if (state->options.in_order) {
        if (ready.count(to_yield)) pick = to_yield;
      } else if (!arrival.empty()) {
        pick = arrival.front();
      }
      if (pick) {
        Result r = std::move(ready[*pick]);
        ready.erase(*pick);
        arrival.erase(std::find(arrival.begin(), arrival.end(), *pick));
        if (state->options.in_order) ++to_yield;
        if (r.end) continue;
        Took(*pick);
        if (r.worker >= 0 && r.worker < static_cast<int>(state->worker_rng.size())) {
          state->worker_rng[r.worker] = std::move(r.rng);
        }
        if (!r.batch.ok()) return r.batch.status();
        return std::optional<Sample>(state->Pin(*std::move(r.batch)));
      }
      if (outstanding.empty() && !MoreTasks()) return End();
      EMBER_RETURN_IF_ERROR(
          ReceiveOne(deadline, state->options.in_order ? to_yield : outstanding.begin()->first));
    }
  }

  // The loop took task `task` (Note [Resuming a loader]).
  void Took(int64_t task) {
    ++state->batches_taken;
    if (state->map != nullptr) state->samples_taken += static_cast<int64_t>(tasks[task].size());
  }

  absl::StatusOr<std::optional<Sample>> End() {
    done = true;
    state->in_epoch = false;
    return std::optional<Sample>();
  }

  absl::StatusOr<std::optional<Sample>> NextHere() {
    if (state->map != nullptr) {
      if (next_task >= static_cast<int64_t>(tasks.size())) return End();
      Took(next_task);
      absl::StatusOr<std::optional<Sample>> b = state->Fetch(tasks[next_task++], nullptr);
      if (!b.ok()) return b.status();
      return std::optional<Sample>(state->Pin(**std::move(b)));
    }
    absl::StatusOr<std::optional<Sample>> b = state->Fetch({}, &stream);
    if (!b.ok()) return b.status();
    if (!b->has_value()) return End();
    Took(0);
    return std::optional<Sample>(state->Pin(**std::move(b)));
  }
};

DataLoaderIterator::DataLoaderIterator(std::unique_ptr<Epoch> epoch) : epoch_(std::move(epoch)) {}
DataLoaderIterator::DataLoaderIterator(DataLoaderIterator&&) noexcept = default;
DataLoaderIterator& DataLoaderIterator::operator=(DataLoaderIterator&&) noexcept = default;
DataLoaderIterator::~DataLoaderIterator() = default;

absl::StatusOr<std::optional<Sample>> DataLoaderIterator::next() {
  Epoch& e = *epoch_;
  if (!e.failure.ok()) return e.failure;
  if (e.done) return std::optional<Sample>();
  return e.pool != nullptr ? e.NextFromWorkers() : e.NextHere();
}

// --- The loader -------------------------------------------------------------------

namespace {

absl::Status CheckOptions(const DataLoaderOptions& o, bool iterable) {
  auto refuse = [](std::string what) { return absl::InvalidArgumentError("DataLoader: " + what); };
  if (o.num_workers < 0) {
    return refuse(absl::StrCat("num_workers option should be non-negative, got ", o.num_workers,
                               "; use num_workers=0 to disable multiprocessing"));
  }
  if (o.timeout < absl::ZeroDuration()) {
    return refuse(absl::StrCat("timeout option should be non-negative, got ",
                               absl::FormatDuration(o.timeout)));
  }
  if (o.num_workers == 0 && o.prefetch_factor) {
    return refuse(
        "prefetch_factor option could only be specified in multiprocessing: let num_workers > 0 "
        "to enable multiprocessing, otherwise leave prefetch_factor unset");
  }
  if (o.prefetch_factor && *o.prefetch_factor < 0) {
    return refuse(
        absl::StrCat("prefetch_factor option should be non-negative, got ", *o.prefetch_factor));
  }
  if (o.prefetch_factor && *o.prefetch_factor == 0) {
    return refuse(
        "prefetch_factor=0 would never request a batch; leave it unset (2) or give a "
        "positive number");
  }
  if (o.persistent_workers && o.num_workers == 0) {
    return refuse("persistent_workers option needs num_workers > 0");
  }
  if (!o.multiprocessing_context.empty() && o.num_workers == 0) {
    return refuse(
        absl::StrCat("multiprocessing_context can only be used with multi-process "
                     "loading (num_workers > 0), but got num_workers=",
                     o.num_workers));
  }
  const std::string& method = o.multiprocessing_context;
  if (!method.empty() && method != "fork" && method != "spawn" && method != "forkserver") {
    return refuse(
        absl::StrCat("multiprocessing_context option should specify a valid start "
                     "method in ['fork', 'spawn', 'forkserver'], but got "
                     "multiprocessing_context='",
                     method, "'"));
  }
  if (method == "spawn" || method == "forkserver") {
    if (iterable) {
      return absl::UnimplementedError(absl::StrCat(
          "DataLoader: an IterableDataset's workers can only be forked (its stream has no "
          "recipe to rebuild it from); use multiprocessing_context 'fork'"));
    }
    if (o.collate_fn || o.worker_init_fn) {
      return refuse(
          absl::StrCat("multiprocessing_context '", method, "' starts fresh processes, to which ",
                       o.collate_fn ? "collate_fn" : "worker_init_fn",
                       " (a C++ function) cannot be sent; use 'fork', or leave it unset"));
    }
  }
  if (o.batch_size && *o.batch_size <= 0) {
    return refuse(
        absl::StrCat("batch_size should be a positive integer value, but got "
                     "batch_size=",
                     *o.batch_size));
  }
  if (iterable) {
    if (o.shuffle) {
      return refuse(
          "DataLoader with IterableDataset: expected unspecified shuffle option, but "
          "got shuffle=true");
    }
    if (o.sampler) {
      return refuse("DataLoader with IterableDataset: expected unspecified sampler option");
    }
    if (o.batch_sampler) {
      return refuse("DataLoader with IterableDataset: expected unspecified batch_sampler option");
    }
  }
  if (o.sampler && o.shuffle) return refuse("sampler option is mutually exclusive with shuffle");
  if (o.batch_sampler &&
      (o.batch_size != std::optional<int64_t>(1) || o.shuffle || o.sampler || o.drop_last)) {
    return refuse(
        "batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, "
        "and drop_last");
  }
  if (!o.batch_size && !o.batch_sampler && o.drop_last) {
    return refuse(
        "batch_size=None option disables auto-batching and is mutually exclusive with "
        "drop_last");
  }
  return absl::OkStatus();
}

}  // namespace

DataLoader::DataLoader(std::shared_ptr<LoaderState> state) : state_(std::move(state)) {}
DataLoader::DataLoader(DataLoader&&) noexcept = default;
DataLoader& DataLoader::operator=(DataLoader&&) noexcept = default;
DataLoader::~DataLoader() = default;

absl::StatusOr<DataLoader> DataLoader::create(std::shared_ptr<Dataset> dataset,
                                              DataLoaderOptions options) {
  if (dataset == nullptr) return absl::InvalidArgumentError("DataLoader: the dataset is null");
  EMBER_RETURN_IF_ERROR(CheckOptions(options, /*iterable=*/false));
  if ((options.multiprocessing_context == "spawn" ||
       options.multiprocessing_context == "forkserver") &&
      !dataset->recipe()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DataLoader: multiprocessing_context '", options.multiprocessing_context,
        "' rebuilds the dataset in each worker from its recipe(), and this dataset has none; "
        "give it one (Dataset::recipe, EMBER_REGISTER_DATASET_FACTORY) or use 'fork'"));
  }
  auto state = std::make_shared<LoaderState>();
  state->map = std::move(dataset);
  state->pin_memory = options.pin_memory;
  state->options = std::move(options);
  DataLoaderOptions& o = state->options;
  if (o.batch_sampler) {
    state->batch_sampler = o.batch_sampler;
  } else {
    state->sampler = o.sampler != nullptr ? o.sampler
                     : o.shuffle
                         ? std::shared_ptr<Sampler>(std::make_shared<RandomSampler>(
                               state->map->size(), RandomSamplerOptions{.generator = o.generator}))
                         : std::make_shared<SequentialSampler>(state->map->size());
    if (o.batch_size) {
      state->batch_sampler =
          std::make_shared<BatchSampler>(state->sampler, *o.batch_size, o.drop_last);
    }
  }
  return DataLoader(std::move(state));
}

absl::StatusOr<DataLoader> DataLoader::create(std::shared_ptr<IterableDataset> dataset,
                                              DataLoaderOptions options) {
  if (dataset == nullptr) return absl::InvalidArgumentError("DataLoader: the dataset is null");
  EMBER_RETURN_IF_ERROR(CheckOptions(options, /*iterable=*/true));
  auto state = std::make_shared<LoaderState>();
  state->iterable = std::move(dataset);
  state->pin_memory = options.pin_memory;
  state->options = std::move(options);
  return DataLoader(std::move(state));
}

const DataLoaderOptions& DataLoader::options() const { return state_->options; }

std::optional<int64_t> DataLoader::size() const {
  if (state_->map != nullptr) {
    return state_->batch_sampler != nullptr ? state_->batch_sampler->size()
                                            : state_->sampler->size();
  }
  std::optional<int64_t> n = state_->iterable->size();
  if (!n || !state_->batching()) return n;
  const int64_t b = *state_->options.batch_size;
  return state_->options.drop_last ? *n / b : (*n + b - 1) / b;
}

namespace {

Tensor BytesTensor(const std::string& bytes) {
  Tensor t = empty({static_cast<int64_t>(bytes.size())}, kUInt8);
  if (!bytes.empty()) std::memcpy(t.raw_data(), bytes.data(), bytes.size());
  return t;
}

std::string WorkerKey(int w) { return absl::StrCat("worker_rng_state.", w); }

}  // namespace

StateDict DataLoader::state_dict() const {
  LoaderState& st = *state_;
  StateDict out;
  out.emplace_back("generator_state",
                   st.in_epoch ? st.epoch_generator_state : st.generator().get_state());
  out.emplace_back("batches_taken", internal::StateValue(st.in_epoch ? st.batches_taken : 0));
  out.emplace_back("samples_taken", internal::StateValue(st.in_epoch ? st.samples_taken : 0));
  out.emplace_back("num_workers", internal::StateValue(st.options.num_workers));
  if (!st.in_epoch) return out;
  for (size_t w = 0; w < st.worker_rng.size(); ++w) {
    if (st.worker_rng[w].empty()) continue;
    Tensor rng = BytesTensor(st.worker_rng[w]);
    out.emplace_back(WorkerKey(static_cast<int>(w)), rng);
  }
  if (Sampler* sampler = st.IndexSampler()) sampler->save_state(st.samples_taken, out);
  return out;
}

absl::Status DataLoader::load_state_dict(const StateDict& state) {
  LoaderState& st = *state_;
  if (st.iterable != nullptr) {
    return absl::UnimplementedError(
        "DataLoader::load_state_dict: an IterableDataset's stream has no state to resume "
        "from; resume a map-style dataset, or skip batches yourself");
  }
  const Tensor* gen = internal::FindState(state, "generator_state");
  if (gen == nullptr || !gen->defined() || gen->dtype() != kUInt8 || gen->dim() != 1) {
    return absl::InvalidArgumentError(
        "DataLoader::load_state_dict: the state has no 'generator_state' (a 1-D uint8 tensor); "
        "pass what DataLoader::state_dict() returned");
  }
  EMBER_ASSIGN_OR_RETURN(int64_t batches, internal::StateInt(state, "batches_taken"));
  EMBER_RETURN_IF_ERROR(internal::StateInt(state, "samples_taken").status());
  EMBER_RETURN_IF_ERROR(internal::StateInt(state, "num_workers").status());
  const int64_t per_epoch =
      st.batch_sampler != nullptr ? st.batch_sampler->size() : st.sampler->size();
  const bool by_sampler = internal::FindState(state, "sampler.consumed") != nullptr;
  if (!by_sampler && (batches < 0 || batches > per_epoch)) {
    return absl::InvalidArgumentError(
        absl::StrCat("DataLoader::load_state_dict: the state says ", batches,
                     " batches of the epoch were taken, but an epoch of this loader has ",
                     per_epoch, "; it was saved for another dataset or batch size"));
  }
  try {
    Generator probe(0, st.generator().device());
    probe.set_state(*gen);  // refuses bytes that are not a generator state
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("DataLoader::load_state_dict: ", e.what()));
  }
  bool by_itself = false;
  if (Sampler* sampler = st.IndexSampler()) {
    EMBER_ASSIGN_OR_RETURN(by_itself, sampler->load_state(state));
  }
  st.resume = state;
  st.resume_by_sampler = by_itself;
  return absl::OkStatus();
}

absl::StatusOr<DataLoaderIterator> DataLoader::iter() {
  LoaderState& st = *state_;
  auto epoch = std::make_unique<DataLoaderIterator::Epoch>();
  epoch->state = state_;
  std::optional<StateDict> resume = std::move(st.resume);
  st.resume.reset();
  int64_t skip = 0;
  int64_t taken_before = 0;  // batches the saved epoch had taken
  if (resume) {
    st.generator().set_state(*internal::FindState(*resume, "generator_state"));
    taken_before = *internal::StateInt(*resume, "batches_taken");
    skip = st.resume_by_sampler ? 0 : taken_before;
  }
  st.epoch_generator_state = st.generator().get_state();
  const bool reuse = st.persistent != nullptr && st.persistent->failure.ok();
  // torch draws the base seed when an iterator is made (for persistent
  // workers, once), before the sampler draws its order.
  const uint64_t base_seed = reuse ? st.persistent->base_seed : internal::DrawSeed(st.generator());
  if (st.map != nullptr) {
    if (st.batch_sampler != nullptr) {
      epoch->tasks = st.batch_sampler->batches();
    } else {
      for (int64_t i : st.sampler->indices()) epoch->tasks.push_back({i});
    }
  }
  skip = std::min<int64_t>(skip, epoch->tasks.size());
  st.batches_taken = skip;
  st.samples_taken = 0;
  for (int64_t t = 0; t < skip; ++t) st.samples_taken += epoch->tasks[t].size();
  epoch->tasks.erase(epoch->tasks.begin(), epoch->tasks.begin() + skip);
  st.in_epoch = true;
  st.worker_rng.assign(st.options.num_workers, std::string());
  if (st.options.num_workers == 0) {
    if (st.iterable != nullptr) {
      absl::StatusOr<SampleStream> s =
          Guarded([&]() -> absl::StatusOr<SampleStream> { return st.iterable->iter(); });
      if (!s.ok()) return Annotate(s.status(), "DataLoader: the dataset's iter()");
      epoch->stream = *std::move(s);
    }
    return DataLoaderIterator(std::move(epoch));
  }
  if (resume && *internal::StateInt(*resume, "num_workers") == st.options.num_workers) {
    // Each worker goes on from where its generator stood after the last
    // batch the loop took from it, and the tasks go round as they would
    // have (batch k to worker k % num_workers).
    for (int w = 0; w < st.options.num_workers; ++w) {
      if (const Tensor* rng = internal::FindState(*resume, WorkerKey(w))) {
        st.worker_rng[w] =
            std::string(static_cast<const char*>(rng->contiguous().raw_data()), rng->numel());
      }
    }
    epoch->resume_rng = st.worker_rng;
  }
  epoch->next_worker = static_cast<int>(taken_before % st.options.num_workers);
  if (reuse) {
    epoch->pool = st.persistent;
  } else {
    st.persistent.reset();
    EMBER_ASSIGN_OR_RETURN(epoch->pool, StartPool(state_, base_seed));
    if (st.options.persistent_workers) st.persistent = epoch->pool;
  }
  epoch->persistent = st.options.persistent_workers;
  epoch->token = ++epoch->pool->token;
  epoch->active.assign(st.options.num_workers, true);
  return DataLoaderIterator(std::move(epoch));
}

}  // namespace ember::data
