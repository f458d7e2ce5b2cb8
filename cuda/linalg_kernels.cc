// CUDA kernel of gemm_out through cuBLAS: out[b] = beta * out[b] + alpha *
// (a[b] @ b[b]) for out [B, n, m], a [B, n, k], b [B, k, m] (a batch stride
// may be 0), as one cublasGemmStridedBatchedEx call.
//
// cuBLAS is column-major, so the row-major product C = A B is computed as
// C^T = B^T A^T: a row-major operand is passed untransposed with its row
// stride as the leading dimension, a column-major one (a transposed view)
// transposed; an operand that is neither is made contiguous first, and an
// output that is not row-major goes through a contiguous temporary.
// float32 computes in float32 (TF32 tensor cores only when
// TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1, as torch's matmul default of
// allow_tf32 = False); float64 in float64; float16 and bfloat16 in float32 on
// the tensor cores. Integer and bool matmuls are refused, as torch refuses
// them on CUDA.
//
// Handles: one per device and thread, bound to the current stream at each
// call, with a workspace from the caching allocator per (device, stream), so
// work on two streams never shares one and a device never gets another
// device's memory: every device's default stream is the same null handle,
// so the stream alone does not tell devices apart. A thread's handles go back
// to a per-device pool when it exits, for the next thread to reuse.
#include <cublas_v2.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "cuda/kernels.h"
#include "tensor/device_guard.h"

namespace ember::cuda {
namespace {

using internal::StreamOf;

// cuBLAS's workspace per handle and stream (torch's default on Hopper).
constexpr int64_t kWorkspaceBytes = int64_t{32} << 20;

class HandlePool {
 public:
  static HandlePool& Get() {
    static HandlePool* pool = new HandlePool();  // Outlives every thread.
    return *pool;
  }
  cublasHandle_t Acquire(int device) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      std::vector<cublasHandle_t>& free = free_[device];
      if (!free.empty()) {
        cublasHandle_t h = free.back();
        free.pop_back();
        return h;
      }
    }
    cublasHandle_t h = nullptr;
    EMBER_CUDA_CHECK(cublasCreate(&h));
    return h;
  }
  void Release(int device, cublasHandle_t h) {
    std::lock_guard<std::mutex> lock(mu_);
    free_[device].push_back(h);
  }

 private:
  std::mutex mu_;
  std::map<int, std::vector<cublasHandle_t>> free_;
};

// This thread's handles and workspaces.
struct ThreadHandles {
  std::map<int, cublasHandle_t> handles;
  std::map<std::pair<int, cudaStream_t>, Tensor> workspaces;  // by (device, stream)
  ~ThreadHandles() {
    for (auto& [device, h] : handles) HandlePool::Get().Release(device, h);
  }
};

// The current device's handle for this thread, bound to `stream` with its
// workspace.
cublasHandle_t HandleFor(Device device, cudaStream_t stream) {
  thread_local ThreadHandles mine;
  auto it = mine.handles.find(device.index());
  if (it == mine.handles.end()) {
    it = mine.handles.emplace(device.index(), HandlePool::Get().Acquire(device.index())).first;
  }
  cublasHandle_t h = it->second;
  EMBER_CUDA_CHECK(cublasSetStream(h, stream));
  const std::pair<int, cudaStream_t> key(device.index(), stream);
  auto ws = mine.workspaces.find(key);
  if (ws == mine.workspaces.end()) {
    ws = mine.workspaces.emplace(key, EmptyTensor({kWorkspaceBytes}, kUInt8, device)).first;
  }
  EMBER_CUDA_CHECK(cublasSetWorkspace(h, ws->second.raw_data(), kWorkspaceBytes));
  return h;
}

bool AllowTf32() {
  static const bool allow = [] {
    const char* env = std::getenv("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE");
    return env != nullptr && std::string(env) == "1";
  }();
  return allow;
}

using Layout = BlasMatrixLayout;

// out = beta * out, for an empty inner dimension.
void ScaleOut(const Tensor& out, const Scalar& beta) {
  if (beta.to_double() == 0.0) {
    ops::fill_out(out, 0);
    return;
  }
  Tensor s = EmptyTensor({}, out.dtype(), out.device());
  ops::fill_out(s, beta);
  ops::binary_out(BinaryOp::kMul, out, out, s.expand(out.sizes()));
}

