// The gloo backend on CUDA tensors (Note [gloo on device tensors] in
// staging.cc): two ranks, as threads of this process, sharing cuda:0 (which
// NCCL refuses), run each op on CUDA tensors, and every tensor the op wrote
// must equal what the same op gives on CPU tensors. The CPU side runs
// everywhere, checked against values worked out here; the CUDA side skips
// without a usable GPU.
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cuda/device.h"
#include "cuda/stream.h"
#include "distributed/gloo/process_group_gloo.h"
#include "distributed/testing/ranks.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"
#include "tensor/stream.h"
#include "tensor/testing.h"

namespace ember::distributed::gloo {
namespace {

using ::ember::distributed::testing::Finish;
using ::ember::distributed::testing::Rank;
using ::ember::distributed::testing::RunRanks;
using ::ember::distributed::testing::RunRanksOptions;
using ::ember::testing::Values;
using ::testing::HasSubstr;

#define SKIP_WITHOUT_GPU()                                                     \
  do {                                                                         \
    if (!cuda::is_available()) {                                               \
      GTEST_SKIP() << "the CPU side passed; the CUDA side needs a GPU: "      \
                   << cuda::unavailable_reason();                              \
    }                                                                          \
  } while (0)

constexpr int kRanks = 2;
const Device kCuda0(DeviceType::kCUDA, 0);

RunRanksOptions Backend(const std::string& name) {
  RunRanksOptions options;
  options.backend = name;
  return options;
}

// `values` (float32) on `device`, doubled there by a kernel queued on the
// current stream just before the op is called: an op that read the tensor
// before the stream reached that point would see the undoubled values.
Tensor On(Device device, std::vector<float> values) {
  for (float& v : values) v /= 2;
  Tensor t = tensor(values).to(device);
  t.mul_(2);
  return t;
}

Tensor Empty(Device device, int64_t n) {
  return zeros({n}, TensorOptions(kFloat32).device(device));
}

// One rank's part of an op on `device`: makes its tensors there, runs the op,
// waits for it and returns what the op wrote, copied to the CPU.
using Op = std::function<absl::StatusOr<std::vector<Tensor>>(Rank&, Device)>;

absl::StatusOr<std::vector<std::vector<Tensor>>> Run(Device device, const Op& op,
                                                     const std::string& backend = "gloo") {
  std::vector<std::vector<Tensor>> results(kRanks);
  absl::Status s = RunRanks(
      kRanks,
      [&](Rank& me) -> absl::Status {
        EMBER_ASSIGN_OR_RETURN(std::vector<Tensor> written, op(me, device));
        for (Tensor& t : written) t = t.cpu();  // on the current stream, after wait()
        results[me.rank] = std::move(written);
        return absl::OkStatus();
      },
      Backend(backend));
  if (!s.ok()) return s;
  return results;
}

// The CPU side: each rank's results are `expected(rank)`.
void CheckCpu(const Op& op, const std::function<std::vector<std::vector<double>>(int)>& expected,
              std::vector<std::vector<Tensor>>* cpu) {
  absl::StatusOr<std::vector<std::vector<Tensor>>> got = Run(kCPU, op);
  ASSERT_TRUE(got.ok()) << got.status();
  for (int r = 0; r < kRanks; ++r) {
    const std::vector<std::vector<double>> want = expected(r);
    ASSERT_EQ((*got)[r].size(), want.size()) << "rank " << r;
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(Values((*got)[r][i]), want[i]) << "rank " << r << ", tensor " << i;
    }
  }
  *cpu = std::move(*got);
}

// The CUDA side: two ranks on cuda:0 write what the CPU ranks wrote.
void CheckCudaMatches(const Op& op, const std::vector<std::vector<Tensor>>& cpu) {
  absl::StatusOr<std::vector<std::vector<Tensor>>> got = Run(kCuda0, op);
  ASSERT_TRUE(got.ok()) << got.status();
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_EQ((*got)[r].size(), cpu[r].size());
    for (size_t i = 0; i < cpu[r].size(); ++i) {
      EXPECT_EQ(Values((*got)[r][i]), Values(cpu[r][i])) << "rank " << r << ", tensor " << i;
    }
  }
}

// The CPU side against the expected values (the rest of the arguments, a
// function of the rank), then the CUDA side against the CPU's results.
#define EXPECT_CUDA_MATCHES_CPU(op, ...)            \
  do {                                              \
    std::vector<std::vector<Tensor>> cpu;           \
    CheckCpu(op, __VA_ARGS__, &cpu);                \
    if (HasFatalFailure()) return;                  \
    SKIP_WITHOUT_GPU();                             \
    CheckCudaMatches(op, cpu);                      \
  } while (0)

TEST(GlooCudaTest, SupportTableListsCudaForEveryOpWithTensors) {
  const SupportTable table = GlooSupportTable();
  for (int i = 0; i < kNumOpTypes; ++i) {
    const auto op = static_cast<OpType>(i);
    const bool has_tensors = op != OpType::kBarrier && op != OpType::kMonitoredBarrier;
    EXPECT_EQ(table.supports(op, DeviceType::kCUDA), has_tensors) << op_type_name(op);
    EXPECT_TRUE(table.supports(op, DeviceType::kCPU)) << op_type_name(op);
  }
}

