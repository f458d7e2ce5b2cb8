#include "nn/cuda/cudnn_graph.h"

#include <algorithm>

#include "cuda/status.h"
#include "nn/cuda/cudnn.h"
#include "tensor/error.h"

namespace ember::nn::cudnn::internal {

Descriptors::~Descriptors() {
  for (auto it = owned_.rbegin(); it != owned_.rend(); ++it) cudnnBackendDestroyDescriptor(*it);
}

cudnnStatus_t Descriptors::Create(cudnnBackendDescriptorType_t type, cudnnBackendDescriptor_t* d) {
  *d = nullptr;
  const cudnnStatus_t s = cudnnBackendCreateDescriptor(type, d);
  if (s == CUDNN_STATUS_SUCCESS) owned_.push_back(*d);
  return s;
}

bool Ok(cudnnStatus_t s, const char* what, std::string* why) {
  if (s == CUDNN_STATUS_SUCCESS) return true;
  char detail[512] = "";
  cudnnGetLastErrorString(detail, sizeof(detail));
  *why = std::string(what) + ": " + cudnnGetErrorString(s);
  if (detail[0] != '\0') *why += std::string(" (") + detail + ")";
  return false;
}

// --- GraphBuilder ------------------------------------------------------------------------

bool GraphBuilder::Try(cudnnStatus_t status, const char* what) {
  if (!ok()) return false;
  return Ok(status, what, &why_);
}

cudnnBackendDescriptor_t GraphBuilder::Create(cudnnBackendDescriptorType_t type,
                                              const char* what) {
  if (!ok()) return nullptr;
  cudnnBackendDescriptor_t d = nullptr;
  return Try(owned_.Create(type, &d), what) ? d : nullptr;
}

namespace {

// Sets one attribute of `d` to `count` values of `type` at `values`.
template <typename T>
cudnnStatus_t Set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                  cudnnBackendAttributeType_t type, int64_t count, const T* values) {
  return cudnnBackendSetAttribute(d, name, type, count, values);
}

}  // namespace

cudnnBackendDescriptor_t GraphBuilder::Tensor(int64_t uid, const TensorSpec& spec) {
  cudnnBackendDescriptor_t t = Create(CUDNN_BACKEND_TENSOR_DESCRIPTOR, "creating a tensor");
  const std::vector<int64_t> strides = spec.strides.empty() ? PackedStrides(spec.dims)
                                                            : spec.strides;
  const auto rank = static_cast<int64_t>(spec.dims.size());
  const bool is_virtual = spec.is_virtual, by_value = spec.by_value;
  if (!Try(Set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &spec.type),
           "a tensor's data type") ||
      !Try(Set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, rank, spec.dims.data()),
           "a tensor's dimensions") ||
      !Try(Set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, rank, strides.data()),
           "a tensor's strides") ||
      !Try(Set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid), "a tensor's uid") ||
      !Try(Set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &spec.alignment),
           "a tensor's alignment") ||
      (is_virtual &&
       !Try(Set(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual),
            "a tensor's virtual flag")) ||
      (by_value &&
       !Try(Set(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value),
            "a tensor's by-value flag")) ||
      !Try(cudnnBackendFinalize(t), "finalizing a tensor")) {
    return nullptr;
  }
  return t;
}

cudnnBackendDescriptor_t GraphBuilder::Virtual(cudnnDataType_t type, std::vector<int64_t> dims,
                                               std::vector<int64_t> strides) {
  return Tensor(next_virtual_uid_++, TensorSpec{.type = type,
                                                .dims = std::move(dims),
                                                .strides = std::move(strides),
                                                .is_virtual = true});
}

cudnnBackendDescriptor_t GraphBuilder::Scalar(int64_t uid) {
  return Tensor(uid, TensorSpec{.type = CUDNN_DATA_FLOAT,
                                .dims = {1, 1, 1, 1},
                                .strides = {1, 1, 1, 1},
                                .by_value = true});
}

