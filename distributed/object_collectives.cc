#include "distributed/object_collectives.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"

// Note [Object collectives on the wire]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// An object travels as its pickle (protocol 4, pickle.Pickler's default and
// what torch's _object_to_tensor writes) in a uint8 tensor, its length in a
// one-element int64 tensor. Each op issues the tensor collectives PyTorch
// 2.x's distributed_c10d.py issues, in its order and with its shapes, so a
// PyTorch rank of the same group takes part in every step:
//   broadcast_object_list  broadcast(int64[k] sizes); broadcast(uint8[sum])
//   all_gather_object      all_gather_into_tensor(int64[n] <- int64[1]);
//                          all_gather_into_tensor(uint8[n*max] <- uint8[max])
//   gather_object          all_gather(n x int64[1] <- int64[1]);
//                          gather(uint8[max] -> n x uint8[max] on dst)
//   scatter_object_list    broadcast(int64[1] max); scatter(uint8[max]);
//                          scatter(int64[1] size)
//   send/recv_object_list  send(int64[k] sizes); send(uint8[sum]), tag 0
// where max is the largest pickle of the op; shorter pickles are padded
// with zeros to it and cut back to their own size before unpickling.

namespace ember::distributed {
namespace {

struct Membership {
  int group_rank = -1;
  int group_size = 0;
  int global_rank = -1;
};

absl::StatusOr<Membership> Member(const char* op, const Group& group) {
  if (!is_initialized()) {
    return absl::FailedPreconditionError(
        absl::StrCat(op,
                     ": the default process group is not initialised; call "
                     "init_process_group first"));
  }
  Membership m;
  m.global_rank = get_rank();
  m.group_rank = get_rank(group);
  if (m.group_rank < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(op, ": rank ", m.global_rank,
                     " is not a member of the group it was called on; call it only on the "
                     "group's ranks"));
  }
  m.group_size = get_world_size(group);
  return m;
}

absl::StatusOr<std::string> Pickle(const char* op, const PickleValue& obj) {
  absl::StatusOr<std::string> bytes = serialization::pickle_value(obj);
  if (!bytes.ok()) {
    return absl::Status(bytes.status().code(), absl::StrCat(op, ": ", bytes.status().message()));
  }
  return bytes;
}

// A uint8 tensor of `bytes`, zero-padded to `size` bytes.
Tensor ByteTensor(const std::string& bytes, int64_t size) {
  Tensor t = zeros({size}, kUInt8);
  if (!bytes.empty()) std::memcpy(t.raw_data(), bytes.data(), bytes.size());
  return t;
}

Tensor SizeTensor(absl::Span<const int64_t> sizes) {
  Tensor t = empty({static_cast<int64_t>(sizes.size())}, kInt64);
  if (!sizes.empty()) std::memcpy(t.raw_data(), sizes.data(), sizes.size() * sizeof(int64_t));
  return t;
}

// The object pickled in the first `size` bytes at `data` (which holds
// `capacity` bytes), sent by `from` (for messages).
absl::StatusOr<PickleValue> Unpickle(const char* op, const Tensor& t, int64_t offset, int64_t size,
                                     const std::string& from) {
  if (size < 0 || offset < 0 || offset + size > t.numel()) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", from, " announced an object of ", size,
                                                   " bytes that its ", t.numel(),
                                                   "-byte message does not hold"));
  }
  const char* data = static_cast<const char*>(t.raw_data()) + offset;
  absl::StatusOr<PickleValue> v =
      serialization::unpickle_value(absl::string_view(data, static_cast<size_t>(size)));
  if (!v.ok()) {
    return absl::Status(v.status().code(),
                        absl::StrCat(op, ": the object from ", from, ": ", v.status().message()));
  }
  return v;
}

int64_t SizeAt(const Tensor& sizes, int64_t i) { return sizes.data_ptr<int64_t>()[i]; }

absl::StatusOr<int64_t> SumOfSizes(const char* op, const Tensor& sizes, const std::string& from) {
  int64_t total = 0;
  for (int64_t i = 0; i < sizes.numel(); ++i) {
    const int64_t s = SizeAt(sizes, i);
    if (s < 0 || __builtin_add_overflow(total, s, &total)) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": ", from, " announced an object of ", s, " bytes"));
    }
  }
  return total;
}

}  // namespace

