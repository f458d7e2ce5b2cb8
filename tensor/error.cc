#include "tensor/error.h"

#include <cstdio>
#include <cstdlib>

namespace ember::internal {

void ThrowError(std::string message) { throw Error(std::move(message)); }

void AssertFailed(const char* file, int line, const char* cond,
                  const std::string& message) {
  std::fprintf(stderr, "%s:%d: internal assertion failed: %s %s\n", file, line,
               cond, message.c_str());
  std::abort();
}

}  // namespace ember::internal
