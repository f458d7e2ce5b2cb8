// Checkpoint formats against fixtures made by python3-torch
// (testdata/make_fixtures.py): reading torch.save and safetensors files,
// refusing hostile ones, and Ember -> PyTorch format -> Ember round trips
// checked by PyTorch itself (testdata/check_torch_load.py).
#include "serialization/serialization.h"

#include <sys/wait.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "serialization/safetensors.h"
#include "serialization/torch_format.h"
#include "tensor/factories.h"

namespace ember::serialization {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kTestdata[] = "serialization/testdata/";

struct Expected {
  std::string name;
  std::string dtype;
  std::vector<int64_t> sizes;
  std::vector<double> values;
};

// testdata/tensors.expected.txt, written by PyTorch.
std::vector<Expected> ReadExpected() {
  std::ifstream in(std::string(kTestdata) + "tensors.expected.txt");
  std::vector<Expected> out;
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> parts = absl::StrSplit(line, ' ');
    Expected e{parts[0], parts[1], {}, {}};
    if (parts[2] != "-") {
      for (absl::string_view s : absl::StrSplit(parts[2], ','))
        e.sizes.push_back(std::stoll(std::string(s)));
    }
    for (size_t i = 3; i < parts.size(); ++i) {
      if (!parts[i].empty()) e.values.push_back(std::stod(parts[i]));
    }
    out.push_back(e);
  }
  return out;
}

std::vector<double> Values(const Tensor& t) {
  Tensor d = t.to(kFloat64).contiguous();
  const double* p = d.numel() ? d.data_ptr<double>() : nullptr;
  return std::vector<double>(p, p + d.numel());
}

void ExpectMatchesFixture(const StateDict& sd) {
  std::vector<Expected> expected = ReadExpected();
  ASSERT_EQ(expected.size(), 13u);
  ASSERT_EQ(sd.size(), expected.size());
  for (size_t i = 0; i < sd.size(); ++i) {
    SCOPED_TRACE(expected[i].name);
    EXPECT_EQ(sd[i].first, expected[i].name);
    EXPECT_EQ(std::string(dtype_name(sd[i].second.dtype())), expected[i].dtype);
    EXPECT_EQ(std::vector<int64_t>(sd[i].second.sizes().begin(), sd[i].second.sizes().end()),
              expected[i].sizes);
    EXPECT_EQ(Values(sd[i].second), expected[i].values);
  }
}

const Tensor& Find(const StateDict& sd, const std::string& name) {
  for (const auto& [n, t] : sd) {
    if (n == name) return t;
  }
  static Tensor none;
  return none;
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string TmpPath(const std::string& name) {
  return std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
}

TEST(CheckpointTest, ReadsTorchSave) {
  absl::StatusOr<StateDict> sd = ember::load(std::string(kTestdata) + "tensors.pt");
  ASSERT_TRUE(sd.ok()) << sd.status();
  ExpectMatchesFixture(*sd);
  // Views keep their geometry and share their storage, as in PyTorch.
  const Tensor& rows = Find(*sd, "view.rows");
  const Tensor& transposed = Find(*sd, "view.transposed");
  EXPECT_EQ(rows.storage_offset(), 4);
  EXPECT_EQ(transposed.strides(), (IntArrayRef{1, 4}));
  EXPECT_TRUE(rows.storage().is_alias_of(transposed.storage()));
}

TEST(CheckpointTest, ReadsLegacyTorchSave) {
  absl::StatusOr<StateDict> sd = ember::load(std::string(kTestdata) + "tensors_legacy.pt");
  ASSERT_TRUE(sd.ok()) << sd.status();
  ExpectMatchesFixture(*sd);
  const Tensor& rows = Find(*sd, "view.rows");
  const Tensor& transposed = Find(*sd, "view.transposed");
  EXPECT_EQ(rows.storage_offset(), 4);
  EXPECT_EQ(transposed.strides(), (IntArrayRef{1, 4}));
  EXPECT_TRUE(rows.storage().is_alias_of(transposed.storage()));
}

TEST(CheckpointTest, ReadsLegacyFilesThatPyTorchWrites) {
  // The fixture's tensors saved now by the installed PyTorch, legacy format.
  const std::string path = TmpPath("legacy_now.pt");
  const std::string cmd =
      "/usr/bin/python3 -c \"import sys\n"
      "try:\n import torch\nexcept ImportError:\n sys.exit(77)\n"
      "sys.path.insert(0, 'serialization/testdata')\nimport make_fixtures\n"
      "torch.save(make_fixtures.tensors(), sys.argv[1], _use_new_zipfile_serialization=False)\" " +
      path;
  int status = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 77) GTEST_SKIP() << "python3-torch is not installed";
  ASSERT_EQ(WEXITSTATUS(status), 0);
  absl::StatusOr<StateDict> sd = ember::load(path);
  ASSERT_TRUE(sd.ok()) << sd.status();
  ExpectMatchesFixture(*sd);
}

