// arc4random and arc4random_buf for the release binaries, from getrandom(2)
// (glibc 2.25). Debian 12's static libstdc++ (std::random_device) and libbsd
// users reference them, and glibc only has them since 2.36; defined here, the
// static link binds those references to these, so the binaries run on glibc
// 2.35 (Ubuntu 22.04) too. Like glibc's, they abort when the kernel cannot
// supply randomness, since callers have no way to see an error.
#include <sys/random.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>

extern "C" {

void arc4random_buf(void* buffer, size_t n) {
  auto* p = static_cast<unsigned char*>(buffer);
  while (n > 0) {
    const ssize_t got = getrandom(p, n, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      std::abort();
    }
    p += got;
    n -= static_cast<size_t>(got);
  }
}

uint32_t arc4random(void) {
  uint32_t value;
  arc4random_buf(&value, sizeof(value));
  return value;
}

}  // extern "C"
