#include "parallel/tensor_parallel.h"

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "autograd/variable.h"
#include "distributed/process_group.h"
#include "nn/embedding.h"
#include "nn/linear.h"
#include "nn/normalization.h"
#include "tensor/error.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"

namespace ember::parallel {
namespace {

using distributed::Group;

absl::Status Wait(const absl::StatusOr<std::shared_ptr<distributed::Work>>& work) {
  if (!work.ok()) return work.status();
  return (*work)->wait();
}

std::string StyleName(const ParallelStyle& style) {
  switch (style.index()) {
    case 0:
      return "ColwiseParallel";
    case 1:
      return "RowwiseParallel";
    case 2:
      return "SequenceParallel";
    case 3:
      return "PrepareModuleInput";
    default:
      return "PrepareModuleOutput";
  }
}

// The global shape of a tensor whose local piece is `local`, laid out as
// `p` over `n` ranks; a sharded dimension of known global length takes it.
SizeVector GlobalShape(const Tensor& local, const Placement& p, int64_t n,
                       int64_t known_length = -1) {
  SizeVector shape(local.sizes().begin(), local.sizes().end());
  if (p.is_shard()) {
    const int64_t d = p.dim < 0 ? p.dim + local.dim() : p.dim;
    if (d >= 0 && d < local.dim()) shape[d] = known_length >= 0 ? known_length : shape[d] * n;
  }
  return shape;
}

// Reads `local` as laid out `from`, lays it out `to` and returns the local
// tensor, whose gradient will have `grad` (default: `to`). Throws
// ember::Error naming `who` (module hooks report that way).
Tensor Convert(const Tensor& local, const DeviceMesh& mesh, const Placement& from,
               const Placement& to, const SizeVector& shape, const std::optional<Placement>& grad,
               const std::string& who) {
  absl::StatusOr<DTensor> d = DTensor::from_local(local, mesh, {from}, {.shape = shape});
  EMBER_CHECK(d.ok(), who, ": ", d.status().message());
  absl::StatusOr<DTensor> r = d->redistribute({to});
  EMBER_CHECK(r.ok(), who, ": ", r.status().message());
  absl::StatusOr<Tensor> out = r->to_local({grad.value_or(to)});
  EMBER_CHECK(out.ok(), who, ": ", out.status().message());
  return *out;
}

// What a styled module needs in its hooks.
struct Styled {
  std::string fqn;
  ParallelStyle style;
  std::string type;         // "Linear", ...
  SizeVector weight_shape;  // the whole module's weight, when it has one
};

std::string Who(const Styled& s) {
  return absl::StrCat(StyleName(s.style), " of '", s.fqn, "' (", s.type, ")");
}

// The placement of each of a module's parameters under a style; nullopt:
// the style leaves them replicated.
std::optional<Placement> ParameterPlacement(const Styled& s, const std::string& name) {
  if (std::holds_alternative<ColwiseParallel>(s.style)) {
    if (s.type == "Linear") return Shard(0);  // weight [out, in] and bias [out]
    if (s.type == "Embedding") return Shard(1);
  }
  if (std::holds_alternative<RowwiseParallel>(s.style)) {
    if (s.type == "Linear")
      return name == "weight" ? std::optional<Placement>(Shard(1)) : std::nullopt;
    if (s.type == "Embedding") return Shard(0);
  }
  return std::nullopt;
}

absl::Status CheckSupported(const Styled& s, nn::Module& m, const DeviceMesh& mesh) {
  const bool linear = dynamic_cast<nn::Linear*>(&m) != nullptr;
  const bool embedding = dynamic_cast<nn::Embedding*>(&m) != nullptr;
  const bool layer_norm = dynamic_cast<nn::LayerNorm*>(&m) != nullptr;
  if (std::holds_alternative<ColwiseParallel>(s.style) ||
      std::holds_alternative<RowwiseParallel>(s.style)) {
    if (!linear && !embedding) {
      return absl::InvalidArgumentError(
          absl::StrCat(StyleName(s.style), " of '", s.fqn, "': the module is a ", m.name(),
                       "; ColwiseParallel and RowwiseParallel support Linear and Embedding only"));
    }
    if (embedding && std::holds_alternative<RowwiseParallel>(s.style)) {
      if (absl::StrContains(m.str(), "padding_idx")) {
        return absl::UnimplementedError(
            absl::StrCat(Who(s), ": an Embedding with padding_idx can't be sharded by rows"));
      }
      const int64_t n = mesh.shape()[0];
      if (ShardSize(s.weight_shape[0], n, n - 1) == 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            Who(s), ": ", s.weight_shape[0], " embeddings over ", n, " ranks leave rank ", n - 1,
            " without rows (torch.chunk's sizes); use a num_embeddings that gives every rank "
            "some"));
      }
    }
  }
  if (std::holds_alternative<SequenceParallel>(s.style) && !layer_norm) {
    return absl::InvalidArgumentError(absl::StrCat("SequenceParallel of '", s.fqn,
                                                   "': the module is a ", m.name(),
                                                   "; SequenceParallel supports LayerNorm only"));
  }
  return absl::OkStatus();
}

