#include "tools/version.h"

namespace ember::tools {
namespace internal {

// Defined in version_stamp.cc, which the :version_stamp genrule writes.
extern const char kVersion[];
extern const char kGitCommit[];

}  // namespace internal

std::string_view version() { return internal::kVersion; }

std::string_view git_commit() { return internal::kGitCommit; }

std::string version_line(std::string_view tool) {
  std::string line(tool);
  line.append(" ").append(version()).append(" (git ").append(git_commit()).append(")");
  return line;
}

}  // namespace ember::tools
