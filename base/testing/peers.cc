#include "base/testing/peers.h"

#include <pwd.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ember::testing {
namespace {

// tools/install_peers.sh names the environment the same way and writes the
// stamp last, once the install has been checked.
constexpr char kTorch2Peer[] = "torch-2.15.0";
constexpr char kStamp[] = "ember-peer-installed";

// The account's home directory, from the password database; empty when it
// has none.
std::string AccountHome() {
  long size = ::sysconf(_SC_GETPW_R_SIZE_MAX);
  std::vector<char> buffer(size > 0 ? size : 16384);
  struct passwd entry;
  struct passwd* found = nullptr;
  if (::getpwuid_r(::getuid(), &entry, buffer.data(), buffer.size(), &found) != 0 ||
      found == nullptr || found->pw_dir == nullptr) {
    return "";
  }
  return found->pw_dir;
}

// Ember's cache directory: an absolute XDG_CACHE_HOME (a relative one is
// ignored, as the XDG base directory specification says), else
// $HOME/.cache, else the account's home's .cache.
std::string CacheHome() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg != nullptr && xdg[0] == '/') return xdg;
  const char* home = std::getenv("HOME");
  return absl::StrCat(home != nullptr && home[0] != '\0' ? std::string(home) : AccountHome(),
                      "/.cache");
}

}  // namespace

std::string torch2_peer_dir() { return absl::StrCat(CacheHome(), "/ember/peers/", kTorch2Peer); }

absl::StatusOr<std::string> torch2_python() {
  if (const char* env = std::getenv(kTorch2PythonEnv); env != nullptr && env[0] != '\0') {
    if (::access(env, X_OK) == 0) return std::string(env);
    return absl::NotFoundError(absl::StrCat(kTorch2PythonEnv, " is ", env,
                                            ", which is not an executable file; point it at a "
                                            "PyTorch 2.x interpreter, or unset it to use the peer "
                                            "that tools/install_peers.sh installs"));
  }
  const std::string dir = torch2_peer_dir();
  const std::string python = dir + "/bin/python";
  if (::access(python.c_str(), X_OK) != 0) {
    return absl::NotFoundError(absl::StrCat("no PyTorch 2.x peer at ", dir,
                                            "; install it with tools/install_peers.sh (a peer "
                                            "installed elsewhere reaches tests through ",
                                            kTorch2PythonEnv, ")"));
  }
  if (::access(absl::StrCat(dir, "/", kStamp).c_str(), F_OK) != 0) {
    return absl::NotFoundError(absl::StrCat("the PyTorch 2.x peer at ", dir,
                                            " is incomplete (its install did not finish); rerun "
                                            "tools/install_peers.sh"));
  }
  return python;
}

absl::StatusOr<std::string> run_torch2(const std::string& script,
                                       const std::vector<std::string>& args) {
  absl::StatusOr<std::string> python = torch2_python();
  if (!python.ok()) return python.status();
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string err_path =
      absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/run_torch2.", ::getpid(), ".stderr");
  const std::string command = absl::StrCat(*python, " ", script, args.empty() ? "" : " ",
                                           absl::StrJoin(args, " "), " 2>", err_path);
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return absl::InternalError(absl::StrCat("could not run ", command));
  std::string out;
  char buffer[65536];
  for (size_t n; (n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0;) out.append(buffer, n);
  const int status = ::pclose(pipe);
  std::ostringstream err;
  err << std::ifstream(err_path).rdbuf();
  std::remove(err_path.c_str());
  if (status != 0) {
    return absl::InternalError(absl::StrCat(command, " failed (wait status ", status,
                                            "); its stderr:\n", err.str()));
  }
  return out;
}

}  // namespace ember::testing