// Registers the hooks of `s` on `m`, the sharded copy's module.
void RegisterHooks(const Styled& s, nn::Module& m, const DeviceMesh& mesh) {
  const int64_t n = mesh.shape()[0];
  const std::string who = Who(s);
  if (const auto* col = std::get_if<ColwiseParallel>(&s.style)) {
    const ColwiseParallel style = *col;
    const bool linear = s.type == "Linear";
    // The whole output's last dimension: Linear's out_features, Embedding's dim.
    const int64_t out_length = linear ? s.weight_shape[0] : s.weight_shape[1];
    m.register_forward_pre_hook([=](nn::Module&, const Tensor& x) -> std::optional<Tensor> {
      // A Replicate input of a column-sharded matmul gets a Partial gradient.
      return Convert(x, mesh, style.input_layouts, Replicate(),
                     GlobalShape(x, style.input_layouts, n),
                     linear ? std::optional<Placement>(Partial()) : std::nullopt, who);
    });
    m.register_forward_hook(
        [=](nn::Module&, const Tensor&, const Tensor& out) -> std::optional<Tensor> {
          return Convert(out, mesh, Shard(-1), style.output_layouts,
                         GlobalShape(out, Shard(-1), n, out_length), std::nullopt, who);
        });
    return;
  }
  if (const auto* row = std::get_if<RowwiseParallel>(&s.style)) {
    const RowwiseParallel style = *row;
    if (s.type == "Linear") {
      const int64_t in_length = s.weight_shape[1];
      m.register_forward_pre_hook([=](nn::Module&, const Tensor& x) -> std::optional<Tensor> {
        return Convert(
            x, mesh, style.input_layouts, Shard(-1),
            GlobalShape(x, style.input_layouts, n,
                        style.input_layouts.is_shard() && (style.input_layouts.dim == -1 ||
                                                           style.input_layouts.dim == x.dim() - 1)
                            ? in_length
                            : -1),
            std::nullopt, who);
      });
      m.register_forward_hook([=](nn::Module& module, const Tensor&,
                                  const Tensor& out) -> std::optional<Tensor> {
        // Note [Sharded copies]: the bias joins after the reduction.
        const Tensor& bias = static_cast<nn::Linear&>(module).bias();
        const Tensor partial = bias.defined() ? out - bias.detach() : out;
        Tensor y = Convert(partial, mesh, Partial(), style.output_layouts,
                           GlobalShape(partial, Replicate(), n), std::nullopt, who);
        if (!bias.defined()) return y;
        const Placement& o = style.output_layouts;
        if (o.is_shard() && (o.dim == -1 || o.dim == out.dim() - 1)) {
          const int64_t len = bias.size(0);
          const int index = mesh.get_coordinate()[0];
          return y + bias.detach().narrow(0, ShardOffset(len, n, index), ShardSize(len, n, index));
        }
        if (o.is_partial()) return y + bias.detach() / static_cast<double>(n);
        return y + bias.detach();
      });
      return;
    }
    // Embedding: each rank looks up its own rows; the others read as zeros.
    const int64_t rows = s.weight_shape[0];
    const int index = mesh.get_coordinate()[0];
    const int64_t offset = ShardOffset(rows, n, index);
    const int64_t size = ShardSize(rows, n, index);
    auto keep = std::make_shared<Tensor>();
    m.register_forward_pre_hook([=](nn::Module&, const Tensor& x) -> std::optional<Tensor> {
      Tensor idx = Convert(x, mesh, style.input_layouts, Replicate(),
                           GlobalShape(x, style.input_layouts, n), std::nullopt, who);
      const Tensor inside = idx.ge(offset) && idx.lt(offset + size);
      *keep = inside;
      return where(inside, idx - offset, zeros_like(idx));
    });
    m.register_forward_hook(
        [=](nn::Module&, const Tensor&, const Tensor& out) -> std::optional<Tensor> {
          const Tensor masked = out * keep->unsqueeze(-1).to(out.dtype());
          *keep = Tensor();
          return Convert(masked, mesh, Partial(), style.output_layouts,
                         GlobalShape(masked, Replicate(), n), std::nullopt, who);
        });
    return;
  }
  if (const auto* seq = std::get_if<SequenceParallel>(&s.style)) {
    const Placement layout = Shard(seq->sequence_dim);
    m.register_forward_pre_hook([=](nn::Module&, const Tensor& x) -> std::optional<Tensor> {
      return Convert(x, mesh, layout, layout, GlobalShape(x, layout, n), std::nullopt, who);
    });
    m.register_forward_hook(
        [=](nn::Module&, const Tensor&, const Tensor& out) -> std::optional<Tensor> {
          return Convert(out, mesh, layout, layout, GlobalShape(out, layout, n), std::nullopt, who);
        });
    // Each rank's gradient covers its part of the sequence: the replicated
    // parameters get the sum (torch's Partial gradient reduced to Replicate).
    absl::StatusOr<Group> group = mesh.get_group(0);
    EMBER_CHECK(group.ok(), group.status().message());
    for (const Tensor& p : m.parameters(/*recurse=*/false)) {
      autograd::RegisterHook(p, [g = *group, who](const Tensor& grad) -> Tensor {
        Tensor sum = grad.contiguous().clone();
        const absl::Status st = Wait(g->allreduce(sum));
        EMBER_CHECK(st.ok(), who, ": all_reduce of a parameter's gradient: ", st.message());
        return sum;
      });
    }
    return;
  }
  if (const auto* in = std::get_if<PrepareModuleInput>(&s.style)) {
    const PrepareModuleInput style = *in;
    m.register_forward_pre_hook([=](nn::Module&, const Tensor& x) -> std::optional<Tensor> {
      return Convert(x, mesh, style.input_layouts, style.desired_input_layouts,
                     GlobalShape(x, style.input_layouts, n), std::nullopt, who);
    });
    return;
  }
  const PrepareModuleOutput style = std::get<PrepareModuleOutput>(s.style);
  m.register_forward_hook(
      [=](nn::Module&, const Tensor&, const Tensor& out) -> std::optional<Tensor> {
        return Convert(out, mesh, style.output_layouts, style.desired_output_layouts,
                       GlobalShape(out, style.output_layouts, n), std::nullopt, who);
      });
}

