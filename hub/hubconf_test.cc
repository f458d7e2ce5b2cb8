// hubconf.textproto parsing and validation.
#include "hub/hubconf.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ember::hub {
namespace {

using ::testing::HasSubstr;

constexpr char kGood[] = R"pb(
  dependencies: "mlp"
  entry_points {
    name: "tiny_mlp"
    doc: "A two-layer perceptron."
    builder: "mlp"
    kwargs {
      key: "hidden"
      value { int_value: 8 }
    }
    weights { file: "weights/tiny_mlp.safetensors" sha256: "0123abcd" }
  }
  entry_points { name: "fresh" builder: "mlp" }
)pb";

TEST(HubConfTest, ParsesEntryPoints) {
  absl::StatusOr<HubConf> conf = ParseHubConf(kGood, "x/hubconf.textproto");
  ASSERT_TRUE(conf.ok()) << conf.status();
  ASSERT_EQ(conf->entry_points_size(), 2);
  const EntryPoint* e = FindEntryPoint(*conf, "tiny_mlp");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->doc(), "A two-layer perceptron.");
  EXPECT_EQ(e->kwargs().at("hidden").int_value(), 8);
  EXPECT_EQ(e->weights().file(), "weights/tiny_mlp.safetensors");
  EXPECT_EQ(FindEntryPoint(*conf, "nope"), nullptr);
}

TEST(HubConfTest, SyntaxErrorNamesSourceAndLine) {
  absl::StatusOr<HubConf> conf =
      ParseHubConf("entry_points {\n name: 3 }", "r/hubconf.textproto");
  ASSERT_FALSE(conf.ok());
  EXPECT_EQ(conf.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(conf.status().message(), HasSubstr("r/hubconf.textproto"));
  EXPECT_THAT(conf.status().message(), HasSubstr("line 2"));
}

TEST(HubConfTest, UnknownFieldIsAnError) {
  absl::StatusOr<HubConf> conf =
      ParseHubConf("entrypoints { name: \"a\" }", "f");
  ASSERT_FALSE(conf.ok());
  EXPECT_THAT(conf.status().message(), HasSubstr("entrypoints"));
}

TEST(HubConfTest, RejectsInconsistentEntries) {
  auto error = [](const char* text) {
    return std::string(ParseHubConf(text, "f").status().message());
  };
  EXPECT_THAT(error("entry_points { name: \"a\" builder: \"mlp\" } "
                    "entry_points { name: \"a\" builder: \"mlp\" }"),
              HasSubstr("'a' is defined twice"));
  EXPECT_THAT(error("entry_points { name: \"a\" }"),
              HasSubstr("names no builder"));
  EXPECT_THAT(error("entry_points { name: \"a\" builder: \"b\" weights { url: "
                    "\"https://x/w.pt\" } }"),
              HasSubstr("has no sha256"));
  EXPECT_THAT(error("entry_points { name: \"a\" builder: \"b\" weights { file: "
                    "\"w\" url: \"u\" sha256: \"00112233\" } }"),
              HasSubstr("exactly one"));
  EXPECT_THAT(error("entry_points { name: \"a\" builder: \"b\" weights { file: "
                    "\"../w\" } }"),
              HasSubstr("relative path inside"));
  EXPECT_THAT(error("entry_points { name: \"a\" builder: \"b\" weights { file: "
                    "\"w\" sha256: \"xyz12345\" } }"),
              HasSubstr("not 8 to 64 hex digits"));
  EXPECT_THAT(error("entry_points { name: \"a\" builder: \"b\" kwargs { key: "
                    "\"pretrained\" value { bool_value: true } } }"),
              HasSubstr("`pretrained`"));
}

TEST(HubConfTest, MissingDependenciesAreListed) {
  absl::StatusOr<HubConf> conf = ParseHubConf(
      "dependencies: \"mlp\" dependencies: \"vit\" dependencies: \"bert\"",
      "f");
  ASSERT_TRUE(conf.ok()) << conf.status();
  EXPECT_TRUE(CheckDependencies(*conf, {"mlp", "vit", "bert"}).ok());
  absl::Status s = CheckDependencies(*conf, {"mlp", "resnet18"});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("missing dependencies: vit, bert"));
  EXPECT_THAT(s.message(), HasSubstr("mlp, resnet18"));
}

}  // namespace
}  // namespace ember::hub
