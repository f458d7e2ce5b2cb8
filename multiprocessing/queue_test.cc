#include "multiprocessing/queue.h"

#include <fcntl.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "multiprocessing/message.h"
#include "multiprocessing/process.h"
#include "multiprocessing/sharing.h"
#include "multiprocessing/testing.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"

namespace ember::multiprocessing {
namespace {

using ::testing::HasSubstr;

TEST(QueueTest, ManyProducersOneConsumerKeepsPerProducerOrder) {
  absl::StatusOr<Queue> q = Queue::create();
  ASSERT_TRUE(q.ok()) << q.status();
  constexpr int kProducers = 3, kEach = 40;
  std::vector<Process> producers;
  for (int p = 0; p < kProducers; ++p) {
    absl::StatusOr<Process> proc = Process::start([&, p]() -> absl::Status {
      for (int i = 0; i < kEach; ++i) {
        EMBER_RETURN_IF_ERROR(
            q->put(Value(Value::List{p, i, full({3}, p * 1000 + i, kInt32)}), absl::Seconds(20)));
      }
      return absl::OkStatus();
    });
    ASSERT_TRUE(proc.ok());
    producers.push_back(*std::move(proc));
  }
  std::vector<int> next(kProducers, 0);
  for (int n = 0; n < kProducers * kEach; ++n) {
    absl::StatusOr<Value> v = q->get(absl::Seconds(20));
    ASSERT_TRUE(v.ok()) << v.status();
    int64_t p = *v->list()[0].get_if<int64_t>(), i = *v->list()[1].get_if<int64_t>();
    EXPECT_EQ(i, next[p]++);
    Tensor t = *v->list()[2].get_if<Tensor>();
    EXPECT_EQ(t[2].item<int64_t>(), p * 1000 + i);
  }
  for (Process& p : producers) {
    absl::StatusOr<ExitStatus> e = p.join(absl::Seconds(20));
    ASSERT_TRUE(e.ok());
    EXPECT_TRUE(e->ok()) << p.error_message();
  }
  EXPECT_TRUE(q->empty());
}

TEST(QueueTest, MaxsizeBoundsPutsAndQsizeCounts) {
  absl::StatusOr<Queue> q = Queue::create(/*maxsize=*/2);
  ASSERT_TRUE(q.ok());
  ASSERT_TRUE(q->put(Value(1)).ok());
  ASSERT_TRUE(q->put(Value(2)).ok());
  EXPECT_EQ(q->qsize(), 2);
  absl::Status full = q->put(Value(3), absl::Milliseconds(50));
  EXPECT_EQ(full.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(full.message(), HasSubstr("maxsize 2"));
  EXPECT_EQ(*q->get(absl::Seconds(1))->get_if<int64_t>(), 1);
  EXPECT_EQ(q->qsize(), 1);
  ASSERT_TRUE(q->put(Value(3), absl::Milliseconds(50)).ok());
  EXPECT_EQ(*q->get(absl::Seconds(1))->get_if<int64_t>(), 2);
  EXPECT_EQ(*q->get(absl::Seconds(1))->get_if<int64_t>(), 3);
  EXPECT_TRUE(q->empty());
}

TEST(QueueTest, GetTimesOutOnAnEmptyQueue) {
  absl::StatusOr<SimpleQueue> q = SimpleQueue::create();
  ASSERT_TRUE(q.ok());
  absl::StatusOr<Value> v = q->get(absl::Milliseconds(30));
  EXPECT_EQ(v.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(q->empty());
}

TEST(QueueTest, HogwildWritesThroughAQueueAreSeenByAll) {
  absl::StatusOr<SimpleQueue> to_child = SimpleQueue::create();
  absl::StatusOr<SimpleQueue> to_parent = SimpleQueue::create();
  ASSERT_TRUE(to_child.ok() && to_parent.ok());
  Tensor w = zeros({8});
  absl::StatusOr<Process> child = Process::start([&]() -> absl::Status {
    EMBER_ASSIGN_OR_RETURN(Value v, to_child->get(absl::Seconds(20)));
    EMBER_ASSIGN_OR_RETURN(Tensor t, v.as<Tensor>());
    t.add_(1.5);
    return to_parent->put(Value("done"));
  });
  ASSERT_TRUE(child.ok());
  ASSERT_TRUE(to_child->put(Value(w)).ok());
  ASSERT_TRUE(to_parent->get(absl::Seconds(20)).ok());
  EXPECT_TRUE(w.equal(full({8}, 1.5)));
  ASSERT_TRUE(child->join(absl::Seconds(20)).ok());
}

// A leaf that requires grad (a model parameter) may be sent, as in PyTorch;
// only non-leaf tensors that require grad are refused (CheckTensorSendable).
TEST(QueueTest, LeafTensorsThatRequireGradMaySend) {
  Tensor param = ones({4});
  param.requires_grad_();
  EXPECT_TRUE(CheckTensorSendable(param).ok());
  absl::StatusOr<SimpleQueue> q = SimpleQueue::create();
  ASSERT_TRUE(q.ok());
  ASSERT_TRUE(q->put(Value(param)).ok());
  absl::StatusOr<Value> v = q->get(absl::Seconds(5));
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->get_if<Tensor>()->raw_data(),
            param.raw_data());  // same process: same mapping
  EXPECT_TRUE(v->get_if<Tensor>()->requires_grad());
  EXPECT_TRUE(v->get_if<Tensor>()->is_leaf());
}

// A parameter crosses a queue as PyTorch rebuilds it: a leaf that requires
// grad, viewing the same bytes, with a .grad of its own in each process.
class RequiresGradTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    ASSERT_TRUE(set_sharing_strategy(GetParam()).ok());
    ASSERT_TRUE(set_shared_memory_prefix(testing::UniquePrefix("grad")).ok());
  }
  void TearDown() override { ASSERT_TRUE(set_sharing_strategy("file_descriptor").ok()); }
};

TEST_P(RequiresGradTest, ParametersArriveAsLeavesThatRequireGradAcrossFork) {
  Tensor w = full({4}, 2.0);
  w.requires_grad_();
  Tensor frozen = ones({2});
  absl::StatusOr<Queue> to_child = Queue::create();
  absl::StatusOr<Queue> to_parent = Queue::create();
  ASSERT_TRUE(to_child.ok() && to_parent.ok());
  absl::StatusOr<Process> child = Process::start([&]() -> absl::Status {
    EMBER_ASSIGN_OR_RETURN(Value v, to_child->get(absl::Seconds(20)));
    const Value* got_w = v.find("w");
    const Value* got_frozen = v.find("frozen");
    if (got_w == nullptr || got_frozen == nullptr) return absl::InternalError("keys missing");
    Tensor cw = *got_w->get_if<Tensor>();
    Tensor cf = *got_frozen->get_if<Tensor>();
    Value::List report{cw.requires_grad(), cw.is_leaf(), cw.grad().defined(), cf.requires_grad()};
    (cw * cw).sum().backward();  // d/dw = 2w = 4
    report.push_back(cw.grad().sum().item<double>());
    cw.grad().zero_();
    return to_parent->put(Value(std::move(report)), absl::Seconds(20));
  });
  ASSERT_TRUE(child.ok());
  ASSERT_TRUE(to_child->put(Value(Value::Dict{{"w", Value(w)}, {"frozen", Value(frozen)}})).ok());
  absl::StatusOr<Value> report = to_parent->get(absl::Seconds(20));
  ASSERT_TRUE(report.ok()) << report.status();
  const Value::List& r = report->list();
  ASSERT_EQ(r.size(), 5u);
  EXPECT_TRUE(*r[0].get_if<bool>()) << "requires_grad lost";
  EXPECT_TRUE(*r[1].get_if<bool>()) << "not a leaf";
  EXPECT_FALSE(*r[2].get_if<bool>()) << "arrived with a .grad";
  EXPECT_FALSE(*r[3].get_if<bool>()) << "requires_grad invented";
  EXPECT_DOUBLE_EQ(*r[4].get_if<double>(), 16.0);
  // The child's gradient is its own.
  EXPECT_FALSE(w.grad().defined());
  absl::StatusOr<ExitStatus> e = child->join(absl::Seconds(20));
  ASSERT_TRUE(e.ok());
  EXPECT_TRUE(e->ok()) << child->error_message();
}

TEST_P(RequiresGradTest, NonLeavesAreStillRefused) {
  Tensor w = ones({3});
  w.requires_grad_();
  absl::StatusOr<Queue> q = Queue::create();
  ASSERT_TRUE(q.ok());
  absl::Status put = q->put(Value(Value::Dict{{"y", Value(w * 3)}}));
  EXPECT_EQ(put.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(put.message(), HasSubstr("non-leaf tensor that requires grad"));
}

INSTANTIATE_TEST_SUITE_P(Strategies, RequiresGradTest,
                         ::testing::Values("file_descriptor", "file_system"));

TEST(QueueTest, DictsOfStringKeysRoundTrip) {
  absl::StatusOr<SimpleQueue> q = SimpleQueue::create();
  ASSERT_TRUE(q.ok());
  Value sent = Value::Dict{{"epoch", Value(3)},
                           {"lr", Value(0.01)},
                           {"state", Value::Dict{{"w", Value(arange(4))}}},
                           {"tags", Value::List{Value("a"), Value()}}};
  ASSERT_TRUE(q->put(sent).ok());
  absl::StatusOr<Value> got = q->get(absl::Seconds(5));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->kind(), "dict");
  EXPECT_EQ(*got->find("epoch")->get_if<int64_t>(), 3);
  EXPECT_EQ(*got->find("lr")->get_if<double>(), 0.01);
  EXPECT_TRUE(got->find("state")->find("w")->get_if<Tensor>()->equal(arange(4)));
  EXPECT_EQ(got->find("tags")->list().size(), 2u);
  EXPECT_EQ(got->find("missing"), nullptr);
}

TEST(QueueTest, NonLeafTensorsThatRequireGradAreRefused) {
  Tensor param = ones({4});
  param.requires_grad_();
  Tensor activation = param * 2;  // has a grad_fn: not a leaf
  ASSERT_FALSE(activation.is_leaf());
  absl::StatusOr<SimpleQueue> q = SimpleQueue::create();
  ASSERT_TRUE(q.ok());
  absl::Status put = q->put(Value(activation));
  EXPECT_EQ(put.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(put.message(), ::testing::HasSubstr("non-leaf tensor that requires grad"));
  EXPECT_THAT(put.message(), ::testing::HasSubstr("detach()"));
  // Nothing was sent: the queue is still empty.
  EXPECT_EQ(q->get(absl::Milliseconds(50)).status().code(), absl::StatusCode::kDeadlineExceeded);
  // Its detached data may go.
  EXPECT_TRUE(q->put(Value(activation.detach())).ok());
}

// --- Bad input on queue sockets: an error, never a crash or a leak -----------

class QueueBadInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<SimpleQueue> q = SimpleQueue::create();
    ASSERT_TRUE(q.ok());
    q_ = *std::move(q);
  }
  // After any bad message, a good one still gets through.
  void ExpectStillWorks() {
    ASSERT_TRUE(q_.put(Value("fine")).ok());
    absl::StatusOr<Value> v = q_.get(absl::Seconds(5));
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_EQ(*v->get_if<std::string>(), "fine");
  }
  SimpleQueue q_;
};

