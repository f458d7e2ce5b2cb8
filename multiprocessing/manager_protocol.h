// The wire protocol between processes and the shm manager daemon
// (tools/shm_manager), which tracks the file_system strategy's named
// shared-memory regions so that none outlives the processes using them.
//
// Every message is one frame: a 12-byte header (magic "EMSM", version, type,
// payload length, all in host byte order, since both ends share the machine)
// then the payload. A client sends kHello once (its pid, which the daemon
// checks against the socket's SO_PEERCRED), then kRegister for each region
// it is about to create (answered by kAck once the daemon has recorded it),
// kUnregister when it unlinks one, and kGoodbye when it exits normally. The
// daemon answers a malformed, foreign or disallowed frame with kError and
// closes that connection.
//
// Only regions a client creates itself may be registered: the name follows
// RegionName's scheme with the client's own pid in it, and no such region
// exists yet (the client creates it with O_EXCL after the ack). A client may
// unregister its own regions, and another's only once the region is gone.
//
//   std::string frame =
//       EncodeFrame(FrameType::kRegister, FormatRegionName({"/ember", 12, 0, 0xab}));
//   FrameReader reader;
//   reader.Append(bytes.data(), bytes.size());
//   absl::StatusOr<std::optional<Frame>> next = reader.Next();
//
// Thread-compatible.
#ifndef EMBER_MULTIPROCESSING_MANAGER_PROTOCOL_H_
#define EMBER_MULTIPROCESSING_MANAGER_PROTOCOL_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ember::multiprocessing {

inline constexpr uint32_t kManagerMagic = 0x4D534D45;  // "EMSM" in memory order
inline constexpr uint16_t kManagerProtocolVersion = 2;
inline constexpr size_t kFrameHeaderBytes = 12;
// Payloads are a pid or a region name; anything longer is malformed.
inline constexpr size_t kMaxFramePayload = 1024;

enum class FrameType : uint16_t {
  kHello = 1,       // payload: the client's pid, decimal
  kRegister = 2,    // payload: region name; answered by kAck or kError
  kUnregister = 3,  // payload: region name; no answer
  kGoodbye = 4,     // empty; the client exits normally
  kAck = 5,         // empty
  kError = 6,       // payload: what was wrong
};

struct Frame {
  FrameType type;
  std::string payload;
};

std::string EncodeFrame(FrameType type, std::string_view payload = {});

// Reassembles frames from a byte stream that may arrive in arbitrary pieces.
class FrameReader {
 public:
  void Append(const char* data, size_t n) { buffer_.append(data, n); }
  // The next complete frame, std::nullopt when more bytes are needed, or
  // InvalidArgument for a foreign or malformed header (the stream is then
  // unusable).
  absl::StatusOr<std::optional<Frame>> Next();
  size_t buffered() const { return buffer_.size(); }

 private:
  std::string buffer_;
};

// True for a name shm_open accepts as one region: "/" then 1..250 characters
// of [A-Za-z0-9_.-].
bool IsValidRegionName(std::string_view name);

// The parts of a file_system region name, "<prefix>_<pid>_<counter>_<random>"
// with `random` as 8 lower-case hex digits.
struct RegionName {
  std::string prefix;  // "/" then [A-Za-z0-9_.-]
  int64_t pid = 0;
  uint64_t counter = 0;
  uint32_t random = 0;
};
std::string FormatRegionName(const RegionName& parts);
// The parts of `name`, or std::nullopt when it does not follow the scheme.
std::optional<RegionName> ParseRegionName(std::string_view name);

// Blocking reads and writes over a stream socket, retrying partial transfers
// and EINTR.
// Each fails with DeadlineExceeded once `deadline` passes, Unavailable when
// the peer closed the connection.
absl::Status WriteAll(int fd, std::string_view bytes, absl::Time deadline);
absl::StatusOr<Frame> ReadFrame(int fd, FrameReader& reader, absl::Time deadline);

}  // namespace ember::multiprocessing

#endif  // EMBER_MULTIPROCESSING_MANAGER_PROTOCOL_H_
