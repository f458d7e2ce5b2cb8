// torch.distributed's object collectives for C++ values: broadcast_object_list,
// all_gather_object, gather_object, scatter_object_list, send_object_list
// and recv_object_list, over the default group or a Group, carrying
// serialization::PickleValue (None, bool, int, float, str, bytes, lists,
// tuples, str- or int-keyed dicts, CPU tensors; nested).
//
//   ```cpp compile-only
//   #include "distributed/object_collectives.h"
//   namespace dist = ember::distributed;
//   using ember::serialization::PickleValue;
//   std::vector<PickleValue> objects(dist::get_world_size());
//   EMBER_RETURN_IF_ERROR(dist::all_gather_object(
//       absl::MakeSpan(objects), PickleValue::Dict({{"rank", dist::get_rank()}, {"host", "node7"}})));
//   std::vector<PickleValue> config = {nullptr};
//   if (dist::get_rank() == 0) config[0] = PickleValue::List({0.1, "adam"});
//   EMBER_RETURN_IF_ERROR(dist::broadcast_object_list(absl::MakeSpan(config), /*src=*/0));
//   ```
//
// Wire format (Note [Object collectives on the wire] in object_collectives.cc):
// each object travels as Python's pickle of it (protocol 4), in uint8 tensors,
// after an int64 tensor of the pickles' sizes, in exactly the sequence of
// tensor collectives PyTorch 2.x's distributed_c10d.py issues, so Ember and
// PyTorch ranks of one gloo group exchange objects both ways
// (distributed/gloo/torch_objects_test). Tensors inside objects travel as
// PyTorch pickles them (serialization/pickle_value.h) and arrive as CPU
// tensors; a CUDA tensor inside an object is refused (move it to the CPU),
// and the byte tensors always live on the CPU, so groups whose backend has
// no CPU path (nccl alone) cannot carry objects: use a "cpu:gloo,cuda:nccl"
// group, as torch does for CPU objects.
//
// As in torch, src and dst are global ranks, output lists are sized by the
// caller, and every member must make the same calls in the same order; the
// ops block until done or the group's timeout (kDeadlineExceeded).
//
// Errors: InvalidArgument for a value the pickle cannot carry (named, from
// pickle_value) or a received pickle the unpickler refuses, and for list
// sizes that do not fit (PyTorch's wording where it has one);
// FailedPrecondition before init_process_group or on a rank that is not a
// member of the group; otherwise the errors of the tensor collectives
// (distributed.h).
//
// Thread-safety: as the tensor collectives; calls on one group must not be
// issued concurrently from several threads (their order must match across
// ranks).
#ifndef EMBER_DISTRIBUTED_OBJECT_COLLECTIVES_H_
#define EMBER_DISTRIBUTED_OBJECT_COLLECTIVES_H_

#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "distributed/distributed.h"
#include "serialization/pickle_value.h"

namespace ember::distributed {

using ::ember::serialization::PickleValue;

// Every rank's objects become src's (torch.distributed.broadcast_object_list):
// on src, `object_list` is read; elsewhere it is overwritten, and must have
// as many entries as src's. An empty list sends nothing (torch raises).
absl::Status broadcast_object_list(absl::Span<PickleValue> object_list, int src = 0,
                                   const Group& group = nullptr);

// object_list[i] = the object of the group's rank i, on every rank.
// `object_list` must have one entry per rank of the group.
absl::Status all_gather_object(absl::Span<PickleValue> object_list, const PickleValue& obj,
                               const Group& group = nullptr);

// On dst, object_gather_list[i] = the object of the group's rank i; it must
// have one entry per rank there and is ignored elsewhere (pass {}).
absl::Status gather_object(const PickleValue& obj, absl::Span<PickleValue> object_gather_list,
                           int dst = 0, const Group& group = nullptr);

// scatter_object_output_list[0] = the group's rank i's entry of src's
// scatter_object_input_list (one per rank of the group; ignored elsewhere).
// The output list needs at least one entry.
absl::Status scatter_object_list(absl::Span<PickleValue> scatter_object_output_list,
                                 absl::Span<const PickleValue> scatter_object_input_list,
                                 int src = 0, const Group& group = nullptr);

// Sends `object_list` to global rank dst, which receives it with
// recv_object_list into a list of the same size. An empty list sends
// nothing.
absl::Status send_object_list(absl::Span<const PickleValue> object_list, int dst,
                              const Group& group = nullptr);
// Fills `object_list` from src's send_object_list (kAnySource: whichever
// rank sends first) and returns the sender's global rank.
absl::StatusOr<int> recv_object_list(absl::Span<PickleValue> object_list, int src = kAnySource,
                                     const Group& group = nullptr);

}  // namespace ember::distributed

#endif  // EMBER_DISTRIBUTED_OBJECT_COLLECTIVES_H_