TEST_F(QueueBadInputTest, GarbageIsRejected) {
  ASSERT_TRUE(q_.put_end().send_bytes("definitely not a message", {}).ok());
  absl::StatusOr<Value> v = q_.get(absl::Seconds(5));
  EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(v.status().message(), HasSubstr("bad magic"));
  ExpectStillWorks();
}

TEST_F(QueueBadInputTest, EveryTruncationIsRejected) {
  Value value(Value::List{Value(1), Value("two"), Value(3.0), Value(arange(4))});
  absl::StatusOr<EncodedMessage> m = EncodeMessage(value);
  ASSERT_TRUE(m.ok());
  for (size_t cut = 0; cut < m->bytes.size(); ++cut) {
    // Only the full message carries the descriptors it describes.
    ASSERT_TRUE(q_.put_end().send_bytes(std::string_view(m->bytes).substr(0, cut), {}).ok());
    absl::StatusOr<Value> v = q_.get(absl::Seconds(5));
    EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument) << "cut at " << cut;
  }
  AbandonMessage(*m);
  ExpectStillWorks();
}

TEST_F(QueueBadInputTest, ADictWithARepeatedKeyIsRejected) {
  absl::StatusOr<EncodedMessage> m = EncodeMessage(Value(Value::Dict{{"ka", 1}, {"kb", 2}}));
  ASSERT_TRUE(m.ok());
  std::string bytes = m->bytes;
  bytes[bytes.rfind("kb") + 1] = 'a';
  ASSERT_TRUE(q_.put_end().send_bytes(bytes, {}).ok());
  absl::StatusOr<Value> v = q_.get(absl::Seconds(5));
  EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(v.status().message(), HasSubstr("'ka' appears twice"));
  ExpectStillWorks();
}