void GraphBuilder::Pointwise(cudnnPointwiseMode_t mode, cudnnDataType_t compute,
                             cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                             cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y,
                             int64_t axis) {
  cudnnBackendDescriptor_t pw = Create(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, "creating a pointwise");
  if (!Try(Set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode),
           "a pointwise's mode") ||
      !Try(Set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &compute),
           "a pointwise's precision") ||
      (axis >= 0 &&
       !Try(Set(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis), "a pointwise's axis")) ||
      !Try(cudnnBackendFinalize(pw), "finalizing a pointwise")) {
    return;
  }
  cudnnBackendDescriptor_t op =
      Create(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, "creating a pointwise operation");
  const float one = 1.0f;
  const auto port = [&](cudnnBackendAttributeName_t name, cudnnBackendDescriptor_t d,
                        const char* what) {
    return d == nullptr ||
           Try(Set(op, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &d), what);
  };
  if (!Try(Set(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
               &pw),
           "a pointwise operation's descriptor") ||
      !Try(x == nullptr || y == nullptr ? CUDNN_STATUS_BAD_PARAM : CUDNN_STATUS_SUCCESS,
           "a pointwise operation without x or y") ||
      !port(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x, "a pointwise operation's x") ||
      !port(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b, "a pointwise operation's b") ||
      !port(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t, "a pointwise operation's t") ||
      !port(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y, "a pointwise operation's y") ||
      !Try(Set(op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one),
           "a pointwise operation's alpha1") ||
      (b != nullptr && !Try(Set(op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1,
                                &one),
                            "a pointwise operation's alpha2")) ||
      !Try(cudnnBackendFinalize(op), "finalizing a pointwise operation")) {
    return;
  }
  operations_.push_back(op);
}

void GraphBuilder::Matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
                          cudnnBackendDescriptor_t c, cudnnDataType_t compute) {
  cudnnBackendDescriptor_t mm = Create(CUDNN_BACKEND_MATMUL_DESCRIPTOR, "creating a matmul");
  if (!Try(Set(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute),
           "a matmul's compute type") ||
      !Try(cudnnBackendFinalize(mm), "finalizing a matmul")) {
    return;
  }
  cudnnBackendDescriptor_t op =
      Create(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, "creating a matmul operation");
  if (!Try(Set(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a),
           "a matmul's a") ||
      !Try(Set(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b),
           "a matmul's b") ||
      !Try(Set(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c),
           "a matmul's c") ||
      !Try(Set(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mm),
           "a matmul operation's descriptor") ||
      !Try(cudnnBackendFinalize(op), "finalizing a matmul operation")) {
    return;
  }
  operations_.push_back(op);
}

void GraphBuilder::Reduction(cudnnReduceTensorOp_t reduce, cudnnBackendDescriptor_t x,
                             cudnnBackendDescriptor_t y) {
  const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  cudnnBackendDescriptor_t r = Create(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, "creating a reduction");
  if (!Try(Set(r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &reduce),
           "a reduction's operator") ||
      !Try(Set(r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute),
           "a reduction's compute type") ||
      !Try(cudnnBackendFinalize(r), "finalizing a reduction")) {
    return;
  }
  cudnnBackendDescriptor_t op =
      Create(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, "creating a reduction operation");
  if (!Try(Set(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x),
           "a reduction's x") ||
      !Try(Set(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y),
           "a reduction's y") ||
      !Try(Set(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &r),
           "a reduction operation's descriptor") ||
      !Try(cudnnBackendFinalize(op), "finalizing a reduction operation")) {
    return;
  }
  operations_.push_back(op);
}

void GraphBuilder::Reshape(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
  cudnnBackendDescriptor_t op =
      Create(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, "creating a reshape operation");
  if (!Try(Set(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x),
           "a reshape's x") ||
      !Try(Set(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y),
           "a reshape's y") ||
      !Try(cudnnBackendFinalize(op), "finalizing a reshape operation")) {
    return;
  }
  operations_.push_back(op);
}

