#include "parallel/sync_batch_norm.h"

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <typeinfo>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "autograd/variable.h"
#include "distributed/distributed.h"
#include "nn/container.h"
#include "tensor/dtype.h"
#include "tensor/error.h"
#include "tensor/factories.h"
#include "tensor/shape.h"

namespace ember::parallel {
namespace {

using autograd::variable_list;
using distributed::ProcessGroup;

// Note [SyncBatchNorm statistics]
// Per channel, rank r holds n_r elements (its batch times the spatial
// size), their mean m_r and their sum of squared deviations q_r. One
// all_gather of [m_r (C), q_r (C), n_r] gives every rank every rank's, and
// each combines them as Chan et al.'s parallel variance does:
//   N = sum n_r,  mean = sum n_r m_r / N,
//   q = sum (q_r + n_r (m_r - mean)^2),  var = q / N (biased),
// which needs no sum of squares (no cancellation) and weighs a rank with an
// empty batch by zero. running_var takes the unbiased q / (N - 1).
//
// A rank's own m_r and q_r come from nn's batch_norm kernel of the input's
// device: in training mode with running statistics of momentum 1, it writes
// the batch's mean and unbiased variance into them (float64 here, so the
// CPU kernel's double sums arrive unrounded); q_r = var * (n_r - 1). Its
// normalised output is not used. A rank with fewer than two elements per
// channel (which that kernel refuses) computes them with tensor ops.
//
// The output is then nn's batch_norm in eval mode with the global mean and
// biased variance as its "running" statistics: one fused pass, and its
// backward gives what Note [SyncBatchNorm backward] builds on.

// Note [SyncBatchNorm backward]
// With x^ = (x - mean) * invstd and a = weight * invstd per channel, the
// gradient of the input over the whole group's batch of N is
//   dx = a (g - sum(g) / N - x^ sum(g x^) / N),
// the sums running over every rank's elements. The forward makes a
// SyncBatchNormBackward node the producer of the input, weight and bias it
// hands nn's eval-mode batch_norm, so that batch_norm's backward (which
// treats the statistics as constants) delivers to that node, for this rank:
//   a g,   sum(g x^) (its weight gradient),   sum(g) (its bias gradient).
// The node all_reduces the two sums over the group (2 * C values) and adds
// the statistics' part, -a (sum(g) / N + x^ sum(g x^) / N), computed as
// (x - mean) * k + d with k = -a invstd sum(g x^) / N and d = -a sum(g) / N.
// The weight and bias get this rank's own sums, as torch's. When the input
// needs no gradient, nothing is reduced (every rank decides the same way, as
// its input requires grad or not everywhere). A layer without affine
// parameters gives batch_norm a weight of ones and a bias of zeros that only
// this node sees.

// The error of a collective's call or of its Work, as ember::Error.
void Finish(const absl::StatusOr<std::shared_ptr<distributed::Work>>& work, const char* what) {
  absl::Status status = work.ok() ? (*work)->wait() : work.status();
  if (status.ok()) return;
  EMBER_FAIL("SyncBatchNorm: ", what, " over the process group failed: ", status.message(), " [",
             absl::StatusCodeToString(status.code()), "]");
}

// `t` [C] viewed so that it broadcasts over an input of `dim` dims [N, C, *].
Tensor PerChannel(const Tensor& t, int64_t dim) {
  SizeVector shape(dim, 1);
  shape[1] = t.size(0);
  return t.view(shape);
}

class SyncBatchNormBackward final : public autograd::Node {
 public:
  std::string name() const override { return "SyncBatchNormBackward"; }
  void release_variables() override {
    input = Tensor();
    weight = Tensor();
    released = true;
  }

  Tensor input;   // detached, for x - mean
  Tensor weight;  // detached; undefined without affine parameters
  Tensor mean;    // [C] float64: the global statistics
  Tensor invstd;  // [C] float64
  Tensor total;   // 0-dim float64: N, the group's element count per channel
  std::shared_ptr<ProcessGroup> group;
  bool released = false;

