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

// The CRC's definition, one bit at a time: independent of every fast path.
uint32_t BitwiseCrc32c(const uint8_t* p, size_t n) {
  uint32_t c = 0xffffffffu;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
  }
  return ~c;
}

// Lengths around the three-chain stretch (3 x 8 KiB) and its multiples, so
// that every combination of stretches and a single-chain tail is taken.
TEST(Crc32cTest, LongInputsMatchTheDefinition) {
  std::vector<uint8_t> data(5 * 24576 + 77);
  uint32_t x = 12345;
  for (uint8_t& b : data) {
    x = x * 1103515245u + 12345u;
    b = static_cast<uint8_t>(x >> 16);
  }
  for (size_t n : {size_t{24575}, size_t{24576}, size_t{24577}, size_t{49152}, size_t{49160},
                   size_t{3 * 24576 + 5}, data.size()}) {
    EXPECT_EQ(crc32c(data.data(), n), BitwiseCrc32c(data.data(), n)) << n << " bytes";
    // From an unaligned start too.
    EXPECT_EQ(crc32c(data.data() + 3, n - 3), BitwiseCrc32c(data.data() + 3, n - 3))
        << n - 3 << " bytes from offset 3";
  }
}

TEST(Crc32cTest, LongInputsContinueAcrossPieces) {
  std::vector<uint8_t> data(100000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 7 + (i >> 9));
  const uint32_t whole = crc32c(data.data(), data.size());
  for (size_t cut : {size_t{1}, size_t{8191}, size_t{24576}, size_t{30000}, size_t{75423}}) {
    EXPECT_EQ(crc32c(data.data() + cut, data.size() - cut, crc32c(data.data(), cut)), whole)
        << "cut at " << cut;
  }
}

}  // namespace
}  // namespace ember::distributed::checkpoint