void GraphBuilder::Add(cudnnBackendDescriptor_t operation) {
  if (ok()) operations_.push_back(operation);
}

cudnnBackendDescriptor_t GraphBuilder::Finalize(cudnnHandle_t handle) {
  cudnnBackendDescriptor_t graph =
      Create(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "creating the operation graph");
  if (!Try(Set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
               static_cast<int64_t>(operations_.size()), operations_.data()),
           "the graph's operations") ||
      !Try(Set(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle),
           "the graph's handle") ||
      !Try(cudnnBackendFinalize(graph), "finalizing the operation graph")) {
    return nullptr;
  }
  return graph;
}

// --- Choosing a plan ---------------------------------------------------------------------

namespace {

#define EMBER_GRAPH_TRY(call, what)           \
  do {                                        \
    if (!Ok((call), what, why)) return false; \
  } while (0)

// The numerical notes of engine configuration `cfg`'s engine.
bool Notes(Descriptors& owned, cudnnBackendDescriptor_t cfg,
           std::vector<cudnnBackendNumericalNote_t>* notes, std::string* why) {
  cudnnBackendDescriptor_t engine = nullptr;
  EMBER_GRAPH_TRY(owned.Create(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &engine), "creating an engine");
  int64_t count = 0;
  EMBER_GRAPH_TRY(cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE,
                                           CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &count, &engine),
                  "an engine configuration's engine");
  notes->assign(static_cast<size_t>(CUDNN_NUMERICAL_NOTE_TYPE_COUNT),
                CUDNN_NUMERICAL_NOTE_TYPE_COUNT);
  EMBER_GRAPH_TRY(
      cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                               CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &count, notes->data()),
      "an engine's numerical notes");
  notes->resize(static_cast<size_t>(
      std::max<int64_t>(0, std::min<int64_t>(count, CUDNN_NUMERICAL_NOTE_TYPE_COUNT))));
  return true;
}

// The engine configurations cuDNN's heuristics of `mode` rank for `graph`.
bool Heuristics(Descriptors& owned, cudnnBackendDescriptor_t graph, cudnnBackendHeurMode_t mode,
                std::vector<cudnnBackendDescriptor_t>* cfgs, std::string* why) {
  cudnnBackendDescriptor_t heur = nullptr;
  EMBER_GRAPH_TRY(owned.Create(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heur), "creating heuristics");
  EMBER_GRAPH_TRY(cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH,
                                           CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph),
                  "the heuristics' graph");
  EMBER_GRAPH_TRY(
      cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode),
      "the heuristics' mode");
  EMBER_GRAPH_TRY(cudnnBackendFinalize(heur), "finalizing the heuristics");
  int64_t count = 0;
  EMBER_GRAPH_TRY(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                           CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr),
                  "the heuristics' result count");
  cfgs->assign(static_cast<size_t>(std::max<int64_t>(count, 0)), nullptr);
  for (cudnnBackendDescriptor_t& cfg : *cfgs) {
    EMBER_GRAPH_TRY(owned.Create(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &cfg),
                    "creating an engine configuration");
  }
  if (cfgs->empty()) return true;
  EMBER_GRAPH_TRY(
      cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                               count, &count, cfgs->data()),
      "the heuristics' results");
  cfgs->resize(static_cast<size_t>(std::max<int64_t>(0, std::min<int64_t>(count, cfgs->size()))));
  return true;
}

#undef EMBER_GRAPH_TRY

}  // namespace