// A plan checked against `module`: its entries in order, and the entries
// that shard parameters by module name.
struct ResolvedPlan {
  std::vector<Styled> entries;
  std::map<std::string, Styled> sharding;
};

absl::StatusOr<ResolvedPlan> Resolve(const std::shared_ptr<nn::Module>& module,
                                     const DeviceMesh& device_mesh, const ParallelizePlan& plan,
                                     const char* who) {
  if (module == nullptr) return absl::InvalidArgumentError(absl::StrCat(who, ": module is null"));
  if (device_mesh.ndim() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, " needs a 1-D DeviceMesh, got ", device_mesh.DebugString(),
                     "; pass the tensor-parallel dimension's sub-mesh, e.g. mesh[\"tp\"]"));
  }
  std::map<std::string, std::shared_ptr<nn::Module>> by_name;
  for (auto& [name, m] : module->named_modules()) by_name.emplace(name, m);
  ResolvedPlan out;
  for (const auto& [fqn, style] : plan) {
    auto it = by_name.find(fqn);
    if (it == by_name.end()) {
      std::vector<std::string> names;
      for (const auto& [name, m] : by_name) names.push_back(absl::StrCat("'", name, "'"));
      return absl::InvalidArgumentError(
          absl::StrCat(who, ": the plan names '", fqn, "', which is no submodule of ",
                       module->name(), "; its modules are ", absl::StrJoin(names, ", ")));
    }
    Styled s{.fqn = fqn, .style = style, .type = it->second->name(), .weight_shape = {}};
    if (dynamic_cast<nn::Linear*>(it->second.get()) != nullptr ||
        dynamic_cast<nn::Embedding*>(it->second.get()) != nullptr) {
      const Tensor& w = it->second->parameter("weight");
      s.weight_shape = SizeVector(w.sizes().begin(), w.sizes().end());
    }
    EMBER_RETURN_IF_ERROR(CheckSupported(s, *it->second, device_mesh));
    if (std::holds_alternative<ColwiseParallel>(style) ||
        std::holds_alternative<RowwiseParallel>(style)) {
      if (out.sharding.count(fqn) != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(who, ": '", fqn, "' is sharded twice by the plan"));
      }
      out.sharding.emplace(fqn, s);
    }
    out.entries.push_back(std::move(s));
  }
  return out;
}

