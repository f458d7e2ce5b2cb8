// The wire protocol between processes and the shm manager daemon
// (tools/shm_manager), which tracks the file_system strategy's named
// shared-memory regions so that none outlives the processes using them.
//
// Every message is one frame: a 12-byte header (magic "EMSM", version, type,
// payload length, all in host byte order, since both ends share the machine)
// then the payload. A client sends kHello once, then kRegister for each region
// it creates (answered by kAck once the daemon has recorded it), kUnregister
// when it unlinks one, and kGoodbye when it exits normally. The daemon answers
// a malformed or foreign frame with kError and closes that connection.
//
//   std::string frame = EncodeFrame(FrameType::kRegister, "/ember_12_0_ab");
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
inline constexpr uint16_t kManagerProtocolVersion = 1;
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

// Blocking reads and writes over a stream socket, retrying partial transfers
// and EINTR.
// Each fails with DeadlineExceeded once `deadline` passes, Unavailable when
// the peer closed the connection.
absl::Status WriteAll(int fd, std::string_view bytes, absl::Time deadline);
absl::StatusOr<Frame> ReadFrame(int fd, FrameReader& reader,
                                absl::Time deadline);

}  // namespace ember::multiprocessing

#endif  // EMBER_MULTIPROCESSING_MANAGER_PROTOCOL_H_
