// all_reduce (SUM, float32) and broadcast on the mpi backend against the
// same MPI call made directly (MPI_Allreduce / MPI_Bcast on the group's
// communicator, holding the MPI lock as the backend does), 4 KiB to 64 MiB.
// The raw call is the in-binary baseline: the ratio raw time / Ember time is
// what the backend's worker thread and Work cost (1.0 = free).
//
//   bazel build //distributed/mpi:collectives_benchmark
//   export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
//   mpirun --oversubscribe -np 2 --mca btl self,vader,tcp --mca btl_tcp_if_include lo
//       bazel-bin/distributed/mpi/collectives_benchmark --benchmark_min_time=0.2
//   (one command line: mpirun ... collectives_benchmark ...)
//
// Rank 0 runs the benchmarks; the other ranks follow: before every timed op
// rank 0 broadcasts the op and size (untimed), all ranks pass a barrier, and
// rank 0 times the op alone (manual time), as the tcp benchmark and
// ../shared/peers/torch_allreduce.py do. Counters: algbw = bytes / time,
// busbw = algbw x 2(N-1)/N for all_reduce, x 1 for broadcast; p50_us is the
// median.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "absl/time/clock.h"
#include "benchmark/benchmark.h"
#include "distributed/backend_registry.h"
#include "distributed/mpi/process_group_mpi.h"
#include "distributed/mpi/runtime.h"
#include "tensor/factories.h"

namespace ember::distributed::mpi {
namespace {

enum Command : int64_t {
  kStop = 0,
  kAllReduce = 1,
  kRawAllReduce = 2,
  kBroadcast = 3,
  kRawBroadcast = 4,
};

std::shared_ptr<MpiProcessGroup>& Group() {
  static auto* group = new std::shared_ptr<MpiProcessGroup>;
  return *group;
}

void Check(const absl::Status& s, const char* what) {
  if (!s.ok()) {
    fprintf(stderr, "collectives_benchmark: %s: %s\n", what, s.ToString().c_str());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
}

void RunOp(int64_t command, const Tensor& data) {
  MpiProcessGroup& g = *Group();
  const int n = static_cast<int>(data.numel());
  switch (command) {
    case kAllReduce: {
      auto work = g.allreduce(data);
      Check(work.ok() ? (*work)->wait() : work.status(), "all_reduce");
      break;
    }
    case kBroadcast: {
      auto work = g.broadcast(data);
      Check(work.ok() ? (*work)->wait() : work.status(), "broadcast");
      break;
    }
    case kRawAllReduce:
      Check(CallMpi("raw", "MPI_Allreduce",
                    [&] {
                      return MPI_Allreduce(MPI_IN_PLACE, data.raw_data(), n, MPI_FLOAT, MPI_SUM,
                                           g.comm());
                    }),
            "MPI_Allreduce");
      break;
    case kRawBroadcast:
      Check(CallMpi("raw", "MPI_Bcast",
                    [&] { return MPI_Bcast(data.raw_data(), n, MPI_FLOAT, 0, g.comm()); }),
            "MPI_Bcast");
      break;
  }
}

// Tells the followers what comes next, then lines every rank up.
void Announce(int64_t command, int64_t nbytes) {
  int64_t message[2] = {command, nbytes};
  Check(CallMpi("announce", "MPI_Bcast",
                [&] { return MPI_Bcast(message, 2, MPI_INT64_T, 0, MPI_COMM_WORLD); }),
        "announce");
  if (command == kStop) return;
  Check(CallMpi("barrier", "MPI_Barrier", [&] { return MPI_Barrier(MPI_COMM_WORLD); }), "barrier");
}

void Follow() {
  while (true) {
    int64_t message[2] = {0, 0};
    Check(CallMpi("follow", "MPI_Bcast",
                  [&] { return MPI_Bcast(message, 2, MPI_INT64_T, 0, MPI_COMM_WORLD); }),
          "follow");
    if (message[0] == kStop) return;
    Check(CallMpi("barrier", "MPI_Barrier", [&] { return MPI_Barrier(MPI_COMM_WORLD); }),
          "barrier");
    static Tensor data;
    if (!data.defined() || data.numel() != message[1] / 4) data = ones({message[1] / 4});
    RunOp(message[0], data);
  }
}

void BM_Collective(benchmark::State& state, int64_t command) {
  const int64_t nbytes = state.range(0);
  Tensor data = ones({nbytes / 4});
  std::vector<double> times;
  for (auto _ : state) {
    Announce(command, nbytes);
    const absl::Time start = absl::Now();
    RunOp(command, data);
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    state.SetIterationTime(seconds);
    times.push_back(seconds);
  }
  std::sort(times.begin(), times.end());
  const double median = times.empty() ? 0 : times[times.size() / 2];
  const int n = Group()->size();
  const bool reduce = command == kAllReduce || command == kRawAllReduce;
  const double factor = reduce ? 2.0 * (n - 1) / n : 1.0;
  state.counters["p50_us"] = median * 1e6;
  state.counters["busbw_p50_GBps"] = median > 0 ? nbytes / median / 1e9 * factor : 0;
  state.SetBytesProcessed(state.iterations() * nbytes);
}

void Sizes(benchmark::internal::Benchmark* b) {
  for (int64_t bytes :
       {int64_t{4} << 10, int64_t{256} << 10, int64_t{4} << 20, int64_t{64} << 20}) {
    b->Arg(bytes);
  }
  b->UseManualTime();
}

BENCHMARK_CAPTURE(BM_Collective, AllReduce, kAllReduce)->Apply(Sizes);
BENCHMARK_CAPTURE(BM_Collective, RawMpiAllReduce, kRawAllReduce)->Apply(Sizes);
BENCHMARK_CAPTURE(BM_Collective, Broadcast, kBroadcast)->Apply(Sizes);
BENCHMARK_CAPTURE(BM_Collective, RawMpiBroadcast, kRawBroadcast)->Apply(Sizes);

}  // namespace
}  // namespace ember::distributed::mpi

int main(int argc, char** argv) {
  using namespace ember::distributed;
  absl::StatusOr<LauncherWorld> world = mpi::MpiWorldFromLauncher(-1, -1);
  mpi::Check(world.status(), "starting MPI");
  auto group = mpi::MpiProcessGroup::create({.rank = world->rank, .size = world->size});
  mpi::Check(group.status(), "creating the group");
  mpi::Group() = *group;
  if (world->rank != 0) {
    mpi::Follow();
  } else {
    benchmark::Initialize(&argc, argv);
    benchmark::RunSpecifiedBenchmarks();
    mpi::Announce(mpi::kStop, 0);
  }
  mpi::Group().reset();
  return 0;
}
