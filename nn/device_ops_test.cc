// The every-op harness (Note [Device ops harness]): every op with a
// derivative (tensor/ops.inc's autograd kernels, autograd/derivatives.cc) and
// nn's functional layers, run forward and backward in float64 on the CPU and
// on cuda:0 from the same inputs, compared element by element, and checked by
// gradcheck on each side.
//
// Note [Device ops harness]
// Each Case names the derivative it covers (`op`): "mm", "unary:kExp",
// "binary_:kMul", "reduce:kAmax", ... or "nn:conv2d". The completeness test
// walks tensor/ops.inc and, for every op whose autograd kernel is registered,
// requires a Case for it (for unary/unary_, binary/binary_ and reduce, one
// per op kind of tensor/op_kinds.h), and a Case for every nn layer listed in
// kLayers; a Case whose op is no registered derivative fails too. So a new
// derivative without an entry here fails this test on the CPU, with or
// without a GPU. Kinds whose results are bool or integer (comparisons,
// logical ops, argmax/argmin) have forward-only entries: their outputs never
// require grad, and gradcheck confirms that through finite differences.
//
// Per Case, the CPU side (always): forward and a weighted backward, and
// gradcheck. The CUDA side (skips without a device, saying why): the same
// on cuda:0, each forward output and each input gradient against the CPU's
// within 1e-9 relative, then gradcheck on the device. Inputs are
// deterministic and kept away from kinks, ties and domain edges.
#include <cmath>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/gradcheck.h"
#include "cuda/device.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/activation.h"
#include "nn/conv.h"
#include "nn/dropout.h"
#include "nn/embedding.h"
#include "nn/linear.h"
#include "nn/loss.h"
#include "nn/normalization.h"
#include "nn/pooling.h"
#include "tensor/device_guard.h"
#include "tensor/op_kinds.h"
#include "tensor/ops.h"
#include "tensor/testing.h"

