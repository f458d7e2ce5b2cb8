// What data/'s benchmark binaries share of their command lines (not API).
#ifndef EMBER_DATA_BENCHMARK_FLAGS_H_
#define EMBER_DATA_BENCHMARK_FLAGS_H_

#include <string_view>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"

namespace ember::data {

// "0,1,2" -> {0, 1, 2}; parts that are not integers are left out.
inline std::vector<int> IntList(std::string_view list) {
  std::vector<int> out;
  for (absl::string_view part : absl::StrSplit(absl::string_view(list.data(), list.size()), ',')) {
    int value = 0;
    if (absl::SimpleAtoi(part, &value)) out.push_back(value);
  }
  return out;
}

}  // namespace ember::data

#endif  // EMBER_DATA_BENCHMARK_FLAGS_H_
