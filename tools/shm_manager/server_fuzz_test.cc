// Random mutations of the manager protocol against a real daemon: garbage,
// valid conversations with bytes flipped, inserted or cut off, and headers
// with random fields, sent in random pieces. Every answer must be a
// well-formed kAck or kError (after which the daemon hangs up), the daemon
// must survive without growing its descriptors or memory, and a normal
// client must be served afterwards. Fixed seed and iteration count: the run
// is the same every time and takes a few seconds.
#include <signal.h>
#include <sys/socket.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "multiprocessing/manager_protocol.h"
#include "multiprocessing/testing.h"
#include "base/unique_fd.h"
#include "tools/shm_manager/testing.h"

namespace ember::shm_manager::testing {
namespace {

using multiprocessing::EncodeFrame;
using multiprocessing::Frame;
using multiprocessing::FrameReader;
using multiprocessing::FrameType;
using multiprocessing::kFrameHeaderBytes;
using multiprocessing::testing::DirEntries;
using multiprocessing::testing::WaitUntil;

constexpr int kIterations = 6000;
constexpr uint64_t kSeed = 0x5eed0fe3b3;

// VmRSS of `pid` in KiB.
int64_t ResidentKib(pid_t pid) {
  int64_t kib = 0;
  if (FILE* f = std::fopen(absl::StrCat("/proc/", pid, "/status").c_str(), "r")) {
    char line[256];
    while (std::fgets(line, sizeof(line), f) != nullptr) {
      if (std::strncmp(line, "VmRSS:", 6) == 0) kib = std::strtoll(line + 6, nullptr, 10);
    }
    std::fclose(f);
  }
  return kib;
}

class Fuzzer {
 public:
  Fuzzer(std::string base) : base_(std::move(base)), rng_(kSeed) {}

  size_t Below(size_t n) { return n == 0 ? 0 : rng_() % n; }

  // A conversation a correct client could have.
  std::string ValidConversation() {
    std::string out = EncodeFrame(FrameType::kHello, absl::StrCat(::getpid()));
    std::vector<std::string> mine;
    for (size_t i = 0, n = Below(4); i < n; ++i) {
      if (!mine.empty() && Below(3) == 0) {
        out += EncodeFrame(FrameType::kUnregister, mine[Below(mine.size())]);
      } else {
        mine.push_back(TestRegionName(base_, counter_++));
        out += EncodeFrame(FrameType::kRegister, mine.back());
      }
    }
    if (Below(2) == 0) out += EncodeFrame(FrameType::kGoodbye);
    return out;
  }

  std::string RandomBytes(size_t n) {
    std::string out(n, '\0');
    for (char& c : out) c = static_cast<char>(rng_());
    return out;
  }

  // One mutated input; `kind` says which mutation, for failure messages.
  std::string Next(std::string& kind) {
    std::string bytes = ValidConversation();
    switch (Below(7)) {
      case 0:
        kind = "garbage";
        return RandomBytes(1 + Below(300));
      case 1: {
        kind = "flipped bytes";
        for (size_t i = 0, n = 1 + Below(4); i < n; ++i)
          bytes[Below(bytes.size())] ^= 1 + Below(255);
        return bytes;
      }
      case 2:
        kind = "truncated";
        return bytes.substr(0, Below(bytes.size()));
      case 3: {
        kind = "random header field";
        // A header field of one of its frames: version, type or length.
        size_t frame = Below(bytes.size() / kFrameHeaderBytes) * kFrameHeaderBytes;
        size_t field = 4 + 2 * Below(4);
        if (frame + field + 2 <= bytes.size()) {
          uint16_t v = static_cast<uint16_t>(rng_());
          std::memcpy(bytes.data() + frame + field, &v, sizeof(v));
        }
        return bytes;
      }
      case 4:
        kind = "inserted bytes";
        return bytes.insert(Below(bytes.size() + 1), RandomBytes(1 + Below(16)));
      case 5: {
        kind = "frame of a random type and payload";
        std::string header = EncodeFrame(FrameType::kHello).substr(0, 6);
        uint16_t type = static_cast<uint16_t>(Below(9));
        std::string payload = RandomBytes(Below(40));
        uint32_t len = static_cast<uint32_t>(payload.size());
        header.append(reinterpret_cast<const char*>(&type), 2);
        header.append(reinterpret_cast<const char*>(&len), 4);
        return EncodeFrame(FrameType::kHello, absl::StrCat(::getpid())) + header + payload;
      }
      default:
        kind = "valid";
        return bytes;
    }
  }