TEST(ConnectionTest, AClosedPeerIsUnavailable) {
  auto pipe = Pipe();
  ASSERT_TRUE(pipe.ok());
  pipe->second.close();
  absl::StatusOr<Value> v = pipe->first.recv(absl::Seconds(5));
  EXPECT_EQ(v.status().code(), absl::StatusCode::kUnavailable);
  // Without a timeout too (that wait is the receive itself).
  EXPECT_EQ(pipe->first.recv().status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(pipe->first.send(Value(1)).code(), absl::StatusCode::kUnavailable);
}

TEST(ConnectionTest, AReceiveWithoutTimeoutWaitsForTheMessageAndItsDescriptors) {
  auto pipe = Pipe();
  ASSERT_TRUE(pipe.ok());
  absl::StatusOr<Process> child = Process::start([&]() -> absl::Status {
    absl::SleepFor(absl::Milliseconds(50));
    return pipe->second.send(Value(Value::List{Value(7), Value(ones({4}))}));
  });
  ASSERT_TRUE(child.ok());
  absl::StatusOr<Value> v = pipe->first.recv();
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->list()[0].as<int64_t>().value(), 7);
  EXPECT_EQ(v->list()[1].get_if<Tensor>()->sum().item<double>(), 4);
  ASSERT_TRUE(child->join(absl::Seconds(20)).ok());
}

