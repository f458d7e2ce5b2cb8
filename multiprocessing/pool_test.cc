// Pool with real worker processes under every start method: results in
// order, tensors shared, task errors and dead workers reported through the
// results, maxtasksperchild, close / join / terminate, and misuse.
#include "multiprocessing/pool.h"

#include <signal.h>
#include <unistd.h>

#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "multiprocessing/process.h"
#include "multiprocessing/sharing.h"
#include "multiprocessing/synchronize.h"
#include "multiprocessing/testing.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"

namespace ember::multiprocessing {
namespace {

using ::testing::HasSubstr;

class SpawnedChildEnvironment : public ::testing::Environment {
 public:
  void SetUp() override { maybe_run_spawned_child(); }
};
const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new SpawnedChildEnvironment);

constexpr absl::Duration kLong = absl::Seconds(60);

absl::StatusOr<Value> Square(absl::Span<const Value> args) {
  EMBER_ASSIGN_OR_RETURN(int64_t x, args[0].as<int64_t>());
  return Value(x * x);
}
EMBER_REGISTER_POOL_FUNCTION("square", Square);

absl::StatusOr<Value> Add(absl::Span<const Value> args) {
  if (args.size() != 2) return absl::InvalidArgumentError("add takes 2 arguments");
  EMBER_ASSIGN_OR_RETURN(int64_t a, args[0].as<int64_t>());
  EMBER_ASSIGN_OR_RETURN(int64_t b, args[1].as<int64_t>());
  return Value(a + b);
}
EMBER_REGISTER_POOL_FUNCTION("add", Add);

// The worker's pid, after args[0] milliseconds (none when absent).
absl::StatusOr<Value> Pid(absl::Span<const Value> args) {
  if (!args.empty()) absl::SleepFor(absl::Milliseconds(args[0].as<int64_t>().value_or(0)));
  return Value(static_cast<int64_t>(::getpid()));
}
EMBER_REGISTER_POOL_FUNCTION("pid", Pid);

// Fails on item 3 with a status, on item 4 with an exception.
absl::StatusOr<Value> FailSome(absl::Span<const Value> args) {
  EMBER_ASSIGN_OR_RETURN(int64_t x, args[0].as<int64_t>());
  if (x == 3) return absl::InvalidArgumentError("bad item 3: expected an even learning rate");
  if (x == 4) throw std::runtime_error("shape mismatch [2, 3] vs [3]");
  return Value(x);
}
EMBER_REGISTER_POOL_FUNCTION("fail_some", FailSome);

// Kills its own worker.
absl::StatusOr<Value> Die(absl::Span<const Value> args) {
  ::raise(SIGKILL);
  return Value();
}
EMBER_REGISTER_POOL_FUNCTION("die", Die);

// args: tensor, value. Fills the tensor (shared with the parent) and returns
// it with its sum.
absl::StatusOr<Value> FillTensor(absl::Span<const Value> args) {
  EMBER_ASSIGN_OR_RETURN(Tensor t, args[0].as<Tensor>());
  EMBER_ASSIGN_OR_RETURN(double v, args[1].as<double>());
  t.fill_(v);
  return Value(Value::List{Value(t), Value(t.sum().item<double>())});
}
EMBER_REGISTER_POOL_FUNCTION("fill_tensor", FillTensor);

// args: lock, counter (int64 tensor). One locked read-modify-write.
absl::StatusOr<Value> LockedIncrement(absl::Span<const Value> args) {
  EMBER_ASSIGN_OR_RETURN(Lock lock, args[0].as<Lock>());
  EMBER_ASSIGN_OR_RETURN(Tensor counter, args[1].as<Tensor>());
  EMBER_RETURN_IF_ERROR(lock.acquire(kLong));
  int64_t* p = counter.data_ptr<int64_t>();
  const int64_t v = *p;
  ::sched_yield();
  *p = v + 1;
  EMBER_RETURN_IF_ERROR(lock.release());
  return Value();
}
EMBER_REGISTER_POOL_FUNCTION("locked_increment", LockedIncrement);

// A result larger than any message.
absl::StatusOr<Value> Huge(absl::Span<const Value> args) {
  return Value(std::string(size_t{1} << 20, 'x'));
}
EMBER_REGISTER_POOL_FUNCTION("huge", Huge);

class PoolTest : public ::testing::TestWithParam<std::string> {
 protected:
  absl::StatusOr<Pool> Make(int processes, std::optional<int> maxtasks = std::nullopt) {
    return Pool::create(
        {.processes = processes, .start_method = GetParam(), .maxtasksperchild = maxtasks});
  }
};
INSTANTIATE_TEST_SUITE_P(EveryStartMethod, PoolTest,
                         ::testing::Values("fork", "spawn", "forkserver"),
                         [](const auto& info) { return info.param; });

Value::List Ints(int n) {
  Value::List items;
  for (int i = 0; i < n; ++i) items.push_back(Value(i));
  return items;
}

TEST_P(PoolTest, MapStarmapAndApplyReturnResultsInOrder) {
  absl::StatusOr<Pool> pool = Make(2);
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_EQ(pool->processes(), 2);
  EXPECT_EQ(pool->pids().size(), 2u);
  for (int chunksize : {0, 1, 7, 1000}) {
    absl::StatusOr<Value::List> squares = pool->map("square", Ints(100), chunksize, kLong);
    ASSERT_TRUE(squares.ok()) << squares.status();
    ASSERT_EQ(squares->size(), 100u);
    for (int i = 0; i < 100; ++i) {
      EXPECT_EQ((*squares)[i].as<int64_t>().value(), int64_t{i} * i) << "chunksize " << chunksize;
    }
  }
  // One chunk of 60000 items, and its results, exceed a message: both are
  // split on the way.
  absl::StatusOr<Value::List> big = pool->map("square", Ints(60000), 60000, kLong);
  ASSERT_TRUE(big.ok()) << big.status();
  ASSERT_EQ(big->size(), 60000u);
  EXPECT_EQ((*big)[59999].as<int64_t>().value(), int64_t{59999} * 59999);
  EXPECT_EQ((*big)[30000].as<int64_t>().value(), int64_t{30000} * 30000);
  std::vector<Value::List> pairs;
  for (int i = 0; i < 10; ++i) pairs.push_back({Value(i), Value(100 * i)});
  absl::StatusOr<Value::List> sums = pool->starmap("add", pairs, 0, kLong);
  ASSERT_TRUE(sums.ok()) << sums.status();
  for (int i = 0; i < 10; ++i) EXPECT_EQ((*sums)[i].as<int64_t>().value(), 101 * i);
  absl::StatusOr<Value> one = pool->apply("add", {Value(2), Value(40)}, kLong);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->as<int64_t>().value(), 42);
  absl::StatusOr<Value::List> none = pool->map("square", {}, 0, kLong);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());

  absl::StatusOr<AsyncResult> r = pool->apply_async("pid", {Value(int64_t{200})});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->ready());
  EXPECT_TRUE(absl::IsFailedPrecondition(r->successful().status()));
  EXPECT_TRUE(absl::IsDeadlineExceeded(r->get(absl::Milliseconds(10)).status()));
  EXPECT_TRUE(r->wait(kLong).ok());
  EXPECT_TRUE(r->ready());
  EXPECT_TRUE(r->successful().value());
  const std::vector<pid_t> pids = pool->pids();
  EXPECT_THAT(pids, ::testing::Contains(static_cast<pid_t>(r->get().value().as<int64_t>().value())));
  pool->close();
  EXPECT_TRUE(pool->join(kLong).ok());
}

