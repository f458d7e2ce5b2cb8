#include "parallel/replicate.h"

#include "parallel/comm.h"
#include "parallel/functions.h"
#include "tensor/error.h"

namespace ember::parallel {
namespace {

// copies[d][i]: tensors[i] on devices[d], through autograd unless `detach`.
std::vector<std::vector<Tensor>> BroadcastTensors(absl::Span<const Tensor> tensors,
                                                  absl::Span<const Device> devices, bool detach) {
  if (tensors.empty()) return std::vector<std::vector<Tensor>>(devices.size());
  return detach ? comm::broadcast_coalesced(tensors, devices) : Broadcast::apply(devices, tensors);
}

}  // namespace

std::vector<std::shared_ptr<nn::Module>> replicate(const std::shared_ptr<nn::Module>& module,
                                                   absl::Span<const Device> devices, bool detach) {
  EMBER_CHECK(module != nullptr, "replicate: the module is null");
  if (devices.empty()) return {};
  const std::vector<Tensor> params = module->parameters();
  std::vector<std::vector<Tensor>> param_copies = BroadcastTensors(params, devices, detach);

  // Buffers that require grad go through autograd, the rest are plain copies.
  const std::vector<Tensor> buffers = module->buffers();
  std::vector<Tensor> with_grad, without_grad;
  for (const Tensor& b : buffers)
    (b.requires_grad() && !detach ? with_grad : without_grad).push_back(b);
  std::vector<std::vector<Tensor>> copies_with = BroadcastTensors(with_grad, devices, detach);
  std::vector<std::vector<Tensor>> copies_without = BroadcastTensors(without_grad, devices, true);

  std::vector<std::shared_ptr<nn::Module>> replicas;
  replicas.reserve(devices.size());
  for (size_t d = 0; d < devices.size(); ++d) {
    std::vector<Tensor> buffer_copies;
    buffer_copies.reserve(buffers.size());
    size_t i_with = 0, i_without = 0;
    for (const Tensor& b : buffers) {
      buffer_copies.push_back(b.requires_grad() && !detach ? copies_with[d][i_with++]
                                                           : copies_without[d][i_without++]);
    }
    replicas.push_back(module->replicate_for_data_parallel(param_copies[d], buffer_copies));
  }
  return replicas;
}

}  // namespace ember::parallel
