// Containers and shape modules: Sequential, Flatten and Identity, as
// torch.nn's.
//
//   ```cpp
//   #include "nn/activation.h"
//   #include "nn/container.h"
//   #include "nn/linear.h"
//   #include "tensor/factories.h"
//   auto net = std::make_shared<ember::nn::Sequential>();
//   net->push_back(std::make_shared<ember::nn::Linear>(784, 128));
//   net->push_back(std::make_shared<ember::nn::ReLU>());
//   net->push_back(std::make_shared<ember::nn::Linear>(128, 10));
//   ember::Tensor logits = (*net)(ember::randn({32, 784}));  // [32, 10]
//   // Or all at once:
//   std::vector<std::shared_ptr<ember::nn::Module>> layers = {
//       std::make_shared<ember::nn::Linear>(4, 2), std::make_shared<ember::nn::Tanh>()};
//   auto small = std::make_shared<ember::nn::Sequential>(layers);  // "0.weight", "0.bias"
//   ```
//
// Sequential calls its children in order, each through operator() so that
// their hooks run. Children are registered under "0", "1", ..., so parameter
// names read "0.weight", "2.bias", as in PyTorch. clone() clones every child.
//
// Note [Sequential fuses a Linear and its activation]
// Where a child that is exactly a Linear with a bias is followed by exactly a
// ReLU or a GELU("tanh"), neither with hooks, and the input's device fuses
// them (functional::fuses_linear_activation: CUDA), the pair runs as one
// functional::linear_activation (Note [Linear and its activation] in
// linear.h): what the pair returns and every gradient are the same
// computation, the intermediate output is never visible, and subclasses or
// hooked modules run unfused. On the CPU nothing changes.
//
// Errors: indexing outside the container and bad dims throw ember::Error.
// Thread-safety: as Module (nn/module.h).
#ifndef EMBER_NN_CONTAINER_H_
#define EMBER_NN_CONTAINER_H_

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nn/module.h"
#include "tensor/tensor.h"

namespace ember::nn {

class Sequential : public Module {
 public:
  Sequential() = default;
  explicit Sequential(std::vector<std::shared_ptr<Module>> modules);

  // Appends `module` under the name of its position.
  void push_back(std::shared_ptr<Module> module);
  size_t size() const { return modules_.size(); }
  // The module at `index` (negative counts from the end).
  std::shared_ptr<Module> operator[](int64_t index) const;

  Tensor forward(const Tensor& input) override;
  std::shared_ptr<Module> CloneImpl(std::optional<Device> device) const override;

 protected:
  Sequential(const Sequential& other) : Module(other) {}

 private:
  std::vector<std::shared_ptr<Module>> modules_;
};

// Flattens dims start_dim..end_dim into one (default: all but the batch dim).
class Flatten : public Cloneable<Flatten> {
 public:
  explicit Flatten(int64_t start_dim = 1, int64_t end_dim = -1)
      : start_dim_(start_dim), end_dim_(end_dim) {}
  void reset() override {}
  Tensor forward(const Tensor& input) override { return input.flatten(start_dim_, end_dim_); }

 protected:
  std::string extra_repr() const override;

 private:
  int64_t start_dim_;
  int64_t end_dim_;
};

// Returns its input.
class Identity : public Cloneable<Identity> {
 public:
  Identity() = default;
  void reset() override {}
  Tensor forward(const Tensor& input) override { return input; }
};

}  // namespace ember::nn

#endif  // EMBER_NN_CONTAINER_H_
