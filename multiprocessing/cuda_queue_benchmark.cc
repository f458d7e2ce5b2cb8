// Round trips of a float32 CUDA tensor between two processes through a Queue
// (CUDA IPC, multiprocessing/cuda_sharing.h), against torch.multiprocessing
// doing the same: queue_benchmark's protocol with the tensor on cuda:0.
//
//   bazel run //multiprocessing:cuda_queue_benchmark
//   # beside PyTorch (2.x with CUDA), each case paired with the peer's run:
//   export EMBER_TORCH_PEER=$PWD/multiprocessing/torch_cuda_queue.py
//   bazel run //multiprocessing:cuda_queue_benchmark
//
// The protocol (torch_cuda_queue.py runs the same): a child started with the
// spawn method (a forked child cannot use CUDA once its parent has) takes
// tensors from one Queue and answers on another. Each round trip the parent
// makes a fresh tensor on cuda:0 (zeros) and puts it; the child gets it, over
// the parent's memory, and then
//   ack  (BM_CudaQueueRoundTrip/mode:0): adds 1 in place, synchronises the
//        device, drops the tensor and puts an ack (its element count);
//   echo (mode:1): puts back a CUDA tensor of its own, t + 1 (a received CUDA
//        tensor cannot be sent on), which the parent gets and drops.
// Five checked round trips come first (the other process's writes must
// arrive), then the timed ones, a fixed count per size: 10,000 for 4 KiB,
// 2,500 for 1 MiB, 2,000 for 64 MiB.
//
// Counters: rt_per_s (round trips per second); around the timed round trips,
// once both processes collected the blocks no consumer holds
// (cuda_ipc_collect), what could leak, as differences after - before:
// d_blocks_held (sent storages still kept for a consumer), d_allocated
// (cuda::memory_allocated, bytes), d_segments (the caching allocator's
// segments), d_fds (open descriptors), d_maps (lines of /proc/self/maps),
// d_shm (this process's CUDA IPC counter files in /dev/shm), and the child's
// child_d_fds, child_d_maps, child_d_allocated and child_blocks_held. All
// are 0 when nothing leaks.
//
// With EMBER_TORCH_PEER naming torch_cuda_queue.py, each case first runs the
// peer for the same mode, size and count (`env -u LD_LIBRARY_PATH python3
// PEER --mode M --bytes B --iters N`; $EMBER_PYTHON replaces python3:
// PyTorch loads its own CUDA libraries), then itself, and adds torch_rt_per_s
// and x_torch (Ember's rate over PyTorch's; the issue asks >= 2 at 64 MiB).
// After the run, every figure is printed again as `figure <name> <value>
// <unit>` lines (the peer's own lines among them, and its SKIP line, or a
// `FAIL torch peer failed ...` line when it exited with an error), for
// scripts.
//
// BM_CudaIpcFloor: the CUDA runtime's own IPC calls of one message, the
// floor under both frameworks' rates (see there).
//
// Without a usable GPU every case reports an error naming the reason.
// EMBER_QUEUE_DEVICE=cpu runs the same protocol, peer included (--device
// cpu), over CPU tensors in shared memory, to check the harness where no GPU
// is; its figures are named *_cpu_queue_*.
#include <cuda_runtime_api.h>
#include <dirent.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "benchmark/benchmark.h"
#include "cuda/caching_allocator.h"
#include "cuda/device.h"
#include "cuda/status.h"
#include "multiprocessing/cuda_sharing.h"
#include "multiprocessing/process.h"
#include "multiprocessing/queue.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"

