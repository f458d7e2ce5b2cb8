// The CUDA transport of parallel/comm.h (Note [Device transports]):
// DataParallel's coalesced broadcasts and reductions between the GPUs of one
// process through NCCL, as torch.cuda.comm does, with peer copies (peer
// access enabled) where NCCL cannot serve; and one side stream per device
// for scatter's copies from the host. Registered for kCUDA when the library
// loads (alwayslink); only built with CUDA (a build without it links an
// empty stand-in, and comm.h then copies tensor by tensor).
//
// Note [NCCL inside one process]
// A device list gets one clique of communicators, made with ncclCommInitAll
// on its first use and kept for the life of the process (as torch's
// _get_communicators cache), in list order: the broadcast's source, or the
// reduction's destination, is NCCL rank 0. Each op is one NCCL group of
// ncclBroadcast / ncclReduce calls, one per device, each on that device's
// current stream, so that it follows the work queued there before it and the
// work queued there after it follows it, without the host waiting. A clique's
// communicators may not be used by two threads at once: a mutex serialises
// the ops. NCCL has no int16 and sums bools as bytes: those, a
// destination off the device list, and a clique NCCL could not make (its
// error is printed once) move by peer copies instead: Tensor::to between
// devices, then additions on the destination. Every op first enables peer
// access (cudaDeviceEnablePeerAccess, both ways, once per pair, where the
// hardware allows it) among the devices it involves, so that those copies,
// and scatter's and gather's between the same devices, go device to device.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "cuda/device.h"
#include "cuda/nccl_dtype.h"
#include "cuda/status.h"
#include "cuda/stream.h"
#include "parallel/comm.h"
#include "parallel/warning.h"
#include "tensor/device_guard.h"
#include "tensor/error.h"
#include "tensor/factories.h"

namespace ember::parallel {
namespace {

// NCCL's type for coalesced copies and sums: cuda::nccl_type, except bool
// (a byte sum is no "or"); none for what NCCL lacks (int16).
std::optional<ncclDataType_t> NcclType(Dtype dtype) {
  if (dtype == Dtype::kBool) return std::nullopt;
  return cuda::nccl_type(dtype);
}

cudaStream_t CurrentStream(int device) {
  absl::StatusOr<cuda::Stream> stream = cuda::current_stream(device);
  EMBER_CHECK(stream.ok(), "DataParallel comm: the current stream of cuda:", device, ": ",
              stream.status().ToString());
  return stream->stream();
}

void Check(ncclResult_t result, const char* call) {
  const absl::Status status = cuda::nccl_status(result, call);
  EMBER_CHECK(status.ok(), "DataParallel comm: ", status.ToString());
}

class CudaTransport final : public comm::DeviceTransport {
 public:
  std::string name() const override { return "nccl"; }

  std::vector<Tensor> Broadcast(const Tensor& flat, absl::Span<const Device> devices) override {
    std::vector<int> order = {flat.device().index()};
    for (const Device& d : devices) order.push_back(d.index());
    std::vector<Tensor> out;
    for (const Device& d : devices) {
      out.push_back(empty({flat.numel()}, TensorOptions().dtype(flat.dtype()).device(d)));
    }
    const std::optional<ncclDataType_t> type = NcclType(flat.dtype());
    absl::MutexLock lock(&mu_);
    EnablePeerAccessAmong(order);
    const std::vector<ncclComm_t>* comms = type ? Clique(order) : nullptr;
    if (comms == nullptr) {
      for (size_t k = 0; k < devices.size(); ++k) {
        EnablePeerAccess(order[0], order[k + 1]);
        out[k].copy_(flat);
      }
      return out;
    }
    Check(ncclGroupStart(), "ncclGroupStart");
    for (size_t k = 0; k < order.size(); ++k) {
      void* buffer = k == 0 ? flat.raw_data() : out[k - 1].raw_data();
      DeviceGuard guard(Device(DeviceType::kCUDA, order[k]));
      Check(ncclBroadcast(buffer, buffer, static_cast<size_t>(flat.numel()), *type, /*root=*/0,
                          (*comms)[k], CurrentStream(order[k])),
            "ncclBroadcast");
    }
    Check(ncclGroupEnd(), "ncclGroupEnd");
    return out;
  }

