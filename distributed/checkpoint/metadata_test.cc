#include "distributed/checkpoint/metadata.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ember::distributed::checkpoint {
namespace {

using ::testing::HasSubstr;

Metadata Sample() {
  Metadata md;
  md.world_size = 2;
  TensorMetadata w{kBFloat16, {4, 3}, {}};
  w.chunks.push_back({{0, 0}, {2, 3}, "__0_0.distcp", 0, 12, 8, {1, 4294967295u}});
  w.chunks.push_back({{2, 0}, {2, 3}, "__1_0.distcp", 0, 12, 1 << 20, {7}});
  md.tensors.push_back({"layer.\"quoted\"\\weight\n", w});
  md.tensors.push_back({"step", TensorMetadata{kInt64, {}, {{{}, {}, "__0_0.distcp", 12, 8, 8,
                                                            {99}}}}});
  return md;
}

TEST(MetadataTest, RoundTrip) {
  const Metadata md = Sample();
  const std::string json = encode_metadata(md);
  absl::StatusOr<Metadata> back = decode_metadata(json, "test");
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << json;
  EXPECT_EQ(back->world_size, 2);
  ASSERT_EQ(back->tensors.size(), 2u);
  EXPECT_EQ(back->tensors[0].first, "layer.\"quoted\"\\weight\n");
  const TensorMetadata* w = back->find("layer.\"quoted\"\\weight\n");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->dtype, kBFloat16);
  EXPECT_EQ(w->global_shape, SizeVector({4, 3}));
  ASSERT_EQ(w->chunks.size(), 2u);
  EXPECT_EQ(w->chunks[1].offsets, SizeVector({2, 0}));
  EXPECT_EQ(w->chunks[1].file, "__1_0.distcp");
  EXPECT_EQ(w->chunks[0].crc32c, std::vector<uint32_t>({1, 4294967295u}));
  const TensorMetadata* step = back->find("step");
  ASSERT_NE(step, nullptr);
  EXPECT_EQ(step->dtype, kInt64);
  EXPECT_TRUE(step->global_shape.empty());
  EXPECT_EQ(step->chunks[0].offset, 12);
  EXPECT_EQ(back->find("missing"), nullptr);
}

TEST(MetadataTest, ReadsWhatPythonsJsonWrites) {
  // json.dumps with its default ensure_ascii escapes non-ASCII keys.
  const std::string json =
      R"({"format": "ember-distributed-checkpoint", "version": 1, "world_size": 1,
          "tensors": [{"key": "caf\u00e9.\ud83d\ude00", "dtype": "float32", "shape": [2],
          "chunks": [{"offsets": [0], "sizes": [2], "file": "__0_0.distcp", "offset": 0,
          "length": 8, "block_bytes": 1048576, "crc32c": [5]}]}]})";
  absl::StatusOr<Metadata> md = decode_metadata(json, "py");
  ASSERT_TRUE(md.ok()) << md.status();
  EXPECT_EQ(md->tensors[0].first, "caf\xc3\xa9.\xf0\x9f\x98\x80");
}

TEST(MetadataTest, MalformedInputIsNamed) {
  auto error = [](const std::string& json) {
    absl::StatusOr<Metadata> md = decode_metadata(json, "ckpt/metadata.json");
    EXPECT_FALSE(md.ok()) << json;
    return std::string(md.status().message());
  };
  EXPECT_THAT(error("{"), HasSubstr("not valid JSON"));
  EXPECT_THAT(error("[1, 2"), HasSubstr("ckpt/metadata.json"));
  EXPECT_THAT(error(R"({"format": "other"})"), HasSubstr("expected \"ember-distributed"));
  const std::string good = encode_metadata(Sample());
  std::string newer = good;
  newer.replace(newer.find("\"version\": 1"), 12, "\"version\": 9");
  EXPECT_THAT(error(newer), HasSubstr("versions 1 to 1"));
  std::string bad_dtype = good;
  bad_dtype.replace(bad_dtype.find("bfloat16"), 8, "complex7");
  EXPECT_THAT(error(bad_dtype), HasSubstr("unknown dtype \"complex7\""));
  std::string outside = good;
  outside.replace(outside.find("[2, 0]"), 6, "[3, 0]");
  EXPECT_THAT(error(outside), HasSubstr("leave the shape [4, 3]"));
  std::string escape = good;
  escape.replace(escape.find("__1_0.distcp"), 12, "../../etc/pw");
  EXPECT_THAT(error(escape), HasSubstr("not a plain name"));
  std::string short_length = good;
  short_length.replace(short_length.find("\"length\": 12"), 12, "\"length\": 10");
  EXPECT_THAT(error(short_length), HasSubstr("expected 12 bytes"));
  std::string deep(100, '[');
  EXPECT_THAT(error(deep), HasSubstr("nesting deeper"));
}

TEST(MetadataTest, MissingDirectoryIsNotFound) {
  absl::StatusOr<Metadata> md = read_metadata("/nonexistent/ckpt");
  EXPECT_EQ(md.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(md.status().message(), HasSubstr("/nonexistent/ckpt/metadata.json"));
}

}  // namespace
}  // namespace ember::distributed::checkpoint
