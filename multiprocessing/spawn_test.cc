// Start methods, and children started with the spawn and forkserver methods
// (each case runs under both): what they are handed (queues, pipes, shared
// tensors, modules, plain values) and how their failures reach the parent.
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "multiprocessing/connection.h"
#include "multiprocessing/module_state.h"
#include "multiprocessing/process.h"
#include "multiprocessing/queue.h"
#include "multiprocessing/sharing.h"
#include "multiprocessing/testing.h"
#include "nn/linear.h"
#include "nn/optim/sgd.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"
#include "tensor/testing.h"

namespace ember::multiprocessing {
namespace {

using ::ember::testing::Values;
using ::testing::HasSubstr;

class SpawnedChildEnvironment : public ::testing::Environment {
 public:
  void SetUp() override { maybe_run_spawned_child(); }
};
const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new SpawnedChildEnvironment);

Tensor Inputs() { return arange(6).view({2, 3}).to(kFloat32); }

// One SGD step of `model` on a fixed batch.
void TrainStep(nn::Linear& model) {
  nn::optim::SGD opt(model.parameters(), {.lr = 0.1});
  opt.zero_grad();
  Tensor y = model.forward(Inputs());
  (y * y).sum().backward();
  opt.step();
}

// The arguments, in order: queue, pipe end, board, weight that requires
// grad, module state, 7, 2.5, "text", [1, "two"], {"k": 3}.
absl::Status UseEverythingEntry(int rank, absl::Span<const Value> args) {
  CHILD_CHECK(args.size() == 10);
  EMBER_ASSIGN_OR_RETURN(Queue answers, args[0].as<Queue>());
  EMBER_ASSIGN_OR_RETURN(Connection pipe, args[1].as<Connection>());
  EMBER_ASSIGN_OR_RETURN(Tensor board, args[2].as<Tensor>());
  EMBER_ASSIGN_OR_RETURN(Tensor w, args[3].as<Tensor>());
  CHILD_CHECK(args[5].as<int64_t>().value_or(0) == 7);
  CHILD_CHECK(args[6].as<double>().value_or(0) == 2.5);
  CHILD_CHECK(args[7].as<std::string>().value_or("") == "text");
  CHILD_CHECK(args[8].list().size() == 2 &&
              args[8].list()[1].as<std::string>().value_or("") == "two");
  CHILD_CHECK(args[9].find("k") != nullptr && args[9].find("k")->as<int64_t>().value_or(0) == 3);
  // A shared tensor: the parent sees the write.
  CHILD_CHECK(is_shared(board));
  board.select(0, rank).fill_(rank + 1);
  // A pipe: one message per rank is waiting.
  EMBER_ASSIGN_OR_RETURN(Value hello, pipe.recv(absl::Seconds(20)));
  CHILD_CHECK(hello.as<std::string>().value_or("") == "hello through a pipe");
  // requires_grad and leaf-ness survive; the gradient is this process's.
  CHILD_CHECK(w.requires_grad() && w.is_leaf() && !w.grad().defined());
  (w * w).sum().backward();
  const double grad_sum = w.grad().sum().item<double>();
  // A module: a differently initialised one of the same architecture,
  // rebuilt onto the parent's shared parameters; rank 0 trains a step.
  manual_seed(1000 + rank);
  auto model = std::make_shared<nn::Linear>(3, 1);
  EMBER_RETURN_IF_ERROR(load_shared_state(model->state_dict(), args[4]));
  CHILD_CHECK(model->weight().requires_grad() && model->weight().is_leaf());
  if (rank == 0) TrainStep(*model);
  // A queue: the answer.
  return answers.put(Value(Value::List{rank, grad_sum}), absl::Seconds(20));
}
EMBER_REGISTER_ENTRY_POINT("use_everything", UseEverythingEntry);

// The start methods that send their children's arguments.
const auto kSendingMethods = ::testing::Values("spawn", "forkserver");
std::string MethodName(const ::testing::TestParamInfo<std::string>& info) { return info.param; }

// (sharing strategy, start method)
class SpawnCarriesTest : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {
 protected:
  void SetUp() override {
    ASSERT_TRUE(set_sharing_strategy(std::get<0>(GetParam())).ok());
    ASSERT_TRUE(set_shared_memory_prefix(testing::UniquePrefix("spawn")).ok());
  }
  void TearDown() override { ASSERT_TRUE(set_sharing_strategy("file_descriptor").ok()); }
};

TEST_P(SpawnCarriesTest, QueuesPipesTensorsModulesAndValuesReachSpawnedChildren) {
  absl::StatusOr<Queue> answers = Queue::create();
  ASSERT_TRUE(answers.ok()) << answers.status();
  auto pipe = Pipe();
  ASSERT_TRUE(pipe.ok()) << pipe.status();
  Tensor board = zeros({4});
  Tensor w = full({3}, 2.0);
  w.requires_grad_();
  manual_seed(1);
  auto model = std::make_shared<nn::Linear>(3, 1);
  ASSERT_TRUE(model->share_memory().ok());
  absl::StatusOr<Value> state = share_state(model->state_dict());
  ASSERT_TRUE(state.ok()) << state.status();
  manual_seed(1);
  nn::Linear expected(3, 1);
  TrainStep(expected);
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(pipe->first.send(Value("hello through a pipe")).ok());

  absl::StatusOr<Context> ctx = get_context(std::get<1>(GetParam()));
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  SpawnOptions options;
  options.timeout = absl::Seconds(120);
  absl::Status s =
      ctx->spawn("use_everything",
                 {Value(*answers), Value(pipe->second), Value(board), Value(w), *state, Value(7),
                  Value(2.5), Value("text"), Value(Value::List{Value(1), Value("two")}),
                  Value(Value::Dict{{"k", Value(3)}})},
                 2, options);
  ASSERT_TRUE(s.ok()) << s;
  std::vector<double> grads(2, -1);
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<Value> a = answers->get(absl::Seconds(20));
    ASSERT_TRUE(a.ok()) << a.status();
    grads[a->list()[0].as<int64_t>().value()] = a->list()[1].as<double>().value();
  }
  EXPECT_EQ(grads, (std::vector<double>{12, 12}));  // d/dw sum(w*w) = 2w = 4 each
  EXPECT_FALSE(w.grad().defined());
  EXPECT_EQ(Values(board), (std::vector<double>{1, 2, 0, 0}));
  EXPECT_EQ(Values(model->weight()), Values(expected.weight()));
  EXPECT_EQ(Values(model->bias()), Values(expected.bias()));
}

