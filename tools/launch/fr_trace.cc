// fr_trace: reads every rank's flight recorder dump of a job and prints the
// first point where the ranks diverged (PyTorch's torchfrtrace for Ember's
// dump format; Note [First divergence] in flight_analysis.cc).
//
//   fr_trace [--world_size=N] <dump file or directory>...
//
// Prints the verdict on the first line, then each rank's progress per group.
// Exit codes: 0 when it could read the dumps (whatever the verdict), 2 for
// bad arguments or unreadable dumps.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "tools/launch/flight_analysis.h"

namespace ember::launch::flight {
namespace {

constexpr char kUsage[] =
    "usage: fr_trace [--world_size=N] <dump file or directory>...\n"
    "Reads flight recorder dumps (TORCH_FR_DUMP_TEMP_FILE) and prints where the ranks\n"
    "diverged first. --world_size names the ranks that left no dump.\n";

int Main(int argc, char** argv) {
  std::vector<std::string> paths;
  int world_size = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::printf("%s", kUsage);
      return 0;
    }
    if (absl::StartsWith(arg, "--world_size=")) {
      if (!absl::SimpleAtoi(arg.substr(13), &world_size) || world_size < 1) {
        std::fprintf(stderr, "fr_trace: --world_size needs a positive integer, got '%s'\n",
                     arg.substr(13).c_str());
        return 2;
      }
      continue;
    }
    if (absl::StartsWith(arg, "--")) {
      std::fprintf(stderr, "fr_trace: unknown option '%s'\n%s", arg.c_str(), kUsage);
      return 2;
    }
    paths.push_back(arg);
  }
  if (paths.empty()) {
    std::fprintf(stderr, "fr_trace: no dumps given\n%s", kUsage);
    return 2;
  }
  absl::StatusOr<std::vector<RankDump>> dumps = ReadDumps(paths);
  if (!dumps.ok()) {
    std::fprintf(stderr, "fr_trace: %s\n", std::string(dumps.status().message()).c_str());
    return 2;
  }
  if (dumps->empty()) {
    std::fprintf(stderr, "fr_trace: no flight recorder dumps found in the paths given\n");
    return 2;
  }
  const Verdict verdict = Analyse(*dumps, world_size);
  std::printf("%s\n", verdict.text.c_str());
  for (const std::string& line : Progress(*dumps)) std::printf("  %s\n", line.c_str());
  return 0;
}

}  // namespace
}  // namespace ember::launch::flight

int main(int argc, char** argv) { return ember::launch::flight::Main(argc, argv); }
