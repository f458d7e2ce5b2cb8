#include "distributed/checkpoint/crc32c.h"

#include <array>
#include <cstring>

namespace ember::distributed::checkpoint {
namespace {

constexpr uint32_t kPolynomial = 0x82f63b78;  // reflected Castagnoli

constexpr std::array<uint32_t, 256> MakeTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPolynomial : c >> 1;
    table[i] = c;
  }
  return table;
}
constexpr std::array<uint32_t, 256> kTable = MakeTable();

uint32_t TableCrc(const unsigned char* p, size_t n, uint32_t c) {
  for (size_t i = 0; i < n; ++i) c = kTable[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return c;
}

#if defined(__x86_64__)
// Note [Three crc32 streams]
// The crc32 instruction takes three cycles and can start one per cycle, so a
// single chain of them runs at a third of the core's speed. Long inputs are
// cut into stretches of 3 * kStream bytes, each run as three independent
// chains from the state s: a = crc(s, A), b = crc(0, B), c = crc(0, C). The
// state update is linear over GF(2), with crc(s, X) = Z|X|(s) ^ crc(0, X)
// where Zn is "n zero bytes more", so the stretch's state is
// Z2k(a) ^ Zk(b) ^ c (k = kStream); Zk and Z2k are applied through tables
// of their values on each byte of the state, built once from the
// single-chain code.
constexpr size_t kStream = 8192;

__attribute__((target("sse4.2"))) uint32_t OneChain(const unsigned char* p, size_t n,
                                                    uint32_t c) {
  uint64_t c64 = c;
  while (n >= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    c64 = __builtin_ia32_crc32di(c64, word);
    p += 8;
    n -= 8;
  }
  c = static_cast<uint32_t>(c64);
  while (n > 0) {
    c = __builtin_ia32_crc32qi(c, *p++);
    --n;
  }
  return c;
}

// A linear map of the 32-bit state, by the byte of the state it acts on.
struct ZeroShift {
  std::array<std::array<uint32_t, 256>, 4> table;
  uint32_t operator()(uint32_t x) const {
    return table[0][x & 0xff] ^ table[1][(x >> 8) & 0xff] ^ table[2][(x >> 16) & 0xff] ^
           table[3][x >> 24];
  }
};

// The map from its value on each basis vector.
ZeroShift FromBasis(const std::array<uint32_t, 32>& basis) {
  ZeroShift z{};
  for (int k = 0; k < 4; ++k) {
    for (uint32_t b = 0; b < 256; ++b) {
      uint32_t v = 0;
      for (int bit = 0; bit < 8; ++bit) {
        if (b & (1u << bit)) v ^= basis[8 * k + bit];
      }
      z.table[k][b] = v;
    }
  }
  return z;
}

struct Shifts {
  ZeroShift one;  // kStream zero bytes
  ZeroShift two;  // 2 * kStream zero bytes
};

const Shifts& StreamShifts() {
  static const Shifts* shifts = [] {
    static const unsigned char zeros[kStream] = {};
    std::array<uint32_t, 32> one{}, two{};
    for (int i = 0; i < 32; ++i) one[i] = OneChain(zeros, kStream, 1u << i);
    auto* s = new Shifts;
    s->one = FromBasis(one);
    for (int i = 0; i < 32; ++i) two[i] = s->one(one[i]);
    s->two = FromBasis(two);
    return s;
  }();
  return *shifts;
}

__attribute__((target("sse4.2"))) uint32_t HardwareCrc(const unsigned char* p, size_t n,
                                                       uint32_t c) {
  if (n >= 3 * kStream) {
    const Shifts& z = StreamShifts();
    while (n >= 3 * kStream) {
      uint64_t a = c, b = 0, d = 0;
      const unsigned char* pb = p + kStream;
      const unsigned char* pd = p + 2 * kStream;
      for (size_t i = 0; i < kStream; i += 8) {
        uint64_t wa, wb, wd;
        std::memcpy(&wa, p + i, 8);
        std::memcpy(&wb, pb + i, 8);
        std::memcpy(&wd, pd + i, 8);
        a = __builtin_ia32_crc32di(a, wa);
        b = __builtin_ia32_crc32di(b, wb);
        d = __builtin_ia32_crc32di(d, wd);
      }
      c = z.two(static_cast<uint32_t>(a)) ^ z.one(static_cast<uint32_t>(b)) ^
          static_cast<uint32_t>(d);
      p += 3 * kStream;
      n -= 3 * kStream;
    }
  }
  return OneChain(p, n, c);
}

bool HaveSse42() {
  static const bool have = __builtin_cpu_supports("sse4.2");
  return have;
}
#endif

}  // namespace

uint32_t crc32c(const void* data, size_t size, uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
#if defined(__x86_64__)
  if (HaveSse42()) return ~HardwareCrc(p, size, c);
#endif
  return ~TableCrc(p, size, c);
}

}  // namespace ember::distributed::checkpoint
