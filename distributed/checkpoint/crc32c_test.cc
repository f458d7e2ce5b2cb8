// Known CRC-32C values: the check value of "123456789" and the test vectors
// of RFC 3720 (iSCSI), appendix B.4.
#include "distributed/checkpoint/crc32c.h"

#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace ember::distributed::checkpoint {
namespace {

TEST(Crc32cTest, CheckValue) { EXPECT_EQ(crc32c("123456789", 9), 0xe3069283u); }

TEST(Crc32cTest, Rfc3720Vectors) {
  std::vector<uint8_t> zeros(32, 0), ones(32, 0xff), up(32), down(32);
  for (int i = 0; i < 32; ++i) {
    up[i] = static_cast<uint8_t>(i);
    down[i] = static_cast<uint8_t>(31 - i);
  }
  EXPECT_EQ(crc32c(zeros.data(), 32), 0x8a9136aau);
  EXPECT_EQ(crc32c(ones.data(), 32), 0x62a8ab43u);
  EXPECT_EQ(crc32c(up.data(), 32), 0x46dd794eu);
  EXPECT_EQ(crc32c(down.data(), 32), 0x113fdb5cu);
}

TEST(Crc32cTest, ContinuesAcrossPieces) {
  const std::string s = "The quick brown fox jumps over the lazy dog, twice over.";
  for (size_t cut = 0; cut <= s.size(); ++cut) {
    EXPECT_EQ(crc32c(s.data() + cut, s.size() - cut, crc32c(s.data(), cut)),
              crc32c(s.data(), s.size()))
        << "cut at " << cut;
  }
}

}  // namespace
}  // namespace ember::distributed::checkpoint
