// Modules across processes: a parent hands over the state of a module whose
// parameters and buffers are in shared memory, and a child rebuilds its own
// module of the same architecture onto the same bytes, as PyTorch rebuilds a
// module pickled for a spawned child from its shared storages. A C++ module
// cannot be sent itself (its code is not data), so the child constructs one
// and points every tensor of it at the shared bytes; afterwards the two
// processes train one set of parameters (Hogwild), each with its own
// gradients and optimizer.
//
//   ```cpp
//   #include "multiprocessing/module_state.h"
//   #include "nn/linear.h"
//   namespace mp = ember::multiprocessing;
//   // parent
//   auto model = std::make_shared<ember::nn::Linear>(4, 2);
//   EMBER_RETURN_IF_ERROR(model->share_memory());
//   EMBER_ASSIGN_OR_RETURN(mp::Value state, mp::share_state(model->state_dict()));
//   // ... spawn.spawn("train", {state}, /*nprocs=*/2), with `spawn` from
//   // mp::get_context("spawn"); then, in the entry point "train" (args[0]):
//   auto replica = std::make_shared<ember::nn::Linear>(4, 2);  // the same architecture
//   EMBER_RETURN_IF_ERROR(mp::load_shared_state(replica->state_dict(), state));
//   // replica->weight() now views the bytes of model->weight()
//   ```
//
// `state` is the module's state_dict() (tensors sharing storage with the
// module), an ember::StateDict; this layer takes it without depending on
// nn. Thread-safety: as the tensors'; do not run the module meanwhile.
#ifndef EMBER_MULTIPROCESSING_MODULE_STATE_H_
#define EMBER_MULTIPROCESSING_MODULE_STATE_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "multiprocessing/value.h"
#include "serialization/state_dict.h"
#include "tensor/tensor.h"

namespace ember::multiprocessing {

// Moves every tensor of `state` into shared memory (a no-op for those already
// there, e.g. after Module::share_memory()) and returns them as a dict from
// name to tensor, ready to be passed to a child. Errors: those of
// share_memory_.
absl::StatusOr<Value> share_state(const StateDict& state);

// Points every tensor of `state` (the child's own module's state_dict()) at
// the shared bytes of the tensor under the same name in `shared` (a dict from
// share_state): writes on either side are then seen by both. Each pair must
// match in dtype, sizes, strides, offset and storage size. InvalidArgument
// naming every missing, unexpected or mismatched entry; nothing is changed
// then.
absl::Status load_shared_state(const StateDict& state, const Value& shared);

}  // namespace ember::multiprocessing

#endif  // EMBER_MULTIPROCESSING_MODULE_STATE_H_
