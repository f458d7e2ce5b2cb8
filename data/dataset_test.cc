// Datasets and default_collate: what each returns, and the errors that name
// the offending value.
#include "data/dataset.h"

#include <memory>
#include <string>
#include <vector>

#include "data/collate.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/error.h"
#include "tensor/factories.h"

namespace ember::data {
namespace {

using ::testing::HasSubstr;

Tensor At(const Sample& s, size_t i) { return *s.list().at(i).get_if<Tensor>(); }

TEST(TensorDatasetTest, SampleIIsEveryTensorsRowI) {
  TensorDataset ds({arange(12, kFloat32).reshape({4, 3}), arange(4)});
  EXPECT_EQ(ds.size(), 4);
  absl::StatusOr<Sample> s = ds.get(2);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->list().size(), 2u);
  EXPECT_TRUE(At(*s, 0).equal(tensor({6.0f, 7.0f, 8.0f})));
  EXPECT_EQ(At(*s, 1).item<int64_t>(), 2);
  absl::StatusOr<Sample> out = ds.get(4);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(std::string(out.status().message()),
              HasSubstr("index 4 is out of range for a dataset of 4 samples"));
}

TEST(TensorDatasetTest, RefusesTensorsOfDifferentLengths) {
  try {
    TensorDataset ds({zeros({4, 2}), zeros({5})});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("tensor 0 has 4 samples and tensor 1 has 5"));
  }
}

TEST(SubsetAndConcatTest, MapIndicesThrough) {
  auto base = std::make_shared<TensorDataset>(std::vector<Tensor>{arange(10)});
  Subset sub(base, {7, 2, 9});
  EXPECT_EQ(sub.size(), 3);
  EXPECT_EQ(At(*sub.get(1), 0).item<int64_t>(), 2);
  EXPECT_EQ(sub.get(3).status().code(), absl::StatusCode::kOutOfRange);

  auto second = std::make_shared<TensorDataset>(std::vector<Tensor>{arange(100, 105)});
  ConcatDataset both({base, second});
  EXPECT_EQ(both.size(), 15);
  EXPECT_EQ(both.cumulative_sizes(), (std::vector<int64_t>{10, 15}));
  EXPECT_EQ(At(*both.get(9), 0).item<int64_t>(), 9);
  EXPECT_EQ(At(*both.get(10), 0).item<int64_t>(), 100);
  EXPECT_EQ(At(*both.get(-1), 0).item<int64_t>(), 104);  // from the end, as torch
  EXPECT_EQ(both.get(-16).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(both.get(15).status().code(), absl::StatusCode::kOutOfRange);
}

TEST(RandomSplitTest, PartsCoverTheDatasetOnceAndBadLengthsAreNamed) {
  auto base = std::make_shared<TensorDataset>(std::vector<Tensor>{arange(10)});
  Generator g(1);
  absl::StatusOr<std::vector<std::shared_ptr<Subset>>> parts = random_split(base, {0.5, 0.5}, g);
  ASSERT_TRUE(parts.ok()) << parts.status();
  std::vector<int64_t> all = (*parts)[0]->indices();
  all.insert(all.end(), (*parts)[1]->indices().begin(), (*parts)[1]->indices().end());
  std::sort(all.begin(), all.end());
  EXPECT_EQ(all, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));

  auto bad = random_split(base, {3, 4}, g);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()),
              HasSubstr("the lengths sum to 7 but the dataset has 10 samples"));
  bad = random_split(base, {2.5, 7.5}, g);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("length 0 (2.5) is not a whole"));
  bad = random_split(base, {1.5, -0.5}, g);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("fraction 0 (1.5)"));
}

TEST(DefaultCollateTest, StacksTensorsAndTurnsNumbersIntoTensors) {
  std::vector<Sample> samples;
  for (int i = 0; i < 3; ++i) {
    samples.push_back(Sample::List{
        Sample(full({2}, static_cast<double>(i), kFloat32)), Sample(i), Sample(i * 0.5),
        Sample(i % 2 == 0), Sample(std::string("s") + std::to_string(i)),
        Sample::Dict{{"y", Sample(10 + i)}, {"z", Sample::List{Sample(i), Sample(-i)}}}});
  }
  absl::StatusOr<Sample> batch = default_collate(samples);
  ASSERT_TRUE(batch.ok()) << batch.status();
  const Sample::List& b = batch->list();
  ASSERT_EQ(b.size(), 6u);
  EXPECT_TRUE(
      b[0].get_if<Tensor>()->equal(tensor(std::vector<float>{0, 0, 1, 1, 2, 2}, SizeVector{3, 2})));
  EXPECT_TRUE(b[1].get_if<Tensor>()->equal(tensor(std::vector<int64_t>{0, 1, 2})));
  EXPECT_EQ(b[2].get_if<Tensor>()->dtype(), kFloat64);
  EXPECT_TRUE(b[2].get_if<Tensor>()->equal(tensor(std::vector<double>{0, 0.5, 1})));
  EXPECT_EQ(b[3].get_if<Tensor>()->dtype(), kBool);
  EXPECT_EQ(b[3].get_if<Tensor>()->to(kInt64).sum().item<int64_t>(), 2);
  ASSERT_EQ(b[4].list().size(), 3u);
  EXPECT_EQ(*b[4].list()[2].get_if<std::string>(), "s2");
  EXPECT_TRUE(b[5].find("y")->get_if<Tensor>()->equal(tensor(std::vector<int64_t>{10, 11, 12})));
  EXPECT_TRUE(
      b[5].find("z")->list()[1].get_if<Tensor>()->equal(tensor(std::vector<int64_t>{0, -1, -2})));
}

TEST(DefaultCollateTest, MismatchesNameWhereAndWhat) {
  auto message = [](std::vector<Sample> samples) {
    absl::StatusOr<Sample> b = default_collate(std::move(samples));
    EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(b.status().message());
  };
  EXPECT_THAT(
      message({Sample::List{Sample(zeros({3}))}, Sample::List{Sample(zeros({4}))}}),
      HasSubstr("[3] float32 on cpu at entry 0 and [4] float32 on cpu at entry 1 (at [0])"));
  EXPECT_THAT(message({Sample::List{Sample(1), Sample(2)}, Sample::List{Sample(1)}}),
              HasSubstr("sample 0 has 2 and sample 1 has 1"));
  EXPECT_THAT(message({Sample::Dict{{"a", Sample(1)}}, Sample::Dict{{"b", Sample(1)}}}),
              HasSubstr("sample 1 has no key 'a'"));
  EXPECT_THAT(message({Sample(1), Sample(1.5)}),
              HasSubstr("sample 0 holds a int and sample 1 a double"));
  EXPECT_THAT(message({Sample(), Sample()}), HasSubstr("found none"));
  EXPECT_THAT(message({}), HasSubstr("no samples"));
}

}  // namespace
}  // namespace ember::data