namespace ember::autograd {
namespace {

using ::ember::testing::Make;
using ::ember::testing::Values;

const Device kCuda0(DeviceType::kCUDA, 0);

// The nn layers the harness must cover (Note [Device ops harness]).
const std::vector<std::string> kLayers = {
    "nn:conv2d",
    "nn:conv2d_input",
    "nn:conv2d_weight",
    "nn:batch_norm",
    "nn:layer_norm",
    "nn:max_pool2d",
    "nn:avg_pool2d",
    "nn:adaptive_avg_pool2d",
    "nn:embedding",
    "nn:dropout",
    "nn:relu",
    "nn:gelu",
    "nn:tanh",
    "nn:sigmoid",
    "nn:cross_entropy",
    "nn:nll_loss",
    "nn:mse_loss",
    "nn:l1_loss",
    "nn:binary_cross_entropy_with_logits",
    "nn:linear",
};

// --- Inputs --------------------------------------------------------------------------

// Deterministic float64 values in (lo, hi), well spread (a golden-ratio
// sequence), none exactly at an integer or half-integer for the ranges used.
Tensor Sample(SizeVector shape, double lo, double hi, int salt = 0) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  std::vector<double> v(n);
  for (int64_t i = 0; i < n; ++i) {
    double f = std::fmod(0.6180339887498949 * (i + 1 + 37 * salt) + 0.1234567, 1.0);
    v[i] = lo + (hi - lo) * (0.02 + 0.96 * f);
  }
  return Make(v, std::move(shape), kFloat64);
}
Tensor General(SizeVector shape, int salt = 0) { return Sample(std::move(shape), -1.9, 1.9, salt); }
Tensor Positive(SizeVector shape, int salt = 0) { return Sample(std::move(shape), 0.3, 2.5, salt); }
Tensor Indices(const std::vector<double>& v) {
  return Make(v, {static_cast<int64_t>(v.size())}, kInt64);
}

struct Input {
  Tensor value;  // on the CPU
  bool grad;     // a leaf that requires grad
};
Input G(Tensor t) { return {std::move(t), true}; }   // differentiated
Input C(Tensor t) { return {std::move(t), false}; }  // constant (masks, indices, targets)

using Fn = std::function<variable_list(const variable_list&)>;

struct Case {
  std::string op;    // the derivative covered (Note [Device ops harness])
  std::string name;  // unique, for the test name
  std::vector<Input> inputs;
  Fn fn;
  GradcheckOptions options = {};
  // False where the gradient is by definition not the derivative (an
  // embedding's padding row): compared CPU against device only.
  bool gradcheck = true;
};

// --- The table ---------------------------------------------------------------------

#define EMBER_KIND_NAME(k) #k,
const std::vector<std::string> kUnaryNames = {EMBER_UNARY_OPS(EMBER_KIND_NAME)};
const std::vector<std::string> kBinaryNames = {EMBER_BINARY_OPS(EMBER_KIND_NAME)};
const std::vector<std::string> kReduceNames = {EMBER_REDUCE_OPS(EMBER_KIND_NAME)};
#undef EMBER_KIND_NAME

bool UnaryIsDifferentiable(UnaryOp op) { return op != UnaryOp::kLogicalNot; }
bool BinaryIsDifferentiable(BinaryOp op) {
  switch (op) {
    case BinaryOp::kAdd:
    case BinaryOp::kSub:
    case BinaryOp::kMul:
    case BinaryOp::kDiv:
    case BinaryOp::kPow:
    case BinaryOp::kMaximum:
    case BinaryOp::kMinimum:
      return true;
    default:
      return false;
  }
}
bool ReduceIsDifferentiable(ReduceOp op) {
  return op != ReduceOp::kArgmax && op != ReduceOp::kArgmin;
}

// The unary op's input: inside its domain, away from its kinks.
Tensor UnaryInput(UnaryOp op) {
  switch (op) {
    case UnaryOp::kLog:
    case UnaryOp::kLog1p:
    case UnaryOp::kLog2:
    case UnaryOp::kSqrt:
    case UnaryOp::kRsqrt:
    case UnaryOp::kReciprocal:
      return Positive({3, 4});
    case UnaryOp::kTan:
      return Sample({3, 4}, -1.2, 1.2);
    default:
      return General({3, 4});
  }
}

void AddElementwise(std::vector<Case>& cases) {
  for (size_t k = 0; k < kUnaryNames.size(); ++k) {
    const auto op = static_cast<UnaryOp>(k);
    const bool d = UnaryIsDifferentiable(op);
    const Tensor x = UnaryInput(op);
    cases.push_back(
        {"unary:" + kUnaryNames[k],
         "unary_" + kUnaryNames[k],
         {{x, d}},
         [op](const variable_list& in) { return variable_list{ops::unary(op, in[0])}; }});
    // In place on a non-leaf (a leaf that requires grad refuses it).
    cases.push_back({"unary_:" + kUnaryNames[k],
                     "unary_inplace_" + kUnaryNames[k],
                     {{x, d}},
                     [op](const variable_list& in) {
                       Tensor y = in[0].mul(1.0);
                       return variable_list{ops::unary_(op, y)};
                     }});
  }
  for (size_t k = 0; k < kBinaryNames.size(); ++k) {
    const auto op = static_cast<BinaryOp>(k);
    const bool d = BinaryIsDifferentiable(op);
    // other broadcasts along dim 0: the engine sums its gradient back.
    Tensor a = op == BinaryOp::kPow ? Positive({3, 4}) : General({3, 4});
    Tensor b = op == BinaryOp::kPow   ? Sample({4}, -1.5, 1.5, 1)
               : op == BinaryOp::kDiv ? Positive({4}, 1)
                                      : General({4}, 1);
    cases.push_back(
        {"binary:" + kBinaryNames[k],
         "binary_" + kBinaryNames[k],
         {{a, d}, {b, d}},
         [op](const variable_list& in) { return variable_list{ops::binary(op, in[0], in[1])}; }});
    cases.push_back({"binary_:" + kBinaryNames[k],
                     "binary_inplace_" + kBinaryNames[k],
                     {{a, d}, {b, d}},
                     [op](const variable_list& in) {
                       Tensor y = in[0].mul(1.0);
                       return variable_list{ops::binary_(op, y, in[1])};
                     }});
  }
  // Both operands the same tensor: x.mul_(x) reads the old x.
  cases.push_back({"binary_:kMul",
                   "binary_inplace_kMul_aliased",
                   {G(General({5}))},
                   [](const variable_list& in) {
                     Tensor y = in[0].mul(1.0);
                     return variable_list{y.mul_(y)};
                   }});
  for (size_t k = 0; k < kReduceNames.size(); ++k) {
    const auto op = static_cast<ReduceOp>(k);
    const bool d = ReduceIsDifferentiable(op);
    if (!d) {
      // reduce refuses the index kinds; argmax/argmin reach them.
      const bool is_max = op == ReduceOp::kArgmax;
      cases.push_back({"reduce:" + kReduceNames[k],
                       "reduce_" + kReduceNames[k] + "_dim1",
                       {C(General({3, 4}))},
                       [is_max](const variable_list& in) {
                         return variable_list{is_max ? in[0].argmax(1) : in[0].argmin(1)};
                       }});
      continue;
    }
    cases.push_back({"reduce:" + kReduceNames[k],
                     "reduce_" + kReduceNames[k] + "_dim1",
                     {G(General({3, 4}))},
                     [op](const variable_list& in) {
                       return variable_list{ops::reduce(op, in[0], {1}, false, std::nullopt)};
                     }});
    cases.push_back({"reduce:" + kReduceNames[k],
                     "reduce_" + kReduceNames[k] + "_all_keepdim",
                     {G(General({2, 3}))},
                     [op](const variable_list& in) {
                       return variable_list{ops::reduce(op, in[0], {0, 1}, true, std::nullopt)};
                     }});
  }
}

void AddViews(std::vector<Case>& cases) {
  auto unary_case = [&](std::string op, std::string name, Tensor x,
                        std::function<Tensor(const Tensor&)> f) {
    cases.push_back(
        {std::move(op), std::move(name), {G(std::move(x))}, [f](const variable_list& in) {
           return variable_list{f(in[0])};
         }});
  };
  unary_case("view", "view", General({3, 4}), [](const Tensor& t) { return t.view({2, 6}); });
  unary_case("as_strided", "as_strided_overlapping", General({4, 6}), [](const Tensor& t) {
    return t.as_strided({3, 4}, {2, 1}, 1);
  });
  unary_case("transpose", "transpose", General({3, 4}),
             [](const Tensor& t) { return t.transpose(0, 1); });
  unary_case("permute", "permute", General({2, 3, 4}), [](const Tensor& t) {
    return t.permute({2, 0, 1});
  });
  unary_case("slice", "slice", General({3, 5}), [](const Tensor& t) { return t.slice(1, 1, 4); });
  unary_case("slice", "slice_stepped", General({3, 6}),
             [](const Tensor& t) { return t.slice(1, 0, 6, 2); });
  unary_case("select", "select", General({3, 4}), [](const Tensor& t) { return t.select(1, 2); });
  unary_case("expand", "expand", General({3, 1}), [](const Tensor& t) { return t.expand({3, 4}); });
  unary_case("squeeze", "squeeze_dim", General({3, 1, 4}),
             [](const Tensor& t) { return t.squeeze(1); });
  unary_case("squeeze", "squeeze_all", General({1, 3, 1}),
             [](const Tensor& t) { return t.squeeze(); });
  unary_case("unsqueeze", "unsqueeze", General({3, 4}),
             [](const Tensor& t) { return t.unsqueeze(1); });
  // A view written in place: the base's history is rewritten (CopySlices).
  unary_case("as_strided", "view_written_in_place", General({3, 4}), [](const Tensor& t) {
    Tensor y = t.mul(1.0);
    y.slice(0, 1, 3).mul_(3.0);
    return y;
  });
}

void AddOthers(std::vector<Case>& cases) {
  const Tensor mask = General({3, 4}, 5).gt(0.2);
  cases.push_back(
      {"copy_", "copy_", {G(General({3, 4})), G(General({3, 4}, 1))}, [](const variable_list& in) {
         Tensor y = in[0].mul(1.0);
         y.copy_(in[1]);
         return variable_list{y};
       }});
  cases.push_back({"copy_",
                   "copy_into_slice",
                   {G(General({3, 4})), G(General({3, 2}, 1))},
                   [](const variable_list& in) {
                     Tensor y = in[0].mul(1.0);
                     y.slice(1, 1, 3).copy_(in[1]);
                     return variable_list{y};
                   }});
  cases.push_back({"fill_", "fill_slice", {G(General({3, 4}))}, [](const variable_list& in) {
                     Tensor y = in[0].mul(2.0);
                     y.slice(1, 1, 3).fill_(0.25);
                     return variable_list{y};
                   }});
  cases.push_back(
      {"where",
       "where",
       {G(General({3, 4})), G(General({4}, 1)), C(mask)},
       [](const variable_list& in) { return variable_list{where(in[2], in[0], in[1])}; }});
  cases.push_back({"clamp", "clamp", {G(General({3, 4}))}, [](const variable_list& in) {
                     return variable_list{in[0].clamp(-0.61, 0.73)};
                   }});
  cases.push_back({"clamp", "clamp_min_only", {G(General({3, 4}))}, [](const variable_list& in) {
                     return variable_list{in[0].clamp(0.11, std::nullopt)};
                   }});
  cases.push_back({"clamp_", "clamp_", {G(General({3, 4}))}, [](const variable_list& in) {
                     Tensor y = in[0].mul(1.0);
                     return variable_list{y.clamp_(std::nullopt, 0.37)};
                   }});
  cases.push_back(
      {"masked_fill_", "masked_fill_", {G(General({3, 4})), C(mask)}, [](const variable_list& in) {
         Tensor y = in[0].mul(1.0);
         return variable_list{y.masked_fill_(in[1], 0.5)};
       }});
  cases.push_back(
      {"masked_select",
       "masked_select",
       {G(General({3, 4})), C(mask)},
       [](const variable_list& in) { return variable_list{in[0].masked_select(in[1])}; }});
  cases.push_back(
      {"index_select",
       "index_select_repeats",
       {G(General({3, 4})), C(Indices({3, 0, 3, 1, 3}))},
       [](const variable_list& in) { return variable_list{in[0].index_select(1, in[1])}; }});
  cases.push_back(
      {"cat", "cat_dim1", {G(General({3, 4})), G(General({3, 2}, 1))}, [](const variable_list& in) {
         return variable_list{cat({in[0], in[1]}, 1)};
       }});
  cases.push_back(
      {"cat", "cat_dim0", {G(General({1, 4})), G(General({2, 4}, 1))}, [](const variable_list& in) {
         return variable_list{cat({in[0], in[1]}, 0)};
       }});
  cases.push_back({"std", "std_dim1", {G(General({3, 4}))}, [](const variable_list& in) {
                     return variable_list{in[0].std({1})};
                   }});
  cases.push_back({"std", "std_all_correction0", {G(General({3, 4}))}, [](const variable_list& in) {
                     return variable_list{in[0].std({}, 0, true)};
                   }});
  cases.push_back({"norm", "norm_2_dim1", {G(General({3, 4}))}, [](const variable_list& in) {
                     return variable_list{in[0].norm(2, {1})};
                   }});
  cases.push_back({"norm", "norm_1_all", {G(General({3, 4}))}, [](const variable_list& in) {
                     return variable_list{in[0].norm(1)};
                   }});
  cases.push_back(
      {"norm", "norm_3_dim0_keepdim", {G(General({3, 4}))}, [](const variable_list& in) {
         return variable_list{in[0].norm(3, {0}, true)};
       }});
  cases.push_back({"max_dim", "max_dim", {G(General({3, 4}))}, [](const variable_list& in) {
                     MinMaxResult r = in[0].max(1);
                     return variable_list{r.values, r.indices};
                   }});
  cases.push_back({"min_dim", "min_dim_keepdim", {G(General({3, 4}))}, [](const variable_list& in) {
                     MinMaxResult r = in[0].min(0, true);
                     return variable_list{r.values, r.indices};
                   }});
  cases.push_back({"softmax", "softmax", {G(General({3, 4}))}, [](const variable_list& in) {
                     return variable_list{in[0].softmax(1)};
                   }});
  cases.push_back({"log_softmax", "log_softmax", {G(General({3, 4}))}, [](const variable_list& in) {
                     return variable_list{in[0].log_softmax(0)};
                   }});
  cases.push_back(
      {"mm", "mm", {G(General({3, 4})), G(General({4, 2}, 1))}, [](const variable_list& in) {
         return variable_list{in[0].mm(in[1])};
       }});
  cases.push_back({"bmm",
                   "bmm",
                   {G(General({2, 3, 4})), G(General({2, 4, 2}, 1))},
                   [](const variable_list& in) { return variable_list{in[0].bmm(in[1])}; }});
  cases.push_back({"addmm",
                   "addmm",
                   {G(General({2})), G(General({3, 4}, 1)), G(General({4, 2}, 2))},
                   [](const variable_list& in) {
                     return variable_list{addmm(in[0], in[1], in[2], 0.5, 2.0)};
                   }});
  cases.push_back(
      {"dot", "dot", {G(General({5})), G(General({5}, 1))}, [](const variable_list& in) {
         return variable_list{in[0].dot(in[1])};
       }});
}

void AddLayers(std::vector<Case>& cases) {
  namespace F = ::ember::nn::functional;
  using ::ember::nn::Int2;
  cases.push_back(
      {"nn:conv2d",
       "conv2d",
       {G(General({1, 2, 5, 5})), G(General({3, 2, 3, 3}, 1)), G(General({3}, 2))},
       [](const variable_list& in) { return variable_list{F::conv2d(in[0], in[1], in[2])}; }});
  cases.push_back({"nn:conv2d",
                   "conv2d_stride2_padding1",
                   {G(General({1, 2, 5, 5})), G(General({3, 2, 3, 3}, 1)), G(General({3}, 2))},
                   [](const variable_list& in) {
                     return variable_list{F::conv2d(in[0], in[1], in[2], {2, 2}, {1, 1})};
                   }});
  cases.push_back(
      {"nn:conv2d",
       "conv2d_dilation2_no_bias",
       {G(General({2, 1, 5, 5})), G(General({2, 1, 2, 2}, 1))},
       [](const variable_list& in) {
         return variable_list{F::conv2d(in[0], in[1], Tensor(), {1, 1}, {0, 0}, {2, 2})};
       }});
  cases.push_back(
      {"nn:conv2d",
       "conv2d_groups2",
       {G(General({1, 4, 4, 4})), G(General({4, 2, 3, 3}, 1)), G(General({4}, 2))},
       [](const variable_list& in) {
         return variable_list{F::conv2d(in[0], in[1], in[2], {1, 1}, {1, 1}, {1, 1}, /*groups=*/2)};
       }});
  cases.push_back({"nn:conv2d_input",
                   "conv2d_input",
                   {G(General({3, 2, 3, 3})), G(General({1, 3, 3, 3}, 1))},
                   [](const variable_list& in) {
                     return variable_list{nn::grad::conv2d_input({1, 2, 5, 5}, in[0], in[1])};
                   }});
  cases.push_back(
      {"nn:conv2d_weight",
       "conv2d_weight_stride2",
       {G(General({1, 2, 5, 5})), G(General({1, 3, 2, 2}, 1))},
       [](const variable_list& in) {
         return variable_list{nn::grad::conv2d_weight(in[0], {3, 2, 3, 3}, in[1], {2, 2})};
       }});
  cases.push_back({"nn:batch_norm",
                   "batch_norm_training",
                   {G(General({4, 3, 2})), G(Positive({3}, 1)), G(General({3}, 2))},
                   [](const variable_list& in) {
                     return variable_list{
                         F::batch_norm(in[0], Tensor(), Tensor(), in[1], in[2], /*training=*/true)};
                   }});
  cases.push_back({"nn:batch_norm",
                   "batch_norm_eval",
                   {G(General({4, 3})), C(General({3}, 3)), C(Positive({3}, 4)),
                    G(Positive({3}, 1)), G(General({3}, 2))},
                   [](const variable_list& in) {
                     return variable_list{
                         F::batch_norm(in[0], in[1], in[2], in[3], in[4], /*training=*/false)};
                   }});
  cases.push_back({"nn:layer_norm",
                   "layer_norm",
                   {G(General({3, 4})), G(Positive({4}, 1)), G(General({4}, 2))},
                   [](const variable_list& in) {
                     return variable_list{F::layer_norm(in[0], {4}, in[1], in[2])};
                   }});
  cases.push_back({"nn:layer_norm",
                   "layer_norm_no_affine_2d",
                   {G(General({2, 2, 3}))},
                   [](const variable_list& in) {
                     return variable_list{F::layer_norm(in[0], {2, 3}, Tensor(), Tensor())};
                   }});
  cases.push_back(
      {"nn:max_pool2d", "max_pool2d_2x2", {G(General({1, 2, 4, 4}))}, [](const variable_list& in) {
         nn::MaxPool2dOptions o;
         o.kernel_size = {2, 2};
         return variable_list{F::max_pool2d(in[0], o)};
       }});
  cases.push_back({"nn:max_pool2d",
                   "max_pool2d_3x3_stride2_padding1",
                   {G(General({1, 2, 5, 5}))},
                   [](const variable_list& in) {
                     nn::MaxPool2dOptions o;
                     o.kernel_size = {3, 3};
                     o.stride = {2, 2};
                     o.padding = {1, 1};
                     return variable_list{F::max_pool2d(in[0], o)};
                   }});
  cases.push_back(
      {"nn:avg_pool2d", "avg_pool2d_2x2", {G(General({1, 2, 4, 4}))}, [](const variable_list& in) {
         nn::AvgPool2dOptions o;
         o.kernel_size = {2, 2};
         return variable_list{F::avg_pool2d(in[0], o)};
       }});
  cases.push_back({"nn:avg_pool2d",
                   "avg_pool2d_3x3_padding1_exclude_pad_ceil",
                   {G(General({1, 2, 5, 5}))},
                   [](const variable_list& in) {
                     nn::AvgPool2dOptions o;
                     o.kernel_size = {3, 3};
                     o.stride = {2, 2};
                     o.padding = {1, 1};
                     o.ceil_mode = true;
                     o.count_include_pad = false;
                     return variable_list{F::avg_pool2d(in[0], o)};
                   }});
  cases.push_back({"nn:adaptive_avg_pool2d",
                   "adaptive_avg_pool2d_5x5_to_3x2",
                   {G(General({1, 2, 5, 5}))},
                   [](const variable_list& in) {
                     return variable_list{F::adaptive_avg_pool2d(in[0], Int2{3, 2})};
                   }});
  const Tensor dup = Make({1, 3, 1, 4, 1, 0}, {2, 3}, kInt64);
  cases.push_back(
      {"nn:embedding",
       "embedding_duplicate_indices",
       {G(General({5, 3})), C(dup)},
       [](const variable_list& in) { return variable_list{F::embedding(in[1], in[0])}; }});
  cases.push_back({"nn:embedding",
                   "embedding_padding_idx",
                   {G(General({5, 3})), C(dup)},
                   [](const variable_list& in) {
                     return variable_list{F::embedding(in[1], in[0], /*padding_idx=*/1)};
                   },
                   {},
                   /*gradcheck=*/false});  // row 1 gets no gradient, as in torch
  cases.push_back(
      {"nn:dropout", "dropout_p0_training", {G(General({3, 4}))}, [](const variable_list& in) {
         return variable_list{F::dropout(in[0], 0.0, /*training=*/true)};
       }});
  cases.push_back({"nn:dropout", "dropout_eval", {G(General({3, 4}))}, [](const variable_list& in) {
                     return variable_list{F::dropout(in[0], 0.5, /*training=*/false)};
                   }});
  cases.push_back({"nn:relu", "relu", {G(General({3, 4}))}, [](const variable_list& in) {
                     return variable_list{F::relu(in[0])};
                   }});
  // The GELU, Tanh and Sigmoid modules' forward (nn/activation.h).
  cases.push_back({"nn:gelu", "gelu", {G(General({3, 4}))}, [](const variable_list& in) {
                     return variable_list{nn::GELU().forward(in[0])};
                   }});
  cases.push_back({"nn:tanh", "tanh", {G(General({3, 4}))}, [](const variable_list& in) {
                     return variable_list{nn::Tanh().forward(in[0])};
                   }});
  cases.push_back({"nn:sigmoid", "sigmoid", {G(General({3, 4}))}, [](const variable_list& in) {
                     return variable_list{nn::Sigmoid().forward(in[0])};
                   }});
  const Tensor target = Indices({2, 0, 4, 2});
  cases.push_back(
      {"nn:cross_entropy",
       "cross_entropy",
       {G(General({4, 5})), C(target)},
       [](const variable_list& in) { return variable_list{F::cross_entropy(in[0], in[1])}; }});
  cases.push_back({"nn:cross_entropy",
                   "cross_entropy_smoothing_ignore_sum",
                   {G(General({4, 5})), C(target)},
                   [](const variable_list& in) {
                     nn::CrossEntropyOptions o;
                     o.label_smoothing = 0.1;
                     o.ignore_index = 0;
                     o.reduction = nn::Reduction::kSum;
                     return variable_list{F::cross_entropy(in[0], in[1], o)};
                   }});
  cases.push_back(
      {"nn:nll_loss", "nll_loss", {G(General({4, 5})), C(target)}, [](const variable_list& in) {
         return variable_list{F::nll_loss(in[0], in[1])};
       }});
  cases.push_back({"nn:nll_loss",
                   "nll_loss_none_ignore",
                   {G(General({4, 5})), C(target)},
                   [](const variable_list& in) {
                     nn::NllOptions o;
                     o.reduction = nn::Reduction::kNone;
                     o.ignore_index = 2;
                     return variable_list{F::nll_loss(in[0], in[1], o)};
                   }});
  cases.push_back(
      {"nn:mse_loss",
       "mse_loss",
       {G(General({3, 4})), G(General({3, 4}, 1))},
       [](const variable_list& in) { return variable_list{F::mse_loss(in[0], in[1])}; }});
  cases.push_back({"nn:l1_loss",
                   "l1_loss_sum",
                   {G(General({3, 4})), G(General({3, 4}, 1))},
                   [](const variable_list& in) {
                     return variable_list{F::l1_loss(in[0], in[1], nn::Reduction::kSum)};
                   }});
  cases.push_back({"nn:binary_cross_entropy_with_logits",
                   "bce_with_logits_pos_weight",
                   {G(General({3, 4})), G(Sample({3, 4}, 0.05, 0.95, 1)), G(Positive({4}, 2))},
                   [](const variable_list& in) {
                     return variable_list{F::binary_cross_entropy_with_logits(
                         in[0], in[1], nn::Reduction::kMean, in[2])};
                   }});
  cases.push_back(
      {"nn:linear",
       "linear",
       {G(General({3, 4})), G(General({2, 4}, 1)), G(General({2}, 2))},
       [](const variable_list& in) { return variable_list{F::linear(in[0], in[1], in[2])}; }});
}

const std::vector<Case>& AllCases() {
  static const std::vector<Case>* cases = [] {
    auto* c = new std::vector<Case>();
    AddElementwise(*c);
    AddViews(*c);
    AddOthers(*c);
    AddLayers(*c);
    return c;
  }();
  return *cases;
}

// --- Running a case on a device -----------------------------------------------------

// The elements of `t`, read on the host.
std::vector<double> HostValues(const Tensor& t) { return Values(t.to(kCPU)); }

// Fresh leaves on `device` from the case's CPU inputs.
variable_list Leaves(const Case& c, Device device) {
  variable_list in;
  for (const Input& i : c.inputs) {
    Tensor t = i.value.clone().to(device);
    if (i.grad) t.requires_grad_();
    in.push_back(t);
  }
  return in;
}

struct Outcome {
  std::vector<std::vector<double>> forward;  // each output
  std::vector<std::vector<double>> grads;    // each input that requires grad
  std::vector<Device> devices;               // of each output and each gradient
};

// Forward, then the gradients of sum_o <out_o, w_o> for fixed weights w_o.
Outcome RunCase(const Case& c, Device device) {
  variable_list in = Leaves(c, device);
  variable_list out = c.fn(in);
  Outcome r;
  Tensor loss;
  for (size_t o = 0; o < out.size(); ++o) {
    r.forward.push_back(HostValues(out[o]));
    r.devices.push_back(out[o].device());
    if (!out[o].requires_grad()) continue;
    Tensor w =
        Sample(SizeVector(out[o].sizes().begin(), out[o].sizes().end()), -1, 1, 11 + o).to(device);
    Tensor term = (out[o] * w).sum();
    loss = loss.defined() ? loss + term : term;
  }
  variable_list wrt;
  for (const Tensor& t : in) {
    if (t.requires_grad()) wrt.push_back(t);
  }
  if (!loss.defined()) return r;
  variable_list g = grad({loss}, wrt, {}, std::nullopt, false, /*allow_unused=*/true);
  for (size_t i = 0; i < g.size(); ++i) {
    if (!g[i].defined()) {
      r.grads.push_back(std::vector<double>(wrt[i].numel(), 0.0));
      continue;
    }
    r.grads.push_back(HostValues(g[i]));
    r.devices.push_back(g[i].device());
  }
  return r;
}

void ExpectClose(const std::vector<std::vector<double>>& got,
                 const std::vector<std::vector<double>>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t k = 0; k < got.size(); ++k) {
    ASSERT_EQ(got[k].size(), want[k].size()) << what << " " << k;
    for (size_t e = 0; e < got[k].size(); ++e) {
      if (std::isnan(want[k][e])) {
        EXPECT_TRUE(std::isnan(got[k][e])) << what << " " << k << " element " << e;
        continue;
      }
      EXPECT_NEAR(got[k][e], want[k][e], 1e-9 * (1 + std::abs(want[k][e])))
          << what << " " << k << " element " << e;
    }
  }
}