TEST_P(PoolTest, TensorsTravelAsSharedMemory) {
  absl::StatusOr<Pool> pool = Make(2);
  ASSERT_TRUE(pool.ok()) << pool.status();
  std::vector<Value::List> args;
  std::vector<Tensor> tensors;
  for (int i = 0; i < 6; ++i) {
    tensors.push_back(zeros({4}));
    args.push_back({Value(tensors.back()), Value(double(i + 1))});
  }
  absl::StatusOr<Value::List> out = pool->starmap("fill_tensor", args, 1, kLong);
  ASSERT_TRUE(out.ok()) << out.status();
  for (int i = 0; i < 6; ++i) {
    EXPECT_TRUE(is_shared(tensors[i]));
    EXPECT_EQ(tensors[i].sum().item<double>(), 4.0 * (i + 1)) << "the worker's write is seen";
    const Value::List& pair = (*out)[i].list();
    EXPECT_EQ(pair[1].as<double>().value(), 4.0 * (i + 1));
    Tensor back = pair[0].as<Tensor>().value();
    back.fill_(-1);  // the same bytes again
    EXPECT_EQ(tensors[i].sum().item<double>(), -4.0);
  }
}

TEST_P(PoolTest, TaskErrorsReachGetWithTheWorkersMessage) {
  absl::StatusOr<Pool> pool = Make(2);
  ASSERT_TRUE(pool.ok()) << pool.status();
  absl::StatusOr<Value::List> failed = pool->map("fail_some", {Value(1), Value(3)}, 1, kLong);
  EXPECT_TRUE(absl::IsInvalidArgument(failed.status())) << failed.status();
  EXPECT_THAT(failed.status().message(), HasSubstr("bad item 3: expected an even learning rate"));
  EXPECT_THAT(failed.status().message(), HasSubstr("'fail_some' of item 1 failed in worker"));
  EXPECT_THAT(failed.status().message(), HasSubstr("(pid "));

  absl::StatusOr<AsyncResult> thrown = pool->apply_async("fail_some", {Value(4)});
  ASSERT_TRUE(thrown.ok());
  absl::StatusOr<Value> v = thrown->get(kLong);
  EXPECT_TRUE(absl::IsInternal(v.status())) << v.status();
  EXPECT_THAT(v.status().message(), HasSubstr("uncaught exception: shape mismatch [2, 3] vs [3]"));
  EXPECT_FALSE(thrown->successful().value());

  // A bad argument is the function's error too.
  v = pool->apply("square", {Value("three")}, kLong);
  EXPECT_TRUE(absl::IsInvalidArgument(v.status())) << v.status();
  EXPECT_THAT(v.status().message(), HasSubstr("expected a int value, got string"));
  // Arguments or a result that cannot travel are that task's error.
  v = pool->apply("square", {Value(std::string(size_t{1} << 20, 'x'))}, kLong);
  EXPECT_TRUE(absl::IsInvalidArgument(v.status())) << v.status();
  EXPECT_THAT(v.status().message(), HasSubstr("Pool: sending 'square' to a worker"));
  v = pool->apply("huge", {}, kLong);
  EXPECT_TRUE(absl::IsInvalidArgument(v.status())) << v.status();
  EXPECT_THAT(v.status().message(), HasSubstr("its result cannot be sent back"));
  EXPECT_THAT(v.status().message(), HasSubstr("exceeds the limit"));
  // The pool goes on.
  absl::StatusOr<Value::List> ok = pool->map("square", Ints(5), 0, kLong);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ((*ok)[4].as<int64_t>().value(), 16);
}