// The placement of parameter `name` (dotted) under the plan; nullopt: whole.
std::optional<Placement> PlacementOf(const ResolvedPlan& plan, const std::string& name) {
  const size_t dot = name.rfind('.');
  const std::string owner = dot == std::string::npos ? "" : name.substr(0, dot);
  const std::string leaf = dot == std::string::npos ? name : name.substr(dot + 1);
  auto it = plan.sharding.find(owner);
  if (it == plan.sharding.end()) return std::nullopt;
  return ParameterPlacement(it->second, leaf);
}

}  // namespace

absl::StatusOr<std::shared_ptr<nn::Module>> parallelize_module(
    const std::shared_ptr<nn::Module>& module, const DeviceMesh& device_mesh,
    const ParallelizePlan& plan) {
  EMBER_ASSIGN_OR_RETURN(ResolvedPlan resolved,
                         Resolve(module, device_mesh, plan, "parallelize_module"));
  // This rank's parameters: shards where a style says so, copies elsewhere.
  std::vector<Tensor> params;
  try {
    autograd::NoGradGuard no_grad;
    for (const auto& [name, p] : module->named_parameters()) {
      const std::optional<Placement> placement = PlacementOf(resolved, name);
      Tensor local;
      if (placement.has_value()) {
        EMBER_ASSIGN_OR_RETURN(DTensor d, distribute_tensor(p.detach(), device_mesh, {*placement}));
        local = d.to_local();
      } else {
        local = p.detach().clone();
      }
      local.requires_grad_(p.requires_grad());
      params.push_back(local);
    }
    std::vector<Tensor> buffers;
    for (const Tensor& b : module->buffers()) buffers.push_back(b.detach().clone());
    std::shared_ptr<nn::Module> copy = module->replicate_for_data_parallel(params, buffers);
    std::map<std::string, std::shared_ptr<nn::Module>> copies;
    for (auto& [name, m] : copy->named_modules()) copies.emplace(name, m);
    for (const Styled& s : resolved.entries) RegisterHooks(s, *copies.at(s.fqn), device_mesh);
    return copy;
  } catch (const Error& e) {
    return absl::InvalidArgumentError(absl::StrCat("parallelize_module: ", e.what()));
  }
}

absl::StatusOr<std::map<std::string, LocalShard>> parameter_shards(
    const std::shared_ptr<nn::Module>& module, const DeviceMesh& device_mesh,
    const ParallelizePlan& plan) {
  EMBER_ASSIGN_OR_RETURN(ResolvedPlan resolved,
                         Resolve(module, device_mesh, plan, "parameter_shards"));
  std::map<std::string, LocalShard> out;
  for (const auto& [name, p] : module->named_parameters()) {
    const std::optional<Placement> placement = PlacementOf(resolved, name);
    if (!placement.has_value()) continue;
    EMBER_ASSIGN_OR_RETURN(
        LocalShard shard,
        local_shard(SizeVector(p.sizes().begin(), p.sizes().end()), device_mesh, {*placement}));
    out.emplace(name, std::move(shard));
  }
  return out;
}

namespace {

class VocabParallelCrossEntropyBackward final : public autograd::Node {
 public:
  std::string name() const override { return "VocabParallelCrossEntropyBackward"; }
  Tensor softmax;  // [N, C_local]
  Tensor one_hot;  // [N, C_local]
  Tensor weight;   // [N]: 1/count (mean), 1 (sum, none), 0 where ignored
  bool per_element = false;
  SizeVector logits_shape;

 protected:
  autograd::variable_list apply(autograd::variable_list&& grads) override {
    autograd::NoGradGuard no_grad;
    Tensor g = grads[0];
    if (!g.defined()) return {Tensor()};
    Tensor coef = per_element ? g.reshape({-1}) * weight : weight * g;
    return {((softmax - one_hot) * coef.unsqueeze(1)).reshape(logits_shape)};
  }
};

}  // namespace