std::string CudaSkipReason() {
  if (device_count(DeviceType::kCUDA) > 0) return "";
  const std::string& why = cuda::unavailable_reason();
  return "no usable CUDA device (" + (why.empty() ? std::string("0 devices") : why) +
         "); the CPU side of this case ran in the Cpu suite";
}

// --- Tests --------------------------------------------------------------------------

// The op names of tensor/ops.inc whose autograd kernel is registered.
std::vector<std::string> OpsWithDerivatives() {
  std::vector<std::string> names;
#define EMBER_OP(name, ret, args) \
  if (::ember::ops::name.HasKernel(DispatchKey::kAutograd)) names.push_back(#name);
#define EMBER_CROSS_DEVICE_OP EMBER_OP
#include "tensor/ops.inc"
#undef EMBER_CROSS_DEVICE_OP
#undef EMBER_OP
  return names;
}

TEST(DeviceOpsHarnessTest, EveryDerivativeAndLayerHasAnEntry) {
  std::set<std::string> covered, names;
  for (const Case& c : AllCases()) {
    covered.insert(c.op);
    EXPECT_TRUE(names.insert(c.name).second) << "two cases named " << c.name;
  }
  std::set<std::string> required(kLayers.begin(), kLayers.end());
  const std::vector<std::string> with_derivatives = OpsWithDerivatives();
  ASSERT_GT(with_derivatives.size(), 20u) << "autograd's kernels are not linked";
  for (const std::string& op : with_derivatives) {
    const std::vector<std::string>* kinds = nullptr;
    if (op == "unary" || op == "unary_") kinds = &kUnaryNames;
    if (op == "binary" || op == "binary_") kinds = &kBinaryNames;
    if (op == "reduce") kinds = &kReduceNames;
    if (kinds == nullptr) {
      required.insert(op);
      continue;
    }
    for (const std::string& kind : *kinds) required.insert(op + ":" + kind);
  }
  for (const std::string& op : required) {
    EXPECT_TRUE(covered.contains(op))
        << "the derivative or layer '" << op
        << "' has no entry in nn/device_ops_test.cc (Note [Device ops harness]); add one";
  }
  for (const std::string& op : covered) {
    EXPECT_TRUE(required.contains(op))
        << "the entry '" << op << "' names no registered derivative or listed layer";
  }
}

class DeviceOps : public ::testing::TestWithParam<size_t> {
 protected:
  const Case& TheCase() const { return AllCases()[GetParam()]; }
};

// The CPU side, always: forward, backward and gradcheck.
TEST_P(DeviceOps, Cpu) {
  const Case& c = TheCase();
  SCOPED_TRACE(c.op);
  Outcome cpu = RunCase(c, kCPU);
  ASSERT_FALSE(cpu.forward.empty());
  for (const Device& d : cpu.devices) EXPECT_EQ(d, kCPU);
  if (!c.gradcheck) return;
  variable_list in = Leaves(c, kCPU);
  absl::Status st = gradcheck(c.fn, in, c.options);
  EXPECT_TRUE(st.ok()) << st;
}

// The device side: the same on cuda:0, against the CPU, and gradcheck there.
TEST_P(DeviceOps, CudaMatchesCpu) {
  const std::string why = CudaSkipReason();
  if (!why.empty()) GTEST_SKIP() << why;
  const Case& c = TheCase();
  SCOPED_TRACE(c.op);
  Outcome cpu = RunCase(c, kCPU);
  Outcome dev = RunCase(c, kCuda0);
  for (const Device& d : dev.devices) EXPECT_EQ(d, kCuda0) << "results stay on the device";
  ExpectClose(dev.forward, cpu.forward, "forward output");
  ExpectClose(dev.grads, cpu.grads, "gradient of input");
  if (!c.gradcheck) return;
  variable_list in = Leaves(c, kCuda0);
  absl::Status st = gradcheck(c.fn, in, c.options);
  EXPECT_TRUE(st.ok()) << st;
}

INSTANTIATE_TEST_SUITE_P(EveryOp, DeviceOps, ::testing::Range<size_t>(0, AllCases().size()),
                         [](const ::testing::TestParamInfo<size_t>& info) {
                           return AllCases()[info.param].name;
                         });

}  // namespace
}  // namespace ember::autograd
