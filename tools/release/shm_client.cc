// A client of the shm manager for release_test: shares one tensor with the
// file_system strategy (which starts $EMBER_SHM_MANAGER), prints the region
// it made, and exits without cleaning up, as a crashed process would; the
// manager must unlink the region and then exit and remove its directory.
//
//   EMBER_SHM_MANAGER=bin/shm_manager EMBER_SHM_PREFIX=/embertest_x shm_client
#include <dirent.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "multiprocessing/sharing.h"
#include "tensor/factories.h"

int main() {
  namespace mp = ember::multiprocessing;
  if (absl::Status s = mp::set_sharing_strategy("file_system"); !s.ok()) {
    std::fprintf(stderr, "shm_client: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  ember::Tensor t = ember::zeros({1024});
  if (absl::Status s = mp::share_memory_(t); !s.ok()) {
    std::fprintf(stderr, "shm_client: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  const char* prefix = std::getenv("EMBER_SHM_PREFIX");
  const std::string wanted = prefix ? std::string(prefix + 1) : "ember";
  if (DIR* d = ::opendir("/dev/shm")) {
    while (dirent* e = ::readdir(d)) {
      if (std::string(e->d_name).rfind(wanted, 0) == 0) std::printf("%s\n", e->d_name);
    }
    ::closedir(d);
  }
  std::fflush(stdout);
  ::_exit(0);  // no goodbye to the manager, no unlink
}
