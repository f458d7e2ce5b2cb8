// pin_memory on a machine with a GPU: every tensor of a batch arrives in
// pinned host memory, ready for a non_blocking copy, from the loop and from
// workers. Skips without a usable device, saying why.
#include <memory>
#include <vector>

#include "cuda/device.h"
#include "data/dataloader.h"
#include "data/dataset.h"
#include "gtest/gtest.h"
#include "tensor/factories.h"
#include "third_party/cuda/device_check.h"

namespace ember::data {
namespace {

TEST(PinMemoryCudaTest, BatchesArriveInPinnedMemoryAndCopyToTheDevice) {
  EMBER_SKIP_WITHOUT_CUDA();
  auto ds = std::make_shared<TensorDataset>(
      std::vector<Tensor>{arange(64, kFloat32).reshape({16, 4}), arange(16)});
  for (int workers : {0, 2}) {
    absl::StatusOr<DataLoader> loader =
        DataLoader::create(ds, {.batch_size = 4, .num_workers = workers, .pin_memory = true});
    ASSERT_TRUE(loader.ok()) << loader.status();
    absl::StatusOr<DataLoaderIterator> it = loader->iter();
    ASSERT_TRUE(it.ok());
    int batches = 0;
    while (true) {
      absl::StatusOr<std::optional<Sample>> b = it->next();
      ASSERT_TRUE(b.ok()) << b.status();
      if (!b->has_value()) break;
      for (const Sample& part : (*b)->list()) {
        const Tensor t = *part.get_if<Tensor>();
        EXPECT_TRUE(t.is_pinned()) << workers << " workers, batch " << batches;
        const Tensor on_device = t.to(Device(DeviceType::kCUDA, 0), /*non_blocking=*/true);
        EXPECT_TRUE(on_device.cpu().equal(t));
      }
      ++batches;
    }
    EXPECT_EQ(batches, 4);
  }
}

}  // namespace
}  // namespace ember::data
