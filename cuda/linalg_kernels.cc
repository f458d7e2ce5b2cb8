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
#include <cublasLt.h>
#include <cublas_v2.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <tuple>
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

// Note [Bias epilogue]
// gemm_bias_out (a Linear's forward) runs as one cuBLASLt matmul whose
// epilogue adds the bias (CUBLASLT_EPILOGUE_BIAS), as PyTorch's addmm does,
// instead of copying the bias into the output and accumulating onto it. In
// cuBLASLt's column-major terms the row-major out [n, m] is D^T: D (m x n) =
// op(b) (m x k) * op(a) (k x n) + bias (m, one per row of D). The descriptors
// and the heuristic's algorithm are made once per shape, layout and dtype,
// per thread and device (the host cost of a call is then one attribute set
// and the launch); the workspace is the thread's per (device, stream), as
// cuBLAS's.
// gemm_bias_grad_out (a Linear's weight and bias gradients) is the same
// matmul with a bias-gradient epilogue: the bias pointer is written with the
// sums over the GEMM's k of op(b) (CUBLASLT_EPILOGUE_BGRADA: cuBLASLt's A is
// our b) or, with of_a, of op(a) (CUBLASLT_EPILOGUE_BGRADB: its B is our a),
// the reduction PyTorch otherwise runs as a separate sum after the GEMM.
// gemm_bias_act_out (a Linear and the activation after it) adds the
// activation to the forward's epilogue: CUBLASLT_EPILOGUE_RELU_BIAS, or
// CUBLASLT_EPILOGUE_GELU_AUX_BIAS, which also writes the pre-activation into
// the auxiliary buffer (`pre`, leading dimension m) for GELU's backward.
// Operands without a BLAS layout are made contiguous (AsBlasOperand); an
// output, bias or auxiliary buffer that is not contiguous, a dtype cuBLASLt's bias epilogues
// lack here (float64), or a shape for which the heuristic offers no
// algorithm with the epilogue takes the composite path.
struct LtKey {
  int device;
  Dtype dtype;
  int64_t n, m, k, lda, ldb;
  bool a_row_major, b_row_major, tf32;
  cublasLtEpilogue_t epilogue;
  bool operator<(const LtKey& o) const {
    return std::tie(device, dtype, n, m, k, lda, ldb, a_row_major, b_row_major, tf32, epilogue) <
           std::tie(o.device, o.dtype, o.n, o.m, o.k, o.lda, o.ldb, o.a_row_major, o.b_row_major,
                    o.tf32, o.epilogue);
  }
};

struct LtPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool ok = false;  // the heuristic found an algorithm
};

struct ThreadLt {
  std::map<int, cublasLtHandle_t> handles;
  std::map<LtKey, LtPlan> plans;
  ~ThreadLt() {
    for (auto& [key, p] : plans) {
      if (p.desc != nullptr) (void)cublasLtMatmulDescDestroy(p.desc);
      for (cublasLtMatrixLayout_t l : {p.a, p.b, p.d}) {
        if (l != nullptr) (void)cublasLtMatrixLayoutDestroy(l);
      }
    }
    for (auto& [device, h] : handles) (void)cublasLtDestroy(h);
  }
};

ThreadLt& Lt() {
  thread_local ThreadLt lt;
  return lt;
}

// The thread's cuBLASLt workspace for (device, stream).
void* WorkspaceFor(Device device, cudaStream_t stream) {
  thread_local std::map<std::pair<int, cudaStream_t>, Tensor> lt_workspaces;
  const std::pair<int, cudaStream_t> key(device.index(), stream);
  auto ws = lt_workspaces.find(key);
  if (ws == lt_workspaces.end()) {
    ws = lt_workspaces.emplace(key, EmptyTensor({kWorkspaceBytes}, kUInt8, device)).first;
  }
  return ws->second.raw_data();
}