TEST_F(QueueBadInputTest, DescriptorsWithGarbageAreClosed) {
  const int before = testing::OpenFdCount();
  int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(devnull, 0);
  int fds[] = {devnull, devnull, devnull};
  ASSERT_TRUE(q_.put_end().send_bytes("garbage with descriptors", fds).ok());
  ::close(devnull);
  EXPECT_FALSE(q_.get(absl::Seconds(5)).ok());
  EXPECT_EQ(testing::OpenFdCount(), before);
  ExpectStillWorks();
}

TEST_F(QueueBadInputTest, AForeignDescriptorInPlaceOfASegmentIsRejected) {
  ASSERT_TRUE(set_sharing_strategy("file_descriptor").ok());
  absl::StatusOr<EncodedMessage> m = EncodeMessage(Value(ones({16})));
  ASSERT_TRUE(m.ok());
  int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  int fds[] = {devnull};
  ASSERT_TRUE(q_.put_end().send_bytes(m->bytes, fds).ok());
  ::close(devnull);
  absl::StatusOr<Value> v = q_.get(absl::Seconds(5));
  EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(v.status().message(), HasSubstr("not an Ember shared-memory segment"));
  AbandonMessage(*m);
  ExpectStillWorks();
}

TEST_F(QueueBadInputTest, AMissingRegionNameIsNotFound) {
  ASSERT_TRUE(set_sharing_strategy("file_system").ok());
  ASSERT_TRUE(set_shared_memory_prefix(testing::UniquePrefix("queue")).ok());
  Tensor t = ones({16});
  absl::StatusOr<EncodedMessage> m = EncodeMessage(Value(t));
  ASSERT_TRUE(set_sharing_strategy("file_descriptor").ok());
  ASSERT_TRUE(m.ok()) << m.status();
  std::string bytes = m->bytes;
  std::string name = testing::UniquePrefix("queue");
  size_t at = bytes.find(name.substr(1));
  ASSERT_NE(at, std::string::npos);
  bytes[at] = 'X';  // a region nobody created
  ASSERT_TRUE(q_.put_end().send_bytes(bytes, {}).ok());
  absl::StatusOr<Value> v = q_.get(absl::Seconds(5));
  EXPECT_EQ(v.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(v.status().message(), HasSubstr("cannot be opened"));
  AbandonMessage(*m);
  ExpectStillWorks();
}

TEST_F(QueueBadInputTest, OversizedPlainValuesAreRefusedBeforeSending) {
  absl::Status s = q_.put(Value(std::string(kMaxMessageBytes + 1, 'x')));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("put large data in a tensor"));
  EXPECT_TRUE(q_.empty());
  ExpectStillWorks();
}

TEST_F(QueueBadInputTest, UndefinedTensorsAreRefused) {
  absl::Status s = q_.put(Value(Tensor()));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("undefined tensor"));
}

}  // namespace
}  // namespace ember::multiprocessing
