// Pool throughput and Lock cost, each against its baseline in the same run.
//
//   EMBER_TORCH_PEER=$PWD/multiprocessing/torch_mp_pool.py bazel run //multiprocessing:pool_benchmark
//
// BM_PoolMapInts / BM_PoolMapTensors / BM_PoolApply: Pool(2 processes, fork)
// running map over small ints (default chunksize), map over fresh 1 KiB
// float tensors (each moved to shared memory when sent), and apply one task
// at a time. With EMBER_TORCH_PEER set, each first runs the same work
// through torch.multiprocessing's Pool (fork context) in the peer script
// (/usr/bin/python3, or $EMBER_PYTHON) over as many rounds, and reports its rate
// (torch_items_per_s) and Ember's over it (x_torch, > 1: Ember is faster).
//
// BM_LockVsPthreadMutex: uncontended acquire+release of a Lock (a robust,
// process-shared, error-checking pthread mutex plus the owner bookkeeping)
// against a plain default pthread_mutex_t and against the robust,
// process-shared, error-checking pthread mutex Lock is built on, in
// alternating rounds; reports the costs and lock_over_pthread /
// lock_over_robust (the ratios). With the peer, also
// torch.multiprocessing.Lock's cost (torch_lock_ns) and torch_over_lock.
#include <pthread.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/time/clock.h"
#include "benchmark/benchmark.h"
#include "multiprocessing/pool.h"
#include "multiprocessing/synchronize.h"
#include "tensor/factories.h"

