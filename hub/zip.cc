#include "hub/zip.h"

#include <array>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace ember::hub {
namespace {

constexpr uint32_t kLocalHeader = 0x04034b50;
constexpr uint32_t kCentralHeader = 0x02014b50;
constexpr uint32_t kEndOfDirectory = 0x06054b50;
constexpr size_t kEndSize = 22;
constexpr size_t kAlignment = 64;

uint32_t Le32(const std::string& b, size_t at) {
  uint32_t v;
  std::memcpy(&v, b.data() + at, 4);
  return v;
}
uint16_t Le16(const std::string& b, size_t at) {
  uint16_t v;
  std::memcpy(&v, b.data() + at, 2);
  return v;
}
void Put16(std::string& out, uint16_t v) {
  out.append(reinterpret_cast<const char*>(&v), 2);
}
void Put32(std::string& out, uint32_t v) {
  out.append(reinterpret_cast<const char*>(&v), 4);
}

}  // namespace

uint32_t Crc32(absl::string_view data) {
  // Slicing-by-8: eight tables let the loop fold in eight bytes per step.
  static const auto* tables = [] {
    auto* t = new std::array<std::array<uint32_t, 256>, 8>();
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      (*t)[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i) {
      for (int s = 1; s < 8; ++s)
        (*t)[s][i] = ((*t)[s - 1][i] >> 8) ^ (*t)[0][(*t)[s - 1][i] & 0xFF];
    }
    return t;
  }();
  const auto& t = *tables;
  uint32_t crc = 0xFFFFFFFFu;
  const unsigned char* p = reinterpret_cast<const unsigned char*>(data.data());
  size_t n = data.size();
  for (; n >= 8; p += 8, n -= 8) {
    uint32_t lo, hi;
    std::memcpy(&lo, p, 4);
    std::memcpy(&hi, p + 4, 4);
    lo ^= crc;  // little-endian host
    crc = t[7][lo & 0xFF] ^ t[6][(lo >> 8) & 0xFF] ^ t[5][(lo >> 16) & 0xFF] ^
          t[4][lo >> 24] ^ t[3][hi & 0xFF] ^ t[2][(hi >> 8) & 0xFF] ^
          t[1][(hi >> 16) & 0xFF] ^ t[0][hi >> 24];
  }
  for (; n > 0; ++p, --n) crc = t[0][(crc ^ *p) & 0xFF] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

absl::StatusOr<ZipReader> ZipReader::Open(std::string bytes,
                                          std::string source) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": not a readable checkpoint zip: ", why));
  };
  const size_t n = bytes.size();
  if (n < kEndSize) return bad("file too short (truncated?)");
  // The end-of-directory record sits in the last 22 + 65535 (comment) bytes.
  size_t end = std::string::npos;
  for (size_t at = n - kEndSize;; --at) {
    if (Le32(bytes, at) == kEndOfDirectory &&
        at + kEndSize + Le16(bytes, at + 20) == n) {
      end = at;
      break;
    }
    if (at == 0 || n - at > kEndSize + 0xFFFF) break;
  }
  if (end == std::string::npos)
    return bad("no end-of-directory record (truncated or not a zip)");
  const uint64_t count = Le16(bytes, end + 10);
  const uint64_t dir_size = Le32(bytes, end + 12);
  const uint64_t dir_offset = Le32(bytes, end + 16);
  if (count == 0xFFFF || dir_offset == 0xFFFFFFFFu)
    return bad("zip64 archives are not supported");
  if (dir_offset + dir_size > end)
    return bad("central directory lies outside the file");

  ZipReader r;
  r.source_ = std::move(source);
  size_t at = dir_offset;
  for (uint64_t i = 0; i < count; ++i) {
    if (at + 46 > end || Le32(bytes, at) != kCentralHeader)
      return bad("corrupt central directory");
    const uint16_t method = Le16(bytes, at + 10);
    Entry e;
    e.crc = Le32(bytes, at + 16);
    const uint64_t compressed = Le32(bytes, at + 20);
    e.size = Le32(bytes, at + 24);
    const size_t name_len = Le16(bytes, at + 28);
    const size_t extra_len = Le16(bytes, at + 30);
    const size_t comment_len = Le16(bytes, at + 32);
    const uint64_t header = Le32(bytes, at + 42);
    if (at + 46 + name_len > end) return bad("corrupt central directory");
    std::string name = bytes.substr(at + 46, name_len);
    at += 46 + name_len + extra_len + comment_len;
    if (method != 0 || compressed != e.size) {
      return bad(
          absl::StrCat("entry '", name, "' is compressed (method ", method,
                       "); checkpoints store their entries uncompressed"));
    }
    if (header + 30 > dir_offset || Le32(bytes, header) != kLocalHeader) {
      return bad(absl::StrCat("entry '", name,
                              "' has no local header at offset ", header));
    }
    e.offset =
        header + 30 + Le16(bytes, header + 26) + Le16(bytes, header + 28);
    if (e.offset + e.size > dir_offset) {
      return bad(absl::StrCat("entry '", name, "' (", e.size,
                              " bytes at offset ", e.offset,
                              ") runs past the end of the data"));
    }
    if (!r.entries_.emplace(name, e).second)
      return bad(absl::StrCat("entry '", name, "' appears twice"));
    r.names_.push_back(std::move(name));
  }
  r.bytes_ = std::move(bytes);
  return r;
}

