// The model of the training-step benchmarks (nn/mlp_benchmark,
// parallel/ddp_benchmark, parallel/data_parallel_benchmark) and of their
// PyTorch peers (../shared/peers/torch_ddp.py): `hidden` ReLU layers of
// `width` and a linear head of `classes`, initialised after manual_seed(0),
// so every benchmark times the same network.
//
//   ```cpp
//   #include "nn/benchmark_mlp.h"
//   std::shared_ptr<ember::nn::Sequential> mlp = ember::nn::benchmark_mlp();   // 4 x 512 -> 10
//   if (mlp->parameters().size() != 10) return absl::InternalError("5 weights, 5 biases");
//   ```
#ifndef EMBER_NN_BENCHMARK_MLP_H_
#define EMBER_NN_BENCHMARK_MLP_H_

#include <cstdint>
#include <memory>

#include "nn/activation.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "tensor/factories.h"

namespace ember::nn {

inline std::shared_ptr<Sequential> benchmark_mlp(int64_t width = 512, int hidden = 4,
                                                 int64_t classes = 10) {
  manual_seed(0);
  auto model = std::make_shared<Sequential>();
  for (int i = 0; i < hidden; ++i) {
    model->push_back(std::make_shared<Linear>(width, width));
    model->push_back(std::make_shared<ReLU>());
  }
  model->push_back(std::make_shared<Linear>(width, classes));
  return model;
}

}  // namespace ember::nn

#endif  // EMBER_NN_BENCHMARK_MLP_H_
