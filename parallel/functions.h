// The autograd functions of DataParallel, as torch.nn.parallel._functions:
// comm.h's copies recorded in the autograd graph, so that a loss computed
// from several replicas sends its gradients back through them.
//
//   ```cpp
//   #include "parallel/functions.h"
//   #include "tensor/factories.h"
//   ember::Tensor w = ember::ones({3}, ember::TensorOptions().requires_grad(true));
//   std::vector<ember::Device> devices(2, ember::kCPU);
//   // copies[d][0]: w on devices[d], non-leaf outputs of one node.
//   std::vector<std::vector<ember::Tensor>> copies =
//       ember::parallel::Broadcast::apply(devices, {w});
//   ember::Tensor loss = copies[0][0].sum() + (copies[1][0] * 2.0).sum();
//   loss.backward();   // w.grad() is the sum over copies: 1 + 2 = 3 everywhere
//   if (w.grad().sum().item<double>() != 9) return absl::InternalError("gradients not summed");
//   ```
//
// | function | forward | backward |
// | --- | --- | --- |
// | Broadcast | each input to every device (comm::broadcast_coalesced) | ReduceAddCoalesced of the
// gradients onto each input's device | | ReduceAddCoalesced | sums each position over the devices
// onto one | Broadcast back to the devices the inputs came from | | Scatter | splits one tensor
// across devices along dim | Gather onto the input's device | | Gather | concatenates along dim
// onto one device | Scatter back to the input devices with their sizes |
//
// Each records one node when grad mode is on and an input requires grad, and
// its backward is written in these functions, so create_graph gives second
// derivatives. Outputs of inputs that need no gradient don't require grad.
// Gradients that a replica never produced count as zeros.
//
// Errors: tensor math; throws ember::Error (from comm.h). Thread-safety: as
// any recorded op.
#ifndef EMBER_PARALLEL_FUNCTIONS_H_
#define EMBER_PARALLEL_FUNCTIONS_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "tensor/device.h"
#include "tensor/tensor.h"

namespace ember::parallel {

struct Broadcast {
  // result[d][i] is inputs[i] on devices[d] (comm::broadcast: the first entry
  // naming an input's device shares its storage, as a new tensor handle).
  static std::vector<std::vector<Tensor>> apply(absl::Span<const Device> devices,
                                                absl::Span<const Tensor> inputs);
};

struct ReduceAddCoalesced {
  // result[i] is the sum over d of grads[d][i], on `destination`.
  static std::vector<Tensor> apply(Device destination,
                                   const std::vector<std::vector<Tensor>>& grads);
};

struct Scatter {
  // comm::scatter of `input`, recorded.
  static std::vector<Tensor> apply(absl::Span<const Device> devices,
                                   absl::Span<const int64_t> chunk_sizes, int64_t dim,
                                   const Tensor& input);
};

struct Gather {
  // comm::gather of `inputs` onto `destination`, recorded. When every input
  // is 0-dim and dim is 0, each is taken as a vector of one value (so the
  // result has one value per input), with PyTorch's warning.
  static Tensor apply(Device destination, int64_t dim, absl::Span<const Tensor> inputs);
};

}  // namespace ember::parallel

#endif  // EMBER_PARALLEL_FUNCTIONS_H_
