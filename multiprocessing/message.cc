#include "multiprocessing/message.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <iterator>
#include <memory>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tensor/dtype.h"
#include "tensor/error.h"
#include "tensor/status_macros.h"

namespace ember::multiprocessing {
namespace {

constexpr uint32_t kMagic = 0x51424D45;  // "EMBQ" in memory order
constexpr uint16_t kVersion = 3;
constexpr int kMaxDepth = 64;
constexpr int kMaxDims = 64;

enum Tag : uint8_t { kNone = 0, kBool, kInt, kDouble, kString, kTensor, kList, kDict, kChannel };
// A tensor node's flags.
constexpr uint8_t kRequiresGrad = 1;

class Writer {
 public:
  template <typename T>
  void Put(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    out_.append(reinterpret_cast<const char*>(&v), sizeof(v));
  }
  void PutBytes(std::string_view s) {
    Put<uint32_t>(static_cast<uint32_t>(s.size()));
    out_.append(s);
  }
  std::string& out() { return out_; }

 private:
  std::string out_;
};

class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  template <typename T>
  absl::Status Get(T& v) {
    if (in_.size() - pos_ < sizeof(T)) return Truncated();
    std::memcpy(&v, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return absl::OkStatus();
  }
  absl::Status GetBytes(std::string& s) {
    uint32_t n = 0;
    EMBER_RETURN_IF_ERROR(Get(n));
    if (in_.size() - pos_ < n) return Truncated();
    s.assign(in_.data() + pos_, n);
    pos_ += n;
    return absl::OkStatus();
  }
  bool done() const { return pos_ == in_.size(); }
  size_t pos() const { return pos_; }
  size_t left() const { return in_.size() - pos_; }

 private:
  absl::Status Truncated() const {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed message: truncated at byte ", pos_, " of ", in_.size()));
  }
  std::string_view in_;
  size_t pos_ = 0;
};

absl::Status Malformed(const std::string& what) {
  return absl::InvalidArgumentError("malformed message: " + what);
}

std::array<ChannelCodec, kNumChannelKinds>& Codecs() {
  static std::array<ChannelCodec, kNumChannelKinds> codecs;
  return codecs;
}

template <typename T>
constexpr ChannelKind KindOf() {
  if constexpr (std::is_same_v<T, Connection>) return ChannelKind::kConnection;
  if constexpr (std::is_same_v<T, SimpleQueue>) return ChannelKind::kSimpleQueue;
  if constexpr (std::is_same_v<T, Queue>) return ChannelKind::kQueue;
  if constexpr (std::is_same_v<T, Lock>) return ChannelKind::kLock;
  if constexpr (std::is_same_v<T, RLock>) return ChannelKind::kRLock;
  if constexpr (std::is_same_v<T, Semaphore>) return ChannelKind::kSemaphore;
  if constexpr (std::is_same_v<T, BoundedSemaphore>) return ChannelKind::kBoundedSemaphore;
  if constexpr (std::is_same_v<T, Event>) return ChannelKind::kEvent;
  if constexpr (std::is_same_v<T, Condition>) return ChannelKind::kCondition;
  return ChannelKind::kBarrier;
}

template <typename T>
struct HandleOf : std::false_type {};
template <typename T>
struct HandleOf<std::shared_ptr<const T>> : std::bool_constant<internal::kIsHandle<T>> {
  using Type = T;
};

constexpr const char* kChannelNames[] = {
    "connection", "simple_queue",      "queue", "lock",      "rlock",
    "semaphore",  "bounded_semaphore", "event", "condition", "barrier"};
static_assert(std::size(kChannelNames) == kNumChannelKinds);

struct Encoder {
  Writer body;
  EncodedMessage* message;
  std::unordered_map<const void*, uint32_t> storage_index;  // by Storage::id()
  std::vector<int> channel_fds;                             // sent after the storages'