absl::StatusOr<Tensor> loss_parallel_cross_entropy(const DTensor& logits, const Tensor& target,
                                                   const nn::CrossEntropyOptions& options) {
  const char* kWho = "loss_parallel_cross_entropy: ";
  if (!logits.defined() || !target.defined()) {
    return absl::InvalidArgumentError(absl::StrCat(kWho, "logits and target must be defined"));
  }
  const DeviceMesh& mesh = logits.device_mesh();
  const int64_t ndim = static_cast<int64_t>(logits.shape().size());
  if (mesh.ndim() != 1 || !logits.placements()[0].is_shard() ||
      logits.placements()[0].dim != ndim - 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(kWho, "the logits must be Shard(-1) over a 1-D mesh (the vocabulary), got ",
                     logits.DebugString()));
  }
  if (options.label_smoothing != 0.0) {
    return absl::UnimplementedError(absl::StrCat(kWho, "label_smoothing ", options.label_smoothing,
                                                 " is not supported; use 0"));
  }
  if (target.dtype() != kInt64 || target.numel() * logits.shape()[ndim - 1] != [&] {
        int64_t c = 1;
        for (int64_t s : logits.shape()) c *= s;
        return c;
      }()) {
    return absl::InvalidArgumentError(
        absl::StrCat(kWho, "target must be int64 class indices of the logits' leading shape, got ",
                     target.numel(), " values of ", std::string(dtype_name(target.dtype())),
                     " for logits ", logits.DebugString()));
  }
  EMBER_ASSIGN_OR_RETURN(Group group, mesh.get_group(0));
  const int n = group->size();
  const int64_t classes = logits.shape()[ndim - 1];
  const int64_t offset = ShardOffset(classes, n, group->rank());
  Tensor local = logits.to_local();
  const int64_t local_classes = local.size(-1);

  Tensor loss;
  auto node = std::make_shared<VocabParallelCrossEntropyBackward>();
  {
    autograd::NoGradGuard no_grad;
    Tensor x = local.detach().reshape({-1, local_classes});
    Tensor t = target.reshape({-1});
    const int64_t rows = t.size(0);
    // The maximum over the whole vocabulary, for a stable exp.
    Tensor max = local_classes > 0 ? x.amax({1}, /*keepdim=*/true)
                                   : full({rows, 1}, -1e30, TensorOptions(x.dtype()));
    max = max.contiguous();
    EMBER_RETURN_IF_ERROR(Wait(group->allreduce(max, {.op = distributed::ReduceOp::kMax})));
    Tensor e = (x - max).exp();
    Tensor sum = e.sum({1}, /*keepdim=*/true).contiguous();
    EMBER_RETURN_IF_ERROR(Wait(group->allreduce(sum)));
    const Tensor valid = t.ne(options.ignore_index);
    const Tensor shifted = t - offset;
    const Tensor mine = valid && shifted.ge(0) && shifted.lt(local_classes);
    Tensor one_hot =
        (arange(local_classes, TensorOptions(kInt64)).unsqueeze(0).eq(shifted.unsqueeze(1)) &&
         mine.unsqueeze(1))
            .to(x.dtype());
    Tensor picked = (x * one_hot).sum({1}, /*keepdim=*/true).contiguous();
    EMBER_RETURN_IF_ERROR(Wait(group->allreduce(picked)));
    const Tensor valid_f = valid.to(x.dtype());
    Tensor per_row = (sum.log() + max - picked).reshape({-1}) * valid_f;
    Tensor weight = valid_f;
    if (options.reduction == nn::Reduction::kMean) {
      const double count = valid_f.sum().item<double>();
      loss = per_row.sum() / count;
      weight = valid_f / count;
    } else if (options.reduction == nn::Reduction::kSum) {
      loss = per_row.sum();
    } else {
      loss = per_row.reshape(SizeVector(target.sizes().begin(), target.sizes().end()));
      node->per_element = true;
    }
    node->softmax = e / sum;
    node->one_hot = one_hot;
    node->weight = weight;
    node->logits_shape = SizeVector(local.sizes().begin(), local.sizes().end());
  }
  if (autograd::GradMode::is_enabled() && local.requires_grad()) {
    node->add_next_edge(autograd::GradientEdge(local));
    autograd::SetHistory(loss, node);
  }
  return loss;
}

}  // namespace ember::parallel
