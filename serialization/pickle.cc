#include "serialization/pickle.h"

#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "serialization/printable.h"
#include "tensor/error.h"

// Note [Restricted unpickler]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A pickle is a program for a stack machine whose GLOBAL and REDUCE opcodes
// import and call arbitrary Python functions, so loading an untrusted .pt
// with Python's pickle can run anything. This unpickler is an interpreter of
// its own that never calls out: it knows the opcodes torch.save emits for a
// state_dict (containers, numbers, strings, memo, persistent ids) and exactly
// these globals, each given a meaning here rather than imported:
//   collections.OrderedDict              -> an ordered mapping (REDUCE with ())
//   torch._utils._rebuild_tensor_v2      -> a tensor view of a storage (REDUCE)
//   torch._utils._rebuild_parameter      -> the tensor it wraps (REDUCE)
//   torch.{Float,Double,Half,BFloat16,Long,Int,Short,Char,Byte,Bool}Storage
//                                        -> a dtype, only inside a persistent
//                                        id
// Any other global, REDUCE on anything but the three callables above, and any
// other opcode stop the load with an error that names them. Every tensor's
// offset, sizes and strides are checked against its storage's element count,
// and the storage's record must hold exactly that many bytes (checked by the
// StorageLoader), so a hostile file cannot make a view read out of bounds.
// PyTorch's torch.load(weights_only=True) follows the same idea.

// Note [Pickle values without recursion]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A few bytes of pickle nest containers one level deeper (TUPLE1 over and
// over), so a small file can describe a value a million levels deep. Nothing
// here walks values recursively: every Value lives in the Unpickler's arena
// (a deque) and containers hold plain pointers into it, so freeing is one
// pass over the arena whatever the shape, on any thread's stack. Nesting is
// still capped at kMaxPickleNesting, checked as values are placed in
// containers; that count is exact because a list or dict may only grow
// while it is not yet inside another value (Python's pickler never does
// otherwise, except for self-referencing objects, which a state_dict never
// holds) and never into itself, which rules out cycles.