TEST_P(PoolTest, AWorkerThatDiesFailsItsTaskInsteadOfHanging) {
  absl::StatusOr<Pool> pool = Make(2);
  ASSERT_TRUE(pool.ok()) << pool.status();
  const std::vector<pid_t> before = pool->pids();
  absl::StatusOr<AsyncResult> r = pool->apply_async("die");
  ASSERT_TRUE(r.ok());
  absl::StatusOr<Value> v = r->get(kLong);
  EXPECT_TRUE(absl::IsAborted(v.status())) << v.status();
  EXPECT_THAT(v.status().message(), HasSubstr("ended with signal SIGKILL while running 'die'"));
  EXPECT_THAT(v.status().message(), HasSubstr("BrokenProcessPool"));
  // The dead worker's pid is named, and it was replaced.
  bool named = false;
  for (pid_t p : before) named |= v.status().message().find(absl::StrCat("(pid ", p, ")")) !=
                                  std::string_view::npos;
  EXPECT_TRUE(named) << v.status();
  ASSERT_TRUE(testing::WaitUntil([&] { return pool->pids().size() == 2; }, kLong));
  absl::StatusOr<Value::List> ok = pool->map("square", Ints(20), 0, kLong);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ((*ok)[19].as<int64_t>().value(), 361);
  // A map whose chunk dies fails as a whole, naming the items.
  absl::StatusOr<Value::List> mapped = pool->map("die", Ints(3), 3, kLong);
  EXPECT_TRUE(absl::IsAborted(mapped.status())) << mapped.status();
  EXPECT_THAT(mapped.status().message(), HasSubstr("items 0-2"));
}

