// Proves GoogleTest and GoogleMock link and that matchers evaluate.
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(GoogleTestTest, MatchersEvaluate) {
  std::vector<int> v = {1, 2, 3};
  EXPECT_THAT(v, ElementsAre(1, 2, 3));
  EXPECT_THAT(v, Not(ElementsAre(3, 2, 1)));
  EXPECT_THAT("shapes [2, 3] and [4]", HasSubstr("[4]"));
}

}  // namespace