TEST(GlooCudaTest, Broadcast) {
  Op op = [](Rank& me, Device d) -> absl::StatusOr<std::vector<Tensor>> {
    Tensor t = On(d, {1.f + me.rank, 10.f + me.rank, 100.f + me.rank});
    EMBER_RETURN_IF_ERROR(Finish(me.group->broadcast(t, {.root = 1})));
    return std::vector<Tensor>{t};
  };
  EXPECT_CUDA_MATCHES_CPU(op, [](int) { return std::vector<std::vector<double>>{{2, 11, 101}}; });
}

TEST(GlooCudaTest, AllReduceSumAndMax) {
  Op op = [](Rank& me, Device d) -> absl::StatusOr<std::vector<Tensor>> {
    Tensor sum = On(d, {1.f + me.rank, 2.f * me.rank, -4.f});
    Tensor max = On(d, {1.f + me.rank, 5.f - me.rank});
    EMBER_RETURN_IF_ERROR(Finish(me.group->allreduce(sum)));
    EMBER_RETURN_IF_ERROR(Finish(me.group->allreduce(max, {.op = ReduceOp::kMax})));
    return std::vector<Tensor>{sum, max};
  };
  EXPECT_CUDA_MATCHES_CPU(op, [](int) { return std::vector<std::vector<double>>{{3, 2, -8}, {2, 5}}; });
}

// Several all_reduces in flight at once, waited for in the end only.
TEST(GlooCudaTest, AllReducesQueuedTogether) {
  Op op = [](Rank& me, Device d) -> absl::StatusOr<std::vector<Tensor>> {
    std::vector<Tensor> ts;
    std::vector<std::shared_ptr<Work>> works;
    for (int i = 0; i < 4; ++i) {
      ts.push_back(On(d, {static_cast<float>(i), static_cast<float>(me.rank)}));
      EMBER_ASSIGN_OR_RETURN(std::shared_ptr<Work> w, me.group->allreduce(ts.back()));
      works.push_back(w);
    }
    for (auto& w : works) EMBER_RETURN_IF_ERROR(w->wait());
    return ts;
  };
  EXPECT_CUDA_MATCHES_CPU(op, [](int) {
    return std::vector<std::vector<double>>{{0, 1}, {2, 1}, {4, 1}, {6, 1}};
  });
}

TEST(GlooCudaTest, ReduceLandsOnTheRootOnly) {
  Op op = [](Rank& me, Device d) -> absl::StatusOr<std::vector<Tensor>> {
    Tensor t = On(d, {1.f + me.rank, 3.f});
    EMBER_RETURN_IF_ERROR(Finish(me.group->reduce(t, {.root = 0})));
    return std::vector<Tensor>{t};
  };
  EXPECT_CUDA_MATCHES_CPU(op, [](int rank) {
    return rank == 0 ? std::vector<std::vector<double>>{{3, 6}}
                     : std::vector<std::vector<double>>{{2, 3}};  // untouched
  });
}

TEST(GlooCudaTest, AllGatherAndAllGatherIntoTensor) {
  Op op = [](Rank& me, Device d) -> absl::StatusOr<std::vector<Tensor>> {
    Tensor in = On(d, {10.f * me.rank, 10.f * me.rank + 1});
    std::vector<Tensor> outs = {Empty(d, 2), Empty(d, 2)};
    EMBER_RETURN_IF_ERROR(Finish(me.group->allgather(outs, in)));
    Tensor flat = Empty(d, 4);
    EMBER_RETURN_IF_ERROR(Finish(me.group->allgather_into_tensor(flat, in)));
    return std::vector<Tensor>{outs[0], outs[1], flat, in};
  };
  EXPECT_CUDA_MATCHES_CPU(op, [](int rank) {
    return std::vector<std::vector<double>>{
        {0, 1}, {10, 11}, {0, 1, 10, 11}, {10.0 * rank, 10.0 * rank + 1}};
  });
}

TEST(GlooCudaTest, GatherAndScatter) {
  Op op = [](Rank& me, Device d) -> absl::StatusOr<std::vector<Tensor>> {
    Tensor in = On(d, {5.f + me.rank});
    std::vector<Tensor> gathered;
    if (me.rank == 1) gathered = {Empty(d, 1), Empty(d, 1)};
    EMBER_RETURN_IF_ERROR(Finish(me.group->gather(gathered, in, {.root = 1})));
    Tensor part = Empty(d, 2);
    std::vector<Tensor> parts;
    if (me.rank == 0) parts = {On(d, {1, 2}), On(d, {3, 4})};
    EMBER_RETURN_IF_ERROR(Finish(me.group->scatter(part, parts, {.root = 0})));
    std::vector<Tensor> written = {part};
    written.insert(written.end(), gathered.begin(), gathered.end());
    return written;
  };
  EXPECT_CUDA_MATCHES_CPU(op, [](int rank) {
    return rank == 0 ? std::vector<std::vector<double>>{{1, 2}}
                     : std::vector<std::vector<double>>{{3, 4}, {5}, {6}};
  });
}

