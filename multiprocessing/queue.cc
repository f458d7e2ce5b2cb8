#include "multiprocessing/queue.h"

#include <semaphore.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <ctime>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "multiprocessing/message.h"
#include "tensor/status_macros.h"

namespace ember::multiprocessing {

absl::StatusOr<SimpleQueue> SimpleQueue::create() {
  EMBER_ASSIGN_OR_RETURN(auto pair, Pipe(/*duplex=*/true));
  SimpleQueue q;
  q.ends_ = std::make_shared<Ends>(Ends{std::move(pair.first), std::move(pair.second)});
  return q;
}

absl::Status SimpleQueue::put(const Value& value, absl::Duration timeout) {
  return ends_->put.send(value, timeout);
}

absl::StatusOr<Value> SimpleQueue::get(absl::Duration timeout) { return ends_->get.recv(timeout); }

bool SimpleQueue::empty() const { return !ends_->get.poll(); }

absl::StatusOr<std::string> SimpleQueue::Encode(const Value& value, std::vector<int>& fds) {
  const SimpleQueue& q = *value.get_if<SimpleQueue>();
  if (!q.ends_->put.valid() || !q.ends_->get.valid()) {
    return absl::FailedPreconditionError("cannot send a closed queue");
  }
  fds.push_back(q.ends_->put.fd());
  fds.push_back(q.ends_->get.fd());
  return std::string();
}

absl::StatusOr<Value> SimpleQueue::Decode(std::vector<base::UniqueFd> fds, std::string_view) {
  SimpleQueue q;
  q.ends_ =
      std::make_shared<Ends>(Ends{Connection(std::move(fds[0])), Connection(std::move(fds[1]))});
  return Value(std::move(q));
}

const bool SimpleQueue::kCodecRegistered = [] {
  RegisterChannelCodec(ChannelKind::kSimpleQueue,
                       {.encode = &SimpleQueue::Encode, .decode = &SimpleQueue::Decode, .fds = 2});
  return true;
}();

// The page every process shares: the free-slot semaphore and the count. It
// is a memfd, so that the queue can be passed to a spawned child.
struct Queue::Shared {
  struct Page {
    sem_t free_slots;
    std::atomic<int64_t> size;
  };
  base::UniqueFd fd;
  Page* page = nullptr;
  ~Shared() {
    if (page != nullptr) ::munmap(page, sizeof(Page));
  }
  // Maps the page of `fd` (one created by Create, or received).
  absl::Status Map(base::UniqueFd page_fd) {
    void* p = ::mmap(nullptr, sizeof(Page), PROT_READ | PROT_WRITE, MAP_SHARED, page_fd.get(), 0);
    if (p == MAP_FAILED) {
      return absl::ResourceExhaustedError(absl::StrCat("Queue: mmap: ", std::strerror(errno)));
    }
    fd = std::move(page_fd);
    page = static_cast<Page*>(p);
    return absl::OkStatus();
  }
};

absl::StatusOr<Queue> Queue::create(int64_t maxsize) {
  Queue q;
  EMBER_ASSIGN_OR_RETURN(q.queue_, SimpleQueue::create());
  q.maxsize_ = maxsize > 0 ? maxsize : 0;
  base::UniqueFd fd(::memfd_create("ember_queue", MFD_CLOEXEC));
  if (!fd.valid() || ::ftruncate(fd.get(), sizeof(Shared::Page)) != 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("Queue: cannot create its shared page: ", std::strerror(errno),
                     errno == EMFILE ? "; raise the descriptor limit (ulimit -n)" : ""));
  }
  q.shared_ = std::make_shared<Shared>();
  EMBER_RETURN_IF_ERROR(q.shared_->Map(std::move(fd)));
  new (q.shared_->page) Shared::Page;
  q.shared_->page->size.store(0);
  if (q.maxsize_ > 0 &&
      ::sem_init(&q.shared_->page->free_slots, /*pshared=*/1,
                 static_cast<unsigned>(std::min<int64_t>(q.maxsize_, SEM_VALUE_MAX))) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("Queue: maxsize ", maxsize, " is too large"));
  }
  return q;
}

