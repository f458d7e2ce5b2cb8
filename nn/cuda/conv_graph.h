// conv2d's three directions through cuDNN's graph ("backend") API, the path
// nn/cuda/conv.cc takes under set_graph_api(true) (Note [cuDNN graph API] in
// conv_graph.cc): an execution plan built once per shape and cached, so a
// call only packs its pointers and executes.
//
// Thread-safety: thread-safe.
#ifndef EMBER_NN_CUDA_CONV_GRAPH_H_
#define EMBER_NN_CUDA_CONV_GRAPH_H_

#include <cudnn.h>

#include <cstdint>
#include <string>
#include <vector>

#include "nn/conv_kernels.h"
#include "nn/cuda/conv_graph_plan.h"
#include "nn/cuda/cudnn_graph.h"
#include "tensor/device.h"
#include "tensor/tensor.h"

namespace ember::nn::cudnn::internal {

// One convolution without empty dimensions, of contiguous NCHW tensors
// x [N, C, H, W], w [O, C/g, kh, kw] and y [N, O, OH, OW] (`y_sizes`), on
// `device` (current) and the stream of `handle` (Handle(device)), in
// `dtype`: for kForward y = conv(x, w), for kInputGrad x = the gradient of
// the input from y (the output's gradient) and w, for kWeightGrad w = the
// gradient of the weight from x and y, added to what w holds when
// `accumulate` (cuDNN's beta = 1). Runs it through the cached execution plan
// of its shape and returns true, or returns false, having run nothing, when
// the graph API has no plan for it (cached too): the caller then takes the
// legacy path. Throws when cuDNN fails to execute a plan it built.
bool GraphConvolution(ConvDirection direction, cudnnHandle_t handle, Device device, Dtype dtype,
                      const std::vector<int64_t>& x_sizes, const std::vector<int64_t>& w_sizes,
                      const std::vector<int64_t>& y_sizes,
                      const ::ember::nn::internal::ConvParams& p, void* x, void* w, void* y,
                      bool accumulate);

// What conv2d's plan cache holds (for tests and diagnostics): shapes with a
// plan, shapes left to the legacy path, and why the last of those was.
GraphPlanStats GraphStats();

}  // namespace ember::nn::cudnn::internal

#endif  // EMBER_NN_CUDA_CONV_GRAPH_H_