TEST(CheckpointTest, RefusesBrokenLegacyFiles) {
  const std::string good = Slurp(std::string(kTestdata) + "tensors_legacy.pt");
  ASSERT_TRUE(read_torch_checkpoint(good, "l.pt").ok());
  // Cut anywhere: an error, never a crash.
  for (size_t n = 14; n < good.size(); n += 7) {
    absl::Status s = read_torch_checkpoint(good.substr(0, n), "l.pt").status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << n << ": " << s;
    EXPECT_THAT(s.message(), HasSubstr("truncated")) << n;
  }
  // Trailing bytes after the last storage.
  absl::Status s = read_torch_checkpoint(good + "x", "l.pt").status();
  EXPECT_THAT(s.message(), HasSubstr("1 bytes follow the last storage record"));
  // A storage record whose element count disagrees with the pickle: the
  // first record follows the key list, whose pickle ends with "e.".
  std::string bad = good;
  size_t first = bad.find("e.", bad.find("\x80\x02]")) + 2;
  ASSERT_NE(first, std::string::npos);
  bad[first] ^= 0x01;
  s = read_torch_checkpoint(bad, "l.pt").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("elements but its record says"));
  // The same restricted unpickler as the zip format.
  bad = good;
  size_t global = bad.find("ccollections\nOrderedDict\n");
  ASSERT_NE(global, std::string::npos);
  bad.replace(global, 25, "cposix\nsystem\n__________");
  s = read_torch_checkpoint(bad, "l.pt").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(s.message(), HasSubstr("global 'posix.system' is not allowed"));
}

TEST(CheckpointTest, NamesDtypesEmberLacks) {
  absl::Status s = ember::load(std::string(kTestdata) + "complex.pt").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
  EXPECT_THAT(s.message(), HasSubstr("complex64"));
  EXPECT_THAT(s.message(), HasSubstr("torch.ComplexFloatStorage"));
  EXPECT_THAT(s.message(), Not(HasSubstr("malicious")));
}

TEST(CheckpointTest, ReadsSafetensors) {
  absl::StatusOr<StateDict> sd = ember::load(std::string(kTestdata) + "tensors.safetensors");
  ASSERT_TRUE(sd.ok()) << sd.status();
  ExpectMatchesFixture(*sd);
}

