// DistributedDataParallel with a module on a GPU, one device per process:
// ranks as threads of this process (distributed/testing/ranks.h), so that
// two gloo ranks can share cuda:0 (which NCCL refuses) and the process never
// forks after CUDA is initialised. Each rank trains its shard; one module
// trains on the whole batch beside them, on the same device; every rank must
// end with its parameters within 1e-5 relative of it (fp32), and all ranks
// equal. The CPU side of each case runs the same scenario on the CPU (gloo)
// everywhere; the GPU side skips without a usable GPU (or with too few),
// saying so.
#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "cuda/device.h"
#include "cuda/graphs.h"
#include "distributed/testing/ranks.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "nn/loss.h"
#include "nn/optim/sgd.h"
#include "parallel/cuda_testing.h"
#include "parallel/distributed_data_parallel.h"
#include "tensor/error.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"

namespace ember::parallel {
namespace {

namespace testing = ::ember::distributed::testing;
using ::testing::HasSubstr;

constexpr int64_t kInputs = 6;
constexpr int64_t kClasses = 4;
constexpr int64_t kGlobalBatch = 16;
constexpr double kRelativeTolerance = 1e-5;

using cuda_testing::Cuda;
using cuda_testing::Guard;

// fc1 -> relu -> fc2 (scaled by a buffer), plus a head forward uses only
// when `use_extra`.
class Net : public nn::Cloneable<Net> {
 public:
  Net() { reset(); }
  void reset() override {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(kInputs, 16));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(16, kClasses));
    extra = register_module("extra", std::make_shared<nn::Linear>(16, kClasses));
    register_buffer("scale", ones({1}));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = (*fc1)(x).relu();
    Tensor y = (*fc2)(h) * buffer("scale");
    return use_extra ? y + (*extra)(h) : y;
  }
  bool use_extra = true;
  std::shared_ptr<nn::Linear> fc1, fc2, extra;
};

struct Batch {
  Tensor x, y;
};
Batch GlobalBatch(int step, Device device) {
  Generator gen(500 + step);
  return {randn({kGlobalBatch, kInputs}, {}, &gen).to(device),
          randint(0, kClasses, {kGlobalBatch}, {}, &gen).to(device)};
}
Batch Shard(const Batch& b, int rank, int world) {
  const int64_t n = kGlobalBatch / world;
  return {b.x.narrow(0, rank * n, n), b.y.narrow(0, rank * n, n)};
}

std::vector<Tensor> HostCopies(const nn::Module& m) {
  std::vector<Tensor> out;
  for (const Tensor& p : m.parameters()) out.push_back(p.detach().cpu().clone());
  return out;
}

// What a scenario does on each rank and in the reference module.
struct Scenario {
  DistributedDataParallelOptions options;
  int steps = 3;
  // Step 0 runs under no_sync (local accumulation), step 1 synchronises
  // without zero_grad in between; the reference accumulates both batches.
  bool no_sync_first = false;
  // `extra` unused by every rank (needs find_unused_parameters).
  bool unused_head = false;
  // Rank 1 changes its buffer after create(); broadcast_buffers must undo it
  // at the next forward.
  bool perturb_buffer = false;
};

