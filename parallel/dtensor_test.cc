// DTensor on forked ranks (tcp and gloo over a file:// rendezvous): every
// redistribute pair on 1-D meshes of 2 and 4 ranks with uneven shards, the
// gradients through them (replicated and partial gradients), 2-D meshes, and
// the errors. Expected values are chunks of known whole tensors, with the
// chunk sizes written out (torch.chunk's: 5 rows over 4 ranks are 2, 2, 1, 0).
#include "parallel/dtensor.h"

#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "distributed/device_mesh.h"
#include "distributed/distributed.h"
#include "distributed/testing/ranks.h"
#include "gtest/gtest.h"
#include "parallel/rank_testing.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"

namespace ember::parallel {
namespace {

namespace dist = ::ember::distributed;
using ::ember::distributed::testing::Rank;
using ::ember::distributed::testing::RunRankProcesses;
using ::ember::distributed::testing::RunRanksOptions;
using ::ember::parallel::rank_testing::ExpectAllSucceeded;
using ::ember::parallel::rank_testing::Guard;

absl::Status Check(bool ok, const std::string& what) {
  return ok ? absl::OkStatus() : absl::InternalError(absl::StrCat("check failed: ", what));
}

absl::Status CheckEqual(const Tensor& got, const Tensor& want, const std::string& what) {
  if (got.sizes() != want.sizes() || !got.allclose(want, 1e-6, 1e-6)) {
    std::ostringstream s;
    s << what << ": got " << got << " want " << want;
    return absl::InternalError(s.str());
  }
  return absl::OkStatus();
}

absl::Status Init(const Rank& me, const std::string& backend) {
  return dist::init_process_group({.backend = backend,
                                   .init_method = absl::StrCat("file://", me.temp_dir, "/rdv"),
                                   .world_size = me.world_size,
                                   .rank = me.rank,
                                   .timeout = absl::Seconds(30)});
}

// torch.chunk's sizes, written out: 5 over 2 and 4, 3 over 2 and 4, 4 over 2.
std::vector<int64_t> Sizes(int64_t length, int n) {
  if (length == 5 && n == 2) return {3, 2};
  if (length == 5 && n == 4) return {2, 2, 1, 0};
  if (length == 3 && n == 2) return {2, 1};
  if (length == 3 && n == 4) return {1, 1, 1, 0};
  if (length == 4 && n == 2) return {2, 2};
  ADD_FAILURE() << "no sizes for " << length << " over " << n;
  return {};
}

// Chunk `index` of `full` along `dim` over `n` ranks.
Tensor Chunk(const Tensor& full, int64_t dim, int n, int index) {
  const std::vector<int64_t> sizes = Sizes(full.size(dim), n);
  int64_t offset = 0;
  for (int i = 0; i < index; ++i) offset += sizes[i];
  return full.narrow(dim, offset, sizes[index]).contiguous();
}

// The local piece of `full` laid out as `p` on a 1-D mesh (Partial: the
// summands the test uses, `full / n + (r - (n-1)/2)`, whose sum is `full`).
Tensor Piece(const Tensor& full, const Placement& p, int n, int r) {
  if (p.is_shard()) return Chunk(full, p.dim, n, r);
  if (p.is_partial()) return full / static_cast<double>(n) + (r - (n - 1) / 2.0);
  return full.clone();
}

// A leaf DTensor laid out as `p` whose value is `full`.
absl::StatusOr<DTensor> Source(const Tensor& full, const DeviceMesh& mesh, const Placement& p,
                               Tensor& leaf) {
  const int n = static_cast<int>(mesh.size());
  leaf = Piece(full, p, n, mesh.get_rank()).requires_grad_();
  return DTensor::from_local(leaf, mesh, {p},
                             {.shape = SizeVector(full.sizes().begin(), full.sizes().end())});
}

const Placements kAll = {Shard(0), Shard(1), Replicate(), Partial()};

absl::Status EveryPair(Rank& me) {
  const int n = me.world_size;
  const int r = me.rank;
  EMBER_ASSIGN_OR_RETURN(DeviceMesh mesh, dist::init_device_mesh("cpu", {n}));
  const Tensor x = arange(15, TensorOptions(kFloat32)).reshape({5, 3});
  const Tensor g = arange(15, TensorOptions(kFloat32)).reshape({5, 3}) * 0.5 - 3.0;
  for (const Placement& src : kAll) {
    for (const Placement& dst : kAll) {
      const std::string what = absl::StrCat(src.DebugString(), " -> ", dst.DebugString());
      if (src.is_shard() && dst.is_partial()) {
        Tensor leaf;
        EMBER_ASSIGN_OR_RETURN(DTensor d, Source(x, mesh, src, leaf));
        absl::StatusOr<DTensor> refused = d.redistribute({dst});
        EMBER_RETURN_IF_ERROR(Check(absl::IsInvalidArgument(refused.status()) &&
                                        absl::StrContains(refused.status().message(), "Partial"),
                                    absl::StrCat(what, ": ", refused.status().ToString())));
        continue;
      }
      // Forward: the local piece of the new layout, and the whole tensor.
      Tensor leaf;
      EMBER_ASSIGN_OR_RETURN(DTensor d, Source(x, mesh, src, leaf));
      EMBER_ASSIGN_OR_RETURN(DTensor out, d.redistribute({dst}));
      Tensor want;
      if (dst.is_shard()) {
        want = Chunk(x, dst.dim, n, r);
      } else if (dst.is_replicate()) {
        want = x;
      } else {
        want = src.is_partial() ? Piece(x, src, n, r) : x / static_cast<double>(n);
      }
      EMBER_ASSIGN_OR_RETURN(
          Tensor local, out.to_local(dst.is_partial() ? Placements{Replicate()} : Placements{dst}));
      EMBER_RETURN_IF_ERROR(CheckEqual(local, want, absl::StrCat(what, " local")));
      {
        // A replicated gradient g: the source gets its piece of g.
        Tensor weight = dst.is_shard() ? Chunk(g, dst.dim, n, r) : g;
        (local * weight).sum().backward();
        Tensor want_grad = src.is_shard() ? Chunk(g, src.dim, n, r) : g;
        EMBER_RETURN_IF_ERROR(CheckEqual(leaf.grad(), want_grad, absl::StrCat(what, " grad")));
      }
      {
        // The full tensor, through a fresh graph.
        Tensor leaf2;
        EMBER_ASSIGN_OR_RETURN(DTensor d2, Source(x, mesh, src, leaf2));
        EMBER_ASSIGN_OR_RETURN(DTensor out2, d2.redistribute({dst}));
        EMBER_ASSIGN_OR_RETURN(Tensor full, out2.full_tensor());
        EMBER_RETURN_IF_ERROR(CheckEqual(full, x, absl::StrCat(what, " full_tensor")));
      }
      if (dst.is_replicate()) {
        // A partial gradient: rank r sends (r + 1) * g, so the value's
        // gradient is (1 + ... + n) * g; a Shard source gets it by
        // reduce_scatter, the transposed collective of all_gather.
        Tensor leaf3;
        EMBER_ASSIGN_OR_RETURN(DTensor d3, Source(x, mesh, src, leaf3));
        EMBER_ASSIGN_OR_RETURN(DTensor out3, d3.redistribute({dst}));
        EMBER_ASSIGN_OR_RETURN(Tensor local3, out3.to_local({Partial()}));
        (local3 * (g * static_cast<double>(r + 1))).sum().backward();
        const Tensor total = g * (n * (n + 1) / 2.0);
        Tensor want_grad = src.is_shard() ? Chunk(total, src.dim, n, r) : total;
        EMBER_RETURN_IF_ERROR(
            CheckEqual(leaf3.grad(), want_grad, absl::StrCat(what, " partial grad")));
      }
    }
  }
  return absl::OkStatus();
}

struct Case {
  std::string backend;
  int ranks;
};

class DTensorPairsTest : public ::testing::TestWithParam<Case> {};

TEST_P(DTensorPairsTest, EveryRedistributePairWithGradients) {
  const Case c = GetParam();
  RunRanksOptions options;
  options.make_group = false;
  ExpectAllSucceeded(RunRankProcesses(
      c.ranks,
      [c](Rank& me) -> absl::Status {
        EMBER_RETURN_IF_ERROR(Init(me, c.backend));
        EMBER_RETURN_IF_ERROR(Guard([&] { return EveryPair(me); }));
        return dist::destroy_process_group();
      },
      options, absl::Seconds(120)));
}

INSTANTIATE_TEST_SUITE_P(Ranks, DTensorPairsTest,
                         ::testing::Values(Case{"tcp", 2}, Case{"tcp", 4}, Case{"gloo", 2},
                                           Case{"gloo", 4}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return absl::StrCat(info.param.backend, "_", info.param.ranks);
                         });

// A 2 x 2 mesh: layouts over both dimensions, and back to the whole tensor.
TEST(DTensor2DTest, TwoDimensionalLayouts) {
  RunRanksOptions options;
  options.make_group = false;
  ExpectAllSucceeded(RunRankProcesses(
      4,
      [](Rank& me) -> absl::Status {
        EMBER_RETURN_IF_ERROR(Init(me, "tcp"));
        EMBER_RETURN_IF_ERROR(Guard([&]() -> absl::Status {
          EMBER_ASSIGN_OR_RETURN(DeviceMesh mesh,
                                 dist::init_device_mesh("cpu", {2, 2}, {"dp", "tp"}));
          const int row = me.rank / 2;
          const int col = me.rank % 2;
          const Tensor x = arange(15, TensorOptions(kFloat32)).reshape({5, 3});
          // [Shard(0), Shard(1)]: rows by "dp", columns by "tp".
          Tensor leaf = Chunk(Chunk(x, 0, 2, row), 1, 2, col).requires_grad_();
          EMBER_ASSIGN_OR_RETURN(DTensor d, DTensor::from_local(leaf, mesh, {Shard(0), Shard(1)},
                                                                {.shape = SizeVector{5, 3}}));
          EMBER_ASSIGN_OR_RETURN(Tensor full, d.full_tensor());
          EMBER_RETURN_IF_ERROR(CheckEqual(full, x, "[S0, S1] full"));
          full.sum().backward();
          EMBER_RETURN_IF_ERROR(CheckEqual(leaf.grad(), ones_like(leaf), "[S0, S1] grad"));
          // Nested sharding is refused.
          absl::StatusOr<DTensor> nested = d.redistribute({Shard(0), Shard(0)});
          EMBER_RETURN_IF_ERROR(
              Check(absl::IsUnimplemented(nested.status()) &&
                        absl::StrContains(nested.status().message(), "tensor dimension 0"),
                    nested.status().ToString()));
          // [Shard(0), Shard(1)] -> [Shard(1), Shard(0)]: swapped.
          EMBER_ASSIGN_OR_RETURN(DTensor swapped, d.redistribute({Shard(1), Shard(0)}));
          EMBER_RETURN_IF_ERROR(
              CheckEqual(swapped.to_local(), Chunk(Chunk(x, 1, 2, row), 0, 2, col), "swapped"));
          // [Replicate, Partial] -> [Shard(0), Shard(1)]: a chunk, then a
          // reduce_scatter along "tp".
          Tensor summand = x * (col == 0 ? 0.25 : 0.75);
          EMBER_ASSIGN_OR_RETURN(DTensor p,
                                 DTensor::from_local(summand, mesh, {Replicate(), Partial()}));
          EMBER_ASSIGN_OR_RETURN(DTensor s, p.redistribute({Shard(0), Shard(1)}));
          EMBER_RETURN_IF_ERROR(
              CheckEqual(s.to_local(), Chunk(Chunk(x, 0, 2, row), 1, 2, col), "reduce_scatter"));
          // [Partial, Replicate] -> [Replicate, Replicate] along "dp" only.
          Tensor half = x * (row == 0 ? 0.5 : 0.5);
          EMBER_ASSIGN_OR_RETURN(DTensor q,
                                 DTensor::from_local(half, mesh, {Partial(), Replicate()}));
          EMBER_ASSIGN_OR_RETURN(Tensor qf, q.full_tensor());
          EMBER_RETURN_IF_ERROR(CheckEqual(qf, x, "partial over dp"));
          return absl::OkStatus();
        }));
        return dist::destroy_process_group();
      },
      options, absl::Seconds(120)));
}

TEST(DTensorErrorsTest, BadLayoutsNameTheValues) {
  RunRanksOptions options;
  options.make_group = false;
  ExpectAllSucceeded(RunRankProcesses(
      2,
      [](Rank& me) -> absl::Status {
        EMBER_RETURN_IF_ERROR(Init(me, "tcp"));
        EMBER_RETURN_IF_ERROR(Guard([&]() -> absl::Status {
          EMBER_ASSIGN_OR_RETURN(DeviceMesh mesh, dist::init_device_mesh("cpu", {2}));
          const Tensor x = ones({4, 3});
          absl::StatusOr<DTensor> count = DTensor::from_local(x, mesh, {Shard(0), Shard(1)});
          EMBER_RETURN_IF_ERROR(
              Check(absl::IsInvalidArgument(count.status()) &&
                        absl::StrContains(count.status().message(), "(Shard(dim=0), Shard(dim=1))"),
                    count.status().ToString()));
          absl::StatusOr<DTensor> range = DTensor::from_local(x, mesh, {Shard(2)});
          EMBER_RETURN_IF_ERROR(
              Check(absl::IsInvalidArgument(range.status()) &&
                        absl::StrContains(range.status().message(), "Shard(dim=2)"),
                    range.status().ToString()));
          absl::StatusOr<DTensor> shape =
              DTensor::from_local(x, mesh, {Shard(0)}, {.shape = SizeVector{12, 3}});
          EMBER_RETURN_IF_ERROR(Check(absl::IsInvalidArgument(shape.status()) &&
                                          absl::StrContains(shape.status().message(), "[12, 3]"),
                                      shape.status().ToString()));
          absl::StatusOr<DTensor> partial = distribute_tensor(x, mesh, {Partial()});
          EMBER_RETURN_IF_ERROR(
              Check(absl::IsInvalidArgument(partial.status()), partial.status().ToString()));
          // Even shards: the global shape is inferred.
          EMBER_ASSIGN_OR_RETURN(DTensor even, DTensor::from_local(x, mesh, {Shard(0)}));
          EMBER_RETURN_IF_ERROR(Check(even.shape() == SizeVector{8, 3}, even.DebugString()));
          // Two consumers asking for different gradient layouts.
          Tensor leaf = ones({4, 3}).requires_grad_();
          EMBER_ASSIGN_OR_RETURN(DTensor d, DTensor::from_local(leaf, mesh, {Replicate()}));
          EMBER_ASSIGN_OR_RETURN(Tensor a, d.to_local({Partial()}));
          absl::StatusOr<Tensor> b = d.to_local({Replicate()});
          EMBER_RETURN_IF_ERROR(Check(absl::IsInvalidArgument(b.status()) &&
                                          absl::StrContains(b.status().message(), "Partial(sum)"),
                                      b.status().ToString()));
          return absl::OkStatus();
        }));
        return dist::destroy_process_group();
      },
      options, absl::Seconds(60)));
}

}  // namespace
}  // namespace ember::parallel
