// Collation: a list of samples into one batch (torch.utils.data's
// default_collate).
//
//   ```cpp
//   #include "tensor/status_macros.h"
//   #include "data/collate.h"
//   #include "tensor/factories.h"
//   namespace data = ember::data;
//   std::vector<data::Sample> samples = {
//       data::Sample::List{ember::ones({3}), data::Sample(1)},
//       data::Sample::List{ember::zeros({3}), data::Sample(0)}};
//   EMBER_ASSIGN_OR_RETURN(data::Sample batch, data::default_collate(samples));
//   // batch: [a 2x3 float32 tensor, an int64 tensor [1, 0]]
//   ```
//
// default_collate, as torch's: tensors are stacked along a new first
// dimension (equal shapes and dtypes); ints become an int64 tensor, doubles
// a float64 one, bools a bool one; strings stay a list of strings; lists
// (torch's tuples and sequences, which must have equal lengths) and dicts
// (each key of the first sample, which every sample must have) are collated
// element by element. In a DataLoader worker the stacked tensors are created
// in shared memory (multiprocessing::empty_shared), so the batch crosses to
// the loop without another copy. Anything else (None, channels) is an
// InvalidArgument naming what was found and where.
#ifndef EMBER_DATA_COLLATE_H_
#define EMBER_DATA_COLLATE_H_

#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "data/dataset.h"

namespace ember::data {

// What a DataLoader calls to make a batch of its samples.
using CollateFn = std::function<absl::StatusOr<Sample>(std::vector<Sample> samples)>;

absl::StatusOr<Sample> default_collate(std::vector<Sample> samples);

}  // namespace ember::data

#endif  // EMBER_DATA_COLLATE_H_
