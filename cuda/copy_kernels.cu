// Device side of copy_out and fill_out (Note [CUDA loops] in loops.cuh): one
// kernel converts between any two dtypes with run-time switches on both, so
// that 100 dtype pairs cost one instantiation; same-dtype copies and fills
// move raw elements of 1, 2, 4 or 8 bytes, in 16-byte vectors where they can.
#include "cuda/loops.cuh"

namespace ember::cuda::kernels {
namespace {

// An element on its way between dtypes: integers and bools as int64 (exact),
// floats as double (exact for every float type).
struct Value {
  bool is_int;
  int64_t i;
  double f;
};

__device__ __forceinline__ Value Load(const char* p, int dtype) {
  switch (dtype) {
    case kF32:
      return {false, 0, static_cast<double>(*reinterpret_cast<const float*>(p))};
    case kF64:
      return {false, 0, *reinterpret_cast<const double*>(p)};
    case kF16:
      return {false, 0, static_cast<double>(__half2float(*reinterpret_cast<const __half*>(p)))};
    case kBF16:
      return {false, 0,
              static_cast<double>(__bfloat162float(*reinterpret_cast<const __nv_bfloat16*>(p)))};
    case kI64:
      return {true, *reinterpret_cast<const int64_t*>(p), 0};
    case kI32:
      return {true, *reinterpret_cast<const int32_t*>(p), 0};
    case kI16:
      return {true, *reinterpret_cast<const int16_t*>(p), 0};
    case kI8:
      return {true, *reinterpret_cast<const int8_t*>(p), 0};
    case kU8:
      return {true, *reinterpret_cast<const uint8_t*>(p), 0};
    default:
      return {true, *reinterpret_cast<const bool*>(p) ? 1 : 0, 0};
  }
}

template <typename D>
__device__ __forceinline__ D As(const Value& v) {
  return v.is_int ? static_cast<D>(v.i) : static_cast<D>(v.f);
}

__device__ __forceinline__ void Store(char* p, int dtype, const Value& v) {
  switch (dtype) {
    case kF32:
      *reinterpret_cast<float*>(p) = As<float>(v);
      return;
    case kF64:
      *reinterpret_cast<double*>(p) = As<double>(v);
      return;
    case kF16:
      *reinterpret_cast<__half*>(p) = __float2half_rn(As<float>(v));
      return;
    case kBF16:
      *reinterpret_cast<__nv_bfloat16*>(p) = __float2bfloat16_rn(As<float>(v));
      return;
    // Floats to narrow integers go through int64, as ember::CastTo's
    // static_cast does for values in range.
    case kI64:
      *reinterpret_cast<int64_t*>(p) = As<int64_t>(v);
      return;
    case kI32:
      *reinterpret_cast<int32_t*>(p) = static_cast<int32_t>(As<int64_t>(v));
      return;
    case kI16:
      *reinterpret_cast<int16_t*>(p) = static_cast<int16_t>(As<int64_t>(v));
      return;
    case kI8:
      *reinterpret_cast<int8_t*>(p) = static_cast<int8_t>(As<int64_t>(v));
      return;
    case kU8:
      *reinterpret_cast<uint8_t*>(p) = static_cast<uint8_t>(As<int64_t>(v));
      return;
    default:
      *reinterpret_cast<bool*>(p) = v.is_int ? v.i != 0 : v.f != 0.0;
      return;
  }
}

struct ConvertBody {
  char* out;
  const char* src;
  int out_dtype;
  int src_dtype;
  __device__ void operator()(const int64_t (&off)[2]) {
    Store(out + off[0], out_dtype, Load(src + off[1], src_dtype));
  }
};

// Between dtypes: the scalar path (Note [CUDA loops]).
__global__ void ConvertKernel(Geometry<2> g, ConvertBody body) { ForEachElement<2>(g, body); }

// Raw elements of one width: ForEachValue (the vector path where it applies).
template <typename W>
struct RawOf {
  __device__ W operator()(W x) const { return x; }
};

template <typename W>
__global__ void RawCopyKernel(Geometry<2> g, char* out, const char* src) {
  ForEachValue(g, RawOf<W>{}, reinterpret_cast<W*>(out), reinterpret_cast<const W*>(src));
}

template <typename W>
struct FillOf {
  W value;
  __device__ W operator()() const { return value; }
};

template <typename W>
__global__ void FillKernel(Geometry<1> g, FillOf<W> f, char* out) {
  ForEachValue(g, f, reinterpret_cast<W*>(out));
}

// Calls f.template operator()<W>() with W an unsigned type of `bytes` bytes.
template <typename F>
void VisitWidth(int64_t bytes, F&& f) {
  switch (bytes) {
    case 8:
      return f.template operator()<uint64_t>();
    case 4:
      return f.template operator()<uint32_t>();
    case 2:
      return f.template operator()<uint16_t>();
    default:
      return f.template operator()<uint8_t>();
  }
}

}  // namespace

cudaError_t LaunchCopy(cudaStream_t stream, const Geometry<2>& g, char* out, int out_dtype,
                       const char* src, int src_dtype) {
  if (g.numel == 0) return cudaSuccess;
  if (out_dtype == src_dtype) {
    VisitWidth(ElementSize(out_dtype), [&]<typename W>() {
      const unsigned grid =
          GridForValues(g, reinterpret_cast<const W*>(out), reinterpret_cast<const W*>(src));
      RawCopyKernel<W><<<grid, kThreads, 0, stream>>>(g, out, src);
    });
  } else {
    ConvertKernel<<<GridFor(g.numel), kThreads, 0, stream>>>(
        g, ConvertBody{out, src, out_dtype, src_dtype});
  }
  return cudaGetLastError();
}

cudaError_t LaunchFill(cudaStream_t stream, const Geometry<1>& g, char* out, int out_dtype,
                       ScalarBits value) {
  if (g.numel == 0) return cudaSuccess;
  VisitWidth(ElementSize(out_dtype), [&]<typename W>() {
    const W v = static_cast<W>(value.bits);  // The value's bytes (little-endian).
    const unsigned grid = GridForValues(g, reinterpret_cast<const W*>(out));
    FillKernel<W><<<grid, kThreads, 0, stream>>>(g, FillOf<W>{v}, out);
  });
  return cudaGetLastError();
}

}  // namespace ember::cuda::kernels
