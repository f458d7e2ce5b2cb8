// The engine's worker threads (Note [Device workers] in engine.cc), run on
// the CPU: with SetCpuNodesOnWorkerForTesting the CPU nodes go to a worker of
// their own, so the hand-off between threads, errors raised on a worker,
// re-entrant backward from a worker, hooks and callbacks run here without a
// device. The CUDA cases (streams, one worker per GPU) are in
// engine_cuda_test.cc.
#include "autograd/engine.h"

#include <atomic>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "autograd/function.h"
#include "autograd/node.h"
#include "autograd/variable.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/testing.h"

namespace ember::autograd {
namespace {

using ::ember::testing::ErrorOf;
using ::ember::testing::Make;
using ::ember::testing::Values;
using ::testing::DoubleNear;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pointwise;

// Runs the scope's backward calls with CPU nodes on the engine's worker.
class CpuNodesOnWorker {
 public:
  CpuNodesOnWorker() { internal::SetCpuNodesOnWorkerForTesting(true); }
  ~CpuNodesOnWorker() { internal::SetCpuNodesOnWorkerForTesting(false); }
};

// Records the thread each backward runs on.
struct ThreadRecorder {
  std::mutex mutex;
  std::set<std::thread::id> threads;
  void Add() {
    std::lock_guard<std::mutex> lock(mutex);
    threads.insert(std::this_thread::get_id());
  }
};

ThreadRecorder* g_recorder = nullptr;

// y = x * 3, whose backward notes its thread.
struct Triple : Function<Triple> {
  static Tensor forward(AutogradContext*, const Tensor& x) { return x * 3.0; }
  static variable_list backward(AutogradContext*, variable_list grads) {
    if (g_recorder != nullptr) g_recorder->Add();
    return {grads[0] * 3.0};
  }
};

struct Fails : Function<Fails> {
  static Tensor forward(AutogradContext*, const Tensor& x) { return x.clone(); }
  static variable_list backward(AutogradContext*, variable_list) {
    EMBER_FAIL("backward of Fails refused its gradient");
  }
};

// A backward that differentiates an inner graph itself (re-entrant backward).
struct ReentrantSquare : Function<ReentrantSquare> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x) {
    ctx->save_for_backward({x});
    return x * x;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    Tensor x = ctx->get_saved_variables()[0].detach().requires_grad_();
    Tensor inner;
    {
      EnableGradGuard enable;
      inner = (x * x).sum();
    }
    variable_list dx = grad({inner}, {x});  // 2 * x, computed by a nested backward
    return {grads[0] * dx[0]};
  }
};

// A graph with branches, broadcasting and a shared input.
std::vector<double> BranchyGrad(const Tensor& x0, const Tensor& w0) {
  Tensor x = x0.clone().requires_grad_();
  Tensor w = w0.clone().requires_grad_();
  Tensor a = x.mm(w).tanh();
  Tensor b = (x * 2).sum({1}, true);  // [4, 1], broadcast below
  Tensor loss = (a * b + Triple::apply(a)).sigmoid().sum() + w.pow(2).sum();
  loss.backward();
  std::vector<double> out = Values(x.grad());
  for (double v : Values(w.grad())) out.push_back(v);
  return out;
}

TEST(EngineWorkerTest, GradientsOnTheWorkerMatchTheCallingThread) {
  const Tensor x = randn({4, 3}, TensorOptions(kFloat64));
  const Tensor w = randn({3, 5}, TensorOptions(kFloat64));
  ThreadRecorder caller_side;
  g_recorder = &caller_side;
  std::vector<double> on_caller = BranchyGrad(x, w);
  std::vector<double> on_worker;
  ThreadRecorder worker_side;
  {
    CpuNodesOnWorker workers;
    g_recorder = &worker_side;
    on_worker = BranchyGrad(x, w);
  }
  g_recorder = nullptr;
  ASSERT_EQ(on_caller.size(), 4u * 3 + 3 * 5);
  EXPECT_THAT(on_worker, Pointwise(DoubleNear(1e-12), on_caller));
  // Without workers the node ran on this thread; with them, on another one.
  EXPECT_THAT(caller_side.threads, ElementsAre(std::this_thread::get_id()));
  ASSERT_EQ(worker_side.threads.size(), 1u);
  EXPECT_NE(*worker_side.threads.begin(), std::this_thread::get_id());
}