INSTANTIATE_TEST_SUITE_P(BothStrategiesBothMethods, SpawnCarriesTest,
                         ::testing::Combine(::testing::Values("file_descriptor", "file_system"),
                                            kSendingMethods),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + std::get<1>(info.param);
                         });

// Each case runs under the start method given as the parameter.
class SpawnErrorsTest : public ::testing::TestWithParam<std::string> {};
INSTANTIATE_TEST_SUITE_P(BothMethods, SpawnErrorsTest, kSendingMethods, MethodName);

// args[0]: how rank 1 fails ("status", "throw" or "exit"); rank 0 waits.
absl::Status FailOnRankOneEntry(int rank, absl::Span<const Value> args) {
  if (rank != 1) {
    absl::SleepFor(absl::Seconds(60));
    return absl::OkStatus();
  }
  const std::string how = args.empty() ? "" : args[0].as<std::string>().value_or("");
  if (how == "status") return absl::InvalidArgumentError("loss is NaN at step 7");
  if (how == "throw") throw std::runtime_error("shape mismatch [2, 3] vs [3]");
  if (how == "exit") std::_Exit(3);
  return absl::OkStatus();
}
EMBER_REGISTER_ENTRY_POINT("fail_on_rank_one", FailOnRankOneEntry);

absl::Status SpawnFailing(const std::string& method, const std::string& how) {
  absl::StatusOr<Context> ctx = get_context(method);
  if (!ctx.ok()) return ctx.status();
  SpawnOptions options;
  options.timeout = absl::Seconds(120);
  options.terminate_grace = absl::Milliseconds(200);
  return ctx->spawn("fail_on_rank_one", {Value(how)}, 2, options);
}

TEST_P(SpawnErrorsTest, ChildFailuresNameTheRankAndMessage) {
  const absl::Time start = absl::Now();
  EXPECT_EQ(SpawnFailing(GetParam(), "status").message(),
            "process 1 terminated with exit code 1: loss is NaN at step 7");
  EXPECT_EQ(SpawnFailing(GetParam(), "throw").message(),
            "process 1 terminated with exit code 1: uncaught exception: shape mismatch [2, 3] vs "
            "[3]");
  EXPECT_EQ(SpawnFailing(GetParam(), "exit").message(), "process 1 terminated with exit code 3");
  // Rank 0 sleeps a minute: it was stopped, not waited for.
  EXPECT_LT(absl::Now() - start, absl::Seconds(60));
}