namespace ember::multiprocessing {
namespace {

absl::StatusOr<Value> Square(absl::Span<const Value> args) {
  absl::StatusOr<int64_t> x = args[0].as<int64_t>();
  if (!x.ok()) return x.status();
  return Value(*x * *x);
}
EMBER_REGISTER_POOL_FUNCTION("square", Square);

absl::StatusOr<Value> TensorSum(absl::Span<const Value> args) {
  absl::StatusOr<Tensor> t = args[0].as<Tensor>();
  if (!t.ok()) return t.status();
  return Value(t->sum().item<double>());
}
EMBER_REGISTER_POOL_FUNCTION("tensor_sum", TensorSum);

constexpr int kProcesses = 2;

// The peer's rate for `call` (a Python expression on module `peer`); 0
// without a peer.
double TorchRate(const std::string& call) {
  const char* script = std::getenv("EMBER_TORCH_PEER");
  if (script == nullptr || *script == '\0') return 0;
  std::string path = script;
  std::string dir = path.substr(0, path.rfind('/'));
  std::string module = path.substr(path.rfind('/') + 1);
  module = module.substr(0, module.rfind('.'));
  const char* python = std::getenv("EMBER_PYTHON");
  std::string cmd = std::string(python != nullptr ? python : "/usr/bin/python3") +
                    " -c \"import sys; sys.path.insert(0, '" + dir + "'); import " + module +
                    " as peer; print(peer." + call + ")\"";
  FILE* f = ::popen(cmd.c_str(), "r");
  if (f == nullptr) return 0;
  double rate = 0;
  if (std::fscanf(f, "%lf", &rate) != 1) rate = 0;
  ::pclose(f);
  return rate;
}

void Report(benchmark::State& state, double items, absl::Duration elapsed, double torch) {
  const double rate = items / absl::ToDoubleSeconds(elapsed);
  state.counters["items_per_s"] = rate;
  if (torch > 0) {
    state.counters["torch_items_per_s"] = torch;
    state.counters["x_torch"] = rate / torch;
  }
}

absl::StatusOr<Pool> WarmPool() {
  absl::StatusOr<Pool> pool = Pool::create({.processes = kProcesses, .start_method = "fork"});
  if (!pool.ok()) return pool.status();
  Value::List warm;
  for (int i = 0; i < kProcesses * 4; ++i) warm.push_back(Value(i));
  absl::StatusOr<Value::List> out = pool->map("square", warm);
  if (!out.ok()) return out.status();
  return pool;
}

void BM_PoolMapInts(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const double torch = TorchRate("bench_map_ints(" + std::to_string(n) + ", 2, " +
                                 std::to_string(state.max_iterations) + ")");
  absl::StatusOr<Pool> pool = WarmPool();
  if (!pool.ok()) return state.SkipWithError(std::string(pool.status().message()).c_str());
  Value::List items;
  for (int i = 0; i < n; ++i) items.push_back(Value(i));
  const absl::Time start = absl::Now();
  for (auto _ : state) {
    absl::StatusOr<Value::List> out = pool->map("square", items);
    if (!out.ok()) return state.SkipWithError(std::string(out.status().message()).c_str());
  }
  Report(state, static_cast<double>(n) * state.iterations(), absl::Now() - start, torch);
}

void BM_PoolMapTensors(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const int numel = 256;  // 1 KiB of float32
  const double torch = TorchRate("bench_map_tensors(" + std::to_string(n) + ", " +
                                 std::to_string(numel) + ", 2, " +
                                 std::to_string(state.max_iterations) + ")");
  absl::StatusOr<Pool> pool = WarmPool();
  if (!pool.ok()) return state.SkipWithError(std::string(pool.status().message()).c_str());
  const absl::Time start = absl::Now();
  for (auto _ : state) {
    Value::List items;
    for (int i = 0; i < n; ++i) items.push_back(Value(ones({numel})));
    absl::StatusOr<Value::List> out = pool->map("tensor_sum", std::move(items));
    if (!out.ok()) return state.SkipWithError(std::string(out.status().message()).c_str());
  }
  Report(state, static_cast<double>(n) * state.iterations(), absl::Now() - start, torch);
}

void BM_PoolApply(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const double torch = TorchRate("bench_apply(" + std::to_string(n) + ", 2, " +
                                 std::to_string(state.max_iterations) + ")");
  absl::StatusOr<Pool> pool = WarmPool();
  if (!pool.ok()) return state.SkipWithError(std::string(pool.status().message()).c_str());
  const absl::Time start = absl::Now();
  for (auto _ : state) {
    for (int i = 0; i < n; ++i) {
      absl::StatusOr<Value> out = pool->apply("square", {Value(i)});
      if (!out.ok()) return state.SkipWithError(std::string(out.status().message()).c_str());
    }
  }
  Report(state, static_cast<double>(n) * state.iterations(), absl::Now() - start, torch);
}

void BM_LockVsPthreadMutex(benchmark::State& state) {
  constexpr int kRound = 100000;
  const double torch = TorchRate("bench_lock(" + std::to_string(kRound) + ")");
  absl::StatusOr<Lock> lock = Lock::create();
  if (!lock.ok()) return state.SkipWithError("Lock::create");
  pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  // What Lock is built on, alone: robust, process-shared, error-checking.
  pthread_mutex_t robust;
  pthread_mutexattr_t attr;
  ::pthread_mutexattr_init(&attr);
  ::pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  ::pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
  ::pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_ERRORCHECK);
  ::pthread_mutex_init(&robust, &attr);
  absl::Duration lock_time, mutex_time, robust_time;
  for (auto _ : state) {
    absl::Time t0 = absl::Now();
    for (int i = 0; i < kRound; ++i) {
      if (!lock->acquire().ok() || !lock->release().ok()) return state.SkipWithError("Lock");
    }
    absl::Time t1 = absl::Now();
    for (int i = 0; i < kRound; ++i) {
      ::pthread_mutex_lock(&mu);
      benchmark::DoNotOptimize(&mu);
      ::pthread_mutex_unlock(&mu);
    }
    absl::Time t2 = absl::Now();
    for (int i = 0; i < kRound; ++i) {
      ::pthread_mutex_lock(&robust);
      benchmark::DoNotOptimize(&robust);
      ::pthread_mutex_unlock(&robust);
    }
    absl::Time t3 = absl::Now();
    lock_time += t1 - t0;
    mutex_time += t2 - t1;
    robust_time += t3 - t2;
  }
  const double pairs = static_cast<double>(kRound) * state.iterations();
  const double lock_ns = absl::ToDoubleNanoseconds(lock_time) / pairs;
  const double mutex_ns = absl::ToDoubleNanoseconds(mutex_time) / pairs;
  const double robust_ns = absl::ToDoubleNanoseconds(robust_time) / pairs;
  state.counters["lock_ns"] = lock_ns;
  state.counters["pthread_ns"] = mutex_ns;
  state.counters["robust_pthread_ns"] = robust_ns;
  state.counters["lock_over_pthread"] = lock_ns / mutex_ns;
  state.counters["lock_over_robust"] = lock_ns / robust_ns;
  if (torch > 0) {
    state.counters["torch_lock_ns"] = 1e9 / torch;
    state.counters["torch_over_lock"] = (1e9 / torch) / lock_ns;
  }
}

// The peer runs as many rounds as the iterations here.
BENCHMARK(BM_PoolMapInts)->Arg(20000)->Iterations(20)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_PoolMapTensors)->Arg(1000)->Iterations(5)->UseRealTime()->Unit(
    benchmark::kMillisecond);
BENCHMARK(BM_PoolApply)->Arg(1000)->Iterations(5)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_LockVsPthreadMutex)->Iterations(20)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace ember::multiprocessing
