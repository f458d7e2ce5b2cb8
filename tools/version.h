// The version every Ember tool reports for --version: the VERSION file at the
// repository root and the git commit the tool was built from.
//
//   if (arg == "--version") {
//     std::printf("%s\n", ember::tools::version_line("hub").c_str());  // hub 0.1.0 (git
//     3bb46a69c4fe) return 0;
//   }
//
// The commit comes from Bazel's workspace status (tools/release/
// workspace_status.sh, named in .bazelrc) through a stamped genrule; it is
// "unknown" where the build had none (a source archive, a consumer's
// workspace). It is a volatile status key: a commit alone does not relink the
// tools, so a tool rebuilt for no other reason can report an earlier commit;
// a release built from a clean checkout reports its own.
//
// Thread-safety: constants only.
#ifndef EMBER_TOOLS_VERSION_H_
#define EMBER_TOOLS_VERSION_H_

#include <string>
#include <string_view>

namespace ember::tools {

// The release version, MAJOR.MINOR.PATCH from the VERSION file ("0.1.0").
std::string_view version();

// The short git commit the tools were built from, "unknown" outside git; a
// "-dirty" suffix when the checkout had uncommitted changes.
std::string_view git_commit();

// "<tool> <version> (git <commit>)": what every tool prints for --version.
std::string version_line(std::string_view tool);

}  // namespace ember::tools

#endif  // EMBER_TOOLS_VERSION_H_