TEST_P(PoolTest, MaxTasksPerChildReplacesWorkers) {
  absl::StatusOr<Pool> pool = Make(1, /*maxtasks=*/2);
  ASSERT_TRUE(pool.ok()) << pool.status();
  absl::StatusOr<Value::List> pids = pool->map("pid", Ints(6), 1, kLong);
  ASSERT_TRUE(pids.ok()) << pids.status();
  std::vector<int64_t> seen;
  for (const Value& v : *pids) seen.push_back(v.as<int64_t>().value());
  // Chunks 0-1 in the first worker, 2-3 in the second, 4-5 in the third.
  EXPECT_EQ(seen[0], seen[1]);
  EXPECT_EQ(seen[2], seen[3]);
  EXPECT_EQ(seen[4], seen[5]);
  EXPECT_EQ(std::set<int64_t>(seen.begin(), seen.end()).size(), 3u);
}

TEST_P(PoolTest, LocksPassedToTasksSerializeThem) {
  absl::StatusOr<Pool> pool = Make(2);
  absl::StatusOr<Lock> lock = Lock::create();
  ASSERT_TRUE(pool.ok() && lock.ok());
  Tensor counter = zeros({1}, TensorOptions().dtype(kInt64));
  std::vector<Value::List> args(200, Value::List{Value(*lock), Value(counter)});
  absl::StatusOr<Value::List> out = pool->starmap("locked_increment", args, 5, kLong);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(counter.data_ptr<int64_t>()[0], 200);
}

TEST_P(PoolTest, CloseJoinAndTerminate) {
  absl::StatusOr<Pool> pool = Make(2);
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_TRUE(absl::IsFailedPrecondition(pool->join(absl::Seconds(1))));
  absl::StatusOr<AsyncResult> pending = pool->map_async("pid", {Value(300), Value(300)}, 1);
  ASSERT_TRUE(pending.ok());
  pool->close();
  absl::StatusOr<AsyncResult> late = pool->apply_async("square", {Value(1)});
  EXPECT_TRUE(absl::IsFailedPrecondition(late.status())) << late.status();
  EXPECT_THAT(late.status().message(), HasSubstr("not running"));
  EXPECT_TRUE(pool->join(kLong).ok());
  EXPECT_TRUE(pending->ready());  // submitted work finished before the workers left
  EXPECT_TRUE(pending->successful().value());
  EXPECT_TRUE(pool->pids().empty());

  absl::StatusOr<Pool> other = Make(1);
  ASSERT_TRUE(other.ok()) << other.status();
  const pid_t worker = other->pids().at(0);
  absl::StatusOr<AsyncResult> slow = other->apply_async("pid", {Value(int64_t{60000})});
  absl::StatusOr<AsyncResult> queued = other->map_async("square", Ints(50), 1);
  ASSERT_TRUE(slow.ok() && queued.ok());
  const absl::Time start = absl::Now();
  other->terminate();
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  EXPECT_TRUE(absl::IsCancelled(slow->get(absl::Seconds(1)).status()));
  EXPECT_TRUE(absl::IsCancelled(queued->get(absl::Seconds(1)).status()));
  EXPECT_TRUE(other->join(absl::Seconds(1)).ok());
  EXPECT_TRUE(testing::WaitUntil([&] { return ::kill(worker, 0) != 0; }, kLong));
}

TEST(PoolErrorsTest, MisuseIsNamed) {
  absl::StatusOr<Pool> bad = Pool::create({.processes = 0});
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status()));
  EXPECT_THAT(bad.status().message(), HasSubstr("processes must be at least 1, got 0"));
  bad = Pool::create({.processes = 1, .maxtasksperchild = 0});
  EXPECT_THAT(bad.status().message(), HasSubstr("maxtasksperchild must be at least 1"));
  bad = Pool::create({.processes = 1, .start_method = "thread"});
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status()));
  EXPECT_THAT(bad.status().message(), HasSubstr("'thread'"));

  absl::StatusOr<Pool> pool = Pool::create({.processes = 1, .start_method = "fork"});
  ASSERT_TRUE(pool.ok()) << pool.status();
  absl::StatusOr<AsyncResult> r = pool->apply_async("no_such_function");
  EXPECT_TRUE(absl::IsNotFound(r.status()));
  EXPECT_THAT(r.status().message(), HasSubstr("'no_such_function'"));
  EXPECT_TRUE(absl::IsInvalidArgument(pool->map("square", Ints(3), -1).status()));
  // The default size: one process per CPU.
  absl::StatusOr<Pool> sized = Pool::create({.start_method = "fork"});
  ASSERT_TRUE(sized.ok()) << sized.status();
  EXPECT_EQ(sized->processes(), static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN)));
}

}  // namespace
}  // namespace ember::multiprocessing
