// Desync reports (Note [Desync reports]): a group's progress published in
// its store, so that a rank whose collective times out can name the ranks
// that are behind and where they are, on every host and every backend that
// has a store.
//
//   ```cpp
//   // Inside ProcessGroup (backends call PublishProgress with their store):
//   ember::distributed::ProgressPublisher publisher(store, "default_pg/0/", recorder);
//   std::string why = publisher.Report(/*seq=*/57);
//   // "desync report: rank 1 is behind: its last collective is #56 broadcast (completed #56)"
//   ```
//
// Environment: EMBER_DESYNC_PUBLISH_MS, how often a changed progress is
// published (default 100; 0 turns publishing off).
//
// Thread-safety: thread-safe; the publishing thread stops in the destructor
// (which waits at most 200 ms for a store call it is in to return).
#ifndef EMBER_DISTRIBUTED_DESYNC_H_
#define EMBER_DISTRIBUTED_DESYNC_H_

#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "distributed/flight_recorder.h"
#include "distributed/store.h"

namespace ember::distributed {

class ProgressPublisher {
 public:
  // Publishes `recorder`'s progress as <prefix>ember_progress/<rank>.
  ProgressPublisher(std::shared_ptr<Store> store, std::string prefix,
                    std::shared_ptr<FlightRecorder> recorder);
  ~ProgressPublisher();
  ProgressPublisher(const ProgressPublisher&) = delete;
  ProgressPublisher& operator=(const ProgressPublisher&) = delete;

  // Why collective `seq` could not finish, from the ranks' published
  // progress: the ranks that have not entered it, with their last entered
  // and completed collectives, and the ranks that published nothing. Blocks
  // for the store reads (at most about 100 ms per silent rank).
  std::string Report(int64_t seq);

 private:
  // What the publishing thread uses. The thread holds it too, so that a
  // thread still inside a store call (a peer's store server gone: the call
  // retries up to the store's timeout) may outlive the publisher; the
  // destructor waits for it only briefly (Note [Desync reports]).
  struct Shared {
    std::shared_ptr<Store> store;
    std::string prefix;
    std::shared_ptr<FlightRecorder> recorder;
    absl::Duration period;
    absl::Mutex mu;
    bool stopping ABSL_GUARDED_BY(mu) = false;
    absl::Mutex publish_mu;  // one publish at a time
    std::string published ABSL_GUARDED_BY(publish_mu);
    absl::Notification finished;  // the thread has left its loop

    std::string Key(int rank) const;
    // Publishes the current progress when it changed.
    void Publish() ABSL_LOCKS_EXCLUDED(publish_mu);
    void Loop() ABSL_LOCKS_EXCLUDED(mu);
  };

  std::shared_ptr<Shared> shared_;
  std::thread thread_;
};

}  // namespace ember::distributed

#endif  // EMBER_DISTRIBUTED_DESYNC_H_