// Runs check_torch_load.py on `path`; its exit status (77: no python3-torch).
int TorchLoadCheck(const std::string& path) {
  std::string cmd = "/usr/bin/python3 serialization/testdata/check_torch_load.py " + path + " " +
                    kTestdata + "tensors.expected.txt";
  int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(CheckpointTest, RoundTripThroughPyTorchFormat) {
  absl::StatusOr<StateDict> sd = ember::load(std::string(kTestdata) + "tensors.pt");
  ASSERT_TRUE(sd.ok()) << sd.status();
  std::string path = TmpPath("ember.pt");
  ASSERT_TRUE(ember::save(*sd, path).ok());
  absl::StatusOr<StateDict> back = ember::load(path);
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectMatchesFixture(*back);

  int rc = TorchLoadCheck(path);
  if (rc == 77)
    GTEST_SKIP() << "python3-torch is not installed; PyTorch's side of the "
                    "round trip is unchecked";
  EXPECT_EQ(rc, 0) << "torch.load(weights_only=True) did not read Ember's "
                      "checkpoint as expected";
}

TEST(CheckpointTest, RoundTripThroughSafetensors) {
  absl::StatusOr<StateDict> sd = ember::load(std::string(kTestdata) + "tensors.pt");
  ASSERT_TRUE(sd.ok()) << sd.status();
  std::string path = TmpPath("ember.safetensors");
  ASSERT_TRUE(ember::save(*sd, path).ok());
  absl::StatusOr<StateDict> back = ember::load(path);
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectMatchesFixture(*back);
}

absl::Status LoadFixture(const std::string& name) {
  return ember::load(std::string(kTestdata) + name).status();
}

TEST(CheckpointTest, RefusesUnknownGlobals) {
  absl::Status s = LoadFixture("evil_global.pt");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(s.message(), HasSubstr("global 'os.system' is not allowed"));
  EXPECT_THAT(s.message(), HasSubstr("evil_global.pt"));
}

TEST(CheckpointTest, RefusesReduceOnDisallowedCallable) {
  absl::Status s = LoadFixture("evil_reduce.pt");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(s.message(), HasSubstr("REDUCE on 'torch.FloatStorage' is not allowed"));
}

TEST(CheckpointTest, RefusesUnknownOpcodes) {
  absl::Status s = LoadFixture("evil_opcode.pt");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(s.message(), HasSubstr("opcode INST (0x69)"));
}

TEST(CheckpointTest, ChecksStorageSizesAndGeometry) {
  absl::Status s = LoadFixture("evil_storage_size.pt");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("storage '0' should hold 6 float32 elements (24 bytes) "
                                     "but its record has 8"));
  s = LoadFixture("evil_view.pt");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("size [2, 3], stride [3, 1] at offset 2 "
                                     "reaches past its storage of 6"));
  s = LoadFixture("evil_stride.pt");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("non-negative"));
}

TEST(CheckpointTest, RefusesTruncatedAndCorruptZips) {
  absl::Status s = LoadFixture("truncated.pt");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("truncated"));

  std::string bytes = Slurp(std::string(kTestdata) + "tensors.pt");
  size_t at = bytes.find("tensors/data/0");
  ASSERT_NE(at, std::string::npos);
  // Flip a byte of the first storage record (its data follows its local
  // header).
  size_t data = bytes.find("tensors/data/0", at) + std::string("tensors/data/0").size();
  absl::StatusOr<StateDict> sd = read_torch_checkpoint(bytes, "x.pt");
  ASSERT_TRUE(sd.ok());
  bytes[data + 70] ^= 0x5a;
  sd = read_torch_checkpoint(bytes, "x.pt");
  EXPECT_EQ(sd.status().code(), absl::StatusCode::kDataLoss) << sd.status();
  EXPECT_THAT(sd.status().message(), HasSubstr("CRC"));
}

TEST(CheckpointTest, RefusesHostileSafetensors) {
  std::string good = Slurp(std::string(kTestdata) + "tensors.safetensors");
  std::string bytes = good;
  bytes[7] = 0x7f;  // a header length far past the file
  EXPECT_THAT(read_safetensors(bytes, "a").status().message(), HasSubstr("exceeds the file"));
  bytes = good.substr(0, good.size() - 1);
  EXPECT_THAT(read_safetensors(bytes, "b").status().message(), HasSubstr("truncated"));
  // A header claiming more bytes than the shape needs.
  std::string header = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,12]}})";
  bytes = std::string(1, static_cast<char>(header.size())) + std::string(7, '\0') + header +
          std::string(12, '\0');
  EXPECT_THAT(read_safetensors(bytes, "c").status().message(),
              HasSubstr("hold 12 bytes but shape [2] of F32 needs 8"));
  header =
      R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"v":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}})";
  bytes = std::string(1, static_cast<char>(header.size())) + std::string(7, '\0') + header +
          std::string(6, '\0');
  EXPECT_THAT(read_safetensors(bytes, "d").status().message(), HasSubstr("overlap or hole"));
  header = R"({"w":{"dtype":"C64","shape":[1],"data_offsets":[0,8]}})";
  bytes = std::string(1, static_cast<char>(header.size())) + std::string(7, '\0') + header +
          std::string(8, '\0');
  EXPECT_THAT(read_safetensors(bytes, "e").status().message(), HasSubstr("dtype C64"));
  header = R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]})";
  bytes = std::string(1, static_cast<char>(header.size())) + std::string(7, '\0') + header +
          std::string(4, '\0');
  EXPECT_THAT(read_safetensors(bytes, "f").status().message(), HasSubstr("invalid JSON"));
}

