// DistributedDataParallel's cost on a GPU: the training step of
// torchvision's ResNet-18 (nn/models/resnet.h, 1000 classes, 3x224x224, fp32, SGD
// lr 0.01) on cuda:0 wrapped in DDP with one rank over nccl (world size 1),
// against the plain module's step, in the same iterations. What DDP adds is
// its own machinery: the gradient hooks, the copies into the buckets and
// back, the all_reduce launches (a single-rank NCCL all_reduce) and the
// end-of-backward wait on the caller's stream; the figure of issue 25 is
// ddp / plain <= 1.05.
//
//   bazel run -c opt //parallel:ddp_cuda_benchmark
//
// A step is zero_grad, forward, cross-entropy, backward and the optimizer's
// step, then a device synchronisation. Each iteration times one plain step
// and one DDP step, alternating which goes first, so that both see the same
// machine; both models start from the same weights and train on the same
// batch. Counters: plain_ms and ddp_ms (medians), ratio (ddp / plain), and
// the same as `ember-figure <name> <value>` lines for BENCHMARKS.md. Arguments:
// the batch size, and gradient_as_bucket_view (0/1). Without a usable device
// (or without the nccl backend) every case reports why and measures nothing.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "cuda/device.h"
#include "distributed/backend_registry.h"
#include "distributed/hash_store.h"
#include "nn/models/resnet.h"
#include "nn/loss.h"
#include "nn/optim/sgd.h"
#include "parallel/distributed_data_parallel.h"
#include "tensor/factories.h"

namespace ember::parallel {
namespace {

const Device kGpu(DeviceType::kCUDA, 0);
constexpr int64_t kImage = 224;
constexpr int64_t kClasses = 1000;
constexpr int kWarmupSteps = 5;

double Now() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

void Figure(const std::string& name, double value) {
  std::printf("ember-figure %s %.4f\n", name.c_str(), value);
  std::fflush(stdout);
}

// One step, through the device synchronisation; its time in ms.
double Step(nn::Module& model, nn::optim::SGD& opt, const Tensor& x, const Tensor& y) {
  const double start = Now();
  opt.zero_grad();
  nn::functional::cross_entropy(model(x), y).backward();
  opt.step();
  (void)cuda::synchronize(0);
  return Now() - start;
}

void BM_ResNet18DdpStepVsPlain(benchmark::State& state) {
  if (!cuda::is_available()) {
    state.SkipWithError(("no usable CUDA device: " + cuda::unavailable_reason()).c_str());
    return;
  }
  const int64_t batch = state.range(0);
  const bool as_view = state.range(1) != 0;
  absl::StatusOr<const distributed::BackendInfo*> nccl = distributed::find_backend("nccl");
  if (!nccl.ok()) {
    state.SkipWithError(std::string(nccl.status().message()).c_str());
    return;
  }
  absl::StatusOr<std::shared_ptr<distributed::ProcessGroup>> group = (*nccl)->create(
      {.store = std::make_shared<distributed::HashStore>(), .rank = 0, .size = 1});
  if (!group.ok()) {
    state.SkipWithError(absl::StrCat("nccl group: ", group.status().ToString()).c_str());
    return;
  }

  manual_seed(0);
  auto plain = std::make_shared<nn::models::ResNet18>(nn::models::ResNetOptions{.num_classes = kClasses});
  plain->to(kGpu);
  plain->train();
  std::shared_ptr<nn::Module> wrapped = plain->clone(kGpu);
  wrapped->train();
  absl::StatusOr<std::shared_ptr<DistributedDataParallel>> ddp = DistributedDataParallel::create(
      wrapped,
      {.device_ids = {kGpu}, .process_group = *group, .gradient_as_bucket_view = as_view});
  if (!ddp.ok()) {
    state.SkipWithError(absl::StrCat("DDP: ", ddp.status().ToString()).c_str());
    return;
  }
  nn::optim::SGD plain_opt(plain->parameters(), {.lr = 0.01});
  nn::optim::SGD ddp_opt((*ddp)->parameters(), {.lr = 0.01});
  const Tensor x = randn({batch, 3, kImage, kImage}).to(kGpu);
  const Tensor y = randint(0, kClasses, {batch}).to(kGpu);
  for (int i = 0; i < kWarmupSteps; ++i) {
    Step(*plain, plain_opt, x, y);
    Step(**ddp, ddp_opt, x, y);
  }
  std::vector<double> plain_ms, ddp_ms;
  bool plain_first = true;
  for (auto _ : state) {
    if (plain_first) {
      plain_ms.push_back(Step(*plain, plain_opt, x, y));
      ddp_ms.push_back(Step(**ddp, ddp_opt, x, y));
    } else {
      ddp_ms.push_back(Step(**ddp, ddp_opt, x, y));
      plain_ms.push_back(Step(*plain, plain_opt, x, y));
    }
    plain_first = !plain_first;
  }
  const double p = Median(plain_ms), d = Median(ddp_ms);
  state.counters["plain_ms"] = p;
  state.counters["ddp_ms"] = d;
  state.counters["ratio"] = d / p;
  const std::string tag =
      absl::StrCat("resnet18_b", batch, as_view ? "_bucket_view" : "", "_cuda0");
  Figure(tag + "_plain_step_ms", p);
  Figure(tag + "_ddp_step_ms", d);
  Figure(tag + "_ddp_over_plain", d / p);
}
BENCHMARK(BM_ResNet18DdpStepVsPlain)
    ->ArgNames({"batch", "bucket_view"})
    ->Args({64, 0})
    ->Args({64, 1})
    ->Args({16, 0})
    ->Iterations(30)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace ember::parallel
