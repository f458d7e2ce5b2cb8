// The bytes TcpStore's clients and server exchange: c10d's TCPStore protocol,
// as PyTorch 2.x speaks it, so that PyTorch ranks, torchrun and Ember's ranks
// share one store; and Ember's few extensions to it, which only Ember's
// server answers. Internal to distributed/ (tcp_store.cc, tcp_store_server.cc
// and their tests); see Note [TcpStore protocol] in tcp_store_server.cc.
//
// A request is one query byte followed by its fields; integers are in the
// machine's byte order (little-endian on every platform PyTorch runs on),
// strings and byte values are a uint64 length and the bytes:
//
//   query          fields                         reply
//   VALIDATE    0  uint32 magic                   none (a wrong magic: closed)
//   SET         1  key, value                     none
//   COMPARE_SET 2  key, expected, desired         value now stored
//   GET         3  key                            value ("" when absent)
//   ADD         4  key, int64 delta               int64 new value
//   CHECK       5  uint64 n, n keys               uint8 READY / NOT_READY
//   WAIT        6  uint64 n, n keys               uint8 STOP_WAITING, once all are set
//   GETNUMKEYS  7  -                              int64
//   DELETE_KEY  8  key                            int64 keys deleted (0 or 1)
//   APPEND      9  key, value                     none
//   MULTI_GET  10  uint64 n, n keys               n values
//   MULTI_SET  11  uint64 n, n (key, value)       none
//   CANCEL_WAIT 12 -                              uint8 WAIT_CANCELED
//   PING       13  uint32 nonce                   uint32 nonce
//   QUEUE_PUSH 14  key, value                     none
//   QUEUE_POP  15  key                            int64 length before, then the value if > 0
//   QUEUE_LEN  16  key                            int64
//   LIST_KEYS  17  -                              int64 n, n keys
//   BARRIER    18  key, int64 world_size          uint8 STOP_WAITING once the count reaches it
//
// Ember's extensions (numbered from 0x80) reply with a status first:
//   EMBER_GET  0x80  key, int64 timeout_us             status, then the value
//   EMBER_WAIT 0x81  uint64 n, n keys, int64 timeout_us status
//   EMBER_ADD  0x82  key, int64 delta                  status, then the int64 value
// where a status is one byte, an absl::StatusCode (0 for OK), and for any
// other code a detail: bytes whose meaning the code gives (PutStatus below).
#ifndef EMBER_DISTRIBUTED_TCP_STORE_WIRE_H_
#define EMBER_DISTRIBUTED_TCP_STORE_WIRE_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace ember::distributed::wire {

// What a c10d client sends first (VALIDATE's field).
inline constexpr uint32_t kValidationMagic = 0x3C85F7CE;

enum class Query : uint8_t {
  kValidate = 0,
  kSet = 1,
  kCompareSet = 2,
  kGet = 3,
  kAdd = 4,
  kCheck = 5,
  kWait = 6,
  kNumKeys = 7,
  kDeleteKey = 8,
  kAppend = 9,
  kMultiGet = 10,
  kMultiSet = 11,
  kCancelWait = 12,
  kPing = 13,
  kQueuePush = 14,
  kQueuePop = 15,
  kQueueLen = 16,
  kListKeys = 17,
  kBarrier = 18,
  kEmberGet = 0x80,
  kEmberWait = 0x81,
  kEmberAdd = 0x82,
};

enum class CheckReply : uint8_t { kReady = 0, kNotReady = 1 };
enum class WaitReply : uint8_t { kStopWaiting = 0, kWaitCanceled = 1 };

// The key whose CHECK tells a client whether the server answers Ember's
// extensions: Ember's server says READY without storing it; PyTorch's server
// says NOT_READY, as for any key no one set (clients' keys all begin with '/',
// so no client can set this one).
inline constexpr std::string_view kExtensionProbeKey{"\0ember-store/1", 14};

// The most keys one request may name (c10d's own bound).
inline constexpr uint64_t kMaxKeysPerRequest = uint64_t{128} << 10;

// Appends fields to a message.
inline void PutU8(std::string& out, uint8_t value) { out.push_back(static_cast<char>(value)); }
template <typename T>
void PutValue(std::string& out, T value) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));
  out.append(bytes, sizeof(T));
}
inline void PutBytes(std::string& out, std::string_view bytes) {
  PutValue<uint64_t>(out, bytes.size());
  out.append(bytes);
}
inline void PutQuery(std::string& out, Query query) { PutU8(out, static_cast<uint8_t>(query)); }

// One request, its strings viewing the bytes it was parsed from.
struct Request {
  Query query = Query::kValidate;
  std::string_view key;
  std::string_view value;   // SET, APPEND, QUEUE_PUSH; COMPARE_SET's expected
  std::string_view value2;  // COMPARE_SET's desired
  int64_t number = 0;       // ADD's delta, BARRIER's world size, EMBER_*'s timeout_us
  uint32_t word = 0;        // VALIDATE's magic, PING's nonce
  std::vector<std::string_view> keys;    // CHECK, WAIT, MULTI_GET, MULTI_SET, EMBER_WAIT
  std::vector<std::string_view> values;  // MULTI_SET
};

enum class Parse {
  kComplete,    // `request` holds the first request; `consumed` says its length
  kIncomplete,  // more bytes are needed
  kInvalid,     // not a request this server takes; `error` says why
};

// Parses the request at the front of `bytes`. A request whose strings add up
// to more than `max_request_bytes`, or that names more than
// kMaxKeysPerRequest keys, is kInvalid as soon as its lengths say so, before
// its bytes arrive.
Parse ParseRequest(std::string_view bytes, int64_t max_request_bytes, Request& request,
                   size_t& consumed, std::string& error);

// Reads fields from the front of `bytes`; each returns false when too few
// bytes are left (and then consumes nothing more).
class Reader {
 public:
  explicit Reader(std::string_view bytes) : bytes_(bytes) {}

  template <typename T>
  bool Value(T& value) {
    if (bytes_.size() - pos_ < sizeof(T)) return false;
    std::memcpy(&value, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  // A length and its bytes; a length above `max` sets too_long() and fails.
  bool Bytes(std::string_view& bytes, uint64_t max);

  size_t consumed() const { return pos_; }
  bool too_long() const { return too_long_; }
  uint64_t last_length() const { return last_length_; }

 private:
  std::string_view bytes_;
  size_t pos_ = 0;
  bool too_long_ = false;
  uint64_t last_length_ = 0;
};

// An Ember extension's status and detail (see the table above). The details:
//   kDataLoss, kOutOfRange (EMBER_ADD): the key's current value, from which
//     the client words the error as every store does (store_util.h);
//   kDeadlineExceeded (EMBER_GET, EMBER_WAIT): the indices, in the request, of
//     the keys still missing, as uint64s;
//   any other code: a message.
void PutStatus(std::string& out, uint8_t code, std::string_view detail);

}  // namespace ember::distributed::wire

#endif  // EMBER_DISTRIBUTED_TCP_STORE_WIRE_H_