TEST(EngineWorkerTest, AnErrorOnTheWorkerReachesTheCaller) {
  CpuNodesOnWorker workers;
  Tensor x = Make({1, 2, 3}, {3}, kFloat64).requires_grad_();
  Tensor y = (Fails::apply(x * 2) + x).sum();
  EXPECT_THAT(ErrorOf([&] { y.backward(); }), HasSubstr("backward of Fails refused"));
  // The engine and its worker are still usable, and the graph is released
  // by the failed run (x's other branch may or may not have accumulated).
  Tensor z = Make({1, 2, 3}, {3}, kFloat64).requires_grad_();
  (z * z).sum().backward();
  EXPECT_THAT(Values(z.grad()), ElementsAre(2, 4, 6));
}

TEST(EngineWorkerTest, ReentrantBackwardFromAWorkerNode) {
  CpuNodesOnWorker workers;
  Tensor x = Make({1, -2, 3}, {3}, kFloat64).requires_grad_();
  // d/dx sum(x^2 * 5) = 10 x, with x^2's backward running a nested grad().
  (ReentrantSquare::apply(x) * 5.0).sum().backward();
  EXPECT_THAT(Values(x.grad()), ElementsAre(10, -20, 30));
}

TEST(EngineWorkerTest, HooksRunOnTheWorkerAndCallbacksOnTheCaller) {
  CpuNodesOnWorker workers;
  Tensor x = Make({1, 2}, {2}, kFloat64).requires_grad_();
  Tensor y = x * 4.0;
  std::atomic<bool> hook_off_caller{false};
  std::thread::id callback_thread;
  const std::thread::id caller = std::this_thread::get_id();
  RegisterHook(y, [&](const Tensor& g) {
    hook_off_caller = std::this_thread::get_id() != caller;
    queue_callback([&] { callback_thread = std::this_thread::get_id(); });
    return g * 10.0;
  });
  y.sum().backward();
  EXPECT_THAT(Values(x.grad()), ElementsAre(40, 40));
  EXPECT_TRUE(hook_off_caller);
  EXPECT_EQ(callback_thread, caller);
}

TEST(EngineWorkerTest, GradCapturesOnTheWorker) {
  CpuNodesOnWorker workers;
  Tensor x = Make({1, 2, 3}, {3}, kFloat64).requires_grad_();
  Tensor h = x.exp();
  Tensor loss = (h * h).sum();
  variable_list g = grad({loss}, {h, x}, {}, /*retain_graph=*/true);
  ASSERT_EQ(g.size(), 2u);
  const std::vector<double> hv = Values(h.detach());
  EXPECT_THAT(Values(g[0]), Pointwise(DoubleNear(1e-12), std::vector<double>{
                                                             2 * hv[0], 2 * hv[1], 2 * hv[2]}));
  EXPECT_THAT(Values(g[1]), Pointwise(DoubleNear(1e-9), std::vector<double>{
                                                            2 * hv[0] * hv[0], 2 * hv[1] * hv[1],
                                                            2 * hv[2] * hv[2]}));
  EXPECT_FALSE(x.grad().defined()) << "grad() does not accumulate";
}

TEST(EngineWorkerTest, ConcurrentBackwardCallsShareTheWorker) {
  CpuNodesOnWorker workers;
  constexpr int kThreads = 4;
  std::vector<std::vector<double>> results(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t, &results] {
      for (int round = 0; round < 20; ++round) {
        Tensor x = Make({1.0 + t, 2.0}, {2}, kFloat64).requires_grad_();
        Tensor y = x;
        for (int i = 0; i < 10; ++i) y = y * 2.0 + x;
        y.sum().backward();
        results[t] = Values(x.grad());
      }
    });
  }
  for (std::thread& th : threads) th.join();
  // y_i = 2 y_{i-1} + x, y_0 = x: dy_10/dx = 2^10 + (2^10 - 1) = 2047.
  for (int t = 0; t < kThreads; ++t) EXPECT_THAT(results[t], ElementsAre(2047, 2047));
}

TEST(EngineWorkerTest, CreateGraphOnTheWorkerGivesSecondDerivatives) {
  CpuNodesOnWorker workers;
  Tensor x = Make({0.5, -1.0}, {2}, kFloat64).requires_grad_();
  Tensor y = (x * x * x).sum();
  variable_list g = grad({y}, {x}, {}, std::nullopt, /*create_graph=*/true);
  g[0].sum().backward();
  EXPECT_THAT(Values(x.grad()), ElementsAre(3.0, -6.0));  // d2/dx2 x^3 = 6 x
}

}  // namespace
}  // namespace ember::autograd