namespace ember::multiprocessing {
namespace {

constexpr absl::Duration kTimeout = absl::Seconds(60);
constexpr int kWarmup = 5;
constexpr int64_t kAck = 0;
constexpr int64_t kReport = -1;  // parent -> child: send your counts

const char* ModeName(int64_t mode) { return mode == kAck ? "ack" : "echo"; }

// kCUDA, or kCPU under EMBER_QUEUE_DEVICE=cpu (the harness check).
DeviceType TheDeviceType() {
  const char* d = std::getenv("EMBER_QUEUE_DEVICE");
  return d != nullptr && std::string(d) == "cpu" ? DeviceType::kCPU : DeviceType::kCUDA;
}
const char* DeviceName() { return TheDeviceType() == DeviceType::kCUDA ? "cuda" : "cpu"; }

std::string SizeName(int64_t nbytes) {
  if (nbytes % (1 << 20) == 0) return absl::StrCat(nbytes >> 20, "MiB");
  if (nbytes % (1 << 10) == 0) return absl::StrCat(nbytes >> 10, "KiB");
  return absl::StrCat(nbytes, "B");
}

// Every `figure` line of the run, printed after it.
std::vector<std::string>& Figures() {
  static auto* figures = new std::vector<std::string>();
  return *figures;
}

// --- What could leak ------------------------------------------------------------

int64_t CountEntries(const char* dir, const std::string& prefix) {
  DIR* d = ::opendir(dir);
  if (d == nullptr) return -1;
  int64_t n = 0;
  while (const dirent* e = ::readdir(d)) {
    if (e->d_name[0] != '.' && absl::StartsWith(e->d_name, prefix)) ++n;
  }
  ::closedir(d);
  return n;
}

int64_t CountLines(const char* path) {
  std::ifstream in(path);
  int64_t n = 0;
  for (std::string line; std::getline(in, line);) ++n;
  return n;
}

struct Counts {
  int64_t fds = 0;
  int64_t maps = 0;
  int64_t shm = 0;  // this process's CUDA IPC counter files (cuda_sharing.cc's names)
  int64_t allocated = 0;
  int64_t segments = 0;
  int64_t blocks_held = 0;
};

// After freeing what no consumer holds any more, as torch.cuda.ipc_collect.
Counts CollectAndCount() {
  cuda_ipc_collect();
  Counts c;
  c.fds = CountEntries("/proc/self/fd", "");
  c.maps = CountLines("/proc/self/maps");
  c.shm = CountEntries("/dev/shm", absl::StrCat("ember_cuda_ipc_", ::getpid(), "_"));
  c.allocated = cuda::memory_allocated(0);
  c.segments = static_cast<int64_t>(cuda::memory_snapshot().size());
  c.blocks_held = cuda_ipc_blocks_held();
  return c;
}

// --- The child ---------------------------------------------------------------------

// args: the Queue it gets from, the Queue it answers on, the mode.
absl::Status RoundTripChild(int, absl::Span<const Value> args) {
  EMBER_ASSIGN_OR_RETURN(Queue in, args[0].as<Queue>());
  EMBER_ASSIGN_OR_RETURN(Queue out, args[1].as<Queue>());
  EMBER_ASSIGN_OR_RETURN(int64_t mode, args[2].as<int64_t>());
  while (true) {
    EMBER_ASSIGN_OR_RETURN(Value v, in.get(kTimeout));
    if (v.is_none()) return absl::OkStatus();
    if (v.is<int64_t>()) {  // kReport
      const Counts c = CollectAndCount();
      EMBER_RETURN_IF_ERROR(
          out.put(Value(Value::List{c.fds, c.maps, c.allocated, c.blocks_held}), kTimeout));
      continue;
    }
    EMBER_ASSIGN_OR_RETURN(Tensor t, v.as<Tensor>());
    v = Value();
    if (t.device().type() != TheDeviceType()) {
      return absl::InternalError(absl::StrCat("the tensor arrived on ", t.device().str()));
    }
    if (mode == kAck) {
      t.add_(1.0);
      if (t.is_cuda()) EMBER_RETURN_IF_ERROR(cuda::synchronize(t.device().index()));
      const int64_t n = t.numel();
      t = Tensor();  // the parent's block is released before the ack
      EMBER_RETURN_IF_ERROR(out.put(Value(n), kTimeout));
    } else {
      Tensor back = t + 1.0;
      t = Tensor();
      EMBER_RETURN_IF_ERROR(out.put(Value(std::move(back)), kTimeout));
    }
  }
}
EMBER_REGISTER_ENTRY_POINT("cuda_queue_round_trip", RoundTripChild);

// The child's next answer on `out`, within kTimeout; a child that exited is
// told at once (within a second), with its failure.
absl::StatusOr<Value> Answer(Queue& out, Process& child) {
  for (absl::Time deadline = absl::Now() + kTimeout;;) {
    absl::StatusOr<Value> got = out.get(absl::Seconds(1));
    if (got.ok() || got.status().code() != absl::StatusCode::kDeadlineExceeded) return got;
    if (!child.is_alive()) {
      absl::StatusOr<ExitStatus> end = child.join(absl::ZeroDuration());
      return absl::AbortedError(absl::StrCat("the child exited (",
                                             end.ok() ? end->str() : end.status().ToString(),
                                             "): ", child.error_message()));
    }
    if (absl::Now() >= deadline) return got;
  }
}

// Sends None and joins; "" when the child ended cleanly, else what happened.
std::string StopChild(Queue& in, Process& child) {
  (void)in.put(Value(), kTimeout);
  absl::StatusOr<ExitStatus> end = child.join(kTimeout);
  if (!end.ok()) {
    child.kill();
    (void)child.join(kTimeout);
    return absl::StrCat("the child did not end: ", end.status().ToString());
  }
  return end->ok() ? std::string()
                   : absl::StrCat("the child ended with ", end->str(), ": ", child.error_message());
}

// --- PyTorch's side -----------------------------------------------------------------

struct TorchResult {
  double rate = 0;   // 0: no figure (no peer, or it skipped or failed)
  std::string note;  // the peer's SKIP line or failure, for the label
};

std::string ShellQuote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

TorchResult RunTorchPeer(int64_t mode, int64_t nbytes, int64_t iters) {
  TorchResult r;
  const char* script = std::getenv("EMBER_TORCH_PEER");
  if (script == nullptr || *script == '\0') return r;
  const char* python = std::getenv("EMBER_PYTHON");
  const std::string cmd = absl::StrCat(
      "env -u LD_LIBRARY_PATH ", python != nullptr && *python != '\0' ? python : "python3", " ",
      ShellQuote(script), " --mode ", ModeName(mode), " --bytes ", nbytes, " --iters ", iters,
      " --device ", DeviceName());
  FILE* f = ::popen(cmd.c_str(), "r");
  if (f == nullptr) {
    r.note = "torch peer: popen failed";
    return r;
  }
  const std::string rate_name = absl::StrCat("figure torch_", DeviceName(), "_queue_",
                                             ModeName(mode), "_", SizeName(nbytes), " ");
  char line[512];
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    std::string s(line);
    while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
    if (absl::StartsWith(s, "figure ")) {
      Figures().push_back(s);
      if (absl::StartsWith(s, rate_name)) r.rate = std::atof(s.c_str() + rate_name.size());
    } else if (absl::StartsWith(s, "SKIP ")) {
      Figures().push_back(s);
      r.note = s;
    }
  }
  const int status = ::pclose(f);
  if (status != 0 && r.note.empty()) {
    r.note = absl::StrCat("torch peer failed (",
                          WIFEXITED(status) ? absl::StrCat("exit code ", WEXITSTATUS(status))
                                            : absl::StrCat("wait status ", status),
                          "): ", cmd);
    Figures().push_back(absl::StrCat("FAIL ", r.note));  // its traceback went to stderr
  }
  if (!r.note.empty()) r.rate = 0;
  return r;
}

// --- The benchmark -----------------------------------------------------------------------

// range(0): the mode (0 ack, 1 echo); range(1): the tensor's bytes.
void BM_CudaQueueRoundTrip(benchmark::State& state) {
  const int64_t mode = state.range(0);
  const int64_t nbytes = state.range(1);
  const int64_t numel = nbytes / 4;
  const std::string name = absl::StrCat(ModeName(mode), "_", SizeName(nbytes));
  const bool cuda = TheDeviceType() == DeviceType::kCUDA;
  if (cuda && !cuda::is_available()) {
    return state.SkipWithError(absl::StrCat("needs a GPU: ", cuda::unavailable_reason()).c_str());
  }
  // The peer runs first, alone, under the same conditions as what follows.
  const TorchResult torch = RunTorchPeer(mode, nbytes, state.max_iterations);

  absl::StatusOr<Queue> in = Queue::create(), out = Queue::create();
  if (!in.ok() || !out.ok()) {
    return state.SkipWithError(
        absl::StrCat("Queue::create: ", in.ok() ? out.status().ToString() : in.status().ToString())
            .c_str());
  }
  absl::StatusOr<Process> child =
      Process::start_spawn("cuda_queue_round_trip", 0, {Value(*in), Value(*out), Value(mode)});
  if (!child.ok()) {
    return state.SkipWithError(absl::StrCat("start_spawn: ", child.status().ToString()).c_str());
  }
  const TensorOptions on_device = TensorOptions(kFloat32).device(cuda ? Device(DeviceType::kCUDA, 0)
                                                                      : Device(DeviceType::kCPU));
  std::string error;
  // One round trip of `t`; `back` gets what came back (the ack or the echo).
  auto round_trip = [&](const Tensor& t, Value& back) {
    absl::Status put = in->put(Value(t), kTimeout);
    if (!put.ok()) {
      error = absl::StrCat("put: ", put.ToString());
      return false;
    }
    absl::StatusOr<Value> got = Answer(*out, *child);
    if (!got.ok()) {
      error = absl::StrCat("get: ", got.status().ToString());
      return false;
    }
    back = *std::move(got);
    return true;
  };
  // Asks the child for its counts (after it collected).
  auto child_counts = [&](Counts& c) {
    absl::Status put = in->put(Value(kReport), kTimeout);
    absl::StatusOr<Value> got = put.ok() ? Answer(*out, *child) : put;
    bool ok = got.ok() && got->list().size() == 4;
    if (ok) {
      for (const Value& v : got->list()) ok = ok && v.is<int64_t>();
    }
    if (!ok) {
      error = absl::StrCat("the child's counts did not arrive: ",
                           got.ok() ? "a malformed report" : got.status().ToString());
      return false;
    }
    c.fds = *got->list()[0].get_if<int64_t>();
    c.maps = *got->list()[1].get_if<int64_t>();
    c.allocated = *got->list()[2].get_if<int64_t>();
    c.blocks_held = *got->list()[3].get_if<int64_t>();
    return true;
  };
  for (int i = 0; i < kWarmup && error.empty(); ++i) {
    Tensor t = full({numel}, 7.0, on_device);
    Value back;
    if (!round_trip(t, back)) break;
    const Tensor* got = &t;
    if (mode == kAck) {
      const int64_t* ack = back.get_if<int64_t>();
      if (ack == nullptr || *ack != numel) error = "the child's ack is not the element count";
    } else {
      got = back.get_if<Tensor>();
      if (got == nullptr || got->device().type() != TheDeviceType()) {
        error = "the child did not send a tensor on the device back";
      }
    }
    if (error.empty() && !got->to(Device(DeviceType::kCPU)).equal(full({numel}, 8.0, kFloat32))) {
      error = "the child's write did not arrive";
    }
  }
  Counts before, after, child_before, child_after;
  if (error.empty()) child_counts(child_before);
  before = CollectAndCount();

  const absl::Time start = absl::Now();
  for (auto _ : state) {
    if (!error.empty()) break;
    Tensor t = zeros({numel}, on_device);
    Value back;
    if (!round_trip(t, back)) break;
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);

  if (error.empty()) child_counts(child_after);
  after = CollectAndCount();
  const std::string end = StopChild(*in, *child);
  if (error.empty()) error = end;
  if (!error.empty()) return state.SkipWithError(error.c_str());

  const double rate = static_cast<double>(state.iterations()) / seconds;
  state.counters["rt_per_s"] = rate;
  state.SetBytesProcessed(state.iterations() * nbytes);
  struct Leak {
    const char* key;
    int64_t value;
    const char* unit;
  };
  const Leak leaks[] = {
      {"d_blocks_held", after.blocks_held - before.blocks_held, "blocks"},
      {"d_allocated", after.allocated - before.allocated, "bytes"},
      {"d_segments", after.segments - before.segments, "segments"},
      {"d_fds", after.fds - before.fds, "fds"},
      {"d_maps", after.maps - before.maps, "maps"},
      {"d_shm", after.shm - before.shm, "files"},
      {"child_d_fds", child_after.fds - child_before.fds, "fds"},
      {"child_d_maps", child_after.maps - child_before.maps, "maps"},
      {"child_d_allocated", child_after.allocated - child_before.allocated, "bytes"},
      {"child_blocks_held", child_after.blocks_held, "blocks"},
  };
  const std::string figure = absl::StrCat("ember_", DeviceName(), "_queue_", name);
  Figures().push_back(absl::StrFormat("figure %s %.1f round_trips/s", figure, rate));
  for (const Leak& leak : leaks) {
    state.counters[leak.key] = static_cast<double>(leak.value);
    Figures().push_back(
        absl::StrCat("figure ", figure, "_", leak.key, " ", leak.value, " ", leak.unit));
  }
  std::string label = ModeName(mode);
  if (torch.rate > 0) {
    state.counters["torch_rt_per_s"] = torch.rate;
    state.counters["x_torch"] = rate / torch.rate;
    Figures().push_back(absl::StrFormat("figure x_torch_%s_queue_%s %.2f x", DeviceName(), name,
                                        rate / torch.rate));
  } else if (!torch.note.empty()) {
    absl::StrAppend(&label, " (", torch.note, ")");
  }
  state.SetLabel(label);
}

// --- The floor: CUDA IPC's own calls --------------------------------------------------

// What one message of the round trip costs in the CUDA runtime alone: no
// tensor, allocator, counter file or kernel. The parent takes the IPC handle
// of one cudaMalloc'd buffer and of an interprocess event recorded on the
// default stream and puts their bytes on a Queue; the child opens both, makes
// its default stream wait for the event, closes both and acks. Ember and
// torch.multiprocessing make these calls for every message (the child opens
// the segment anew each time: nothing else of it is held between messages),
// so this rate bounds both, and torch's rate / this one bounds the ratio
// x_torch can reach.
struct FloorWire {
  cudaIpcMemHandle_t memory;
  cudaIpcEventHandle_t event;
};

absl::Status FloorChild(int, absl::Span<const Value> args) {
  EMBER_ASSIGN_OR_RETURN(Queue in, args[0].as<Queue>());
  EMBER_ASSIGN_OR_RETURN(Queue out, args[1].as<Queue>());
  while (true) {
    EMBER_ASSIGN_OR_RETURN(Value v, in.get(kTimeout));
    if (v.is_none()) return absl::OkStatus();
    EMBER_ASSIGN_OR_RETURN(std::string bytes, v.as<std::string>());
    FloorWire w;
    if (bytes.size() != sizeof(w)) {
      return absl::InvalidArgumentError(
          absl::StrCat("a floor message of ", bytes.size(), " bytes, expected ", sizeof(w)));
    }
    std::memcpy(&w, bytes.data(), sizeof(w));
    void* p = nullptr;
    EMBER_RETURN_IF_ERROR(
        cuda::runtime_status(cudaIpcOpenMemHandle(&p, w.memory, cudaIpcMemLazyEnablePeerAccess),
                             "cudaIpcOpenMemHandle"));
    cudaEvent_t event = nullptr;
    EMBER_RETURN_IF_ERROR(
        cuda::runtime_status(cudaIpcOpenEventHandle(&event, w.event), "cudaIpcOpenEventHandle"));
    absl::Status waited =
        cuda::runtime_status(cudaStreamWaitEvent(nullptr, event, 0), "cudaStreamWaitEvent");
    cudaEventDestroy(event);
    EMBER_RETURN_IF_ERROR(waited);
    EMBER_RETURN_IF_ERROR(cuda::runtime_status(cudaIpcCloseMemHandle(p), "cudaIpcCloseMemHandle"));
    EMBER_RETURN_IF_ERROR(out.put(Value(int64_t{1}), kTimeout));
  }
}
EMBER_REGISTER_ENTRY_POINT("cuda_ipc_floor", FloorChild);

// range(0): the buffer's bytes.
void BM_CudaIpcFloor(benchmark::State& state) {
  const int64_t nbytes = state.range(0);
  if (TheDeviceType() != DeviceType::kCUDA)
    return state.SkipWithError(
        "CUDA only: the CUDA runtime's IPC calls (not under EMBER_QUEUE_DEVICE=cpu)");
  if (!cuda::is_available()) {
    return state.SkipWithError(absl::StrCat("needs a GPU: ", cuda::unavailable_reason()).c_str());
  }
  absl::StatusOr<Queue> in = Queue::create(), out = Queue::create();
  if (!in.ok() || !out.ok()) return state.SkipWithError("Queue::create failed");
  absl::StatusOr<Process> child =
      Process::start_spawn("cuda_ipc_floor", 0, {Value(*in), Value(*out)});
  if (!child.ok()) {
    return state.SkipWithError(absl::StrCat("start_spawn: ", child.status().ToString()).c_str());
  }
  void* buffer = nullptr;
  absl::Status status = cuda::runtime_status(cudaMalloc(&buffer, nbytes), "cudaMalloc");
  auto message = [&]() -> absl::Status {
    FloorWire w;
    EMBER_RETURN_IF_ERROR(
        cuda::runtime_status(cudaIpcGetMemHandle(&w.memory, buffer), "cudaIpcGetMemHandle"));
    cudaEvent_t event = nullptr;
    EMBER_RETURN_IF_ERROR(cuda::runtime_status(
        cudaEventCreateWithFlags(&event, cudaEventDisableTiming | cudaEventInterprocess),
        "cudaEventCreateWithFlags"));
    absl::Status s = cuda::runtime_status(cudaEventRecord(event, nullptr), "cudaEventRecord");
    if (s.ok())
      s = cuda::runtime_status(cudaIpcGetEventHandle(&w.event, event), "cudaIpcGetEventHandle");
    if (s.ok()) {
      s = in->put(Value(std::string(reinterpret_cast<const char*>(&w), sizeof(w))), kTimeout);
    }
    if (s.ok()) s = Answer(*out, *child).status();
    cudaEventDestroy(event);
    return s;
  };
  for (int i = 0; i < kWarmup && status.ok(); ++i) status = message();
  const absl::Time start = absl::Now();
  for (auto _ : state) {
    if (!status.ok()) break;
    status = message();
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  const std::string end = StopChild(*in, *child);
  if (buffer != nullptr) cudaFree(buffer);
  if (!status.ok()) return state.SkipWithError(status.ToString().c_str());
  if (!end.empty()) return state.SkipWithError(end.c_str());
  const double rate = static_cast<double>(state.iterations()) / seconds;
  state.counters["rt_per_s"] = rate;
  Figures().push_back(
      absl::StrFormat("figure ember_cuda_ipc_floor_%s %.1f round_trips/s", SizeName(nbytes), rate));
}

void Cases(benchmark::internal::Benchmark* b) {
  b->ArgNames({"mode", "bytes"})->UseRealTime()->Unit(benchmark::kMicrosecond);
}
BENCHMARK(BM_CudaQueueRoundTrip)->Apply(Cases)->Args({0, 4 << 10})->Iterations(10000);
BENCHMARK(BM_CudaQueueRoundTrip)->Apply(Cases)->Args({0, 1 << 20})->Iterations(2500);
BENCHMARK(BM_CudaQueueRoundTrip)->Apply(Cases)->Args({0, 64 << 20})->Iterations(2000);
BENCHMARK(BM_CudaQueueRoundTrip)->Apply(Cases)->Args({1, 4 << 10})->Iterations(10000);
BENCHMARK(BM_CudaQueueRoundTrip)->Apply(Cases)->Args({1, 1 << 20})->Iterations(2500);
BENCHMARK(BM_CudaQueueRoundTrip)->Apply(Cases)->Args({1, 64 << 20})->Iterations(2000);
BENCHMARK(BM_CudaIpcFloor)
    ->ArgName("bytes")
    ->Arg(4 << 10)
    ->Arg(64 << 20)
    ->Iterations(2000)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace ember::multiprocessing

int main(int argc, char** argv) {
  // The spawned child is this binary again.
  ember::multiprocessing::maybe_run_spawned_child();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  for (const std::string& line : ember::multiprocessing::Figures())
    std::printf("%s\n", line.c_str());
  return 0;
}
