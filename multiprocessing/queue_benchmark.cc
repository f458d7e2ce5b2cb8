// Round trips through a Queue: the parent puts a fresh tensor, a child gets
// it and answers with a small ack (its element count), for both sharing
// strategies and 4 KiB / 1 MiB / 64 MiB tensors: the same protocol as
// PyTorch's peer script (torch.multiprocessing Queue, fork context).
//
//   EMBER_TORCH_PEER=/path/to/torch_mp_queue.py \
//     bazel run //multiprocessing:queue_benchmark
//
// With EMBER_TORCH_PEER set, the peer runs once (/usr/bin/python3, or
// $EMBER_PYTHON) in the same run and each benchmark reports PyTorch's rate
// for the same case (torch_msgs_per_s) and the ratio (x_torch).
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <utility>

#include "benchmark/benchmark.h"
#include "multiprocessing/process.h"
#include "multiprocessing/queue.h"
#include "multiprocessing/sharing.h"
#include "tensor/factories.h"

namespace ember::multiprocessing {
namespace {

const char* StrategyOf(int64_t code) { return code == 0 ? "file_descriptor" : "file_system"; }

// PyTorch's messages per second by (strategy, bytes), from one peer run.
const std::map<std::pair<std::string, int64_t>, double>& TorchRates() {
  static const auto* rates = [] {
    auto* m = new std::map<std::pair<std::string, int64_t>, double>;
    const char* script = std::getenv("EMBER_TORCH_PEER");
    if (script == nullptr || *script == '\0') return m;
    const char* python = std::getenv("EMBER_PYTHON");
    std::string cmd = std::string(python ? python : "/usr/bin/python3") + " " + script;
    FILE* f = ::popen(cmd.c_str(), "r");
    if (f == nullptr) return m;
    char strategy[64];
    long long bytes;
    double rate;
    char line[512];
    while (std::fgets(line, sizeof(line), f) != nullptr) {
      if (std::sscanf(line, "%63s %lld %lf msgs/s", strategy, &bytes, &rate) == 3) {
        (*m)[{strategy, bytes}] = rate;
        std::fprintf(stderr, "torch peer: %s", line);
      }
    }
    ::pclose(f);
    return m;
  }();
  return *rates;
}

void BM_QueueRoundTrip(benchmark::State& state) {
  const std::string strategy = StrategyOf(state.range(0));
  const int64_t nbytes = state.range(1);
  const auto& torch = TorchRates();  // before the child exists: it runs alone
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
  for (auto _ : state) {
    if (!round_trip()) {
      state.SkipWithError("round trip failed");
      break;
    }
  }
  (void)in->Put(Value());
  (void)child->Join(absl::Seconds(60));
  state.counters["msgs_per_s"] =
      benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
  state.SetBytesProcessed(state.iterations() * nbytes);
  if (auto it = torch.find({strategy, nbytes}); it != torch.end()) {
    state.counters["torch_msgs_per_s"] = it->second;
    state.counters["x_torch"] = benchmark::Counter(
        static_cast<double>(state.iterations()) / it->second, benchmark::Counter::kIsRate);
  }
  state.SetLabel(strategy);
}

BENCHMARK(BM_QueueRoundTrip)
    ->ArgNames({"fs", "bytes"})
    ->ArgsProduct({{0, 1}, {4 << 10, 1 << 20, 64 << 20}})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace ember::multiprocessing
