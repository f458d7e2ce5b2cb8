// Optimizer: the base of SGD, Adam and AdamW, as torch.optim.Optimizer.
//
//   ```cpp
//   #include "nn/linear.h"
//   #include "nn/loss.h"
//   #include "nn/optim/sgd.h"
//   #include "tensor/factories.h"
//   auto model = std::make_shared<ember::nn::Linear>(4, 1);
//   ember::Tensor x = ember::randn({16, 4}), y = ember::randn({16, 1});
//   ember::nn::optim::SGD opt(model->parameters(), {.lr = 0.1, .momentum = 0.9});
//   for (int step = 0; step < 10; ++step) {
//     opt.zero_grad();
//     ember::nn::functional::mse_loss((*model)(x), y).backward();
//     opt.step();
//   }
//   ember::nn::optim::OptimizerStateDict saved = opt.state_dict();
//   ember::nn::optim::SGD other_opt(model->parameters(), {.lr = 0.1, .momentum = 0.9});
//   EMBER_RETURN_IF_ERROR(other_opt.load_state_dict(saved));  // momentum buffers included
//   ```
//
// Parameters are held in groups, each with its own hyperparameters
// (Options, one struct per optimizer). Per-parameter state (momentum
// buffers, Adam moments, step counts) is created lazily on the first step()
// that sees a gradient, and is addressed in state_dict() by the parameter's
// position across all groups, as PyTorch numbers them. Learning-rate
// schedulers reach every optimizer through lr() / set_lr().
//
// Errors: invalid hyperparameters throw ember::Error naming the value, as
// PyTorch raises ValueError ("Invalid learning rate: -0.1").
// load_state_dict returns InvalidArgument when the saved groups do not match.
// step() runs on the calling thread without recording a graph.
// Thread-safety: thread-compatible; one thread steps an optimizer at a time.
#ifndef EMBER_NN_OPTIM_OPTIMIZER_H_
#define EMBER_NN_OPTIM_OPTIMIZER_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "tensor/error.h"
#include "tensor/factories.h"
#include "tensor/tensor.h"

namespace ember::nn::optim {

// An optimizer's state as plain data: per parameter (by overall index), named
// tensors; per group, named hyperparameters and the parameter indices.
struct OptimizerStateDict {
  struct ParamState {
    int64_t index = 0;
    std::vector<std::pair<std::string, Tensor>> values;
  };
  struct Group {
    std::vector<std::pair<std::string, double>> options;
    std::vector<int64_t> params;
  };
  std::vector<ParamState> state;
  std::vector<Group> param_groups;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // Updates every parameter that has a gradient.
  virtual void step() = 0;
  // Clears the gradients of every parameter (to none by default).
  void zero_grad(bool set_to_none = true);

  virtual size_t num_param_groups() const = 0;
  virtual const std::vector<Tensor>& params(size_t group) const = 0;
  virtual double lr(size_t group) const = 0;
  virtual void set_lr(size_t group, double lr) = 0;

  virtual OptimizerStateDict state_dict() const = 0;
  virtual absl::Status load_state_dict(const OptimizerStateDict& state) = 0;

 protected:
  Optimizer() = default;
};

// Holds groups of (params, Options) and per-parameter State; the base of the
// concrete optimizers. Options must have a `double lr` and a static
// Validate(const Options&) plus ToPairs/FromPairs for state_dict; State must
// have ToPairs/FromPairs.
template <typename Options, typename State>
class OptimizerBase : public Optimizer {
 public:
  struct ParamGroup {
    std::vector<Tensor> params;
    Options options;
  };

  // Adds a group; throws when one of its parameters is already optimised,
  // listed twice (PyTorch only warns; a twice-listed parameter would be
  // stepped twice) or is not a leaf.
  void add_param_group(std::vector<Tensor> params, Options options) {
    Options::Validate(options);
    for (size_t i = 0; i < params.size(); ++i) {
      const Tensor& p = params[i];
      EMBER_CHECK(p.defined(), "optimizer: parameter ", i, " is an undefined tensor");
      EMBER_CHECK(p.is_leaf(), "can't optimize a non-leaf Tensor");
      for (size_t j = 0; j < i; ++j) {
        EMBER_CHECK(!params[j].is_same(p),
                    "optimizer contains a parameter group with duplicate "
                    "parameters (positions ",
                    j, " and ", i, ")");
      }
      for (const ParamGroup& g : groups_) {
        for (const Tensor& q : g.params) {
          EMBER_CHECK(!q.is_same(p), "some parameters appear in more than one parameter group");
        }
      }
    }
    state_.emplace_back(params.size());
    groups_.push_back({std::move(params), std::move(options)});
  }

  std::vector<ParamGroup>& param_groups() { return groups_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }

  size_t num_param_groups() const override { return groups_.size(); }
  const std::vector<Tensor>& params(size_t group) const override {
    return groups_.at(group).params;
  }
  double lr(size_t group) const override { return groups_.at(group).options.lr; }
  void set_lr(size_t group, double lr) override {
    groups_.at(group).options.lr = lr;
    for (auto& [key, t] : lr_tensors_) {
      if (key.first == group) t.fill_(lr);  // on the device: a captured step reads it
    }
  }

  OptimizerStateDict state_dict() const override {
    OptimizerStateDict out;
    int64_t index = 0;
    for (size_t g = 0; g < groups_.size(); ++g) {
      OptimizerStateDict::Group group{groups_[g].options.ToPairs(), {}};
      for (size_t i = 0; i < groups_[g].params.size(); ++i, ++index) {
        group.params.push_back(index);
        if (state_[g][i].initialized()) {
          out.state.push_back({index, state_[g][i].ToPairs()});
        }
      }
      out.param_groups.push_back(std::move(group));
    }
    return out;
  }

  absl::Status load_state_dict(const OptimizerStateDict& state) override {
    if (state.param_groups.size() != groups_.size()) {
      return absl::InvalidArgumentError(
          "loaded state dict has a different number of parameter groups (" +
          std::to_string(state.param_groups.size()) + " vs " + std::to_string(groups_.size()) +
          ")");
    }
    std::vector<Options> options;
    for (size_t g = 0; g < groups_.size(); ++g) {
      if (state.param_groups[g].params.size() != groups_[g].params.size()) {
        return absl::InvalidArgumentError(
            "loaded state dict contains a parameter group that doesn't match the size of "
            "optimizer's group (group " +
            std::to_string(g) + ": " + std::to_string(state.param_groups[g].params.size()) +
            " vs " + std::to_string(groups_[g].params.size()) + " parameters)");
      }
      Options o = groups_[g].options;
      absl::Status s = o.FromPairs(state.param_groups[g].options);
      if (!s.ok()) return s;
      options.push_back(o);
    }
    // Positions of each saved index in (group, param).
    std::vector<std::pair<size_t, size_t>> where;
    for (size_t g = 0; g < groups_.size(); ++g) {
      for (size_t i = 0; i < groups_[g].params.size(); ++i) where.emplace_back(g, i);
    }
    std::vector<std::vector<State>> new_state(groups_.size());
    for (size_t g = 0; g < groups_.size(); ++g) new_state[g].resize(groups_[g].params.size());
    for (const auto& ps : state.state) {
      if (ps.index < 0 || ps.index >= static_cast<int64_t>(where.size())) {
        return absl::InvalidArgumentError("loaded state dict has state for parameter " +
                                          std::to_string(ps.index) + ", but the optimizer has " +
                                          std::to_string(where.size()) + " parameters");
      }
      auto [g, i] = where[ps.index];
      absl::Status s = new_state[g][i].FromPairs(ps.values, groups_[g].params[i]);
      if (!s.ok()) return s;
    }
    for (size_t g = 0; g < groups_.size(); ++g) groups_[g].options = options[g];
    state_ = std::move(new_state);
    return absl::OkStatus();
  }

 protected:
  OptimizerBase(std::vector<ParamGroup> groups) {
    for (ParamGroup& g : groups) add_param_group(std::move(g.params), std::move(g.options));
  }

  // The learning rate of group `g` as a float32 [1] tensor on `device`
  // (Note [Capturable steps] in fused_kernels.h), made with the group's lr on
  // first use and refilled by set_lr.
  const Tensor& lr_tensor(size_t g, Device device) {
    for (auto& [key, t] : lr_tensors_) {
      if (key.first == g && key.second == device) return t;
    }
    lr_tensors_.push_back(
        {{g, device}, full({1}, groups_.at(g).options.lr, TensorOptions(kFloat32).device(device))});
    return lr_tensors_.back().second;
  }

  // Calls fn(param, grad, state) for every parameter of group `g` that has a
  // grad, in order.
  template <typename Fn>
  void ForEachParamWithGradOfGroup(size_t g, Fn fn) {
    for (size_t i = 0; i < groups_[g].params.size(); ++i) {
      const Tensor& p = groups_[g].params[i];
      Tensor grad = p.grad();
      if (grad.defined()) fn(p, grad, state_[g][i]);
    }
  }

 private:
  std::vector<ParamGroup> groups_;
  std::vector<std::vector<State>> state_;
  std::vector<std::pair<std::pair<size_t, Device>, Tensor>> lr_tensors_;
};

}  // namespace ember::nn::optim

#endif  // EMBER_NN_OPTIM_OPTIMIZER_H_
