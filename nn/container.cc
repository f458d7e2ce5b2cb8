#include "nn/container.h"

#include <optional>
#include <typeinfo>
#include <utility>

#include "absl/strings/str_cat.h"
#include "nn/activation.h"
#include "nn/linear.h"
#include "tensor/error.h"

namespace ember::nn {

Sequential::Sequential(std::vector<std::shared_ptr<Module>> modules) {
  for (auto& m : modules) push_back(std::move(m));
}

void Sequential::push_back(std::shared_ptr<Module> module) {
  EMBER_CHECK(module != nullptr, "Sequential::push_back: module ", modules_.size(), " is null");
  register_module(std::to_string(modules_.size()), module);
  modules_.push_back(std::move(module));
}

std::shared_ptr<Module> Sequential::operator[](int64_t index) const {
  const int64_t n = static_cast<int64_t>(modules_.size());
  EMBER_CHECK(index >= -n && index < n, "Sequential: index ", index,
              " is out of range for a container of ", n, " modules");
  return modules_[index < 0 ? index + n : index];
}

namespace {

// Note [Sequential fuses a Linear and its activation]: `first` and `second`
// as one linear_activation on `x`, or nullopt when they don't qualify.
std::optional<Tensor> FusedPair(Module& first, Module& second, const Tensor& x) {
  if (!x.defined() || typeid(first) != typeid(Linear) || first.has_hooks() ||
      second.has_hooks() || !functional::fuses_linear_activation(x.device())) {
    return std::nullopt;
  }
  const auto& linear = static_cast<Linear&>(first);
  if (!linear.bias().defined()) return std::nullopt;
  functional::LinearActivation act;
  if (typeid(second) == typeid(ReLU)) {
    act = functional::LinearActivation::kReLU;
  } else if (typeid(second) == typeid(GELU) &&
             static_cast<GELU&>(second).approximate() == "tanh") {
    act = functional::LinearActivation::kGeluTanh;
  } else {
    return std::nullopt;
  }
  return functional::linear_activation(x, linear.weight(), linear.bias(), act);
}

}  // namespace

Tensor Sequential::forward(const Tensor& input) {
  Tensor x = input;
  for (size_t i = 0; i < modules_.size(); ++i) {
    if (i + 1 < modules_.size()) {
      if (std::optional<Tensor> y = FusedPair(*modules_[i], *modules_[i + 1], x)) {
        x = *std::move(y);
        ++i;
        continue;
      }
    }
    x = (*modules_[i])(x);
  }
  return x;
}

std::shared_ptr<Module> Sequential::CloneImpl(std::optional<Device> device) const {
  std::shared_ptr<Sequential> copy(new Sequential(*this));
  // The copy constructor copied the train/eval flag and hooks; a Sequential
  // has no parameters or buffers of its own.
  for (const auto& m : modules_) copy->push_back(m->clone(device));
  return copy;
}

std::string Flatten::extra_repr() const {
  return absl::StrCat("start_dim=", start_dim_, ", end_dim=", end_dim_);
}

}  // namespace ember::nn
