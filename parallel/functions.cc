#include "parallel/functions.h"

#include <memory>
#include <string>
#include <utility>

#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "autograd/variable.h"
#include "parallel/comm.h"
#include "parallel/warning.h"
#include "tensor/factories.h"

namespace ember::parallel {
namespace {

using autograd::Node;
using autograd::variable_list;

bool AnyRequiresGrad(absl::Span<const Tensor> inputs) {
  for (const Tensor& t : inputs) {
    if (t.defined() && t.requires_grad()) return true;
  }
  return false;
}

// Makes `node` the producer of `outputs` from `inputs` (its next edges, in
// order). Outputs for which `differentiable` says no, and those of a
// non-floating dtype, are listed in the node but left out of the graph.
template <typename Differentiable>
void Record(const std::shared_ptr<Node>& node, absl::Span<const Tensor> inputs,
            absl::Span<const Tensor> outputs, Differentiable differentiable) {
  for (const Tensor& in : inputs) node->add_next_edge(autograd::GradientEdge(in));
  for (size_t j = 0; j < outputs.size(); ++j) {
    if (!outputs[j].defined()) {
      node->add_input_metadata(zeros({0}));  // nothing flows back through it
    } else if (differentiable(j) && outputs[j].is_floating_point()) {
      autograd::SetHistory(outputs[j], node);
    } else {
      node->add_input_metadata(outputs[j]);
    }
  }
}

// Zeros in place of the undefined gradients the engine hands a node for the
// outputs nothing used.
void MaterializeGrads(const Node& node, variable_list& grads) {
  for (size_t i = 0; i < grads.size(); ++i) {
    if (grads[i].defined()) continue;
    const autograd::InputMetadata& m = node.input_metadata(i);
    grads[i] = zeros(m.shape, TensorOptions(m.dtype).device(m.device));
  }
}

class BroadcastBackward final : public Node {
 public:
  std::string name() const override { return "BroadcastBackward"; }
  std::vector<Device> input_devices;  // one per input

 protected:
  variable_list apply(variable_list&& grads) override {
    const size_t n = input_devices.size();
    std::vector<std::vector<Tensor>> per_device(grads.size() / n);
    for (size_t d = 0; d < per_device.size(); ++d) {
      per_device[d].assign(grads.begin() + d * n, grads.begin() + (d + 1) * n);
    }
    // Inputs may come from different devices: reduce each onto its own.
    variable_list out(n);
    for (size_t i = 0; i < n; ++i) {
      std::vector<std::vector<Tensor>> column(per_device.size());
      for (size_t d = 0; d < per_device.size(); ++d) column[d] = {per_device[d][i]};
      out[i] = ReduceAddCoalesced::apply(input_devices[i], column)[0];
    }
    return out;
  }
};

class ReduceAddCoalescedBackward final : public Node {
 public:
  std::string name() const override { return "ReduceAddCoalescedBackward"; }
  std::vector<Device> source_devices;  // the device of each group of inputs

 protected:
  variable_list apply(variable_list&& grads) override {
    MaterializeGrads(*this, grads);
    std::vector<std::vector<Tensor>> copies = Broadcast::apply(source_devices, grads);
    variable_list out;
    for (auto& per_device : copies) {
      for (Tensor& t : per_device) out.push_back(std::move(t));
    }
    return out;
  }
};

class ScatterBackward final : public Node {
 public:
  std::string name() const override { return "ScatterBackward"; }
  Device input_device;
  int64_t dim = 0;

 protected:
  variable_list apply(variable_list&& grads) override {
    MaterializeGrads(*this, grads);
    return {Gather::apply(input_device, dim, grads)};
  }
};

class GatherBackward final : public Node {
 public:
  std::string name() const override { return "GatherBackward"; }
  std::vector<Device> input_devices;
  std::vector<int64_t> input_sizes;  // along dim
  int64_t dim = 0;
  bool unsqueezed_scalars = false;

