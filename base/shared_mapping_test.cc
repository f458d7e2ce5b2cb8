#include "base/shared_mapping.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ember::base {
namespace {

using ::testing::HasSubstr;

TEST(SharedMappingTest, APeerMapsTheSameZeroFilledBytes) {
  absl::StatusOr<SharedMapping> mine = SharedMapping::create_memfd("test-ring", 1 << 16);
  ASSERT_TRUE(mine.ok()) << mine.status();
  EXPECT_EQ(mine->size(), 1u << 16);
  for (size_t i = 0; i < mine->size(); i += 4096) ASSERT_EQ(mine->data()[i], 0);
  // A forked child opens it by pid and descriptor and writes; the parent sees it.
  const pid_t parent = getpid();
  const int fd = mine->fd();
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    absl::StatusOr<SharedMapping> theirs =
        SharedMapping::open_process_fd(parent, fd, 1 << 16, "the parent's ring");
    if (!theirs.ok()) _exit(2);
    std::memcpy(theirs->data() + 100, "hello", 5);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_EQ(std::memcmp(mine->data() + 100, "hello", 5), 0);
}

TEST(SharedMappingTest, MovesOwnership) {
  absl::StatusOr<SharedMapping> a = SharedMapping::create_memfd("test-move", 4096);
  ASSERT_TRUE(a.ok());
  char* data = a->data();
  SharedMapping b = std::move(*a);
  EXPECT_EQ(b.data(), data);
  EXPECT_EQ(a->data(), nullptr);
  EXPECT_EQ(a->fd(), -1);
  data[0] = 7;  // still mapped through b
  EXPECT_EQ(b.data()[0], 7);
}

TEST(SharedMappingTest, BadRequestsSayWhatIsWrong) {
  absl::StatusOr<SharedMapping> empty = SharedMapping::create_memfd("test-empty", 0);
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(empty.status().message(), HasSubstr("'test-empty' of 0 bytes"));

  absl::StatusOr<SharedMapping> small = SharedMapping::create_memfd("test-small", 4096);
  ASSERT_TRUE(small.ok());
  absl::StatusOr<SharedMapping> longer =
      SharedMapping::open_process_fd(getpid(), small->fd(), 8192, "rank 1's ring");
  EXPECT_EQ(longer.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(longer.status().message(),
              HasSubstr("rank 1's ring at /proc/" + std::to_string(getpid())));
  EXPECT_THAT(longer.status().message(), HasSubstr("holds 4096 bytes where 8192 were expected"));

  absl::StatusOr<SharedMapping> gone =
      SharedMapping::open_process_fd(getpid(), 1 << 20, 4096, "rank 2's ring");
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(gone.status().message(), HasSubstr("cannot open rank 2's ring"));

  // An object that cannot be sized (read-only) is refused, naming it.
  int ro = ::open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(ro, 0);
  absl::Status s = reserve_pages(ro, 4096, "the read-only file");
  ::close(ro);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("cannot size the read-only file to 4096 bytes"));
}

}  // namespace
}  // namespace ember::base
