// Round trips through a Queue: the parent puts a fresh tensor, a child gets
// it and answers with a small ack (its element count), for both sharing
// strategies and 4 KiB / 1 MiB / 64 MiB tensors: the same protocol as
// PyTorch's peer script (torch.multiprocessing Queue, fork context).
//
//   EMBER_TORCH_PEER=/path/to/torch_mp_queue.py bazel run //multiprocessing:queue_benchmark
//
// With EMBER_TORCH_PEER set, each case first runs the peer's bench() for the
// same strategy and size (/usr/bin/python3, or $EMBER_PYTHON), then itself,
// and reports PyTorch's rate (torch_msgs_per_s) and the ratio (x_torch); use
// --benchmark_repetitions to pair several runs on a noisy machine.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/time/clock.h"
#include "benchmark/benchmark.h"
#include "multiprocessing/process.h"
#include "multiprocessing/queue.h"
#include "multiprocessing/sharing.h"
#include "tensor/factories.h"

namespace ember::multiprocessing {
namespace {

const char* StrategyOf(int64_t code) { return code == 0 ? "file_descriptor" : "file_system"; }

// PyTorch's messages per second for one case, measured now by the peer's
// own bench() with the peer's own message counts; 0 without a peer.
double TorchRate(const std::string& strategy, int64_t nbytes) {
  const char* script = std::getenv("EMBER_TORCH_PEER");
  if (script == nullptr || *script == '\0') return 0;
  std::string path = script;
  std::string dir = path.substr(0, path.rfind('/'));
  std::string module = path.substr(path.rfind('/') + 1);
  module = module.substr(0, module.rfind('.'));
  const int n = nbytes <= (4 << 10) ? 2000 : nbytes <= (1 << 20) ? 500 : 30;
  const char* python = std::getenv("EMBER_PYTHON");
  std::string cmd = std::string(python != nullptr ? python : "/usr/bin/python3") +
                    " -c \"import sys; sys.path.insert(0, '" + dir + "'); import " + module +
                    " as peer; print(peer.bench('" + strategy + "', " + std::to_string(nbytes) +
                    ", " + std::to_string(n) + "))\"";
  FILE* f = ::popen(cmd.c_str(), "r");
  if (f == nullptr) return 0;
  double rate = 0;
  if (std::fscanf(f, "%lf", &rate) != 1) rate = 0;
  ::pclose(f);
  return rate;
}

void BM_QueueRoundTrip(benchmark::State& state) {
  const std::string strategy = StrategyOf(state.range(0));
  const int64_t nbytes = state.range(1);
  // The peer runs first, alone, under the same conditions as what follows.
  const double torch = TorchRate(strategy, nbytes);
  if (!set_sharing_strategy(strategy).ok()) return state.SkipWithError("strategy");
  absl::StatusOr<Queue> in = Queue::Create(), out = Queue::Create();
  if (!in.ok() || !out.ok()) return state.SkipWithError("queue");
  absl::StatusOr<Process> child = Process::Start([&]() -> absl::Status {
    while (true) {
      absl::StatusOr<Value> v = in->Get(absl::Seconds(60));
      if (!v.ok()) return v.status();
      const Tensor* t = v->get_if<Tensor>();
      if (t == nullptr) return absl::OkStatus();  // None: stop
      absl::Status s = out->Put(Value(t->numel()), absl::Seconds(60));
      if (!s.ok()) return s;
    }
  });
  if (!child.ok()) return state.SkipWithError("fork");
  auto round_trip = [&] {
    Tensor t = zeros({nbytes / 4});
    if (!in->Put(Value(t), absl::Seconds(60)).ok()) return false;
    absl::StatusOr<Value> ack = out->Get(absl::Seconds(60));
    return ack.ok() && *ack->get_if<int64_t>() == nbytes / 4;
  };
  for (int i = 0; i < 5; ++i) round_trip();  // warm-up, as the peer does
  const absl::Time start = absl::Now();
  for (auto _ : state) {
    if (!round_trip()) {
      state.SkipWithError("round trip failed");
      break;
    }
  }
  const double rate = state.iterations() / absl::ToDoubleSeconds(absl::Now() - start);
  (void)in->Put(Value());
  (void)child->Join(absl::Seconds(60));
  state.counters["msgs_per_s"] = rate;
  state.SetBytesProcessed(state.iterations() * nbytes);
  if (torch > 0) {
    state.counters["torch_msgs_per_s"] = torch;
    state.counters["x_torch"] = rate / torch;
  }
  state.SetLabel(strategy);
}

// Fixed message counts (5x the peer's), so that each repetition runs the
// case once, right after its peer measurement.
void Cases(benchmark::internal::Benchmark* b) {
  b->ArgNames({"fs", "bytes"})->UseRealTime()->Unit(benchmark::kMicrosecond);
}
BENCHMARK(BM_QueueRoundTrip)->Apply(Cases)->Args({0, 4 << 10})->Iterations(10000);
BENCHMARK(BM_QueueRoundTrip)->Apply(Cases)->Args({1, 4 << 10})->Iterations(10000);
BENCHMARK(BM_QueueRoundTrip)->Apply(Cases)->Args({0, 1 << 20})->Iterations(2500);
BENCHMARK(BM_QueueRoundTrip)->Apply(Cases)->Args({1, 1 << 20})->Iterations(2500);
BENCHMARK(BM_QueueRoundTrip)->Apply(Cases)->Args({0, 64 << 20})->Iterations(150);
BENCHMARK(BM_QueueRoundTrip)->Apply(Cases)->Args({1, 64 << 20})->Iterations(150);

}  // namespace
}  // namespace ember::multiprocessing
