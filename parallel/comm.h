// comm: moving tensors between the devices of a data-parallel step, as
// torch.cuda.comm: broadcast one tensor to several devices, sum copies back
// onto one, split a tensor across devices and concatenate pieces onto one.
//
//   ```cpp
//   #include "parallel/comm.h"
//   #include "tensor/factories.h"
//   ember::Tensor w = ember::randn({6, 2});
//   ember::Tensor x = ember::randn({6, 2});
//   std::vector<ember::Device> devices(3, ember::kCPU);   // three CPU replicas
//   std::vector<ember::Tensor> copies = ember::parallel::comm::broadcast(w, devices);
//   // copies[0] shares w's storage; copies[1] and copies[2] are copies.
//   ember::Tensor sum = ember::parallel::comm::reduce_add(copies, ember::kCPU);   // 3 * w
//   std::vector<ember::Tensor> parts = ember::parallel::comm::scatter(x, devices);  // 2 rows each
//   ember::Tensor whole = ember::parallel::comm::gather(parts, 0, ember::kCPU);    // x again
//   ```
//
// A device list names one replica per entry (Note [Device lists] in
// parallel/README.md): on the CPU, kCPU repeated. Nothing here is recorded
// by autograd; functions.h wraps these as autograd nodes. Copies are made
// on the calling thread (on CUDA they will run on the current stream).
//
// Errors: these are tensor operations and throw ember::Error naming the
// values involved. Pure functions; thread-safe.
#ifndef EMBER_PARALLEL_COMM_H_
#define EMBER_PARALLEL_COMM_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "tensor/device.h"
#include "tensor/tensor.h"

namespace ember::parallel::comm {

// One tensor per entry of `devices`: the entry that is the first one equal
// to tensor's device gets `tensor` itself (shared storage); every other entry
// gets a fresh copy on its device, so that each replica owns its memory even
// when several entries name the same device.
std::vector<Tensor> broadcast(const Tensor& tensor, absl::Span<const Device> devices);

// broadcast() of each tensor: result[d][i] is tensors[i] on devices[d]. On
// the CPU the tensors are copied one by one; packing them into one buffer per
// device pays off across a device link and arrives with CUDA.
std::vector<std::vector<Tensor>> broadcast_coalesced(absl::Span<const Tensor> tensors,
                                                     absl::Span<const Device> devices);

// The elementwise sum of `inputs` (one per device, same shape and dtype) in
// a new tensor on `destination`. Undefined inputs count as zeros; all
// undefined gives an undefined tensor.
Tensor reduce_add(absl::Span<const Tensor> inputs, Device destination);

// reduce_add() of each position: inputs[d][i] is tensor i from device d; the
// result's entry i sums inputs[*][i].
std::vector<Tensor> reduce_add_coalesced(const std::vector<std::vector<Tensor>>& inputs,
                                         Device destination);

// Splits `tensor` along `dim` into pieces of `chunk_sizes` (empty: equal
// pieces, as tensor.chunk(devices.size(), dim), which may give fewer pieces
// than devices when the dim is short) and puts piece i on devices[i]. A piece
// already on its device is a view of `tensor`.
std::vector<Tensor> scatter(const Tensor& tensor, absl::Span<const Device> devices,
                            absl::Span<const int64_t> chunk_sizes = {}, int64_t dim = 0);

// Concatenates `tensors` along `dim` into a new tensor on `destination`.
Tensor gather(absl::Span<const Tensor> tensors, int64_t dim, Device destination);

}  // namespace ember::parallel::comm

#endif  // EMBER_PARALLEL_COMM_H_
