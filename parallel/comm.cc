#include "parallel/comm.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "autograd/grad_mode.h"
#include "tensor/error.h"
#include "tensor/factories.h"
#include "tensor/stream.h"

namespace ember::parallel::comm {
namespace {

// One slot per device type (Note [Device transports]).
std::array<std::atomic<DeviceTransport*>, 2> g_transports{};

size_t Slot(DeviceType type) { return static_cast<size_t>(type); }

// The transport for tensors on `device`, or null (the CPU; no backend).
DeviceTransport* TransportFor(Device device) {
  if (device.is_cpu()) return nullptr;
  return GetDeviceTransport(device.type());
}

// Groups of indices into `tensors`: one dtype each, in order, each at most
// `buffer_size` bytes unless a single tensor is larger (torch's
// _take_tensors).
std::vector<std::vector<size_t>> Chunks(const std::vector<Tensor>& tensors, int64_t buffer_size) {
  std::map<Dtype, std::pair<std::vector<size_t>, int64_t>> open;
  std::vector<std::vector<size_t>> out;
  for (size_t i = 0; i < tensors.size(); ++i) {
    auto& [indices, bytes] = open[tensors[i].dtype()];
    const auto size = static_cast<int64_t>(tensors[i].nbytes());
    if (!indices.empty() && bytes + size > buffer_size) {
      out.push_back(std::move(indices));
      indices.clear();
      bytes = 0;
    }
    indices.push_back(i);
    bytes += size;
  }
  for (auto& [dtype, chunk] : open) {
    if (!chunk.first.empty()) out.push_back(std::move(chunk.first));
  }
  return out;
}

// The tensors of `chunk` packed into one flat tensor on `device`.
Tensor Pack(const std::vector<Tensor>& tensors, const std::vector<size_t>& chunk, Device device) {
  int64_t total = 0;
  for (size_t i : chunk) total += tensors[i].numel();
  Tensor flat = empty({total}, TensorOptions().dtype(tensors[chunk.front()].dtype()).device(device));
  int64_t offset = 0;
  for (size_t i : chunk) {
    const Tensor& t = tensors[i];
    flat.narrow(0, offset, t.numel()).copy_(t.reshape({t.numel()}));
    offset += t.numel();
  }
  return flat;
}

// The pieces of `flat` in the shapes of the tensors of `chunk`: they share
// its memory but are no views of it and count their in-place writes apart,
// as torch's unflattened results (its NOTE [Version Counter in
// comm.*_coalesced]): a replica's BatchNorm updating its running mean in
// place must not look like a write to the weight it saved for backward.
std::vector<Tensor> Unpack(const Tensor& flat, const std::vector<Tensor>& tensors,
                           const std::vector<size_t>& chunk) {
  std::vector<Tensor> out;
  int64_t offset = 0;
  for (size_t i : chunk) {
    Tensor piece = flat.narrow(0, offset, tensors[i].numel()).view(tensors[i].sizes()).detach();
    piece.impl()->set_version_counter(std::make_shared<VersionCounter>());
    out.push_back(std::move(piece));
    offset += tensors[i].numel();
  }
  return out;
}

// `piece` (on the host) copied to `device` on the transport's side stream;
// the device's current stream waits for the copy (Note [Device transports]).
Tensor CopyOnSideStream(const Tensor& piece, Device device) {
  DeviceTransport* transport = TransportFor(device);
  std::optional<Stream> side =
      transport != nullptr && piece.is_cpu() ? transport->SideStream(device) : std::nullopt;
  if (!side.has_value()) return piece.to(device);
  const Stream main = current_stream(side->device());
  Tensor out;
  {
    StreamGuard guard(*side);
    out = piece.to(side->device(), /*non_blocking=*/true);
  }
  Event copied(device.type());
  absl::Status status = copied.record(*side);
  if (status.ok()) status = copied.block(main);
  EMBER_CHECK(status.ok(), "scatter: ordering the copy to ", device.str(),
              " before the current stream failed: ", status.ToString());
  out.record_stream(main);
  return out;
}

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

void SetDeviceTransport(DeviceType type, DeviceTransport* transport) {
  g_transports[Slot(type)].store(transport);
}

DeviceTransport* GetDeviceTransport(DeviceType type) { return g_transports[Slot(type)].load(); }

std::vector<std::vector<Tensor>> broadcast_coalesced(absl::Span<const Tensor> tensors,
                                                     absl::Span<const Device> devices,
                                                     int64_t buffer_size) {
  EMBER_CHECK(buffer_size > 0, "broadcast_coalesced: buffer_size must be positive, got ",
              buffer_size);
  std::vector<std::vector<Tensor>> out(devices.size());
  for (auto& per_device : out) per_device.reserve(tensors.size());
  // Packed only when every tensor sits on one device with a transport and
  // every target is a device of that type (Note [Device transports]).
  DeviceTransport* transport = nullptr;
  if (!tensors.empty() && tensors.front().defined()) {
    const Device source = tensors.front().device();
    transport = TransportFor(source);
    for (const Tensor& t : tensors) {
      if (!t.defined() || t.device() != source) transport = nullptr;
    }
    for (const Device& d : devices) {
      if (d.type() != source.type() || !d.has_index()) transport = nullptr;
    }
  }
  if (transport == nullptr) {
    for (const Tensor& t : tensors) {
      std::vector<Tensor> copies = broadcast(t, devices);
      for (size_t d = 0; d < devices.size(); ++d) out[d].push_back(std::move(copies[d]));
    }
    return out;
  }
  autograd::NoGradGuard no_grad;
  const Device source = tensors.front().device();
  // The distinct targets; an entry naming a device again gets a clone.
  std::vector<Device> targets;
  for (const Device& d : devices) {
    if (d != source && std::find(targets.begin(), targets.end(), d) == targets.end()) {
      targets.push_back(d);
    }
  }
  const std::vector<Tensor> list(tensors.begin(), tensors.end());
  // arrived[k][i]: tensor i on targets[k].
  std::vector<std::vector<Tensor>> arrived(targets.size(), std::vector<Tensor>(list.size()));
  if (!targets.empty()) {
    for (const std::vector<size_t>& chunk : Chunks(list, buffer_size)) {
      const Tensor flat = Pack(list, chunk, source);
      const std::vector<Tensor> copies = transport->Broadcast(flat, targets);
      EMBER_CHECK(copies.size() == targets.size(), "broadcast_coalesced: the ",
                  transport->name(), " transport returned ", copies.size(), " copies for ",
                  targets.size(), " devices");
      for (size_t k = 0; k < targets.size(); ++k) {
        std::vector<Tensor> views = Unpack(copies[k], list, chunk);
        for (size_t j = 0; j < chunk.size(); ++j) arrived[k][chunk[j]] = std::move(views[j]);
      }
    }
  }
  std::vector<bool> handed_out(targets.size() + 1, false);  // [0]: the source
  for (size_t d = 0; d < devices.size(); ++d) {
    const size_t k = devices[d] == source
                         ? 0
                         : 1 + static_cast<size_t>(std::find(targets.begin(), targets.end(),
                                                             devices[d]) -
                                                   targets.begin());
    for (size_t i = 0; i < list.size(); ++i) {
      const Tensor& t = k == 0 ? list[i] : arrived[k - 1][i];
      out[d].push_back(handed_out[k] ? t.clone() : t);
    }
    handed_out[k] = true;
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
                                         Device destination, int64_t buffer_size) {
  EMBER_CHECK(!inputs.empty(), "reduce_add_coalesced: expected the tensors of at least one device");
  EMBER_CHECK(buffer_size > 0, "reduce_add_coalesced: buffer_size must be positive, got ",
              buffer_size);
  const size_t n = inputs[0].size();
  for (size_t d = 1; d < inputs.size(); ++d) {
    EMBER_CHECK(inputs[d].size() == n, "reduce_add_coalesced: device ", d, " has ",
                inputs[d].size(), " tensors but device 0 has ", n);
  }
  std::vector<Tensor> out(n);
  std::vector<Tensor> column(inputs.size());
  // Positions every device holds, on one device each, distinct, with a
  // transport (Note [Device transports]): packed; the rest one by one.
  std::vector<Device> where(inputs.size());
  DeviceTransport* transport = nullptr;
  bool packable = inputs.size() > 1 && n > 0;
  for (size_t d = 0; d < inputs.size() && packable; ++d) {
    for (const Tensor& t : inputs[d]) {
      if (!t.defined()) continue;
      if (where[d].is_cpu() && !where[d].has_index()) where[d] = t.device();
      if (t.device() != where[d]) packable = false;
    }
    DeviceTransport* mine = TransportFor(where[d]);
    if (mine == nullptr || (transport != nullptr && mine != transport)) packable = false;
    transport = mine;
    for (size_t e = 0; e < d; ++e) {
      if (where[e] == where[d]) packable = false;
    }
  }
  std::vector<size_t> packed;  // positions
  for (size_t i = 0; i < n; ++i) {
    for (size_t d = 0; d < inputs.size(); ++d) column[d] = inputs[d][i];
    bool all_defined = true;
    for (size_t d = 0; d < inputs.size(); ++d) {
      const Tensor& t = column[d];
      if (!t.defined()) {
        all_defined = false;
        continue;
      }
      EMBER_CHECK(t.sizes() == column[0].sizes() || !column[0].defined(),
                  "reduce_add: input ", d, " has invalid size: got ", Shape(t),
                  ", but expected ", Shape(column[0]));
      EMBER_CHECK(!column[0].defined() || t.dtype() == column[0].dtype(), "reduce_add: input ",
                  d, " is ", t.dtype(), " but input 0 is ", column[0].dtype());
    }
    if (packable && all_defined) {
      packed.push_back(i);
    } else {
      out[i] = reduce_add(column, destination);
    }
  }
  if (packed.empty()) return out;
  autograd::NoGradGuard no_grad;
  std::vector<Tensor> first;  // device 0's tensors at the packed positions
  for (size_t i : packed) first.push_back(inputs[0][i]);
  for (const std::vector<size_t>& chunk : Chunks(first, buffer_size)) {
    std::vector<Tensor> flats;
    for (size_t d = 0; d < inputs.size(); ++d) {
      std::vector<Tensor> mine;
      for (size_t i : packed) mine.push_back(inputs[d][i]);
      flats.push_back(Pack(mine, chunk, where[d]));
    }
    const Tensor sum = transport->ReduceAdd(flats, destination);
    std::vector<Tensor> views = Unpack(sum, first, chunk);
    for (size_t j = 0; j < chunk.size(); ++j) out[packed[chunk[j]]] = std::move(views[j]);
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
  for (size_t i = 0; i < chunks.size(); ++i) chunks[i] = CopyOnSideStream(chunks[i], devices[i]);
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
