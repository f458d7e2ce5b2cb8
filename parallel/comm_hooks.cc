#include "parallel/comm_hooks.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "autograd/grad_mode.h"
#include "distributed/debug.h"
#include "tensor/error.h"
#include "tensor/factories.h"
#include "tensor/shape.h"

// LAPACK (OpenBLAS ships it): Householder QR and the explicit Q.
extern "C" {
void sgeqrf_(const int* m, const int* n, float* a, const int* lda, float* tau, float* work,
             const int* lwork, int* info);
void sorgqr_(const int* m, const int* n, const int* k, float* a, const int* lda, const float* tau,
             float* work, const int* lwork, int* info);
void dgeqrf_(const int* m, const int* n, double* a, const int* lda, double* tau, double* work,
             const int* lwork, int* info);
void dorgqr_(const int* m, const int* n, const int* k, double* a, const int* lda,
             const double* tau, double* work, const int* lwork, int* info);
}

namespace ember::parallel::comm_hooks {
namespace {

using distributed::Future;
using distributed::ProcessGroup;

ProcessGroup& GroupOf(const std::shared_ptr<ProcessGroup>& group, const GradBucket& bucket) {
  if (group != nullptr) return *group;
  EMBER_CHECK(bucket.process_group() != nullptr,
              "DDP communication hook: the bucket has no process group");
  return *bucket.process_group();
}

// all_reduce SUM of `t` in place; the future of `t`.
std::shared_ptr<Future> AllReduce(ProcessGroup& group, const Tensor& t) {
  absl::StatusOr<std::shared_ptr<distributed::Work>> work =
      group.allreduce(t, {.op = distributed::ReduceOp::kSum});
  if (!work.ok()) return Future::Failed(work.status());
  return (*work)->get_future();
}

// The hooks compute on gradients, outside autograd.
struct NoGrad {
  autograd::NoGradGuard guard;
};

CommHook CompressHook(std::shared_ptr<ProcessGroup> group, Dtype dtype) {
  return [group, dtype](GradBucket& bucket) -> std::shared_ptr<Future> {
    NoGrad no_grad;
    ProcessGroup& g = GroupOf(group, bucket);
    const Tensor buffer = bucket.buffer();
    const Tensor compressed = buffer.to(dtype).div_(g.size());
    return AllReduce(g, compressed)->then([buffer](const Future& f) {
      NoGrad no_grad;
      buffer.copy_(f.value().at(0));  // in place: no second full-size tensor
      return absl::StatusOr<std::vector<Tensor>>(std::vector<Tensor>{buffer});
    });
  };
}

CommHook CompressWrapper(CommHook hook, Dtype dtype) {
  EMBER_CHECK(static_cast<bool>(hook), "fp16/bf16_compress_wrapper: the wrapped hook is empty");
  return [hook = std::move(hook), dtype](GradBucket& bucket) -> std::shared_ptr<Future> {
    NoGrad no_grad;
    const Tensor buffer = bucket.buffer();
    const Tensor compressed = buffer.to(dtype);
    std::vector<Tensor> gradients;
    int64_t offset = 0;
    for (const Tensor& g : bucket.gradients()) {
      gradients.push_back(compressed.narrow(0, offset, g.numel()).view(g.sizes()));
      offset += g.numel();
    }
    GradBucket narrow(bucket.index(), bucket.is_last(), compressed, std::move(gradients),
                      bucket.parameters(), bucket.process_group());
    std::shared_ptr<Future> inner = hook(narrow);
    if (inner == nullptr) {
      return Future::Failed(
          absl::InvalidArgumentError("the hook inside a compress wrapper returned a null future"));
    }
    return inner->then([buffer](const Future& f) {
      NoGrad no_grad;
      buffer.copy_(f.value().at(0).reshape({-1}));
      return absl::StatusOr<std::vector<Tensor>>(std::vector<Tensor>{buffer});
    });
  };
}

// --- PowerSGD -------------------------------------------------------------

// Gram-Schmidt on the columns of each matrix of `m` [batch, n, r], in place
// (torch's _orthogonalize_gram_schmidt).
void GramSchmidt(const Tensor& m, double epsilon) {
  const int64_t cols = m.size(2);
  for (int64_t i = 0; i < cols; ++i) {
    const Tensor col = m.narrow(2, i, 1);
    Tensor norm = col.norm(2, {1}, /*keepdim=*/true);
    if (epsilon != 0) norm = norm.add(epsilon);
    col.div_(norm);
    if (i + 1 < cols) {
      const Tensor rest = m.narrow(2, i + 1, cols - i - 1);
      rest.sub_(col.mul(rest).sum({1}, /*keepdim=*/true).mul(col));
    }
  }
}

template <typename T, typename Geqrf, typename Orgqr>
void HouseholderQ(T* a, int n, int r, Geqrf geqrf, Orgqr orgqr) {
  // `a` is n x r in column-major order; replaced by the reduced Q.
  std::vector<T> tau(static_cast<size_t>(r));
  int info = 0, lwork = -1;
  T query = 0;
  geqrf(&n, &r, a, &n, tau.data(), &query, &lwork, &info);
  lwork = std::max(1, static_cast<int>(query));
  std::vector<T> work(static_cast<size_t>(lwork));
  geqrf(&n, &r, a, &n, tau.data(), work.data(), &lwork, &info);
  EMBER_CHECK(info == 0, "PowerSGD: LAPACK geqrf failed (info ", info, ")");
  lwork = -1;
  orgqr(&n, &r, &r, a, &n, tau.data(), &query, &lwork, &info);
  lwork = std::max(1, static_cast<int>(query));
  work.resize(static_cast<size_t>(lwork));
  orgqr(&n, &r, &r, a, &n, tau.data(), work.data(), &lwork, &info);
  EMBER_CHECK(info == 0, "PowerSGD: LAPACK orgqr failed (info ", info, ")");
}

// The reduced Q of each matrix of `m` [batch, n, r] (n >= r), in place, as
// torch.linalg.qr: LAPACK's Householder QR. A device tensor goes through the
// host.
void HouseholderOrthogonalize(const Tensor& m) {
  // [batch, r, n] row-major is each n x r matrix column-major.
  Tensor cm = m.transpose(1, 2).to(kCPU).contiguous();
  const int n = static_cast<int>(m.size(1)), r = static_cast<int>(m.size(2));
  for (int64_t b = 0; b < m.size(0); ++b) {
    if (cm.dtype() == kFloat64) {
      HouseholderQ(cm.data_ptr<double>() + b * n * r, n, r, dgeqrf_, dorgqr_);
    } else {
      HouseholderQ(cm.data_ptr<float>() + b * n * r, n, r, sgeqrf_, sorgqr_);
    }
  }
  m.copy_(cm.to(m.device()).transpose(1, 2));
}

// torch's _orthogonalize: Gram-Schmidt for rank 1 and 2 and for half
// precision, Householder QR above.
void Orthogonalize(const Tensor& m, double epsilon) {
  if (m.size(2) <= 2 || m.dtype() == kFloat16 || m.dtype() == kBFloat16) {
    GramSchmidt(m, epsilon);
  } else {
    HouseholderOrthogonalize(m);
  }
}

}  // namespace

CommHook allreduce_hook(std::shared_ptr<ProcessGroup> group) {
  return [group](GradBucket& bucket) -> std::shared_ptr<Future> {
    NoGrad no_grad;
    ProcessGroup& g = GroupOf(group, bucket);
    const Tensor buffer = bucket.buffer();
    buffer.div_(g.size());
    return AllReduce(g, buffer);
  };
}

CommHook fp16_compress_hook(std::shared_ptr<ProcessGroup> group) {
  return CompressHook(std::move(group), kFloat16);
}
CommHook bf16_compress_hook(std::shared_ptr<ProcessGroup> group) {
  return CompressHook(std::move(group), kBFloat16);
}
CommHook fp16_compress_wrapper(CommHook hook) { return CompressWrapper(std::move(hook), kFloat16); }
CommHook bf16_compress_wrapper(CommHook hook) {
  return CompressWrapper(std::move(hook), kBFloat16);
}

absl::StatusOr<std::shared_ptr<PowerSGDState>> PowerSGDState::create(
    std::shared_ptr<ProcessGroup> group, PowerSGDOptions options) {
  auto bad = [](auto... parts) {
    return absl::InvalidArgumentError(absl::StrCat("PowerSGDState: ", parts...));
  };
  if (options.matrix_approximation_rank < 1) {
    return bad("matrix_approximation_rank must be at least 1, got ",
               options.matrix_approximation_rank);
  }
  if (!(options.min_compression_rate > 0)) {
    return bad("min_compression_rate must be positive, got ", options.min_compression_rate);
  }
  if (!(options.orthogonalization_epsilon >= 0)) {
    return bad("orthogonalization_epsilon must be at least 0, got ",
               options.orthogonalization_epsilon);
  }
  if ((options.use_error_feedback || options.warm_start) && options.start_powerSGD_iter <= 1) {
    return bad("expected start_powerSGD_iter > 1 when use_error_feedback or warm_start is on, "
               "got ",
               options.start_powerSGD_iter,
               ": PowerSGD starts after at least two plain iterations (torch's rule, for DDP "
               "rebuilding its buckets after the first)");
  }
  if (options.compression_stats_logging_frequency < 1) {
    return bad("compression_stats_logging_frequency must be at least 1, got ",
               options.compression_stats_logging_frequency);
  }
  std::shared_ptr<PowerSGDState> state(new PowerSGDState(std::move(group), options));
  return state;
}

PowerSGDState::CompressionStats PowerSGDState::compression_stats() const {
  return {.compress_rate = numel_after_ > 0 ? static_cast<double>(numel_before_) /
                                                  static_cast<double>(numel_after_)
                                            : 0.0,
          .numel_before_compression = numel_before_,
          .numel_after_compression = numel_after_};
}

uint64_t PowerSGDState::NextSeed() {
  // numpy's legacy randint below 10^9: a 32-bit draw masked to the bits the
  // range needs (30), redrawn while above the largest value.
  constexpr uint32_t kMax = 999'999'999, kMask = (uint32_t{1} << 30) - 1;
  uint32_t v = 0;
  do {
    v = static_cast<uint32_t>(rng_()) & kMask;
  } while (v > kMax);
  return v;
}

void PowerSGDState::MaybeIncreaseIter(const GradBucket& bucket) {
  if (!bucket.is_last()) return;
  ++iter_;
  if (iter_ == options_.start_powerSGD_iter &&
      distributed::debug_level_from_env() != distributed::DebugLevel::kOff) {
    std::fprintf(stderr, "PowerSGD: start to apply PowerSGD after %lld iterations\n",
                 static_cast<long long>(iter_));
  }
}

// Note [PowerSGD]
// One bucket, as torch's powerSGD_hook: add the error feedback; split the
// gradients into matrices worth compressing (n x m viewed from each
// gradient, kept when (n + m) r min_compression_rate < n m) and the rest;
// the rest is all_reduced as one flat tensor, divided by the world size.
// For the matrices M, with Q [m, r] random on the first PowerSGD iteration
// (each bucket's Qs drawn from a CPU generator seeded with the state's next
// seed, torch's order) and the previous Q after (warm start, orthogonalised
// first): P = M Q, all_reduce the Ps, orthogonalise them, Q = M^T P,
// all_reduce the Qs, divide them by the world size, M = P Q^T. The error
// feedback keeps what the approximation lost, M before minus M after. The
// three all_reduces are a chain of futures (then_async), so each starts as
// soon as the one before has finished and someone polls.
class PowerSGD {
 public:
  static std::shared_ptr<Future> Run(const std::shared_ptr<PowerSGDState>& state,
                                     GradBucket& bucket) {
    NoGrad no_grad;
    PowerSGDState& s = *state;
    ProcessGroup& group = GroupOf(s.group_, bucket);
    const int world = group.size();
    const Tensor input = bucket.buffer();
    if (s.iter_ < s.options_.start_powerSGD_iter) {
      s.MaybeIncreaseIter(bucket);
      input.div_(world);
      return AllReduce(group, input);
    }
    const size_t index = bucket.index();
    const PowerSGDOptions& o = s.options_;
    const TensorOptions like = TensorOptions().dtype(input.dtype()).device(input.device());
    Tensor input_before;
    if (o.use_error_feedback) {
      auto it = s.error_.find(index);
      if (it != s.error_.end()) {
        input.add_(it->second);
      } else {
        s.error_[index] = zeros({input.numel()}, like);
      }
      input_before = input.clone();
    }
    // Which gradients to compress.
    std::vector<Tensor> matrices, uncompressed;
    int64_t total_p = 0, total_q = 0;
    for (const Tensor& g : bucket.gradients()) {
      const Tensor matrix = g.dim() == 0 ? g.view({1, 1}) : g.view({g.size(0), -1});
      const int64_t n = matrix.size(0), m = matrix.size(1);
      const int64_t r = std::min({n, m, o.matrix_approximation_rank});
      const int64_t before = n * m, after = (n + m) * r;
      s.numel_before_ += before;
      if (static_cast<double>(after) * o.min_compression_rate < static_cast<double>(before)) {
        matrices.push_back(matrix);
        total_p += n * r;
        total_q += m * r;
        s.numel_after_ += after;
      } else {
        uncompressed.push_back(g);
        s.numel_after_ += before;
      }
    }
    if (bucket.is_last() && s.iter_ >= s.next_stats_report_) {
      if (distributed::debug_level_from_env() != distributed::DebugLevel::kOff) {
        const PowerSGDState::CompressionStats stats = s.compression_stats();
        std::fprintf(stderr,
                     "PowerSGD compression stats: iter %lld, total before compression %lld, "
                     "total after compression %lld, rate %.4g\n",
                     static_cast<long long>(s.iter_),
                     static_cast<long long>(stats.numel_before_compression),
                     static_cast<long long>(stats.numel_after_compression),
                     stats.compress_rate);
      }
      s.next_stats_report_ = s.iter_ + o.compression_stats_logging_frequency;
    }
    std::vector<Tensor> flat;
    for (const Tensor& t : uncompressed) flat.push_back(t.reshape({-1}));
    const Tensor rest = flat.empty() ? empty({0}, like) : cat(flat);

    const bool randomize = !o.warm_start || !s.p_memory_.contains(index);
    if (randomize) {
      s.p_memory_[index] = empty({total_p}, like);
      s.q_memory_[index] = empty({total_q}, like);
    }
    const Tensor p_memory = s.p_memory_[index], q_memory = s.q_memory_[index];
    // Group the matrices by shape, in first-seen order; batched (stacked)
    // or one by one as [1, n, m].
    std::vector<std::pair<std::vector<int64_t>, std::vector<Tensor>>> by_shape;
    for (const Tensor& matrix : matrices) {
      const std::vector<int64_t> shape(matrix.sizes().begin(), matrix.sizes().end());
      auto it = std::find_if(by_shape.begin(), by_shape.end(),
                             [&](const auto& e) { return e.first == shape; });
      if (it == by_shape.end()) it = by_shape.insert(by_shape.end(), {shape, {}});
      it->second.push_back(matrix);
    }
    auto plan = std::make_shared<Plan>();
    for (auto& [shape, group_of] : by_shape) {
      if (o.batch_tensors_with_same_shape && group_of.size() > 1) {
        plan->batches.push_back({stack(group_of), group_of});
      } else {
        for (const Tensor& matrix : group_of) plan->batches.push_back({matrix.unsqueeze(0), {}});
      }
    }
    int64_t p_at = 0, q_at = 0;
    for (Batch& b : plan->batches) {
      const int64_t batch = b.m.size(0), n = b.m.size(1), m = b.m.size(2);
      const int64_t r = std::min({n, m, o.matrix_approximation_rank});
      b.p = p_memory.narrow(0, p_at, batch * n * r).view({batch, n, r});
      b.q = q_memory.narrow(0, q_at, batch * m * r).view({batch, m, r});
      p_at += batch * n * r;
      q_at += batch * m * r;
    }
    if (!randomize) {
      for (Batch& b : plan->batches) Orthogonalize(b.q, o.orthogonalization_epsilon);
    } else {
      // torch seeds its CPU generator inside fork_rng and draws each Q on
      // the CPU; a fresh generator with that seed draws the same.
      Generator gen(s.NextSeed());
      for (Batch& b : plan->batches) {
        b.q.copy_(randn(b.q.sizes(), TensorOptions().dtype(b.q.dtype()), &gen));
        Orthogonalize(b.q, o.orthogonalization_epsilon);
      }
    }
    for (Batch& b : plan->batches) b.p.copy_(b.m.bmm(b.q));

    std::shared_ptr<ProcessGroup> group_ref = s.group_ != nullptr ? s.group_ : bucket.process_group();
    const double epsilon = o.orthogonalization_epsilon;
    const GradBucket bucket_copy = bucket;
    return AllReduce(group, rest)
        ->then_async([=](const Future& f) -> absl::StatusOr<std::shared_ptr<Future>> {
          NoGrad no_grad;
          const Tensor reduced = f.value().at(0).div_(world);
          int64_t at = 0;
          for (const Tensor& t : uncompressed) {
            t.copy_(reduced.narrow(0, at, t.numel()).view(t.sizes()));
            at += t.numel();
          }
          // The Ps are orthogonalised next: no division by the world size.
          return AllReduce(*group_ref, p_memory);
        })
        ->then_async([=](const Future&) -> absl::StatusOr<std::shared_ptr<Future>> {
          NoGrad no_grad;
          for (Batch& b : plan->batches) {
            Orthogonalize(b.p, epsilon);
            b.q.copy_(b.m.transpose(1, 2).bmm(b.p));
          }
          return AllReduce(*group_ref, q_memory);
        })
        ->then([=](const Future&) -> absl::StatusOr<std::vector<Tensor>> {
          NoGrad no_grad;
          q_memory.div_(world);
          for (Batch& b : plan->batches) {
            b.m.copy_(b.p.bmm(b.q.transpose(1, 2)));
            for (size_t i = 0; i < b.originals.size(); ++i) b.originals[i].copy_(b.m.select(0, static_cast<int64_t>(i)));
          }
          if (state->options_.use_error_feedback) state->error_[index] = input_before.sub(input);
          if (!state->options_.warm_start) {
            state->p_memory_.clear();
            state->q_memory_.clear();
          }
          state->MaybeIncreaseIter(bucket_copy);
          return std::vector<Tensor>{input};
        });
  }

 private:
  // Matrices compressed together: m [batch, n, m] (a view of the bucket, or
  // a stack of `originals`), with their P [batch, n, r] and Q [batch, m, r],
  // views of the bucket's P and Q memories.
  struct Batch {
    Tensor m;
    std::vector<Tensor> originals;
    Tensor p, q;
  };
  struct Plan {
    std::vector<Batch> batches;
  };
};

CommHook powerSGD_hook(std::shared_ptr<PowerSGDState> state) {
  EMBER_CHECK(state != nullptr, "powerSGD_hook: the state is null; make one with "
                                "PowerSGDState::create");
  return [state](GradBucket& bucket) { return PowerSGD::Run(state, bucket); };
}

}  // namespace ember::parallel::comm_hooks
