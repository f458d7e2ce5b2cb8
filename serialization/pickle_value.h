// Python values as Python's pickle module writes them: PickleValue, a small
// value type for None, bool, int, float, str, bytes, list, tuple, dict (str
// or int keys) and tensors, nested, with a pickler that writes the bytes
// Python 3's pickle.Pickler writes (protocol 4, framed) and a restricted
// unpickler for what Python and PyTorch write. torch.distributed's object
// collectives (distributed/object_collectives.h) carry objects this way.
//
//   ```cpp compile-only
//   #include "serialization/pickle_value.h"
//   using ember::serialization::PickleValue;
//   PickleValue config = PickleValue::Dict({{"lr", 0.1}, {"layers", PickleValue::List({1, 2})}});
//   EMBER_ASSIGN_OR_RETURN(std::string bytes, ember::serialization::pickle_value(config));
//   // pickle.loads(bytes) in Python gives {'lr': 0.1, 'layers': [1, 2]}.
//   EMBER_ASSIGN_OR_RETURN(PickleValue back, ember::serialization::unpickle_value(bytes));
//   double lr = back.at("lr")->as_float();  // 0.1
//   (void)lr;
//   ```
//
// Tensors are pickled as PyTorch pickles them (torch._utils._rebuild_tensor_v2
// over a storage that torch.storage._load_from_bytes rebuilds from a legacy
// torch.save of it), so a tensor crosses between Ember and PyTorch either
// way. Only CPU tensors are pickled (a CUDA tensor is refused: move it to the
// CPU first); a tensor is written contiguous in a storage of its own, and its
// requires_grad is not carried. Tensors read back are CPU tensors; a storage
// saved on a CUDA device is refused.
//
// The unpickler never runs code (Note [Value unpickler] in pickle_value.cc):
// it knows the opcodes of protocols 2 to 5 that build these values and
// exactly the globals collections.OrderedDict (a dict),
// torch._utils._rebuild_tensor_v2, torch._utils._rebuild_parameter and
// torch.storage._load_from_bytes; anything else is refused. Nesting deeper
// than kMaxPickleValueNesting and values larger than the input can justify
// are refused too, so hostile bytes give InvalidArgument, never a crash.
//
// Errors: InvalidArgument throughout, naming the value or opcode at fault.
//
// Thread-safety: PickleValue is a value type (copies share tensors' storages,
// as Tensor copies do); the free functions are safe from any thread.
#ifndef EMBER_SERIALIZATION_PICKLE_VALUE_H_
#define EMBER_SERIALIZATION_PICKLE_VALUE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tensor/tensor.h"

namespace ember::serialization {

// The deepest nesting of lists, tuples and dicts pickle_value writes and
// unpickle_value builds (Python's own pickler fails near its recursion limit,
// 1000).
inline constexpr int kMaxPickleValueNesting = 512;

// One Python value. Construct scalars implicitly (PickleValue(3), 2.5,
// "text", true, nullptr) and containers with the factories.
class PickleValue {
 public:
  enum class Kind { kNone, kBool, kInt, kFloat, kString, kBytes, kList, kTuple, kDict, kTensor };
  using Items = std::vector<PickleValue>;
  using Pairs = std::vector<std::pair<PickleValue, PickleValue>>;

  PickleValue() = default;                                                      // None
  PickleValue(std::nullptr_t) {}                                                // NOLINT: None
  PickleValue(bool b) : kind_(Kind::kBool), i_(b) {}                            // NOLINT
  PickleValue(int i) : kind_(Kind::kInt), i_(i) {}                              // NOLINT
  PickleValue(long i) : kind_(Kind::kInt), i_(i) {}                             // NOLINT
  PickleValue(long long i) : kind_(Kind::kInt), i_(static_cast<int64_t>(i)) {}  // NOLINT
  PickleValue(double f) : kind_(Kind::kFloat), f_(f) {}                         // NOLINT
  PickleValue(const char* s) : kind_(Kind::kString), s_(s) {}                   // NOLINT: str
  PickleValue(std::string s) : kind_(Kind::kString), s_(std::move(s)) {}        // NOLINT: str
  PickleValue(absl::string_view s) : kind_(Kind::kString), s_(s) {}             // NOLINT: str
  PickleValue(Tensor t) : kind_(Kind::kTensor), tensor_(std::move(t)) {}        // NOLINT

  static PickleValue Bytes(std::string bytes);  // Python bytes
  static PickleValue List(Items items);
  static PickleValue Tuple(Items items);
  // Keys are str or int values; order is kept (Python dicts keep insertion
  // order).
  static PickleValue Dict(Pairs pairs);

  Kind kind() const { return kind_; }
  bool is_none() const { return kind_ == Kind::kNone; }
  // The accessors below check the kind and throw ember::Error on another.
  bool as_bool() const;
  int64_t as_int() const;
  double as_float() const;
  const std::string& as_string() const;  // kString (UTF-8) or kBytes
  const Items& items() const;            // kList or kTuple
  Items& mutable_items();
  const Pairs& pairs() const;  // kDict
  Pairs& mutable_pairs();
  const Tensor& as_tensor() const;
  // The dict value under `key` (a str or int key), or null.
  const PickleValue* at(const PickleValue& key) const;

  // Deep equality; tensors are equal when dtype, sizes and values are
  // (Tensor::equal). A list never equals a tuple; an int never equals a
  // float or a bool, unlike Python.
  bool operator==(const PickleValue& other) const;
  bool operator!=(const PickleValue& other) const { return !(*this == other); }

  // Python's repr of the value, for messages and tests ("{'a': [1, None]}");
  // a tensor is "tensor(<dtype>, sizes=[2, 3])".
  std::string DebugString() const;

  // Python's name of the kind: "NoneType", "bool", "int", "float", "str",
  // "bytes", "list", "tuple", "dict", "Tensor".
  static const char* KindName(Kind kind);

 private:
  Kind kind_ = Kind::kNone;
  int64_t i_ = 0;
  double f_ = 0;
  std::string s_;
  Items items_;
  Pairs pairs_;
  Tensor tensor_;
};

// The pickle of `value` with `protocol` (3 to 5; 4 is Python 3.8-3.13's
// pickle.DEFAULT_PROTOCOL, which torch.distributed's object collectives
// use). For values without repeated objects the bytes are the ones
// Python's pickle.dumps(value, protocol) writes; Ember never writes memo
// references, so where Python shares one object twice the bytes differ but
// load to the same value. Errors: InvalidArgument for a str that is not
// UTF-8, a dict key that is not a str or int, a CUDA or undefined tensor,
// nesting past kMaxPickleValueNesting, a protocol outside 3..5.
absl::StatusOr<std::string> pickle_value(const PickleValue& value, int protocol = 4);

// The value a pickle builds (protocols 2 to 5, as Python and PyTorch write
// them). Errors: InvalidArgument naming a refused global, callable or
// opcode, a truncated or malformed program, nesting past
// kMaxPickleValueNesting, an int outside int64, a dict key that is not a str
// or int, a tensor whose geometry does not fit its storage, a storage on a
// CUDA device, or memo references that would expand the input past what it
// could hold.
absl::StatusOr<PickleValue> unpickle_value(absl::string_view pickle);

}  // namespace ember::serialization

#endif  // EMBER_SERIALIZATION_PICKLE_VALUE_H_
