// Value: what queues and pipes carry: None, a bool, an integer, a double, a
// string, a tensor, a list of values, a dict from strings to values (nested
// freely), a channel (a Connection, SimpleQueue or Queue) or a
// synchronization primitive (synchronize.h: Lock, RLock, Semaphore,
// BoundedSemaphore, Event, Condition, Barrier), as PyTorch's pickled messages
// carry Python objects.
//
//   ```cpp
//   #include "multiprocessing/queue.h"  // for Value(queue) and as<Queue>()
//   #include "multiprocessing/value.h"
//   #include "tensor/factories.h"
//   namespace mp = ember::multiprocessing;
//   mp::Value msg = mp::Value::List{mp::Value(3), mp::Value("loss"), mp::Value(ember::ones({4}))};
//   EMBER_ASSIGN_OR_RETURN(ember::Tensor t, msg.list()[2].as<ember::Tensor>());
//   EMBER_ASSIGN_OR_RETURN(mp::Queue queue, mp::Queue::create());
//   mp::Value state =
//       mp::Value::Dict{{"step", mp::Value(10)}, {"w", mp::Value(t)}, {"q", mp::Value(queue)}};
//   const mp::Value* step = state.find("step");  // null when absent
//   if (step == nullptr) return absl::NotFoundError("no step");
//   EMBER_ASSIGN_OR_RETURN(mp::Queue q, state.find("q")->as<mp::Queue>());
//   ```
//
// Channels and synchronization primitives travel as their descriptors
// (message.h), so a child started with the spawn method can be handed the
// queues, pipes and locks of its parent.
//
// Copying a Value copies tensor, channel and primitive handles, not their
// bytes, sockets or shared pages. Thread-compatible.
#ifndef EMBER_MULTIPROCESSING_VALUE_H_
#define EMBER_MULTIPROCESSING_VALUE_H_

#include <cstdint>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "tensor/tensor.h"

namespace ember::multiprocessing {

// Defined in connection.h and queue.h; a Value holds them by handle.
class Connection;
class SimpleQueue;
class Queue;
// Defined in synchronize.h.
class Lock;
class RLock;
class Semaphore;
class BoundedSemaphore;
class Event;
class Condition;
class Barrier;

namespace internal {
template <typename T>
inline constexpr bool kIsChannel =
    std::is_same_v<T, Connection> || std::is_same_v<T, SimpleQueue> || std::is_same_v<T, Queue>;
template <typename T>
inline constexpr bool kIsSyncPrimitive =
    std::is_same_v<T, Lock> || std::is_same_v<T, RLock> || std::is_same_v<T, Semaphore> ||
    std::is_same_v<T, BoundedSemaphore> || std::is_same_v<T, Event> ||
    std::is_same_v<T, Condition> || std::is_same_v<T, Barrier>;
// Held by a Value as a shared handle.
template <typename T>
inline constexpr bool kIsHandle = kIsChannel<T> || kIsSyncPrimitive<T>;
}  // namespace internal

class Value {
 public:
  using List = std::vector<Value>;
  // Keys in sorted order (a Python dict keeps insertion order; nothing here
  // depends on it).
  using Dict = std::map<std::string, Value>;
  using Variant = std::variant<std::monostate, bool, int64_t, double, std::string, Tensor, List,
                               Dict, std::shared_ptr<const Connection>,
                               std::shared_ptr<const SimpleQueue>, std::shared_ptr<const Queue>,
                               std::shared_ptr<const Lock>, std::shared_ptr<const RLock>,
                               std::shared_ptr<const Semaphore>,
                               std::shared_ptr<const BoundedSemaphore>,
                               std::shared_ptr<const Event>, std::shared_ptr<const Condition>,
                               std::shared_ptr<const Barrier>>;

  Value() = default;                             // None
  Value(bool v) : v_(v) {}                       // NOLINT: implicit by design
  Value(int v) : v_(static_cast<int64_t>(v)) {}  // NOLINT
  Value(int64_t v) : v_(v) {}                    // NOLINT
  Value(double v) : v_(v) {}                     // NOLINT
  Value(const char* v) : v_(std::string(v)) {}   // NOLINT
  Value(std::string v) : v_(std::move(v)) {}     // NOLINT
  Value(Tensor v) : v_(std::move(v)) {}          // NOLINT
  Value(List v) : v_(std::move(v)) {}            // NOLINT
  Value(Dict v) : v_(std::move(v)) {}            // NOLINT
  // A channel (Connection, SimpleQueue or Queue) or a synchronization
  // primitive: the Value holds a handle to the same socket(s) or shared page,
  // as copying the channel or primitive would.
  template <typename T, typename = std::enable_if_t<internal::kIsHandle<T>>>
  Value(T channel)  // NOLINT
      : v_(std::shared_ptr<const T>(std::make_shared<T>(std::move(channel)))) {}

  bool is_none() const { return std::holds_alternative<std::monostate>(v_); }
  template <typename T>
  bool is() const {
    return get_if<T>() != nullptr;
  }
  // The held T, or null.
  template <typename T>
  const T* get_if() const {
    if constexpr (internal::kIsHandle<T>) {
      const auto* p = std::get_if<std::shared_ptr<const T>>(&v_);
      return p != nullptr ? p->get() : nullptr;
    } else {
      return std::get_if<T>(&v_);
    }
  }
  // The held T (a channel or primitive: a handle to the same one), or
  // InvalidArgument
  // naming what is held instead.
  template <typename T>
  absl::StatusOr<T> as() const {
    if (const T* p = get_if<T>()) return *p;
    using Held = std::conditional_t<internal::kIsHandle<T>, std::shared_ptr<const T>, T>;
    return absl::InvalidArgumentError(absl::StrCat("expected a ", KindName(Variant(Held{}).index()),
                                                   " value, got ", KindName(v_.index())));
  }
  // The elements of a list (empty for anything else).
  const List& list() const {
    static const List kEmpty;
    const List* l = std::get_if<List>(&v_);
    return l != nullptr ? *l : kEmpty;
  }
  // The entries of a dict (empty for anything else).
  const Dict& dict() const {
    static const Dict kEmpty;
    const Dict* d = std::get_if<Dict>(&v_);
    return d != nullptr ? *d : kEmpty;
  }
  // The value under `key` of a dict, or null (absent, or not a dict).
  const Value* find(const std::string& key) const {
    const Dict& d = dict();
    auto it = d.find(key);
    return it == d.end() ? nullptr : &it->second;
  }
  const Variant& variant() const { return v_; }
  // "none", "bool", "int", "double", "string", "tensor", "list", "dict",
  // "connection", "simple_queue", "queue", "lock", "rlock", "semaphore",
  // "bounded_semaphore", "event", "condition" or "barrier".
  std::string_view kind() const { return KindName(v_.index()); }

 private:
  static const char* KindName(size_t index) {
    constexpr const char* kNames[] = {
        "none",       "bool",         "int",   "double", "string",    "tensor",
        "list",       "dict",         "connection", "simple_queue", "queue", "lock",
        "rlock",      "semaphore",    "bounded_semaphore", "event", "condition", "barrier"};
    static_assert(std::size(kNames) == std::variant_size_v<Variant>);
    return kNames[index];
  }
  Variant v_;
};

}  // namespace ember::multiprocessing

#endif  // EMBER_MULTIPROCESSING_VALUE_H_
