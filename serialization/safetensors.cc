#include "serialization/safetensors.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <variant>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "serialization/printable.h"
#include "tensor/factories.h"

namespace ember::serialization {
namespace {

constexpr uint64_t kMaxHeader = 100 << 20;  // the specification's limit

// Dtypes of the safetensors specification that Ember has no dtype for.
const std::vector<std::string>& UnsupportedDtypeNames() {
  static const auto* names = new std::vector<std::string>{
      "C64", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4", "U16", "U32", "U64"};
  return *names;
}

const std::vector<std::pair<std::string, Dtype>>& DtypeNames() {
  static const auto* names = new std::vector<std::pair<std::string, Dtype>>{
      {"F32", kFloat32}, {"F64", kFloat64}, {"F16", kFloat16}, {"BF16", kBFloat16},
      {"I64", kInt64},   {"I32", kInt32},   {"I16", kInt16},   {"I8", kInt8},
      {"U8", kUInt8},    {"BOOL", kBool}};
  return *names;
}

// A JSON value: just what a safetensors header holds.
struct Json {
  enum Kind { kNull, kBool, kNumber, kString, kArray, kObject } kind = kNull;
  bool b = false;
  int64_t integer = 0;
  bool is_integer = false;
  std::string s;
  std::vector<Json> array;
  std::vector<std::pair<std::string, Json>> object;
};

class JsonParser {
 public:
  explicit JsonParser(absl::string_view text) : text_(text) {}

  absl::StatusOr<Json> ParseDocument() {
    Json v;
    if (!Value(&v, 0))
      return absl::InvalidArgumentError(absl::StrCat("invalid JSON at byte ", pos_, ": ", error_));
    Space();
    if (pos_ != text_.size())
      return absl::InvalidArgumentError(absl::StrCat("trailing data at byte ", pos_));
    return v;
  }

 private:
  bool Fail(const char* why) {
    error_ = why;
    return false;
  }
  void Space() {
    while (pos_ < text_.size() && absl::ascii_isspace(text_[pos_])) ++pos_;
  }
  bool Literal(absl::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return Fail("unexpected token");
    pos_ += word.size();
    return true;
  }
  bool String(std::string* out) {
    if (pos_ >= text_.size() || text_[pos_] != '"') return Fail("expected a string");
    ++pos_;
    while (pos_ < text_.size() && text_[pos_] != '"') {
      char c = text_[pos_++];
      if (static_cast<unsigned char>(c) < 0x20) return Fail("control character in a string");
      if (c != '\\') {
        out->push_back(c);
        continue;
      }
      if (pos_ >= text_.size()) return Fail("unterminated escape");
      char e = text_[pos_++];
      switch (e) {
        case '"':
        case '\\':
        case '/':
          out->push_back(e);
          break;
        case 'b':
          out->push_back('\b');
          break;
        case 'f':
          out->push_back('\f');
          break;
        case 'n':
          out->push_back('\n');
          break;
        case 'r':
          out->push_back('\r');
          break;
        case 't':
          out->push_back('\t');
          break;
        case 'u': {
          if (pos_ + 4 > text_.size()) return Fail("short \\u escape");
          std::optional<uint32_t> hi = parse_hex_digits(text_.substr(pos_, 4));
          if (!hi) return Fail("bad \\u escape");
          pos_ += 4;
          uint32_t cp = *hi;
          if (cp >= 0xDC00 && cp < 0xE000) return Fail("lone low surrogate in a \\u escape");
          if (cp >= 0xD800 && cp < 0xDC00) {  // must be followed by its low half
            if (text_.substr(pos_, 2) != "\\u" || pos_ + 6 > text_.size())
              return Fail("lone high surrogate in a \\u escape");
            pos_ += 2;
            std::optional<uint32_t> low = parse_hex_digits(text_.substr(pos_, 4));
            if (!low) return Fail("bad \\u escape");
            pos_ += 4;
            const uint32_t lo = *low;
            if (lo < 0xDC00 || lo >= 0xE000) return Fail("lone high surrogate in a \\u escape");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          append_utf8(out, cp);
          break;
        }
        default:
          return Fail("bad escape");
      }
    }
    if (pos_ >= text_.size()) return Fail("unterminated string");
    ++pos_;
    return true;
  }
  bool Number(Json* v) {
    size_t start = pos_;
    if (pos_ < text_.size() && text_[pos_] == '-') ++pos_;
    while (pos_ < text_.size() &&
           (absl::ascii_isdigit(text_[pos_]) || text_[pos_] == '.' || text_[pos_] == 'e' ||
            text_[pos_] == 'E' || text_[pos_] == '+' || text_[pos_] == '-')) {
      ++pos_;
    }
    std::string token(text_.substr(start, pos_ - start));
    if (token.empty() || token == "-") return Fail("expected a value");
    v->kind = Json::kNumber;
    v->is_integer = token.find_first_of(".eE") == std::string::npos;
    if (v->is_integer) {
      errno = 0;
      char* end;
      v->integer = std::strtoll(token.c_str(), &end, 10);
      if (errno == ERANGE || *end != '\0') return Fail("integer out of range");
    }
    return true;
  }
  bool Value(Json* v, int depth) {
    if (depth > 16) return Fail("nesting too deep");
    Space();
    if (pos_ >= text_.size()) return Fail("unexpected end");
    char c = text_[pos_];
    if (c == '{') {
      ++pos_;
      v->kind = Json::kObject;
      Space();
      if (pos_ < text_.size() && text_[pos_] == '}') return ++pos_, true;
      while (true) {
        Space();
        std::string key;
        if (!String(&key)) return false;
        Space();
        if (pos_ >= text_.size() || text_[pos_++] != ':') return Fail("expected ':'");
        Json member;
        if (!Value(&member, depth + 1)) return false;
        v->object.emplace_back(std::move(key), std::move(member));
        Space();
        if (pos_ < text_.size() && text_[pos_] == ',') {
          ++pos_;
          continue;
        }
        if (pos_ < text_.size() && text_[pos_] == '}') return ++pos_, true;
        return Fail("expected ',' or '}'");
      }
    }
    if (c == '[') {
      ++pos_;
      v->kind = Json::kArray;
      Space();
      if (pos_ < text_.size() && text_[pos_] == ']') return ++pos_, true;
      while (true) {
        Json item;
        if (!Value(&item, depth + 1)) return false;
        v->array.push_back(std::move(item));
        Space();
        if (pos_ < text_.size() && text_[pos_] == ',') {
          ++pos_;
          continue;
        }
        if (pos_ < text_.size() && text_[pos_] == ']') return ++pos_, true;
        return Fail("expected ',' or ']'");
      }
    }
    if (c == '"') {
      v->kind = Json::kString;
      return String(&v->s);
    }
    if (c == 't') return v->kind = Json::kBool, v->b = true, Literal("true");
    if (c == 'f') return v->kind = Json::kBool, Literal("false");
    if (c == 'n') return Literal("null");
    return Number(v);
  }

  absl::string_view text_;
  size_t pos_ = 0;
  const char* error_ = "";
};

void AppendJsonString(std::string* out, absl::string_view s) {
  out->push_back('"');
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out->push_back('\\');
      out->push_back(static_cast<char>(c));
    } else if (c < 0x20) {
      absl::StrAppend(out, "\\u00", absl::string_view("0123456789abcdef" + (c >> 4), 1),
                      absl::string_view("0123456789abcdef" + (c & 15), 1));
    } else {
      out->push_back(static_cast<char>(c));
    }
  }
  out->push_back('"');
}

}  // namespace

absl::StatusOr<StateDict> read_safetensors(absl::string_view bytes, absl::string_view source) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": not a valid safetensors file: ", why));
  };
  if (bytes.size() < 8) return bad("shorter than its 8-byte header length");
  uint64_t header_len;
  std::memcpy(&header_len, bytes.data(), 8);
  if (header_len > kMaxHeader || header_len > bytes.size() - 8) {
    return bad(absl::StrCat("header length ", header_len, " exceeds the file (", bytes.size(),
                            " bytes; truncated?)"));
  }
  // JSON text is UTF-8 (RFC 8259), and tensor names are looked up as text.
  if (size_t bad_at; !is_valid_utf8(bytes.substr(8, header_len), &bad_at)) {
    return bad(absl::StrCat("the header is not valid UTF-8 (byte ", 8 + bad_at, " of the file)"));
  }
  absl::StatusOr<Json> header = JsonParser(bytes.substr(8, header_len)).ParseDocument();
  if (!header.ok()) return bad(header.status().message());
  if (header->kind != Json::kObject) return bad("the header is not a JSON object");
  const absl::string_view data = bytes.substr(8 + header_len);

  struct Entry {
    std::string name;
    Dtype dtype;
    SizeVector shape;
    uint64_t begin, end;
  };
  std::vector<Entry> entries;
  std::set<std::string> names;
  for (const auto& [name, info] : header->object) {
    if (name == "__metadata__") continue;
    auto fail = [&](absl::string_view why) {
      return bad(absl::StrCat("tensor '", escape_for_terminal(name), "': ", why));
    };
    if (name.find('\0') != std::string::npos) return fail("its name holds a NUL character");
    if (!names.insert(name).second) return fail("appears twice");
    if (info.kind != Json::kObject) return fail("is not an object");
    const Json* dtype = nullptr;
    const Json* shape = nullptr;
    const Json* offsets = nullptr;
    for (const auto& [k, v] : info.object) {
      if (k == "dtype") dtype = &v;
      if (k == "shape") shape = &v;
      if (k == "data_offsets") offsets = &v;
    }
    if (!dtype || !shape || !offsets) return fail("needs dtype, shape and data_offsets");
    Entry e;
    e.name = name;
    auto d = std::find_if(DtypeNames().begin(), DtypeNames().end(), [&](const auto& p) {
      return dtype->kind == Json::kString && p.first == dtype->s;
    });
    if (d == DtypeNames().end()) {
      const std::string given =
          dtype->kind == Json::kString ? escape_for_terminal(dtype->s) : "(not a string)";
      const std::string have = "F32, F64, F16, BF16, I64, I32, I16, I8, U8 and BOOL";
      if (dtype->kind == Json::kString &&
          std::count(UnsupportedDtypeNames().begin(), UnsupportedDtypeNames().end(), dtype->s)) {
        return absl::UnimplementedError(
            absl::StrCat(source, ": tensor '", escape_for_terminal(name), "' has dtype ", given,
                         ", which Ember does not support (it reads ", have,
                         "); convert the tensor to one of those before saving"));
      }
      return fail(
          absl::StrCat("dtype ", given, " is not a safetensors dtype Ember knows (", have, ")"));
    }
    e.dtype = d->second;
    if (shape->kind != Json::kArray) return fail("shape is not an array");
    if (shape->array.size() > static_cast<size_t>(kMaxCheckpointDims)) {
      return fail(absl::StrCat("shape has ", shape->array.size(),
                               " dimensions; checkpoints may have at most ", kMaxCheckpointDims));
    }
    uint64_t numel = 1;
    for (const Json& s : shape->array) {
      if (s.kind != Json::kNumber || !s.is_integer || s.integer < 0)
        return fail("shape holds a non-integer or negative size");
      e.shape.push_back(s.integer);
      if (__builtin_mul_overflow(numel, static_cast<uint64_t>(s.integer), &numel))
        return fail("shape overflows");
    }
    if (offsets->kind != Json::kArray || offsets->array.size() != 2 ||
        offsets->array[0].kind != Json::kNumber || offsets->array[1].kind != Json::kNumber ||
        !offsets->array[0].is_integer || !offsets->array[1].is_integer ||
        offsets->array[0].integer < 0 || offsets->array[1].integer < offsets->array[0].integer) {
      return fail("data_offsets is not [begin, end]");
    }
    e.begin = offsets->array[0].integer;
    e.end = offsets->array[1].integer;
    uint64_t nbytes;
    if (__builtin_mul_overflow(numel, element_size(e.dtype), &nbytes) ||
        nbytes != e.end - e.begin) {
      return fail(absl::StrCat("data_offsets [", e.begin, ", ", e.end, "] hold ", e.end - e.begin,
                               " bytes but shape [", absl::StrJoin(e.shape, ", "), "] of ",
                               dtype->s, " needs ", nbytes));
    }
    entries.push_back(std::move(e));
  }
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t covered = 0;
  for (const Entry& e : entries) {
    if (e.begin != covered) {
      return bad(absl::StrCat("tensor '", escape_for_terminal(e.name), "' starts at byte ", e.begin,
                              " but the previous data ends at ", covered, " (overlap or hole)"));
    }
    covered = e.end;
  }
  if (covered != data.size()) {
    return bad(absl::StrCat("the tensors cover ", covered, " bytes of data but the file holds ",
                            data.size(), covered > data.size() ? " (truncated?)" : ""));
  }
  StateDict sd;
  for (const Entry& e : entries) {
    Tensor t = empty(e.shape, TensorOptions(e.dtype));
    if (e.end > e.begin) std::memcpy(t.raw_data(), data.data() + e.begin, e.end - e.begin);
    sd.emplace_back(e.name, std::move(t));
  }
  return sd;
}

