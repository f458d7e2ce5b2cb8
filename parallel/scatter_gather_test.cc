#include "parallel/scatter_gather.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/factories.h"
#include "tensor/testing.h"

namespace ember::parallel {
namespace {

using ::ember::testing::ErrorOf;
using ::ember::testing::Values;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

const std::vector<Device> kTwo(2, kCPU);

TEST(ScatterTest, RecursesListsAndDictsAndSharesOtherValues) {
  Tensor x = arange(8, kFloat32).view({4, 2});
  Tensor m = arange(4, kFloat32);
  Value in(Value::List{Value(x), Value(Value::Dict{{"mask", Value(Value::List{Value(m)})},
                                                   {"k", Value(3)},
                                                   {"name", Value("cpu")}})});
  std::vector<Value> shares = scatter(in, kTwo);
  ASSERT_EQ(shares.size(), 2u);
  for (int r = 0; r < 2; ++r) {
    const Value::List& args = shares[r].list();
    ASSERT_EQ(args.size(), 2u);
    EXPECT_EQ(Values(*args[0].get_if<Tensor>()), Values(x.narrow(0, 2 * r, 2)));
    const Value* mask = args[1].find("mask");
    ASSERT_NE(mask, nullptr);
    EXPECT_EQ(Values(*mask->list()[0].get_if<Tensor>()), Values(m.narrow(0, 2 * r, 2)));
    EXPECT_EQ(*args[1].find("k")->get_if<int64_t>(), 3);
    EXPECT_EQ(*args[1].find("name")->get_if<std::string>(), "cpu");
  }
  // Along dim 1.
  std::vector<Value> columns = scatter(Value(x), kTwo, 1);
  EXPECT_THAT(Values(*columns[1].get_if<Tensor>()), ElementsAre(1, 3, 5, 7));
}

TEST(ScatterTest, AShortBatchGivesFewerShares) {
  Value in(Value::List{Value(ones({1, 3})), Value(7)});
  EXPECT_EQ(scatter(in, kTwo).size(), 1u);
  // Nothing to split: every replica gets the same values.
  std::vector<Value> same = scatter(Value(Value::List{Value(7)}), kTwo);
  ASSERT_EQ(same.size(), 2u);
  EXPECT_EQ(*same[1].list()[0].get_if<int64_t>(), 7);
}

TEST(ScatterTest, ScatterKwargsPadsTheShorterSide) {
  auto [inputs, kwargs] = scatter_kwargs({}, {{"x", Value(ones({4}))}}, kTwo);
  ASSERT_EQ(inputs.size(), 2u);
  ASSERT_EQ(kwargs.size(), 2u);
  EXPECT_TRUE(inputs[1].empty());
  EXPECT_EQ(kwargs[1].at("x").get_if<Tensor>()->size(0), 2);
  auto [inputs2, kwargs2] = scatter_kwargs({Value(ones({4}))}, {}, kTwo);
  ASSERT_EQ(kwargs2.size(), 2u);
  EXPECT_TRUE(kwargs2[0].empty());
  auto [none, none_kwargs] = scatter_kwargs({}, {}, kTwo);
  EXPECT_TRUE(none.empty());
  EXPECT_TRUE(none_kwargs.empty());
}

TEST(GatherTest, JoinsTensorsListsAndDicts) {
  std::vector<Value> outputs = {
      Value(Value::Dict{{"y", Value(ones({1, 2}))},
                        {"extra", Value(Value::List{Value(zeros({2}))})}}),
      Value(Value::Dict{{"y", Value(full({2, 2}, 2.0f))},
                        {"extra", Value(Value::List{Value(ones({3}))})}})};
  Value out = gather(outputs, kCPU);
  EXPECT_THAT(Values(*out.find("y")->get_if<Tensor>()), ElementsAre(1, 1, 2, 2, 2, 2));
  EXPECT_THAT(Values(*out.find("extra")->list()[0].get_if<Tensor>()), ElementsAre(0, 0, 1, 1, 1));
  EXPECT_TRUE(gather({Value(), Value()}, kCPU).is_none());
  EXPECT_THAT(ErrorOf([&] {
                gather({Value(Value::Dict{{"a", Value(ones({1}))}}), Value(Value::Dict{})}, kCPU);
              }),
              HasSubstr("All dicts must have the same number of keys"));
  EXPECT_THAT(ErrorOf([&] {
                gather({Value(3), Value(4)}, kCPU);
              }),
              HasSubstr("can't gather replica outputs of kind int"));
}

TEST(GatherTest, ZeroDimOutputsBecomeAVectorWithAWarning) {
  ::testing::internal::CaptureStderr();
  Value out = gather({Value(scalar_tensor(1.5f)), Value(scalar_tensor(2.5f))}, kCPU);
  EXPECT_THAT(::testing::internal::GetCapturedStderr(),
              HasSubstr("all input tensors were scalars; will instead unsqueeze and return a "
                        "vector"));
  EXPECT_THAT(Values(*out.get_if<Tensor>()), ElementsAre(1.5, 2.5));
  EXPECT_EQ(out.get_if<Tensor>()->dim(), 1);
}

}  // namespace
}  // namespace ember::parallel
