// CUDA kernels of copy_out and fill_out, and the host-side helpers the other
// CUDA kernel files share (cuda/kernels.h).
//
// copy_out is a cross-device op (Note [Dispatch] in tensor/dispatch.h): this
// kernel owns every copy with a CUDA side.
// - On one device: one cudaMemcpyAsync when the dtypes match and both sides
//   are contiguous, else the strided converting kernel (copy_kernels.cu).
// - Host to device: the source (made contiguous on the host) is copied as it
//   is, then converted or scattered on the device when the destination's
//   dtype or layout differs.
// - Device to host: the source is converted and made contiguous on its device
//   first, copied, and scattered on the host when the destination is not
//   contiguous.
// - Between devices: the source is made contiguous in the destination's dtype
//   on its own device, then copied peer to peer.
// Copies that involve the host, or two devices, wait for the copy to finish
// before returning (torch's copy_ with non_blocking=false), so the host may
// read or free its side at once, except a non-blocking host copy (Note
// [Non-blocking copies] in tensor/ops.h) whose host side is pinned: from a
// pinned source, or to a contiguous pinned destination, the copy (and any
// conversion on the device after it) is queued on the device's current
// stream and not waited for, so it is ordered with the work on that stream
// like a kernel. Copies within a device are asynchronous on the current
// stream.
// A pinned host side (cuda/host_allocator.h) is recorded against the copy's
// stream (host_record_stream), as torch's CachingHostAllocator records an
// event at each copy: once freed, its block is not handed out again before
// the work queued on that stream has finished. While copies wait, that is
// already true when the host gets control back; it is what keeps an
// asynchronous (non_blocking) copy from reading or writing a block that was
// freed and reused meanwhile.
#include <array>
#include <cstring>
#include <mutex>

#include "cuda/kernels.h"
#include "cuda/stream.h"
#include "tensor/device_guard.h"

