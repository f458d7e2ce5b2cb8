#include "distributed/checkpoint/metadata.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <variant>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "tensor/shape.h"
#include "tensor/status_macros.h"

namespace ember::distributed::checkpoint {
namespace {

// --- Writing -------------------------------------------------------------------

void AppendString(std::string* out, absl::string_view s) {
  out->push_back('"');
  for (char c : s) {
    switch (c) {
      case '"': out->append("\\\""); break;
      case '\\': out->append("\\\\"); break;
      case '\n': out->append("\\n"); break;
      case '\t': out->append("\\t"); break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          absl::StrAppendFormat(out, "\\u%04x", static_cast<unsigned char>(c));
        } else {
          out->push_back(c);
        }
    }
  }
  out->push_back('"');
}

template <typename Ints>
void AppendInts(std::string* out, const Ints& ints) {
  out->push_back('[');
  for (size_t i = 0; i < ints.size(); ++i) {
    if (i > 0) out->append(", ");
    absl::StrAppend(out, ints[i]);
  }
  out->push_back(']');
}

// --- Reading: a small JSON parser (objects, arrays, strings, integers) --------

struct Json;
using JsonObject = std::vector<std::pair<std::string, Json>>;
using JsonArray = std::vector<Json>;
struct Json {
  std::variant<std::monostate, int64_t, std::string, JsonArray, JsonObject, bool> v;
};

constexpr int kMaxDepth = 32;

class Parser {
 public:
  explicit Parser(absl::string_view text) : s_(text) {}

  absl::StatusOr<Json> ParseDocument() {
    EMBER_ASSIGN_OR_RETURN(Json j, ParseValue(0));
    SkipSpace();
    if (pos_ != s_.size()) return Error("text after the end of the document");
    return j;
  }

