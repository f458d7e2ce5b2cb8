// What the flight recorder (Note [Flight recorder]) costs:
// - BM_RecordOp: one op's life in the recorder alone (Record, Started,
//   Finished), against BM_RecordOpOff, the same calls on a recorder of
//   capacity 0;
// - BM_WorkLife/record:{0,1}: the path every op takes through Work (create,
//   attach the entry, mark started, finish), with and without an entry;
// - BM_TcpAllReduce4KiB/recorder:{0,1}: a 4 KiB float32 all_reduce between
//   two ranks (threads of this process over the tcp backend) whose groups
//   were created with TORCH_FR_BUFFER_SIZE=0 / the default;
// - BM_TcpAllReduce4KiBCpu/recorder:{0,1}: the same, timed by the whole
//   process's CPU time per all_reduce;
// - BM_AllReduce4KiB/gloo:{0,1}/check:{0,1}: the same all_reduce over tcp
//   (gloo:0) or gloo (gloo:1), with the call check (Note [Call checks] in
//   debug.cc) off (EMBER_CHECK_COLLECTIVES=0) or on (the default); the
//   recorder is on.
//
//   bazel run -c opt //distributed:flight_recorder_benchmark --
//       --benchmark_repetitions=5 --benchmark_enable_random_interleaving=true
//   (one command line)
#include <atomic>
#include <cstdlib>
#include <memory>
#include <thread>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "benchmark/benchmark.h"
#include "distributed/backend_registry.h"
#include "distributed/flight_recorder.h"
#include "distributed/hash_store.h"
#include "distributed/process_group.h"
#include "tensor/factories.h"

