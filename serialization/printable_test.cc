#include "serialization/printable.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ember::serialization {
namespace {

TEST(PrintableTest, EscapesWhatATerminalWouldObey) {
  EXPECT_EQ(escape_for_terminal("resnet18"), "resnet18");
  EXPECT_EQ(escape_for_terminal("a\x1b[2Jb"), "a\\x1b[2Jb");
  EXPECT_EQ(escape_for_terminal("x\ry\nz\t"), "x\\x0dy\\x0az\\x09");
  EXPECT_EQ(escape_for_terminal("x\ry\nz\t", /*keep_newlines=*/true), "x\\x0dy\nz\t");
  EXPECT_EQ(escape_for_terminal("del\x7f"), "del\\x7f");
  EXPECT_EQ(escape_for_terminal("c1\xc2\x9b"), "c1\\u009b");        // CSI as U+009B
  EXPECT_EQ(escape_for_terminal("rtl\xe2\x80\xae"), "rtl\\u202e");  // RIGHT-TO-LEFT OVERRIDE
  EXPECT_EQ(escape_for_terminal("bad\xff\xc0\xaf"), "bad\\xff\\xc0\\xaf");  // not UTF-8, overlong
  EXPECT_EQ(escape_for_terminal("na\xc3\xafve \xe6\xa8\xa1\xe5\x9e\x8b \\d"),
            "na\xc3\xafve \xe6\xa8\xa1\xe5\x9e\x8b \\d");  // printable UTF-8 and '\' stay
  EXPECT_EQ(escape_for_terminal(std::string("nul\0", 4)), "nul\\x00");
}

TEST(PrintableTest, ValidatesUtf8) {
  size_t at = 99;
  EXPECT_TRUE(is_valid_utf8("plain \xe2\x82\xac \xf0\x9f\x98\x80"));
  EXPECT_FALSE(is_valid_utf8("ab\xed\xa0\x80", &at));  // a surrogate
  EXPECT_EQ(at, 2u);
  EXPECT_FALSE(is_valid_utf8("\xf4\x90\x80\x80"));  // past U+10FFFF
  EXPECT_FALSE(is_valid_utf8("\xe2\x82"));          // cut short
}

TEST(PrintableTest, AppendsUtf8AtEveryLength) {
  std::string out;
  for (uint32_t cp : {0x41u, 0x7Fu, 0x80u, 0x20ACu, 0xFFFFu, 0x1F600u, 0x10FFFFu})
    append_utf8(&out, cp);
  EXPECT_EQ(out, "A\x7f\xc2\x80\xe2\x82\xac\xef\xbf\xbf\xf0\x9f\x98\x80\xf4\x8f\xbf\xbf");
}

TEST(PrintableTest, ParsesOnlyPlainHexDigits) {
  EXPECT_EQ(parse_hex_digits("00e9"), 0xE9u);
  EXPECT_EQ(parse_hex_digits("D83D"), 0xD83Du);
  EXPECT_EQ(parse_hex_digits("fFfFfFfF"), 0xFFFFFFFFu);
  for (absl::string_view bad : {"", "12g4", "+1a2", "0x12", " 12", "123456789"})
    EXPECT_EQ(parse_hex_digits(bad), std::nullopt) << bad;
}

}  // namespace
}  // namespace ember::serialization
