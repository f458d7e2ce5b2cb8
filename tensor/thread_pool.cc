#include "tensor/thread_pool.h"

#include <omp.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "cblas.h"
#include "tensor/error.h"

// Note [One team for every op]
// Ember's intra-op work and oneDNN's primitives share one set of threads:
// GNU OpenMP's team, which Debian's oneDNN (an OpenMP build) runs on. With
// two pools on the same cores each takes the cores from the other: after
// every primitive the team's threads spin-wait for the next region
// (GOMP_SPINCOUNT) while the pool's workers need those cores for the batch
// norm, ReLU or optimizer step that follows; with one team the next op's
// region finds the spinning threads ready. (PyTorch's at::parallel_for runs
// on OpenMP too, its default parallel backend.)
//
// GNU OpenMP's team does not survive fork(): a region in the child waits
// forever for its parent's threads. A child forked after the team started
// therefore runs parallel_for on a pool of Ember's own workers (started
// afresh in the child) and gives OpenMP libraries one thread
// (internal::openmp_threads()); a child forked before it uses OpenMP as its
// parent would.

namespace ember {
namespace {

thread_local bool t_in_parallel = false;

// Whether this process has run an OpenMP region on several threads, and
// whether it is a child forked after that (Note [One team for every op]).
std::atomic<bool> g_team_started{false};
std::atomic<bool> g_forked_after_team{false};

void WatchForks() {
  static std::once_flag once;
  std::call_once(once, [] {
    pthread_atfork(nullptr, nullptr, [] {
      if (g_team_started.load(std::memory_order_relaxed)) {
        g_forked_after_team.store(true, std::memory_order_relaxed);
      }
    });
  });
}

int DefaultThreads() {
  int n = 0;
  if (const char* env = std::getenv("OMP_NUM_THREADS");
      env != nullptr && absl::SimpleAtoi(env, &n) && n > 0) {
    return n;
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

// Workers that run queued tasks; grows on demand, never shrinks. Used in a
// child forked after the OpenMP team started (Note [One team for every op]).
class Pool {
 public:
  // The process's pool. Never destroyed: workers outlive main. A child made
  // by fork() has none of its parent's workers (and the parent's lock may have
  // been held at the fork), so the child starts over with a fresh pool; the
  // parent's copy is abandoned.
  static Pool& Get() {
    static std::once_flag once;
    std::call_once(once, [] {
      current_ = new Pool();
      pthread_atfork(nullptr, nullptr, [] { current_ = new Pool(); });
    });
    return *current_;
  }

  void Run(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      tasks_.push_back(std::move(task));
    }
    cv_.notify_one();
  }

  void EnsureWorkers(int n) {
    std::lock_guard<std::mutex> lock(mu_);
    while (static_cast<int>(workers_.size()) < n) {
      workers_.emplace_back([this] { Loop(); });
      workers_.back().detach();
    }
  }

 private:
  void Loop() {
    t_in_parallel = true;
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return !tasks_.empty(); });
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
    }
  }

  static inline Pool* current_ = nullptr;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  std::vector<std::thread> workers_;
};

std::atomic<int>& NumThreads() {
  static std::atomic<int> n{[] {
    // Note [BLAS on the team]. Here, not in a static initialiser: in a
    // static binary OpenBLAS may not be initialised yet when those run.
    openblas_set_num_threads(1);
    return DefaultThreads();
  }()};
  return n;
}

}  // namespace

int get_num_threads() { return NumThreads().load(std::memory_order_relaxed); }

void set_num_threads(int n) {
  EMBER_CHECK(n >= 1, "set_num_threads: expected a positive number of threads, got ", n);
  NumThreads().store(n, std::memory_order_relaxed);
}

bool in_parallel_region() { return t_in_parallel; }

namespace internal {

int openmp_threads() {
  WatchForks();
  if (t_in_parallel || g_forked_after_team.load(std::memory_order_relaxed)) return 1;
  int n = get_num_threads();
  if (n > 1) g_team_started.store(true, std::memory_order_relaxed);
  return n;
}

}  // namespace internal

namespace {

// Runs chunk t of `tasks` for every t in [0, tasks) on OpenMP's team, the
// caller taking chunk 0 (Note [One team for every op]). The team may be
// smaller than asked for; its threads then take several chunks each.
void RunOnTeam(int64_t tasks, const std::function<void(int64_t)>& run_chunk) {
  const int team = static_cast<int>(tasks);
#pragma omp parallel num_threads(team)
  {
    t_in_parallel = true;
    for (int64_t t = omp_get_thread_num(); t < tasks; t += omp_get_num_threads()) run_chunk(t);
    t_in_parallel = false;
  }
}

// The same on Ember's own workers, for children forked after the team
// started.
void RunOnPool(int64_t tasks, const std::function<void(int64_t)>& run_chunk) {
  Pool::Get().EnsureWorkers(static_cast<int>(tasks) - 1);
  std::mutex mu;
  std::condition_variable done_cv;
  int64_t remaining = tasks - 1;
  for (int64_t t = 1; t < tasks; ++t) {
    Pool::Get().Run([&, t] {
      run_chunk(t);
      std::lock_guard<std::mutex> lock(mu);
      if (--remaining == 0) done_cv.notify_one();
    });
  }
  t_in_parallel = true;
  run_chunk(0);
  t_in_parallel = false;
  std::unique_lock<std::mutex> lock(mu);
  done_cv.wait(lock, [&] { return remaining == 0; });
}

}  // namespace

void parallel_for(int64_t begin, int64_t end, int64_t grain,
                  const std::function<void(int64_t, int64_t)>& body) {
  if (begin >= end) return;
  int64_t range = end - begin;
  grain = std::max<int64_t>(grain, 1);
  int64_t tasks = std::min<int64_t>(get_num_threads(), (range + grain - 1) / grain);
  if (tasks <= 1 || t_in_parallel) {
    bool was = t_in_parallel;
    t_in_parallel = true;
    try {
      body(begin, end);
    } catch (...) {
      t_in_parallel = was;
      throw;
    }
    t_in_parallel = was;
    return;
  }
  int64_t chunk = (range + tasks - 1) / tasks;
  std::mutex mu;
  std::exception_ptr error;
  auto run_chunk = [&](int64_t t) {
    int64_t b = begin + t * chunk;
    int64_t e = std::min(end, b + chunk);
    try {
      if (b < e) body(b, e);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      if (!error) error = std::current_exception();
    }
  };
  WatchForks();
  if (g_forked_after_team.load(std::memory_order_relaxed)) {
    RunOnPool(tasks, run_chunk);
  } else {
    g_team_started.store(true, std::memory_order_relaxed);
    RunOnTeam(tasks, run_chunk);
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace ember
