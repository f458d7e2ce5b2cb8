// CUDA tensors between processes (CUDA IPC). Without a GPU: the handler's
// registration, its refusal of malformed handles and of a producer that has
// exited, and the shared-memory reference counters across a real fork. With
// a GPU: a spawned child reads and writes the parent's CUDA memory through a
// Queue, a received tensor cannot be sent on, and 10,000 messages leave no
// block, counter or segment behind.
#include "multiprocessing/cuda_sharing.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "cuda/caching_allocator.h"
#include "cuda/device.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "multiprocessing/process.h"
#include "multiprocessing/queue.h"
#include "multiprocessing/sharing.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"

namespace ember::multiprocessing {
namespace {

using ::testing::HasSubstr;
using internal::CudaIpcWire;
using internal::IpcRefCounters;

class SpawnedChildEnvironment : public ::testing::Environment {
 public:
  void SetUp() override { maybe_run_spawned_child(); }
};
const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new SpawnedChildEnvironment);

#define SKIP_WITHOUT_GPU()                                                                  \
  do {                                                                                      \
    if (!cuda::is_available()) GTEST_SKIP() << "needs a GPU: " << cuda::unavailable_reason(); \
  } while (0)

CudaIpcWire ValidWire(int pid) {
  CudaIpcWire w{};
  std::memcpy(w.magic, internal::kCudaIpcMagic, sizeof(w.magic));
  w.version = internal::kCudaIpcVersion;
  w.device = 0;
  w.producer_pid = pid;
  w.segment_size = 2 << 20;
  w.offset = 512;
  w.nbytes = 1024;
  std::snprintf(w.counters, sizeof(w.counters), "/ember_cuda_ipc_none");
  return w;
}

absl::StatusOr<Storage> ImportBytes(const std::string& bytes, uint64_t nbytes = 1024) {
  EMBER_ASSIGN_OR_RETURN(SharingHandler * h, get_sharing_handler(DeviceType::kCUDA));
  ReceivedStorage r;
  r.nbytes = nbytes;
  r.handle = bytes;
  return h->Import(std::move(r));
}

std::string Bytes(const CudaIpcWire& w) { return std::string(reinterpret_cast<const char*>(&w), sizeof(w)); }

TEST(CudaSharingTest, TheCudaHandlerIsRegistered) {
  absl::StatusOr<SharingHandler*> h = get_sharing_handler(DeviceType::kCUDA);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_TRUE((*h)->IsShared(Storage()));
}

TEST(CudaSharingTest, MalformedHandlesNameWhatIsWrong) {
  absl::StatusOr<Storage> short_one = ImportBytes("abc");
  ASSERT_FALSE(short_one.ok());
  EXPECT_EQ(short_one.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(short_one.status().message(),
              HasSubstr(absl::StrCat("malformed CUDA IPC handle: 3 bytes, expected ",
                                     sizeof(CudaIpcWire))));
  CudaIpcWire w = ValidWire(getpid());
  w.magic[0] = 'X';
  EXPECT_THAT(ImportBytes(Bytes(w)).status().message(), HasSubstr("bad magic"));
  w = ValidWire(getpid());
  w.offset = w.segment_size - 100;  // 1024 bytes do not fit
  EXPECT_THAT(ImportBytes(Bytes(w)).status().message(), HasSubstr("does not fit its segment"));
  w = ValidWire(getpid());
  EXPECT_THAT(ImportBytes(Bytes(w), 4096).status().message(), HasSubstr("describes 1024 bytes"));
}

TEST(CudaSharingTest, AProducerThatExitedIsNamed) {
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);  // reaped: the pid is gone
  absl::StatusOr<Storage> s = ImportBytes(Bytes(ValidWire(child)));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.status().message(), HasSubstr(absl::StrCat("(pid ", child, ") has exited")));
}

TEST(IpcRefCountersTest, AnotherProcessDropsItsReference) {
  absl::StatusOr<std::unique_ptr<IpcRefCounters>> file = IpcRefCounters::Create("/ember_ipc_test");
  ASSERT_TRUE(file.ok()) << file.status();
  const std::string name = (*file)->name();
  EXPECT_THAT(name, HasSubstr(absl::StrCat("/ember_ipc_test_", getpid(), "_")));
  absl::StatusOr<int> a = (*file)->Acquire(), b = (*file)->Acquire();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(*a, *b);
  EXPECT_EQ((*file)->Get(*a), 1);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    absl::StatusOr<std::unique_ptr<IpcRefCounters>> opened = IpcRefCounters::Open(name);
    if (!opened.ok()) _exit(2);
    (*opened)->Add(*a, -1);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_EQ((*file)->Get(*a), 0);
  EXPECT_EQ((*file)->Get(*b), 1);  // untouched
  (*file)->Release(*a);
  absl::StatusOr<int> again = (*file)->Acquire();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *a);  // the released slot is handed out again, at 1
  EXPECT_EQ((*file)->Get(*again), 1);
  file->reset();  // the creator unlinks the file
  absl::StatusOr<std::unique_ptr<IpcRefCounters>> gone = IpcRefCounters::Open(name);
  ASSERT_FALSE(gone.ok());
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(gone.status().message(), HasSubstr(name));
}