namespace ember::serialization {
namespace {

struct Value {
  enum Kind {
    kNone,
    kBool,
    kInt,
    kBigInt,
    kFloat,
    kString,
    kTuple,
    kList,
    kDict,
    kGlobal,
    kStorage,
    kTensor
  };
  Kind kind = kNone;
  bool ordered = false;    // kDict: an OrderedDict
  bool contained = false;  // placed inside a tuple, list or dict
  int depth = 0;           // levels of containers, this one included
  int64_t i = 0;           // kBool, kInt
  double f = 0;
  std::string s;                                 // kString; kGlobal: "module.name"; kBigInt: bytes
  std::vector<Value*> items;                     // kTuple, kList
  std::vector<std::pair<Value*, Value*>> pairs;  // kDict
  Storage storage;                               // kStorage
  Dtype dtype = kFloat32;
  int64_t numel = 0;
  Tensor tensor;  // kTensor
};

const char* KindName(Value::Kind k) {
  static const char* names[] = {"None",  "bool", "int",  "int",    "float",   "str",
                                "tuple", "list", "dict", "global", "storage", "tensor"};
  return names[k];
}

const std::map<std::string, Dtype>& StorageTypes() {
  static const auto* types = new std::map<std::string, Dtype>{
      {"torch.FloatStorage", kFloat32}, {"torch.DoubleStorage", kFloat64},
      {"torch.HalfStorage", kFloat16},  {"torch.BFloat16Storage", kBFloat16},
      {"torch.LongStorage", kInt64},    {"torch.IntStorage", kInt32},
      {"torch.ShortStorage", kInt16},   {"torch.CharStorage", kInt8},
      {"torch.ByteStorage", kUInt8},    {"torch.BoolStorage", kBool}};
  return *types;
}

// PyTorch's storage types for dtypes Ember lacks, and their dtypes' names.
const std::map<std::string, std::string>& UnsupportedStorageTypes() {
  static const auto* types =
      new std::map<std::string, std::string>{{"torch.ComplexFloatStorage", "complex64"},
                                             {"torch.ComplexDoubleStorage", "complex128"},
                                             {"torch.QInt8Storage", "qint8"},
                                             {"torch.QUInt8Storage", "quint8"},
                                             {"torch.QInt32Storage", "qint32"},
                                             {"torch.QUInt4x2Storage", "quint4x2"},
                                             {"torch.QUInt2x4Storage", "quint2x4"}};
  return *types;
}

// PyTorch's rebuild functions for tensor layouts Ember lacks.
const std::map<std::string, std::string>& UnsupportedRebuilds() {
  static const auto* rebuilds = new std::map<std::string, std::string>{
      {"torch._utils._rebuild_qtensor", "quantized tensors"},
      {"torch._utils._rebuild_sparse_tensor", "sparse tensors"},
      {"torch._utils._rebuild_sparse_csr_tensor", "sparse CSR tensors"},
      {"torch._utils._rebuild_nested_tensor", "nested tensors"}};
  return *rebuilds;
}

constexpr char kOrderedDict[] = "collections.OrderedDict";
constexpr char kRebuildTensor[] = "torch._utils._rebuild_tensor_v2";
constexpr char kRebuildParameter[] = "torch._utils._rebuild_parameter";

// The magic number a legacy torch.save file starts with,
// 0x1950a86a20f9469cfc6c, as the little-endian bytes LONG1 carries.
constexpr char kLegacyMagic[] = "\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19";
constexpr size_t kLegacyMagicSize = sizeof(kLegacyMagic) - 1;
constexpr int64_t kLegacyProtocolVersion = 1001;

// Names of the pickle opcodes this reader refuses, for error messages.
std::string OpcodeName(unsigned char op) {
  static const auto* names =
      new std::map<unsigned char, const char*>{{'i', "INST"},         {'o', "OBJ"},
                                               {0x81, "NEWOBJ"},      {0x92, "NEWOBJ_EX"},
                                               {'P', "PERSID"},       {'S', "STRING"},
                                               {'T', "BINSTRING"},    {'U', "SHORT_BINSTRING"},
                                               {'V', "UNICODE"},      {'I', "INT"},
                                               {'L', "LONG"},         {'F', "FLOAT"},
                                               {'g', "GET"},          {'p', "PUT"},
                                               {'l', "LIST"},         {'d', "DICT"},
                                               {'0', "POP"},          {'1', "POP_MARK"},
                                               {'2', "DUP"},          {0x82, "EXT1"},
                                               {0x83, "EXT2"},        {0x84, "EXT4"},
                                               {0x8b, "LONG4"},       {0x8e, "BINBYTES8"},
                                               {'B', "BINBYTES"},     {'C', "SHORT_BINBYTES"},
                                               {0x90, "ADDITEMS"},    {0x8f, "EMPTY_SET"},
                                               {0x91, "FROZENSET"},   {0x96, "BYTEARRAY8"},
                                               {0x97, "NEXT_BUFFER"}, {0x98, "READONLY_BUFFER"}};
  auto it = names->find(op);
  return it != names->end() ? absl::StrFormat("%s (0x%02x)", it->second, op)
                            : absl::StrFormat("0x%02x", op);
}

// Which torch.save layout a program belongs to: its persistent ids differ.
enum class Layout {
  kZip,     // ('storage', type, key, location, numel)
  kLegacy,  // ('storage', type, key, location, numel, view_metadata)
};

// Runs one pickle program, from `start` in `data` to its STOP.
class Unpickler {
 public:
  Unpickler(absl::string_view data, size_t start, const StorageLoader* load, Layout layout,
            absl::string_view source, absl::string_view what)
      : data_(data), load_(load), layout_(layout), source_(source), what_(what), pos_(start) {}

  // The program's result; it lives as long as the Unpickler.
  absl::StatusOr<const Value*> Run();
  // Where the program ended (just past STOP), after a successful Run.
  size_t end() const { return pos_; }

