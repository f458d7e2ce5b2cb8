// Checkpoint read/write throughput against copying the same bytes into fresh
// tensors (BM_MemcpyBaseline: the floor for any reader that produces tensors
// it owns), so the figures are ratios. A 64 MiB float32 state dict of 16
// tensors (hub/sha256_benchmark.cc times hashing the same bytes).
//
//   bazel run //serialization:serialization_benchmark
#include <cstring>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "serialization/safetensors.h"
#include "serialization/torch_format.h"
#include "tensor/factories.h"

namespace ember::serialization {
namespace {

constexpr int64_t kTensors = 16;
constexpr int64_t kElements = (64 << 20) / 4 / kTensors;

const StateDict& Fixture() {
  static const StateDict* sd = [] {
    auto* s = new StateDict;
    for (int64_t i = 0; i < kTensors; ++i)
      s->emplace_back("layer" + std::to_string(i), rand({kElements}));
    return s;
  }();
  return *sd;
}

void SetBytes(benchmark::State& state) {
  state.SetBytesProcessed(state.iterations() * kTensors * kElements * 4);
}

void BM_MemcpyBaseline(benchmark::State& state) {
  // What any reader of these bytes must do: take the file's bytes (a copy, as
  // read_torch_checkpoint takes its argument) and copy them into fresh tensors
  // that are all alive at the end.
  std::string src = *write_torch_checkpoint(Fixture());
  for (auto _ : state) {
    std::string file = src;
    std::vector<Tensor> out;
    size_t at = 0;
    for (const auto& [name, t] : Fixture()) {
      out.push_back(empty({kElements}));
      std::memcpy(out.back().raw_data(), file.data() + at, t.nbytes());
      at += t.nbytes();
    }
    benchmark::DoNotOptimize(out.data());
  }
  SetBytes(state);
}
BENCHMARK(BM_MemcpyBaseline)->Unit(benchmark::kMillisecond);

void BM_ReadTorchCheckpoint(benchmark::State& state) {
  std::string bytes = *write_torch_checkpoint(Fixture());
  for (auto _ : state) {
    absl::StatusOr<StateDict> sd = read_torch_checkpoint(bytes, "bench.pt");  // copies `bytes` in
    benchmark::DoNotOptimize(sd->data());
  }
  SetBytes(state);
}
BENCHMARK(BM_ReadTorchCheckpoint)->Unit(benchmark::kMillisecond);

void BM_WriteTorchCheckpoint(benchmark::State& state) {
  for (auto _ : state) {
    absl::StatusOr<std::string> bytes = write_torch_checkpoint(Fixture());
    benchmark::DoNotOptimize(bytes->data());
  }
  SetBytes(state);
}
BENCHMARK(BM_WriteTorchCheckpoint)->Unit(benchmark::kMillisecond);

void BM_ReadSafetensors(benchmark::State& state) {
  std::string bytes = *write_safetensors(Fixture());
  for (auto _ : state) {
    absl::StatusOr<StateDict> sd = read_safetensors(bytes, "bench.safetensors");
    benchmark::DoNotOptimize(sd->data());
  }
  SetBytes(state);
}
BENCHMARK(BM_ReadSafetensors)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace ember::serialization