namespace ember::distributed {
namespace {

FlightOp AllReduceOp() {
  FlightOp op;
  op.op = "all_reduce";
  op.dtype = "float32";
  op.in_numel = op.out_numel = 1024;
  op.nbytes = 4096;
  op.timeout_ms = 30000;
  return op;
}

void RecordOp(benchmark::State& state, int capacity) {
  setenv("EMBER_FR_SIGNALS", "0", 1);
  FlightRecorder recorder("bench", "tcp", 0, 2, capacity);
  const FlightOp op = AllReduceOp();
  const absl::Status ok;
  for (auto _ : state) {
    const int64_t id = recorder.Record(op, absl::GetCurrentTimeNanos());
    recorder.Started(id, absl::GetCurrentTimeNanos());
    recorder.Finished(id, ok, absl::GetCurrentTimeNanos());
  }
}
void BM_RecordOp(benchmark::State& state) { RecordOp(state, FlightRecorder::kDefaultCapacity); }
void BM_RecordOpOff(benchmark::State& state) { RecordOp(state, 0); }
BENCHMARK(BM_RecordOp);
BENCHMARK(BM_RecordOpOff);

void BM_WorkLife(benchmark::State& state) {
  setenv("EMBER_FR_SIGNALS", "0", 1);
  auto recorder = std::make_shared<FlightRecorder>("bench", "tcp", 0, 2,
                                                   FlightRecorder::kDefaultCapacity);
  const bool record = state.range(0) != 0;
  const FlightOp op = AllReduceOp();
  for (auto _ : state) {
    auto work = std::make_shared<Work>(OpType::kAllReduce, absl::InfiniteFuture());
    if (record) work->AttachRecord(recorder, recorder->Record(op, absl::GetCurrentTimeNanos()));
    work->MarkStarted();
    work->Finish(absl::OkStatus());
    benchmark::DoNotOptimize(work.get());
  }
}
BENCHMARK(BM_WorkLife)->ArgName("record")->Arg(0)->Arg(1);

// Two ranks of a tcp group; rank 1 runs on a thread of its own and joins
// every all_reduce until rank 0's input says stop (element 0 >= kStop).
constexpr float kStop = 1e6f;
struct Pair {
  std::shared_ptr<ProcessGroup> rank0;
  std::shared_ptr<ProcessGroup> rank1;
  std::thread follower;
};

std::shared_ptr<ProcessGroup> Create(const std::shared_ptr<Store>& store, int rank,
                                     const char* name = "tcp") {
  auto backend = find_backend(name);
  if (!backend.ok()) std::abort();
  auto pg = (*backend)->create(
      {.store = store, .store_prefix = "bench/", .rank = rank, .size = 2,
       .timeout = absl::Seconds(60)});
  if (!pg.ok()) {
    fprintf(stderr, "flight_recorder_benchmark: %s\n", pg.status().ToString().c_str());
    std::abort();
  }
  return *pg;
}

Pair MakePair(bool recorder, const char* backend = "tcp") {
  setenv("EMBER_FR_SIGNALS", "0", 1);
  setenv("TORCH_FR_BUFFER_SIZE", recorder ? "2000" : "0", 1);
  auto store = std::make_shared<HashStore>();
  Pair pair;
  std::thread other([&] { pair.rank1 = Create(store, 1, backend); });
  pair.rank0 = Create(store, 0, backend);
  other.join();
  unsetenv("TORCH_FR_BUFFER_SIZE");
  pair.follower = std::thread([pg = pair.rank1] {
    Tensor t = ones({1024}, kFloat32);
    while (true) {
      t.data_ptr<float>()[0] = 0;
      auto work = pg->allreduce(t);
      if (!work.ok() || !(*work)->wait().ok()) std::abort();
      if (t.data_ptr<float>()[0] >= kStop) return;
    }
  });
  return pair;
}

void RunAllReduce4KiB(benchmark::State& state, Pair pair) {
  Tensor t = ones({1024}, kFloat32);
  for (auto _ : state) {
    t.data_ptr<float>()[0] = 0;
    auto work = pair.rank0->allreduce(t);
    if (!work.ok() || !(*work)->wait().ok()) std::abort();
  }
  t.data_ptr<float>()[0] = kStop;
  auto work = pair.rank0->allreduce(t);
  if (!work.ok() || !(*work)->wait().ok()) std::abort();
  pair.follower.join();
  state.SetBytesProcessed(state.iterations() * 4096);
}

void BM_TcpAllReduce4KiB(benchmark::State& state) {
  RunAllReduce4KiB(state, MakePair(state.range(0) != 0));
}
BENCHMARK(BM_TcpAllReduce4KiB)->ArgName("recorder")->Arg(0)->Arg(1)->UseRealTime();

// The same, timed by the CPU time of the whole process (both ranks and all
// their threads: workers, readers, the progress publisher): on a shared,
// loaded machine the wall time of a 4 KiB all_reduce varies by tens of
// percent between runs, while the CPU it takes is what the recorder adds to.
void BM_TcpAllReduce4KiBCpu(benchmark::State& state) {
  RunAllReduce4KiB(state, MakePair(state.range(0) != 0));
}
BENCHMARK(BM_TcpAllReduce4KiBCpu)->ArgName("recorder")->Arg(0)->Arg(1)->MeasureProcessCPUTime();

void BM_AllReduce4KiB(benchmark::State& state) {
  // Both names: EMBER_GLOO_CHECK_COLLECTIVES is the older, gloo-only one.
  const char* check = state.range(1) != 0 ? "1" : "0";
  setenv("EMBER_CHECK_COLLECTIVES", check, 1);
  setenv("EMBER_GLOO_CHECK_COLLECTIVES", check, 1);
  Pair pair = MakePair(true, state.range(0) != 0 ? "gloo" : "tcp");
  unsetenv("EMBER_CHECK_COLLECTIVES");
  unsetenv("EMBER_GLOO_CHECK_COLLECTIVES");
  RunAllReduce4KiB(state, std::move(pair));
}
BENCHMARK(BM_AllReduce4KiB)
    ->ArgNames({"gloo", "check"})
    ->ArgsProduct({{0, 1}, {0, 1}})
    ->UseRealTime();

}  // namespace
}  // namespace ember::distributed