// Trains `scenario` with DDP on `world` ranks over `backend`, rank r's module
// on device_of(r), and the reference on device_of(0) on the whole batch;
// fails unless every rank ends within kRelativeTolerance of the reference
// and all ranks are equal.
absl::Status TrainAndCompare(const std::string& backend, int world,
                             const std::function<Device(int)>& device_of,
                             const Scenario& scenario) {
  // Built serially (the global generator), different on every rank: create()
  // broadcasts rank 0's.
  std::vector<std::shared_ptr<Net>> models;
  for (int r = 0; r < world; ++r) {
    manual_seed(40 + r);
    auto model = std::make_shared<Net>();
    model->use_extra = !scenario.unused_head;
    model->to(device_of(r));
    models.push_back(model);
  }
  auto reference = std::static_pointer_cast<Net>(models[0]->clone(device_of(0)));
  std::vector<std::vector<Tensor>> trained(world);
  std::vector<bool> extra_grad_defined(world, true);
  testing::RunRanksOptions rank_options;
  rank_options.backend = backend;
  EMBER_RETURN_IF_ERROR(testing::RunRanks(
      world,
      [&](testing::Rank& me) {
        return Guard([&]() -> absl::Status {
          const Device device = device_of(me.rank);
          DistributedDataParallelOptions options = scenario.options;
          options.process_group = me.group;
          if (device.is_cuda()) options.device_ids = {device};
          auto model = models[me.rank];
          EMBER_ASSIGN_OR_RETURN(auto ddp, DistributedDataParallel::create(model, options));
          // After create()'s broadcast: only the per-forward one can fix it.
          if (scenario.perturb_buffer && me.rank == 1) model->buffer("scale").fill_(3.0);
          nn::optim::SGD opt(ddp->parameters(), {.lr = 0.1});
          for (int step = 0; step < scenario.steps; ++step) {
            // The input starts on the CPU: device_ids moves it.
            const Batch local = Shard(GlobalBatch(step, kCPU), me.rank, me.world_size);
            if (scenario.no_sync_first && step == 0) {
              opt.zero_grad();
              auto guard = ddp->no_sync();
              nn::functional::cross_entropy((*ddp)(local.x), local.y.to(device)).backward();
              continue;
            }
            if (!(scenario.no_sync_first && step == 1)) opt.zero_grad();
            Tensor out = (*ddp)(local.x);
            if (out.device() != device) {
              return absl::InternalError(absl::StrCat("the output is on ", out.device().str(),
                                                      ", expected ", device.str()));
            }
            nn::functional::cross_entropy(out, local.y.to(device)).backward();
            opt.step();
          }
          if (scenario.perturb_buffer) {
            const double scale = model->buffer("scale").cpu().item<double>();
            if (scale != 1.0) {
              return absl::InternalError(
                  absl::StrCat("the buffer is ", scale, " after forward, rank 0 has 1"));
            }
          }
          extra_grad_defined[me.rank] = model->extra->parameter("weight").grad().defined();
          trained[me.rank] = HostCopies(*model);
          return absl::OkStatus();
        });
      },
      rank_options));

  // The reference: the whole batch in one module.
  reference->use_extra = !scenario.unused_head;
  nn::optim::SGD ref_opt(reference->parameters(), {.lr = 0.1});
  const Device d0 = device_of(0);
  for (int step = 0; step < scenario.steps; ++step) {
    const Batch global = GlobalBatch(step, d0);
    if (!(scenario.no_sync_first && step == 1)) ref_opt.zero_grad();
    nn::functional::cross_entropy((*reference)(global.x), global.y).backward();
    if (scenario.no_sync_first && step == 0) continue;
    ref_opt.step();
  }
  const std::vector<Tensor> expected = HostCopies(*reference);
  const auto names = reference->named_parameters();
  for (int r = 0; r < world; ++r) {
    if (scenario.unused_head && extra_grad_defined[r]) {
      return absl::InternalError(
          absl::StrCat("rank ", r, ": a parameter no rank used got a gradient"));
    }
    for (size_t i = 0; i < expected.size(); ++i) {
      const double diff = (trained[r][i] - expected[i]).abs().max().item<double>();
      const double scale = std::max(expected[i].abs().max().item<double>(), 1e-6);
      if (!(diff <= kRelativeTolerance * scale)) {
        return absl::InternalError(absl::StrCat("rank ", r, " on ", device_of(r).str(), ": ",
                                                names[i].first, " differs from one process by ",
                                                diff, " (relative ", diff / scale, ")"));
      }
      const double spread = (trained[r][i] - trained[0][i]).abs().max().item<double>();
      if (spread != 0) {
        return absl::InternalError(absl::StrCat("rank ", r, " and rank 0 differ by ", spread,
                                                " in ", names[i].first));
      }
    }
  }
  return absl::OkStatus();
}

// The scenarios every configuration runs.
std::vector<std::pair<std::string, Scenario>> Scenarios() {
  return {
      {"several buckets", {.options = {.bucket_cap_mb = 0.0001}}},
      {"default buckets", {.options = {}}},
      {"gradient_as_bucket_view",
       {.options = {.bucket_cap_mb = 0.0001, .gradient_as_bucket_view = true}}},
      {"no_sync", {.options = {.bucket_cap_mb = 0.0001}, .no_sync_first = true}},
      {"find_unused_parameters",
       {.options = {.bucket_cap_mb = 0.0001, .find_unused_parameters = true},
        .unused_head = true}},
      {"broadcast_buffers", {.options = {}, .perturb_buffer = true}},
  };
}