const LtPlan& PlanFor(const LtKey& key, cudaDataType_t type, cublasComputeType_t compute) {
  ThreadLt& lt = Lt();
  auto found = lt.plans.find(key);
  if (found != lt.plans.end()) return found->second;
  LtPlan& plan = lt.plans[key];
  auto h = lt.handles.find(key.device);
  if (h == lt.handles.end()) {
    cublasLtHandle_t handle = nullptr;
    EMBER_CHECK(cublasLtCreate(&handle) == CUBLAS_STATUS_SUCCESS, "cublasLtCreate failed");
    h = lt.handles.emplace(key.device, handle).first;
  }
  if (cublasLtMatmulDescCreate(&plan.desc, compute, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS) {
    return plan;
  }
  const cublasOperation_t op_b = key.b_row_major ? CUBLAS_OP_N : CUBLAS_OP_T;
  const cublasOperation_t op_a = key.a_row_major ? CUBLAS_OP_N : CUBLAS_OP_T;
  const cublasLtEpilogue_t epilogue = key.epilogue;
  (void)cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_b, sizeof(op_b));
  (void)cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_a, sizeof(op_a));
  (void)cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                       sizeof(epilogue));
  if (epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) {
    // The auxiliary output is laid out as D: m rows (column-major), ld m. The
    // heuristic sees it with a placeholder pointer; each call sets its own.
    const int64_t aux_ld = static_cast<int64_t>(key.m);
    const void* placeholder = reinterpret_cast<const void*>(uintptr_t{256});
    (void)cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld,
                                         sizeof(aux_ld));
    (void)cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                         &placeholder, sizeof(placeholder));
  }
  // Stored shapes: op(b) is m x k, so b is stored m x k (N) or k x m (T);
  // op(a) is k x n, so a is stored k x n (N) or n x k (T); D is m x n.
  const uint64_t m = key.m, n = key.n, k = key.k;
  const bool layouts_ok =
      cublasLtMatrixLayoutCreate(&plan.b, type, key.b_row_major ? m : k, key.b_row_major ? k : m,
                                 key.ldb) == CUBLAS_STATUS_SUCCESS &&
      cublasLtMatrixLayoutCreate(&plan.a, type, key.a_row_major ? k : n, key.a_row_major ? n : k,
                                 key.lda) == CUBLAS_STATUS_SUCCESS &&
      cublasLtMatrixLayoutCreate(&plan.d, type, m, n, m) == CUBLAS_STATUS_SUCCESS;
  if (!layouts_ok) return plan;
  cublasLtMatmulPreference_t pref = nullptr;
  if (cublasLtMatmulPreferenceCreate(&pref) != CUBLAS_STATUS_SUCCESS) return plan;
  const uint64_t workspace = kWorkspaceBytes;
  (void)cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                             &workspace, sizeof(workspace));
  cublasLtMatmulHeuristicResult_t result{};
  int found_algos = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(h->second, plan.desc, plan.b, plan.a, plan.d, plan.d, pref, 1,
                                     &result, &found_algos);
  (void)cublasLtMatmulPreferenceDestroy(pref);
  if (st == CUBLAS_STATUS_SUCCESS && found_algos > 0) {
    plan.algo = result.algo;
    plan.ok = true;
  }
  return plan;
}

