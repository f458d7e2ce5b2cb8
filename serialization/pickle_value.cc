#include "serialization/pickle_value.h"

#include <cstring>
#include <deque>
#include <map>
#include <optional>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "serialization/printable.h"
#include "tensor/allocator.h"
#include "tensor/error.h"
#include "tensor/status_macros.h"

// Note [Value unpickler]
// ~~~~~~~~~~~~~~~~~~~~~~
// Like the state-dict unpickler (Note [Restricted unpickler] in pickle.cc),
// this one is an interpreter of its own that imports and calls nothing. It
// knows the binary opcodes Python's pickler emits for None, bools, ints,
// floats, str, bytes, lists, tuples and dicts, the memo, framing, and four
// globals, each given a meaning here:
//   collections.OrderedDict          -> a dict (REDUCE with ())
//   torch._utils._rebuild_tensor_v2  -> a tensor view of a storage (REDUCE)
//   torch._utils._rebuild_parameter  -> the tensor it wraps (REDUCE)
//   torch.storage._load_from_bytes   -> a storage, from the legacy torch.save
//                                       bytes it is given (REDUCE)
// Inside _load_from_bytes' bytes, a second run of the same interpreter reads
// the legacy file's pickles, where BINPERSID and torch.<Type>Storage (a
// dtype) are allowed and the four globals above are not.
//
// The program builds nodes in an arena (a deque) that hold plain pointers to
// each other, as Python's objects hold references: the memo, the stack and
// containers share nodes, a list grows after it was memoized, and nothing
// recurses while the program runs, so a few bytes that nest a million
// levels cost a million small nodes and no stack. Only the final conversion
// to PickleValue recurses, and it stops at kMaxPickleValueNesting (which
// also ends cycles a hostile program can build). Memo references copy a node
// into every place it appears, so the conversion charges each node it
// produces (one unit, plus its string's bytes) against a budget proportional
// to the input; a program that doubles a value with each BINGET runs out of
// budget instead of memory.

