// CUDA kernel of index_select_out: the host side of indexing_kernels.cu. The
// index values are data on the device, so they are checked there first; the
// first bad one is read back and reported as the CPU kernel does ("index 7 is
// out of bounds for dimension 0 with size 3"), which costs one
// synchronisation of the current stream.
#include <vector>

#include "cuda/kernels.h"
#include "tensor/device_guard.h"

namespace ember::cuda {
namespace {

using internal::CheckLaunch;
using internal::DtypeCode;
using internal::StreamOf;

void IndexSelectOut(const Tensor& out, const Tensor& self, int64_t dim, const Tensor& index) {
  EMBER_CHECK(index.dtype() == kInt64 || index.dtype() == kInt32,
              "index_select: expected an int64 or int32 index, got dtype ",
              dtype_name(index.dtype()));
  internal::CheckSameDevice("index_select", {&out, &self, &index});
  DeviceGuard guard(out.device());
  cudaStream_t stream = StreamOf(out.device());
  const int64_t n = index.numel();
  const int64_t size = self.dim() == 0 ? 1 : self.sizes()[dim];
  const int64_t index_stride = index.dim() == 0 ? 0 : index.strides()[0];
  const char* index_ptr = static_cast<const char*>(index.raw_data());
  if (n > 0) {
    Tensor first_bad = EmptyTensor({1}, kInt64, out.device());
    CheckLaunch(kernels::LaunchIndexCheck(stream, index_ptr, DtypeCode(index.dtype()), n,
                                          index_stride, size, first_bad.data_ptr<int64_t>()),
                "index_select check kernel");
    int64_t bad = 0;
    EMBER_CUDA_CHECK(
        cudaMemcpyAsync(&bad, first_bad.raw_data(), sizeof(bad), cudaMemcpyDeviceToHost, stream));
    EMBER_CUDA_CHECK(cudaStreamSynchronize(stream));
    if (bad >= 0 && bad < n) {
      int64_t value = 0;
      if (index.dtype() == kInt64) {
        EMBER_CUDA_CHECK(cudaMemcpy(&value, index.data_ptr<int64_t>() + bad * index_stride,
                                    sizeof(value), cudaMemcpyDeviceToHost));
      } else {
        int32_t v32 = 0;
        EMBER_CUDA_CHECK(cudaMemcpy(&v32, index.data_ptr<int32_t>() + bad * index_stride,
                                    sizeof(v32), cudaMemcpyDeviceToHost));
        value = v32;
      }
      EMBER_FAIL("index_select: index ", value, " is out of bounds for dimension ", dim,
                 " with size ", size);
    }
  }
  if (out.numel() == 0) return;
  if (self.dim() == 0) {
    ops::copy_out(out, self);
    return;
  }
  // Operands: out, self with stride 0 along `dim`, and the position along
  // `dim` (stride 1 there, element size 1), which selects the index entry.
  SizeVector self_strides(self.strides().begin(), self.strides().end());
  self_strides[dim] = 0;
  SizeVector position(out.dim(), 0);
  position[dim] = 1;
  const int64_t es = static_cast<int64_t>(self.element_size());
  const auto g = internal::GeometryOf<3>("index_select", out.sizes(),
                                         {out.strides(), self_strides, position}, {es, es, 1});
  CheckLaunch(
      kernels::LaunchIndexSelect(stream, g, static_cast<char*>(out.raw_data()),
                                 static_cast<const char*>(self.raw_data()), es, index_ptr,
                                 DtypeCode(index.dtype()), index_stride, self.strides()[dim] * es),
      "index_select kernel");
}

EMBER_REGISTER_KERNEL(index_select_out, kCUDA, &IndexSelectOut);

}  // namespace
}  // namespace ember::cuda