namespace ember::cuda {
namespace internal {

void CheckSameDevice(const char* op, std::initializer_list<const Tensor*> ts) {
  const Device d = (*ts.begin())->device();
  for (const Tensor* t : ts) {
    EMBER_CHECK(t->device() == d, op, ": expected all tensors on one device, got ", d.str(),
                " and ", t->device().str(), "; move them with .to() first");
  }
}

cudaStream_t StreamOf(Device device) {
  absl::StatusOr<Stream> s = current_stream(device.index());
  if (!s.ok()) ThrowStatus(s.status());
  return s->stream();
}

int SmCount(Device device) {
  static std::mutex mu;
  static std::array<int, 64> counts{};
  const int index = device.index();
  EMBER_CHECK(index >= 0 && index < 64, "CUDA device index ", index, " out of range");
  std::lock_guard<std::mutex> lock(mu);
  if (counts[index] == 0) {
    EMBER_CUDA_CHECK(cudaDeviceGetAttribute(&counts[index], cudaDevAttrMultiProcessorCount, index));
  }
  return counts[index];
}

void CheckLaunch(cudaError_t error, const char* op) {
  if (error != cudaSuccess) ThrowStatus(runtime_status(error, op));
}

kernels::ScalarBits BitsOf(const Scalar& value, Dtype dtype) {
  kernels::ScalarBits bits;
  VisitDtype(dtype, [&]<typename T>() {
    const T v = value.to<T>();
    static_assert(sizeof(T) <= sizeof(bits.bits));
    std::memcpy(&bits.bits, &v, sizeof(T));
  });
  return bits;
}

}  // namespace internal

namespace {

static_assert(kernels::kF32 == static_cast<int>(kFloat32) &&
              kernels::kF64 == static_cast<int>(kFloat64) &&
              kernels::kF16 == static_cast<int>(kFloat16) &&
              kernels::kBF16 == static_cast<int>(kBFloat16) &&
              kernels::kI64 == static_cast<int>(kInt64) &&
              kernels::kI32 == static_cast<int>(kInt32) &&
              kernels::kI16 == static_cast<int>(kInt16) &&
              kernels::kI8 == static_cast<int>(kInt8) && kernels::kU8 == static_cast<int>(kUInt8) &&
              kernels::kBool == static_cast<int>(kBool) && kernels::kNumDtypeCodes == kNumDtypes);

using internal::CheckLaunch;
using internal::DtypeCode;
using internal::StreamOf;

void Synchronize(cudaStream_t stream) { EMBER_CUDA_CHECK(cudaStreamSynchronize(stream)); }

// out = src on one device (the current one), on the current stream.
void DeviceCopy(const Tensor& out, const Tensor& src, cudaStream_t stream) {
  if (out.numel() == 0) return;
  if (out.dtype() == src.dtype() && out.is_contiguous() && src.is_contiguous()) {
    EMBER_CUDA_CHECK(cudaMemcpyAsync(out.raw_data(), src.raw_data(), out.nbytes(),
                                     cudaMemcpyDeviceToDevice, stream));
    return;
  }
  const kernels::Geometry<2> g = internal::GeometryOf<2>("copy_", {&out, &src});
  CheckLaunch(
      kernels::LaunchCopy(stream, g, static_cast<char*>(out.raw_data()), DtypeCode(out.dtype()),
                          static_cast<const char*>(src.raw_data()), DtypeCode(src.dtype())),
      "copy_ kernel");
}

// Records `host`, when pinned, as used by the current stream of `device`.
void RecordPinned(const Tensor& host, Device device) {
  if (host.is_pinned()) host.record_stream(ember::current_stream(device));
}

// Whether this copy may return before the device ran it: asked for, and the
// host side it reads or writes is pinned.
bool NonBlocking(const Tensor& host) {
  return ember::internal::tls_non_blocking_copy && host.is_pinned();
}

void HostToDevice(const Tensor& out, const Tensor& src) {
  if (!NonBlocking(src.contiguous())) {
    internal::CheckNotCapturing(out.device(),
                                "a copy from the host to the device (cuda(), to())");
  }
  DeviceGuard guard(out.device());
  cudaStream_t stream = StreamOf(out.device());
  const Tensor host = src.contiguous();
  const bool direct = out.dtype() == src.dtype() && out.is_contiguous();
  const Tensor staged = direct ? out : EmptyTensor(src.sizes(), src.dtype(), out.device());
  EMBER_CUDA_CHECK(cudaMemcpyAsync(staged.raw_data(), host.raw_data(), host.nbytes(),
                                   cudaMemcpyHostToDevice, stream));
  RecordPinned(host, out.device());
  if (!direct) DeviceCopy(out, staged, stream);
  // `staged` goes back to the caching allocator on this stream: reused only
  // by work queued after the conversion.
  if (!NonBlocking(host)) Synchronize(stream);
}

void DeviceToHost(const Tensor& out, const Tensor& src) {
  const bool non_blocking = NonBlocking(out) && out.is_contiguous();
  if (!non_blocking) {
    internal::CheckNotCapturing(src.device(),
                                "a copy from the device to the host (item(), cpu(), to(kCPU))");
  }
  DeviceGuard guard(src.device());
  cudaStream_t stream = StreamOf(src.device());
  Tensor dev = src;
  if (src.dtype() != out.dtype() || !src.is_contiguous()) {
    dev = EmptyTensor(out.sizes(), out.dtype(), src.device());
    DeviceCopy(dev, src, stream);
  }
  const Tensor host = out.is_contiguous() ? out : EmptyTensor(out.sizes(), out.dtype(), kCPU);
  EMBER_CUDA_CHECK(cudaMemcpyAsync(host.raw_data(), dev.raw_data(), host.nbytes(),
                                   cudaMemcpyDeviceToHost, stream));
  RecordPinned(host, src.device());
  if (non_blocking) return;
  Synchronize(stream);
  if (!out.is_contiguous()) ops::copy_out(out, host);
}

void PeerCopy(const Tensor& out, const Tensor& src) {
  internal::CheckNotCapturing(src.device(), "a copy between devices");
  Tensor staged = src;
  {
    DeviceGuard guard(src.device());
    cudaStream_t stream = StreamOf(src.device());
    if (src.dtype() != out.dtype() || !src.is_contiguous()) {
      staged = EmptyTensor(out.sizes(), out.dtype(), src.device());
      DeviceCopy(staged, src, stream);
    }
    Synchronize(stream);
  }
  DeviceGuard guard(out.device());
  cudaStream_t stream = StreamOf(out.device());
  const Tensor landed =
      out.is_contiguous() ? out : EmptyTensor(out.sizes(), out.dtype(), out.device());
  EMBER_CUDA_CHECK(cudaMemcpyPeerAsync(landed.raw_data(), out.device().index(), staged.raw_data(),
                                       src.device().index(), landed.nbytes(), stream));
  if (!out.is_contiguous()) DeviceCopy(out, landed, stream);
  Synchronize(stream);
}

void CopyOut(const Tensor& out, const Tensor& src) {
  if (out.numel() == 0) return;
  if (out.is_cuda() && src.is_cpu()) return HostToDevice(out, src);
  if (out.is_cpu() && src.is_cuda()) return DeviceToHost(out, src);
  EMBER_CHECK(out.is_cuda() && src.is_cuda(), "copy_: cuda kernel got a ", src.device().str(),
              " source and a ", out.device().str(), " destination");
  if (out.device() != src.device()) return PeerCopy(out, src);
  DeviceGuard guard(out.device());
  DeviceCopy(out, src, StreamOf(out.device()));
}

void FillOut(const Tensor& out, const Scalar& value) {
  if (out.numel() == 0) return;
  DeviceGuard guard(out.device());
  const kernels::Geometry<1> g = internal::GeometryOf<1>("fill_", {&out});
  CheckLaunch(kernels::LaunchFill(StreamOf(out.device()), g, static_cast<char*>(out.raw_data()),
                                  DtypeCode(out.dtype()), internal::BitsOf(value, out.dtype())),
              "fill_ kernel");
}

EMBER_REGISTER_KERNEL(copy_out, kCUDA, &CopyOut);
EMBER_REGISTER_KERNEL(fill_out, kCUDA, &FillOut);

}  // namespace
}  // namespace ember::cuda
