// Proves generated messages build and round-trip through binary and text form.
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "third_party/protobuf/sample.pb.h"

namespace {

TEST(ProtobufTest, RoundTripsBinaryAndText) {
  ember::third_party::Sample s;
  s.set_name("weights");
  s.add_sizes(2);
  s.add_sizes(3);
  std::string wire = s.SerializeAsString();
  ember::third_party::Sample back;
  ASSERT_TRUE(back.ParseFromString(wire));
  EXPECT_EQ(back.name(), "weights");
  ASSERT_EQ(back.sizes_size(), 2);
  EXPECT_EQ(back.sizes(1), 3);

  ember::third_party::Sample parsed;
  ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(
      "name: \"x\" sizes: 7", &parsed));
  EXPECT_EQ(parsed.sizes(0), 7);
  EXPECT_FALSE(google::protobuf::TextFormat::ParseFromString("nope: 1", &parsed));
}

}  // namespace
