#include "nn/embedding.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "autograd/function.h"
#include "autograd/grad_mode.h"
#include "nn/embedding_kernels.h"
#include "nn/init.h"
#include "nn/kernel_util.h"
#include "tensor/error.h"
#include "tensor/factories.h"

namespace ember::nn {

// The backward's slot (nn/embedding_kernels.h), filled per device type.
namespace internal {
constinit DeviceKernel<EmbeddingBackwardFn> embedding_backward{"embedding backward"};
}  // namespace internal

namespace {

using autograd::AutogradContext;

// embedding backward's CPU kernel: gw[indices[i]] += g[i] for every i whose
// index is not padding_idx, in index order.
Tensor EmbeddingBackwardCpu(const Tensor& g, const Tensor& indices, int64_t num_weights,
                            int64_t padding_idx) {
  const int64_t dim = g.size(1);
  Tensor gw = zeros({num_weights, dim}, g.options());
  internal::VisitNnDtype(g.dtype(), "embedding backward", [&]<typename T>() {
    const int64_t* idx = indices.data_ptr<int64_t>();
    const T* pg = g.data_ptr<T>();
    T* pw = gw.data_ptr<T>();
    for (int64_t i = 0; i < indices.numel(); ++i) {
      if (idx[i] == padding_idx) continue;
      T* row = pw + idx[i] * dim;
      const T* src = pg + i * dim;
      for (int64_t j = 0; j < dim; ++j) row[j] += src[j];
    }
  });
  return gw;
}

EMBER_REGISTER_NN_KERNEL(internal::embedding_backward, DeviceType::kCPU, internal::InFloat32<&EmbeddingBackwardCpu>);

// The scatter by the kernel of grad's device.
Tensor EmbeddingScatter(const Tensor& grad, const Tensor& indices, int64_t num_weights,
                        int64_t padding_idx) {
  Tensor g = grad.detach().contiguous();
  return internal::embedding_backward(g.device())(g, indices, num_weights, padding_idx);
}

// Note [Embedding double backward]
// The backward scatters g's rows to the looked-up rows, skipping padding_idx;
// its derivative is the lookup with the padding rows zeroed
// (EmbeddingGatherFunction), whose own derivative is the scatter again, so
// every order is exact. The scatter kernel runs directly unless create_graph
// asks for a graph.
struct EmbeddingScatterFunction : autograd::Function<EmbeddingScatterFunction> {
  static Tensor forward(AutogradContext* ctx, const Tensor& grad, const Tensor& indices,
                        int64_t num_weights, int64_t padding_idx) {
    ctx->save_for_backward({indices});
    ctx->saved_data["padding_idx"] = padding_idx;
    return EmbeddingScatter(grad, indices, num_weights, padding_idx);
  }
  static std::vector<Tensor> backward(AutogradContext* ctx, std::vector<Tensor> grad_outputs);
};

// Rows of weight at indices, with the padding_idx rows zeroed.
struct EmbeddingGatherFunction : autograd::Function<EmbeddingGatherFunction> {
  static Tensor forward(AutogradContext* ctx, const Tensor& weight, const Tensor& indices,
                        int64_t padding_idx) {
    ctx->save_for_backward({indices});
    ctx->saved_data["num_weights"] = weight.size(0);
    ctx->saved_data["padding_idx"] = padding_idx;
    Tensor out = weight.detach().index_select(0, indices);
    if (padding_idx < 0) return out;
    return where(indices.ne(padding_idx).unsqueeze(1), out, zeros({}, out.options()));
  }
  static std::vector<Tensor> backward(AutogradContext* ctx, std::vector<Tensor> grad_outputs) {
    std::vector<Tensor> grads(3);
    if (!grad_outputs[0].defined()) return grads;
    grads[0] = EmbeddingScatterFunction::apply(grad_outputs[0], ctx->get_saved_variables()[0],
                                               std::get<int64_t>(ctx->saved_data["num_weights"]),
                                               std::get<int64_t>(ctx->saved_data["padding_idx"]));
    return grads;
  }
};

std::vector<Tensor> EmbeddingScatterFunction::backward(AutogradContext* ctx,
                                                       std::vector<Tensor> grad_outputs) {
  std::vector<Tensor> grads(4);
  if (!grad_outputs[0].defined()) return grads;
  grads[0] = EmbeddingGatherFunction::apply(grad_outputs[0], ctx->get_saved_variables()[0],
                                            std::get<int64_t>(ctx->saved_data["padding_idx"]));
  return grads;
}

// indices (flat int64, checked) -> rows of weight.
struct EmbeddingFunction : autograd::Function<EmbeddingFunction> {
  static Tensor forward(AutogradContext* ctx, const Tensor& weight, const Tensor& indices,
                        int64_t padding_idx) {
    ctx->save_for_backward({indices});
    ctx->saved_data["num_weights"] = weight.size(0);
    ctx->saved_data["padding_idx"] = padding_idx;
    return weight.detach().index_select(0, indices);
  }