 protected:
  variable_list apply(variable_list&& grads) override {
    MaterializeGrads(*this, grads);
    variable_list out = Scatter::apply(input_devices, input_sizes, dim, grads[0]);
    if (unsqueezed_scalars) {
      for (Tensor& g : out) g = g.squeeze(0);
    }
    return out;
  }
};

}  // namespace

std::vector<std::vector<Tensor>> Broadcast::apply(absl::Span<const Device> devices,
                                                  absl::Span<const Tensor> inputs) {
  std::vector<std::vector<Tensor>> out = comm::broadcast_coalesced(inputs, devices);
  if (inputs.empty() || !autograd::GradMode::is_enabled() || !AnyRequiresGrad(inputs)) return out;
  auto node = autograd::MakeNode<BroadcastBackward>();
  variable_list flat;
  for (auto& per_device : out) {
    for (size_t i = 0; i < per_device.size(); ++i) {
      // The shared entry becomes a new handle on the input's storage, so
      // that it can be an output of this node.
      if (per_device[i].is_same(inputs[i])) per_device[i] = inputs[i].detach();
      flat.push_back(per_device[i]);
    }
  }
  for (const Tensor& in : inputs) node->input_devices.push_back(in.device());
  const size_t n = inputs.size();
  Record(node, inputs, flat, [&](size_t j) { return inputs[j % n].requires_grad(); });
  for (size_t d = 0; d < out.size(); ++d) {
    for (size_t i = 0; i < n; ++i) out[d][i] = flat[d * n + i];
  }
  return out;
}

std::vector<Tensor> ReduceAddCoalesced::apply(Device destination,
                                              const std::vector<std::vector<Tensor>>& grads) {
  std::vector<Tensor> out = comm::reduce_add_coalesced(grads, destination);
  variable_list flat;
  for (const auto& per_device : grads)
    flat.insert(flat.end(), per_device.begin(), per_device.end());
  if (!autograd::GradMode::is_enabled() || !AnyRequiresGrad(flat)) return out;
  auto node = autograd::MakeNode<ReduceAddCoalescedBackward>();
  for (const auto& per_device : grads) {
    Device source = destination;
    for (const Tensor& t : per_device) {
      if (t.defined()) source = t.device();
    }
    node->source_devices.push_back(source);
  }
  Record(node, flat, out, [](size_t) { return true; });
  return out;
}

std::vector<Tensor> Scatter::apply(absl::Span<const Device> devices,
                                   absl::Span<const int64_t> chunk_sizes, int64_t dim,
                                   const Tensor& input) {
  std::vector<Tensor> out = comm::scatter(input, devices, chunk_sizes, dim);
  if (!autograd::GradMode::is_enabled() || !AnyRequiresGrad({input})) return out;
  auto node = autograd::MakeNode<ScatterBackward>();
  node->input_device = input.device();
  node->dim = dim;
  // The chunks are views of the input; the node's outputs are new handles.
  for (Tensor& t : out) t = t.detach();
  Record(node, {input}, out, [](size_t) { return true; });
  return out;
}

Tensor Gather::apply(Device destination, int64_t dim, absl::Span<const Tensor> inputs) {
  EMBER_CHECK(!inputs.empty(), "Gather: expected at least one tensor");
  bool all_scalars = dim == 0;
  for (const Tensor& t : inputs) all_scalars = all_scalars && t.dim() == 0;
  std::vector<Tensor> pieces(inputs.begin(), inputs.end());
  if (all_scalars) {
    internal::Warn(
        "Was asked to gather along dimension 0, but all input tensors were scalars; will instead "
        "unsqueeze and return a vector.");
    autograd::NoGradGuard no_grad;
    for (Tensor& t : pieces) t = t.view({1});
  }
  Tensor out = comm::gather(pieces, dim, destination);
  if (!autograd::GradMode::is_enabled() || !AnyRequiresGrad(inputs)) return out;
  auto node = autograd::MakeNode<GatherBackward>();
  node->dim = dim;
  node->unsqueezed_scalars = all_scalars;
  for (const Tensor& t : pieces) {
    node->input_devices.push_back(t.device());
    node->input_sizes.push_back(t.size(dim));
  }
  Record(node, inputs, {out}, [](size_t) { return true; });
  return out;
}

}  // namespace ember::parallel