absl::StatusOr<std::string> write_safetensors(const StateDict& state_dict) {
  std::string header = "{";
  std::vector<Tensor> contiguous;
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : state_dict) {
    if (!names.insert(name).second || name == "__metadata__") {
      return absl::InvalidArgumentError(
          absl::StrCat("state_dict entry '", name, "' appears twice or is reserved"));
    }
    if (!tensor.defined() || !tensor.is_cpu()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "state_dict entry '", name, "' is not a CPU tensor; move it with .to(ember::kCPU)"));
    }
    Tensor c = tensor.contiguous();
    auto d = std::find_if(DtypeNames().begin(), DtypeNames().end(),
                          [&](const auto& p) { return p.second == c.dtype(); });
    if (contiguous.size() > 0) header += ",";
    AppendJsonString(&header, name);
    absl::StrAppend(&header, ":{\"dtype\":\"", d->first, "\",\"shape\":[",
                    absl::StrJoin(c.sizes(), ","), "],\"data_offsets\":[", offset, ",",
                    offset + c.nbytes(), "]}");
    offset += c.nbytes();
    contiguous.push_back(std::move(c));
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8,
                ' ');  // keeps the data 8-byte aligned
  std::string out(8, '\0');
  uint64_t len = header.size();
  std::memcpy(out.data(), &len, 8);
  out += header;
  out.reserve(out.size() + offset);
  for (const Tensor& c : contiguous) {
    if (c.nbytes() > 0) out.append(static_cast<const char*>(c.raw_data()), c.nbytes());
  }
  return out;
}

}  // namespace ember::serialization