// out = a @ b through cuBLASLt with `epilogue` reading or writing `bias`
// (and `aux`, [n, m], where the epilogue has an auxiliary output) (Note
// [Bias epilogue]); false when the composite must run instead.
bool LtMatmul(const char* op, const Tensor& out, const Tensor& a_in, const Tensor& b_in,
              const Tensor& bias, cublasLtEpilogue_t epilogue, const Tensor& aux = Tensor()) {
  const Dtype dtype = out.dtype();
  internal::CheckSameDevice(op, {&out, &a_in, &b_in, &bias});
  const int64_t n = out.sizes()[0], m = out.sizes()[1], k = a_in.sizes()[1];
  if (dtype == kFloat64 || k == 0 || !out.is_contiguous() || !bias.is_contiguous() ||
      bias.dtype() != dtype) {
    return false;
  }
  if (aux.defined() && (!aux.is_contiguous() || aux.dtype() != dtype || aux.sizes() != out.sizes() ||
                        aux.device() != out.device())) {
    return false;
  }
  DeviceGuard guard(out.device());
  const BlasOperand a_op = AsBlasOperand(a_in.unsqueeze(0), n, k);
  const BlasOperand b_op = AsBlasOperand(b_in.unsqueeze(0), k, m);
  for (int64_t v : {n, m, k, a_op.layout.ld, b_op.layout.ld}) CheckFitsInt(v, a_in, b_in);
  cudaDataType_t type = CUDA_R_32F;
  cublasComputeType_t compute = AllowTf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  if (dtype == kFloat16) type = CUDA_R_16F;
  if (dtype == kBFloat16) type = CUDA_R_16BF;
  if (dtype != kFloat32) compute = CUBLAS_COMPUTE_32F;
  const LtKey key{out.device().index(),
                  dtype,
                  n,
                  m,
                  k,
                  a_op.layout.ld,
                  b_op.layout.ld,
                  a_op.layout.row_major,
                  b_op.layout.row_major,
                  compute == CUBLAS_COMPUTE_32F_FAST_TF32,
                  epilogue};
  const LtPlan& plan = PlanFor(key, type, compute);
  if (!plan.ok) return false;
  cudaStream_t stream = StreamOf(out.device());
  void* workspace = WorkspaceFor(out.device(), stream);
  const void* bias_ptr = bias.raw_data();
  EMBER_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                             &bias_ptr, sizeof(bias_ptr)) == CUBLAS_STATUS_SUCCESS,
              "cublasLtMatmulDescSetAttribute(BIAS_POINTER) failed");
  if (aux.defined()) {
    const void* aux_ptr = aux.raw_data();
    EMBER_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                               &aux_ptr, sizeof(aux_ptr)) == CUBLAS_STATUS_SUCCESS,
                "cublasLtMatmulDescSetAttribute(EPILOGUE_AUX_POINTER) failed");
  }
  const float one = 1.0f, zero = 0.0f;
  EMBER_CHECK(cublasLtMatmul(Lt().handles.at(key.device), plan.desc, &one, b_op.tensor.raw_data(),
                             plan.b, a_op.tensor.raw_data(), plan.a, &zero, out.raw_data(),
                             plan.d, out.raw_data(), plan.d, &plan.algo, workspace,
                             kWorkspaceBytes, stream) == CUBLAS_STATUS_SUCCESS,
              "cublasLtMatmul (", op, ", ", n, "x", k, " @ ", k, "x", m, ") failed");
  return true;
}

void GemmBiasOutCuda(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& bias) {
  if (LtMatmul("gemm_bias_out", out, a, b, bias, CUBLASLT_EPILOGUE_BIAS)) return;
  ops::copy_out(out, bias.expand(out.sizes()));
  GemmOut(out.unsqueeze(0), a.unsqueeze(0), b.unsqueeze(0), 1, 1);
}

void GemmBiasGradOutCuda(const Tensor& out, const Tensor& bias_grad, const Tensor& a,
                         const Tensor& b, bool of_a) {
  if (LtMatmul("gemm_bias_grad_out", out, a, b, bias_grad,
               of_a ? CUBLASLT_EPILOGUE_BGRADB : CUBLASLT_EPILOGUE_BGRADA)) {
    return;
  }
  GemmOut(out.unsqueeze(0), a.unsqueeze(0), b.unsqueeze(0), 0, 1);
  ops::copy_out(bias_grad, of_a ? a.sum(std::vector<int64_t>{1}) : b.sum(std::vector<int64_t>{0}));
}

void GemmBiasActOutCuda(const Tensor& out, const Tensor& pre, const Tensor& a, const Tensor& b,
                        const Tensor& bias, int64_t act) {
  const auto activation = static_cast<GemmActivation>(act);
  // RELU_BIAS writes no pre-activation, GELU_AUX_BIAS needs somewhere to
  // write it: other requests take the composite.
  const bool fused =
      activation == GemmActivation::kReLU
          ? !pre.defined() &&
                LtMatmul("gemm_bias_act_out", out, a, b, bias, CUBLASLT_EPILOGUE_RELU_BIAS)
          : activation == GemmActivation::kGeluTanh && pre.defined() &&
                LtMatmul("gemm_bias_act_out", out, a, b, bias, CUBLASLT_EPILOGUE_GELU_AUX_BIAS,
                         pre);
  if (!fused) ops::gemm_bias_act_out.Redispatch(DispatchKey::kCUDA, out, pre, a, b, bias, act);
}

EMBER_REGISTER_KERNEL(gemm_bias_out, kCUDA, &GemmBiasOutCuda);
EMBER_REGISTER_KERNEL(gemm_bias_act_out, kCUDA, &GemmBiasActOutCuda);
EMBER_REGISTER_KERNEL(gemm_bias_grad_out, kCUDA, &GemmBiasGradOutCuda);

}  // namespace
}  // namespace ember::cuda