namespace ember::serialization {

// --- PickleValue ------------------------------------------------------------

PickleValue PickleValue::Bytes(std::string bytes) {
  PickleValue v;
  v.kind_ = Kind::kBytes;
  v.s_ = std::move(bytes);
  return v;
}

PickleValue PickleValue::List(Items items) {
  PickleValue v;
  v.kind_ = Kind::kList;
  v.items_ = std::move(items);
  return v;
}

PickleValue PickleValue::Tuple(Items items) {
  PickleValue v;
  v.kind_ = Kind::kTuple;
  v.items_ = std::move(items);
  return v;
}

PickleValue PickleValue::Dict(Pairs pairs) {
  PickleValue v;
  v.kind_ = Kind::kDict;
  v.pairs_ = std::move(pairs);
  return v;
}

const char* PickleValue::KindName(Kind kind) {
  switch (kind) {
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kBytes:
      return "bytes";
    case Kind::kList:
      return "list";
    case Kind::kTuple:
      return "tuple";
    case Kind::kDict:
      return "dict";
    case Kind::kTensor:
      return "Tensor";
  }
  return "?";
}

namespace {
void CheckKind(bool ok, PickleValue::Kind have, const char* want) {
  EMBER_CHECK(ok, "PickleValue: want a ", want, ", have a ", PickleValue::KindName(have));
}
}  // namespace

bool PickleValue::as_bool() const {
  CheckKind(kind_ == Kind::kBool, kind_, "bool");
  return i_ != 0;
}
int64_t PickleValue::as_int() const {
  CheckKind(kind_ == Kind::kInt, kind_, "int");
  return i_;
}
double PickleValue::as_float() const {
  CheckKind(kind_ == Kind::kFloat, kind_, "float");
  return f_;
}
const std::string& PickleValue::as_string() const {
  CheckKind(kind_ == Kind::kString || kind_ == Kind::kBytes, kind_, "str or bytes");
  return s_;
}
const PickleValue::Items& PickleValue::items() const {
  CheckKind(kind_ == Kind::kList || kind_ == Kind::kTuple, kind_, "list or tuple");
  return items_;
}
PickleValue::Items& PickleValue::mutable_items() {
  CheckKind(kind_ == Kind::kList || kind_ == Kind::kTuple, kind_, "list or tuple");
  return items_;
}
const PickleValue::Pairs& PickleValue::pairs() const {
  CheckKind(kind_ == Kind::kDict, kind_, "dict");
  return pairs_;
}
PickleValue::Pairs& PickleValue::mutable_pairs() {
  CheckKind(kind_ == Kind::kDict, kind_, "dict");
  return pairs_;
}
const Tensor& PickleValue::as_tensor() const {
  CheckKind(kind_ == Kind::kTensor, kind_, "Tensor");
  return tensor_;
}

const PickleValue* PickleValue::at(const PickleValue& key) const {
  for (const auto& [k, v] : pairs()) {
    if (k == key) return &v;
  }
  return nullptr;
}

bool PickleValue::operator==(const PickleValue& other) const {
  if (kind_ != other.kind_) return false;
  switch (kind_) {
    case Kind::kNone:
      return true;
    case Kind::kBool:
    case Kind::kInt:
      return i_ == other.i_;
    case Kind::kFloat:
      return f_ == other.f_ || (f_ != f_ && other.f_ != other.f_);  // NaN == NaN here
    case Kind::kString:
    case Kind::kBytes:
      return s_ == other.s_;
    case Kind::kList:
    case Kind::kTuple:
      return items_ == other.items_;
    case Kind::kDict:
      return pairs_ == other.pairs_;
    case Kind::kTensor:
      if (tensor_.defined() != other.tensor_.defined()) return false;
      if (!tensor_.defined()) return true;
      return tensor_.dtype() == other.tensor_.dtype() && tensor_.sizes() == other.tensor_.sizes() &&
             tensor_.equal(other.tensor_);
  }
  return false;
}

namespace {
std::string Quoted(const std::string& s, bool bytes) {
  std::string out = bytes ? "b'" : "'";
  for (unsigned char c : s) {
    if (c == '\'' || c == '\\') {
      absl::StrAppend(&out, "\\", std::string(1, static_cast<char>(c)));
    } else if (c == '\n') {
      out += "\\n";
    } else if (c < 0x20 || c == 0x7f || (bytes && c >= 0x80)) {
      absl::StrAppend(&out, absl::StrFormat("\\x%02x", c));
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  out += "'";
  return out;
}
}  // namespace

std::string PickleValue::DebugString() const {
  switch (kind_) {
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return i_ ? "True" : "False";
    case Kind::kInt:
      return absl::StrCat(i_);
    case Kind::kFloat:
      return absl::StrFormat("%.17g", f_);
    case Kind::kString:
      return Quoted(s_, false);
    case Kind::kBytes:
      return Quoted(s_, true);
    case Kind::kList:
    case Kind::kTuple: {
      std::vector<std::string> parts;
      for (const PickleValue& v : items_) parts.push_back(v.DebugString());
      if (kind_ == Kind::kList) return absl::StrCat("[", absl::StrJoin(parts, ", "), "]");
      return absl::StrCat("(", absl::StrJoin(parts, ", "), parts.size() == 1 ? ",)" : ")");
    }
    case Kind::kDict: {
      std::vector<std::string> parts;
      for (const auto& [k, v] : pairs_) {
        parts.push_back(absl::StrCat(k.DebugString(), ": ", v.DebugString()));
      }
      return absl::StrCat("{", absl::StrJoin(parts, ", "), "}");
    }
    case Kind::kTensor:
      if (!tensor_.defined()) return "tensor(undefined)";
      return absl::StrCat("tensor(", std::string(dtype_name(tensor_.dtype())), ", sizes=[",
                          absl::StrJoin(tensor_.sizes(), ", "), "])");
  }
  return "?";
}

namespace {

// --- Opcodes ------------------------------------------------------------------

enum Op : unsigned char {
  kMark = '(',
  kStop = '.',
  kPop = '0',
  kPopMark = '1',
  kDup = '2',
  kBinFloat = 'G',
  kBinInt = 'J',
  kBinInt1 = 'K',
  kBinInt2 = 'M',
  kNone = 'N',
  kBinPersId = 'Q',
  kReduce = 'R',
  kBinUnicode = 'X',
  kAppend = 'a',
  kGlobal = 'c',
  kDict = 'd',
  kEmptyDict = '}',
  kAppends = 'e',
  kBinGet = 'h',
  kLongBinGet = 'j',
  kList = 'l',
  kEmptyList = ']',
  kBinPut = 'q',
  kLongBinPut = 'r',
  kSetItem = 's',
  kTuple = 't',
  kEmptyTuple = ')',
  kSetItems = 'u',
  kBinBytes = 'B',
  kShortBinBytes = 'C',
  kProto = 0x80,
  kTuple1 = 0x85,
  kTuple2 = 0x86,
  kTuple3 = 0x87,
  kNewTrue = 0x88,
  kNewFalse = 0x89,
  kLong1 = 0x8a,
  kLong4 = 0x8b,
  kShortBinUnicode = 0x8c,
  kBinUnicode8 = 0x8d,
  kBinBytes8 = 0x8e,
  kStackGlobal = 0x93,
  kMemoize = 0x94,
  kFrame = 0x95,
  kByteArray8 = 0x96,
};

constexpr size_t kFrameSizeTarget = 64 * 1024;  // Python's FRAME_SIZE_TARGET
constexpr size_t kFrameSizeMin = 4;             // Python's FRAME_SIZE_MIN
constexpr size_t kFrameHeader = 9;
constexpr int kBatchSize = 1000;  // items per APPENDS / SETITEMS, as Python

// The magic number that opens a legacy torch.save file, 0x1950a86a20f9469cfc6c,
// as the little-endian bytes of its LONG1.
constexpr char kLegacyMagic[] = "\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19";
constexpr size_t kLegacyMagicSize = sizeof(kLegacyMagic) - 1;
constexpr int64_t kLegacyProtocol = 1001;

constexpr char kOrderedDict[] = "collections.OrderedDict";
constexpr char kRebuildTensor[] = "torch._utils._rebuild_tensor_v2";
constexpr char kRebuildParameter[] = "torch._utils._rebuild_parameter";
constexpr char kLoadFromBytes[] = "torch.storage._load_from_bytes";

// PyTorch's legacy storage classes and their dtypes.
const std::map<std::string, Dtype>& StorageClasses() {
  static const auto* classes = new std::map<std::string, Dtype>{
      {"FloatStorage", kFloat32},     {"DoubleStorage", kFloat64}, {"HalfStorage", kFloat16},
      {"BFloat16Storage", kBFloat16}, {"LongStorage", kInt64},     {"IntStorage", kInt32},
      {"ShortStorage", kInt16},       {"CharStorage", kInt8},      {"ByteStorage", kUInt8},
      {"BoolStorage", kBool}};
  return *classes;
}

absl::StatusOr<std::string> StorageClassOf(Dtype dtype) {
  for (const auto& [name, d] : StorageClasses()) {
    if (d == dtype) return name;
  }
  return absl::InvalidArgumentError(absl::StrCat("pickle_value: a tensor of dtype ",
                                                 std::string(dtype_name(dtype)),
                                                 " has no PyTorch storage class to pickle"));
}

void AppendLE(std::string* out, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// Python's encode_long: the fewest little-endian two's-complement bytes.
std::string EncodeLong(int64_t v) {
  if (v == 0) return "";
  const __int128 x = v;
  const unsigned __int128 mag = x < 0 ? static_cast<unsigned __int128>(-x) : x;
  int nbits = 0;
  for (unsigned __int128 m = mag; m != 0; m >>= 1) ++nbits;
  int nbytes = (nbits >> 3) + 1;
  std::string out;
  const unsigned __int128 bits = static_cast<unsigned __int128>(x);
  for (int i = 0; i < nbytes; ++i) out.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
  if (v < 0 && nbytes > 1 && static_cast<unsigned char>(out[nbytes - 1]) == 0xff &&
      (static_cast<unsigned char>(out[nbytes - 2]) & 0x80) != 0) {
    out.pop_back();
  }
  return out;
}

// --- Pickler ------------------------------------------------------------------

// The output of Python's C pickler: opcodes go into frames of about
// kFrameSizeTarget bytes (protocol 4 and up); a str or bytes payload of at
// least that size is written outside any frame, after its opcode and length.
class Pickler {
 public:
  explicit Pickler(int protocol) : protocol_(protocol) {}

  absl::Status Dump(const PickleValue& value) {
    Write(std::string{static_cast<char>(kProto), static_cast<char>(protocol_)});
    framing_ = protocol_ >= 4;
    EMBER_RETURN_IF_ERROR(Save(value, 0));
    Write(std::string(1, static_cast<char>(kStop)));
    CommitFrame();
    return absl::OkStatus();
  }

  std::string Take() { return std::move(out_); }

 private:
  void Write(absl::string_view data) {
    if (framing_ && frame_start_ < 0) {
      frame_start_ = static_cast<ptrdiff_t>(out_.size());
      out_.append(kFrameHeader, '\0');
    }
    out_.append(data.data(), data.size());
  }
  void WriteOp(unsigned char op) { Write(absl::string_view(reinterpret_cast<char*>(&op), 1)); }

  void CommitFrame() {
    if (!framing_ || frame_start_ < 0) return;
    const size_t len = out_.size() - frame_start_ - kFrameHeader;
    if (len >= kFrameSizeMin) {
      std::string header(1, static_cast<char>(kFrame));
      AppendLE(&header, len, 8);
      out_.replace(frame_start_, kFrameHeader, header);
    } else {
      out_.erase(frame_start_, kFrameHeader);
    }
    frame_start_ = -1;
  }

  void OpcodeBoundary() {
    if (!framing_ || frame_start_ < 0) return;
    if (out_.size() - frame_start_ - kFrameHeader >= kFrameSizeTarget) CommitFrame();
  }

  void WriteBytes(const std::string& header, const std::string& data) {
    const bool bypass = data.size() >= kFrameSizeTarget;
    const bool framing = framing_;
    if (bypass) {
      CommitFrame();
      framing_ = false;
    }
    Write(header);
    Write(data);
    framing_ = framing;
  }

  void Memoize() {
    if (protocol_ >= 4) {
      WriteOp(kMemoize);
    } else if (memo_ < 256) {
      Write(std::string{static_cast<char>(kBinPut), static_cast<char>(memo_)});
    } else {
      std::string op(1, static_cast<char>(kLongBinPut));
      AppendLE(&op, memo_, 4);
      Write(op);
    }
    ++memo_;
  }

  void SaveInt(int64_t v) {
    std::string op;
    if (v >= 0 && v <= 0xff) {
      op = {static_cast<char>(kBinInt1), static_cast<char>(v)};
    } else if (v >= 0 && v <= 0xffff) {
      op = std::string(1, static_cast<char>(kBinInt2));
      AppendLE(&op, v, 2);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
      op = std::string(1, static_cast<char>(kBinInt));
      AppendLE(&op, static_cast<uint32_t>(v), 4);
    } else {
      const std::string bytes = EncodeLong(v);
      op = {static_cast<char>(kLong1), static_cast<char>(bytes.size())};
      op += bytes;
    }
    Write(op);
  }

  void SaveString(const std::string& s) {
    std::string header;
    if (s.size() <= 0xff && protocol_ >= 4) {
      header = {static_cast<char>(kShortBinUnicode), static_cast<char>(s.size())};
    } else if (s.size() > 0xffffffffu && protocol_ >= 4) {
      header = std::string(1, static_cast<char>(kBinUnicode8));
      AppendLE(&header, s.size(), 8);
    } else {
      header = std::string(1, static_cast<char>(kBinUnicode));
      AppendLE(&header, s.size(), 4);
    }
    WriteBytes(header, s);
    Memoize();
  }

  void SaveBytes(const std::string& s) {
    std::string header;
    if (s.size() <= 0xff) {
      header = {static_cast<char>(kShortBinBytes), static_cast<char>(s.size())};
    } else if (s.size() <= 0xffffffffu) {
      header = std::string(1, static_cast<char>(kBinBytes));
      AppendLE(&header, s.size(), 4);
    } else {
      header = std::string(1, static_cast<char>(kBinBytes8));
      AppendLE(&header, s.size(), 8);
    }
    WriteBytes(header, s);
    Memoize();
  }

  void SaveGlobal(const std::string& module, const std::string& name) {
    if (protocol_ >= 4) {
      SaveString(module);
      SaveString(name);
      WriteOp(kStackGlobal);
    } else {
      Write(absl::StrCat(std::string(1, static_cast<char>(kGlobal)), module, "\n", name, "\n"));
    }
    Memoize();
  }

  // A tuple of ints (a tensor's sizes or strides), as save_tuple writes one.
  void SaveIntTuple(IntArrayRef values) {
    if (values.empty()) {
      WriteOp(kEmptyTuple);
      return;
    }
    if (values.size() > 3) WriteOp(kMark);
    for (int64_t v : values) SaveInt(v);
    WriteOp(values.size() == 1   ? kTuple1
            : values.size() == 2 ? kTuple2
            : values.size() == 3 ? kTuple3
                                 : kTuple);
    Memoize();
  }

  absl::Status SaveTensor(const Tensor& given) {
    if (!given.defined()) {
      return absl::InvalidArgumentError("pickle_value: an undefined tensor cannot be pickled");
    }
    if (!given.is_cpu()) {
      return absl::InvalidArgumentError(
          absl::StrCat("pickle_value: a tensor on ", given.device().str(),
                       " cannot be pickled here; move it to the CPU first (tensor.cpu())"));
    }
    EMBER_ASSIGN_OR_RETURN(const std::string storage_class, StorageClassOf(given.dtype()));
    const Tensor t = given.contiguous();
    std::string legacy = LegacyStorageBytes(t, storage_class);
    SaveGlobal("torch._utils", "_rebuild_tensor_v2");
    WriteOp(kMark);
    SaveGlobal("torch.storage", "_load_from_bytes");
    SaveBytes(legacy);
    WriteOp(kTuple1);
    Memoize();
    WriteOp(kReduce);
    Memoize();
    SaveInt(0);
    SaveIntTuple(t.sizes());
    SaveIntTuple(t.strides());
    WriteOp(kNewFalse);
    SaveGlobal("collections", "OrderedDict");
    WriteOp(kEmptyTuple);
    WriteOp(kReduce);
    Memoize();
    WriteOp(kTuple);
    Memoize();
    WriteOp(kReduce);
    Memoize();
    return absl::OkStatus();
  }

  // torch.save(storage, _use_new_zipfile_serialization=False) of `t`'s
  // elements: protocol-2 pickles of the magic number, the protocol version,
  // sys_info, the storage (as a persistent id) and its key list, then the
  // element count and the bytes.
  static std::string LegacyStorageBytes(const Tensor& t, const std::string& storage_class) {
    auto proto2 = [](std::string* out) {
      out->push_back(static_cast<char>(kProto));
      out->push_back(2);
    };
    auto unicode = [](std::string* out, absl::string_view s) {
      out->push_back(static_cast<char>(kBinUnicode));
      AppendLE(out, s.size(), 4);
      out->append(s.data(), s.size());
    };
    auto int_op = [](std::string* out, int64_t v) {
      Pickler p(2);
      p.SaveInt(v);
      *out += p.out_;
    };
    std::string out;
    proto2(&out);
    out.push_back(static_cast<char>(kLong1));
    out.push_back(static_cast<char>(kLegacyMagicSize));
    out.append(kLegacyMagic, kLegacyMagicSize);
    out.push_back(static_cast<char>(kStop));
    proto2(&out);
    int_op(&out, kLegacyProtocol);
    out.push_back(static_cast<char>(kStop));
    // sys_info: {'protocol_version': 1001, 'little_endian': True,
    //            'type_sizes': {'short': 2, 'int': 4, 'long': 4}}
    proto2(&out);
    out += "}(";
    unicode(&out, "protocol_version");
    int_op(&out, kLegacyProtocol);
    unicode(&out, "little_endian");
    out.push_back(static_cast<char>(kNewTrue));
    unicode(&out, "type_sizes");
    out += "}(";
    unicode(&out, "short");
    int_op(&out, 2);
    unicode(&out, "int");
    int_op(&out, 4);
    unicode(&out, "long");
    int_op(&out, 4);
    out += "uu.";
    // The storage: persistent id ('storage', torch.<Class>, '0', 'cpu', numel, None).
    proto2(&out);
    out += "(";
    unicode(&out, "storage");
    out += absl::StrCat("ctorch\n", storage_class, "\n");
    unicode(&out, "0");
    unicode(&out, "cpu");
    int_op(&out, t.numel());
    out += "NtQ.";
    proto2(&out);
    out += "]";
    unicode(&out, "0");
    out += "a.";
    AppendLE(&out, static_cast<uint64_t>(t.numel()), 8);
    out.append(static_cast<const char*>(t.raw_data()), t.nbytes());
    return out;
  }

  absl::Status Save(const PickleValue& v, int depth) {
    using Kind = PickleValue::Kind;
    switch (v.kind()) {
      case Kind::kNone:
        WriteOp(kNone);
        break;
      case Kind::kBool:
        WriteOp(v.as_bool() ? kNewTrue : kNewFalse);
        break;
      case Kind::kInt:
        SaveInt(v.as_int());
        break;
      case Kind::kFloat: {
        std::string op(1, static_cast<char>(kBinFloat));
        uint64_t bits;
        const double f = v.as_float();
        std::memcpy(&bits, &f, 8);
        for (int i = 7; i >= 0; --i) op.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
        Write(op);
        break;
      }
      case Kind::kString:
        if (!is_valid_utf8(v.as_string())) {
          return absl::InvalidArgumentError(absl::StrCat(
              "pickle_value: str ", escape_for_terminal(v.as_string()),
              " is not valid UTF-8, which a Python str must be; use PickleValue::Bytes for bytes"));
        }
        SaveString(v.as_string());
        break;
      case Kind::kBytes:
        SaveBytes(v.as_string());
        break;
      case Kind::kTensor:
        EMBER_RETURN_IF_ERROR(SaveTensor(v.as_tensor()));
        break;
      case Kind::kList:
      case Kind::kTuple:
      case Kind::kDict:
        if (depth >= kMaxPickleValueNesting) {
          return absl::InvalidArgumentError(
              absl::StrCat("pickle_value: the value nests lists, tuples and dicts deeper than ",
                           kMaxPickleValueNesting, " levels"));
        }
        EMBER_RETURN_IF_ERROR(SaveContainer(v, depth + 1));
        break;
    }
    OpcodeBoundary();
    return absl::OkStatus();
  }

  absl::Status SaveContainer(const PickleValue& v, int depth) {
    using Kind = PickleValue::Kind;
    if (v.kind() == Kind::kTuple) {
      const auto& items = v.items();
      if (items.empty()) {
        WriteOp(kEmptyTuple);
        return absl::OkStatus();
      }
      if (items.size() > 3) WriteOp(kMark);
      for (const PickleValue& item : items) EMBER_RETURN_IF_ERROR(Save(item, depth));
      WriteOp(items.size() == 1   ? kTuple1
              : items.size() == 2 ? kTuple2
              : items.size() == 3 ? kTuple3
                                  : kTuple);
      Memoize();
      return absl::OkStatus();
    }
    if (v.kind() == Kind::kList) {
      const auto& items = v.items();
      WriteOp(kEmptyList);
      Memoize();
      if (items.size() == 1) {
        EMBER_RETURN_IF_ERROR(Save(items[0], depth));
        WriteOp(kAppend);
        return absl::OkStatus();
      }
      for (size_t i = 0; i < items.size();) {
        WriteOp(kMark);
        for (int n = 0; n < kBatchSize && i < items.size(); ++n, ++i) {
          EMBER_RETURN_IF_ERROR(Save(items[i], depth));
        }
        WriteOp(kAppends);
      }
      return absl::OkStatus();
    }
    const auto& pairs = v.pairs();
    for (const auto& [key, value] : pairs) {
      if (key.kind() != Kind::kString && key.kind() != Kind::kInt) {
        return absl::InvalidArgumentError(absl::StrCat("pickle_value: dict key ", key.DebugString(),
                                                       " is a ", PickleValue::KindName(key.kind()),
                                                       "; keys must be str or int"));
      }
    }
    WriteOp(kEmptyDict);
    Memoize();
    if (pairs.size() == 1) {
      EMBER_RETURN_IF_ERROR(Save(pairs[0].first, depth));
      EMBER_RETURN_IF_ERROR(Save(pairs[0].second, depth));
      WriteOp(kSetItem);
      return absl::OkStatus();
    }
    for (size_t i = 0; i < pairs.size();) {
      WriteOp(kMark);
      for (int n = 0; n < kBatchSize && i < pairs.size(); ++n, ++i) {
        EMBER_RETURN_IF_ERROR(Save(pairs[i].first, depth));
        EMBER_RETURN_IF_ERROR(Save(pairs[i].second, depth));
      }
      WriteOp(kSetItems);
    }
    return absl::OkStatus();
  }

  const int protocol_;
  std::string out_;
  bool framing_ = false;
  ptrdiff_t frame_start_ = -1;
  uint32_t memo_ = 0;
};

// --- Unpickler ----------------------------------------------------------------

struct Node {
  enum Kind {
    kNone,
    kBool,
    kInt,
    kBigInt,
    kFloat,
    kStr,
    kBytes,
    kList,
    kTuple,
    kDict,
    kTensor,
    kGlobal,
    kStorage
  };
  Kind kind = kNone;
  int64_t i = 0;
  double f = 0;
  std::string s;  // kStr, kBytes; kGlobal: "module.name"; kBigInt: its bytes
  std::vector<Node*> items;
  std::vector<std::pair<Node*, Node*>> pairs;
  Tensor tensor;
  Storage storage;  // kStorage
  Dtype dtype = kUInt8;
  int64_t numel = 0;
  std::string location;  // kStorage: the legacy persistent id's
};

const char* NodeKindName(Node::Kind k) {
  static const char* names[] = {"None", "bool",  "int",  "int",    "float",  "str",    "bytes",
                                "list", "tuple", "dict", "Tensor", "global", "storage"};
  return names[k];
}

absl::Status Bad(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("unpickle_value: ", what));
}

class Unpickler {
 public:
  // `legacy_storage`: the run inside torch.storage._load_from_bytes' bytes.
  Unpickler(absl::string_view data, size_t pos, bool legacy_storage)
      : data_(data), pos_(pos), legacy_storage_(legacy_storage) {}

  // Runs one pickle program to its STOP and returns what it built.
  absl::StatusOr<Node*> Run() {
    stack_.clear();
    marks_.clear();
    memo_.clear();
    while (true) {
      if (pos_ >= data_.size()) return Bad("the pickle ends before its STOP opcode (truncated?)");
      const size_t at = pos_;
      const unsigned char op = data_[pos_++];
      absl::Status s = Step(op, at);
      if (!s.ok()) return s;
      if (op == kStop) {
        if (stack_.size() != 1 || !marks_.empty()) {
          return Bad(absl::StrCat("STOP at byte ", at, " with ", stack_.size(),
                                  " values on the stack; want one"));
        }
        return stack_.back();
      }
    }
  }

  size_t pos() const { return pos_; }

  // Nodes in `pairs` of a dict, and other helpers for the legacy reader.
  static bool IsInt(const Node* n) { return n->kind == Node::kInt; }

 private:
  Node* Make(Node::Kind kind) {
    arena_.emplace_back();
    arena_.back().kind = kind;
    return &arena_.back();
  }

  absl::Status Need(size_t n, size_t at) {
    if (data_.size() - pos_ < n) {
      return Bad(absl::StrCat("opcode at byte ", at, " needs ", n, " more bytes; the pickle has ",
                              data_.size() - pos_, " (truncated?)"));
    }
    return absl::OkStatus();
  }
  uint64_t ReadLE(int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; ++i)
      v |= uint64_t{static_cast<unsigned char>(data_[pos_ + i])} << (8 * i);
    pos_ += n;
    return v;
  }

  absl::StatusOr<Node*> Pop(size_t at) {
    if (stack_.empty() || (!marks_.empty() && stack_.size() <= marks_.back())) {
      return Bad(absl::StrCat("opcode at byte ", at, " pops from an empty stack"));
    }
    Node* n = stack_.back();
    stack_.pop_back();
    return n;
  }
  absl::StatusOr<std::vector<Node*>> PopMark(size_t at) {
    if (marks_.empty()) return Bad(absl::StrCat("opcode at byte ", at, " needs a MARK"));
    const size_t m = marks_.back();
    marks_.pop_back();
    std::vector<Node*> items(stack_.begin() + m, stack_.end());
    stack_.resize(m);
    return items;
  }
  absl::StatusOr<Node*> Top(size_t at) {
    if (stack_.empty() || (!marks_.empty() && stack_.size() <= marks_.back())) {
      return Bad(absl::StrCat("opcode at byte ", at, " needs a value on the stack"));
    }
    return stack_.back();
  }

  absl::Status PushString(Node::Kind kind, uint64_t n, size_t at) {
    if (n > data_.size() - pos_) {
      return Bad(absl::StrCat("a string of ", n, " bytes at byte ", at, " runs past the pickle's ",
                              data_.size(), " bytes (truncated?)"));
    }
    Node* v = Make(kind);
    v->s.assign(data_.data() + pos_, n);
    pos_ += n;
    stack_.push_back(v);
    return absl::OkStatus();
  }

  absl::Status PushLong(uint64_t n, size_t at) {
    if (n > data_.size() - pos_) return Bad(absl::StrCat("LONG at byte ", at, " is truncated"));
    const absl::string_view bytes = data_.substr(pos_, n);
    pos_ += n;
    if (n > 8) {
      Node* v = Make(Node::kBigInt);
      v->s = std::string(bytes);
      stack_.push_back(v);
      return absl::OkStatus();
    }
    uint64_t u = 0;
    for (size_t i = 0; i < n; ++i) u |= uint64_t{static_cast<unsigned char>(bytes[i])} << (8 * i);
    if (n > 0 && n < 8 && (static_cast<unsigned char>(bytes[n - 1]) & 0x80)) {
      u |= ~uint64_t{0} << (8 * n);  // sign-extend
    }
    Node* v = Make(Node::kInt);
    v->i = static_cast<int64_t>(u);
    stack_.push_back(v);
    return absl::OkStatus();
  }

  absl::Status PushGlobal(const std::string& module, const std::string& name, size_t at) {
    const std::string full = absl::StrCat(module, ".", name);
    bool known = false;
    if (legacy_storage_) {
      known = module == "torch" && StorageClasses().contains(name);
    } else {
      known = full == kOrderedDict || full == kRebuildTensor || full == kRebuildParameter ||
              full == kLoadFromBytes;
    }
    if (!known) {
      return Bad(absl::StrCat(
          "refused global '", escape_for_terminal(full), "' at byte ", at,
          legacy_storage_ ? " inside a storage's bytes (only torch.<Type>Storage is allowed there)"
                          : "; this unpickler builds only None, bool, int, float, str, bytes, "
                            "list, tuple, dict, collections.OrderedDict and tensors, and never "
                            "imports or calls anything"));
    }
    Node* g = Make(Node::kGlobal);
    g->s = full;
    stack_.push_back(g);
    return absl::OkStatus();
  }

  absl::Status Memo(uint64_t index, size_t at) {
    EMBER_ASSIGN_OR_RETURN(Node * top, Top(at));
    memo_[index] = top;
    return absl::OkStatus();
  }
  absl::Status Get(uint64_t index, size_t at) {
    auto it = memo_.find(index);
    if (it == memo_.end()) {
      return Bad(absl::StrCat("memo reference ", index, " at byte ", at, " was never stored"));
    }
    stack_.push_back(it->second);
    return absl::OkStatus();
  }

  absl::Status SetItems(Node* dict, const std::vector<Node*>& kv, size_t at) {
    if (dict->kind != Node::kDict) {
      return Bad(absl::StrCat("SETITEM(S) at byte ", at, " on a ", NodeKindName(dict->kind)));
    }
    if (kv.size() % 2 != 0) {
      return Bad(absl::StrCat("SETITEMS at byte ", at, " with an odd number of items"));
    }
    for (size_t i = 0; i < kv.size(); i += 2) {
      // A repeated key replaces the earlier value, as in a Python dict.
      bool replaced = false;
      for (auto& [k, v] : dict->pairs) {
        if (k->kind == kv[i]->kind &&
            (k->kind == Node::kStr ? k->s == kv[i]->s : k->i == kv[i]->i) &&
            (k->kind == Node::kStr || k->kind == Node::kInt)) {
          v = kv[i + 1];
          replaced = true;
          break;
        }
      }
      if (!replaced) dict->pairs.emplace_back(kv[i], kv[i + 1]);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<Node*> Call(Node* callable, Node* args, size_t at) {
    if (callable->kind != Node::kGlobal) {
      return Bad(absl::StrCat("REDUCE at byte ", at, " calls a ", NodeKindName(callable->kind)));
    }
    if (args->kind != Node::kTuple) {
      return Bad(absl::StrCat("REDUCE at byte ", at, " with arguments that are a ",
                              NodeKindName(args->kind), ", not a tuple"));
    }
    const std::vector<Node*>& a = args->items;
    const std::string& fn = callable->s;
    if (fn == kOrderedDict) {
      if (!a.empty()) return Bad("collections.OrderedDict called with arguments");
      return Make(Node::kDict);
    }
    if (fn == kLoadFromBytes) {
      if (a.size() != 1 || a[0]->kind != Node::kBytes) {
        return Bad("torch.storage._load_from_bytes wants one bytes argument");
      }
      return LoadLegacyStorage(a[0]->s);
    }
    if (fn == kRebuildParameter) {
      if (a.size() < 2 || a[0]->kind != Node::kTensor) {
        return Bad("torch._utils._rebuild_parameter wants (tensor, requires_grad, hooks)");
      }
      return a[0];
    }
    if (fn == kRebuildTensor) return RebuildTensor(a);
    return Bad(absl::StrCat("REDUCE at byte ", at, " calls ", escape_for_terminal(fn),
                            ", which only appears inside a persistent id"));
  }

  absl::StatusOr<Node*> RebuildTensor(const std::vector<Node*>& a) {
    if (a.size() < 6 || a.size() > 7 || a[0]->kind != Node::kStorage || !IsInt(a[1]) ||
        a[2]->kind != Node::kTuple || a[3]->kind != Node::kTuple ||
        a[2]->items.size() != a[3]->items.size()) {
      return Bad(
          "torch._utils._rebuild_tensor_v2 wants (storage, offset, size tuple, stride tuple of "
          "the same length, requires_grad, hooks[, metadata])");
    }
    const Node& storage = *a[0];
    const int64_t offset = a[1]->i;
    SizeVector sizes, strides;
    int64_t extent = 0;
    bool empty = false;
    if (a[2]->items.size() > 64) return Bad("a tensor with more than 64 dimensions");
    for (size_t d = 0; d < a[2]->items.size(); ++d) {
      const Node* size = a[2]->items[d];
      const Node* stride = a[3]->items[d];
      if (!IsInt(size) || !IsInt(stride) || size->i < 0 || stride->i < 0) {
        return Bad("_rebuild_tensor_v2: sizes and strides must be non-negative ints");
      }
      sizes.push_back(size->i);
      strides.push_back(stride->i);
      empty |= size->i == 0;
      int64_t span;
      if (size->i > 0 && (__builtin_mul_overflow(size->i - 1, stride->i, &span) ||
                          __builtin_add_overflow(extent, span, &extent))) {
        return Bad("_rebuild_tensor_v2: size times stride overflows");
      }
    }
    int64_t last;
    if (offset < 0 ||
        (!empty && (__builtin_add_overflow(offset, extent, &last) || last >= storage.numel)) ||
        (empty && offset > storage.numel)) {
      return Bad(absl::StrCat("_rebuild_tensor_v2: a tensor of size [", absl::StrJoin(sizes, ", "),
                              "], stride [", absl::StrJoin(strides, ", "), "] at offset ", offset,
                              " does not fit its storage of ", storage.numel, " elements"));
    }
    Node* t = Make(Node::kTensor);
    t->tensor = Tensor(
        std::make_shared<TensorImpl>(storage.storage, storage.dtype, sizes, strides, offset));
    return t;
  }

  // torch.storage._load_from_bytes' argument: a legacy torch.save of one
  // storage (see Pickler::LegacyStorageBytes for the layout).
  absl::StatusOr<Node*> LoadLegacyStorage(const std::string& bytes) {
    Unpickler inner(bytes, 0, /*legacy_storage=*/true);
    EMBER_ASSIGN_OR_RETURN(Node * magic, inner.Run());
    if (magic->kind != Node::kBigInt ||
        magic->s != absl::string_view(kLegacyMagic, kLegacyMagicSize)) {
      return Bad("torch.storage._load_from_bytes: its bytes are not a legacy torch.save file");
    }
    EMBER_ASSIGN_OR_RETURN(Node * protocol, inner.Run());
    if (!IsInt(protocol) || protocol->i != kLegacyProtocol) {
      return Bad("torch.storage._load_from_bytes: unknown legacy protocol version");
    }
    EMBER_ASSIGN_OR_RETURN(Node * sys_info, inner.Run());
    if (sys_info->kind != Node::kDict) return Bad("torch.storage._load_from_bytes: no sys_info");
    for (const auto& [k, v] : sys_info->pairs) {
      if (k->kind == Node::kStr && k->s == "little_endian" &&
          !(v->kind == Node::kBool && v->i == 1)) {
        return Bad("torch.storage._load_from_bytes: a big-endian storage");
      }
    }
    EMBER_ASSIGN_OR_RETURN(Node * storage, inner.Run());
    if (storage->kind != Node::kStorage) {
      return Bad(absl::StrCat("torch.storage._load_from_bytes: holds a ",
                              NodeKindName(storage->kind), ", not a storage"));
    }
    EMBER_ASSIGN_OR_RETURN(Node * keys, inner.Run());
    if (keys->kind != Node::kList || keys->items.size() != 1 ||
        keys->items[0]->kind != Node::kStr || keys->items[0]->s != storage->s) {
      return Bad("torch.storage._load_from_bytes: its storage key list does not name its storage");
    }
    size_t pos = inner.pos();
    const size_t element = element_size(storage->dtype);
    if (bytes.size() - pos < 8) return Bad("torch.storage._load_from_bytes: truncated storage");
    uint64_t count = 0;
    for (int i = 0; i < 8; ++i)
      count |= uint64_t{static_cast<unsigned char>(bytes[pos + i])} << (8 * i);
    pos += 8;
    if (count != static_cast<uint64_t>(storage->numel) || (bytes.size() - pos) / element < count ||
        (bytes.size() - pos) != count * element) {
      return Bad(absl::StrCat("torch.storage._load_from_bytes: a storage of ", storage->numel,
                              " elements of ", element, " bytes with ", count, " counted and ",
                              bytes.size() - pos, " bytes present"));
    }
    Node* n = Make(Node::kStorage);
    n->dtype = storage->dtype;
    n->numel = storage->numel;
    n->storage = Storage::Allocate(count * element, GetCpuAllocator());
    if (count > 0) std::memcpy(n->storage.data(), bytes.data() + pos, count * element);
    return n;
  }

  // BINPERSID inside a storage's bytes: ('storage', torch.<Type>Storage,
  // key, location, numel, None).
  absl::StatusOr<Node*> PersistentLoad(Node* pid) {
    const std::vector<Node*>& a = pid->items;
    if (pid->kind != Node::kTuple || a.size() != 6 || a[0]->kind != Node::kStr ||
        a[0]->s != "storage" || a[1]->kind != Node::kGlobal || a[2]->kind != Node::kStr ||
        a[3]->kind != Node::kStr || !IsInt(a[4]) || a[4]->i < 0 || a[5]->kind != Node::kNone) {
      return Bad(
          "a persistent id that is not ('storage', torch.<Type>Storage, key, location, numel, "
          "None)");
    }
    if (a[3]->s != "cpu") {
      return Bad(absl::StrCat("a tensor whose storage was saved on ", escape_for_terminal(a[3]->s),
                              "; only CPU tensors are unpickled (send tensor.cpu())"));
    }
    Node* s = Make(Node::kStorage);
    s->dtype = StorageClasses().at(a[1]->s.substr(std::string("torch.").size()));
    s->numel = a[4]->i;
    s->s = a[2]->s;
    s->location = a[3]->s;
    return s;
  }

  absl::Status Step(unsigned char op, size_t at) {
    switch (op) {
      case kProto:
        EMBER_RETURN_IF_ERROR(Need(1, at));
        if (static_cast<unsigned char>(data_[pos_]) > 5) {
          return Bad(absl::StrCat("pickle protocol ", static_cast<int>(data_[pos_] & 0xff),
                                  "; protocols up to 5 are read"));
        }
        ++pos_;
        return absl::OkStatus();
      case kFrame: {
        EMBER_RETURN_IF_ERROR(Need(8, at));
        const uint64_t n = ReadLE(8);
        if (n > data_.size() - pos_) {
          return Bad(absl::StrCat("a frame of ", n, " bytes at byte ", at,
                                  " runs past the end of the pickle (truncated?)"));
        }
        return absl::OkStatus();
      }
      case kStop:
        return absl::OkStatus();
      case kMark:
        marks_.push_back(stack_.size());
        return absl::OkStatus();
      case kPop:
        return Pop(at).status();
      case kPopMark:
        return PopMark(at).status();
      case kDup: {
        EMBER_ASSIGN_OR_RETURN(Node * top, Top(at));
        stack_.push_back(top);
        return absl::OkStatus();
      }
      case kNone:
        stack_.push_back(Make(Node::kNone));
        return absl::OkStatus();
      case kNewTrue:
      case kNewFalse: {
        Node* v = Make(Node::kBool);
        v->i = op == kNewTrue;
        stack_.push_back(v);
        return absl::OkStatus();
      }
      case kBinInt1:
      case kBinInt2:
      case kBinInt: {
        const int n = op == kBinInt1 ? 1 : op == kBinInt2 ? 2 : 4;
        EMBER_RETURN_IF_ERROR(Need(n, at));
        const uint64_t u = ReadLE(n);
        Node* v = Make(Node::kInt);
        v->i = n == 4 ? static_cast<int64_t>(static_cast<int32_t>(u)) : static_cast<int64_t>(u);
        stack_.push_back(v);
        return absl::OkStatus();
      }
      case kLong1:
        EMBER_RETURN_IF_ERROR(Need(1, at));
        return PushLong(ReadLE(1), at);
      case kLong4:
        EMBER_RETURN_IF_ERROR(Need(4, at));
        return PushLong(ReadLE(4), at);
      case kBinFloat: {
        EMBER_RETURN_IF_ERROR(Need(8, at));
        uint64_t bits = 0;
        for (int i = 0; i < 8; ++i)
          bits = (bits << 8) | static_cast<unsigned char>(data_[pos_ + i]);
        pos_ += 8;
        Node* v = Make(Node::kFloat);
        std::memcpy(&v->f, &bits, 8);
        stack_.push_back(v);
        return absl::OkStatus();
      }
      case kShortBinUnicode:
      case kShortBinBytes:
        EMBER_RETURN_IF_ERROR(Need(1, at));
        return PushString(op == kShortBinUnicode ? Node::kStr : Node::kBytes, ReadLE(1), at);
      case kBinUnicode:
      case kBinBytes:
        EMBER_RETURN_IF_ERROR(Need(4, at));
        return PushString(op == kBinUnicode ? Node::kStr : Node::kBytes, ReadLE(4), at);
      case kBinUnicode8:
      case kBinBytes8:
      case kByteArray8:
        EMBER_RETURN_IF_ERROR(Need(8, at));
        return PushString(op == kBinUnicode8 ? Node::kStr : Node::kBytes, ReadLE(8), at);
      case kEmptyTuple:
        stack_.push_back(Make(Node::kTuple));
        return absl::OkStatus();
      case kTuple1:
      case kTuple2:
      case kTuple3: {
        const size_t n = op - kTuple1 + 1;
        if (stack_.size() < n || (!marks_.empty() && stack_.size() - n < marks_.back())) {
          return Bad(absl::StrCat("TUPLE", n, " at byte ", at, " with too few values"));
        }
        Node* t = Make(Node::kTuple);
        t->items.assign(stack_.end() - n, stack_.end());
        stack_.resize(stack_.size() - n);
        stack_.push_back(t);
        return absl::OkStatus();
      }
      case kTuple:
      case kList: {
        EMBER_ASSIGN_OR_RETURN(std::vector<Node*> items, PopMark(at));
        Node* t = Make(op == kTuple ? Node::kTuple : Node::kList);
        t->items = std::move(items);
        stack_.push_back(t);
        return absl::OkStatus();
      }
      case kEmptyList:
        stack_.push_back(Make(Node::kList));
        return absl::OkStatus();
      case kEmptyDict:
        stack_.push_back(Make(Node::kDict));
        return absl::OkStatus();
      case kDict: {
        EMBER_ASSIGN_OR_RETURN(std::vector<Node*> kv, PopMark(at));
        Node* d = Make(Node::kDict);
        EMBER_RETURN_IF_ERROR(SetItems(d, kv, at));
        stack_.push_back(d);
        return absl::OkStatus();
      }
      case kAppend: {
        EMBER_ASSIGN_OR_RETURN(Node * item, Pop(at));
        EMBER_ASSIGN_OR_RETURN(Node * list, Top(at));
        if (list->kind != Node::kList) {
          return Bad(absl::StrCat("APPEND at byte ", at, " on a ", NodeKindName(list->kind)));
        }
        list->items.push_back(item);
        return absl::OkStatus();
      }
      case kAppends: {
        EMBER_ASSIGN_OR_RETURN(std::vector<Node*> items, PopMark(at));
        EMBER_ASSIGN_OR_RETURN(Node * list, Top(at));
        if (list->kind != Node::kList) {
          return Bad(absl::StrCat("APPENDS at byte ", at, " on a ", NodeKindName(list->kind)));
        }
        list->items.insert(list->items.end(), items.begin(), items.end());
        return absl::OkStatus();
      }
      case kSetItem: {
        EMBER_ASSIGN_OR_RETURN(Node * value, Pop(at));
        EMBER_ASSIGN_OR_RETURN(Node * key, Pop(at));
        EMBER_ASSIGN_OR_RETURN(Node * dict, Top(at));
        return SetItems(dict, {key, value}, at);
      }
      case kSetItems: {
        EMBER_ASSIGN_OR_RETURN(std::vector<Node*> kv, PopMark(at));
        EMBER_ASSIGN_OR_RETURN(Node * dict, Top(at));
        return SetItems(dict, kv, at);
      }
      case kMemoize:
        return Memo(memo_.size(), at);
      case kBinPut:
        EMBER_RETURN_IF_ERROR(Need(1, at));
        return Memo(ReadLE(1), at);
      case kLongBinPut:
        EMBER_RETURN_IF_ERROR(Need(4, at));
        return Memo(ReadLE(4), at);
      case kBinGet:
        EMBER_RETURN_IF_ERROR(Need(1, at));
        return Get(ReadLE(1), at);
      case kLongBinGet:
        EMBER_RETURN_IF_ERROR(Need(4, at));
        return Get(ReadLE(4), at);
      case kGlobal: {
        const size_t nl1 = data_.find('\n', pos_);
        const size_t nl2 = nl1 == absl::string_view::npos ? nl1 : data_.find('\n', nl1 + 1);
        if (nl2 == absl::string_view::npos)
          return Bad(absl::StrCat("GLOBAL at byte ", at, " is truncated"));
        const std::string module(data_.substr(pos_, nl1 - pos_));
        const std::string name(data_.substr(nl1 + 1, nl2 - nl1 - 1));
        pos_ = nl2 + 1;
        return PushGlobal(module, name, at);
      }
      case kStackGlobal: {
        EMBER_ASSIGN_OR_RETURN(Node * name, Pop(at));
        EMBER_ASSIGN_OR_RETURN(Node * module, Pop(at));
        if (name->kind != Node::kStr || module->kind != Node::kStr) {
          return Bad(absl::StrCat("STACK_GLOBAL at byte ", at, " on values that are not str"));
        }
        return PushGlobal(module->s, name->s, at);
      }
      case kReduce: {
        EMBER_ASSIGN_OR_RETURN(Node * args, Pop(at));
        EMBER_ASSIGN_OR_RETURN(Node * callable, Pop(at));
        EMBER_ASSIGN_OR_RETURN(Node * result, Call(callable, args, at));
        stack_.push_back(result);
        return absl::OkStatus();
      }
      case kBinPersId: {
        if (!legacy_storage_) {
          return Bad(absl::StrCat("BINPERSID at byte ", at,
                                  ": persistent ids only appear inside a tensor's storage"));
        }
        EMBER_ASSIGN_OR_RETURN(Node * pid, Pop(at));
        EMBER_ASSIGN_OR_RETURN(Node * storage, PersistentLoad(pid));
        stack_.push_back(storage);
        return absl::OkStatus();
      }
      default:
        return Bad(absl::StrFormat(
            "opcode 0x%02x ('%s') at byte %d is not one this unpickler runs (it builds only "
            "plain values and tensors, never objects)",
            op, escape_for_terminal(std::string(1, static_cast<char>(op))), at));
    }
  }

  absl::string_view data_;
  size_t pos_;
  const bool legacy_storage_;
  std::deque<Node> arena_;
  std::vector<Node*> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, Node*> memo_;
};

// Turns the node graph into a PickleValue (Note [Value unpickler]).
class Converter {
 public:
  explicit Converter(size_t input_size) : budget_(64 * input_size + (size_t{1} << 20)) {}

  absl::StatusOr<PickleValue> Convert(const Node* n, int depth) {
    const size_t cost = 1 + n->s.size();
    if (cost > budget_) {
      return Bad("memo references expand the pickle past 64 times its size; refusing to build it");
    }
    budget_ -= cost;
    switch (n->kind) {
      case Node::kNone:
        return PickleValue();
      case Node::kBool:
        return PickleValue(n->i != 0);
      case Node::kInt:
        return PickleValue(n->i);
      case Node::kBigInt:
        return Bad(absl::StrCat("an int of ", n->s.size(), " bytes does not fit int64"));
      case Node::kFloat:
        return PickleValue(n->f);
      case Node::kStr:
        return PickleValue(n->s);
      case Node::kBytes:
        return PickleValue::Bytes(n->s);
      case Node::kTensor:
        return PickleValue(n->tensor);
      case Node::kGlobal:
        return Bad(absl::StrCat("the global ", n->s, " is not a value"));
      case Node::kStorage:
        return Bad("a bare storage is not a value (only tensors are)");
      case Node::kList:
      case Node::kTuple:
      case Node::kDict:
        break;
    }
    if (depth >= kMaxPickleValueNesting) {
      return Bad(absl::StrCat("the value nests lists, tuples and dicts deeper than ",
                              kMaxPickleValueNesting, " levels (or refers to itself)"));
    }
    if (n->kind == Node::kDict) {
      PickleValue::Pairs pairs;
      pairs.reserve(n->pairs.size());
      for (const auto& [k, v] : n->pairs) {
        if (k->kind != Node::kStr && k->kind != Node::kInt) {
          return Bad(absl::StrCat("a dict key that is a ", NodeKindName(k->kind),
                                  "; keys must be str or int"));
        }
        EMBER_ASSIGN_OR_RETURN(PickleValue key, Convert(k, depth + 1));
        EMBER_ASSIGN_OR_RETURN(PickleValue value, Convert(v, depth + 1));
        pairs.emplace_back(std::move(key), std::move(value));
      }
      return PickleValue::Dict(std::move(pairs));
    }
    PickleValue::Items items;
    items.reserve(n->items.size());
    for (const Node* item : n->items) {
      EMBER_ASSIGN_OR_RETURN(PickleValue v, Convert(item, depth + 1));
      items.push_back(std::move(v));
    }
    return n->kind == Node::kList ? PickleValue::List(std::move(items))
                                  : PickleValue::Tuple(std::move(items));
  }

 private:
  size_t budget_;
};

}  // namespace

absl::StatusOr<std::string> pickle_value(const PickleValue& value, int protocol) {
  if (protocol < 3 || protocol > 5) {
    return absl::InvalidArgumentError(
        absl::StrCat("pickle_value: protocol ", protocol, "; use 3, 4 or 5"));
  }
  Pickler p(protocol);
  EMBER_RETURN_IF_ERROR(p.Dump(value));
  return p.Take();
}

absl::StatusOr<PickleValue> unpickle_value(absl::string_view pickle) {
  if (pickle.empty()) return Bad("empty input; a pickle ends with STOP ('.')");
  Unpickler u(pickle, 0, /*legacy_storage=*/false);
  EMBER_ASSIGN_OR_RETURN(Node * root, u.Run());
  Converter c(pickle.size());
  return c.Convert(root, 0);
}

}  // namespace ember::serialization
