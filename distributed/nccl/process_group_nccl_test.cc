// The nccl backend. Without a GPU: its registration and support table, its
// refusal naming why CUDA is unusable, the environment it reads, the
// ncclUniqueId exchange through a real store (ncclGetUniqueId needs no GPU),
// and the dtype and reduce-op mapping. With one GPU: every op at world size 1
// against values computed on the CPU, the stream rules, the multi-GPU ops
// over the local GPUs, the watchdog failing a stuck op and aborting the
// group, and a new group split from the default group's communicator (or
// made through the store without one). With two GPUs: two ranks, each on its
// own GPU, and new groups split with a non-member taking part.
#include "distributed/nccl/process_group_nccl.h"

#include <cuda_runtime_api.h>
#include <stdlib.h>

#include <algorithm>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cuda/device.h"
#include "cuda/stream.h"
#include "cuda/testing/stream_gate.h"
#include "distributed/backend_registry.h"
#include "distributed/hash_store.h"
#include "distributed/testing/ranks.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"
#include "tensor/stream.h"

namespace ember::distributed::nccl {
namespace {

using ::testing::HasSubstr;

#define SKIP_WITHOUT_GPUS(n)                                                          \
  do {                                                                                \
    if (!cuda::is_available()) GTEST_SKIP() << "needs a GPU: " << cuda::unavailable_reason(); \
    if (cuda::device_count() < (n)) {                                                 \
      GTEST_SKIP() << "needs " << (n) << " GPUs, this machine has " << cuda::device_count(); \
    }                                                                                 \
  } while (0)

// Sets an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = getenv(name)) old_ = old;
    if (value == nullptr) {
      unsetenv(name);
    } else {
      setenv(name, value, 1);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(NcclBackendTest, RegisteredWithItsSupportTable) {
  absl::StatusOr<const BackendInfo*> info = find_backend("NCCL");
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ((*info)->name, "nccl");
  EXPECT_EQ((*info)->default_timeout, absl::Minutes(10));  // default_pg_nccl_timeout
  const SupportTable& t = (*info)->support;
  for (OpType op : {OpType::kBroadcast, OpType::kAllReduce, OpType::kReduce, OpType::kAllGather,
                    OpType::kAllGatherIntoTensor, OpType::kGather, OpType::kScatter,
                    OpType::kReduceScatter, OpType::kAllToAll, OpType::kSend, OpType::kRecv}) {
    EXPECT_TRUE(t.supports(op, DeviceType::kCUDA)) << op_type_name(op);
    EXPECT_FALSE(t.supports(op, DeviceType::kCPU)) << op_type_name(op);
  }
  EXPECT_FALSE(t.supports(OpType::kMonitoredBarrier, DeviceType::kCUDA));
  EXPECT_FALSE(t.supports(OpType::kMonitoredBarrier, DeviceType::kCPU));
  EXPECT_TRUE(t.supports(OpType::kBarrier, DeviceType::kCPU));
}

TEST(NcclBackendTest, WithoutAGpuCreationNamesTheReason) {
  if (cuda::is_available()) GTEST_SKIP() << "a GPU is usable here; the refusal needs none";
  absl::StatusOr<std::shared_ptr<NcclProcessGroup>> pg =
      NcclProcessGroup::create({.store = std::make_shared<HashStore>()});
  ASSERT_FALSE(pg.ok());
  EXPECT_EQ(pg.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(pg.status().message(), HasSubstr(cuda::unavailable_reason()));
  EXPECT_THAT(pg.status().message(), HasSubstr("gloo"));
}

TEST(NcclEnvironmentTest, DefaultsArePyTorchs) {
  ScopedEnv a("TORCH_NCCL_ASYNC_ERROR_HANDLING", nullptr), b("NCCL_ASYNC_ERROR_HANDLING", nullptr);
  ScopedEnv c("TORCH_NCCL_BLOCKING_WAIT", nullptr), d("NCCL_BLOCKING_WAIT", nullptr);
  absl::StatusOr<NcclEnvironment> env = read_nccl_environment();
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->async_error_handling, AsyncErrorHandling::kSkipCleanUp);
  EXPECT_FALSE(env->blocking_wait);
  EXPECT_EQ(kDefaultNcclTimeout, absl::Minutes(10));
}

TEST(NcclEnvironmentTest, ReadsEachModeAndPrefersTheTorchName) {
  ScopedEnv legacy("NCCL_ASYNC_ERROR_HANDLING", "1");
  {
    ScopedEnv unset("TORCH_NCCL_ASYNC_ERROR_HANDLING", nullptr);
    EXPECT_EQ(read_nccl_environment()->async_error_handling, AsyncErrorHandling::kTearDown);
  }
  for (auto [value, mode] : {std::pair{"0", AsyncErrorHandling::kNoHandling},
                             std::pair{"2", AsyncErrorHandling::kCleanUpOnly},
                             std::pair{"3", AsyncErrorHandling::kSkipCleanUp}}) {
    ScopedEnv set("TORCH_NCCL_ASYNC_ERROR_HANDLING", value);
    EXPECT_EQ(read_nccl_environment()->async_error_handling, mode) << value;
  }
  ScopedEnv blocking("TORCH_NCCL_BLOCKING_WAIT", "1");
  EXPECT_TRUE(read_nccl_environment()->blocking_wait);
}

TEST(NcclEnvironmentTest, BadValuesNameTheVariable) {
  {
    ScopedEnv bad("TORCH_NCCL_ASYNC_ERROR_HANDLING", "yes");
    absl::StatusOr<NcclEnvironment> env = read_nccl_environment();
    ASSERT_FALSE(env.ok());
    EXPECT_EQ(env.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(env.status().message(), HasSubstr("TORCH_NCCL_ASYNC_ERROR_HANDLING=yes"));
  }
  ScopedEnv unset("TORCH_NCCL_BLOCKING_WAIT", nullptr);
  ScopedEnv bad("NCCL_BLOCKING_WAIT", "2");
  absl::StatusOr<NcclEnvironment> env = read_nccl_environment();
  ASSERT_FALSE(env.ok());
  EXPECT_THAT(env.status().message(), HasSubstr("NCCL_BLOCKING_WAIT=2"));
}

TEST(NcclUniqueIdTest, EveryRankReadsTheRootsIdThroughTheStore) {
  auto store = std::make_shared<HashStore>();
  constexpr int kRanks = 4;
  std::vector<absl::StatusOr<ncclUniqueId>> ids(kRanks, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int r = kRanks - 1; r >= 0; --r) {  // the root last: the others wait for it
    threads.emplace_back([&, r] {
      ids[r] = exchange_unique_id(*store, "default_pg/0", r == 0, absl::Seconds(20));
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) ASSERT_TRUE(ids[r].ok()) << r << ": " << ids[r].status();
  for (int r = 1; r < kRanks; ++r) {
    EXPECT_EQ(std::string(ids[r]->internal, sizeof(ncclUniqueId)),
              std::string(ids[0]->internal, sizeof(ncclUniqueId)))
        << r;
  }
  // The id is in the store under the key, as the other ranks read it.
  absl::StatusOr<std::string> stored = store->get("default_pg/0", absl::Seconds(1));
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(*stored, std::string(ids[0]->internal, sizeof(ncclUniqueId)));
  // Two roots make two different ids.
  absl::StatusOr<ncclUniqueId> other = exchange_unique_id(*store, "1/0", true, absl::Seconds(1));
  ASSERT_TRUE(other.ok());
  EXPECT_NE(std::string(other->internal, sizeof(ncclUniqueId)), *stored);
}

TEST(NcclUniqueIdTest, MissingRootAndForeignValuesAreErrorsNamingTheKey) {
  HashStore store;
  absl::StatusOr<ncclUniqueId> late = exchange_unique_id(store, "g/7", false, absl::Milliseconds(200));
  ASSERT_FALSE(late.ok());
  EXPECT_EQ(late.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(late.status().message(), HasSubstr("'g/7'"));
  ASSERT_TRUE(store.set("g/8", "short").ok());
  absl::StatusOr<ncclUniqueId> foreign = exchange_unique_id(store, "g/8", false, absl::Seconds(1));
  ASSERT_FALSE(foreign.ok());
  EXPECT_EQ(foreign.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(foreign.status().message(), HasSubstr("5 bytes"));
}

TEST(NcclMappingTest, DtypesAndReduceOps) {
  EXPECT_EQ(*nccl_dtype(kFloat32), ncclFloat32);
  EXPECT_EQ(*nccl_dtype(kBFloat16), ncclBfloat16);
  EXPECT_EQ(*nccl_dtype(kBool), ncclUint8);
  absl::StatusOr<ncclDataType_t> i16 = nccl_dtype(kInt16);
  ASSERT_FALSE(i16.ok());
  EXPECT_THAT(i16.status().message(), HasSubstr("int16"));
  // bool: SUM and MAX are "or", PRODUCT and MIN "and".
  EXPECT_EQ(*nccl_reduce_op(ReduceOp::kSum, kBool), ncclMax);
  EXPECT_EQ(*nccl_reduce_op(ReduceOp::kMax, kBool), ncclMax);
  EXPECT_EQ(*nccl_reduce_op(ReduceOp::kProduct, kBool), ncclMin);
  EXPECT_EQ(*nccl_reduce_op(ReduceOp::kMin, kBool), ncclMin);
  EXPECT_FALSE(nccl_reduce_op(ReduceOp::kAvg, kBool).ok());
  EXPECT_EQ(*nccl_reduce_op(ReduceOp::kAvg, kFloat32), ncclAvg);
  EXPECT_EQ(*nccl_reduce_op(ReduceOp::kProduct, kInt64), ncclProd);
}

// --- One GPU -------------------------------------------------------------------------

std::shared_ptr<NcclProcessGroup> OneRank(absl::Duration timeout = absl::Seconds(60)) {
  absl::StatusOr<std::shared_ptr<NcclProcessGroup>> pg = NcclProcessGroup::create(
      {.store = std::make_shared<HashStore>(), .store_prefix = "default_pg/", .timeout = timeout});
  EXPECT_TRUE(pg.ok()) << pg.status();
  return pg.ok() ? *pg : nullptr;
}

TensorOptions Cuda(Dtype dtype = kFloat32) {
  return TensorOptions(dtype).device(Device(DeviceType::kCUDA, 0));
}

// Waits for the work on the host: synchronize() on the current stream, then
// the stream itself.
void Finish(const std::shared_ptr<Work>& work) {
  ASSERT_TRUE(work->synchronize().ok());
  ASSERT_TRUE(cuda::synchronize(0).ok());
  ASSERT_TRUE(work->wait(absl::Seconds(30)).ok()) << work->status();
}

TEST(NcclOneGpuTest, EveryCollectiveAtWorldSizeOne) {
  SKIP_WITHOUT_GPUS(1);
  auto pg = OneRank();
  ASSERT_NE(pg, nullptr);
  Tensor host = arange(12, kFloat32).reshape({3, 4});
  for (Dtype dtype : {kFloat32, kBFloat16, kInt64, kBool, kInt16}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    Tensor x = host.to(dtype).to(Device(DeviceType::kCUDA, 0));
    Tensor expected = host.to(dtype);
    auto b = pg->broadcast(x);
    ASSERT_TRUE(b.ok()) << b.status();
    Finish(*b);
    EXPECT_TRUE(x.to(Device(DeviceType::kCPU)).equal(expected));
    if (dtype == kInt16) continue;  // moved as bytes; NCCL cannot reduce it
    auto r = pg->allreduce(x, {.op = ReduceOp::kSum});
    ASSERT_TRUE(r.ok()) << r.status();
    Finish(*r);
    EXPECT_TRUE(x.to(Device(DeviceType::kCPU)).equal(expected));  // a sum over one rank
  }
  // all_gather (list and into one tensor), reduce_scatter, all_to_all,
  // gather, scatter, reduce, barrier.
  Tensor in = arange(6, kFloat32).to(Device(DeviceType::kCUDA, 0));
  Tensor out = zeros({6}, Cuda());
  Finish(*pg->allgather_into_tensor(out, in));
  EXPECT_TRUE(out.to(Device(DeviceType::kCPU)).equal(arange(6, kFloat32)));
  std::vector<Tensor> list = {zeros({6}, Cuda())};
  Finish(*pg->allgather(list, in));
  EXPECT_TRUE(list[0].to(Device(DeviceType::kCPU)).equal(arange(6, kFloat32)));
  Tensor rs = zeros({6}, Cuda());
  std::vector<Tensor> rs_in = {in * 2.0};
  Finish(*pg->reduce_scatter(rs, rs_in));
  EXPECT_TRUE(rs.to(Device(DeviceType::kCPU)).equal(arange(6, kFloat32) * 2.0));
  std::vector<Tensor> a2a_out = {zeros({6}, Cuda())};
  std::vector<Tensor> a2a_in = {in + 1.0};
  Finish(*pg->alltoall(a2a_out, a2a_in));
  EXPECT_TRUE(a2a_out[0].to(Device(DeviceType::kCPU)).equal(arange(6, kFloat32) + 1.0));
  std::vector<Tensor> gathered = {zeros({6}, Cuda())};
  Finish(*pg->gather(gathered, in, {.root = 0}));
  EXPECT_TRUE(gathered[0].to(Device(DeviceType::kCPU)).equal(arange(6, kFloat32)));
  Tensor scattered = zeros({6}, Cuda());
  std::vector<Tensor> to_scatter = {in * 3.0};
  Finish(*pg->scatter(scattered, to_scatter, {.root = 0}));
  EXPECT_TRUE(scattered.to(Device(DeviceType::kCPU)).equal(arange(6, kFloat32) * 3.0));
  Tensor avg = in.clone();
  Finish(*pg->allreduce(avg, {.op = ReduceOp::kAvg}));
  EXPECT_TRUE(avg.to(Device(DeviceType::kCPU)).equal(arange(6, kFloat32)));
  auto barrier = pg->barrier();
  ASSERT_TRUE(barrier.ok()) << barrier.status();
  EXPECT_TRUE((*barrier)->wait(absl::Seconds(30)).ok());
}

TEST(NcclOneGpuTest, NonContiguousTensorsAreWrittenInPlace) {
  SKIP_WITHOUT_GPUS(1);
  auto pg = OneRank();
  Tensor base = arange(12, kFloat32).reshape({3, 4}).to(Device(DeviceType::kCUDA, 0));
  Tensor column_major = base.t();  // a non-contiguous view
  Finish(*pg->allreduce(column_major, {.op = ReduceOp::kMax}));
  EXPECT_TRUE(base.to(Device(DeviceType::kCPU)).equal(arange(12, kFloat32).reshape({3, 4})));
}

TEST(NcclOneGpuTest, AnOpSeesWritesQueuedOnTheCurrentStream) {
  SKIP_WITHOUT_GPUS(1);
  auto pg = OneRank();
  absl::StatusOr<cuda::Stream> side = cuda::get_stream_from_pool(false, 0);
  ASSERT_TRUE(side.ok());
  Tensor x = zeros({1 << 20}, Cuda());
  {
    StreamGuard guard(*side);
    x.fill_(7.0);  // queued on the side stream, the current one here
    auto work = pg->allreduce(x);
    ASSERT_TRUE(work.ok());
    ASSERT_TRUE((*work)->synchronize().ok());  // the side stream waits for the op
    x.mul_(2.0);                               // so this runs after it
  }
  ASSERT_TRUE(side->synchronize().ok());
  EXPECT_EQ(x.to(Device(DeviceType::kCPU)).min().item<float>(), 14.0f);
  EXPECT_EQ(x.to(Device(DeviceType::kCPU)).max().item<float>(), 14.0f);
}

TEST(NcclOneGpuTest, MultiGpuOpsOverEveryLocalGpu) {
  SKIP_WITHOUT_GPUS(1);
  auto pg = OneRank();
  const int n = cuda::device_count();
  std::vector<Tensor> xs;
  for (int d = 0; d < n; ++d) {
    xs.push_back(full({5}, d + 1.0, TensorOptions(kFloat32).device(Device(DeviceType::kCUDA, d))));
  }
  Finish(*pg->all_reduce_multigpu(xs));
  const float sum = n * (n + 1) / 2.0f;
  for (int d = 0; d < n; ++d) EXPECT_EQ(xs[d].to(Device(DeviceType::kCPU)).max().item<float>(), sum) << d;
  std::vector<std::vector<Tensor>> outs(n);
  for (int d = 0; d < n; ++d) {
    for (int j = 0; j < n; ++j) {
      outs[d].push_back(zeros({5}, TensorOptions(kFloat32).device(Device(DeviceType::kCUDA, d))));
    }
  }
  Finish(*pg->all_gather_multigpu(outs, xs));
  for (int d = 0; d < n; ++d) EXPECT_EQ(outs[d][n - 1].to(Device(DeviceType::kCPU)).max().item<float>(), sum);
  std::vector<Tensor> twice = {xs[0], xs[0]};
  absl::StatusOr<std::shared_ptr<Work>> bad = pg->all_reduce_multigpu(twice);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("two tensors are on cuda:0"));
}

TEST(NcclOneGpuTest, ABatchReceivingFromAnySourceIsRefused) {
  SKIP_WITHOUT_GPUS(1);
  absl::Status s = testing::RunRanks(
      1,
      [](testing::Rank& me) -> absl::Status {
        Tensor t = zeros({4}, TensorOptions(kFloat32).device(Device(DeviceType::kCUDA, 0)));
        absl::StatusOr<std::vector<std::shared_ptr<Work>>> works =
            me.group->batch_p2p(std::vector<P2PRequest>{
                {.op = OpType::kRecv, .tensor = t, .peer = kAnySource}});
        if (works.status().code() != absl::StatusCode::kUnimplemented ||
            !absl::StrContains(works.status().message(), "any source")) {
          return absl::InternalError(absl::StrCat("got ", works.status().ToString()));
        }
        return absl::OkStatus();
      },
      {.backend = "nccl"});
  EXPECT_TRUE(s.ok()) << s;
}

TEST(NcclOneGpuTest, CpuTensorsAreRefusedByTheSupportTable) {
  SKIP_WITHOUT_GPUS(1);
  auto pg = OneRank();
  absl::StatusOr<std::shared_ptr<Work>> w = pg->allreduce(ones({4}));
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(w.status().message(), HasSubstr("'nccl'"));
}

TEST(NcclOneGpuTest, TheWatchdogFailsAStuckOpAndAbortsTheGroup) {
  SKIP_WITHOUT_GPUS(1);
  ScopedEnv mode("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2");  // abort, keep the process
  ScopedEnv blocking("TORCH_NCCL_BLOCKING_WAIT", nullptr), legacy("NCCL_BLOCKING_WAIT", nullptr);
  auto pg = OneRank();
  Tensor x = ones({16}, Cuda());
  // Op #0 makes the communicator and loads NCCL's kernels while the stream
  // is idle: neither may wait for the stream the gate holds.
  Finish(*pg->allreduce(x));
  absl::StatusOr<cuda::Stream> current = cuda::current_stream(0);
  ASSERT_TRUE(current.ok());
  // Op #1 waits for the caller's stream, which the gate holds until opened.
  cuda::testing::StreamGate gate;
  ASSERT_TRUE(gate.Close(current->stream()).ok());
  auto work = pg->allreduce(x, {.timeout = absl::Milliseconds(300)});
  ASSERT_TRUE(work.ok()) << work.status();
  // wait() does not block the host (TORCH_NCCL_BLOCKING_WAIT unset): the
  // host learns of the failure once the watchdog reports it.
  const absl::Time until = absl::Now() + absl::Seconds(20);
  while (!(*work)->is_completed() && absl::Now() < until) absl::SleepFor(absl::Milliseconds(10));
  absl::Status s = (*work)->wait();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_THAT(s.message(), HasSubstr("all_reduce"));
  EXPECT_THAT(s.message(), HasSubstr("op #1 of group default_pg/"));
  EXPECT_THAT(s.message(), HasSubstr("300ms"));
  EXPECT_THAT(s.message(), HasSubstr("Watchdog caught collective operation timeout"));
  // Mode 2 aborted the group: later ops fail at once.
  absl::StatusOr<std::shared_ptr<Work>> later = pg->allreduce(x);
  ASSERT_FALSE(later.ok());
  EXPECT_EQ(later.status().code(), absl::StatusCode::kAborted);
  EXPECT_FALSE(gate.gave_up()) << "a call waited for the stream the gate held";
  gate.Open();
  ASSERT_TRUE(cuda::synchronize(0).ok());
}

// Note [NCCL split groups]: a new group's communicator split from the
// default group's reads no ncclUniqueId from the store; without a parent
// communicator the new group meets through the store instead.
bool HasKey(Store& store, const std::string& key) {
  return store.get(key, absl::ZeroDuration()).ok();
}

TEST(NcclSplitTest, WithoutAParentCommunicatorTheNewGroupMeetsThroughTheStore) {
  SKIP_WITHOUT_GPUS(1);
  auto store = std::make_shared<HashStore>();
  auto parent = NcclProcessGroup::create({.store = store, .store_prefix = "0/"});
  ASSERT_TRUE(parent.ok()) << parent.status();
  const BackendOptions child{.store = store, .store_prefix = "1/", .ranks = {0}};
  ASSERT_TRUE((*parent)->split_for_new_group(child, "").ok());  // nothing to split yet
  auto group = NcclProcessGroup::create(child);
  ASSERT_TRUE(group.ok()) << group.status();
  Tensor x = full({8}, 2.0, Cuda());
  Finish(*(*group)->allreduce(x));
  EXPECT_TRUE(x.to(Device(DeviceType::kCPU)).equal(full({8}, 2.0)));
  EXPECT_TRUE(HasKey(*store, "1/0")) << "a fresh communicator, its id through the store";
}

TEST(NcclSplitTest, AtWorldSizeOneTheNewGroupSplitsTheParentsCommunicator) {
  SKIP_WITHOUT_GPUS(1);
  auto store = std::make_shared<HashStore>();
  auto parent = NcclProcessGroup::create({.store = store, .store_prefix = "0/"});
  ASSERT_TRUE(parent.ok()) << parent.status();
  Tensor x = full({8}, 3.0, Cuda());
  Finish(*(*parent)->allreduce(x));  // the parent's communicator on cuda:0
  ASSERT_TRUE(HasKey(*store, "0/0"));
  const BackendOptions child{.store = store, .store_prefix = "1/", .ranks = {0}};
  absl::Status split = (*parent)->split_for_new_group(child, "");
  ASSERT_TRUE(split.ok()) << split;
  auto group = NcclProcessGroup::create(child);
  ASSERT_TRUE(group.ok()) << group.status();
  Finish(*(*group)->allreduce(x));
  Finish(*(*group)->barrier());  // on the split communicator's device
  EXPECT_TRUE(x.to(Device(DeviceType::kCPU)).equal(full({8}, 3.0)));
  EXPECT_FALSE(HasKey(*store, "1/0")) << "split, so no ncclUniqueId was exchanged";
  // The parent goes on working beside it.
  Finish(*(*parent)->allreduce(x));
  EXPECT_TRUE(x.to(Device(DeviceType::kCPU)).equal(full({8}, 3.0)));
}

// --- Two GPUs, two processes ------------------------------------------------------

TEST(NcclTwoGpuTest, TwoRanksEachOnItsGpu) {
  SKIP_WITHOUT_GPUS(2);
  // Threads, not processes: a child forked after CUDA started could not use
  // it. Each rank has its own communicator on its own GPU either way.
  absl::Status s = testing::RunRanks(
      2,
      [](testing::Rank& me) -> absl::Status {
        EMBER_RETURN_IF_ERROR(cuda::set_device(me.rank));
        const Device dev(DeviceType::kCUDA, me.rank);
        Tensor x = full({1000}, me.rank + 1.0, TensorOptions(kFloat32).device(dev));
        EMBER_ASSIGN_OR_RETURN(auto w, me.group->allreduce(x));
        EMBER_RETURN_IF_ERROR(w->wait());
        EMBER_RETURN_IF_ERROR(cuda::synchronize(me.rank));
        if (x.to(Device(DeviceType::kCPU)).min().item<float>() != 3.0f) return absl::InternalError("wrong all_reduce");
        Tensor msg = full({10}, 42.0, TensorOptions(kFloat32).device(dev));
        if (me.rank == 0) {
          EMBER_ASSIGN_OR_RETURN(auto send, me.group->send(msg, 1));
          EMBER_RETURN_IF_ERROR(send->wait());
        } else {
          Tensor got = zeros({10}, TensorOptions(kFloat32).device(dev));
          EMBER_ASSIGN_OR_RETURN(auto recv, me.group->recv(got, 0));
          EMBER_RETURN_IF_ERROR(recv->wait());
          EMBER_RETURN_IF_ERROR(cuda::synchronize(me.rank));
          if (got.to(Device(DeviceType::kCPU)).max().item<float>() != 42.0f) return absl::InternalError("wrong recv");
        }
        return absl::OkStatus();
      },
      {.backend = "nccl"});
  EXPECT_TRUE(s.ok()) << s;
}

// batch_isend_irecv as one NCCL group: rank 0 lists its send first and rank
// 1 its receive first, one receiver not contiguous; every op's Work is the
// batch's.
TEST(NcclTwoGpuTest, BatchP2PIsOneGroupCallInAnyOrder) {
  SKIP_WITHOUT_GPUS(2);
  absl::Status s = testing::RunRanks(
      2,
      [](testing::Rank& me) -> absl::Status {
        EMBER_RETURN_IF_ERROR(cuda::set_device(me.rank));
        const Device dev(DeviceType::kCUDA, me.rank);
        const TensorOptions on = TensorOptions(kFloat32).device(dev);
        const int peer = 1 - me.rank;
        Tensor out = full({64}, 10.0 + me.rank, on);
        Tensor grid = zeros({8, 8}, on);
        Tensor in = grid.t();  // not contiguous
        std::vector<P2PRequest> ops = {{.op = OpType::kSend, .tensor = out, .peer = peer},
                                       {.op = OpType::kRecv, .tensor = in, .peer = peer}};
        if (me.rank == 1) std::swap(ops[0], ops[1]);
        EMBER_ASSIGN_OR_RETURN(std::vector<std::shared_ptr<Work>> works, me.group->batch_p2p(ops));
        if (works.size() != 2 || works[0] != works[1]) {
          return absl::InternalError("expected the batch's one Work for both ops");
        }
        EMBER_RETURN_IF_ERROR(works[0]->wait());
        EMBER_RETURN_IF_ERROR(cuda::synchronize(me.rank));
        const float want = 10.0f + peer;
        Tensor got = in.to(Device(DeviceType::kCPU));
        if (got.min().item<float>() != want || got.max().item<float>() != want) {
          return absl::InternalError(absl::StrCat("batch received ", got.ToString()));
        }
        return absl::OkStatus();
      },
      {.backend = "nccl"});
  EXPECT_TRUE(s.ok()) << s;
}

// Every rank of the default group splits it, the non-member with no color:
// a group of rank 1 alone, then of both ranks.
TEST(NcclTwoGpuTest, NewGroupsSplitTheDefaultGroupsCommunicator) {
  SKIP_WITHOUT_GPUS(2);
  absl::Status s = testing::RunRanks(
      2,
      [](testing::Rank& me) -> absl::Status {
        EMBER_RETURN_IF_ERROR(cuda::set_device(me.rank));
        const Device dev(DeviceType::kCUDA, me.rank);
        Tensor x = full({100}, me.rank + 1.0, TensorOptions(kFloat32).device(dev));
        EMBER_ASSIGN_OR_RETURN(auto w, me.group->allreduce(x));  // the parent's communicator
        EMBER_RETURN_IF_ERROR(w->wait());
        const BackendOptions alone{.store = me.store,
                                   .store_prefix = "test/1/",
                                   .rank = me.rank == 1 ? 0 : -1,
                                   .size = 1,
                                   .timeout = absl::Seconds(60),
                                   .ranks = {1}};
        EMBER_RETURN_IF_ERROR(me.group->split_for_new_group(alone, ""));
        if (me.rank == 1) {
          EMBER_ASSIGN_OR_RETURN(auto one, NcclProcessGroup::create(alone));
          EMBER_ASSIGN_OR_RETURN(auto w1, one->allreduce(x));
          EMBER_RETURN_IF_ERROR(w1->wait());
        }
        const BackendOptions both{.store = me.store,
                                  .store_prefix = "test/2/",
                                  .rank = me.rank,
                                  .size = 2,
                                  .timeout = absl::Seconds(60),
                                  .ranks = {0, 1}};
        EMBER_RETURN_IF_ERROR(me.group->split_for_new_group(both, ""));
        EMBER_ASSIGN_OR_RETURN(auto pair, NcclProcessGroup::create(both));
        EMBER_ASSIGN_OR_RETURN(auto w2, pair->allreduce(x));
        EMBER_RETURN_IF_ERROR(w2->wait());
        EMBER_RETURN_IF_ERROR(cuda::synchronize(me.rank));
        if (x.to(Device(DeviceType::kCPU)).min().item<float>() != 6.0f) {
          return absl::InternalError("wrong all_reduce on the split group");
        }
        if (me.store->get("test/1/0", absl::ZeroDuration()).ok() ||
            me.store->get("test/2/0", absl::ZeroDuration()).ok()) {
          return absl::InternalError("a split group exchanged a ncclUniqueId");
        }
        return absl::OkStatus();
      },
      {.backend = "nccl"});
  EXPECT_TRUE(s.ok()) << s;
}

// Note [NCCL shrunken groups]: the survivors shrink the group's
// communicator with ncclCommShrink, which the excluded rank does not join,
// and the shrunken group runs on it without a ncclUniqueId through the
// store. Needs a GPU per rank (NCCL refuses two ranks on one GPU).
TEST(NcclShrinkTest, SurvivorsShrinkTheCommunicatorWithoutTheExcludedRank) {
  SKIP_WITHOUT_GPUS(2);
  if (!NcclComm::kCanShrink) {
    GTEST_SKIP() << "ncclCommShrink needs NCCL 2.27 or later; this build has " << NCCL_MAJOR << "."
                 << NCCL_MINOR;
  }
  const int world = std::min(3, cuda::device_count());
  const int excluded = world - 1;
  absl::Status s = testing::RunRanks(
      world,
      [&](testing::Rank& me) -> absl::Status {
        EMBER_RETURN_IF_ERROR(cuda::set_device(me.rank));
        const Device dev(DeviceType::kCUDA, me.rank);
        Tensor x = full({64}, me.rank + 1.0, TensorOptions(kFloat32).device(dev));
        EMBER_ASSIGN_OR_RETURN(auto w, me.group->allreduce(x));  // the communicator exists
        EMBER_RETURN_IF_ERROR(w->wait());
        EMBER_RETURN_IF_ERROR(cuda::synchronize(me.rank));
        if (me.rank == excluded) return absl::OkStatus();  // takes no part in the shrink
        const BackendOptions survivors{.store = me.store,
                                       .store_prefix = "test/shrink:2/",
                                       .rank = me.rank,
                                       .size = world - 1,
                                       .timeout = absl::Seconds(60)};
        const std::vector<int> out = {excluded};
        EMBER_RETURN_IF_ERROR(me.group->shrink_for_new_group(survivors, out, false, ""));
        EMBER_ASSIGN_OR_RETURN(auto shrunk, NcclProcessGroup::create(survivors));
        Tensor y = full({64}, me.rank + 1.0, TensorOptions(kFloat32).device(dev));
        EMBER_ASSIGN_OR_RETURN(auto w2, shrunk->allreduce(y));
        EMBER_RETURN_IF_ERROR(w2->wait());
        EMBER_RETURN_IF_ERROR(cuda::synchronize(me.rank));
        // 1 + 2 (+ 3 excluded): the survivors' sum.
        const float expected = world == 3 ? 3.0f : 1.0f;
        if (y.to(Device(DeviceType::kCPU)).min().item<float>() != expected) {
          return absl::InternalError("wrong all_reduce on the shrunken group");
        }
        if (me.store->get("test/shrink:2/0", absl::ZeroDuration()).ok()) {
          return absl::InternalError("the shrunken group exchanged a ncclUniqueId");
        }
        return absl::OkStatus();
      },
      {.backend = "nccl"});
  EXPECT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace ember::distributed::nccl
