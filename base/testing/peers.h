// Test helpers (testonly) that find the peers Ember's tests compare against
// and the project installs itself (tools/install_peers.sh), so that no test
// names a path of one machine.
//
//   absl::StatusOr<std::string> python = ember::testing::torch2_python();
//   if (!python.ok()) GTEST_SKIP() << python.status().message();
//   // run *python on a script of the test's data
//
// The PyTorch 2.x peer is a virtual environment in Ember's cache directory,
// ${XDG_CACHE_HOME:-$HOME/.cache}/ember/peers/torch-2.15.0. `bazel test`
// gives tests neither HOME nor XDG_CACHE_HOME; a missing HOME is the
// account's home directory (as for the shell's ~), so there the peer is found
// where a plain `tools/install_peers.sh` put it. A peer elsewhere reaches
// tests through EMBER_TORCH2_PYTHON, which .bazelrc passes through.
//
// Tests that use a peer read it from outside Bazel's inputs: tag them
// "external", so that a result cached before the peer was installed (a
// skip) is not reused after.
#ifndef EMBER_BASE_TESTING_PEERS_H_
#define EMBER_BASE_TESTING_PEERS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ember::testing {

// The environment variable that names a PyTorch 2.x interpreter to use in
// place of the installed peer.
inline constexpr char kTorch2PythonEnv[] = "EMBER_TORCH2_PYTHON";

// The directory of the PyTorch 2.x peer (which need not exist): the one
// tools/install_peers.sh installs into in the same environment.
std::string torch2_peer_dir();

// The PyTorch 2.x interpreter: $EMBER_TORCH2_PYTHON when set, else the
// peer's bin/python once its install has completed. NotFound otherwise, with
// a message (for GTEST_SKIP) that says what is missing and which command
// installs it.
absl::StatusOr<std::string> torch2_python();

// Runs `script` (a path; the test's data) with `args` on the PyTorch 2.x
// interpreter and returns what it wrote to stdout. The errors of
// torch2_python() (NotFound: skip), and Internal naming the command, its
// exit status and its stderr when it fails. The arguments are passed
// through the shell: plain words only (numbers, paths without spaces).
absl::StatusOr<std::string> run_torch2(const std::string& script,
                                       const std::vector<std::string>& args = {});

}  // namespace ember::testing

#endif  // EMBER_BASE_TESTING_PEERS_H_
