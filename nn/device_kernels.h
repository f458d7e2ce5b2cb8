// How nn's layers reach the kernel of their input's device (private to nn/
// and the libraries that implement nn's kernels for a device, e.g. nn/cuda/).
//
// Note [nn device kernels]
// The layers with kernels of their own (convolution, pooling, normalisation,
// embedding, losses) are autograd Functions whose forward and backward call
// a few kernels. Each such kernel is a `DeviceKernel<Signature>` slot, defined
// once by the layer's source and declared in its area's *_kernels.h header;
// every device's library fills the slot for its device type at load time:
//
//   // nn/conv_kernels.h
//   using ConvForwardFn = Tensor(const Tensor& x, const Tensor& w, ...);
//   extern constinit DeviceKernel<ConvForwardFn> conv2d_forward;
//   // nn/conv.cc defines the slot (constinit: filled before any registration):
//   constinit DeviceKernel<ConvForwardFn> conv2d_forward{"conv2d forward"};
//   // nn/conv.cc (the CPU kernel) and nn/cuda/conv.cc (cuDNN), each:
//   EMBER_REGISTER_NN_KERNEL(conv2d_forward, DeviceType::kCPU, &ConvForwardCpu);
//   // the Function:
//   Tensor y = conv2d_forward(x.device())(x, w, b, params);
//
// So the layers never depend on a device's library (cuda/ links into nn, not
// the other way round), a device is added without touching the layers, and
// a layer called on a device whose library is not linked (or that has no
// kernel for it) gets an error naming the op and the device. This is nn's
// counterpart of tensor/'s dispatcher (Note [Dispatch] in tensor/dispatch.h),
// kept apart because these kernels are internal steps of a layer, not ops a
// user calls. Registration happens during static initialisation; lookups are
// thread-safe once main() runs.
#ifndef EMBER_NN_DEVICE_KERNELS_H_
#define EMBER_NN_DEVICE_KERNELS_H_

#include <array>

#include "tensor/device.h"
#include "tensor/error.h"

namespace ember::nn::internal {

template <typename Fn>
class DeviceKernel {
 public:
  // `op` names the kernel in errors ("conv2d forward").
  explicit constexpr DeviceKernel(const char* op) : op_(op) {}
  DeviceKernel(const DeviceKernel&) = delete;
  DeviceKernel& operator=(const DeviceKernel&) = delete;

  // Fills the slot of `type`; a second registration for one type is a
  // programming error. Returns true (for EMBER_REGISTER_NN_KERNEL).
  bool Register(DeviceType type, Fn* fn) {
    Fn*& slot = fns_[static_cast<int>(type)];
    EMBER_CHECK(slot == nullptr, op_, ": a second kernel registered for ",
                Device(type).str());
    slot = fn;
    return true;
  }

  // Whether `type` has a kernel (the library implementing it is linked).
  bool has(DeviceType type) const { return fns_[static_cast<int>(type)] != nullptr; }

  // The kernel of `device`'s type; throws naming the op and the device when
  // there is none.
  Fn* operator()(Device device) const {
    Fn* fn = fns_[static_cast<int>(device.type())];
    EMBER_CHECK(fn != nullptr, op_, ": no kernel for ", device.str(), " tensors in this build",
                device.is_cuda() ? " (link //:ember, which carries nn's CUDA kernels in a build "
                                   "with CUDA support, or move the tensors with .to(ember::kCPU))"
                                 : "");
    return fn;
  }

  const char* op() const { return op_; }

 private:
  const char* op_;
  std::array<Fn*, kNumDeviceTypes> fns_{};
};

}  // namespace ember::nn::internal

#define EMBER_NN_KERNEL_CONCAT_INNER(a, b) a##b
#define EMBER_NN_KERNEL_CONCAT(a, b) EMBER_NN_KERNEL_CONCAT_INNER(a, b)

// Registers `fn` as `slot`'s kernel for `device_type` at load time. Use it in
// a library built with alwayslink = 1, so the registration is linked.
#define EMBER_REGISTER_NN_KERNEL(slot, device_type, fn)                      \
  [[maybe_unused]] static const bool EMBER_NN_KERNEL_CONCAT(                 \
      ember_nn_kernel_registered_, __LINE__) = (slot).Register((device_type), (fn))

#endif  // EMBER_NN_DEVICE_KERNELS_H_
