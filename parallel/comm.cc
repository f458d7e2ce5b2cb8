#include "parallel/comm.h"

#include <numeric>
#include <string>

#include "absl/strings/str_join.h"
#include "autograd/grad_mode.h"
#include "tensor/error.h"

namespace ember::parallel::comm {
namespace {

// A copy of `t` on `device` that shares nothing with `t`.
Tensor CopyTo(const Tensor& t, Device device) {
  Tensor moved = t.to(device);
  return moved.is_same(t) ? t.clone() : moved;
}

std::string Shape(const Tensor& t) {
  return absl::StrCat("[", absl::StrJoin(t.sizes(), ", "), "]");
}

}  // namespace

std::vector<Tensor> broadcast(const Tensor& tensor, absl::Span<const Device> devices) {
  EMBER_CHECK(tensor.defined(), "broadcast: the tensor is undefined");
  autograd::NoGradGuard no_grad;
  std::vector<Tensor> out;
  out.reserve(devices.size());
  bool shared = false;
  for (const Device& device : devices) {
    if (!shared && device == tensor.device()) {
      shared = true;
      out.push_back(tensor);
    } else {
      out.push_back(CopyTo(tensor, device));
    }
  }
  return out;
}

std::vector<std::vector<Tensor>> broadcast_coalesced(absl::Span<const Tensor> tensors,
                                                     absl::Span<const Device> devices) {
  std::vector<std::vector<Tensor>> out(devices.size());
  for (auto& per_device : out) per_device.reserve(tensors.size());
  for (const Tensor& t : tensors) {
    std::vector<Tensor> copies = broadcast(t, devices);
    for (size_t d = 0; d < devices.size(); ++d) out[d].push_back(std::move(copies[d]));
  }
  return out;
}

Tensor reduce_add(absl::Span<const Tensor> inputs, Device destination) {
  EMBER_CHECK(!inputs.empty(), "reduce_add: expected at least one input");
  autograd::NoGradGuard no_grad;
  Tensor sum;
  size_t first = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    if (!t.defined()) continue;
    if (!sum.defined()) {
      sum = CopyTo(t, destination);
      first = i;
      continue;
    }
    EMBER_CHECK(t.sizes() == inputs[first].sizes(), "reduce_add: input ", i,
                " has invalid size: got ", Shape(t), ", but expected ", Shape(inputs[first]));
    EMBER_CHECK(t.dtype() == inputs[first].dtype(), "reduce_add: input ", i, " is ", t.dtype(),
                " but input ", first, " is ", inputs[first].dtype());
    sum.add_(t.to(destination));
  }
  return sum;
}

std::vector<Tensor> reduce_add_coalesced(const std::vector<std::vector<Tensor>>& inputs,
                                         Device destination) {
  EMBER_CHECK(!inputs.empty(), "reduce_add_coalesced: expected the tensors of at least one device");
  const size_t n = inputs[0].size();
  for (size_t d = 1; d < inputs.size(); ++d) {
    EMBER_CHECK(inputs[d].size() == n, "reduce_add_coalesced: device ", d, " has ",
                inputs[d].size(), " tensors but device 0 has ", n);
  }
  std::vector<Tensor> out;
  out.reserve(n);
  std::vector<Tensor> column(inputs.size());
  for (size_t i = 0; i < n; ++i) {
    for (size_t d = 0; d < inputs.size(); ++d) column[d] = inputs[d][i];
    out.push_back(reduce_add(column, destination));
  }
  return out;
}

std::vector<Tensor> scatter(const Tensor& tensor, absl::Span<const Device> devices,
                            absl::Span<const int64_t> chunk_sizes, int64_t dim) {
  EMBER_CHECK(tensor.defined(), "scatter: the tensor is undefined");
  EMBER_CHECK(!devices.empty(), "scatter: expected at least one device");
  EMBER_CHECK(tensor.dim() > 0, "scatter: can't split a 0-dim tensor across devices");
  autograd::NoGradGuard no_grad;
  std::vector<Tensor> chunks;
  if (chunk_sizes.empty()) {
    chunks = tensor.chunk(static_cast<int64_t>(devices.size()), dim);
  } else {
    EMBER_CHECK(chunk_sizes.size() == devices.size(), "scatter: expected as many chunk sizes (",
                chunk_sizes.size(), ") as devices (", devices.size(), ")");
    const int64_t total = std::accumulate(chunk_sizes.begin(), chunk_sizes.end(), int64_t{0});
    EMBER_CHECK(
        total == tensor.size(dim),
        "scatter: given chunk sizes don't sum up to the tensor's size (sum(chunk_sizes) == ", total,
        ", but expected ", tensor.size(dim), ")");
    chunks = tensor.split_with_sizes(chunk_sizes, dim);
  }
  for (size_t i = 0; i < chunks.size(); ++i) chunks[i] = chunks[i].to(devices[i]);
  return chunks;
}

Tensor gather(absl::Span<const Tensor> tensors, int64_t dim, Device destination) {
  EMBER_CHECK(!tensors.empty(), "gather: expected at least one tensor");
  autograd::NoGradGuard no_grad;
  std::vector<Tensor> moved;
  moved.reserve(tensors.size());
  for (const Tensor& t : tensors) moved.push_back(t.to(destination));
  return cat(moved, dim);
}

}  // namespace ember::parallel::comm