void RunAll(const std::string& backend, int world, const std::function<Device(int)>& device_of) {
  for (const auto& [name, scenario] : Scenarios()) {
    const absl::Status s = TrainAndCompare(backend, world, device_of, scenario);
    EXPECT_TRUE(s.ok()) << backend << ", " << world << " ranks, " << name << ": " << s;
  }
}

TEST(DdpCudaTest, NcclWorldSizeOneOnCuda0MatchesOneProcess) {
  RunAll("gloo", 1, [](int) { return Device(kCPU); });  // the CPU side
  EMBER_SKIP_WITHOUT_GPUS(1);
  RunAll("nccl", 1, [](int) { return Cuda(0); });
}

TEST(DdpCudaTest, GlooTwoRanksSharingCuda0MatchOneProcess) {
  RunAll("gloo", 2, [](int) { return Device(kCPU); });
  EMBER_SKIP_WITHOUT_GPUS(1);
  RunAll("gloo", 2, [](int) { return Cuda(0); });
}

TEST(DdpCudaTest, NcclOneRankPerGpuMatchesOneProcess) {
  EMBER_SKIP_WITHOUT_GPUS(2);
  const int n = std::min(cuda::device_count(), 4);
  RunAll("nccl", n, [](int r) { return Cuda(r); });
}

// create()'s checks of devices, on one rank; returns each call's error.
std::vector<std::string> CreateErrors(
    const std::string& backend,
    const std::vector<std::pair<std::shared_ptr<nn::Module>, DistributedDataParallelOptions>>&
        calls) {
  std::vector<std::string> errors;
  testing::RunRanksOptions options;
  options.backend = backend;
  const absl::Status s = testing::RunRanks(
      1,
      [&](testing::Rank& me) -> absl::Status {
        for (auto [module, o] : calls) {
          o.process_group = me.group;
          auto made = DistributedDataParallel::create(module, o);
          errors.push_back(made.ok() ? "ok" : std::string(made.status().message()));
        }
        return absl::OkStatus();
      },
      options);
  EXPECT_TRUE(s.ok()) << s;
  return errors;
}

TEST(DdpCudaTest, DeviceIdsAndOutputDeviceAsTorchTakesThem) {
  // The CPU side: a CPU module takes neither.
  {
    const auto errors = CreateErrors(
        "gloo", {{std::make_shared<Net>(), {.device_ids = {Cuda(0)}}},
                 {std::make_shared<Net>(), {.output_device = Device(kCPU)}},
                 {std::make_shared<Net>(), {}}});
    ASSERT_EQ(errors.size(), 3u);
    EXPECT_THAT(errors[0], HasSubstr("device_ids and output_device only work with a module on "
                                     "one GPU, but got device_ids [cuda:0], output_device unset "
                                     "for a module on cpu"));
    EXPECT_THAT(errors[1], HasSubstr("output_device cpu for a module on cpu"));
    EXPECT_EQ(errors[2], "ok");
  }
  EMBER_SKIP_WITHOUT_GPUS(1);
  auto on = [](Device d) {
    auto m = std::make_shared<Net>();
    m->to(d);
    return m;
  };
  auto spanning = std::make_shared<Net>();
  spanning->fc2->to(Cuda(0));  // fc1, extra and the buffer stay on the CPU
  const auto errors =
      CreateErrors("gloo", {{spanning, {}},
                            {on(Cuda(0)), {.device_ids = {Cuda(0), Cuda(1)}}},
                            {on(Cuda(0)), {.device_ids = {Cuda(1)}}},
                            {on(Cuda(0)), {.device_ids = {Cuda(0)}}},
                            {on(Cuda(0)), {}}});
  ASSERT_EQ(errors.size(), 5u);
  EXPECT_THAT(errors[0], HasSubstr("the module's parameters and buffers span devices [cpu, "
                                   "cuda:0] ('fc1.weight' on cpu, 'fc2.weight' on cuda:0)"));
  EXPECT_THAT(errors[1], HasSubstr("device_ids can only be empty or hold a single device (one "
                                   "device per process), got [cuda:0, cuda:1]"));
  EXPECT_THAT(errors[2],
              HasSubstr("device_ids [cuda:1] does not match the module's device cuda:0"));
  EXPECT_EQ(errors[3], "ok");
  EXPECT_EQ(errors[4], "ok");

  // Inputs go to device_ids[0]; the output to output_device.
  testing::RunRanksOptions options;
  options.backend = "nccl";
  const absl::Status s = testing::RunRanks(
      1,
      [&](testing::Rank& me) {
        return Guard([&]() -> absl::Status {
          EMBER_ASSIGN_OR_RETURN(
              auto ddp, DistributedDataParallel::create(on(Cuda(0)),
                                                        {.device_ids = {Cuda(0)},
                                                         .output_device = Device(kCPU),
                                                         .process_group = me.group}));
          const Batch b = GlobalBatch(0, kCPU);
          Tensor out = (*ddp)(b.x);
          if (!out.is_cpu()) return absl::InternalError("the output is not on output_device");
          nn::functional::cross_entropy(out, b.y).backward();
          for (const Tensor& p : ddp->module()->parameters()) {
            if (!p.grad().defined() || p.grad().device() != Cuda(0)) {
              return absl::InternalError("a gradient is missing or not on cuda:0");
            }
          }
          return absl::OkStatus();
        });
      },
      options);
  EXPECT_TRUE(s.ok()) << s;
}