bool ChoosePlan(cudnnBackendDescriptor_t graph, cudnnHandle_t handle, Device device,
                const EngineFilter& refuse, Plan* plan, std::string* why) {
  Descriptors& owned = plan->owned;
  std::string refused;
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    std::vector<cudnnBackendDescriptor_t> cfgs;
    if (!Heuristics(owned, graph, mode, &cfgs, why)) {
      refused = *why;
      continue;
    }
    for (cudnnBackendDescriptor_t cfg : cfgs) {
      if (refuse) {
        std::vector<cudnnBackendNumericalNote_t> notes;
        if (!Notes(owned, cfg, &notes, why)) {
          refused = *why;
          continue;
        }
        if (refuse(notes)) {
          refused = "an engine using TF32 (turned off) or lower-precision inputs was refused";
          continue;
        }
      }
      cudnnBackendDescriptor_t candidate = nullptr;
      int64_t bytes = 0, count = 0;
      if (!Ok(owned.Create(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &candidate),
              "creating an execution plan", why) ||
          !Ok(cudnnBackendSetAttribute(candidate, CUDNN_ATTR_EXECUTION_PLAN_HANDLE,
                                       CUDNN_TYPE_HANDLE, 1, &handle),
              "the plan's handle", why) ||
          !Ok(cudnnBackendSetAttribute(candidate, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                       CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg),
              "the plan's engine configuration", why) ||
          !Ok(cudnnBackendFinalize(candidate), "finalizing an execution plan", why) ||
          !Ok(cudnnBackendGetAttribute(candidate, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                       CUDNN_TYPE_INT64, 1, &count, &bytes),
              "the plan's workspace size", why)) {
        refused = *why;
        continue;
      }
      try {
        // Freed at once into the caching allocator, which serves the calls'.
        Workspace(device, static_cast<size_t>(std::max<int64_t>(bytes, 0)));
      } catch (const Error& e) {
        refused = e.what();  // Out of memory for this one: try one that needs less.
        continue;
      }
      plan->plan = candidate;
      plan->workspace = std::max<int64_t>(bytes, 0);
      return true;
    }
  }
  *why = refused.empty() ? "cuDNN's heuristics offer no engine" : refused;
  return false;
}

// --- Execution ---------------------------------------------------------------------------

namespace {

// A variant pack, destroyed with the object.
class VariantPack {
 public:
  VariantPack() {
    EMBER_CUDA_CHECK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &d_));
  }
  ~VariantPack() { cudnnBackendDestroyDescriptor(d_); }
  VariantPack(const VariantPack&) = delete;
  VariantPack& operator=(const VariantPack&) = delete;
  cudnnBackendDescriptor_t get() const { return d_; }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

}  // namespace

void Execute(cudnnHandle_t handle, Device device, const Plan& plan, std::span<const int64_t> uids,
             std::span<void* const> pointers) {
  EMBER_CHECK(uids.size() == pointers.size(), "cuDNN graph execution: ", uids.size(),
              " uids for ", pointers.size(), " pointers");
  // Alive until the execution is queued; then free on the stream it runs on.
  Tensor workspace = Workspace(device, static_cast<size_t>(plan.workspace));
  void* scratch = workspace.raw_data();
  const auto n = static_cast<int64_t>(uids.size());
  VariantPack pack;
  EMBER_CUDA_CHECK(cudnnBackendSetAttribute(pack.get(), CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
                                            CUDNN_TYPE_VOID_PTR, n, pointers.data()));
  EMBER_CUDA_CHECK(cudnnBackendSetAttribute(pack.get(), CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS,
                                            CUDNN_TYPE_INT64, n, uids.data()));
  EMBER_CUDA_CHECK(cudnnBackendSetAttribute(pack.get(), CUDNN_ATTR_VARIANT_PACK_WORKSPACE,
                                            CUDNN_TYPE_VOID_PTR, 1, &scratch));
  EMBER_CUDA_CHECK(cudnnBackendFinalize(pack.get()));
  EMBER_CUDA_CHECK(cudnnBackendExecute(handle, plan.plan, pack.get()));
}

}  // namespace ember::nn::cudnn::internal
