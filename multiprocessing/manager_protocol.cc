#include "multiprocessing/manager_protocol.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ember::multiprocessing {
namespace {

struct Header {
  uint32_t magic;
  uint16_t version;
  uint16_t type;
  uint32_t length;
};
static_assert(sizeof(Header) == kFrameHeaderBytes);

// Waits until `fd` is ready for `events` or the deadline passes.
absl::Status WaitFor(int fd, short events, absl::Time deadline) {
  while (true) {
    absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError("shm manager: timed out waiting for the socket");
    }
    pollfd p{fd, events, 0};
    int ms = static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 60000));
    int r = ::poll(&p, 1, ms);
    if (r > 0) return absl::OkStatus();
    if (r < 0 && errno != EINTR) {
      return absl::InternalError(absl::StrCat("shm manager: poll: ", std::strerror(errno)));
    }
  }
}

}  // namespace

std::string EncodeFrame(FrameType type, std::string_view payload) {
  Header h{kManagerMagic, kManagerProtocolVersion, static_cast<uint16_t>(type),
           static_cast<uint32_t>(payload.size())};
  std::string out(reinterpret_cast<const char*>(&h), sizeof(h));
  out.append(payload);
  return out;
}

absl::StatusOr<std::optional<Frame>> FrameReader::Next() {
  if (buffer_.size() < kFrameHeaderBytes) return std::optional<Frame>();
  Header h;
  std::memcpy(&h, buffer_.data(), sizeof(h));
  if (h.magic != kManagerMagic) {
    return absl::InvalidArgumentError(
        absl::StrFormat("shm manager protocol: bad magic 0x%08x (expected "
                        "0x%08x): not an Ember client",
                        h.magic, kManagerMagic));
  }
  if (h.version != kManagerProtocolVersion) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shm manager protocol: version ", h.version, " is not supported (this build speaks ",
        kManagerProtocolVersion, "); use client and shm_manager from the same build"));
  }
  if (h.type < static_cast<uint16_t>(FrameType::kHello) ||
      h.type > static_cast<uint16_t>(FrameType::kError)) {
    return absl::InvalidArgumentError(
        absl::StrCat("shm manager protocol: unknown frame type ", h.type));
  }
  if (h.length > kMaxFramePayload) {
    return absl::InvalidArgumentError(absl::StrCat("shm manager protocol: payload of ", h.length,
                                                   " bytes exceeds the limit of ",
                                                   kMaxFramePayload));
  }
  if (buffer_.size() < kFrameHeaderBytes + h.length) return std::optional<Frame>();
  Frame f{static_cast<FrameType>(h.type), buffer_.substr(kFrameHeaderBytes, h.length)};
  buffer_.erase(0, kFrameHeaderBytes + h.length);
  return std::optional<Frame>(std::move(f));
}

bool IsValidRegionName(std::string_view name) {
  if (name.size() < 2 || name.size() > 251 || name[0] != '/') return false;
  return std::all_of(name.begin() + 1, name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '.' || c == '-';
  });
}

std::string FormatRegionName(const RegionName& parts) {
  return absl::StrFormat("%s_%d_%d_%08x", parts.prefix, parts.pid, parts.counter, parts.random);
}

std::optional<RegionName> ParseRegionName(std::string_view name) {
  if (!IsValidRegionName(name)) return std::nullopt;
  // From the right: "_<random>", "_<counter>", "_<pid>"; the rest is the prefix.
  std::string_view fields[3];
  std::string_view rest = name;
  for (std::string_view& field : fields) {
    size_t cut = rest.rfind('_');
    if (cut == std::string_view::npos) return std::nullopt;
    field = rest.substr(cut + 1);
    rest = rest.substr(0, cut);
  }
  RegionName parts;
  parts.prefix = std::string(rest);
  const std::string_view random = fields[0];
  if (parts.prefix.size() < 2 || random.size() != 8 ||
      !std::all_of(random.begin(), random.end(),
                   [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }) ||
      !absl::SimpleHexAtoi(std::string(random), &parts.random) ||
      !absl::SimpleAtoi(std::string(fields[1]), &parts.counter) ||
      !absl::SimpleAtoi(std::string(fields[2]), &parts.pid) || parts.pid <= 0 ||
      FormatRegionName(parts) != name) {  // no signs, spaces or leading zeros
    return std::nullopt;
  }
  return parts;
}

absl::Status WriteAll(int fd, std::string_view bytes, absl::Time deadline) {
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      done += n;
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (absl::Status s = WaitFor(fd, POLLOUT, deadline); !s.ok()) return s;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    return absl::UnavailableError(
        absl::StrCat("shm manager: connection lost while writing: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<Frame> ReadFrame(int fd, FrameReader& reader, absl::Time deadline) {
  char buf[512];
  while (true) {
    absl::StatusOr<std::optional<Frame>> next = reader.Next();
    if (!next.ok()) return next.status();
    if (next->has_value()) return std::move(**next);
    ssize_t n = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n > 0) {
      reader.Append(buf, n);
      continue;
    }
    if (n == 0) return absl::UnavailableError("shm manager: connection closed by the daemon");
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (absl::Status s = WaitFor(fd, POLLIN, deadline); !s.ok()) return s;
      continue;
    }
    if (errno == EINTR) continue;
    return absl::UnavailableError(
        absl::StrCat("shm manager: connection lost while reading: ", std::strerror(errno)));
  }
}

}  // namespace ember::multiprocessing
