// What a backend can learn about a peer rank's process on the same host, for
// error messages that name a stopped or dead peer: whether two ranks share a
// host (and namespaces), and the state of a process by pid.
//
//   if (peer_host_key == HostKey({"pid"})) state = ProcessState(peer_pid);
//
// Thread-safety: free functions that read /proc; safe from any thread.
#ifndef EMBER_DISTRIBUTED_PEER_PROCESS_H_
#define EMBER_DISTRIBUTED_PEER_PROCESS_H_

#include <sys/types.h>

#include <initializer_list>
#include <string>

namespace ember::distributed {

// A key equal on two ranks exactly when they run on the same boot of the
// same host and in the same Linux `namespaces` (e.g. {"pid"} to see each
// other's pids, {"pid", "net"} to share memory by descriptor as well).
std::string HostKey(std::initializer_list<const char*> namespaces);

// "running", "sleeping", "stopped", "stopped by a debugger", "exited", ...
// for the process `pid` (read from /proc/<pid>/stat).
std::string ProcessState(pid_t pid);

}  // namespace ember::distributed

#endif  // EMBER_DISTRIBUTED_PEER_PROCESS_H_
