#include "distributed/tcp_store_wire.h"

#include "absl/strings/str_cat.h"

namespace ember::distributed::wire {

bool Reader::Bytes(std::string_view& bytes, uint64_t max) {
  uint64_t length = 0;
  const size_t start = pos_;
  if (!Value(length)) return false;
  last_length_ = length;
  if (length > max) {
    too_long_ = true;
    pos_ = start;
    return false;
  }
  if (bytes_.size() - pos_ < length) {
    pos_ = start;
    return false;
  }
  bytes = bytes_.substr(pos_, length);
  pos_ += length;
  return true;
}

void PutStatus(std::string& out, uint8_t code, std::string_view detail) {
  PutU8(out, code);
  if (code != 0) PutBytes(out, detail);
}

namespace {

// Parses one request's fields after its query byte, counting the bytes its
// strings announce against the budget.
class RequestParser {
 public:
  RequestParser(std::string_view bytes, int64_t budget)
      : reader_(bytes), budget_(static_cast<uint64_t>(budget < 0 ? 0 : budget)) {}

  bool U8(uint8_t& value) { return reader_.Value(value); }
  bool U32(uint32_t& value) { return reader_.Value(value); }
  bool I64(int64_t& value) { return reader_.Value(value); }

  bool Bytes(std::string_view& bytes) {
    if (!reader_.Bytes(bytes, budget_ - used_)) {
      if (reader_.too_long()) {
        error_ = absl::StrCat("a string of ", reader_.last_length(), " bytes takes the request past ",
                              budget_, " bytes (max_message_bytes)");
      }
      return false;
    }
    used_ += bytes.size();
    return true;
  }

  bool Count(uint64_t& count) {
    if (!reader_.Value(count)) return false;
    if (count > kMaxKeysPerRequest) {
      error_ = absl::StrCat("a request names ", count, " keys; at most ", kMaxKeysPerRequest,
                            " may be named at once");
      return false;
    }
    return true;
  }

  size_t consumed() const { return reader_.consumed(); }
  const std::string& error() const { return error_; }

 private:
  Reader reader_;
  const uint64_t budget_;
  uint64_t used_ = 0;
  std::string error_;
};

}  // namespace

Parse ParseRequest(std::string_view bytes, int64_t max_request_bytes, Request& request,
                   size_t& consumed, std::string& error) {
  RequestParser p(bytes, max_request_bytes);
  uint8_t query = 0;
  if (!p.U8(query)) return Parse::kIncomplete;
  request.query = static_cast<Query>(query);
  request.keys.clear();
  request.values.clear();
  bool ok = false;
  auto keys = [&](bool with_values) {
    uint64_t count = 0;
    if (!p.Count(count)) return false;
    // Each key costs at least its 8-byte length: a count the budget cannot
    // hold is refused before anything is reserved for it.
    if (count > static_cast<uint64_t>(max_request_bytes) / 8 + 1) {
      error = absl::StrCat("a request names ", count, " keys, more than ", max_request_bytes,
                           " bytes (max_message_bytes) can hold");
      return false;
    }
    request.keys.reserve(count);
    if (with_values) request.values.reserve(count);
    for (uint64_t i = 0; i < count; ++i) {
      std::string_view key, value;
      if (!p.Bytes(key)) return false;
      request.keys.push_back(key);
      if (with_values) {
        if (!p.Bytes(value)) return false;
        request.values.push_back(value);
      }
    }
    return true;
  };
  switch (request.query) {
    case Query::kValidate:
    case Query::kPing:
      ok = p.U32(request.word);
      break;
    case Query::kSet:
    case Query::kAppend:
    case Query::kQueuePush:
      ok = p.Bytes(request.key) && p.Bytes(request.value);
      break;
    case Query::kCompareSet:
      ok = p.Bytes(request.key) && p.Bytes(request.value) && p.Bytes(request.value2);
      break;
    case Query::kGet:
    case Query::kDeleteKey:
    case Query::kQueuePop:
    case Query::kQueueLen:
      ok = p.Bytes(request.key);
      break;
    case Query::kAdd:
    case Query::kBarrier:
    case Query::kEmberGet:
    case Query::kEmberAdd:
      ok = p.Bytes(request.key) && p.I64(request.number);
      break;
    case Query::kCheck:
    case Query::kWait:
    case Query::kMultiGet:
      ok = keys(false);
      break;
    case Query::kMultiSet:
      ok = keys(true);
      break;
    case Query::kEmberWait:
      ok = keys(false) && p.I64(request.number);
      break;
    case Query::kNumKeys:
    case Query::kCancelWait:
    case Query::kListKeys:
      ok = true;
      break;
    default:
      error = absl::StrCat("unknown query ", static_cast<int>(query));
      return Parse::kInvalid;
  }
  if (!error.empty() || !p.error().empty()) {
    if (error.empty()) error = p.error();
    return Parse::kInvalid;
  }
  if (!ok) return Parse::kIncomplete;
  consumed = p.consumed();
  return Parse::kComplete;
}

}  // namespace ember::distributed::wire
