// A program built outside Ember's workspace against @ember//:ember: it
// computes with tensors and checks the answer, so `.ci/run` fails if the
// dependency breaks, and says whether CUDA can be used (a build without CUDA
// support, EMBER_CUDA=0 or no toolkit, says "Ember was built without CUDA
// support"; one with it names the device count or the runtime's reason).
#include <iostream>

#include "cuda/device.h"
#include "tensor/factories.h"
#include "tensor/tensor.h"

int main() {
  ember::Tensor a = ember::arange(6).view({2, 3}).to(ember::kFloat32);
  ember::Tensor b = (a * 2 + 1).sum({1});  // [1+3+5, 7+9+11]
  std::cout << "consumer built against @ember: " << b << "\n";
  if (ember::cuda::is_available()) {
    std::cout << "CUDA: " << ember::cuda::device_count() << " device(s)\n";
  } else {
    std::cout << "CUDA: not available: " << ember::cuda::unavailable_reason() << "\n";
  }
  return b.equal(ember::tensor({9.0f, 27.0f})) ? 0 : 1;
}
