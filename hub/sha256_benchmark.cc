// SHA-256 throughput (what load_state_dict_from_url's check_hash costs per
// byte of a downloaded checkpoint) against copying the same bytes, so the
// figure is a ratio: 64 MiB, the size serialization_benchmark reads.
//
//   bazel run //hub:sha256_benchmark
#include <string>

#include "benchmark/benchmark.h"
#include "hub/sha256.h"

namespace ember::hub {
namespace {

constexpr size_t kBytes = size_t{64} << 20;

const std::string& Bytes() {
  static const std::string* bytes = [] {
    auto* s = new std::string(kBytes, '\0');
    for (size_t i = 0; i < kBytes; ++i) (*s)[i] = static_cast<char>(i * 2654435761u >> 24);
    return s;
  }();
  return *bytes;
}

void BM_CopyBaseline(benchmark::State& state) {
  for (auto _ : state) {
    std::string copy = Bytes();
    benchmark::DoNotOptimize(copy.data());
  }
  state.SetBytesProcessed(state.iterations() * kBytes);
}
BENCHMARK(BM_CopyBaseline)->Unit(benchmark::kMillisecond);

void BM_Sha256(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(sha256_hex(Bytes()));
  state.SetBytesProcessed(state.iterations() * kBytes);
}
BENCHMARK(BM_Sha256)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace ember::hub