  absl::Status Encode(const Value& v) {
    return std::visit(
        [&](const auto& x) -> absl::Status {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<T, std::monostate>) {
            body.Put<uint8_t>(kNone);
          } else if constexpr (std::is_same_v<T, bool>) {
            body.Put<uint8_t>(kBool);
            body.Put<uint8_t>(x ? 1 : 0);
          } else if constexpr (std::is_same_v<T, int64_t>) {
            body.Put<uint8_t>(kInt);
            body.Put<int64_t>(x);
          } else if constexpr (std::is_same_v<T, double>) {
            body.Put<uint8_t>(kDouble);
            body.Put<double>(x);
          } else if constexpr (std::is_same_v<T, std::string>) {
            body.Put<uint8_t>(kString);
            body.PutBytes(x);
          } else if constexpr (std::is_same_v<T, Tensor>) {
            return EncodeTensor(x);
          } else if constexpr (HandleOf<T>::value) {
            constexpr ChannelKind kind = KindOf<typename HandleOf<T>::Type>();
            const ChannelCodec& codec = Codecs()[static_cast<int>(kind)];
            const size_t before = channel_fds.size();
            EMBER_ASSIGN_OR_RETURN(std::string state, codec.encode(v, channel_fds));
            EMBER_CHECK(channel_fds.size() - before == codec.fds, "a ",
                        kChannelNames[static_cast<int>(kind)],
                        " codec gave the wrong number of descriptors");
            body.Put<uint8_t>(kChannel);
            body.Put<uint8_t>(static_cast<uint8_t>(kind));
            body.Put<uint8_t>(codec.fds);
            body.PutBytes(state);
          } else if constexpr (std::is_same_v<T, Value::List>) {
            body.Put<uint8_t>(kList);
            body.Put<uint32_t>(static_cast<uint32_t>(x.size()));
            for (const Value& e : x) EMBER_RETURN_IF_ERROR(Encode(e));
          } else {
            body.Put<uint8_t>(kDict);
            body.Put<uint32_t>(static_cast<uint32_t>(x.size()));
            for (const auto& [key, e] : x) {
              body.PutBytes(key);
              EMBER_RETURN_IF_ERROR(Encode(e));
            }
          }
          return absl::OkStatus();
        },
        v.variant());
  }

  absl::Status EncodeTensor(const Tensor& t) {
    if (!t.defined()) return absl::InvalidArgumentError("cannot send an undefined tensor");
    EMBER_RETURN_IF_ERROR(CheckTensorSendable(t));
    const Storage& storage = t.storage();
    auto [it, fresh] =
        storage_index.try_emplace(storage.id(), static_cast<uint32_t>(message->storages.size()));
    if (fresh) {
      EMBER_ASSIGN_OR_RETURN(SharingHandler * h, get_sharing_handler(storage.device().type()));
      EMBER_RETURN_IF_ERROR(h->Share(storage));
      EMBER_ASSIGN_OR_RETURN(ExportedStorage e, h->Export(storage));
      message->storages.push_back(std::move(e));
    }
    body.Put<uint8_t>(kTensor);
    // requires_grad travels (a parameter arrives as a leaf that requires
    // grad, as PyTorch's rebuild keeps it); the gradient does not.
    body.Put<uint8_t>(t.requires_grad() ? kRequiresGrad : 0);
    body.Put<int8_t>(static_cast<int8_t>(t.dtype()));
    body.Put<uint8_t>(static_cast<uint8_t>(t.dim()));
    for (int64_t s : t.sizes()) body.Put<int64_t>(s);
    for (int64_t s : t.strides()) body.Put<int64_t>(s);
    body.Put<int64_t>(t.storage_offset());
    body.Put<uint32_t>(it->second);
    return absl::OkStatus();
  }
};

struct Decoder {
  Reader in;
  std::vector<Storage> storages;
  std::vector<base::UniqueFd> channel_fds;  // those after the storages', in order
  size_t next_channel_fd = 0;

  absl::StatusOr<Value> Decode(int depth) {
    if (depth > kMaxDepth) return Malformed(absl::StrCat("nesting deeper than ", kMaxDepth));
    uint8_t tag = 0;
    EMBER_RETURN_IF_ERROR(in.Get(tag));
    switch (tag) {
      case kNone:
        return Value();
      case kBool: {
        uint8_t b = 0;
        EMBER_RETURN_IF_ERROR(in.Get(b));
        if (b > 1) return Malformed(absl::StrCat("bool byte ", b));
        return Value(b == 1);
      }
      case kInt: {
        int64_t x = 0;
        EMBER_RETURN_IF_ERROR(in.Get(x));
        return Value(x);
      }
      case kDouble: {
        double x = 0;
        EMBER_RETURN_IF_ERROR(in.Get(x));
        return Value(x);
      }
      case kString: {
        std::string s;
        EMBER_RETURN_IF_ERROR(in.GetBytes(s));
        return Value(std::move(s));
      }
      case kTensor:
        return DecodeTensor();
      case kChannel:
        return DecodeChannel();
      case kList: {
        uint32_t n = 0;
        EMBER_RETURN_IF_ERROR(in.Get(n));
        Value::List list;
        list.reserve(std::min<size_t>(n, in.left()));  // every element takes a byte or more
        for (uint32_t i = 0; i < n; ++i) {
          EMBER_ASSIGN_OR_RETURN(Value v, Decode(depth + 1));
          list.push_back(std::move(v));
        }
        return Value(std::move(list));
      }
      case kDict: {
        uint32_t n = 0;
        EMBER_RETURN_IF_ERROR(in.Get(n));
        Value::Dict dict;
        for (uint32_t i = 0; i < n; ++i) {
          std::string key;
          EMBER_RETURN_IF_ERROR(in.GetBytes(key));
          EMBER_ASSIGN_OR_RETURN(Value v, Decode(depth + 1));
          if (!dict.emplace(key, std::move(v)).second) {
            return Malformed(absl::StrCat("dict key '", key.substr(0, 64), "' appears twice"));
          }
        }
        return Value(std::move(dict));
      }
      default:
        return Malformed(absl::StrCat("unknown value tag ", tag, " at byte ", in.pos() - 1));
    }
  }