 private:
  absl::Status Error(absl::string_view why) const {
    return absl::InvalidArgumentError(
        absl::StrCat(source_, ": ", what_, " at byte ", op_at_, ": ", why));
  }
  absl::Status Refused(absl::string_view why) const {
    return absl::PermissionDeniedError(
        absl::StrCat(source_, ": refusing to load: ", why,
                     ". A state_dict checkpoint needs only OrderedDict, "
                     "torch._utils._rebuild_tensor_v2, "
                     "torch._utils._rebuild_parameter and torch.*Storage; this "
                     "file may be malicious"));
  }
  absl::Status Unsupported(absl::string_view what) const {
    return absl::UnimplementedError(absl::StrCat(
        source_, ": the checkpoint holds ", what,
        ", which Ember does not support; convert them to a supported dtype in PyTorch and save "
        "again (Ember reads float32/64, float16, bfloat16, int8/16/32/64, uint8 and bool)"));
  }
  bool Take(size_t n, absl::string_view* out) {
    if (n > data_.size() - pos_) return false;
    *out = data_.substr(pos_, n);
    pos_ += n;
    return true;
  }
  template <typename T>
  bool TakeLe(T* v) {
    absl::string_view b;
    if (!Take(sizeof(T), &b)) return false;
    std::memcpy(v, b.data(), sizeof(T));
    return true;
  }
  bool TakeLine(std::string* out) {
    size_t nl = data_.find('\n', pos_);
    if (nl == absl::string_view::npos) return false;
    *out = std::string(data_.substr(pos_, nl - pos_));
    pos_ = nl + 1;
    return true;
  }
  absl::StatusOr<Value*> Pop() {
    if (stack_.empty() || (!marks_.empty() && stack_.size() == marks_.back())) {
      return Error("stack underflow");
    }
    Value* v = stack_.back();
    stack_.pop_back();
    return v;
  }
  absl::StatusOr<std::vector<Value*>> PopToMark() {
    if (marks_.empty()) return Error("no MARK on the stack");
    std::vector<Value*> items(stack_.begin() + marks_.back(), stack_.end());
    stack_.resize(marks_.back());
    marks_.pop_back();
    return items;
  }
  absl::Status Push(Value* v) {
    if (stack_.size() > (1u << 20)) return Error("stack too deep");
    stack_.push_back(v);
    return absl::OkStatus();
  }
  Value* Make(Value::Kind kind) {
    Value& v = arena_.emplace_back();
    v.kind = kind;
    if (kind == Value::kTuple || kind == Value::kList || kind == Value::kDict) v.depth = 1;
    return &v;
  }
  Value* Int(int64_t i) {
    Value* v = Make(Value::kInt);
    v->i = i;
    return v;
  }
  // Places `child` in `container`, keeping its depth within the limit.
  absl::Status Nest(Value* container, Value* child) {
    if (child == container)
      return Error(absl::StrCat("a ", KindName(child->kind), " inside itself"));
    if (child->depth >= container->depth) {
      container->depth = child->depth + 1;
      if (container->depth > kMaxPickleNesting) {
        return Error(absl::StrCat("values nested more than ", kMaxPickleNesting,
                                  " deep; a state_dict nests a few levels (the limit is "
                                  "kMaxPickleNesting)"));
      }
    }
    child->contained = true;
    return absl::OkStatus();
  }
  // The list or dict on top of the stack, which `op` is about to grow.
  absl::StatusOr<Value*> Growable(Value::Kind kind, absl::string_view op) {
    if (stack_.empty() || stack_.back()->kind != kind)
      return Error(absl::StrCat(op, " without a ", KindName(kind)));
    Value* v = stack_.back();
    if (v->contained) {
      return Error(absl::StrCat(op, " on a ", KindName(kind),
                                " that is already inside another value (self-referencing values "
                                "are not read)"));
    }
    return v;
  }
  absl::Status Global(std::string module, std::string name);
  absl::Status PersistentLoad(const Value& pid);
  absl::Status Reduce(const Value& callable, const Value& args);
  absl::StatusOr<Value*> RebuildTensor(const std::vector<Value*>& args);
  absl::Status SetItems(const std::vector<Value*>& kv, absl::string_view op);

