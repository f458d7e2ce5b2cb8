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
//
// The parts of a 4 KiB round trip, each alone: BM_SocketPingPong (the floor:
// one small message each way on a bare socket between the same two
// processes, blocking send/recv), BM_ConnectionPingPong (the same through
// Connection: message encoding, poll wake-ups), BM_ShareFresh (a fresh
// tensor moved to shared memory: segment creation or reuse) and
// BM_EncodeImport (a shared tensor's message encoded and decoded in one
// process: the storage table, fstat/dedup or the name lookup, no mapping).
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/time/clock.h"
#include "benchmark/benchmark.h"
#include "multiprocessing/connection.h"
#include "multiprocessing/message.h"
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
  absl::StatusOr<Queue> in = Queue::create(), out = Queue::create();
  if (!in.ok() || !out.ok()) return state.SkipWithError("queue");
  absl::StatusOr<Process> child = Process::start([&]() -> absl::Status {
    while (true) {
      absl::StatusOr<Value> v = in->get();
      if (!v.ok()) return v.status();
      const Tensor* t = v->get_if<Tensor>();
      if (t == nullptr) return absl::OkStatus();  // None: stop
      absl::Status s = out->put(Value(t->numel()), absl::Seconds(60));
      if (!s.ok()) return s;
    }
  });
  if (!child.ok()) return state.SkipWithError("fork");
  auto round_trip = [&] {
    Tensor t = zeros({nbytes / 4});
    if (!in->put(Value(t), absl::Seconds(60)).ok()) return false;
    absl::StatusOr<Value> ack = out->get();
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
  (void)in->put(Value());
  (void)child->join(absl::Seconds(60));
  state.counters["msgs_per_s"] = rate;
  state.SetBytesProcessed(state.iterations() * nbytes);
  if (torch > 0) {
    state.counters["torch_msgs_per_s"] = torch;
    state.counters["x_torch"] = rate / torch;
  }
  state.SetLabel(strategy);
}

void BM_SocketPingPong(benchmark::State& state) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
    return state.SkipWithError("socketpair");
  }
  base::UniqueFd parent_end(sv[0]), child_end(sv[1]);
  char buf[64] = {};
  absl::StatusOr<Process> child = Process::start([&]() -> absl::Status {
    while (true) {
      ssize_t n = ::recv(child_end.get(), buf, sizeof(buf), 0);
      if (n <= 0 || buf[0] == 'q') return absl::OkStatus();
      if (::send(child_end.get(), buf, n, MSG_NOSIGNAL) != n) return absl::InternalError("send");
    }
  });
  if (!child.ok()) return state.SkipWithError("fork");
  for (auto _ : state) {
    if (::send(parent_end.get(), buf, 16, MSG_NOSIGNAL) != 16 ||
        ::recv(parent_end.get(), buf, sizeof(buf), 0) != 16) {
      state.SkipWithError("ping-pong failed");
      break;
    }
  }
  buf[0] = 'q';
  (void)::send(parent_end.get(), buf, 1, MSG_NOSIGNAL);
  (void)child->join(absl::Seconds(60));
  state.counters["msgs_per_s"] =
      benchmark::Counter(state.iterations(), benchmark::Counter::kIsRate);
}

void BM_ConnectionPingPong(benchmark::State& state) {
  absl::StatusOr<std::pair<Connection, Connection>> pipe = Pipe();
  if (!pipe.ok()) return state.SkipWithError("pipe");
  absl::StatusOr<Process> child = Process::start([&]() -> absl::Status {
    while (true) {
      absl::StatusOr<Value> v = pipe->second.recv();
      if (!v.ok()) return v.status();
      if (v->is_none()) return absl::OkStatus();
      absl::Status s = pipe->second.send(*v, absl::Seconds(60));
      if (!s.ok()) return s;
    }
  });
  if (!child.ok()) return state.SkipWithError("fork");
  for (auto _ : state) {
    if (!pipe->first.send(Value(1024), absl::Seconds(60)).ok() || !pipe->first.recv().ok()) {
      state.SkipWithError("ping-pong failed");
      break;
    }
  }
  (void)pipe->first.send(Value());
  (void)child->join(absl::Seconds(60));
  state.counters["msgs_per_s"] =
      benchmark::Counter(state.iterations(), benchmark::Counter::kIsRate);
}

void BM_ShareFresh(benchmark::State& state) {
  if (!set_sharing_strategy(StrategyOf(state.range(0))).ok())
    return state.SkipWithError("strategy");
  for (auto _ : state) {
    Tensor t = zeros({state.range(1) / 4});
    if (!share_memory_(t).ok()) return state.SkipWithError("share_memory_");
  }
  state.SetLabel(StrategyOf(state.range(0)));
}

void BM_EncodeImport(benchmark::State& state) {
  if (!set_sharing_strategy(StrategyOf(state.range(0))).ok())
    return state.SkipWithError("strategy");
  Tensor t = zeros({state.range(1) / 4});
  for (auto _ : state) {
    absl::StatusOr<EncodedMessage> m = EncodeMessage(Value(t));
    if (!m.ok()) return state.SkipWithError("encode");
    std::vector<base::UniqueFd> fds;
    for (int fd : m->fds) fds.emplace_back(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
    absl::StatusOr<Value> v = DecodeMessage(m->bytes, std::move(fds));
    if (!v.ok()) return state.SkipWithError("decode");
  }
  state.SetLabel(StrategyOf(state.range(0)));
}

// Fixed message counts (5x the peer's), so that each repetition runs the
// case once, right after its peer measurement.
void Cases(benchmark::internal::Benchmark* b) {
  b->ArgNames({"fs", "bytes"})->UseRealTime()->Unit(benchmark::kMicrosecond);
}
BENCHMARK(BM_SocketPingPong)->UseRealTime()->Unit(benchmark::kMicrosecond)->Iterations(10000);
BENCHMARK(BM_ConnectionPingPong)->UseRealTime()->Unit(benchmark::kMicrosecond)->Iterations(10000);
BENCHMARK(BM_ShareFresh)->Apply(Cases)->Args({0, 4 << 10})->Args({1, 4 << 10});
BENCHMARK(BM_EncodeImport)->Apply(Cases)->Args({0, 4 << 10})->Args({1, 4 << 10});
BENCHMARK(BM_QueueRoundTrip)->Apply(Cases)->Args({0, 4 << 10})->Iterations(10000);
BENCHMARK(BM_QueueRoundTrip)->Apply(Cases)->Args({1, 4 << 10})->Iterations(10000);
BENCHMARK(BM_QueueRoundTrip)->Apply(Cases)->Args({0, 1 << 20})->Iterations(2500);
BENCHMARK(BM_QueueRoundTrip)->Apply(Cases)->Args({1, 1 << 20})->Iterations(2500);
BENCHMARK(BM_QueueRoundTrip)->Apply(Cases)->Args({0, 64 << 20})->Iterations(150);
BENCHMARK(BM_QueueRoundTrip)->Apply(Cases)->Args({1, 64 << 20})->Iterations(150);

}  // namespace
}  // namespace ember::multiprocessing