  absl::StatusOr<Value> DecodeChannel() {
    uint8_t kind = 0, nfds = 0;
    std::string state;
    EMBER_RETURN_IF_ERROR(in.Get(kind));
    EMBER_RETURN_IF_ERROR(in.Get(nfds));
    EMBER_RETURN_IF_ERROR(in.GetBytes(state));
    if (kind >= kNumChannelKinds) return Malformed(absl::StrCat("channel kind ", kind));
    const ChannelCodec& codec = Codecs()[kind];
    if (codec.decode == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("a ", kChannelNames[kind],
                       " arrived, but this binary cannot rebuild one; link the library that "
                       "defines it (//multiprocessing:queue, :connection or :synchronize) into "
                       "it"));
    }
    if (nfds != codec.fds || nfds > channel_fds.size() - next_channel_fd) {
      return Malformed(absl::StrCat("a ", kChannelNames[kind], " with ", nfds, " descriptors (",
                                    channel_fds.size() - next_channel_fd, " left)"));
    }
    std::vector<base::UniqueFd> fds;
    for (uint8_t k = 0; k < nfds; ++k) fds.push_back(std::move(channel_fds[next_channel_fd++]));
    return codec.decode(std::move(fds), state);
  }

  absl::StatusOr<Value> DecodeTensor() {
    uint8_t flags = 0;
    int8_t dtype = 0;
    uint8_t ndim = 0;
    EMBER_RETURN_IF_ERROR(in.Get(flags));
    if ((flags & ~kRequiresGrad) != 0) return Malformed(absl::StrCat("tensor flags ", flags));
    EMBER_RETURN_IF_ERROR(in.Get(dtype));
    EMBER_RETURN_IF_ERROR(in.Get(ndim));
    if (dtype < 0 || dtype >= kNumDtypes) return Malformed(absl::StrCat("dtype code ", dtype));
    if (ndim > kMaxDims) return Malformed(absl::StrCat(ndim, " dimensions"));
    if ((flags & kRequiresGrad) && !is_floating_point(static_cast<Dtype>(dtype))) {
      return Malformed(absl::StrCat("requires_grad on a tensor of dtype code ", dtype));
    }
    SizeVector sizes(ndim), strides(ndim);
    for (auto& s : sizes) EMBER_RETURN_IF_ERROR(in.Get(s));
    for (auto& s : strides) EMBER_RETURN_IF_ERROR(in.Get(s));
    int64_t offset = 0;
    uint32_t index = 0;
    EMBER_RETURN_IF_ERROR(in.Get(offset));
    EMBER_RETURN_IF_ERROR(in.Get(index));
    if (index >= storages.size()) {
      return Malformed(absl::StrCat("storage index ", index, " of ", storages.size()));
    }
    const Storage& storage = storages[index];
    const Dtype dt = static_cast<Dtype>(dtype);
    // The furthest element must lie inside the storage (128-bit: no overflow).
    const int64_t limit = static_cast<int64_t>(storage.nbytes() / element_size(dt));
    bool empty = false;
    for (int64_t n : sizes) empty |= (n == 0);
    if (offset < 0) return Malformed(absl::StrCat("storage offset ", offset));
    __int128 last = offset;
    for (int d = 0; d < ndim; ++d) {
      if (sizes[d] < 0 || strides[d] < 0) {
        return Malformed(absl::StrCat("size ", sizes[d], " / stride ", strides[d], " in dim ", d));
      }
      if (!empty) last += static_cast<__int128>(sizes[d] - 1) * strides[d];
    }
    if (!empty && last >= limit) {
      return Malformed(
          absl::StrCat("a tensor reaches past the ", limit, " elements of its storage"));
    }
    auto impl = std::make_shared<TensorImpl>(storage, dt, sizes, strides, offset);
    Tensor t(std::move(impl));
    if (flags & kRequiresGrad) {
      try {
        t.requires_grad_(true);  // a fresh leaf: its own .grad, none shared
      } catch (const std::exception& e) {
        return absl::FailedPreconditionError(absl::StrCat(
            "a tensor that requires grad arrived, but this process cannot record gradients: ",
            e.what(), ". Link //autograd into the receiving binary"));
      }
    }
    return Value(std::move(t));
  }
};

}  // namespace

