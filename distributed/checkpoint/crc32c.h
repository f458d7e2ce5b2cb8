// CRC-32C (Castagnoli), the checksum of a distributed checkpoint's data
// blocks: the SSE4.2 crc32 instruction where the CPU has it, three chains of
// it at once on long inputs (Note [Three crc32 streams] in crc32c.cc), a
// table otherwise (same values). Internal to distributed/checkpoint/.
//
//   uint32_t crc = ember::distributed::checkpoint::crc32c("123456789", 9);
//   // crc == 0xe3069283 (the CRC-32C check value)
//
// Thread-safety: pure functions.
#ifndef EMBER_DISTRIBUTED_CHECKPOINT_CRC32C_H_
#define EMBER_DISTRIBUTED_CHECKPOINT_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace ember::distributed::checkpoint {

// The CRC-32C of `size` bytes at `data`, continuing from `crc` (the value of
// the bytes before them; 0 to start).
uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);

}  // namespace ember::distributed::checkpoint

#endif  // EMBER_DISTRIBUTED_CHECKPOINT_CRC32C_H_
