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
// on the calling thread, on the current stream of each device involved.
//
// Note [Device transports]
// Between the devices of an accelerator, broadcast_coalesced and
// reduce_add_coalesced pack the tensors of each dtype into flat buffers of
// at most `buffer_size` bytes and move each buffer through the transport
// registered for the device type (SetDeviceTransport): for CUDA,
// parallel/cuda_comm.cc (linked wherever CUDA is) runs NCCL inside the
// process (one communicator per device list, ncclBroadcast / ncclReduce on
// every device's current stream), and falls back to peer copies with peer
// access enabled where NCCL cannot serve (a dtype it lacks, a destination off
// the list). Without a transport (the CPU; a build without CUDA) the tensors
// are copied one by one. scatter() of a host tensor onto devices copies each
// piece on the transport's side stream of its device; the device's current
// stream then waits on an event recorded after the copy, and the piece is
// recorded on that stream for the allocator (torch's Scatter with its
// background streams).
//
// Errors: these are tensor operations and throw ember::Error naming the
// values involved. Pure functions; thread-safe.
#ifndef EMBER_PARALLEL_COMM_H_
#define EMBER_PARALLEL_COMM_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "tensor/device.h"
#include "tensor/tensor.h"

namespace ember::parallel::comm {

// What a device type provides to move data-parallel buffers between its
// devices (Note [Device transports]). Implementations are thread-safe and
// throw ember::Error for failures, as the tensor operations here do.
class DeviceTransport {
 public:
  virtual ~DeviceTransport() = default;
  // For a transport's messages: "nccl", "peer copies".
  virtual std::string name() const = 0;
  // A copy of `flat` (contiguous, 1-D) on each of `devices` (all of the
  // transport's type, distinct, none of them flat's device), queued on the
  // current streams of flat's device and of each target.
  virtual std::vector<Tensor> Broadcast(const Tensor& flat, absl::Span<const Device> devices) = 0;
  // The elementwise sum of `flats` (contiguous, 1-D, equal sizes and dtype,
  // on distinct devices of the transport's type) in a new tensor on
  // `destination` (any device), queued on the current streams.
  virtual Tensor ReduceAdd(absl::Span<const Tensor> flats, Device destination) = 0;
  // A stream of `device` other than the current one, for copies that should
  // not wait behind the current stream's work; nullopt when there is none.
  virtual std::optional<Stream> SideStream(Device device) = 0;
};

// Registers `transport` (not owned; null unregisters) for `type`.
void SetDeviceTransport(DeviceType type, DeviceTransport* transport);
// The transport registered for `type`, or null.
DeviceTransport* GetDeviceTransport(DeviceType type);

// PyTorch's default buffer_size of the coalesced copies (10 MiB).
inline constexpr int64_t kDefaultBufferSize = int64_t{10} << 20;

// One tensor per entry of `devices`: the entry that is the first one equal
// to tensor's device gets `tensor` itself (shared storage); every other entry
// gets a fresh copy on its device, so that each replica owns its memory even
// when several entries name the same device.
std::vector<Tensor> broadcast(const Tensor& tensor, absl::Span<const Device> devices);

// broadcast() of each tensor: result[d][i] is tensors[i] on devices[d]. On
// the CPU the tensors are copied one by one; between devices with a
// transport they travel packed in buffers of at most `buffer_size` bytes
// (Note [Device transports]), and result[d][i] then shares the memory of
// the buffer that arrived on devices[d] (not a view: its own version count).
std::vector<std::vector<Tensor>> broadcast_coalesced(absl::Span<const Tensor> tensors,
                                                     absl::Span<const Device> devices,
                                                     int64_t buffer_size = kDefaultBufferSize);

// The elementwise sum of `inputs` (one per device, same shape and dtype) in
// a new tensor on `destination`. Undefined inputs count as zeros; all
// undefined gives an undefined tensor.
Tensor reduce_add(absl::Span<const Tensor> inputs, Device destination);

// reduce_add() of each position: inputs[d][i] is tensor i from device d; the
// result's entry i sums inputs[*][i]. Between devices with a transport, the
// defined tensors of each dtype travel packed as in broadcast_coalesced.
std::vector<Tensor> reduce_add_coalesced(const std::vector<std::vector<Tensor>>& inputs,
                                         Device destination,
                                         int64_t buffer_size = kDefaultBufferSize);

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
