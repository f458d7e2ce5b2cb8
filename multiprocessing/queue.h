// Queue and SimpleQueue: multi-producer, multi-consumer queues of Values
// between processes (torch.multiprocessing.Queue / SimpleQueue).
//
//   ```cpp
//   #include "multiprocessing/process.h"
//   #include "multiprocessing/queue.h"
//   #include "tensor/factories.h"
//   namespace mp = ember::multiprocessing;
//   EMBER_ASSIGN_OR_RETURN(mp::Queue q, mp::Queue::create());
//   EMBER_ASSIGN_OR_RETURN(mp::Process child, mp::Process::start([&]() -> absl::Status {
//     EMBER_ASSIGN_OR_RETURN(mp::Value v, q.get(absl::Seconds(10)));
//     return v.as<ember::Tensor>().status();
//   }));
//   ember::Tensor weights = ember::zeros({4});
//   EMBER_RETURN_IF_ERROR(q.put(mp::Value(weights)));  // weights now in shared memory
//   EMBER_ASSIGN_OR_RETURN(mp::ExitStatus end, child.join(absl::Seconds(10)));
//   if (!end.ok()) return absl::InternalError("the child ended with " + end.str());
//   ```
//
// A queue is a SOCK_SEQPACKET socket pair created before fork(): every put is
// one message, so any number of processes may put and get at once without
// locks, and each message reaches exactly one getter. Tensors move to shared
// memory when put; getters receive views of the same bytes (Hogwild style
// writes are seen by everyone). Messages follow Connection's rules (size
// limit, descriptors) and are FIFO per producer.
//
// Queue adds an optional bound (`maxsize`, as multiprocessing.Queue), and
// qsize()/empty(), kept in a small shared page; SimpleQueue has neither and
// only blocks when the socket buffer is full.
//
// Handles are cheap to copy and share the same queue; copies made before
// fork() work in the child, and a queue passed to a spawned child (or put in
// a message) arrives as a handle on the same sockets and shared page.
// Thread-safe and process-safe.
#ifndef EMBER_MULTIPROCESSING_QUEUE_H_
#define EMBER_MULTIPROCESSING_QUEUE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/unique_fd.h"
#include "multiprocessing/connection.h"
#include "multiprocessing/value.h"

namespace ember::multiprocessing {

class SimpleQueue {
 public:
  // Errors: ResourceExhausted when no descriptors are left.
  static absl::StatusOr<SimpleQueue> create();

  // Blocks while the socket buffer is full, up to `timeout`. Errors: see
  // Connection::send.
  absl::Status put(const Value& value, absl::Duration timeout = absl::InfiniteDuration());
  // Blocks up to `timeout` for a message (DeadlineExceeded). Errors: see
  // Connection::recv.
  absl::StatusOr<Value> get(absl::Duration timeout = absl::InfiniteDuration());
  // True when no message is waiting (a snapshot).
  bool empty() const;

  // The sockets, for tests that write raw bytes into the queue.
  Connection& put_end() { return ends_->put; }

 private:
  friend class Queue;
  // How a SimpleQueue crosses a message (message.h): its two sockets.
  static absl::StatusOr<std::string> Encode(const Value& value, std::vector<int>& fds);
  static absl::StatusOr<Value> Decode(std::vector<base::UniqueFd> fds, std::string_view state);
  static const bool kCodecRegistered;

  struct Ends {
    Connection put;
    Connection get;
  };
  std::shared_ptr<Ends> ends_;
};

class Queue {
 public:
  // `maxsize` <= 0: unbounded. Errors: ResourceExhausted (descriptors,
  // memory).
  static absl::StatusOr<Queue> create(int64_t maxsize = 0);

  // Waits up to `timeout` for room when the queue holds `maxsize` messages
  // (DeadlineExceeded, naming maxsize), then sends. Errors: see
  // Connection::send.
  absl::Status put(const Value& value, absl::Duration timeout = absl::InfiniteDuration());
  absl::StatusOr<Value> get(absl::Duration timeout = absl::InfiniteDuration());
  // Messages put and not yet got, across all processes (a snapshot).
  int64_t qsize() const;
  bool empty() const { return qsize() == 0; }
  int64_t maxsize() const { return maxsize_; }

 private:
  // How a Queue crosses a message: its sockets, its page's memfd, maxsize.
  static absl::StatusOr<std::string> Encode(const Value& value, std::vector<int>& fds);
  static absl::StatusOr<Value> Decode(std::vector<base::UniqueFd> fds, std::string_view state);
  static const bool kCodecRegistered;

  struct Shared;
  SimpleQueue queue_;
  std::shared_ptr<Shared> shared_;  // the shared page
  int64_t maxsize_ = 0;
};

}  // namespace ember::multiprocessing

#endif  // EMBER_MULTIPROCESSING_QUEUE_H_