 protected:
  // grads: {a g, sum(g x^), sum(g)} from batch_norm's backward (Note
  // [SyncBatchNorm backward]); returns the gradients of input, weight, bias.
  variable_list apply(variable_list&& grads) override {
    EMBER_CHECK(!autograd::GradMode::is_enabled(),
                "SyncBatchNorm: its backward is not differentiable; backward with "
                "create_graph = true (double backward) is not supported");
    EMBER_CHECK(!released,
                "SyncBatchNorm: trying to backward through the graph a second time; specify "
                "retain_graph = true on the first backward if you need to");
    const int64_t c = mean.size(0);
    for (size_t i = 0; i < grads.size(); ++i) {
      if (grads[i].defined()) continue;
      const autograd::InputMetadata& m = input_metadata(i);
      grads[i] = zeros(m.shape, TensorOptions(m.dtype).device(m.device));
    }
    variable_list out(3);
    if (next_edge(0).is_valid()) {
      Tensor sums = cat({grads[2].to(kFloat64), grads[1].to(kFloat64)});  // [sum g, sum g x^]
      Finish(group->allreduce(sums, {.op = distributed::ReduceOp::kSum}),
             "the all_reduce of the gradient sums");
      Tensor sum_g = sums.narrow(0, 0, c), sum_gx = sums.narrow(0, c, c);
      Tensor a = weight.defined() ? weight.to(kFloat64) * invstd : invstd;
      Tensor k = (-a * invstd * sum_gx / total).to(input.dtype());
      Tensor d = (-a * sum_g / total).to(input.dtype());
      const int64_t dim = input.dim();
      Tensor dx = input - PerChannel(mean.to(input.dtype()), dim);
      dx.mul_(PerChannel(k, dim)).add_(PerChannel(d, dim)).add_(grads[0]);
      out[0] = dx;
    }
    if (next_edge(1).is_valid()) out[1] = grads[1];
    if (next_edge(2).is_valid()) out[2] = grads[2];
    return out;
  }
};

// Training-mode sync batch norm of `input` [N, C, *] over `group` (2+
// ranks); updates running_mean / running_var (when defined) with momentum.
Tensor SyncBatchNormTrain(const Tensor& input, const Tensor& weight, const Tensor& bias,
                          const Tensor& running_mean, const Tensor& running_var, double momentum,
                          double eps, const std::shared_ptr<ProcessGroup>& group) {
  const int64_t n = input.size(0), c = input.size(1);
  int64_t spatial = 1;
  for (int64_t d = 2; d < input.dim(); ++d) spatial *= input.size(d);
  const int64_t count = n * spatial;
  const TensorOptions f64 = TensorOptions(kFloat64).device(input.device());
  const int64_t world = group->size();

  Tensor mean, total, var;
  {
    autograd::NoGradGuard no_grad;
    const Tensor x = input.detach();
    // This rank's mean and squared deviations (Note [SyncBatchNorm statistics]).
    Tensor local_mean, local_sq;
    if (count > 1) {
      local_mean = zeros({c}, f64);
      Tensor local_var = zeros({c}, f64);
      nn::functional::batch_norm(x, local_mean, local_var, Tensor(), Tensor(),
                                 /*training=*/true, /*momentum=*/1.0, eps);
      local_sq = local_var * static_cast<double>(count - 1);
    } else {
      local_mean = x.reshape({n, c, spatial}).to(kFloat64).sum({0, 2});
      local_sq = zeros({c}, f64);
    }
    Tensor local = cat({local_mean, local_sq, full({1}, static_cast<double>(count), f64)});
    Tensor gathered = empty({world * (2 * c + 1)}, f64);
    Finish(group->allgather_into_tensor(gathered, local), "the all_gather of the batch statistics");
    gathered = gathered.view({world, 2 * c + 1});
    Tensor counts = gathered.narrow(1, 2 * c, 1);  // [W, 1]
    total = counts.sum();
    mean = (gathered.narrow(1, 0, c) * counts).sum({0}) / total;
    Tensor deviation = gathered.narrow(1, 0, c) - mean;
    Tensor sq = (gathered.narrow(1, c, c) + counts * deviation * deviation).sum({0});
    var = sq / total;
    if (running_mean.defined()) {
      Tensor unbiased = sq / (total - 1.0).clamp(1.0, std::nullopt);
      running_mean.copy_(running_mean.to(kFloat64) * (1.0 - momentum) + mean * momentum);
      running_var.copy_(running_var.to(kFloat64) * (1.0 - momentum) + unbiased * momentum);
    }
  }

  const bool record = autograd::GradMode::is_enabled() &&
                      (input.requires_grad() || (weight.defined() && weight.requires_grad()) ||
                       (bias.defined() && bias.requires_grad()));
  if (!record) {
    return nn::functional::batch_norm(input, mean, var, weight, bias, /*training=*/false,
                                      /*momentum=*/0.0, eps);
  }
  // Note [SyncBatchNorm backward]: the node produces batch_norm's input,
  // weight and bias.
  auto node = autograd::MakeNode<SyncBatchNormBackward>();
  node->add_next_edge(autograd::GradientEdge(input));
  node->add_next_edge(weight.defined() ? autograd::GradientEdge(weight) : autograd::Edge());
  node->add_next_edge(bias.defined() ? autograd::GradientEdge(bias) : autograd::Edge());
  Tensor x = input.detach();
  Tensor w = weight.defined() ? weight.detach() : ones({c}, input.options());
  Tensor b = bias.defined() ? bias.detach() : zeros({c}, input.options());
  autograd::SetHistory(x, node);
  autograd::SetHistory(w, node);
  autograd::SetHistory(b, node);
  node->input = input.detach();
  node->weight = weight.defined() ? weight.detach() : Tensor();
  node->mean = mean;
  node->invstd = (var + eps).rsqrt();
  node->total = total;
  node->group = group;
  return nn::functional::batch_norm(x, mean, var, w, b, /*training=*/false, /*momentum=*/0.0, eps);
}

// Note [Converting inside a Sequential]
// Sequential calls the children of its own list, not the registry's, and so
// refuses replace_module. A Sequential holding a layer to convert is
// therefore rebuilt: a copy made with Sequential's copy constructor (which
// copies the training flag and the hooks, not the children) takes every
// child again in order, converted ones in their places, so names
// ("0", "1", ...), parameters and state_dict() read as before, and the
// parent puts the copy where the original was. The original keeps its old
// children. Only an exact Sequential is rebuilt, never a subclass, whose own
// behaviour a copy would lose.
class RebuiltSequential final : public nn::Sequential {
 public:
  explicit RebuiltSequential(const nn::Sequential& original) : nn::Sequential(original) {}
  std::string name() const override { return "Sequential"; }
};

// A child replaced by the conversion, for putting it back.
struct Replaced {
  std::shared_ptr<nn::Module> parent;
  std::string name;
  std::shared_ptr<nn::Module> old_child;
};

bool IsSequential(const nn::Module& m) {
  return typeid(m) == typeid(nn::Sequential) || typeid(m) == typeid(RebuiltSequential);
}

}  // namespace

// --- SyncBatchNorm -------------------------------------------------------------

SyncBatchNorm::SyncBatchNorm(nn::BatchNormOptions options,
                             std::shared_ptr<distributed::ProcessGroup> process_group)
    : Cloneable(options), process_group_(std::move(process_group)) {
  reset();
}

SyncBatchNorm::SyncBatchNorm(const nn::BatchNormBase& source,
                             std::shared_ptr<distributed::ProcessGroup> process_group)
    : Cloneable(source.options()), process_group_(std::move(process_group)) {
  // The source's own tensors (register_parameter keeps a parameter as
  // itself), in RegisterState's order and names.
  auto requires_grad = [](const Tensor& t) { return !t.defined() || t.requires_grad(); };
  register_parameter("weight", source.weight(), requires_grad(source.weight()));
  register_parameter("bias", source.bias(), requires_grad(source.bias()));
  register_buffer("running_mean", source.running_mean());
  register_buffer("running_var", source.running_var());
  register_buffer("num_batches_tracked", source.num_batches_tracked());
  train(source.is_training());
}

void SyncBatchNorm::CheckInputDim(const Tensor& input) const {
  EMBER_CHECK(input.defined() && input.dim() >= 2,
              "SyncBatchNorm: expected at least 2D input (got ", input.defined() ? input.dim() : 0,
              "D input)");
}

std::shared_ptr<distributed::ProcessGroup> SyncBatchNorm::GroupForForward() const {
  if (process_group_ != nullptr) return process_group_;
  if (!distributed::is_initialized()) return nullptr;
  absl::StatusOr<distributed::Group> group = distributed::get_default_group();
  return group.ok() ? *group : nullptr;
}

Tensor SyncBatchNorm::forward(const Tensor& input) {
  CheckInputDim(input);
  EMBER_CHECK(input.size(1) != 0,
              "SyncBatchNorm: the number of input channels should be non-zero, got input of "
              "shape ",
              ShapeToString(input.sizes()));
  const nn::BatchNormOptions& opts = options();
  EMBER_CHECK(input.size(1) == opts.num_features, "SyncBatchNorm: expected ", opts.num_features,
              " channels (dim 1), got input of shape ", ShapeToString(input.sizes()));
  std::shared_ptr<distributed::ProcessGroup> group =
      is_training() ? GroupForForward() : std::shared_ptr<distributed::ProcessGroup>();
  // Eval mode, one rank or no group: plain batch norm, as torch falls back.
  if (group == nullptr || group->size() < 2) return BatchNormBase::forward(input);

  EMBER_CHECK(input.is_floating_point(), "SyncBatchNorm: expected a floating point input, got ",
              dtype_name(input.dtype()));
  for (const auto& [what, t] : {std::pair<const char*, Tensor>{"weight", weight()},
                                {"bias", bias()},
                                {"running_mean", running_mean()},
                                {"running_var", running_var()}}) {
    if (!t.defined()) continue;
    EMBER_CHECK(t.device() == input.device(), "SyncBatchNorm: the input is on ", input.device(),
                " but its ", what, " is on ", t.device(), "; move the module there with to()");
  }
  for (const auto& [what, t] :
       {std::pair<const char*, Tensor>{"weight", weight()}, {"bias", bias()}}) {
    EMBER_CHECK(!t.defined() || t.dtype() == input.dtype(), "SyncBatchNorm: the input is ",
                dtype_name(input.dtype()), " but its ", what, " is ", dtype_name(t.dtype()),
                "; convert the module or the input so that they match");
  }

  double momentum = opts.momentum.value_or(0.0);
  const bool tracking = opts.track_running_stats;
  if (tracking) {
    autograd::NoGradGuard no_grad;
    const Tensor& batches = num_batches_tracked();
    batches.add_(1);
    if (!opts.momentum) momentum = 1.0 / static_cast<double>(batches.item<int64_t>());
  }
  return SyncBatchNormTrain(input, weight(), bias(), tracking ? running_mean() : Tensor(),
                            tracking ? running_var() : Tensor(), momentum, opts.eps, group);
}

// --- convert_sync_batchnorm ----------------------------------------------------

namespace {

// Converts below `module` (at `path`); returns what should stand in its
// place (itself when nothing below it changed). Records each replace_module
// in `replaced`.
std::shared_ptr<nn::Module> Convert(
    const std::shared_ptr<nn::Module>& module,
    const std::shared_ptr<distributed::ProcessGroup>& group, const std::string& path,
    std::vector<Replaced>& replaced,
    const std::function<std::shared_ptr<nn::Module>(const nn::BatchNormBase&)>& make_sync) {
  if (const auto* bn = dynamic_cast<const nn::BatchNormBase*>(module.get())) return make_sync(*bn);
  std::vector<std::pair<std::string, std::shared_ptr<nn::Module>>> children =
      module->named_children();
  bool changed = false;
  for (auto& [name, child] : children) {
    std::shared_ptr<nn::Module> converted = Convert(
        child, group, path.empty() ? name : absl::StrCat(path, ".", name), replaced, make_sync);
    if (converted != child) {
      child = converted;
      changed = true;
    }
  }
  if (!changed) return module;
  if (IsSequential(*module)) {
    auto copy = std::make_shared<RebuiltSequential>(static_cast<const nn::Sequential&>(*module));
    for (auto& [name, child] : children) copy->push_back(child);
    return copy;
  }
  const std::vector<std::pair<std::string, std::shared_ptr<nn::Module>>> before =
      module->named_children();
  for (size_t i = 0; i < children.size(); ++i) {
    if (children[i].second == before[i].second) continue;
    const std::string& name = children[i].first;
    const std::string child_path = path.empty() ? name : absl::StrCat(path, ".", name);
    try {
      module->replace_module(name, children[i].second);
    } catch (const Error& e) {
      EMBER_FAIL("SyncBatchNorm::convert_sync_batchnorm: can't put the converted '", child_path,
                 "' (", before[i].second->name(), ") into its parent ",
                 path.empty() ? std::string("(the module passed in)") : "'" + path + "'", " (",
                 module->name(), "); nothing was converted. ", e.what());
    }
    replaced.push_back({module, name, before[i].second});
  }
  return module;
}

}  // namespace

std::shared_ptr<nn::Module> SyncBatchNorm::convert_sync_batchnorm(
    std::shared_ptr<nn::Module> module, std::shared_ptr<distributed::ProcessGroup> process_group) {
  EMBER_CHECK(module != nullptr, "SyncBatchNorm::convert_sync_batchnorm: the module is null");
  auto make_sync = [&](const nn::BatchNormBase& bn) -> std::shared_ptr<nn::Module> {
    return std::shared_ptr<SyncBatchNorm>(new SyncBatchNorm(bn, process_group));
  };
  std::vector<Replaced> replaced;
  try {
    return Convert(module, process_group, "", replaced, make_sync);
  } catch (const Error&) {
    // Put back what was replaced, latest first, so the model is as it was.
    for (auto it = replaced.rbegin(); it != replaced.rend(); ++it) {
      it->parent->replace_module(it->name, it->old_child);
    }
    throw;
  }
}

}  // namespace ember::parallel
