#include "serialization/printable.h"

#include <cstdint>

#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"

namespace ember::serialization {
namespace {

// Decodes the UTF-8 sequence at `text[i]`: its code point and length, or
// length 0 when the bytes there are not well-formed UTF-8.
struct Decoded {
  uint32_t code_point = 0;
  size_t length = 0;
};

Decoded DecodeAt(absl::string_view text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char b0 = byte(i);
  if (b0 < 0x80) return {b0, 1};
  size_t n;
  uint32_t cp, min;
  if ((b0 & 0xE0) == 0xC0) {
    n = 2, cp = b0 & 0x1F, min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    n = 3, cp = b0 & 0x0F, min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    n = 4, cp = b0 & 0x07, min = 0x10000;
  } else {
    return {};
  }
  if (text.size() - i < n) return {};
  for (size_t k = 1; k < n; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return {};
    cp = (cp << 6) | (byte(i + k) & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return {};
  return {cp, n};
}

// Code points that reorder or break the lines around them.
bool IsLayoutControl(uint32_t cp) {
  return cp == 0x061C || cp == 0x200E || cp == 0x200F || (cp >= 0x202A && cp <= 0x202E) ||
         (cp >= 0x2066 && cp <= 0x2069) || cp == 0x2028 || cp == 0x2029;
}

}  // namespace

std::string escape_for_terminal(absl::string_view text, bool keep_newlines) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const Decoded d = DecodeAt(text, i);
    if (d.length == 0) {
      absl::StrAppendFormat(&out, "\\x%02x", static_cast<unsigned char>(text[i]));
      ++i;
      continue;
    }
    const uint32_t cp = d.code_point;
    if (keep_newlines && (cp == '\n' || cp == '\t')) {
      out.push_back(static_cast<char>(cp));
    } else if (cp < 0x20 || cp == 0x7F) {
      absl::StrAppendFormat(&out, "\\x%02x", cp);
    } else if ((cp >= 0x80 && cp <= 0x9F) || IsLayoutControl(cp)) {
      absl::StrAppendFormat(&out, "\\u%04x", cp);
    } else {
      out.append(text.data() + i, d.length);
    }
    i += d.length;
  }
  return out;
}

bool is_valid_utf8(absl::string_view text, size_t* bad_at) {
  for (size_t i = 0; i < text.size();) {
    const Decoded d = DecodeAt(text, i);
    if (d.length == 0) {
      if (bad_at != nullptr) *bad_at = i;
      return false;
    }
    i += d.length;
  }
  return true;
}

void append_utf8(std::string* out, uint32_t code_point) {
  const uint32_t cp = code_point;
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | ((cp >> 18) & 0x07)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::optional<uint32_t> parse_hex_digits(absl::string_view digits) {
  if (digits.empty() || digits.size() > 8) return std::nullopt;
  uint32_t v = 0;
  for (char h : digits) {
    if (!absl::ascii_isxdigit(h)) return std::nullopt;
    v = v * 16 + (absl::ascii_isdigit(h) ? h - '0' : absl::ascii_tolower(h) - 'a' + 10);
  }
  return v;
}

}  // namespace ember::serialization
