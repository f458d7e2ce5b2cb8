// A program built outside Ember's workspace against @ember//:ember: it
// computes with tensors and checks the answer, so `.ci/run` fails if the
// dependency breaks.
#include <iostream>

#include "tensor/factories.h"
#include "tensor/tensor.h"

int main() {
  ember::Tensor a = ember::arange(6).view({2, 3}).to(ember::kFloat32);
  ember::Tensor b = (a * 2 + 1).sum({1});  // [1+3+5, 7+9+11]
  std::cout << "consumer built against @ember: " << b << "\n";
  return b.equal(ember::tensor({9.0f, 27.0f})) ? 0 : 1;
}
