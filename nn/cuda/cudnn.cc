#include "nn/cuda/cudnn.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string_view>
#include <utility>

#include "cuda/kernels.h"
#include "cuda/status.h"
#include "tensor/error.h"
#include "tensor/ops.h"

namespace ember::nn::cudnn {
namespace {

std::atomic<bool> tf32_allowed{true};
std::atomic<bool> benchmark_on{false};

std::atomic<bool>& GraphApiOn() {
  static std::atomic<bool> on{internal::GraphApiSetting(std::getenv("EMBER_CUDNN_GRAPH_API"))};
  return on;
}

// Handles no thread holds, per device (Note [cuDNN handles and workspaces]).
class HandlePool {
 public:
  static HandlePool& Get() {
    static HandlePool* pool = new HandlePool();  // Outlives every thread.
    return *pool;
  }
  // A handle of the current device, `device`.
  cudnnHandle_t Acquire(int device) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      std::vector<cudnnHandle_t>& free = free_[device];
      if (!free.empty()) {
        cudnnHandle_t h = free.back();
        free.pop_back();
        return h;
      }
    }
    cudnnHandle_t h = nullptr;
    EMBER_CUDA_CHECK(cudnnCreate(&h));
    return h;
  }
  void Release(int device, cudnnHandle_t h) {
    std::lock_guard<std::mutex> lock(mu_);
    free_[device].push_back(h);
  }

 private:
  std::mutex mu_;
  std::map<int, std::vector<cudnnHandle_t>> free_;
};

// This thread's handles, by (device, stream).
struct ThreadHandles {
  std::map<std::pair<int, cudaStream_t>, cudnnHandle_t> handles;
  ~ThreadHandles() {
    for (auto& [key, h] : handles) HandlePool::Get().Release(key.first, h);
  }
};

}  // namespace

void set_allow_tf32(bool allow) { tf32_allowed.store(allow); }
bool allow_tf32() { return tf32_allowed.load(); }
void set_benchmark(bool on) { benchmark_on.store(on); }
bool benchmark() { return benchmark_on.load(); }
void set_graph_api(bool on) { GraphApiOn().store(on); }
bool graph_api() { return GraphApiOn().load(); }

namespace internal {

bool GraphApiSetting(const char* value) {
  return value != nullptr && std::string_view(value) != "" && std::string_view(value) != "0";
}

cudnnHandle_t Handle(Device device) {
  thread_local ThreadHandles mine;
  const cudaStream_t stream = ::ember::cuda::internal::StreamOf(device);
  const std::pair<int, cudaStream_t> key(device.index(), stream);
  auto it = mine.handles.find(key);
  if (it != mine.handles.end()) return it->second;
  cudnnHandle_t h = HandlePool::Get().Acquire(device.index());
  const cudnnStatus_t set = cudnnSetStream(h, stream);
  if (set != CUDNN_STATUS_SUCCESS) {
    HandlePool::Get().Release(device.index(), h);
    EMBER_CUDA_CHECK(set);
  }
  mine.handles.emplace(key, h);
  return h;
}

cudnnDataType_t DataType(Dtype dtype, const char* op) {
  switch (dtype) {
    case kFloat32:
      return CUDNN_DATA_FLOAT;
    case kFloat64:
      return CUDNN_DATA_DOUBLE;
    case kFloat16:
      return CUDNN_DATA_HALF;
    case kBFloat16:
      return CUDNN_DATA_BFLOAT16;
    default:
      EMBER_FAIL(op, ": expected a float32, float64, float16 or bfloat16 tensor on CUDA, but got ",
                 dtype_name(dtype), "; convert it with .to(ember::kFloat32) first");
  }
}

cudnnDataType_t ComputeType(cudnnDataType_t type) {
  return type == CUDNN_DATA_HALF || type == CUDNN_DATA_BFLOAT16 ? CUDNN_DATA_FLOAT : type;
}

Dtype ParamDtype(Dtype dtype) {
  return dtype == kFloat16 || dtype == kBFloat16 ? kFloat32 : dtype;
}

Tensor Workspace(Device device, size_t nbytes) {
  return EmptyTensor({static_cast<int64_t>(nbytes)}, kUInt8, device);
}

int ToInt(int64_t v, const char* op, const char* what) {
  EMBER_CHECK(v <= INT_MAX, op, ": ", what, " has a dimension or element count of ", v,
              ", more than cuDNN's int dimensions hold (", INT_MAX,
              "); split the batch into smaller ones");
  return static_cast<int>(v);
}

int64_t BatchChunk(int64_t per_sample, const char* op) {
  EMBER_CHECK(per_sample <= INT_MAX, op, ": one sample has ", per_sample,
              " elements, more than cuDNN's int dimensions hold (", INT_MAX,
              "); split it, or run it on the CPU with .to(ember::kCPU)");
  return std::max<int64_t>(INT_MAX / std::max<int64_t>(per_sample, 1), 1);
}

TensorDescriptor::TensorDescriptor() { EMBER_CUDA_CHECK(cudnnCreateTensorDescriptor(&desc_)); }
TensorDescriptor::~TensorDescriptor() { cudnnDestroyTensorDescriptor(desc_); }

void TensorDescriptor::Set(cudnnDataType_t type, const std::vector<int64_t>& dims, const char* op) {
  EMBER_INTERNAL_ASSERT(dims.size() == 4, "TensorDescriptor: expects 4 dims");
  ToInt(dims[0] * dims[1] * dims[2] * dims[3], op, "a tensor");
  EMBER_CUDA_CHECK(
      cudnnSetTensor4dDescriptor(desc_, CUDNN_TENSOR_NCHW, type, ToInt(dims[0], op, "a tensor"),
                                 ToInt(dims[1], op, "a tensor"), ToInt(dims[2], op, "a tensor"),
                                 ToInt(dims[3], op, "a tensor")));
}

FilterDescriptor::FilterDescriptor() { EMBER_CUDA_CHECK(cudnnCreateFilterDescriptor(&desc_)); }
FilterDescriptor::~FilterDescriptor() { cudnnDestroyFilterDescriptor(desc_); }

void FilterDescriptor::Set(cudnnDataType_t type, const std::vector<int64_t>& dims, const char* op) {
  EMBER_INTERNAL_ASSERT(dims.size() == 4, "FilterDescriptor: expects 4 dims");
  ToInt(dims[0] * dims[1] * dims[2] * dims[3], op, "the weight");
  EMBER_CUDA_CHECK(
      cudnnSetFilter4dDescriptor(desc_, type, CUDNN_TENSOR_NCHW, ToInt(dims[0], op, "the weight"),
                                 ToInt(dims[1], op, "the weight"), ToInt(dims[2], op, "the weight"),
                                 ToInt(dims[3], op, "the weight")));
}

ConvolutionDescriptor::ConvolutionDescriptor() {
  EMBER_CUDA_CHECK(cudnnCreateConvolutionDescriptor(&desc_));
}
ConvolutionDescriptor::~ConvolutionDescriptor() { cudnnDestroyConvolutionDescriptor(desc_); }

Scalars::Scalars(cudnnDataType_t type) : type_(type) {}

}  // namespace internal
}  // namespace ember::nn::cudnn