void CheckFitsInt(int64_t v, const Tensor& a, const Tensor& b) {
  EMBER_CHECK(v <= INT_MAX, "gemm: matrix dimensions (", ShapeToString(a.sizes()), " @ ",
              ShapeToString(b.sizes()), ") exceed what cuBLAS can index");
}

void GemmOut(const Tensor& out_in, const Tensor& a_in, const Tensor& b_in, const Scalar& beta,
             const Scalar& alpha) {
  EMBER_INTERNAL_ASSERT(out_in.dim() == 3 && a_in.dim() == 3 && b_in.dim() == 3,
                        "gemm_out: expects 3-D out, a and b");
  const Dtype dtype = out_in.dtype();
  EMBER_CHECK(is_floating_point(dtype), "gemm: matmul of ", dtype_name(dtype),
              " tensors is not supported on CUDA (as in torch); convert them to a floating "
              "dtype first");
  internal::CheckSameDevice("gemm", {&out_in, &a_in, &b_in});
  if (out_in.numel() == 0) return;
  DeviceGuard guard(out_in.device());
  if (a_in.sizes()[2] == 0) return ScaleOut(out_in, beta);
  const int64_t batch = out_in.sizes()[0], n = out_in.sizes()[1], m = out_in.sizes()[2];
  const int64_t k = a_in.sizes()[2];
  const BlasOperand a_op = AsBlasOperand(a_in, n, k), b_op = AsBlasOperand(b_in, k, m);
  const Tensor& a = a_op.tensor;
  const Tensor& b = b_op.tensor;
  const std::optional<Layout> la = a_op.layout, lb = b_op.layout;
  Tensor out = out_in;
  // cuBLAS writes C^T column-major, i.e. out row-major.
  std::optional<Layout> lc = GetBlasMatrixLayout(n, m, out.strides()[1], out.strides()[2]);
  const bool beta_zero = beta.to_double() == 0.0;
  const bool temp_out = !lc || !lc->row_major || (batch > 1 && out.strides()[0] == 0);
  if (temp_out) {
    out = beta_zero ? EmptyTensor(out_in.sizes(), dtype, out_in.device()) : out_in.contiguous();
    lc = Layout{true, std::max<int64_t>(m, 1)};
  }
  EMBER_INTERNAL_ASSERT(la && lb && lc, "gemm: no cuBLAS layout after making operands contiguous");
  for (int64_t v : {batch, n, m, k, la->ld, lb->ld, lc->ld}) CheckFitsInt(v, a_in, b_in);

  cudaStream_t stream = StreamOf(out.device());
  cublasHandle_t h = HandleFor(out.device(), stream);
  // C^T (m x n) = op(b) (m x k) * op(a) (k x n).
  const cublasOperation_t op_b = lb->row_major ? CUBLAS_OP_N : CUBLAS_OP_T;
  const cublasOperation_t op_a = la->row_major ? CUBLAS_OP_N : CUBLAS_OP_T;
  cudaDataType_t type = CUDA_R_32F;
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  float alpha_f = alpha.to<float>(), beta_f = beta.to<float>();
  double alpha_d = alpha.to<double>(), beta_d = beta.to<double>();
  const void* alpha_p = &alpha_f;
  const void* beta_p = &beta_f;
  switch (dtype) {
    case kFloat32:
      if (AllowTf32()) compute = CUBLAS_COMPUTE_32F_FAST_TF32;
      break;
    case kFloat64:
      type = CUDA_R_64F;
      compute = CUBLAS_COMPUTE_64F;
      alpha_p = &alpha_d;
      beta_p = &beta_d;
      break;
    case kFloat16:
      type = CUDA_R_16F;
      break;
    default:  // kBFloat16
      type = CUDA_R_16BF;
      break;
  }
  EMBER_CUDA_CHECK(cublasGemmStridedBatchedEx(
      h, op_b, op_a, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha_p,
      b.raw_data(), type, static_cast<int>(lb->ld), b.strides()[0], a.raw_data(), type,
      static_cast<int>(la->ld), a.strides()[0], beta_p, out.raw_data(), type,
      static_cast<int>(lc->ld), temp_out ? n * m : out.strides()[0], static_cast<int>(batch),
      compute, CUBLAS_GEMM_DEFAULT));
  if (temp_out) ops::copy_out(out_in, out);
}

EMBER_REGISTER_KERNEL(gemm_out, kCUDA, &GemmOut);

}  // namespace
}  // namespace ember::cuda
