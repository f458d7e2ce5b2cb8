// The process-wide client of the shm manager daemon (tools/shm_manager).
//
// The file_system strategy registers every region it creates here before
// creating it, so that the daemon can unlink the region should this process
// die. The first call in a process tree starts the daemon; forked children
// inherit its address and open their own connections.
//
//   EMBER_RETURN_IF_ERROR(RegisterRegion("/ember_41_7_3f2a"));
//   ...
//   UnregisterRegion("/ember_41_7_3f2a");   // after shm_unlink
//
// Finding the daemon's binary, in order:
//   1. $EMBER_SHM_MANAGER (a path to the binary);
//   2. `shm_manager` next to the current executable;
//   3. Bazel runfiles: <runfiles>/ember/tools/shm_manager/shm_manager (a
//      target that uses file_system should have //tools/shm_manager in data).
// Other settings: $EMBER_SHM_MANAGER_GRACE_MS (how long the daemon waits for
// new clients once the last has gone; default 1000) and
// $EMBER_SHM_MANAGER_SOCKET (connect to this daemon instead of starting one;
// set for spawned children).
//
// Thread-safe; each call blocks for at most a few seconds (starting the
// daemon, waiting for an ack) and fails with DeadlineExceeded beyond that.
#ifndef EMBER_MULTIPROCESSING_MANAGER_CLIENT_H_
#define EMBER_MULTIPROCESSING_MANAGER_CLIENT_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ember::multiprocessing {

// Records `name` with the daemon and waits for its ack. Fails (Unavailable,
// NotFound, DeadlineExceeded) when no daemon can be reached or started.
absl::Status RegisterRegion(const std::string& name);
// Tells the daemon `name` was unlinked. Best effort, non-blocking.
void UnregisterRegion(const std::string& name);
// Connects (starting the daemon if needed) without registering anything:
// processes that only map others' regions call this to keep the daemon alive.
absl::Status ConnectToManager();
// Says goodbye and closes the connection: called when the process exits
// normally, so that the daemon leaves this process's live regions to the
// processes still using them.
void DisconnectFromManager();

// The socket of the daemon this process uses ("" before the first use).
std::string ManagerSocketPath();
// Where the daemon's binary is (see above), or NotFound listing the places
// tried.
absl::StatusOr<std::string> FindManagerBinary();

}  // namespace ember::multiprocessing

#endif  // EMBER_MULTIPROCESSING_MANAGER_CLIENT_H_
