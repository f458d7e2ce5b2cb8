#include "tensor/dtype.h"

#include "tensor/error.h"

namespace ember {
namespace {

// Index order of the promotion table below.
enum : int { f4, f8, f2, bf, i8, i4, i2, i1, u1, b1 };

// torch.promote_types for every pair, in Dtype enum order. uint8 with a
// signed integer type gives the next wider signed type; float16 with bfloat16
// gives float32.
constexpr int kPromote[kNumDtypes][kNumDtypes] = {
    /*        f4  f8  f2  bf  i8  i4  i2  i1  u1  b1 */
    /* f4 */ {f4, f8, f4, f4, f4, f4, f4, f4, f4, f4},
    /* f8 */ {f8, f8, f8, f8, f8, f8, f8, f8, f8, f8},
    /* f2 */ {f4, f8, f2, f4, f2, f2, f2, f2, f2, f2},
    /* bf */ {f4, f8, f4, bf, bf, bf, bf, bf, bf, bf},
    /* i8 */ {f4, f8, f2, bf, i8, i8, i8, i8, i8, i8},
    /* i4 */ {f4, f8, f2, bf, i8, i4, i4, i4, i4, i4},
    /* i2 */ {f4, f8, f2, bf, i8, i4, i2, i2, i2, i2},
    /* i1 */ {f4, f8, f2, bf, i8, i4, i2, i1, i2, i1},
    /* u1 */ {f4, f8, f2, bf, i8, i4, i2, i2, u1, u1},
    /* b1 */ {f4, f8, f2, bf, i8, i4, i2, i1, u1, b1},
};

int Category(Dtype d) {
  if (d == kBool) return 0;
  if (is_integral(d)) return 1;
  return 2;
}

// Combines a lower-priority slot into the running result: it only matters
// when its category is higher.
int Combine(int result, int lower) {
  if (lower < 0) return result;
  if (result < 0) return lower;
  Dtype r = static_cast<Dtype>(result), l = static_cast<Dtype>(lower);
  if (Category(l) > Category(r)) return static_cast<int>(promote_types(r, l));
  return result;
}

}  // namespace

size_t element_size(Dtype dtype) {
  switch (dtype) {
    case kFloat64:
    case kInt64: return 8;
    case kFloat32:
    case kInt32: return 4;
    case kFloat16:
    case kBFloat16:
    case kInt16: return 2;
    case kInt8:
    case kUInt8:
    case kBool: return 1;
  }
  internal::ThrowUnsupportedDtype("ElementSize", dtype);
}

std::string_view dtype_name(Dtype dtype) {
  switch (dtype) {
    case kFloat32: return "float32";
    case kFloat64: return "float64";
    case kFloat16: return "float16";
    case kBFloat16: return "bfloat16";
    case kInt64: return "int64";
    case kInt32: return "int32";
    case kInt16: return "int16";
    case kInt8: return "int8";
    case kUInt8: return "uint8";
    case kBool: return "bool";
  }
  return "invalid";
}

std::ostream& operator<<(std::ostream& os, Dtype dtype) {
  return os << dtype_name(dtype);
}

bool is_floating_point(Dtype dtype) {
  return dtype == kFloat32 || dtype == kFloat64 || dtype == kFloat16 ||
         dtype == kBFloat16;
}

bool is_integral(Dtype dtype, bool include_bool) {
  switch (dtype) {
    case kInt64:
    case kInt32:
    case kInt16:
    case kInt8:
    case kUInt8: return true;
    case kBool: return include_bool;
    default: return false;
  }
}

Dtype promote_types(Dtype a, Dtype b) {
  return static_cast<Dtype>(kPromote[static_cast<int>(a)][static_cast<int>(b)]);
}

void ResultTypeState::AddTensor(Dtype dtype, bool zero_dim) {
  int& slot = zero_dim ? zero_dim_ : dim_;
  slot = slot < 0 ? static_cast<int>(dtype)
                  : static_cast<int>(promote_types(static_cast<Dtype>(slot), dtype));
}

void ResultTypeState::AddScalar(Dtype category) {
  // Plain numbers stand for the default type of their category.
  Dtype d = is_floating_point(category) ? kDefaultFloatDtype
            : category == kBool       ? kBool
                                      : kInt64;
  wrapped_ = wrapped_ < 0 ? static_cast<int>(d)
                          : static_cast<int>(promote_types(static_cast<Dtype>(wrapped_), d));
}

Dtype ResultTypeState::Result() const {
  int r = Combine(Combine(dim_, zero_dim_), wrapped_);
  EMBER_INTERNAL_ASSERT(r >= 0, "result_type of no operands");
  return static_cast<Dtype>(r);
}

namespace internal {
void ThrowUnsupportedDtype(const char* op, Dtype dtype) {
  EMBER_FAIL(op, ": unsupported dtype ", dtype_name(dtype));
}
}  // namespace internal

}  // namespace ember