  static std::vector<Tensor> backward(AutogradContext* ctx, std::vector<Tensor> grad_outputs) {
    std::vector<Tensor> grads(3);
    if (!grad_outputs[0].defined() || !ctx->needs_input_grad(0)) return grads;
    const Tensor indices = ctx->get_saved_variables()[0];
    const int64_t num_weights = std::get<int64_t>(ctx->saved_data["num_weights"]);
    const int64_t padding_idx = std::get<int64_t>(ctx->saved_data["padding_idx"]);
    grads[0] =
        autograd::GradMode::is_enabled()
            ? EmbeddingScatterFunction::apply(grad_outputs[0], indices, num_weights, padding_idx)
            : EmbeddingScatter(grad_outputs[0], indices, num_weights, padding_idx);
    return grads;
  }
};

}  // namespace

namespace functional {

Tensor embedding(const Tensor& indices, const Tensor& weight, std::optional<int64_t> padding_idx) {
  EMBER_CHECK(weight.defined(), "embedding: weight is an undefined tensor");
  internal::CheckDevice(indices, weight.device(), "embedding", "indices");
  EMBER_CHECK(weight.dim() == 2,
              "embedding: expected a 2-D weight [num_embeddings, "
              "embedding_dim], got shape ",
              ShapeToString(weight.sizes()));
  EMBER_CHECK(indices.dtype() == kInt64 || indices.dtype() == kInt32,
              "embedding: expected indices of dtype int64 or int32, but got ",
              dtype_name(indices.dtype()), "; convert them with .to(ember::kInt64)");
  internal::CheckNnDtype(weight, "embedding");
  const int64_t n = weight.size(0);
  Tensor flat = indices.to(kInt64).contiguous().view({-1});
  if (flat.numel() > 0) {
    // On any device: the extremes, read back together (one synchronisation
    // on a GPU).
    const Tensor ends = stack({flat.min(), flat.max()}).to(kCPU);
    const int64_t lo = ends.data_ptr<int64_t>()[0], hi = ends.data_ptr<int64_t>()[1];
    EMBER_CHECK(lo >= 0 && hi < n, "embedding: index out of range in self: index ",
                lo < 0 ? lo : hi, " is not in [0, ", n, ")");
  }
  int64_t pad = -1;
  if (padding_idx) {
    pad = *padding_idx < 0 ? *padding_idx + n : *padding_idx;
    EMBER_CHECK(pad >= 0 && pad < n, "embedding: padding_idx ", *padding_idx,
                " must be within num_embeddings (", n, ")");
  }
  SizeVector out_shape(indices.sizes().begin(), indices.sizes().end());
  out_shape.push_back(weight.size(1));
  return EmbeddingFunction::apply(weight, flat, pad).view(out_shape);
}

}  // namespace functional

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim,
                     std::optional<int64_t> padding_idx)
    : num_embeddings_(num_embeddings), embedding_dim_(embedding_dim) {
  EMBER_CHECK(num_embeddings > 0 && embedding_dim >= 0,
              "Embedding: num_embeddings must be "
              "positive and embedding_dim non-negative, got ",
              num_embeddings, " and ", embedding_dim);
  if (padding_idx) {
    EMBER_CHECK(*padding_idx >= -num_embeddings && *padding_idx < num_embeddings,
                "Padding_idx must be within num_embeddings (got padding_idx=", *padding_idx,
                ", num_embeddings=", num_embeddings, ")");
    padding_idx_ = *padding_idx < 0 ? *padding_idx + num_embeddings : *padding_idx;
  }
  reset();
}

void Embedding::reset() {
  register_parameter("weight", empty({num_embeddings_, embedding_dim_}));
  if (!InClone()) reset_parameters();
}

void Embedding::reset_parameters() {
  init::normal_(weight());
  if (padding_idx_) {
    autograd::NoGradGuard no_grad;
    weight().select(0, *padding_idx_).fill_(0);
  }
}

Tensor Embedding::forward(const Tensor& indices) {
  return functional::embedding(indices, weight(), padding_idx_);
}

std::string Embedding::extra_repr() const {
  std::string s = absl::StrCat(num_embeddings_, ", ", embedding_dim_);
  if (padding_idx_) absl::StrAppend(&s, ", padding_idx=", *padding_idx_);
  return s;
}

}  // namespace ember::nn
