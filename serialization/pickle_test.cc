// The restricted unpickler on hostile programs: nesting deep enough to
// overflow a thread's stack if anything recursed over the values.
#include "serialization/pickle.h"

#include <pthread.h>

#include <functional>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ember::serialization {
namespace {

using ::testing::HasSubstr;

// Runs `fn` on a new thread whose stack is `stack_bytes`, and waits for it.
void RunOnStack(size_t stack_bytes, const std::function<void()>& fn) {
  pthread_attr_t attr;
  ASSERT_EQ(pthread_attr_init(&attr), 0);
  ASSERT_EQ(pthread_attr_setstacksize(&attr, stack_bytes), 0);
  pthread_t thread;
  auto call = [](void* arg) -> void* {
    (*static_cast<const std::function<void()>*>(arg))();
    return nullptr;
  };
  ASSERT_EQ(pthread_create(&thread, &attr, call, const_cast<std::function<void()>*>(&fn)), 0);
  pthread_attr_destroy(&attr);
  ASSERT_EQ(pthread_join(thread, nullptr), 0);
}

absl::Status Unpickle(const std::string& program) {
  StorageLoader no_storages = [](const StorageRef& ref) -> absl::StatusOr<Storage> {
    return absl::NotFoundError(ref.key);
  };
  return unpickle_state_dict(program, no_storages, "deep.pt").status();
}

std::string Repeat(absl::string_view s, int n) {
  std::string out;
  out.reserve(s.size() * n);
  for (int i = 0; i < n; ++i) out.append(s.data(), s.size());
  return out;
}

// Lists nested as Python's pickler writes them: every EMPTY_LIST first, then
// one APPEND per level.
std::string NestedLists(int depth) {
  return "\x80\x02" + Repeat("]", depth) + Repeat("a", depth - 1) + ".";
}

// ((((),),),...): TUPLE1 over and over; the stack never holds more than one.
std::string NestedTuples(int depth) { return "\x80\x02)" + Repeat("\x85", depth) + "."; }

// {"k": {"k": {...}}}: dicts and keys pushed, then one SETITEM per level.
std::string NestedDicts(int depth) {
  const std::string key("X\x01\x00\x00\x00k", 6);
  return "\x80\x02}" + Repeat(key + "}", depth - 1) + Repeat("s", depth - 1) + ".";
}

TEST(PickleTest, DeepNestingIsAnErrorOnASmallStack) {
  struct Case {
    const char* what;
    std::string program;
  };
  const Case cases[] = {
      {"lists", NestedLists(300000)},
      {"tuples", NestedTuples(1000000)},
      {"dicts", NestedDicts(300000)},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    absl::Status status;
    RunOnStack(256 << 10, [&] { status = Unpickle(c.program); });
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(status.message(), HasSubstr("nested more than 1000 deep"));
    EXPECT_THAT(status.message(), HasSubstr("deep.pt"));
  }
}

TEST(PickleTest, NestingUpToTheLimitIsRead) {
  // 1000 levels are fine (the result is then refused only for not being a
  // state_dict); the stack of a small thread is not an issue either.
  absl::Status status;
  RunOnStack(256 << 10, [&] { status = Unpickle(NestedLists(kMaxPickleNesting)); });
  EXPECT_THAT(status.message(), HasSubstr("holds a list, not a state_dict"));
}

TEST(PickleTest, SelfReferenceIsAnError) {
  // A list appended to itself, then a list grown after being placed inside
  // another (only self-referencing objects pickle that way).
  EXPECT_THAT(Unpickle(std::string("\x80\x02]q\x00h\x00"
                                   "a.",
                                   9))
                  .message(),
              HasSubstr("a list inside itself"));
  EXPECT_THAT(Unpickle(std::string("\x80\x02]q\x00]q\x01"
                                   "ah\x01K\x01"
                                   "a.",
                                   15))
                  .message(),
              HasSubstr("APPEND on a list that is already inside another value"));
}

TEST(PickleTest, TooManyDimensionsIsAnError) {
  PickledTensor t{"w", "0", kFloat32, 1, 0, SizeVector(100, 1), SizeVector(100, 1)};
  StorageLoader one_float = [](const StorageRef&) -> absl::StatusOr<Storage> {
    return Storage::Allocate(4, GetCpuAllocator());
  };
  absl::Status status = unpickle_state_dict(pickle_state_dict({t}), one_float, "dims.pt").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("a tensor with 100 dimensions"));
  EXPECT_THAT(status.message(), HasSubstr("at most 64"));
  t.sizes = t.strides = SizeVector(kMaxCheckpointDims, 1);
  EXPECT_TRUE(unpickle_state_dict(pickle_state_dict({t}), one_float, "dims.pt").ok());
}

}  // namespace
}  // namespace ember::serialization