  absl::string_view data_;
  const StorageLoader* load_;  // null: the program may hold no persistent ids
  Layout layout_;
  std::string source_;
  std::string what_;  // what the program is, for messages ("data.pkl")
  size_t pos_;
  size_t op_at_ = 0;
  std::deque<Value> arena_;  // every value; see Note [Pickle values without recursion]
  std::vector<Value*> stack_;
  std::vector<size_t> marks_;
  std::map<uint64_t, Value*> memo_;
  std::map<std::string, std::pair<Storage, StorageRef>> storages_;
};

absl::Status Unpickler::Global(std::string module, std::string name) {
  std::string full = absl::StrCat(module, ".", name);
  if (auto it = UnsupportedStorageTypes().find(full); it != UnsupportedStorageTypes().end()) {
    return Unsupported(absl::StrCat("tensors of dtype ", it->second, " (", full, ")"));
  }
  if (auto it = UnsupportedRebuilds().find(full); it != UnsupportedRebuilds().end()) {
    return Unsupported(absl::StrCat(it->second, " (", full, ")"));
  }
  if (full != kOrderedDict && full != kRebuildTensor && full != kRebuildParameter &&
      !StorageTypes().count(full)) {
    if (module == "torch" && absl::EndsWith(name, "Storage") && name != "Storage") {
      return Unsupported(absl::StrCat("tensors stored as ", escape_for_terminal(full),
                                      ", a dtype Ember does not know"));
    }
    return Refused(absl::StrCat("global '", escape_for_terminal(full), "' is not allowed"));
  }
  Value* v = Make(Value::kGlobal);
  v->s = full;
  return Push(v);
}

absl::Status Unpickler::PersistentLoad(const Value& pid) {
  const size_t fields = layout_ == Layout::kLegacy ? 6 : 5;
  if (load_ == nullptr) return Error("unexpected persistent id");
  if (pid.kind != Value::kTuple || pid.items.size() != fields ||
      pid.items[0]->kind != Value::kString || pid.items[0]->s != "storage") {
    return Error(layout_ == Layout::kLegacy
                     ? "persistent id is not ('storage', type, key, location, numel, view)"
                     : "persistent id is not ('storage', type, key, location, numel)");
  }
  const Value& type = *pid.items[1];
  const Value& key = *pid.items[2];
  const Value& location = *pid.items[3];
  const Value& numel = *pid.items[4];
  if (type.kind != Value::kGlobal || !StorageTypes().count(type.s)) {
    return Error("persistent id does not name a storage type");
  }
  if (key.kind != Value::kString || location.kind != Value::kString || numel.kind != Value::kInt ||
      numel.i < 0) {
    return Error("persistent id has a malformed key, location or size");
  }
  if (layout_ == Layout::kLegacy && pid.items[5]->kind != Value::kNone) {
    return absl::UnimplementedError(absl::StrCat(
        source_, ": storage '", escape_for_terminal(key.s),
        "' is a view of another storage (written by PyTorch before 0.4), which Ember does not "
        "read; load and save the file again with a recent PyTorch"));
  }
  if (location.s.rfind("cpu", 0) != 0 && location.s.rfind("cuda", 0) != 0) {
    return Error(absl::StrCat("storage location '", escape_for_terminal(location.s),
                              "' is not cpu or cuda"));
  }
  StorageRef ref{key.s, StorageTypes().at(type.s), numel.i, location.s};
  auto it = storages_.find(ref.key);
  if (it == storages_.end()) {
    absl::StatusOr<Storage> s = (*load_)(ref);
    if (!s.ok()) return s.status();
    it = storages_.emplace(ref.key, std::make_pair(*s, ref)).first;
  } else if (it->second.second.dtype != ref.dtype || it->second.second.numel != ref.numel) {
    return Error(absl::StrCat("storage '", escape_for_terminal(ref.key),
                              "' is described twice with different types or sizes"));
  }
  Value* v = Make(Value::kStorage);
  v->storage = it->second.first;
  v->dtype = ref.dtype;
  v->numel = ref.numel;
  return Push(v);
}

absl::StatusOr<Value*> Unpickler::RebuildTensor(const std::vector<Value*>& args) {
  // (storage, storage_offset, size, stride, requires_grad, backward_hooks[,
  // metadata])
  if (args.size() < 6 || args.size() > 7)
    return Error("_rebuild_tensor_v2 expects 6 or 7 arguments");
  const Value& storage = *args[0];
  if (storage.kind != Value::kStorage)
    return Error("_rebuild_tensor_v2: first argument is not a storage");
  if (args[1]->kind != Value::kInt || args[2]->kind != Value::kTuple ||
      args[3]->kind != Value::kTuple) {
    return Error("_rebuild_tensor_v2: malformed offset, size or stride");
  }
  if (args[5]->kind != Value::kDict || !args[5]->pairs.empty()) {
    return Error("_rebuild_tensor_v2: backward hooks are not supported in a checkpoint");
  }
  const int64_t offset = args[1]->i;
  const std::vector<Value*>& size = args[2]->items;
  const std::vector<Value*>& stride = args[3]->items;
  if (size.size() != stride.size())
    return Error("_rebuild_tensor_v2: size and stride differ in length");
  if (size.size() > static_cast<size_t>(kMaxCheckpointDims)) {
    return Error(absl::StrCat("_rebuild_tensor_v2: a tensor with ", size.size(),
                              " dimensions; checkpoints may have at most ", kMaxCheckpointDims));
  }
  SizeVector sizes, strides;
  int64_t extent = 0;  // largest element index the view touches
  bool empty = false;
  for (size_t d = 0; d < size.size(); ++d) {
    if (size[d]->kind != Value::kInt || stride[d]->kind != Value::kInt || size[d]->i < 0 ||
        stride[d]->i < 0) {
      return Error(
          "_rebuild_tensor_v2: sizes and strides must be non-negative "
          "integers");
    }
    sizes.push_back(size[d]->i);
    strides.push_back(stride[d]->i);
    empty |= size[d]->i == 0;
    int64_t span;
    if (size[d]->i > 0 && (__builtin_mul_overflow(size[d]->i - 1, stride[d]->i, &span) ||
                           __builtin_add_overflow(extent, span, &extent))) {
      return Error("_rebuild_tensor_v2: size times stride overflows");
    }
  }
  if (offset < 0)
    return Error(absl::StrCat("_rebuild_tensor_v2: negative storage offset ", offset));
  int64_t last;
  if (!empty && (__builtin_add_overflow(offset, extent, &last) || last >= storage.numel)) {
    return Error(absl::StrCat("tensor of size [", absl::StrJoin(sizes, ", "), "], stride [",
                              absl::StrJoin(strides, ", "), "] at offset ", offset,
                              " reaches past its storage of ", storage.numel, " elements"));
  }
  if (empty && offset > storage.numel) {
    return Error(absl::StrCat("storage offset ", offset, " is past its storage of ", storage.numel,
                              " elements"));
  }
  Value* v = Make(Value::kTensor);
  v->tensor =
      Tensor(std::make_shared<TensorImpl>(storage.storage, storage.dtype, sizes, strides, offset));
  return v;
}

absl::Status Unpickler::Reduce(const Value& callable, const Value& args) {
  if (callable.kind != Value::kGlobal) {
    return Refused(absl::StrCat("REDUCE on a ", KindName(callable.kind), " value"));
  }
  if (args.kind != Value::kTuple) return Error("REDUCE arguments are not a tuple");
  if (callable.s == kOrderedDict) {
    if (!args.items.empty()) return Error("OrderedDict() takes no arguments here");
    Value* d = Make(Value::kDict);
    d->ordered = true;
    return Push(d);
  }
  if (callable.s == kRebuildTensor) {
    absl::StatusOr<Value*> t = RebuildTensor(args.items);
    if (!t.ok()) return t.status();
    return Push(*t);
  }
  if (callable.s == kRebuildParameter) {
    if (args.items.size() != 3 || args.items[0]->kind != Value::kTensor) {
      return Error("_rebuild_parameter expects (tensor, requires_grad, hooks)");
    }
    return Push(args.items[0]);
  }
  return Refused(absl::StrCat("REDUCE on '", callable.s,
                              "' is not allowed (it is not a callable a state_dict uses)"));
}

absl::Status Unpickler::SetItems(const std::vector<Value*>& kv, absl::string_view op) {
  if (kv.size() % 2 != 0) return Error(absl::StrCat(op, " with an odd number of items"));
  absl::StatusOr<Value*> dict = Growable(Value::kDict, op);
  if (!dict.ok()) return dict.status();
  for (size_t i = 0; i < kv.size(); i += 2) {
    if (absl::Status s = Nest(*dict, kv[i]); !s.ok()) return s;
    if (absl::Status s = Nest(*dict, kv[i + 1]); !s.ok()) return s;
    (*dict)->pairs.emplace_back(kv[i], kv[i + 1]);
  }
  return absl::OkStatus();
}

absl::StatusOr<const Value*> Unpickler::Run() {
#define EMBER_PICKLE_TRY(expr) \
  do {                         \
    absl::Status s_ = (expr);  \
    if (!s_.ok()) return s_;   \
  } while (0)
#define EMBER_PICKLE_POP(var)                   \
  absl::StatusOr<Value*> var##_or = Pop();      \
  if (!var##_or.ok()) return var##_or.status(); \
  Value* var = *var##_or
  const absl::Status truncated =
      absl::InvalidArgumentError(absl::StrCat(source_, ": ", what_, " is truncated"));
  while (true) {
    op_at_ = pos_;
    absl::string_view opb;
    if (!Take(1, &opb)) return truncated;
    const unsigned char op = static_cast<unsigned char>(opb[0]);
    switch (op) {
      case 0x80: {  // PROTO
        uint8_t proto;
        if (!TakeLe(&proto)) return truncated;
        if (proto > 5) return Error(absl::StrCat("unknown pickle protocol ", proto));
        break;
      }
      case 0x95: {  // FRAME
        uint64_t n;
        if (!TakeLe(&n)) return truncated;
        break;
      }
      case '.': {  // STOP
        EMBER_PICKLE_POP(result);
        return result;
      }
      case '(':
        if (marks_.size() > (1u << 20)) return Error("too many MARKs");
        marks_.push_back(stack_.size());
        break;
      case ')':
        EMBER_PICKLE_TRY(Push(Make(Value::kTuple)));
        break;
      case ']':
        EMBER_PICKLE_TRY(Push(Make(Value::kList)));
        break;
      case '}':
        EMBER_PICKLE_TRY(Push(Make(Value::kDict)));
        break;
      case 'N':
        EMBER_PICKLE_TRY(Push(Make(Value::kNone)));
        break;
      case 0x88:
      case 0x89: {
        Value* b = Make(Value::kBool);
        b->i = op == 0x88;
        EMBER_PICKLE_TRY(Push(b));
        break;
      }
      case 't': {
        absl::StatusOr<std::vector<Value*>> items = PopToMark();
        if (!items.ok()) return items.status();
        Value* t = Make(Value::kTuple);
        for (Value* item : *items) EMBER_PICKLE_TRY(Nest(t, item));
        t->items = std::move(*items);
        EMBER_PICKLE_TRY(Push(t));
        break;
      }
      case 0x85:
      case 0x86:
      case 0x87: {  // TUPLE1..3
        Value* t = Make(Value::kTuple);
        t->items.resize(op - 0x84);
        for (size_t i = t->items.size(); i-- > 0;) {
          EMBER_PICKLE_POP(item);
          EMBER_PICKLE_TRY(Nest(t, item));
          t->items[i] = item;
        }
        EMBER_PICKLE_TRY(Push(t));
        break;
      }
      case 'J': {
        int32_t v;
        if (!TakeLe(&v)) return truncated;
        EMBER_PICKLE_TRY(Push(Int(v)));
        break;
      }
      case 'K': {
        uint8_t v;
        if (!TakeLe(&v)) return truncated;
        EMBER_PICKLE_TRY(Push(Int(v)));
        break;
      }
      case 'M': {
        uint16_t v;
        if (!TakeLe(&v)) return truncated;
        EMBER_PICKLE_TRY(Push(Int(v)));
        break;
      }
      case 0x8a: {  // LONG1: little-endian two's complement of n bytes
        uint8_t n;
        absl::string_view b;
        if (!TakeLe(&n) || !Take(n, &b)) return truncated;
        if (n > 8) {  // kept as bytes: only compared (the legacy magic number)
          Value* big = Make(Value::kBigInt);
          big->s = std::string(b);
          EMBER_PICKLE_TRY(Push(big));
          break;
        }
        uint64_t u = 0;
        for (size_t i = 0; i < n; ++i) u |= uint64_t{static_cast<unsigned char>(b[i])} << (8 * i);
        if (n > 0 && n < 8 && (static_cast<unsigned char>(b[n - 1]) & 0x80))
          u |= ~uint64_t{0} << (8 * n);
        EMBER_PICKLE_TRY(Push(Int(static_cast<int64_t>(u))));
        break;
      }
      case 'G': {  // BINFLOAT: big-endian double
        absl::string_view b;
        if (!Take(8, &b)) return truncated;
        uint64_t u = 0;
        for (char c : b) u = (u << 8) | static_cast<unsigned char>(c);
        Value* f = Make(Value::kFloat);
        std::memcpy(&f->f, &u, 8);
        EMBER_PICKLE_TRY(Push(f));
        break;
      }
      case 'X':
      case 0x8c:
      case 0x8d: {  // BINUNICODE, SHORT_BINUNICODE, BINUNICODE8
        uint64_t n = 0;
        if (op == 'X') {
          uint32_t n32;
          if (!TakeLe(&n32)) return truncated;
          n = n32;
        } else if (op == 0x8c) {
          uint8_t n8;
          if (!TakeLe(&n8)) return truncated;
          n = n8;
        } else if (!TakeLe(&n)) {
          return truncated;
        }
        absl::string_view b;
        if (n > data_.size() || !Take(n, &b)) return truncated;
        Value* s = Make(Value::kString);
        s->s = std::string(b);
        EMBER_PICKLE_TRY(Push(s));
        break;
      }
      case 'q':
      case 'r':
      case 0x94: {  // BINPUT, LONG_BINPUT, MEMOIZE
        uint64_t index = memo_.size();
        if (op == 'q') {
          uint8_t i;
          if (!TakeLe(&i)) return truncated;
          index = i;
        } else if (op == 'r') {
          uint32_t i;
          if (!TakeLe(&i)) return truncated;
          index = i;
        }
        if (stack_.empty()) return Error("memo store with an empty stack");
        memo_[index] = stack_.back();
        break;
      }
      case 'h':
      case 'j': {  // BINGET, LONG_BINGET
        uint64_t index;
        if (op == 'h') {
          uint8_t i;
          if (!TakeLe(&i)) return truncated;
          index = i;
        } else {
          uint32_t i;
          if (!TakeLe(&i)) return truncated;
          index = i;
        }
        auto it = memo_.find(index);
        if (it == memo_.end())
          return Error(absl::StrCat("memo entry ", index, " was never stored"));
        EMBER_PICKLE_TRY(Push(it->second));
        break;
      }
      case 'c': {  // GLOBAL "module\nname\n"
        std::string module, name;
        if (!TakeLine(&module) || !TakeLine(&name)) return truncated;
        EMBER_PICKLE_TRY(Global(std::move(module), std::move(name)));
        break;
      }
      case 0x93: {  // STACK_GLOBAL
        EMBER_PICKLE_POP(name);
        EMBER_PICKLE_POP(module);
        if (module->kind != Value::kString || name->kind != Value::kString) {
          return Error("STACK_GLOBAL needs two strings");
        }
        EMBER_PICKLE_TRY(Global(module->s, name->s));
        break;
      }
      case 'Q': {  // BINPERSID
        EMBER_PICKLE_POP(pid);
        EMBER_PICKLE_TRY(PersistentLoad(*pid));
        break;
      }
      case 'R': {
        EMBER_PICKLE_POP(args);
        EMBER_PICKLE_POP(callable);
        EMBER_PICKLE_TRY(Reduce(*callable, *args));
        break;
      }
      case 'b': {  // BUILD: only an OrderedDict's __dict__ (its _metadata),
                   // which is dropped
        EMBER_PICKLE_POP(state);
        if (stack_.empty() || stack_.back()->kind != Value::kDict || state->kind != Value::kDict) {
          return Refused("BUILD on anything but an OrderedDict");
        }
        break;
      }
      case 's': {
        EMBER_PICKLE_POP(value);
        EMBER_PICKLE_POP(key);
        EMBER_PICKLE_TRY(SetItems({key, value}, "SETITEM"));
        break;
      }
      case 'u': {
        absl::StatusOr<std::vector<Value*>> kv = PopToMark();
        if (!kv.ok()) return kv.status();
        EMBER_PICKLE_TRY(SetItems(*kv, "SETITEMS"));
        break;
      }
      case 'a': {
        EMBER_PICKLE_POP(item);
        absl::StatusOr<Value*> list = Growable(Value::kList, "APPEND");
        if (!list.ok()) return list.status();
        EMBER_PICKLE_TRY(Nest(*list, item));
        (*list)->items.push_back(item);
        break;
      }
      case 'e': {
        absl::StatusOr<std::vector<Value*>> items = PopToMark();
        if (!items.ok()) return items.status();
        absl::StatusOr<Value*> list = Growable(Value::kList, "APPENDS");
        if (!list.ok()) return list.status();
        for (Value* v : *items) {
          EMBER_PICKLE_TRY(Nest(*list, v));
          (*list)->items.push_back(v);
        }
        break;
      }
      default:
        return Refused(
            absl::StrCat("opcode ", OpcodeName(op), " at byte ", op_at_, " is not allowed"));
    }
  }
#undef EMBER_PICKLE_TRY
#undef EMBER_PICKLE_POP
}

// The state dict a program's result holds.
absl::StatusOr<StateDict> ToStateDict(const Value& root, absl::string_view source) {
  if (root.kind != Value::kDict) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": the checkpoint holds a ", KindName(root.kind),
                     ", not a state_dict (a mapping of names to tensors)"));
  }
  StateDict sd;
  std::set<std::string> seen;
  for (const auto& [key, value] : root.pairs) {
    if (key->kind != Value::kString) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": a state_dict key is a ", KindName(key->kind), ", not a str"));
    }
    if (value->kind != Value::kTensor) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": entry '", escape_for_terminal(key->s), "' is a ",
                       KindName(value->kind), ", not a tensor; save model.state_dict() itself"));
    }
    if (!seen.insert(key->s).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": entry '", escape_for_terminal(key->s), "' appears twice"));
    }
    sd.emplace_back(key->s, value->tensor);
  }
  return sd;
}