absl::Status broadcast_object_list(absl::Span<PickleValue> object_list, int src,
                                   const Group& group) {
  constexpr char kOp[] = "broadcast_object_list";
  EMBER_ASSIGN_OR_RETURN(const Membership me, Member(kOp, group));
  if (object_list.empty()) return absl::OkStatus();
  const int64_t k = static_cast<int64_t>(object_list.size());
  const bool is_src = me.global_rank == src;
  std::string all;
  Tensor sizes;
  if (is_src) {
    std::vector<int64_t> lengths;
    for (const PickleValue& obj : object_list) {
      EMBER_ASSIGN_OR_RETURN(std::string bytes, Pickle(kOp, obj));
      lengths.push_back(static_cast<int64_t>(bytes.size()));
      all += bytes;
    }
    sizes = SizeTensor(lengths);
  } else {
    sizes = zeros({k}, kInt64);
  }
  EMBER_RETURN_IF_ERROR(broadcast(sizes, src, group));
  const std::string from = absl::StrCat("rank ", src);
  EMBER_ASSIGN_OR_RETURN(const int64_t total, SumOfSizes(kOp, sizes, from));
  Tensor payload = is_src ? ByteTensor(all, total) : empty({total}, kUInt8);
  EMBER_RETURN_IF_ERROR(broadcast(payload, src, group));
  if (is_src) return absl::OkStatus();
  int64_t offset = 0;
  for (int64_t i = 0; i < k; ++i) {
    EMBER_ASSIGN_OR_RETURN(object_list[i], Unpickle(kOp, payload, offset, SizeAt(sizes, i), from));
    offset += SizeAt(sizes, i);
  }
  return absl::OkStatus();
}

absl::Status all_gather_object(absl::Span<PickleValue> object_list, const PickleValue& obj,
                               const Group& group) {
  constexpr char kOp[] = "all_gather_object";
  EMBER_ASSIGN_OR_RETURN(const Membership me, Member(kOp, group));
  const int n = me.group_size;
  if (static_cast<int>(object_list.size()) != n) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": object_list has ", object_list.size(),
                                                   " entries; it needs one per rank of the group (",
                                                   n, ")"));
  }
  EMBER_ASSIGN_OR_RETURN(const std::string bytes, Pickle(kOp, obj));
  const int64_t mine = static_cast<int64_t>(bytes.size());
  Tensor sizes = zeros({n}, kInt64);
  EMBER_RETURN_IF_ERROR(all_gather_into_tensor(sizes, SizeTensor({mine}), group));
  int64_t max = 0;
  for (int r = 0; r < n; ++r) max = std::max(max, SizeAt(sizes, r));
  Tensor out = empty({max * n}, kUInt8);
  EMBER_RETURN_IF_ERROR(all_gather_into_tensor(out, ByteTensor(bytes, max), group));
  for (int r = 0; r < n; ++r) {
    EMBER_ASSIGN_OR_RETURN(object_list[r], Unpickle(kOp, out, max * r, SizeAt(sizes, r),
                                                    absl::StrCat("group rank ", r)));
  }
  return absl::OkStatus();
}

absl::Status gather_object(const PickleValue& obj, absl::Span<PickleValue> object_gather_list,
                           int dst, const Group& group) {
  constexpr char kOp[] = "gather_object";
  EMBER_ASSIGN_OR_RETURN(const Membership me, Member(kOp, group));
  const int n = me.group_size;
  const bool is_dst = me.global_rank == dst;
  if (is_dst && static_cast<int>(object_gather_list.size()) != n) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": object_gather_list has ", object_gather_list.size(),
                     " entries on the destination rank ", dst,
                     "; it needs one per rank of the group (", n, ")"));
  }
  EMBER_ASSIGN_OR_RETURN(const std::string bytes, Pickle(kOp, obj));
  std::vector<Tensor> sizes;
  for (int r = 0; r < n; ++r) sizes.push_back(zeros({1}, kInt64));
  EMBER_RETURN_IF_ERROR(all_gather(sizes, SizeTensor({static_cast<int64_t>(bytes.size())}), group));
  int64_t max = 0;
  for (const Tensor& s : sizes) max = std::max(max, SizeAt(s, 0));
  std::vector<Tensor> outs;
  if (is_dst) {
    for (int r = 0; r < n; ++r) outs.push_back(empty({max}, kUInt8));
  }
  EMBER_RETURN_IF_ERROR(gather(ByteTensor(bytes, max), outs, dst, group));
  for (int r = 0; r < static_cast<int>(outs.size()); ++r) {
    EMBER_ASSIGN_OR_RETURN(object_gather_list[r], Unpickle(kOp, outs[r], 0, SizeAt(sizes[r], 0),
                                                           absl::StrCat("group rank ", r)));
  }
  return absl::OkStatus();
}