 private:
  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(what, " at byte ", pos_));
  }
  void SkipSpace() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\n' || s_[pos_] == '\r' ||
                                s_[pos_] == '\t')) {
      ++pos_;
    }
  }
  bool Consume(char c) {
    SkipSpace();
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  absl::StatusOr<Json> ParseValue(int depth) {
    if (depth > kMaxDepth) return Error("nesting deeper than 32 levels");
    SkipSpace();
    if (pos_ >= s_.size()) return Error("unexpected end of the document");
    char c = s_[pos_];
    Json out;
    if (c == '{') {
      ++pos_;
      JsonObject obj;
      if (!Consume('}')) {
        do {
          SkipSpace();
          EMBER_ASSIGN_OR_RETURN(std::string key, ParseString());
          if (!Consume(':')) return Error("expected ':'");
          EMBER_ASSIGN_OR_RETURN(Json value, ParseValue(depth + 1));
          obj.emplace_back(std::move(key), std::move(value));
        } while (Consume(','));
        if (!Consume('}')) return Error("expected ',' or '}'");
      }
      out.v = std::move(obj);
    } else if (c == '[') {
      ++pos_;
      JsonArray arr;
      if (!Consume(']')) {
        do {
          EMBER_ASSIGN_OR_RETURN(Json value, ParseValue(depth + 1));
          arr.push_back(std::move(value));
        } while (Consume(','));
        if (!Consume(']')) return Error("expected ',' or ']'");
      }
      out.v = std::move(arr);
    } else if (c == '"') {
      EMBER_ASSIGN_OR_RETURN(std::string str, ParseString());
      out.v = std::move(str);
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      bool negative = c == '-';
      if (negative) ++pos_;
      size_t start = pos_;
      uint64_t value = 0;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
        uint64_t digit = s_[pos_] - '0';
        if (value > (uint64_t{1} << 63) / 10) return Error("an integer beyond 64 bits");
        value = value * 10 + digit;
        ++pos_;
      }
      if (pos_ == start) return Error("expected a digit");
      if (pos_ < s_.size() && (s_[pos_] == '.' || s_[pos_] == 'e' || s_[pos_] == 'E')) {
        return Error("a number that is not an integer");
      }
      if (value > (negative ? (uint64_t{1} << 63) : (uint64_t{1} << 63) - 1)) {
        return Error("an integer beyond 64 bits");
      }
      out.v = negative ? static_cast<int64_t>(0 - value) : static_cast<int64_t>(value);
    } else if (s_.substr(pos_, 4) == "true") {
      pos_ += 4;
      out.v = true;
    } else if (s_.substr(pos_, 5) == "false") {
      pos_ += 5;
      out.v = false;
    } else if (s_.substr(pos_, 4) == "null") {
      pos_ += 4;
    } else {
      return Error(absl::StrCat("unexpected character '", std::string(1, c), "'"));
    }
    return out;
  }

  static void AppendUtf8(std::string* out, uint32_t cp) {
    if (cp < 0x80) {
      out->push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out->push_back(static_cast<char>(0xc0 | (cp >> 6)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    } else if (cp < 0x10000) {
      out->push_back(static_cast<char>(0xe0 | (cp >> 12)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    } else {
      out->push_back(static_cast<char>(0xf0 | (cp >> 18)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    }
  }

  absl::StatusOr<uint32_t> ParseHex4() {
    if (pos_ + 4 > s_.size()) return Error("a short \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      char h = s_[pos_++];
      v <<= 4;
      if (h >= '0' && h <= '9') v |= h - '0';
      else if (h >= 'a' && h <= 'f') v |= h - 'a' + 10;
      else if (h >= 'A' && h <= 'F') v |= h - 'A' + 10;
      else return Error("a bad \\u escape");
    }
    return v;
  }

  absl::StatusOr<std::string> ParseString() {
    if (pos_ >= s_.size() || s_[pos_] != '"') return Error("expected a string");
    ++pos_;
    std::string out;
    while (true) {
      if (pos_ >= s_.size()) return Error("an unterminated string");
      char c = s_[pos_++];
      if (c == '"') return out;
      if (c != '\\') {
        out.push_back(c);
        continue;
      }
      if (pos_ >= s_.size()) return Error("an unterminated string");
      char e = s_[pos_++];
      switch (e) {
        case '"': out.push_back('"'); break;
        case '\\': out.push_back('\\'); break;
        case '/': out.push_back('/'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'u': {
          EMBER_ASSIGN_OR_RETURN(uint32_t cp, ParseHex4());
          if (cp >= 0xd800 && cp < 0xdc00 && s_.substr(pos_, 2) == "\\u") {
            pos_ += 2;
            EMBER_ASSIGN_OR_RETURN(uint32_t low, ParseHex4());
            if (low < 0xdc00 || low >= 0xe000) return Error("a bad surrogate pair");
            cp = 0x10000 + ((cp - 0xd800) << 10) + (low - 0xdc00);
          }
          AppendUtf8(&out, cp);
          break;
        }
        default:
          return Error(absl::StrCat("an unknown escape '\\", std::string(1, e), "'"));
      }
    }
  }

  absl::string_view s_;
  size_t pos_ = 0;
};

// Typed access to a parsed document; errors name the field's path.
class Reader {
 public:
  Reader(absl::string_view source) : source_(source) {}

  absl::Status Bad(absl::string_view path, absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat("distributed checkpoint metadata ", source_,
                                                   ": ", path, ": ", what));
  }

  absl::StatusOr<const Json*> Field(const Json& obj, absl::string_view path,
                                    absl::string_view name) const {
    const auto* o = std::get_if<JsonObject>(&obj.v);
    if (o == nullptr) return Bad(path, "expected an object");
    for (const auto& [k, v] : *o) {
      if (k == name) return &v;
    }
    return Bad(path, absl::StrCat("the field \"", name, "\" is missing"));
  }
  absl::StatusOr<int64_t> Int(const Json& obj, absl::string_view path, absl::string_view name) const {
    EMBER_ASSIGN_OR_RETURN(const Json* j, Field(obj, path, name));
    const auto* i = std::get_if<int64_t>(&j->v);
    if (i == nullptr) return Bad(path, absl::StrCat("\"", name, "\" must be an integer"));
    return *i;
  }
  absl::StatusOr<std::string> String(const Json& obj, absl::string_view path,
                                     absl::string_view name) const {
    EMBER_ASSIGN_OR_RETURN(const Json* j, Field(obj, path, name));
    const auto* s = std::get_if<std::string>(&j->v);
    if (s == nullptr) return Bad(path, absl::StrCat("\"", name, "\" must be a string"));
    return *s;
  }
  absl::StatusOr<const JsonArray*> Array(const Json& obj, absl::string_view path,
                                         absl::string_view name) const {
    EMBER_ASSIGN_OR_RETURN(const Json* j, Field(obj, path, name));
    const auto* a = std::get_if<JsonArray>(&j->v);
    if (a == nullptr) return Bad(path, absl::StrCat("\"", name, "\" must be an array"));
    return a;
  }
  absl::StatusOr<SizeVector> Ints(const Json& obj, absl::string_view path,
                                  absl::string_view name) const {
    EMBER_ASSIGN_OR_RETURN(const JsonArray* a, Array(obj, path, name));
    SizeVector out;
    for (const Json& j : *a) {
      const auto* i = std::get_if<int64_t>(&j.v);
      if (i == nullptr || *i < 0) {
        return Bad(path, absl::StrCat("\"", name, "\" must hold non-negative integers"));
      }
      out.push_back(*i);
    }
    return out;
  }

 private:
  absl::string_view source_;
};

}  // namespace

const TensorMetadata* Metadata::find(absl::string_view key) const {
  for (const auto& [k, t] : tensors) {
    if (k == key) return &t;
  }
  return nullptr;
}

absl::StatusOr<Dtype> dtype_from_name(absl::string_view name) {
  for (Dtype d : kAllDtypes) {
    if (std::string(dtype_name(d)) == name) return d;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype \"", name, "\""));
}

std::string encode_metadata(const Metadata& metadata) {
  std::string out = "{\n";
  absl::StrAppend(&out, "  \"format\": \"", kFormatName, "\",\n");
  absl::StrAppend(&out, "  \"version\": ", metadata.version, ",\n");
  absl::StrAppend(&out, "  \"world_size\": ", metadata.world_size, ",\n");
  out.append("  \"tensors\": [");
  for (size_t t = 0; t < metadata.tensors.size(); ++t) {
    const auto& [key, tm] = metadata.tensors[t];
    out.append(t == 0 ? "\n    {\"key\": " : ",\n    {\"key\": ");
    AppendString(&out, key);
    absl::StrAppend(&out, ", \"dtype\": \"", std::string(dtype_name(tm.dtype)), "\", \"shape\": ");
    AppendInts(&out, tm.global_shape);
    out.append(", \"chunks\": [");
    for (size_t c = 0; c < tm.chunks.size(); ++c) {
      const ChunkMetadata& ch = tm.chunks[c];
      out.append(c == 0 ? "\n      {\"offsets\": " : ",\n      {\"offsets\": ");
      AppendInts(&out, ch.offsets);
      out.append(", \"sizes\": ");
      AppendInts(&out, ch.sizes);
      out.append(", \"file\": ");
      AppendString(&out, ch.file);
      absl::StrAppend(&out, ", \"offset\": ", ch.offset, ", \"length\": ", ch.length,
                      ", \"block_bytes\": ", ch.block_bytes, ", \"crc32c\": ");
      AppendInts(&out, ch.crc32c);
      out.push_back('}');
    }
    out.append(tm.chunks.empty() ? "]}" : "\n    ]}");
  }
  out.append(metadata.tensors.empty() ? "]\n}\n" : "\n  ]\n}\n");
  return out;
}

absl::StatusOr<Metadata> decode_metadata(absl::string_view json, absl::string_view source) {
  Parser parser(json);
  absl::StatusOr<Json> doc = parser.ParseDocument();
  if (!doc.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("distributed checkpoint metadata ", source,
                                                   " is not valid JSON: ",
                                                   doc.status().message()));
  }
  Reader r(source);
  Metadata md;
  EMBER_ASSIGN_OR_RETURN(std::string format, r.String(*doc, "top level", "format"));
  if (format != kFormatName) {
    return r.Bad("format", absl::StrCat("is \"", format, "\", expected \"", kFormatName, "\""));
  }
  EMBER_ASSIGN_OR_RETURN(int64_t version, r.Int(*doc, "top level", "version"));
  if (version < 1 || version > kFormatVersion) {
    return r.Bad("version", absl::StrCat("is ", version, "; this build reads versions 1 to ",
                                         kFormatVersion, " (a newer Ember wrote it?)"));
  }
  md.version = static_cast<int>(version);
  EMBER_ASSIGN_OR_RETURN(int64_t world, r.Int(*doc, "top level", "world_size"));
  if (world < 1 || world > (1 << 24)) return r.Bad("world_size", absl::StrCat("is ", world));
  md.world_size = static_cast<int>(world);
  EMBER_ASSIGN_OR_RETURN(const JsonArray* tensors, r.Array(*doc, "top level", "tensors"));
  for (size_t t = 0; t < tensors->size(); ++t) {
    const Json& tj = (*tensors)[t];
    std::string path = absl::StrCat("tensors[", t, "]");
    EMBER_ASSIGN_OR_RETURN(std::string key, r.String(tj, path, "key"));
    path = absl::StrCat("tensor \"", key, "\"");
    if (md.find(key) != nullptr) return r.Bad(path, "appears twice");
    TensorMetadata tm;
    EMBER_ASSIGN_OR_RETURN(std::string dtype, r.String(tj, path, "dtype"));
    absl::StatusOr<Dtype> d = dtype_from_name(dtype);
    if (!d.ok()) return r.Bad(path, d.status().message());
    tm.dtype = *d;
    EMBER_ASSIGN_OR_RETURN(tm.global_shape, r.Ints(tj, path, "shape"));
    EMBER_ASSIGN_OR_RETURN(const JsonArray* chunks, r.Array(tj, path, "chunks"));
    for (size_t c = 0; c < chunks->size(); ++c) {
      const Json& cj = (*chunks)[c];
      std::string cpath = absl::StrCat(path, " chunk ", c);
      ChunkMetadata ch;
      EMBER_ASSIGN_OR_RETURN(ch.offsets, r.Ints(cj, cpath, "offsets"));
      EMBER_ASSIGN_OR_RETURN(ch.sizes, r.Ints(cj, cpath, "sizes"));
      EMBER_ASSIGN_OR_RETURN(ch.file, r.String(cj, cpath, "file"));
      EMBER_ASSIGN_OR_RETURN(ch.offset, r.Int(cj, cpath, "offset"));
      EMBER_ASSIGN_OR_RETURN(ch.length, r.Int(cj, cpath, "length"));
      EMBER_ASSIGN_OR_RETURN(ch.block_bytes, r.Int(cj, cpath, "block_bytes"));
      EMBER_ASSIGN_OR_RETURN(SizeVector crcs, r.Ints(cj, cpath, "crc32c"));
      if (ch.offsets.size() != tm.global_shape.size() ||
          ch.sizes.size() != tm.global_shape.size()) {
        return r.Bad(cpath, absl::StrCat("offsets ", ShapeToString(ch.offsets), " and sizes ",
                                         ShapeToString(ch.sizes), " do not match the shape ",
                                         ShapeToString(tm.global_shape)));
      }
      for (size_t d = 0; d < tm.global_shape.size(); ++d) {
        if (ch.offsets[d] + ch.sizes[d] > tm.global_shape[d]) {
          return r.Bad(cpath, absl::StrCat("offsets ", ShapeToString(ch.offsets), " + sizes ",
                                           ShapeToString(ch.sizes), " leave the shape ",
                                           ShapeToString(tm.global_shape)));
        }
      }
      if (ch.file.empty() || ch.file.find('/') != std::string::npos || ch.file[0] == '.') {
        return r.Bad(cpath, absl::StrCat("file \"", ch.file,
                                         "\" is not a plain name inside the checkpoint"));
      }
      const int64_t want = Numel(ch.sizes) * static_cast<int64_t>(element_size(tm.dtype));
      if (ch.offset < 0 || ch.length != want) {
        return r.Bad(cpath, absl::StrCat("offset ", ch.offset, " / length ", ch.length,
                                         " (expected ", want, " bytes)"));
      }
      const int64_t blocks =
          ch.block_bytes > 0 ? (ch.length + ch.block_bytes - 1) / ch.block_bytes : -1;
      if (ch.block_bytes <= 0 || static_cast<int64_t>(crcs.size()) != blocks) {
        return r.Bad(cpath, absl::StrCat("block_bytes ", ch.block_bytes, " and ", crcs.size(),
                                         " checksums do not cover ", ch.length, " bytes"));
      }
      for (int64_t v : crcs) {
        if (v > 0xffffffffLL) return r.Bad(cpath, "a crc32c beyond 32 bits");
        ch.crc32c.push_back(static_cast<uint32_t>(v));
      }
      tm.chunks.push_back(std::move(ch));
    }
    md.tensors.emplace_back(std::move(key), std::move(tm));
  }
  return md;
}

namespace {

// The text of `path`; NotFound when it does not exist.
absl::StatusOr<std::string> ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    if (err == ENOENT) return absl::NotFoundError(absl::StrCat(path, " does not exist"));
    return absl::InternalError(absl::StrCat("cannot open ", path, ": ", std::strerror(err)));
  }
  std::stringstream buf;
  buf << in.rdbuf();
  if (in.bad()) return absl::InternalError(absl::StrCat("cannot read ", path));
  return buf.str();
}

// Note [Collective-free saves] in checkpoint.h: the parts' union.
absl::StatusOr<Metadata> MergeParts(const std::string& dir, Metadata first) {
  const std::string part0 = absl::StrCat(dir, "/", kMetadataPartPrefix, 0, ".json");
  const int world = first.world_size;
  if (world < 1 || world > (1 << 24)) {
    return absl::InvalidArgumentError(absl::StrCat(part0, " claims a world size of ", world));
  }
  Metadata merged = std::move(first);
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < merged.tensors.size(); ++i) index[merged.tensors[i].first] = i;
  std::vector<int> missing;
  for (int r = 1; r < world; ++r) {
    const std::string path = absl::StrCat(dir, "/", kMetadataPartPrefix, r, ".json");
    absl::StatusOr<std::string> text = ReadText(path);
    if (absl::IsNotFound(text.status())) {
      missing.push_back(r);
      continue;
    }
    if (!text.ok()) return text.status();
    EMBER_ASSIGN_OR_RETURN(Metadata part, decode_metadata(*text, path));
    if (part.world_size != world) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, " was saved by a world of ", part.world_size, " ranks but ", part0,
                       " by ", world, "; the directory mixes two collective-free saves"));
    }
    for (auto& [key, tm] : part.tensors) {
      auto it = index.find(key);
      if (it == index.end()) {
        index[key] = merged.tensors.size();
        merged.tensors.emplace_back(key, std::move(tm));
        continue;
      }
      TensorMetadata& have = merged.tensors[it->second].second;
      if (have.dtype != tm.dtype || have.global_shape != tm.global_shape) {
        return absl::InvalidArgumentError(
            absl::StrCat("collective-free checkpoint ", dir, ": \"", key, "\" is ",
                         std::string(dtype_name(have.dtype)), " ", ShapeToString(have.global_shape),
                         " in an earlier rank's part but ", std::string(dtype_name(tm.dtype)), " ",
                         ShapeToString(tm.global_shape), " in rank ", r, "'s"));
      }
      for (ChunkMetadata& ch : tm.chunks) {
        const bool seen = std::any_of(have.chunks.begin(), have.chunks.end(), [&](const auto& c) {
          return c.offsets == ch.offsets && c.sizes == ch.sizes;
        });
        if (!seen) have.chunks.push_back(std::move(ch));
      }
    }
  }
  if (!missing.empty()) {
    std::vector<std::string> names;
    for (int r : missing) names.push_back(absl::StrCat(r));
    return absl::NotFoundError(
        absl::StrCat("collective-free checkpoint ", dir, " is incomplete: the parts of rank",
                     missing.size() > 1 ? "s " : " ", absl::StrJoin(names, ", "), " of ", world,
                     " are missing (their save is still running, failed, or the rank died)"));
  }
  return merged;
}

}  // namespace

