// The dispatched op registry: one `Op` object per entry of tensor/ops.inc
// (Note [Dispatch] in tensor/dispatch.h). Tensor methods call these; kernel
// libraries register implementations into them.
//
//   ```cpp
//   #include "tensor/factories.h"
//   #include "tensor/ops.h"
//   ember::Tensor a = ember::ones({3}), b = ember::arange(3);
//   ember::Tensor c = ember::ops::binary(ember::BinaryOp::kAdd, a, b);  // a + b
//   ```
//
// Most code should use the Tensor methods instead.
#ifndef EMBER_TENSOR_OPS_H_
#define EMBER_TENSOR_OPS_H_

#include <optional>
#include <string_view>

#include "absl/types/span.h"
#include "tensor/dispatch.h"
#include "tensor/op_kinds.h"
#include "tensor/tensor.h"

namespace ember {

class Generator;  // tensor/factories.h

// The op kinds of tensor/op_kinds.h.
#define EMBER_OP_KIND(name) name,
enum class UnaryOp : uint8_t { EMBER_UNARY_OPS(EMBER_OP_KIND) };

enum class BinaryOp : uint8_t { EMBER_BINARY_OPS(EMBER_OP_KIND) };

enum class ReduceOp : uint8_t { EMBER_REDUCE_OPS(EMBER_OP_KIND) };
#undef EMBER_OP_KIND

// The activations gemm_bias_act_out applies after a GEMM and its bias (its
// int64_t `act`): ReLU, and GELU's tanh approximation (what cuBLASLt's GELU
// epilogue computes; torch's approximate="tanh").
enum class GemmActivation : int64_t { kReLU = 1, kGeluTanh = 2 };

// Lowercase names as in torch ("exp", "add", "sum"), for messages.
std::string_view UnaryOpName(UnaryOp op);
std::string_view BinaryOpName(BinaryOp op);
std::string_view ReduceOpName(ReduceOp op);

// Whether the op's result is computed in floating point even for integer
// inputs (exp, sqrt, ...: int64 in, float32 out).
bool UnaryOpPromotesToFloat(UnaryOp op);
// Comparison and logical ops: bool results.
bool BinaryOpReturnsBool(BinaryOp op);

// Throws when `self` cannot be written elementwise: some of its elements
// share memory (an expanded tensor), as torch refuses. `op` names the caller.
void CheckWritable(const Tensor& self, const char* op);

// Counts an in-place modification of `self` (and all its views).
inline void BumpVersion(const Tensor& self) { self.impl()->BumpVersion(); }

// Note [Fresh tensors start at version 0]
// A tensor that a factory or a copy (clone, to, rand, eye) has just made and
// filled reads version 0, as in torch: its filling happened before anyone
// could hold or save it, so it is not a modification. Fillers that go through
// a dispatched in-place op (copy_, so that autograd records clone and to)
// call this on the result; nothing else shares its counter yet.
inline void ResetFreshVersion(const Tensor& fresh) {
  fresh.impl()->version_counter()->version.store(0, std::memory_order_relaxed);
}

// Note [Non-blocking copies]
// copy_(src, non_blocking) and to(device, non_blocking) ask that a copy
// between the host and a device not wait for the device. copy_ and copy_out
// keep their (self, src) signatures; the request travels to the device's
// copy_out kernel as this thread's NonBlockingCopyGuard, alive for exactly
// that one copy. The kernel honours it only as PyTorch does: a copy whose
// host side is pinned memory is queued on the device's current stream and
// returns at once (the pinned block recorded against that stream, so it is
// not handed out again before the copy ran); from or to pageable memory the
// copy waits, non_blocking or not. Copies within a device never wait;
// kernels of other devices (the CPU's) ignore the request.
namespace internal {
extern thread_local constinit bool tls_non_blocking_copy;
}  // namespace internal

// While alive, copies on this thread may be non-blocking (see above).
// Nests; restores the previous state on destruction.
class NonBlockingCopyGuard {
 public:
  explicit NonBlockingCopyGuard(bool non_blocking) : previous_(internal::tls_non_blocking_copy) {
    internal::tls_non_blocking_copy = non_blocking;
  }
  ~NonBlockingCopyGuard() { internal::tls_non_blocking_copy = previous_; }
  NonBlockingCopyGuard(const NonBlockingCopyGuard&) = delete;
  NonBlockingCopyGuard& operator=(const NonBlockingCopyGuard&) = delete;

 private:
  bool previous_;
};

// The result of op(a, b) for in-place ops must have `self`'s shape; throws
// "<op>: output with shape [3] doesn't match the broadcast shape [2, 3]".
void CheckInPlaceShape(const Tensor& self, IntArrayRef broadcast, const char* op);

// Whether two tensors' element ranges in one storage may overlap.
bool MayOverlap(const Tensor& a, const Tensor& b);

// Whether two tensors are the same elements: one storage, offset, sizes,
// strides and dtype. Reading and writing such a pair elementwise is safe.
bool SameView(const Tensor& a, const Tensor& b);

// A fresh contiguous tensor of `sizes` on `device` (uninitialised), from the
// allocator registered for its type, or from `allocator` (pinned host
// memory, for instance); `device` is current while its memory is allocated.
Tensor EmptyTensor(IntArrayRef sizes, Dtype dtype, Device device);
Tensor EmptyTensor(IntArrayRef sizes, Dtype dtype, Device device, Allocator* allocator);

// An input of a batched GEMM kernel ([batch, rows, cols]) as BLAS can read
// it: the tensor itself when its matrices have a BLAS layout
// (GetBlasMatrixLayout), else a contiguous copy; with that layout.
struct BlasOperand {
  Tensor tensor;
  BlasMatrixLayout layout;
};
BlasOperand AsBlasOperand(const Tensor& t, int64_t rows, int64_t cols);

namespace ops {
#define EMBER_OP(name, ret, args) extern Op<ret args> name;
#define EMBER_CROSS_DEVICE_OP EMBER_OP
#include "tensor/ops.inc"
#undef EMBER_CROSS_DEVICE_OP
#undef EMBER_OP
}  // namespace ops

}  // namespace ember

#endif  // EMBER_TENSOR_OPS_H_