  Tensor ReduceAdd(absl::Span<const Tensor> flats, Device destination) override {
    // NCCL rank 0 is the destination when it holds one of the inputs.
    size_t root = flats.size();
    for (size_t i = 0; i < flats.size(); ++i) {
      if (flats[i].device() == destination) root = i;
    }
    const std::optional<ncclDataType_t> type = NcclType(flats[0].dtype());
    absl::MutexLock lock(&mu_);
    std::vector<int> involved;
    for (const Tensor& flat : flats) involved.push_back(flat.device().index());
    if (destination.is_cuda()) involved.push_back(destination.index());
    EnablePeerAccessAmong(involved);
    if (root < flats.size() && type.has_value()) {
      std::vector<size_t> ranks = {root};  // NCCL rank -> index into flats
      for (size_t i = 0; i < flats.size(); ++i) {
        if (i != root) ranks.push_back(i);
      }
      std::vector<int> order;
      for (size_t i : ranks) order.push_back(flats[i].device().index());
      if (const std::vector<ncclComm_t>* comms = Clique(order)) {
        Tensor sum = empty({flats[0].numel()},
                           TensorOptions().dtype(flats[0].dtype()).device(destination));
        Check(ncclGroupStart(), "ncclGroupStart");
        for (size_t k = 0; k < ranks.size(); ++k) {
          DeviceGuard guard(Device(DeviceType::kCUDA, order[k]));
          Check(ncclReduce(flats[ranks[k]].raw_data(), k == 0 ? sum.raw_data() : nullptr,
                           static_cast<size_t>(flats[0].numel()), *type, ncclSum, /*root=*/0,
                           (*comms)[k], CurrentStream(order[k])),
                "ncclReduce");
        }
        Check(ncclGroupEnd(), "ncclGroupEnd");
        return sum;
      }
    }
    // Peer copies onto the destination, summed there.
    Tensor sum;
    for (const Tensor& flat : flats) {
      if (destination.is_cuda() && flat.device() != destination) {
        EnablePeerAccess(flat.device().index(), destination.index());
      }
      Tensor moved = flat.to(destination);
      if (!sum.defined()) {
        sum = moved.is_same(flat) ? flat.clone() : moved;
      } else {
        sum.add_(moved);
      }
    }
    return sum;
  }

  std::optional<Stream> SideStream(Device device) override {
    if (!device.has_index()) return std::nullopt;
    absl::MutexLock lock(&mu_);
    auto it = side_.find(device.index());
    if (it == side_.end()) {
      absl::StatusOr<cuda::Stream> stream = cuda::get_stream_from_pool(false, device.index());
      if (!stream.ok()) return std::nullopt;
      it = side_.emplace(device.index(), stream->unwrap()).first;
    }
    return it->second;
  }

 private:
  // The communicators of `order` (Note [NCCL inside one process]), or null
  // when NCCL could not make them. Holds mu_.
  const std::vector<ncclComm_t>* Clique(const std::vector<int>& order)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = cliques_.find(order);
    if (it != cliques_.end()) return it->second.empty() ? nullptr : &it->second;
    std::vector<ncclComm_t> comms(order.size());
    const absl::Status status = cuda::nccl_status(
        ncclCommInitAll(comms.data(), static_cast<int>(order.size()), order.data()),
        "ncclCommInitAll");
    if (!status.ok()) {
      internal::Warn(absl::StrCat("DataParallel: NCCL could not connect the devices inside the "
                                  "process (",
                                  status.ToString(), "); using peer copies"));
      comms.clear();
    }
    it = cliques_.emplace(order, std::move(comms)).first;
    return it->second.empty() ? nullptr : &it->second;
  }

  // EnablePeerAccess for every pair of `devices`: the devices DataParallel
  // replicates onto, so that its scatter, gather and peer copies between them
  // go device to device too.
  void EnablePeerAccessAmong(const std::vector<int>& devices) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (size_t i = 0; i < devices.size(); ++i) {
      for (size_t j = i + 1; j < devices.size(); ++j) EnablePeerAccess(devices[i], devices[j]);
    }
  }

  // Lets `from` read and write `to`'s memory directly (and the reverse), where
  // the hardware allows it; once per pair.
  void EnablePeerAccess(int from, int to) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (from == to) return;
    for (auto [a, b] : {std::pair(from, to), std::pair(to, from)}) {
      if (!peer_.insert({a, b}).second) continue;
      int can = 0;
      if (cudaDeviceCanAccessPeer(&can, a, b) != cudaSuccess || can == 0) {
        (void)cudaGetLastError();
        continue;
      }
      DeviceGuard guard(Device(DeviceType::kCUDA, a));
      const cudaError_t error = cudaDeviceEnablePeerAccess(b, 0);
      if (error != cudaSuccess) (void)cudaGetLastError();  // already enabled, or refused
    }
  }

  absl::Mutex mu_;
  std::map<std::vector<int>, std::vector<ncclComm_t>> cliques_ ABSL_GUARDED_BY(mu_);
  std::set<std::pair<int, int>> peer_ ABSL_GUARDED_BY(mu_);
  std::map<int, Stream> side_ ABSL_GUARDED_BY(mu_);
};

// Registered at load time; never destroyed (ops may run during exit).
[[maybe_unused]] const bool kRegistered = [] {
  comm::SetDeviceTransport(DeviceType::kCUDA, new CudaTransport());
  return true;
}();

}  // namespace
}  // namespace ember::parallel
