// scatter, scatter_kwargs and gather, as torch.nn.parallel.scatter_gather:
// how DataParallel splits a batch across its replicas and joins their
// outputs again.
//
//   ```cpp
//   #include "parallel/scatter_gather.h"
//   #include "tensor/factories.h"
//   using ember::multiprocessing::Value;
//   ember::Tensor x = ember::randn({8, 3}), mask = ember::ones({8});
//   std::vector<ember::Device> devices(2, ember::kCPU);
//   // A batch of 8 and a dict of extras: each replica gets 4 rows of every tensor.
//   std::vector<Value> shares = ember::parallel::scatter(
//       Value(Value::List{Value(x), Value(Value::Dict{{"mask", Value(mask)}, {"k", Value(3)}})}),
//       devices);
//   // shares[1].list()[0] is rows 4..7 of x; shares[1].list()[1].find("k") is 3.
//   if (shares[1].list()[1].find("k")->as<int64_t>().value() != 3) {
//     return absl::InternalError("k not shared");
//   }
//   Value out = ember::parallel::gather({shares[0].list()[0], shares[1].list()[0]}, ember::kCPU);
//   if (!out.as<ember::Tensor>()->equal(x)) return absl::InternalError("not x again");
//   ```
//
// Arguments are multiprocessing::Value trees (multiprocessing/value.h): a
// tensor is split along `dim` with the recorded Scatter (functions.h), so
// gradients flow back to it; lists (Python's tuples and lists) and dicts are
// recursed; anything else (numbers, strings, None, channels) is shared, the
// same value for every replica. As in PyTorch, when a tensor splits into
// fewer pieces than there are devices (a batch smaller than the device
// list), there are only as many replicas as the smallest split gives.
//
// Errors: tensor math; throws ember::Error naming what is wrong. Pure
// functions; thread-safe.
#ifndef EMBER_PARALLEL_SCATTER_GATHER_H_
#define EMBER_PARALLEL_SCATTER_GATHER_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/types/span.h"
#include "multiprocessing/value.h"
#include "tensor/device.h"

namespace ember::parallel {

using Value = multiprocessing::Value;

// One share of `inputs` per replica (at most devices.size()); see above.
std::vector<Value> scatter(const Value& inputs, absl::Span<const Device> devices, int64_t dim = 0);

// scatter() of the positional and the keyword arguments, padded so that both
// have one entry per replica: empty lists and dicts where one side ran out
// (as torch.nn.parallel.scatter_kwargs).
std::pair<std::vector<Value::List>, std::vector<Value::Dict>> scatter_kwargs(
    const Value::List& inputs, const Value::Dict& kwargs, absl::Span<const Device> devices,
    int64_t dim = 0);

// Joins the replicas' outputs (one Value each, all of the same structure) on
// `target_device` (PyTorch's -1 is kCPU): tensors are concatenated along
// `dim` with the recorded Gather (0-dim tensors gathered on dim 0 become a
// vector with one value per replica, with PyTorch's warning); lists are
// joined position by position, dicts key by key (all must have the same
// number of keys); None stays None. Any other value throws.
Value gather(absl::Span<const Value> outputs, Device target_device, int64_t dim = 0);

}  // namespace ember::parallel

#endif  // EMBER_PARALLEL_SCATTER_GATHER_H_