// Puts (rank, pid) on args[0], then waits.
absl::Status ReportPidEntry(int rank, absl::Span<const Value> args) {
  EMBER_ASSIGN_OR_RETURN(Queue q, args[0].as<Queue>());
  EMBER_RETURN_IF_ERROR(q.put(Value(Value::List{rank, static_cast<int64_t>(::getpid())})));
  absl::SleepFor(absl::Seconds(60));
  return absl::OkStatus();
}
EMBER_REGISTER_ENTRY_POINT("report_pid", ReportPidEntry);

bool IsGone(int64_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;
  size_t paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] == 'Z';
}

TEST_P(SpawnErrorsTest, ASigkilledChildIsReportedAndTheOthersStopped) {
  absl::StatusOr<Queue> pids = Queue::create();
  ASSERT_TRUE(pids.ok());
  std::vector<int64_t> by_rank(3, -1);
  std::thread killer([&] {
    for (int i = 0; i < 3; ++i) {
      absl::StatusOr<Value> v = pids->get(absl::Seconds(30));
      if (!v.ok()) return;
      by_rank[v->list()[0].as<int64_t>().value()] = v->list()[1].as<int64_t>().value();
    }
    ::kill(static_cast<pid_t>(by_rank[1]), SIGKILL);
  });
  absl::StatusOr<Context> ctx = get_context(GetParam());
  ASSERT_TRUE(ctx.ok());
  SpawnOptions options;
  options.timeout = absl::Seconds(120);
  options.terminate_grace = absl::Milliseconds(200);
  absl::Status s = ctx->spawn("report_pid", {Value(*pids)}, 3, options);
  killer.join();
  EXPECT_EQ(s.message(), "process 1 terminated with signal SIGKILL");
  for (int64_t pid : by_rank) {
    ASSERT_GT(pid, 0);
    EXPECT_TRUE(IsGone(pid)) << pid;
  }
}

TEST_P(SpawnErrorsTest, UnsendableArgumentsAreRefusedNamingTheRank) {
  Tensor w = ones({3});
  w.requires_grad_();
  absl::StatusOr<Context> ctx = get_context(GetParam());
  ASSERT_TRUE(ctx.ok());
  absl::StatusOr<Process> p = ctx->process("report_pid", {Value(w * 2)}, /*rank=*/4);
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(p.status().message(), HasSubstr("sending the arguments to process 4"));
  EXPECT_THAT(p.status().message(), HasSubstr("non-leaf tensor that requires grad"));
}

// Answers args[1] * 2 on the queue args[0].
absl::Status DoubleEntry(int rank, absl::Span<const Value> args) {
  EMBER_ASSIGN_OR_RETURN(Queue q, args[0].as<Queue>());
  EMBER_ASSIGN_OR_RETURN(int64_t x, args[1].as<int64_t>());
  return q.put(Value(Value::List{rank, 2 * x}));
}
EMBER_REGISTER_ENTRY_POINT("double", DoubleEntry);

