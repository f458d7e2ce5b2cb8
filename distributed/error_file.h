// The worker side of PyTorch's TORCHELASTIC_ERROR_FILE convention
// (torch.distributed.elastic.multiprocessing.errors.record): a program's
// main runs its body through record(), and when the body returns a non-OK
// Status, throws (ember::Error or any std::exception), or the process dies
// of a fatal signal, the failure is written as JSON to the file that the
// launcher named in TORCHELASTIC_ERROR_FILE, where the launcher (launch's
// failure summary) reads it.
//
//   ```cpp compile-only
//   #include "distributed/error_file.h"
//   int main(int argc, char** argv) {
//     return ember::distributed::record([&]() -> absl::Status {
//       EMBER_RETURN_IF_ERROR(ember::distributed::init_process_group({.backend = "tcp"}));
//       // ... training ...
//       return absl::OkStatus();
//     });
//   }
//   ```
//
// The file (PyTorch's layout, so its tooling can read it):
//   {"message": {"message": "<Status or exception text>",
//                "extraInfo": {"py_callstack": "<stack, for a signal>",
//                              "timestamp": "<unix seconds>"}}}
// (py_callstack only when there is a stack: torchrun's summary shows it in
// place of the message when present.)
// Without TORCHELASTIC_ERROR_FILE nothing is written; the failure is still
// printed to stderr.
//
// Thread-safety: call record() once, from main's thread.
#ifndef EMBER_DISTRIBUTED_ERROR_FILE_H_
#define EMBER_DISTRIBUTED_ERROR_FILE_H_

#include <functional>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace ember::distributed {

// Runs `body` and returns main's exit code: 0 when it returns OK; 1 after
// writing its error (a non-OK Status or an exception's what()) to stderr and
// the error file. Installs a fatal-signal handler (SIGSEGV, SIGBUS, SIGFPE,
// SIGILL, SIGABRT; chained to any handler already installed) that writes
// the signal and the stack to the error file before the process dies.
int record(const std::function<absl::Status()>& body);

// Writes `message` (and `stack`) to TORCHELASTIC_ERROR_FILE in the format
// above; OK without the variable.
absl::Status write_error_file(std::string_view message, std::string_view stack = "");

}  // namespace ember::distributed

#endif  // EMBER_DISTRIBUTED_ERROR_FILE_H_
