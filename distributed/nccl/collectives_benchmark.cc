// The nccl backend's all_reduce at world size 1 against a raw ncclAllReduce
// on a one-rank communicator of its own, the same sizes in the same binary
// (4 KiB and 256 MiB): the ratio is what the backend adds (stream sync,
// events, allocator records, the watchdog's bookkeeping). Each iteration
// ends with the stream synchronised, for both. Without a GPU every case
// reports itself skipped, saying why.
//
//   bazel run -c opt //distributed/nccl:collectives_benchmark
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <memory>

#include "benchmark/benchmark.h"
#include "cuda/device.h"
#include "cuda/stream.h"
#include "distributed/hash_store.h"
#include "distributed/nccl/process_group_nccl.h"
#include "tensor/factories.h"

namespace ember::distributed::nccl {
namespace {

bool SkipWithoutGpu(benchmark::State& state) {
  if (cuda::is_available()) return false;
  state.SkipWithError(("needs a GPU: " + cuda::unavailable_reason()).c_str());
  return true;
}

void BM_RawNcclAllReduce(benchmark::State& state) {
  if (SkipWithoutGpu(state)) return;
  const int64_t bytes = state.range(0);
  Tensor x = ones({bytes / 4}, TensorOptions(kFloat32).device(Device(DeviceType::kCUDA, 0)));
  ncclUniqueId id;
  ncclGetUniqueId(&id);
  ncclComm_t comm;
  cudaSetDevice(0);
  if (ncclCommInitRank(&comm, 1, id, 0) != ncclSuccess) {
    state.SkipWithError("ncclCommInitRank failed");
    return;
  }
  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  for (auto _ : state) {
    ncclAllReduce(x.raw_data(), x.raw_data(), bytes / 4, ncclFloat32, ncclSum, comm, stream);
    cudaStreamSynchronize(stream);
  }
  state.SetBytesProcessed(state.iterations() * bytes);
  cudaStreamDestroy(stream);
  ncclCommDestroy(comm);
}

void BM_EmberNcclAllReduce(benchmark::State& state) {
  if (SkipWithoutGpu(state)) return;
  const int64_t bytes = state.range(0);
  Tensor x = ones({bytes / 4}, TensorOptions(kFloat32).device(Device(DeviceType::kCUDA, 0)));
  auto pg = NcclProcessGroup::create({.store = std::make_shared<HashStore>()});
  if (!pg.ok()) {
    state.SkipWithError(std::string(pg.status().message()).c_str());
    return;
  }
  auto current = cuda::current_stream(0);
  for (auto _ : state) {
    auto work = (*pg)->allreduce(x);
    if (!work.ok() || !(*work)->synchronize().ok()) {
      state.SkipWithError("all_reduce failed");
      break;
    }
    cudaStreamSynchronize(current->stream());
  }
  state.SetBytesProcessed(state.iterations() * bytes);
}

BENCHMARK(BM_RawNcclAllReduce)->Arg(4 << 10)->Arg(256 << 20)->UseRealTime();
BENCHMARK(BM_EmberNcclAllReduce)->Arg(4 << 10)->Arg(256 << 20)->UseRealTime();

}  // namespace
}  // namespace ember::distributed::nccl

BENCHMARK_MAIN();