absl::StatusOr<Metadata> read_metadata(const std::string& checkpoint_dir) {
  const std::string path = absl::StrCat(checkpoint_dir, "/", kMetadataFileName);
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    const std::string part0 = absl::StrCat(checkpoint_dir, "/", kMetadataPartPrefix, 0, ".json");
    if (err == ENOENT) {
      absl::StatusOr<std::string> text = ReadText(part0);
      if (text.ok()) {
        EMBER_ASSIGN_OR_RETURN(Metadata first, decode_metadata(*text, part0));
        return MergeParts(checkpoint_dir, std::move(first));
      }
      if (!absl::IsNotFound(text.status())) return text.status();
      // Other ranks' parts without rank 0's: an incomplete collective-free save.
      std::error_code ec;
      for (const auto& entry : std::filesystem::directory_iterator(checkpoint_dir, ec)) {
        const std::string name = entry.path().filename().string();
        if (name.rfind(kMetadataPartPrefix, 0) == 0 && absl::EndsWith(name, ".json")) {
          return absl::NotFoundError(absl::StrCat(
              "collective-free checkpoint ", checkpoint_dir,
              " is incomplete: the part of rank 0 is missing (its save is still running, "
              "failed, or the rank died)"));
        }
      }
    }
    if (err == ENOENT) {
      return absl::NotFoundError(absl::StrCat(
          "no distributed checkpoint at ", checkpoint_dir, ": ", path,
          " does not exist (was the save interrupted? an interrupted save leaves the "
          "previous checkpoint in place and a <path>.tmp-* directory beside it)"));
    }
    return absl::InternalError(absl::StrCat("cannot open ", path, ": ", std::strerror(err)));
  }
  std::stringstream buf;
  buf << in.rdbuf();
  if (in.bad()) return absl::InternalError(absl::StrCat("cannot read ", path));
  return decode_metadata(buf.str(), path);
}

}  // namespace ember::distributed::checkpoint