// A safetensors file of `header` followed by `data_bytes` zero bytes.
std::string Safetensors(const std::string& header, size_t data_bytes) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  return out + header + std::string(data_bytes, '\0');
}

TEST(CheckpointTest, SafetensorsNamesMustBeText) {
  const std::string tensor = R"(:{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  struct Case {
    std::string name;  // as written in the JSON header
    std::string error;
  };
  const Case cases[] = {
      {"w\xff", "not valid UTF-8 (byte 11 of the file)"},
      {"w\xed\xa0\x80", "not valid UTF-8"},  // an encoded surrogate
      {"w\\u0000x", "tensor 'w\\x00x': its name holds a NUL character"},
      {"w\\ud800", "lone high surrogate"},
      {"w\\udc00", "lone low surrogate"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    absl::Status s = read_safetensors(Safetensors("{\"" + c.name + "\"" + tensor, 4), "n").status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(s.message(), HasSubstr(c.error));
  }
  // A surrogate pair is one code point, and fine.
  EXPECT_TRUE(read_safetensors(Safetensors("{\"w\\ud83d\\ude00\"" + tensor, 4), "n").ok());
}

TEST(CheckpointTest, SafetensorsDimensionsAreCapped) {
  std::string ones = "1";
  for (int i = 1; i < 100000; ++i) ones += ",1";
  absl::Status s =
      read_safetensors(
          Safetensors(R"({"w":{"dtype":"F32","shape":[)" + ones + R"(],"data_offsets":[0,4]}})", 4),
          "dims")
          .status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr("shape has 100000 dimensions; checkpoints may have at most 64"));
  ones = "1";
  for (int i = 1; i < kMaxCheckpointDims; ++i) ones += ",1";
  EXPECT_TRUE(
      read_safetensors(
          Safetensors(R"({"w":{"dtype":"F32","shape":[)" + ones + R"(],"data_offsets":[0,4]}})", 4),
          "dims")
          .ok());
}

TEST(CheckpointTest, SafetensorsDtypesEmberLacksAreUnsupported) {
  absl::Status s =
      read_safetensors(Safetensors(R"({"z":{"dtype":"C64","shape":[1],"data_offsets":[0,8]}})", 8),
                       "c.safetensors")
          .status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), HasSubstr("tensor 'z' has dtype C64, which Ember does not support"));
  s = read_safetensors(Safetensors(R"({"z":{"dtype":"Q99","shape":[1],"data_offsets":[0,8]}})", 8),
                       "c")
          .status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("dtype Q99 is not a safetensors dtype Ember knows"));
}

TEST(CheckpointTest, WritersRefuseDuplicates) {
  StateDict sd = {{"a", zeros({2})}, {"a", zeros({2})}};
  EXPECT_THAT(write_torch_checkpoint(sd).status().message(), HasSubstr("'a' appears twice"));
  EXPECT_THAT(write_safetensors(sd).status().message(), HasSubstr("'a' appears twice"));
}

TEST(CheckpointTest, UnknownFileIsAnError) {
  std::string path = TmpPath("junk.bin");
  std::ofstream(path) << "\x80\x02legacy";
  absl::Status s = ember::load(path).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr("neither a torch.save checkpoint (zip or legacy) nor a safetensors"));
  EXPECT_EQ(ember::load(TmpPath("missing.pt")).status().code(), absl::StatusCode::kNotFound);
}

// weights_only = false would run pickled Python in PyTorch; Ember refuses it
// by name instead of reading the file as if it were true.
TEST(CheckpointTest, WeightsOnlyFalseIsRefusedAndTrueIsTheDefault) {
  const std::string path = std::string(kTestdata) + "tensors.pt";
  absl::Status s = ember::load(path, {.weights_only = false}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr(path));
  EXPECT_THAT(s.message(), HasSubstr("weights_only = false"));
  EXPECT_THAT(s.message(), HasSubstr("leave weights_only at its default, true"));
  EXPECT_TRUE(LoadOptions().weights_only);
  absl::StatusOr<StateDict> sd = ember::load(path, {.weights_only = true});
  ASSERT_TRUE(sd.ok()) << sd.status();
  EXPECT_FALSE(sd->empty());
}

}  // namespace
}  // namespace ember::serialization