// Appends pickle opcodes.
class Pickler {
 public:
  void Proto() { out_ += "\x80\x02"; }
  void Global(absl::string_view module, absl::string_view name) {
    absl::StrAppend(&out_, "c", module, "\n", name, "\n");
  }
  void Op(char op) { out_.push_back(op); }
  void String(absl::string_view s) {
    out_.push_back('X');
    uint32_t n = static_cast<uint32_t>(s.size());
    out_.append(reinterpret_cast<const char*>(&n), 4);
    out_.append(s.data(), s.size());
  }
  void Int(int64_t v) {
    if (v >= 0 && v < 256) {
      out_.push_back('K');
      out_.push_back(static_cast<char>(v));
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
      out_.push_back('J');
      int32_t v32 = static_cast<int32_t>(v);
      out_.append(reinterpret_cast<const char*>(&v32), 4);
    } else {
      out_ += "\x8a\x08";  // LONG1, 8 bytes
      out_.append(reinterpret_cast<const char*>(&v), 8);
    }
  }
  void IntTuple(IntArrayRef values) {
    Op('(');
    for (int64_t v : values) Int(v);
    Op('t');
  }
  std::string Take() && { return std::move(out_); }

 private:
  std::string out_;
};

std::string StorageTypeName(Dtype dtype) {
  for (const auto& [name, d] : StorageTypes()) {
    if (d == dtype) return name.substr(std::strlen("torch."));
  }
  EMBER_INTERNAL_ASSERT(false, "no storage type for ", dtype);
  return "";
}

}  // namespace

