// The shm manager daemon's event loop (the `shm_manager` binary's core).
//
// The daemon serves a UNIX stream socket and records, for each connected
// client, the file_system regions it registers. It unlinks a client's regions
// when the client disconnects without kGoodbye (it died), and, once no client
// has been connected for `grace` (or, before the first client, for
// `first_client_timeout`), unlinks every region still recorded, removes its
// socket and directory and returns. Protocol and its rules (who may register
// and unregister what): multiprocessing/manager_protocol.h.
//
// Its directory (the socket's, private to the user) also holds:
//   lock     flock'd for the daemon's whole life and holding its pid and pid
//            namespace, so that a later daemon can tell a dead predecessor
//            from a live one;
//   journal  every registration, written before its ack, and every release;
//            rewritten with only the live records once it grows past
//            kJournalCompactBytes, so it stays bounded by what is registered.
// On start, the daemon looks at its siblings (`ember-shm-*` directories of
// the same user beside its own) and reaps every one whose daemon died (its
// lock is free): the regions its journal records are unlinked when their
// client is dead too, or adopted (watched until that client dies) when it is
// still running; then the directory is removed (Note [Reaping a dead
// manager]).
//
//   ServerOptions options{.socket_path = dir + "/manager.sock",
//                         .grace = absl::Seconds(1)};
//   absl::Status done = RunServer(options);   // returns when idle
//
// Single-threaded: one poll() loop; no call blocks longer than the grace
// period.
#ifndef EMBER_TOOLS_SHM_MANAGER_SERVER_H_
#define EMBER_TOOLS_SHM_MANAGER_SERVER_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace ember::shm_manager {

// The journal is rewritten once it is larger than this and than twice its
// live records.
inline constexpr size_t kJournalCompactBytes = 64 << 10;
// A sibling directory with no lock file (a starter that died before its
// daemon ran, or a daemon from before locks) is reaped once this old and its
// socket refuses connections.
inline constexpr absl::Duration kStaleDirectoryAge = absl::Seconds(60);

struct ServerOptions {
  // Where to listen; its directory should be private (0700) and is where the
  // lock and journal live.
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

// Serves until idle for `grace`, then cleans up. Fails only when the socket,
// lock or journal cannot be set up.
absl::Status RunServer(const ServerOptions& options);

}  // namespace ember::shm_manager

#endif  // EMBER_TOOLS_SHM_MANAGER_SERVER_H_