TEST(IpcRefCountersTest, AFullFileSaysSo) {
  absl::StatusOr<std::unique_ptr<IpcRefCounters>> file = IpcRefCounters::Create("/ember_ipc_test");
  ASSERT_TRUE(file.ok());
  for (int i = 0; i < IpcRefCounters::kSlots; ++i) ASSERT_TRUE((*file)->Acquire().ok()) << i;
  absl::StatusOr<int> more = (*file)->Acquire();
  ASSERT_FALSE(more.ok());
  EXPECT_EQ(more.status().code(), absl::StatusCode::kResourceExhausted);
}

// --- With a GPU --------------------------------------------------------------------

// Receives a CUDA tensor, checks it holds 0..n-1, adds 1 in place, tries to
// send it back (refused), and reports through the second queue.
absl::Status IncrementEntry(int, absl::Span<const Value> args) {
  EMBER_ASSIGN_OR_RETURN(Queue in, args[0].as<Queue>());
  EMBER_ASSIGN_OR_RETURN(Queue out, args[1].as<Queue>());
  EMBER_ASSIGN_OR_RETURN(Value v, in.get(absl::Seconds(60)));
  EMBER_ASSIGN_OR_RETURN(Tensor t, v.as<Tensor>());
  if (!t.is_cuda()) return absl::InternalError("the tensor did not arrive on a CUDA device");
  Tensor expected = arange(t.numel(), kFloat32);
  if (!t.to(Device(DeviceType::kCPU)).equal(expected)) {
    return absl::InternalError("the received tensor does not hold the sender's values");
  }
  t.add_(1.0);
  EMBER_RETURN_IF_ERROR(cuda::synchronize(t.device().index()));
  absl::Status resend = out.put(Value(t));
  EMBER_RETURN_IF_ERROR(out.put(Value(std::string(resend.message()))));
  return absl::OkStatus();
}
EMBER_REGISTER_ENTRY_POINT("cuda_increment", IncrementEntry);

TEST(CudaSharingGpuTest, ASpawnedChildWritesTheSendersMemory) {
  SKIP_WITHOUT_GPU();
  absl::StatusOr<Queue> in = Queue::create(), out = Queue::create();
  ASSERT_TRUE(in.ok() && out.ok());
  Tensor t = arange(1 << 16, kFloat32).to(Device(DeviceType::kCUDA, 0));
  absl::StatusOr<Process> child =
      Process::start_spawn("cuda_increment", 0, {Value(*in), Value(*out)});
  ASSERT_TRUE(child.ok()) << child.status();
  ASSERT_TRUE(in->put(Value(t)).ok());
  absl::StatusOr<Value> refusal = out->get(absl::Seconds(60));
  ASSERT_TRUE(refusal.ok()) << refusal.status();
  EXPECT_THAT(*refusal->as<std::string>(),
              HasSubstr("Attempted to send CUDA tensor received from another process"));
  absl::StatusOr<ExitStatus> exit = child->join(absl::Seconds(60));
  ASSERT_TRUE(exit.ok() && exit->ok()) << child->error_message();
  EXPECT_TRUE(t.to(Device(DeviceType::kCPU)).equal(arange(1 << 16, kFloat32) + 1.0));
  // The child freed its view: the block goes back at the next collect.
  EXPECT_EQ(cuda_ipc_collect(), 1);
  EXPECT_EQ(cuda_ipc_blocks_held(), 0);
}

absl::Status DrainEntry(int, absl::Span<const Value> args) {
  EMBER_ASSIGN_OR_RETURN(Queue in, args[0].as<Queue>());
  EMBER_ASSIGN_OR_RETURN(int64_t n, args[1].as<int64_t>());
  for (int64_t i = 0; i < n; ++i) {
    EMBER_ASSIGN_OR_RETURN(Value v, in.get(absl::Seconds(60)));
    EMBER_ASSIGN_OR_RETURN(Tensor t, v.as<Tensor>());
    if (t.numel() != 256) return absl::InternalError("wrong size");
  }
  return absl::OkStatus();
}
EMBER_REGISTER_ENTRY_POINT("cuda_drain", DrainEntry);

TEST(CudaSharingGpuTest, TenThousandMessagesLeaveNothingBehind) {
  SKIP_WITHOUT_GPU();
  constexpr int64_t kMessages = 10000;
  absl::StatusOr<Queue> q = Queue::create(64);
  ASSERT_TRUE(q.ok());
  const int64_t before = cuda::memory_allocated(0);
  absl::StatusOr<Process> child = Process::start_spawn("cuda_drain", 0, {Value(*q), Value(kMessages)});
  ASSERT_TRUE(child.ok()) << child.status();
  for (int64_t i = 0; i < kMessages; ++i) {
    Tensor t = full({256}, static_cast<double>(i), TensorOptions(kFloat32).device(Device(DeviceType::kCUDA, 0)));
    ASSERT_TRUE(q->put(Value(t), absl::Seconds(60)).ok()) << i;
  }
  absl::StatusOr<ExitStatus> exit = child->join(absl::Seconds(120));
  ASSERT_TRUE(exit.ok() && exit->ok()) << child->error_message();
  cuda_ipc_collect();
  EXPECT_EQ(cuda_ipc_blocks_held(), 0);
  EXPECT_EQ(cuda::memory_allocated(0), before);
}

}  // namespace
}  // namespace ember::multiprocessing
