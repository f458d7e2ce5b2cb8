// The shm manager daemon's event loop (the `shm_manager` binary's core).
//
// The daemon serves a UNIX stream socket and records, for each connected
// client, the file_system regions it registers. It unlinks a client's regions
// when the client disconnects without kGoodbye (it died), and, once no client
// has been connected for `grace` (or, before the first client, for
// `first_client_timeout`), unlinks every region still recorded, removes its
// socket and returns. Protocol: multiprocessing/manager_protocol.h.
//
//   ServerOptions options{.socket_path = dir + "/manager.sock",
//                         .grace = absl::Seconds(1)};
//   absl::Status done = RunServer(options);   // returns when idle
//
// Single-threaded: one poll() loop; no call blocks longer than the grace
// period.
#ifndef EMBER_TOOLS_SHM_MANAGER_SERVER_H_
#define EMBER_TOOLS_SHM_MANAGER_SERVER_H_

#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace ember::shm_manager {

struct ServerOptions {
  // Where to listen; its directory should be private (0700).
  std::string socket_path;
  // How long to wait for a new client once the last one has gone.
  absl::Duration grace = absl::Seconds(1);
  // How long to wait for the first client (at least `grace`): the process
  // that started the daemon may be slow to connect on a loaded machine.
  absl::Duration first_client_timeout = absl::Seconds(10);
  // When >= 0, "ok\n" (or the bind error) is written there once listening,
  // then it is closed.
  int ready_fd = -1;
};

// Serves until idle for `grace`, then cleans up. Fails only when the socket
// cannot be set up.
absl::Status RunServer(const ServerOptions& options);

}  // namespace ember::shm_manager

#endif  // EMBER_TOOLS_SHM_MANAGER_SERVER_H_
