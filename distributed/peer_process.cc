#include "distributed/peer_process.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

#include "absl/strings/str_cat.h"

namespace ember::distributed {
namespace {

std::string ReadFirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

}  // namespace

std::string HostKey(std::initializer_list<const char*> namespaces) {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  std::string key = absl::StrCat(ReadFirstLine("/proc/sys/kernel/random/boot_id"), "/", host);
  for (const char* ns : namespaces) {
    struct stat st {};
    const bool known = stat(absl::StrCat("/proc/self/ns/", ns).c_str(), &st) == 0;
    absl::StrAppend(&key, "/", known ? absl::StrCat(st.st_ino) : std::string("?"));
  }
  return key;
}

std::string ProcessState(pid_t pid) {
  const std::string line = ReadFirstLine(absl::StrCat("/proc/", pid, "/stat"));
  if (line.empty()) return "exited";
  const size_t paren = line.rfind(')');
  if (paren == std::string::npos || paren + 2 >= line.size()) return "unknown";
  switch (line[paren + 2]) {
    case 'R':
      return "running";
    case 'S':
      return "sleeping";
    case 'D':
      return "in uninterruptible I/O";
    case 'T':
      return "stopped";
    case 't':
      return "stopped by a debugger";
    case 'Z':
    case 'X':
      return "exited";
    default:
      return "unknown";
  }
}

}  // namespace ember::distributed