TEST(GlooCudaTest, ReduceScatter) {
  Op op = [](Rank& me, Device d) -> absl::StatusOr<std::vector<Tensor>> {
    std::vector<Tensor> ins = {On(d, {1.f + me.rank, 2.f}), On(d, {10.f * me.rank, 7.f})};
    Tensor out = Empty(d, 2);
    EMBER_RETURN_IF_ERROR(Finish(me.group->reduce_scatter(out, ins)));
    return std::vector<Tensor>{out};
  };
  EXPECT_CUDA_MATCHES_CPU(op, [](int rank) {
    return rank == 0 ? std::vector<std::vector<double>>{{3, 4}}
                     : std::vector<std::vector<double>>{{10, 14}};
  });
}

TEST(GlooCudaTest, AllToAllWithUnevenSizes) {
  // Rank r sends j + 1 elements of value 10 r + j to rank j.
  Op op = [](Rank& me, Device d) -> absl::StatusOr<std::vector<Tensor>> {
    std::vector<Tensor> ins, outs;
    for (int j = 0; j < kRanks; ++j) {
      ins.push_back(On(d, std::vector<float>(j + 1, 10.f * me.rank + j)));
      outs.push_back(Empty(d, me.rank + 1));
    }
    EMBER_RETURN_IF_ERROR(Finish(me.group->alltoall(outs, ins)));
    return outs;
  };
  EXPECT_CUDA_MATCHES_CPU(op, [](int rank) {
    return std::vector<std::vector<double>>{std::vector<double>(rank + 1, rank),
                                            std::vector<double>(rank + 1, 10 + rank)};
  });
}

TEST(GlooCudaTest, SendRecvAndBarrier) {
  Op op = [](Rank& me, Device d) -> absl::StatusOr<std::vector<Tensor>> {
    Tensor t = On(d, {1.f + me.rank, 2.f + me.rank});
    if (me.rank == 0) {
      EMBER_RETURN_IF_ERROR(Finish(me.group->send(t, 1, {.tag = 3})));
    } else {
      EMBER_ASSIGN_OR_RETURN(std::shared_ptr<RecvWork> w, me.group->recv(t, 0, {.tag = 3}));
      EMBER_RETURN_IF_ERROR(w->wait());
      if (w->source() != 0) return absl::InternalError("wrong source");
    }
    EMBER_RETURN_IF_ERROR(Finish(me.group->barrier()));
    return std::vector<Tensor>{t};
  };
  EXPECT_CUDA_MATCHES_CPU(op, [](int) { return std::vector<std::vector<double>>{{1, 2}}; });
}

// The copies run on the caller's current stream, whichever it is: here a
// pool stream made current for the call and the wait.
TEST(GlooCudaTest, UsesTheCallersCurrentStream) {
  SKIP_WITHOUT_GPU();
  absl::Status s = RunRanks(
      kRanks,
      [](Rank& me) -> absl::Status {
        EMBER_ASSIGN_OR_RETURN(cuda::Stream side, cuda::get_stream_from_pool(false, 0));
        StreamGuard guard(side);
        Tensor t = On(kCuda0, std::vector<float>(1 << 20, 1.f + me.rank));
        EMBER_RETURN_IF_ERROR(Finish(me.group->allreduce(t)));
        t.add_(1);  // queued on the side stream, after the copy back
        Tensor got = t.cpu();
        if (Values(got.narrow(0, 0, 1)) != std::vector<double>{4} ||
            Values(got.narrow(0, (1 << 20) - 1, 1)) != std::vector<double>{4}) {
          return absl::InternalError(absl::StrCat("got ", Values(got.narrow(0, 0, 1))[0]));
        }
        return absl::OkStatus();
      },
      Backend("gloo"));
  EXPECT_TRUE(s.ok()) << s;
}

// tcp moves host memory only, and says what to use instead.
TEST(GlooCudaTest, TcpRefusesCudaTensorsNamingNcclAndGloo) {
  SKIP_WITHOUT_GPU();
  absl::Status s = RunRanks(
      1,
      [](Rank& me) -> absl::Status {
        Tensor t = ones({2}, TensorOptions(kFloat32).device(kCuda0));
        auto work = me.group->allreduce(t);
        EXPECT_EQ(work.status().code(), absl::StatusCode::kUnimplemented);
        EXPECT_THAT(std::string(work.status().message()), HasSubstr("'tcp'"));
        EXPECT_THAT(std::string(work.status().message()), HasSubstr("nccl"));
        EXPECT_THAT(std::string(work.status().message()), HasSubstr("gloo"));
        return absl::OkStatus();
      },
      Backend("tcp"));
  EXPECT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace ember::distributed::gloo
