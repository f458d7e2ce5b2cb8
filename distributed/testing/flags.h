// Command-line flags of the test workers (testonly): the value of
// `--name=value`, the first one given, or `fallback`.
//
//   std::string backend = ember::distributed::testing::Flag(argc, argv, "backend", "tcp");
#ifndef EMBER_DISTRIBUTED_TESTING_FLAGS_H_
#define EMBER_DISTRIBUTED_TESTING_FLAGS_H_

#include <string>

namespace ember::distributed::testing {

inline std::string Flag(int argc, char** argv, const std::string& name,
                        const std::string& fallback = "") {
  const std::string prefix = "--" + name + "=";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind(prefix, 0) == 0) return arg.substr(prefix.size());
  }
  return fallback;
}

}  // namespace ember::distributed::testing

#endif  // EMBER_DISTRIBUTED_TESTING_FLAGS_H_
