// A worker for multihost_test: joins the job with the tcp backend through
// env:// (or the init method given as its argument, with WORLD_SIZE from the
// environment and the rank assigned), all_reduces a tensor holding rank + 1
// and checks that every element became 1 + 2 + ... + world_size. Exit 0 on
// success, 1 otherwise.
#include <cstdio>
#include <cstdlib>

#include "distributed/distributed.h"
#include "tensor/factories.h"
#include "tensor/tensor.h"

int main(int argc, char** argv) {
  namespace dist = ember::distributed;
  dist::InitOptions options;  // env://, filled in by launch
  options.backend = "tcp";
  if (argc > 1) {
    options.init_method = argv[1];
    options.world_size = std::atoi(std::getenv("WORLD_SIZE"));
  }
  options.timeout = absl::Seconds(60);
  absl::Status init = dist::init_process_group(options);
  if (!init.ok()) {
    std::fprintf(stderr, "multihost_worker: init_process_group: %s\n",
                 std::string(init.message()).c_str());
    return 1;
  }
  int rank = dist::get_rank();
  int world_size = dist::get_world_size();
  ember::Tensor t = ember::full({4096}, static_cast<double>(rank + 1));
  if (absl::Status s = dist::all_reduce(t); !s.ok()) {
    std::fprintf(stderr, "multihost_worker rank %d: all_reduce: %s\n", rank,
                 std::string(s.message()).c_str());
    return 1;
  }
  const float expected = world_size * (world_size + 1) / 2.0f;
  const float* data = t.data_ptr<float>();
  for (int i = 0; i < 4096; ++i) {
    if (data[i] != expected) {
      std::fprintf(stderr, "multihost_worker rank %d: element %d is %g, expected %g\n", rank, i,
                   data[i], expected);
      return 1;
    }
  }
  std::printf("multihost_worker rank %d of %d: all_reduce gave %g\n", rank, world_size, expected);
  (void)dist::destroy_process_group();
  return 0;
}