// DDP over nccl inside a step captured into a CUDA graph (Note [Capturing a
// graph] in cuda/graphs.h): with gradient_as_bucket_view, replays of the
// captured step (forward, backward with its bucket all-reduces, a capturable
// SGD step) give the parameters of the same steps run eagerly, bit for bit.
TEST(DdpCudaTest, NcclInsideACapturedStepMatchesEagerSteps) {
  if (cuda::device_count() < 1) {
    GTEST_SKIP() << "needs a CUDA device: " << cuda::unavailable_reason();
  }
  testing::RunRanksOptions options;
  options.backend = "nccl";
  const absl::Status s = testing::RunRanks(
      1,
      [&](testing::Rank& me) {
        return Guard([&]() -> absl::Status {
          auto make = [&]() -> absl::StatusOr<std::shared_ptr<DistributedDataParallel>> {
            manual_seed(3);
            auto net = std::make_shared<Net>();
            net->use_extra = false;
            net->to(Cuda(0));
            return DistributedDataParallel::create(net, {.process_group = me.group,
                                                         .find_unused_parameters = true,
                                                         .gradient_as_bucket_view = true});
          };
          EMBER_ASSIGN_OR_RETURN(auto graphed, make());
          EMBER_ASSIGN_OR_RETURN(auto eager, make());
          nn::optim::SGD opt(graphed->parameters(),
                             {.lr = 0.05, .momentum = 0.9, .capturable = true});
          nn::optim::SGD eager_opt(eager->parameters(),
                                   {.lr = 0.05, .momentum = 0.9, .capturable = true});
          auto step = [](DistributedDataParallel& m, nn::optim::SGD& o, const Batch& b) {
            o.zero_grad(/*set_to_none=*/false);
            nn::functional::cross_entropy(m(b.x), b.y).backward();
            o.step();
          };
          Batch static_batch = GlobalBatch(0, Cuda(0));
          for (int k = 0; k < 2; ++k) {  // the momentum buffers exist before the capture
            step(*graphed, opt, GlobalBatch(k, Cuda(0)));
            step(*eager, eager_opt, GlobalBatch(k, Cuda(0)));
          }
          cuda::CUDAGraph g;
          {
            cuda::graph capture(g);
            step(*graphed, opt, static_batch);
          }
          EMBER_RETURN_IF_ERROR(cuda::capture_status_of(g));
          for (int k = 2; k < 6; ++k) {
            const Batch b = GlobalBatch(k, Cuda(0));
            static_batch.x.copy_(b.x);
            static_batch.y.copy_(b.y);
            EMBER_RETURN_IF_ERROR(g.replay());
            step(*eager, eager_opt, b);
          }
          const std::vector<Tensor> a = HostCopies(*graphed), e = HostCopies(*eager);
          for (size_t i = 0; i < a.size(); ++i) {
            if (!a[i].equal(e[i])) {
              return absl::InternalError(absl::StrCat("parameter ", i, " differs from eager's"));
            }
          }
          return absl::OkStatus();
        });
      },
      options);
  EXPECT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace ember::parallel
