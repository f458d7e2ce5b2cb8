#include "multiprocessing/queue.h"

#include <semaphore.h>
#include <sys/mman.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <ctime>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tensor/status_macros.h"

namespace ember::multiprocessing {

absl::StatusOr<SimpleQueue> SimpleQueue::Create() {
  EMBER_ASSIGN_OR_RETURN(auto pair, Pipe(/*duplex=*/true));
  SimpleQueue q;
  q.ends_ = std::make_shared<Ends>(
      Ends{std::move(pair.first), std::move(pair.second)});
  return q;
}

absl::Status SimpleQueue::Put(const Value& value, absl::Duration timeout) {
  return ends_->put.Send(value, timeout);
}

absl::StatusOr<Value> SimpleQueue::Get(absl::Duration timeout) {
  return ends_->get.Receive(timeout);
}

bool SimpleQueue::empty() const { return !ends_->get.Poll(); }

// The page every process shares: the free-slot semaphore and the count.
struct Queue::Shared {
  struct Page {
    sem_t free_slots;
    std::atomic<int64_t> size;
  };
  Page* page = nullptr;
  ~Shared() {
    if (page != nullptr) ::munmap(page, sizeof(Page));
  }
};

absl::StatusOr<Queue> Queue::Create(int64_t maxsize) {
  Queue q;
  EMBER_ASSIGN_OR_RETURN(q.queue_, SimpleQueue::Create());
  q.maxsize_ = maxsize > 0 ? maxsize : 0;
  void* p = ::mmap(nullptr, sizeof(Shared::Page), PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("Queue: mmap: ", std::strerror(errno)));
  }
  q.shared_ = std::make_shared<Shared>();
  q.shared_->page = new (p) Shared::Page;
  q.shared_->page->size.store(0);
  if (q.maxsize_ > 0 && ::sem_init(&q.shared_->page->free_slots, /*pshared=*/1,
                                   static_cast<unsigned>(std::min<int64_t>(
                                       q.maxsize_, SEM_VALUE_MAX))) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Queue: maxsize ", maxsize, " is too large"));
  }
  return q;
}

absl::Status Queue::Put(const Value& value, absl::Duration timeout) {
  const absl::Time deadline = timeout == absl::InfiniteDuration()
                                  ? absl::InfiniteFuture()
                                  : absl::Now() + timeout;
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
            absl::StrCat("Queue::Put: the queue stayed full (maxsize ",
                         maxsize_, ") for ", absl::FormatDuration(timeout)));
      }
      return absl::InternalError(
          absl::StrCat("sem_wait: ", std::strerror(errno)));
    }
  }
  absl::Duration left =
      deadline == absl::InfiniteFuture()
          ? absl::InfiniteDuration()
          : std::max(deadline - absl::Now(), absl::ZeroDuration());
  shared_->page->size.fetch_add(1);
  absl::Status s = queue_.Put(value, left);
  if (!s.ok()) {
    shared_->page->size.fetch_sub(1);
    if (maxsize_ > 0) ::sem_post(&shared_->page->free_slots);
  }
  return s;
}

absl::StatusOr<Value> Queue::Get(absl::Duration timeout) {
  absl::StatusOr<Value> v = queue_.Get(timeout);
  // A malformed message still left the queue.
  if (v.ok() || absl::IsInvalidArgument(v.status()) ||
      absl::IsResourceExhausted(v.status())) {
    shared_->page->size.fetch_sub(1);
    if (maxsize_ > 0) ::sem_post(&shared_->page->free_slots);
  }
  return v;
}

int64_t Queue::qsize() const {
  return std::max<int64_t>(0, shared_->page->size.load());
}

}  // namespace ember::multiprocessing