absl::Status scatter_object_list(absl::Span<PickleValue> scatter_object_output_list,
                                 absl::Span<const PickleValue> scatter_object_input_list, int src,
                                 const Group& group) {
  constexpr char kOp[] = "scatter_object_list";
  EMBER_ASSIGN_OR_RETURN(const Membership me, Member(kOp, group));
  if (scatter_object_output_list.empty()) {
    return absl::InvalidArgumentError(
        "Expected argument scatter_object_output_list to be a list of size at least 1.");
  }
  const int n = me.group_size;
  const bool is_src = me.global_rank == src;
  std::vector<Tensor> pieces, piece_sizes;
  Tensor max = zeros({1}, kInt64);
  if (is_src) {
    if (static_cast<int>(scatter_object_input_list.size()) != n) {
      return absl::InvalidArgumentError(absl::StrCat(
          kOp, ": scatter_object_input_list has ", scatter_object_input_list.size(),
          " entries on the source rank ", src, "; it needs one per rank of the group (", n, ")"));
    }
    std::vector<std::string> pickles;
    int64_t longest = 0;
    for (const PickleValue& obj : scatter_object_input_list) {
      EMBER_ASSIGN_OR_RETURN(std::string bytes, Pickle(kOp, obj));
      longest = std::max<int64_t>(longest, bytes.size());
      pickles.push_back(std::move(bytes));
    }
    for (const std::string& p : pickles) {
      pieces.push_back(ByteTensor(p, longest));
      piece_sizes.push_back(SizeTensor({static_cast<int64_t>(p.size())}));
    }
    max = SizeTensor({longest});
  }
  EMBER_RETURN_IF_ERROR(broadcast(max, src, group));
  const int64_t capacity = SizeAt(max, 0);
  if (capacity < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": rank ", src, " announced objects of ", capacity, " bytes"));
  }
  Tensor out = empty({capacity}, kUInt8);
  EMBER_RETURN_IF_ERROR(scatter(out, pieces, src, group));
  Tensor size = zeros({1}, kInt64);
  EMBER_RETURN_IF_ERROR(scatter(size, piece_sizes, src, group));
  EMBER_ASSIGN_OR_RETURN(scatter_object_output_list[0],
                         Unpickle(kOp, out, 0, SizeAt(size, 0), absl::StrCat("rank ", src)));
  return absl::OkStatus();
}

absl::Status send_object_list(absl::Span<const PickleValue> object_list, int dst,
                              const Group& group) {
  constexpr char kOp[] = "send_object_list";
  EMBER_ASSIGN_OR_RETURN(const Membership me, Member(kOp, group));
  if (dst == me.global_rank) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp,
                     ": Invalid destination rank: destination rank should not be the same "
                     "as the current rank (",
                     dst, ")"));
  }
  if (object_list.empty()) return absl::OkStatus();
  std::vector<int64_t> lengths;
  std::string all;
  for (const PickleValue& obj : object_list) {
    EMBER_ASSIGN_OR_RETURN(std::string bytes, Pickle(kOp, obj));
    lengths.push_back(static_cast<int64_t>(bytes.size()));
    all += bytes;
  }
  EMBER_RETURN_IF_ERROR(send(SizeTensor(lengths), dst, group));
  return send(ByteTensor(all, static_cast<int64_t>(all.size())), dst, group);
}

absl::StatusOr<int> recv_object_list(absl::Span<PickleValue> object_list, int src,
                                     const Group& group) {
  constexpr char kOp[] = "recv_object_list";
  EMBER_ASSIGN_OR_RETURN(const Membership me, Member(kOp, group));
  if (src == me.global_rank) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp,
                     ": Invalid source rank: source rank should not be the same as the "
                     "current rank (",
                     src, ")"));
  }
  if (object_list.empty()) return src;
  Tensor sizes = zeros({static_cast<int64_t>(object_list.size())}, kInt64);
  EMBER_ASSIGN_OR_RETURN(const int sender, recv(sizes, src, group));
  const std::string from = absl::StrCat("rank ", sender);
  EMBER_ASSIGN_OR_RETURN(const int64_t total, SumOfSizes(kOp, sizes, from));
  Tensor payload = empty({total}, kUInt8);
  EMBER_ASSIGN_OR_RETURN(const int again, recv(payload, sender, group));
  if (again != sender) {
    return absl::InternalError(absl::StrCat(kOp, ": the sizes came from rank ", sender,
                                            " and the objects from rank ", again));
  }
  int64_t offset = 0;
  for (size_t i = 0; i < object_list.size(); ++i) {
    EMBER_ASSIGN_OR_RETURN(object_list[i], Unpickle(kOp, payload, offset, SizeAt(sizes, i), from));
    offset += SizeAt(sizes, i);
  }
  return sender;
}

}  // namespace ember::distributed