absl::StatusOr<absl::string_view> ZipReader::Read(
    absl::string_view name) const {
  auto it = entries_.find(std::string(name));
  if (it == entries_.end()) {
    return absl::NotFoundError(
        absl::StrCat(source_, ": no record '", name, "' in the checkpoint"));
  }
  absl::string_view data(bytes_.data() + it->second.offset, it->second.size);
  if (Crc32(data) != it->second.crc) {
    return absl::DataLossError(absl::StrCat(source_, ": record '", name,
                                            "' is corrupt (CRC mismatch)"));
  }
  return data;
}

void ZipWriter::Add(const std::string& name, absl::string_view data) {
  Entry e{name, out_.size(), data.size(), Crc32(data)};
  // Pad with an extra field so that the data starts on a 64-byte boundary.
  size_t unpadded = out_.size() + 30 + name.size() + 4;
  uint16_t pad =
      static_cast<uint16_t>((kAlignment - unpadded % kAlignment) % kAlignment);
  Put32(out_, kLocalHeader);
  Put16(out_, 20);    // version needed
  Put16(out_, 0);     // flags
  Put16(out_, 0);     // method: stored
  Put16(out_, 0);     // time
  Put16(out_, 0x21);  // date: 1980-01-01
  Put32(out_, e.crc);
  Put32(out_, static_cast<uint32_t>(e.size));
  Put32(out_, static_cast<uint32_t>(e.size));
  Put16(out_, static_cast<uint16_t>(name.size()));
  Put16(out_, static_cast<uint16_t>(4 + pad));
  out_ += name;
  Put16(out_, 0x4246);  // "FB": padding, as PyTorch's writer names it
  Put16(out_, pad);
  out_.append(pad, 'Z');
  out_.append(data.data(), data.size());
  entries_.push_back(std::move(e));
}

std::string ZipWriter::Finish() && {
  const uint32_t dir_offset = static_cast<uint32_t>(out_.size());
  for (const Entry& e : entries_) {
    Put32(out_, kCentralHeader);
    Put16(out_, 20);  // version made by
    Put16(out_, 20);  // version needed
    Put16(out_, 0);
    Put16(out_, 0);
    Put16(out_, 0);
    Put16(out_, 0x21);
    Put32(out_, e.crc);
    Put32(out_, static_cast<uint32_t>(e.size));
    Put32(out_, static_cast<uint32_t>(e.size));
    Put16(out_, static_cast<uint16_t>(e.name.size()));
    Put16(out_, 0);  // extra
    Put16(out_, 0);  // comment
    Put16(out_, 0);  // disk
    Put16(out_, 0);  // internal attributes
    Put32(out_, 0);  // external attributes
    Put32(out_, static_cast<uint32_t>(e.header_offset));
    out_ += e.name;
  }
  const uint32_t dir_size = static_cast<uint32_t>(out_.size()) - dir_offset;
  Put32(out_, kEndOfDirectory);
  Put16(out_, 0);
  Put16(out_, 0);
  Put16(out_, static_cast<uint16_t>(entries_.size()));
  Put16(out_, static_cast<uint16_t>(entries_.size()));
  Put32(out_, dir_size);
  Put32(out_, dir_offset);
  Put16(out_, 0);
  return std::move(out_);
}

}  // namespace ember::hub