absl::Status CheckTensorSendable(const Tensor& t) {
  if (t.requires_grad() && !t.is_leaf()) {
    return absl::InvalidArgumentError(
        "cannot send a non-leaf tensor that requires grad between processes "
        "(its autograd graph cannot cross a process boundary); send "
        "tensor.detach() to share its data");
  }
  return absl::OkStatus();
}

absl::StatusOr<EncodedMessage> EncodeMessage(const Value& value) {
  EncodedMessage message;
  Encoder enc{Writer(), &message, {}};
  absl::Status status = enc.Encode(value);
  if (!status.ok()) {
    AbandonMessage(message);
    return status;
  }
  Writer head;
  head.Put<uint32_t>(kMagic);
  head.Put<uint16_t>(kVersion);
  head.Put<uint16_t>(0);
  head.Put<uint32_t>(static_cast<uint32_t>(message.storages.size()));
  for (const ExportedStorage& e : message.storages) {
    head.Put<uint8_t>(static_cast<uint8_t>(e.source.device().type()));
    head.Put<uint64_t>(e.nbytes);
    head.PutBytes(e.handle);
    head.Put<uint8_t>(static_cast<uint8_t>(e.fds.size()));
    message.fds.insert(message.fds.end(), e.fds.begin(), e.fds.end());
  }
  message.fds.insert(message.fds.end(), enc.channel_fds.begin(), enc.channel_fds.end());
  message.bytes = std::move(head.out()) + enc.body.out();
  return message;
}

void RegisterChannelCodec(ChannelKind kind, ChannelCodec codec) {
  Codecs()[static_cast<int>(kind)] = codec;
}

void AbandonMessage(EncodedMessage& message) {
  for (ExportedStorage& e : message.storages) {
    if (absl::StatusOr<SharingHandler*> h = get_sharing_handler(e.source.device().type()); h.ok()) {
      (*h)->Abandon(e);
    }
  }
  message.storages.clear();
  message.fds.clear();
}

absl::StatusOr<Value> DecodeMessage(std::string_view bytes, std::vector<base::UniqueFd> fds) {
  Decoder dec{Reader(bytes), {}};
  uint32_t magic = 0, count = 0;
  uint16_t version = 0, flags = 0;
  EMBER_RETURN_IF_ERROR(dec.in.Get(magic));
  if (magic != kMagic) {
    return Malformed(absl::StrFormat("bad magic 0x%08x: not an Ember queue message", magic));
  }
  EMBER_RETURN_IF_ERROR(dec.in.Get(version));
  if (version != kVersion) {
    return Malformed(absl::StrCat("version ", version, " (this build reads ", kVersion, ")"));
  }
  EMBER_RETURN_IF_ERROR(dec.in.Get(flags));
  EMBER_RETURN_IF_ERROR(dec.in.Get(count));
  if (count > bytes.size()) return Malformed(absl::StrCat(count, " storages"));
  size_t next_fd = 0;
  for (uint32_t i = 0; i < count; ++i) {
    uint8_t device = 0, nfds = 0;
    ReceivedStorage r;
    EMBER_RETURN_IF_ERROR(dec.in.Get(device));
    EMBER_RETURN_IF_ERROR(dec.in.Get(r.nbytes));
    EMBER_RETURN_IF_ERROR(dec.in.GetBytes(r.handle));
    EMBER_RETURN_IF_ERROR(dec.in.Get(nfds));
    if (device >= kNumDeviceTypes) return Malformed(absl::StrCat("device type ", device));
    if (nfds > fds.size() - next_fd) {
      return Malformed(absl::StrCat("storage ", i, " wants ", nfds, " descriptors but only ",
                                    fds.size() - next_fd, " arrived"));
    }
    for (uint8_t k = 0; k < nfds; ++k) r.fds.push_back(std::move(fds[next_fd++]));
    EMBER_ASSIGN_OR_RETURN(SharingHandler * h,
                           get_sharing_handler(static_cast<DeviceType>(device)));
    EMBER_ASSIGN_OR_RETURN(Storage s, h->Import(std::move(r)));
    dec.storages.push_back(std::move(s));
  }
  dec.channel_fds.assign(std::make_move_iterator(fds.begin() + next_fd),
                         std::make_move_iterator(fds.end()));
  EMBER_ASSIGN_OR_RETURN(Value v, dec.Decode(0));
  if (!dec.in.done()) return Malformed(absl::StrCat("trailing bytes after byte ", dec.in.pos()));
  if (dec.next_channel_fd != dec.channel_fds.size()) {
    return Malformed(absl::StrCat(fds.size(), " descriptors arrived but ",
                                  next_fd + dec.next_channel_fd, " were used"));
  }
  return v;
}

}  // namespace ember::multiprocessing