absl::Status Queue::put(const Value& value, absl::Duration timeout) {
  const absl::Time deadline =
      timeout == absl::InfiniteDuration() ? absl::InfiniteFuture() : absl::Now() + timeout;
  if (maxsize_ > 0) {
    while (true) {
      int r;
      if (deadline == absl::InfiniteFuture()) {
        r = ::sem_wait(&shared_->page->free_slots);
      } else {
        timespec ts = absl::ToTimespec(deadline);
        r = ::sem_timedwait(&shared_->page->free_slots, &ts);
      }
      if (r == 0) break;
      if (errno == EINTR) continue;
      if (errno == ETIMEDOUT) {
        return absl::DeadlineExceededError(
            absl::StrCat("Queue::Put: the queue stayed full (maxsize ", maxsize_, ") for ",
                         absl::FormatDuration(timeout)));
      }
      return absl::InternalError(absl::StrCat("sem_wait: ", std::strerror(errno)));
    }
  }
  absl::Duration left = deadline == absl::InfiniteFuture()
                            ? absl::InfiniteDuration()
                            : std::max(deadline - absl::Now(), absl::ZeroDuration());
  shared_->page->size.fetch_add(1);
  absl::Status s = queue_.put(value, left);
  if (!s.ok()) {
    shared_->page->size.fetch_sub(1);
    if (maxsize_ > 0) ::sem_post(&shared_->page->free_slots);
  }
  return s;
}

absl::StatusOr<Value> Queue::get(absl::Duration timeout) {
  absl::StatusOr<Value> v = queue_.get(timeout);
  // A malformed message still left the queue.
  if (v.ok() || absl::IsInvalidArgument(v.status()) || absl::IsResourceExhausted(v.status())) {
    shared_->page->size.fetch_sub(1);
    if (maxsize_ > 0) ::sem_post(&shared_->page->free_slots);
  }
  return v;
}

absl::StatusOr<std::string> Queue::Encode(const Value& value, std::vector<int>& fds) {
  const Queue& q = *value.get_if<Queue>();
  EMBER_ASSIGN_OR_RETURN(std::string ignored, SimpleQueue::Encode(Value(q.queue_), fds));
  fds.push_back(q.shared_->fd.get());
  return std::string(reinterpret_cast<const char*>(&q.maxsize_), sizeof(q.maxsize_));
}

absl::StatusOr<Value> Queue::Decode(std::vector<base::UniqueFd> fds, std::string_view state) {
  Queue q;
  if (state.size() != sizeof(q.maxsize_)) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed message: a queue's state has ", state.size(), " bytes"));
  }
  std::memcpy(&q.maxsize_, state.data(), sizeof(q.maxsize_));
  struct stat st {};
  if (q.maxsize_ < 0 || ::fstat(fds[2].get(), &st) != 0 ||
      st.st_size != static_cast<off_t>(sizeof(Shared::Page))) {
    return absl::InvalidArgumentError(
        "malformed message: a queue's maxsize or shared page is not valid");
  }
  q.shared_ = std::make_shared<Shared>();
  EMBER_RETURN_IF_ERROR(q.shared_->Map(std::move(fds[2])));
  fds.pop_back();
  EMBER_ASSIGN_OR_RETURN(Value sockets, SimpleQueue::Decode(std::move(fds), ""));
  q.queue_ = *sockets.get_if<SimpleQueue>();
  return Value(std::move(q));
}

const bool Queue::kCodecRegistered = [] {
  RegisterChannelCodec(ChannelKind::kQueue,
                       {.encode = &Queue::Encode, .decode = &Queue::Decode, .fds = 3});
  return true;
}();

int64_t Queue::qsize() const { return std::max<int64_t>(0, shared_->page->size.load()); }

}  // namespace ember::multiprocessing