TEST(StartMethodTest, SetOnceThenOnlyWithForce) {
  // Nothing else in this binary sets or fixes the process-wide method.
  EXPECT_EQ(get_start_method(/*allow_none=*/true), "");
  EXPECT_THAT(get_all_start_methods(), ::testing::ElementsAre("fork", "spawn", "forkserver"));
  absl::Status bad = set_start_method("fork_server");
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.message(),
              HasSubstr("'fork_server'; valid start methods: fork, spawn, forkserver"));
  EXPECT_EQ(get_start_method(true), "");
  ASSERT_TRUE(set_start_method("spawn").ok());
  EXPECT_EQ(get_start_method(), "spawn");
  absl::Status again = set_start_method("fork");
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(again.message(), HasSubstr("context has already been set (to 'spawn')"));
  absl::StatusOr<Context> ctx = get_context();
  ASSERT_TRUE(ctx.ok());
  EXPECT_EQ(ctx->get_start_method(), "spawn");
  ASSERT_TRUE(set_start_method("forkserver", /*force=*/true).ok());
  EXPECT_EQ(get_context()->get_start_method(), "forkserver");
  ASSERT_TRUE(set_start_method("fork", /*force=*/true).ok());
  EXPECT_EQ(get_start_method(), "fork");
  EXPECT_EQ(get_context("bogus").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(StartMethodTest, EachContextStartsChildrenWithItsMethod) {
  for (const std::string& method : get_all_start_methods()) {
    absl::StatusOr<Context> ctx = get_context(method);
    ASSERT_TRUE(ctx.ok());
    absl::StatusOr<Queue> q = Queue::create();
    ASSERT_TRUE(q.ok());
    absl::StatusOr<Process> p = ctx->process("double", {Value(*q), Value(21)}, /*rank=*/5);
    ASSERT_TRUE(p.ok()) << method << ": " << p.status();
    absl::StatusOr<Value> v = q->get(absl::Seconds(20));
    ASSERT_TRUE(v.ok()) << method << ": " << v.status();
    EXPECT_EQ(v->list()[0].as<int64_t>().value(), 5);
    EXPECT_EQ(v->list()[1].as<int64_t>().value(), 42);
    absl::StatusOr<ExitStatus> e = p->join(absl::Seconds(20));
    ASSERT_TRUE(e.ok() && e->ok()) << method << ": " << p->error_message();
    absl::Status s = ctx->spawn("double", {Value(*q), Value(1)}, 3);
    ASSERT_TRUE(s.ok()) << method << ": " << s;
    int64_t ranks = 0;
    for (int i = 0; i < 3; ++i) {
      absl::StatusOr<Value> r = q->get(absl::Seconds(20));
      ASSERT_TRUE(r.ok());
      ranks += r->list()[0].as<int64_t>().value();
    }
    EXPECT_EQ(ranks, 0 + 1 + 2);
    EXPECT_EQ(ctx->process("no_such_entry").status().code(), absl::StatusCode::kNotFound);
  }
}

TEST(ModuleStateTest, AMismatchedArchitectureIsNamedAndNothingChanges) {
  auto parent = std::make_shared<nn::Linear>(3, 1);
  absl::StatusOr<Value> state = share_state(parent->state_dict());
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_TRUE(is_shared(parent->weight()));
  nn::Linear wider(4, 1);
  const std::vector<double> before = Values(wider.weight());
  absl::Status s = load_shared_state(wider.state_dict(), *state);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("'weight' is float32 [1, 3] in the shared state but float32 "
                                     "[1, 4] here"));
  EXPECT_FALSE(is_shared(wider.weight()));
  EXPECT_EQ(Values(wider.weight()), before);
  nn::Linear no_bias(3, 1, /*bias=*/false);
  EXPECT_THAT(load_shared_state(no_bias.state_dict(), *state).message(),
              HasSubstr("unexpected key 'bias'"));
}

class SpawnLeakTest : public ::testing::TestWithParam<std::string> {};
INSTANTIATE_TEST_SUITE_P(BothMethods, SpawnLeakTest, kSendingMethods, MethodName);

TEST_P(SpawnLeakTest, RepeatedSpawnsLeakNoDescriptorsOrRegions) {
  const std::string prefix = testing::UniquePrefix("spawnleak");
  ASSERT_TRUE(set_shared_memory_prefix(prefix).ok());
  auto run_once = [&] {
    absl::StatusOr<Queue> q = Queue::create();
    ASSERT_TRUE(q.ok());
    auto pipe = Pipe();
    ASSERT_TRUE(pipe.ok());
    Tensor board = zeros({4});
    Tensor w = full({3}, 2.0);
    w.requires_grad_();
    auto model = std::make_shared<nn::Linear>(3, 1);
    ASSERT_TRUE(model->share_memory().ok());
    absl::StatusOr<Value> state = share_state(model->state_dict());
    ASSERT_TRUE(state.ok());
    ASSERT_TRUE(pipe->first.send(Value("hello through a pipe")).ok());
    absl::StatusOr<Context> ctx = get_context(GetParam());
    ASSERT_TRUE(ctx.ok());
    absl::Status s =
        ctx->spawn("use_everything",
                   {Value(*q), Value(pipe->second), Value(board), Value(w), *state, Value(7),
                    Value(2.5), Value("text"), Value(Value::List{Value(1), Value("two")}),
                    Value(Value::Dict{{"k", Value(3)}})},
                   1);
    ASSERT_TRUE(s.ok()) << s;
    ASSERT_TRUE(q->get(absl::Seconds(20)).ok());
  };
  for (const std::string strategy : {"file_descriptor", "file_system"}) {
    ASSERT_TRUE(set_sharing_strategy(strategy).ok());
    run_once();  // warms up: the manager connection, thread-locals, the forkserver
    empty_shared_memory_cache();
    const int fds = testing::OpenFdCount();
    for (int rep = 0; rep < 5; ++rep) {
      run_once();
      empty_shared_memory_cache();
      ASSERT_EQ(testing::OpenFdCount(), fds) << strategy << " repetition " << rep;
      ASSERT_TRUE(testing::WaitUntil([&] { return testing::ShmEntries(prefix).empty(); },
                                     absl::Seconds(10)))
          << strategy << " repetition " << rep << ": " << testing::ShmEntries(prefix).size()
          << " regions left";
    }
  }
  ASSERT_TRUE(set_sharing_strategy("file_descriptor").ok());
}

}  // namespace
}  // namespace ember::multiprocessing
