// checkpoint_sequential: segments of modules run under autograd::checkpoint.
#include "nn/checkpoint.h"

#include "tensor/error.h"

namespace ember::nn {
namespace {

// Calls functions[start..end] (inclusive) in order.
Tensor RunSegment(const std::vector<std::shared_ptr<Module>>& functions, size_t start, size_t end,
                  Tensor x) {
  for (size_t j = start; j <= end; ++j) x = (*functions[j])(x);
  return x;
}

}  // namespace

Tensor checkpoint_sequential(const std::vector<std::shared_ptr<Module>>& functions,
                             int64_t segments, const Tensor& input,
                             const autograd::CheckpointOptions& options) {
  const int64_t n = static_cast<int64_t>(functions.size());
  EMBER_CHECK(segments >= 1 && segments <= n,
              "checkpoint_sequential: segments must be between 1 and the number of modules (", n,
              "), got ", segments);
  for (size_t i = 0; i < functions.size(); ++i) {
    EMBER_CHECK(functions[i] != nullptr, "checkpoint_sequential: module ", i, " is null");
  }
  const size_t segment_size = static_cast<size_t>(n / segments);
  Tensor x = input;
  size_t start = 0;
  for (int64_t s = 0; s + 1 < segments; ++s, start += segment_size) {
    const size_t end = start + segment_size - 1;
    // The segment's modules, held until the backward pass recomputes them.
    std::vector<std::shared_ptr<Module>> segment(functions.begin() + start,
                                                 functions.begin() + end + 1);
    x = autograd::checkpoint(
        [segment](const Tensor& in) { return RunSegment(segment, 0, segment.size() - 1, in); }, x,
        options);
  }
  return RunSegment(functions, start, functions.size() - 1, x);
}

Tensor checkpoint_sequential(const Sequential& functions, int64_t segments, const Tensor& input,
                             const autograd::CheckpointOptions& options) {
  std::vector<std::shared_ptr<Module>> modules;
  modules.reserve(functions.size());
  for (size_t i = 0; i < functions.size(); ++i) {
    modules.push_back(functions[static_cast<int64_t>(i)]);
  }
  return checkpoint_sequential(modules, segments, input, options);
}

}  // namespace ember::nn