absl::StatusOr<StateDict> unpickle_state_dict(absl::string_view pickle, const StorageLoader& load,
                                              absl::string_view source) {
  Unpickler unpickler(pickle, 0, &load, Layout::kZip, source, "data.pkl");
  absl::StatusOr<const Value*> result = unpickler.Run();
  if (!result.ok()) return result.status();
  return ToStateDict(**result, source);
}

bool IsLegacyTorchCheckpoint(absl::string_view bytes) {
  // PROTO n, LONG1 of 10 bytes, the magic number.
  return bytes.size() >= 4 + kLegacyMagicSize && bytes[0] == '\x80' &&
         bytes.substr(2, 2) == "\x8a\x0a" &&
         bytes.substr(4, kLegacyMagicSize) == absl::string_view(kLegacyMagic, kLegacyMagicSize);
}

absl::StatusOr<LegacyPickles> unpickle_legacy_checkpoint(absl::string_view bytes,
                                                         const StorageLoader& load,
                                                         absl::string_view source) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": not a readable legacy torch.save file: ", why));
  };
  size_t pos = 0;
  // The magic number, the protocol version and sys_info: plain values.
  const char* const kHeader[] = {"its magic number", "its protocol version", "its sys_info"};
  for (const char* what : kHeader) {
    Unpickler u(bytes, pos, nullptr, Layout::kLegacy, source, what);
    absl::StatusOr<const Value*> v = u.Run();
    if (!v.ok()) return v.status();
    pos = u.end();
    const Value& value = **v;
    if (what == kHeader[0] && (value.kind != Value::kBigInt ||
                               value.s != absl::string_view(kLegacyMagic, kLegacyMagicSize))) {
      return bad("it does not start with torch.save's magic number");
    }
    if (what == kHeader[1] && (value.kind != Value::kInt || value.i != kLegacyProtocolVersion)) {
      return bad(absl::StrCat("protocol version ",
                              value.kind == Value::kInt ? std::to_string(value.i) : "(not an int)",
                              "; Ember reads version ", kLegacyProtocolVersion));
    }
    if (what == kHeader[2]) {
      if (value.kind != Value::kDict) return bad("sys_info is not a dict");
      for (const auto& [k, v] : value.pairs) {
        if (k->kind == Value::kString && k->s == "little_endian" &&
            !(v->kind == Value::kBool && v->i == 1)) {
          return absl::UnimplementedError(absl::StrCat(
              source,
              ": the checkpoint was saved on a big-endian machine, which Ember does not "
              "read; save it again on a little-endian one"));
        }
      }
    }
  }
  LegacyPickles out;
  {
    Unpickler u(bytes, pos, &load, Layout::kLegacy, source, "the object's pickle");
    absl::StatusOr<const Value*> v = u.Run();
    if (!v.ok()) return v.status();
    pos = u.end();
    absl::StatusOr<StateDict> sd = ToStateDict(**v, source);
    if (!sd.ok()) return sd.status();
    out.state_dict = std::move(*sd);
  }
  {
    Unpickler u(bytes, pos, nullptr, Layout::kLegacy, source, "the storage key list");
    absl::StatusOr<const Value*> v = u.Run();
    if (!v.ok()) return v.status();
    pos = u.end();
    if ((*v)->kind != Value::kList) return bad("the storage keys are not a list");
    for (const Value* key : (*v)->items) {
      if (key->kind != Value::kString) return bad("a storage key is not a str");
      out.storage_keys.push_back(key->s);
    }
  }
  out.data_offset = pos;
  return out;
}

std::string pickle_state_dict(const std::vector<PickledTensor>& tensors) {
  Pickler p;
  p.Proto();
  p.Global("collections", "OrderedDict");
  p.Op(')');
  p.Op('R');
  p.Op('(');
  for (const PickledTensor& t : tensors) {
    p.String(t.name);
    p.Global("torch._utils", "_rebuild_tensor_v2");
    p.Op('(');
    p.Op('(');  // persistent id
    p.String("storage");
    p.Global("torch", StorageTypeName(t.dtype));
    p.String(t.storage_key);
    p.String(t.location);
    p.Int(t.storage_numel);
    p.Op('t');
    p.Op('Q');
    p.Int(t.storage_offset);
    p.IntTuple(t.sizes);
    p.IntTuple(t.strides);
    p.Op('\x89');                            // requires_grad = False
    p.Global("collections", "OrderedDict");  // backward hooks: OrderedDict()
    p.Op(')');
    p.Op('R');
    p.Op('t');
    p.Op('R');
  }
  p.Op('u');
  p.Op('.');
  return std::move(p).Take();
}

}  // namespace ember::serialization
