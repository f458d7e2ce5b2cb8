#include "parallel/warning.h"

#include <cstdio>
#include <mutex>
#include <set>
#include <string>

namespace ember::parallel::internal {

void Warn(std::string_view message) {
  static std::mutex mutex;
  static std::set<std::string, std::less<>> shown;
  std::lock_guard<std::mutex> lock(mutex);
  if (!shown.emplace(message).second) return;
  std::fprintf(stderr, "UserWarning: %.*s\n", static_cast<int>(message.size()), message.data());
}

}  // namespace ember::parallel::internal