 private:
  std::string base_;
  std::mt19937_64 rng_;
  uint64_t counter_ = 0;
};

// Sends `bytes` in random pieces, half-closes, and checks every answer up to
// the daemon's hang-up. Returns what was wrong, or "".
std::string Converse(const std::string& socket, const std::string& bytes, std::mt19937_64& rng) {
  absl::StatusOr<UniqueFd> fd = ConnectTo(socket);
  if (!fd.ok()) return std::string(fd.status().message());
  for (size_t at = 0; at < bytes.size();) {
    size_t n = std::min<size_t>(bytes.size() - at, 1 + rng() % 64);
    // The daemon may hang up early (after kError): later pieces then fail.
    if (!SendBytes(*fd, bytes.substr(at, n)).ok()) break;
    at += n;
  }
  ::shutdown(fd->get(), SHUT_WR);
  FrameReader reader;
  bool refused = false;
  while (true) {
    absl::StatusOr<Frame> f = ReadFrame(fd->get(), reader, absl::Now() + absl::Seconds(5));
    if (absl::IsUnavailable(f.status())) return "";  // hung up, as it should
    if (!f.ok()) return absl::StrCat("bad answer: ", f.status().message());
    if (refused) return "an answer after kError";
    if (f->type == FrameType::kError) {
      refused = true;
      if (f->payload.empty()) return "a kError without a reason";
    } else if (f->type != FrameType::kAck || !f->payload.empty()) {
      return absl::StrCat("unexpected frame type ", static_cast<int>(f->type));
    }
  }
}

TEST(ServerFuzzTest, RandomMutationsGetErrorsAndTheDaemonKeepsServing) {
  const std::string base = MakeTempDir();
  ASSERT_FALSE(base.empty());
  absl::StatusOr<Daemon> daemon =
      StartDaemon(base + "/ember-shm-fuzz", {.grace_ms = 300, .quiet = true});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  // A client held open for the whole run, so the daemon never goes idle.
  absl::StatusOr<UniqueFd> keeper = HelloFrom(daemon->socket);
  ASSERT_TRUE(keeper.ok()) << keeper.status();
  const int fds_before = OpenFdsOf(daemon->pid);
  const int64_t rss_before = ResidentKib(daemon->pid);

  Fuzzer fuzzer(base);
  std::mt19937_64 pieces(kSeed + 1);
  for (int i = 0; i < kIterations; ++i) {
    std::string kind;
    const std::string bytes = fuzzer.Next(kind);
    const std::string wrong = Converse(daemon->socket, bytes, pieces);
    ASSERT_EQ(wrong, "") << "iteration " << i << " (" << kind << ", " << bytes.size() << " bytes)";
    ASSERT_EQ(::kill(daemon->pid, 0), 0)
        << "the daemon died at iteration " << i << " (" << kind << ")";
  }

  // Every connection closed: the daemon holds what it held before.
  EXPECT_TRUE(WaitUntil([&] { return OpenFdsOf(daemon->pid) <= fds_before; }, absl::Seconds(5)))
      << OpenFdsOf(daemon->pid) << " descriptors open, " << fds_before << " before";
  EXPECT_LT(ResidentKib(daemon->pid), rss_before + 8192);
  // A normal client is served.
  {
    absl::StatusOr<UniqueFd> client = HelloFrom(daemon->socket);
    ASSERT_TRUE(client.ok()) << client.status();
    const std::string name = TestRegionName(base, 1u << 30);
    ASSERT_TRUE(RegisterAndCreate(*client, name).ok());
    EXPECT_TRUE(RegionExists(name));
  }  // dies without kGoodbye: its region is unlinked
  EXPECT_TRUE(WaitUntil([&] { return DirEntries("/dev/shm", TestRegionPrefix(base)).empty(); },
                        absl::Seconds(5)));
  keeper->reset();
  EXPECT_TRUE(WaitUntil([&] { return DirEntries(base).empty(); }, absl::Seconds(10)));
  EXPECT_EQ(::rmdir(base.c_str()), 0);
}

}  // namespace
}  // namespace ember::shm_manager::testing
