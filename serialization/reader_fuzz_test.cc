// Bounded random-mutation fuzzing of the checkpoint readers: the restricted
// unpickler, the safetensors reader and the zip reader (through
// read_torch_checkpoint). Valid fixtures are mutated (bit flips, interesting
// values, insertions, deletions, splices, truncation) and random bytes are
// fed in; every read must return an error or a state dict whose tensors can
// be read in full. The seed is fixed, so a failure reproduces; the iteration
// counts keep each case to a few seconds. Run under ASan to catch bad reads:
//   bazel test //serialization:reader_fuzz_test --copt=-fsanitize=address
//   --linkopt=-fsanitize=address
#include <cstdint>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "serialization/pickle.h"
#include "serialization/safetensors.h"
#include "serialization/torch_format.h"
#include "serialization/zip.h"

namespace ember::serialization {
namespace {

constexpr uint64_t kSeed = 20240601;

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class Mutator {
 public:
  explicit Mutator(uint64_t seed) : rng_(seed) {}

  size_t Below(size_t n) {
    return n == 0 ? 0 : std::uniform_int_distribution<size_t>(0, n - 1)(rng_);
  }
  char Byte() { return static_cast<char>(Below(256)); }

  std::string Random(size_t max_size) {
    std::string out(Below(max_size + 1), '\0');
    for (char& c : out) c = Byte();
    return out;
  }

  // `input` with one to four random edits.
  std::string Mutate(std::string s) {
    for (size_t edits = 1 + Below(4); edits > 0; --edits) {
      const size_t at = Below(s.size());
      switch (Below(7)) {
        case 0:  // flip a bit
          if (!s.empty()) s[at] ^= static_cast<char>(1 << Below(8));
          break;
        case 1: {  // an interesting byte
          static const unsigned char kBytes[] = {0, 1, 0x7f, 0x80, 0xff, '(', '.', 't', 'R'};
          if (!s.empty()) s[at] = static_cast<char>(kBytes[Below(sizeof(kBytes))]);
          break;
        }
        case 2: {  // an interesting little-endian integer
          static const uint64_t kInts[] = {
              0,         1, 0x7f, 0xff, 0x7fffffff, 0xffffffff, 0x7fffffffffffffff, ~uint64_t{0},
              1ull << 40};
          const uint64_t v = kInts[Below(sizeof(kInts) / sizeof(kInts[0]))];
          const size_t n = Below(2) ? 4 : 8;
          for (size_t k = 0; k < n && at + k < s.size(); ++k)
            s[at + k] = static_cast<char>(v >> (8 * k));
          break;
        }
        case 3:  // insert random bytes
          s.insert(at, Random(16));
          break;
        case 4:  // delete a range
          s.erase(at, Below(64) + 1);
          break;
        case 5: {  // copy a range elsewhere
          const size_t from = Below(s.size());
          const std::string piece = s.substr(from, Below(128) + 1);
          s.insert(Below(s.size() + 1), piece);
          break;
        }
        default:  // truncate
          s.resize(at);
          break;
      }
    }
    return s;
  }

 private:
  std::mt19937_64 rng_;
};

// Reads every element of every tensor (so a view that escaped its storage
// shows up under ASan) and counts the results.
struct Outcomes {
  int ok = 0;
  int errors = 0;
  void Record(const absl::StatusOr<StateDict>& sd) {
    if (!sd.ok()) {
      EXPECT_FALSE(sd.status().message().empty());
      ++errors;
      return;
    }
    for (const auto& [name, t] : *sd) {
      Tensor c = t.contiguous();
      volatile unsigned char sink = 0;
      const auto* p = static_cast<const unsigned char*>(c.raw_data());
      for (size_t i = 0; i < c.nbytes(); ++i) sink = sink ^ p[i];
    }
    ++ok;
  }
};

TEST(ReaderFuzzTest, Unpickler) {
  absl::StatusOr<ZipReader> zip =
      ZipReader::open(Slurp("serialization/testdata/tensors.pt"), "tensors.pt");
  ASSERT_TRUE(zip.ok()) << zip.status();
  absl::StatusOr<absl::string_view> pkl = zip->read("tensors/data.pkl");
  ASSERT_TRUE(pkl.ok()) << pkl.status();
  const std::string seed(*pkl);
  // Storages of whatever size the pickle asks for, up to 1 MiB.
  StorageLoader load = [](const StorageRef& ref) -> absl::StatusOr<Storage> {
    const uint64_t n = static_cast<uint64_t>(ref.numel) * element_size(ref.dtype);
    if (ref.numel > (1 << 20) || n > (1 << 20)) return absl::InvalidArgumentError("too big");
    return Storage::Allocate(n, GetCpuAllocator());
  };
  ASSERT_TRUE(unpickle_state_dict(seed, load, "seed").ok());
  Mutator m(kSeed);
  Outcomes outcomes;
  for (int i = 0; i < 20000; ++i)
    outcomes.Record(unpickle_state_dict(m.Mutate(seed), load, "fuzz"));
  // Opcode soup: random bytes drawn from the opcodes a state_dict uses.
  const std::string opcodes = "\x80()]}NtJKMXqh\x85\x86\x87\x88\x89\x8a\x94Qcrsuaeb.";
  for (int i = 0; i < 20000; ++i) {
    std::string program = "\x80\x02";
    for (size_t n = m.Below(64); n > 0; --n) {
      program += opcodes[m.Below(opcodes.size())];
      if (m.Below(2)) program += m.Random(4);
    }
    outcomes.Record(unpickle_state_dict(program, load, "soup"));
  }
  for (int i = 0; i < 5000; ++i)
    outcomes.Record(unpickle_state_dict(m.Random(256), load, "random"));
  EXPECT_GT(outcomes.errors, 0);
  std::cout << "unpickler: " << outcomes.ok << " read, " << outcomes.errors << " refused\n";
}

TEST(ReaderFuzzTest, LegacyTorchSave) {
  const std::string seed = Slurp("serialization/testdata/tensors_legacy.pt");
  ASSERT_TRUE(read_torch_checkpoint(seed, "seed").ok());
  Mutator m(kSeed + 1);
  Outcomes outcomes;
  for (int i = 0; i < 20000; ++i) outcomes.Record(read_torch_checkpoint(m.Mutate(seed), "fuzz"));
  std::cout << "legacy: " << outcomes.ok << " read, " << outcomes.errors << " refused\n";
}

TEST(ReaderFuzzTest, Safetensors) {
  const std::string seed = Slurp("serialization/testdata/tensors.safetensors");
  ASSERT_TRUE(read_safetensors(seed, "seed").ok());
  Mutator m(kSeed + 2);
  Outcomes outcomes;
  for (int i = 0; i < 20000; ++i) outcomes.Record(read_safetensors(m.Mutate(seed), "fuzz"));
  for (int i = 0; i < 5000; ++i) outcomes.Record(read_safetensors(m.Random(256), "random"));
  std::cout << "safetensors: " << outcomes.ok << " read, " << outcomes.errors << " refused\n";
}

TEST(ReaderFuzzTest, ZipCheckpoints) {
  const std::string seed = Slurp("serialization/testdata/tensors.pt");
  ASSERT_TRUE(read_torch_checkpoint(seed, "seed").ok());
  Mutator m(kSeed + 3);
  Outcomes outcomes;
  for (int i = 0; i < 5000; ++i) outcomes.Record(read_torch_checkpoint(m.Mutate(seed), "fuzz"));
  for (int i = 0; i < 2000; ++i) {
    outcomes.Record(read_torch_checkpoint("PK\x03\x04" + m.Random(512), "random"));
  }
  std::cout << "zip: " << outcomes.ok << " read, " << outcomes.errors << " refused\n";
}

}  // namespace
}  // namespace ember::serialization
