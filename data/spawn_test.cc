// DataLoader workers started by spawn and forkserver: fresh processes of
// this binary that rebuild the dataset from its recipe() give the batches
// forked workers give; a recipe this binary cannot rebuild stops the epoch
// with the factory's name.
#include <memory>
#include <string>
#include <vector>

#include "data/dataloader.h"
#include "data/dataset.h"
#include "data/record_file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "multiprocessing/process.h"
#include "tensor/factories.h"

namespace ember::data {
namespace {

using ::testing::HasSubstr;

// Sample i: [i * factor, the worker's id], built from the recipe {factor}.
class Scaled : public Dataset {
 public:
  explicit Scaled(int64_t factor, std::string factory = "test.Scaled")
      : factor_(factor), factory_(std::move(factory)) {}
  int64_t size() const override { return 20; }
  absl::StatusOr<Sample> get(int64_t index) override {
    const WorkerInfo* w = get_worker_info();
    return Sample(Sample::List{Sample(index * factor_), Sample(w != nullptr ? w->id : -1)});
  }
  std::optional<Recipe> recipe() const override { return Recipe{factory_, Sample(factor_)}; }

 private:
  int64_t factor_;
  std::string factory_;
};

absl::StatusOr<std::shared_ptr<Dataset>> MakeScaled(const Sample& args) {
  absl::StatusOr<int64_t> factor = args.as<int64_t>();
  if (!factor.ok()) return factor.status();
  return std::shared_ptr<Dataset>(std::make_shared<Scaled>(*factor));
}
EMBER_REGISTER_DATASET_FACTORY("test.Scaled", MakeScaled);

class SpawnTest : public ::testing::TestWithParam<std::string> {
 protected:
  // A spawned worker is this binary again: it runs its entry point here.
  void SetUp() override { multiprocessing::maybe_run_spawned_child(); }
};

std::vector<std::string> Epoch(DataLoader& loader) {
  absl::StatusOr<DataLoaderIterator> it = loader.iter();
  EXPECT_TRUE(it.ok()) << it.status();
  std::vector<std::string> out;
  while (true) {
    absl::StatusOr<std::optional<Sample>> b = it->next();
    EXPECT_TRUE(b.ok()) << b.status();
    if (!b.ok() || !b->has_value()) break;
    std::string text;
    for (const Sample& part : (*b)->list()) {
      const Tensor t = part.get_if<Tensor>()->to(kFloat64).contiguous();
      for (int64_t i = 0; i < t.numel(); ++i) text += std::to_string(t.data_ptr<double>()[i]) + " ";
      text += "| ";
    }
    out.push_back(text);
  }
  return out;
}

TEST_P(SpawnTest, WorkersRebuildATensorDatasetAndGiveForksBatches) {
  auto ds = std::make_shared<TensorDataset>(
      std::vector<Tensor>{arange(300, kFloat32).reshape({100, 3}), arange(100)});
  std::vector<std::vector<std::string>> runs;
  for (const std::string& method : {std::string("fork"), GetParam()}) {
    Generator g(9);
    absl::StatusOr<DataLoader> loader = DataLoader::create(ds, {.batch_size = 8,
                                                                .shuffle = true,
                                                                .num_workers = 2,
                                                                .multiprocessing_context = method,
                                                                .generator = &g});
    ASSERT_TRUE(loader.ok()) << loader.status();
    runs.push_back(Epoch(*loader));
  }
  ASSERT_EQ(runs[0].size(), 13u);
  EXPECT_EQ(runs[1], runs[0]);
}

TEST_P(SpawnTest, ARegisteredFactoryRebuildsACustomDataset) {
  absl::StatusOr<DataLoader> loader = DataLoader::create(
      std::make_shared<Scaled>(7),
      {.batch_size = 4, .num_workers = 2, .multiprocessing_context = GetParam()});
  ASSERT_TRUE(loader.ok()) << loader.status();
  const std::vector<std::string> batches = Epoch(*loader);
  ASSERT_EQ(batches.size(), 5u);
  // Batch 1 is samples 4..7 (times 7), made by worker 1.
  EXPECT_EQ(batches[1],
            "28.000000 35.000000 42.000000 49.000000 | 1.000000 1.000000 1.000000 "
            "1.000000 | ");
}

TEST_P(SpawnTest, ARecordFileIsOpenedAgainInEachWorker) {
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/spawn.records";
  {
    absl::StatusOr<RecordWriter> w = RecordWriter::create(path);
    ASSERT_TRUE(w.ok());
    for (int i = 0; i < 6; ++i) ASSERT_TRUE(w->append(std::string(i + 1, 'a' + i), i).ok());
    ASSERT_TRUE(w->close().ok());
  }
  absl::StatusOr<std::shared_ptr<RecordDataset>> records = RecordDataset::open(path);
  ASSERT_TRUE(records.ok());
  absl::StatusOr<DataLoader> loader = DataLoader::create(
      *records,
      {.batch_size = std::nullopt, .num_workers = 2, .multiprocessing_context = GetParam()});
  ASSERT_TRUE(loader.ok()) << loader.status();
  absl::StatusOr<DataLoaderIterator> it = loader->iter();
  for (int i = 0; i < 6; ++i) {
    absl::StatusOr<std::optional<Sample>> s = it->next();
    ASSERT_TRUE(s.ok()) << s.status();
    const Tensor bytes = *(*s)->list()[0].get_if<Tensor>();
    EXPECT_EQ(std::string(static_cast<const char*>(bytes.raw_data()), bytes.numel()),
              std::string(i + 1, 'a' + i));
    EXPECT_EQ(*(*s)->list()[1].get_if<int64_t>(), i);
  }
}

TEST_P(SpawnTest, ARecipeThisBinaryCannotRebuildIsNamed) {
  absl::StatusOr<DataLoader> loader = DataLoader::create(
      std::make_shared<Scaled>(1, "test.NotRegistered"),
      {.batch_size = 4, .num_workers = 1, .multiprocessing_context = GetParam()});
  ASSERT_TRUE(loader.ok()) << loader.status();
  absl::StatusOr<DataLoaderIterator> it = loader->iter();
  ASSERT_TRUE(it.ok());
  absl::Status failure = it->next().status();
  EXPECT_EQ(failure.code(), absl::StatusCode::kAborted) << failure;
  EXPECT_THAT(std::string(failure.message()),
              HasSubstr("no dataset factory is registered as 'test.NotRegistered'"));
}

INSTANTIATE_TEST_SUITE_P(Methods, SpawnTest, ::testing::Values("spawn", "forkserver"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace ember::data
