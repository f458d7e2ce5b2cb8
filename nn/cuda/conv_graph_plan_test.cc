// The host-only logic of conv2d's cuDNN graph-API path (Note [cuDNN graph
// API] in nn/cuda/conv_graph.cc): packed strides, pointer alignments, the
// plan cache's key, the TF32 filter over engines' numerical notes, and the
// EMBER_CUDNN_GRAPH_API switch's reading. Runs without a device.
#include "nn/cuda/conv_graph_plan.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "nn/cuda/cudnn.h"

namespace ember::nn::cudnn::internal {
namespace {

using IntVector = std::vector<int64_t>;
using Notes = std::vector<cudnnBackendNumericalNote_t>;

TEST(ConvGraphPlanTest, PackedStridesAreNchwRowMajor) {
  EXPECT_EQ(PackedStrides({2, 64, 56, 56}), (IntVector{200704, 3136, 56, 1}));
  EXPECT_EQ(PackedStrides({64, 3, 7, 7}), (IntVector{147, 49, 7, 1}));
  EXPECT_EQ(PackedStrides({1, 1, 1, 1}), (IntVector{1, 1, 1, 1}));
  EXPECT_EQ(PackedStrides({5}), (IntVector{1}));
  EXPECT_EQ(PackedStrides({}), (IntVector{}));
}

TEST(ConvGraphPlanTest, AlignmentIsTheLargestPowerOfTwoUpTo16) {
  EXPECT_EQ(Alignment(0), 16);
  EXPECT_EQ(Alignment(0x7f0000000000), 16);
  EXPECT_EQ(Alignment(0x7f0000000100), 16);
  EXPECT_EQ(Alignment(0x7f0000000008), 8);
  EXPECT_EQ(Alignment(0x7f0000000004), 4);  // A float past a 16-byte boundary.
  EXPECT_EQ(Alignment(0x7f0000000006), 2);  // A bfloat16 three elements in.
  EXPECT_EQ(Alignment(0x7f0000000001), 1);
  EXPECT_EQ(Alignment(48), 16);
  EXPECT_EQ(Alignment(40), 8);
}

TEST(ConvGraphPlanTest, Float32RefusesTensorCoresOnlyWithoutTf32) {
  const Notes tensor_core = {CUDNN_NUMERICAL_NOTE_TENSOR_CORE};
  const Notes plain = {};
  const Notes winograd = {CUDNN_NUMERICAL_NOTE_WINOGRAD, CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_4x4};
  const Notes mixed = {CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC, CUDNN_NUMERICAL_NOTE_TENSOR_CORE};
  EXPECT_TRUE(RefusesEngine(tensor_core, CUDNN_DATA_FLOAT, /*allow_tf32=*/false));
  EXPECT_TRUE(RefusesEngine(mixed, CUDNN_DATA_FLOAT, false));
  EXPECT_FALSE(RefusesEngine(tensor_core, CUDNN_DATA_FLOAT, /*allow_tf32=*/true));
  EXPECT_FALSE(RefusesEngine(plain, CUDNN_DATA_FLOAT, false));
  EXPECT_FALSE(RefusesEngine(winograd, CUDNN_DATA_FLOAT, false));
}

TEST(ConvGraphPlanTest, Float32WithoutTf32RefusesInputsConvertedDown) {
  const Notes down = {CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS};
  EXPECT_TRUE(RefusesEngine(down, CUDNN_DATA_FLOAT, /*allow_tf32=*/false));
  EXPECT_FALSE(RefusesEngine(down, CUDNN_DATA_FLOAT, /*allow_tf32=*/true));
}

TEST(ConvGraphPlanTest, OtherDtypesTakeAnyEngine) {
  const Notes down = {CUDNN_NUMERICAL_NOTE_TENSOR_CORE, CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS};
  for (cudnnDataType_t type : {CUDNN_DATA_DOUBLE, CUDNN_DATA_HALF, CUDNN_DATA_BFLOAT16}) {
    EXPECT_FALSE(RefusesEngine(down, type, false)) << type;
    EXPECT_FALSE(RefusesEngine(down, type, true)) << type;
  }
}

TEST(ConvGraphPlanTest, TheKeyTellsApartEverythingAPlanDependsOn) {
  const ::ember::nn::internal::ConvParams p{{1, 1}, {1, 1}, {1, 1}, 1};
  const IntVector x = {2, 64, 56, 56}, w = {64, 64, 3, 3}, aligned = {16, 16, 16};
  const IntVector key =
      GraphPlanKey(0, 0x1000, ConvDirection::kForward, 0, true, false, x, w, p, aligned);
  EXPECT_EQ(key, (IntVector{0, 0x1000, 0, 0, 1, 0, 2, 64, 56, 56, 64, 64,
                            3, 3,      1, 1, 1, 1, 1, 1,  1,  16, 16, 16}));
  auto differs = [&](const IntVector& other) { EXPECT_NE(other, key); };
  differs(GraphPlanKey(1, 0x1000, ConvDirection::kForward, 0, true, false, x, w, p, aligned));
  differs(GraphPlanKey(0, 0x2000, ConvDirection::kForward, 0, true, false, x, w, p, aligned));
  differs(GraphPlanKey(0, 0x1000, ConvDirection::kInputGrad, 0, true, false, x, w, p, aligned));
  differs(GraphPlanKey(0, 0x1000, ConvDirection::kWeightGrad, 0, true, false, x, w, p, aligned));
  differs(GraphPlanKey(0, 0x1000, ConvDirection::kForward, 1, true, false, x, w, p, aligned));
  differs(GraphPlanKey(0, 0x1000, ConvDirection::kForward, 0, false, false, x, w, p, aligned));
  differs(GraphPlanKey(0, 0x1000, ConvDirection::kForward, 0, true, true, x, w, p, aligned));
  differs(GraphPlanKey(0, 0x1000, ConvDirection::kForward, 0, true, false, {1, 64, 56, 56}, w, p,
                       aligned));
  differs(GraphPlanKey(0, 0x1000, ConvDirection::kForward, 0, true, false, x, {64, 32, 3, 3}, p,
                       aligned));
  differs(GraphPlanKey(0, 0x1000, ConvDirection::kForward, 0, true, false, x, w,
                       {{2, 1}, {1, 1}, {1, 1}, 1}, aligned));
  differs(GraphPlanKey(0, 0x1000, ConvDirection::kForward, 0, true, false, x, w,
                       {{1, 1}, {0, 1}, {1, 1}, 1}, aligned));
  differs(GraphPlanKey(0, 0x1000, ConvDirection::kForward, 0, true, false, x, w,
                       {{1, 1}, {1, 1}, {1, 2}, 1}, aligned));
  differs(GraphPlanKey(0, 0x1000, ConvDirection::kForward, 0, true, false, x, w,
                       {{1, 1}, {1, 1}, {1, 1}, 2}, aligned));
  differs(GraphPlanKey(0, 0x1000, ConvDirection::kForward, 0, true, false, x, w, p, {16, 4, 16}));
}

TEST(ConvGraphPlanTest, TheEnvironmentSwitchIsOffUnlessSetToSomethingButZero) {
  EXPECT_FALSE(GraphApiSetting(nullptr));
  EXPECT_FALSE(GraphApiSetting(""));
  EXPECT_FALSE(GraphApiSetting("0"));
  EXPECT_TRUE(GraphApiSetting("1"));
  EXPECT_TRUE(GraphApiSetting("true"));
}

}  // namespace
}  // namespace ember::nn::cudnn::internal
