// cuDNN behind nn's CUDA kernels of conv2d and batch_norm (nn/cuda/conv.cc,
// nn/cuda/batch_norm.cc), and torch.backends.cudnn's switch for TF32.
//
//   ember::nn::cudnn::set_allow_tf32(false);  // float32 convolutions in full float32
//   ember::nn::cudnn::set_benchmark(true);    // time the algorithms of each new shape
//   ember::nn::cudnn::set_graph_api(true);    // convolutions through cached graph-API plans
//
// Note [cuDNN handles and workspaces]
// A cudnnHandle_t is bound to a device and a stream and may be used by one
// thread at a time, so each thread keeps one handle per (device, stream) it
// ran on, created on first use with the stream set once (every device's
// default stream is the same null cudaStream_t, so the stream alone does not
// tell devices apart). A thread's handles go back to a per-device pool when
// the thread exits, for the next thread to reuse with its own stream.
// Workspaces come from Ember's caching allocator on the current stream (the
// one the cuDNN call is queued on), so freeing one after the call is safe and
// costs no cudaMalloc. The cuDNN calls run with the tensors' device current
// (the callers hold a DeviceGuard) on that device's current stream.
//
// TF32: as torch.backends.cudnn.allow_tf32, float32 convolutions may use the
// tensor cores' TF32 (about 10 bits of mantissa in the products) unless
// set_allow_tf32(false); float64 never does. The setting is read when an
// algorithm is chosen and is part of the algorithm cache's key.
//
// Thread-safety: thread-safe.
#ifndef EMBER_NN_CUDA_CUDNN_H_
#define EMBER_NN_CUDA_CUDNN_H_

#include <cudnn.h>

#include <cstdint>
#include <vector>

#include "tensor/device.h"
#include "tensor/tensor.h"

namespace ember::nn::cudnn {

// torch.backends.cudnn.allow_tf32 (default true, as in torch).
void set_allow_tf32(bool allow);
bool allow_tf32();

// torch.backends.cudnn.benchmark (default false, as in torch): when set, a
// convolution shape's first call times cuDNN's algorithms on it
// (cudnnFind*AlgorithmEx) and keeps the fastest, instead of taking the
// heuristics' first (Note [cuDNN convolution algorithms] in conv.cc).
void set_benchmark(bool on);
bool benchmark();

// Whether conv2d runs through cuDNN's graph ("backend") API: execution plans
// built once per shape and cached, so a call costs the host only a variant
// pack and cudnnBackendExecute (Note [cuDNN graph API] in conv_graph.cc).
// Off by default, or as the environment variable EMBER_CUDNN_GRAPH_API says
// when the switch is first read (unset, empty or 0: off; anything else: on). A shape the graph
// API builds no plan for runs on the legacy path; under set_benchmark(true)
// every convolution does (the legacy path's cudnnFind* times the
// algorithms).
void set_graph_api(bool on);
bool graph_api();

namespace internal {

// set_graph_api's initial value for EMBER_CUDNN_GRAPH_API's `value` (null
// when unset): false for null, "" and "0", true otherwise.
bool GraphApiSetting(const char* value);

// The calling thread's handle for `device` (which must be current), bound to
// its current stream (Note [cuDNN handles and workspaces]).
cudnnHandle_t Handle(Device device);

// cuDNN's data type for float32 / float64 / float16 / bfloat16; throws for
// other dtypes, naming `op`.
cudnnDataType_t DataType(Dtype dtype, const char* op);

// The type a convolution of `type` data accumulates in: float for float16
// and bfloat16 (as torch sets it), the data's own type otherwise.
cudnnDataType_t ComputeType(cudnnDataType_t type);

// The dtype of batch normalisation's scale, bias and statistics for an input
// of `dtype`: float32 for float16 and bfloat16 inputs (cuDNN's derived
// descriptor), the input's own dtype otherwise.
Dtype ParamDtype(Dtype dtype);

// `nbytes` of scratch memory on `device`'s current stream (an empty tensor
// for 0 bytes).
Tensor Workspace(Device device, size_t nbytes);

// Throws unless `v` fits cuDNN's int dimensions, naming `op` and `what`.
int ToInt(int64_t v, const char* op, const char* what);

// How many samples of `per_sample` elements one cuDNN call takes (its int
// dimensions hold INT_MAX elements; Note [cuDNN batch chunks] in conv.cc); at
// least 1. Throws, naming `op`, when one sample alone is too large.
int64_t BatchChunk(int64_t per_sample, const char* op);

// Owners of cuDNN descriptors (destroyed with the object).
class TensorDescriptor {
 public:
  TensorDescriptor();
  ~TensorDescriptor();
  TensorDescriptor(const TensorDescriptor&) = delete;
  TensorDescriptor& operator=(const TensorDescriptor&) = delete;
  // A contiguous NCHW tensor of `dims` (4 values).
  void Set(cudnnDataType_t type, const std::vector<int64_t>& dims, const char* op);
  cudnnTensorDescriptor_t get() const { return desc_; }

 private:
  cudnnTensorDescriptor_t desc_ = nullptr;
};

class FilterDescriptor {
 public:
  FilterDescriptor();
  ~FilterDescriptor();
  FilterDescriptor(const FilterDescriptor&) = delete;
  FilterDescriptor& operator=(const FilterDescriptor&) = delete;
  // A contiguous [O, C / groups, kh, kw] filter.
  void Set(cudnnDataType_t type, const std::vector<int64_t>& dims, const char* op);
  cudnnFilterDescriptor_t get() const { return desc_; }

 private:
  cudnnFilterDescriptor_t desc_ = nullptr;
};

class ConvolutionDescriptor {
 public:
  ConvolutionDescriptor();
  ~ConvolutionDescriptor();
  ConvolutionDescriptor(const ConvolutionDescriptor&) = delete;
  ConvolutionDescriptor& operator=(const ConvolutionDescriptor&) = delete;
  cudnnConvolutionDescriptor_t get() const { return desc_; }

 private:
  cudnnConvolutionDescriptor_t desc_ = nullptr;
};

// 1 and 0 as cuDNN's scaling factors for `type` (double for float64 data,
// float otherwise, float16 and bfloat16 included).
struct Scalars {
  explicit Scalars(cudnnDataType_t type);
  const void* one() const {
    return type_ == CUDNN_DATA_DOUBLE ? static_cast<const void*>(&d1_) : &f1_;
  }
  const void* zero() const {
    return type_ == CUDNN_DATA_DOUBLE ? static_cast<const void*>(&d0_) : &f0_;
  }

 private:
  cudnnDataType_t type_;
  float f1_ = 1, f0_ = 0;
  double d1_ = 1, d0_ = 0;
};

}  // namespace internal
}  // namespace ember::nn::cudnn

#endif  // EMBER_NN_CUDA_CUDNN_H_
