#include "serialization/pickle_value.h"

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/testing/peers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/factories.h"

namespace ember::serialization {
namespace {

using ::testing::HasSubstr;

constexpr char kCheck[] = "serialization/testdata/pickle_value_check.py";

using L = PickleValue::Items;
using P = PickleValue::Pairs;

std::string Bytes(std::initializer_list<int> b) {
  std::string s;
  for (int c : b) s.push_back(static_cast<char>(c));
  return s;
}

std::string Pickled(const PickleValue& v) {
  absl::StatusOr<std::string> s = pickle_value(v);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : "";
}

PickleValue Unpickled(const std::string& bytes) {
  absl::StatusOr<PickleValue> v = unpickle_value(bytes);
  EXPECT_TRUE(v.ok()) << v.status();
  return v.ok() ? *v : PickleValue();
}

// pickle.dumps(value) in Python 3.11 (protocol 4), as literal fixtures.
struct Fixture {
  const char* name;
  PickleValue value;
  std::string bytes;
};

std::vector<Fixture> Fixtures() {
  return {
      {"None", PickleValue(), "\x80\x04N."},
      {"True", true, "\x80\x04\x88."},
      {"ints",
       PickleValue::List({0, 255, 256, 65535, 65536, -1, int64_t{2147483647},
                          int64_t{-2147483648LL}, int64_t{2147483648LL}, int64_t{-2147483649LL},
                          int64_t{INT64_MAX}, int64_t{INT64_MIN}}),
       Bytes({0x80, 0x04, 0x95, 0x45, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x5d, 0x94, 0x28,
              0x4b, 0x00, 0x4b, 0xff, 0x4d, 0x00, 0x01, 0x4d, 0xff, 0xff, 0x4a, 0x00, 0x00, 0x01,
              0x00, 0x4a, 0xff, 0xff, 0xff, 0xff, 0x4a, 0xff, 0xff, 0xff, 0x7f, 0x4a, 0x00, 0x00,
              0x00, 0x80, 0x8a, 0x05, 0x00, 0x00, 0x00, 0x80, 0x00, 0x8a, 0x05, 0xff, 0xff, 0xff,
              0x7f, 0xff, 0x8a, 0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 0x8a, 0x08,
              0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x80, 0x65, 0x2e})},
      {"float", -2.5, Bytes({0x80, 0x04, 0x95, 0x0a, 0, 0, 0, 0, 0, 0,   0,
                             0x47, 0xc0, 0x04, 0,    0, 0, 0, 0, 0, 0x2e})},
      {"str", "h\xc3\xa9llo", Bytes({0x80, 0x04, 0x95, 0x0a, 0,    0,    0,    0,    0,    0,   0,
                                     0x8c, 0x06, 0x68, 0xc3, 0xa9, 0x6c, 0x6c, 0x6f, 0x94, 0x2e})},
      {"bytes", PickleValue::Bytes(Bytes({0x00, 0xff, 'a', 'b'})),
       Bytes({0x80, 0x04, 0x95, 0x08, 0, 0, 0, 0, 0, 0, 0, 0x43, 0x04, 0x00, 0xff, 0x61, 0x62, 0x94,
              0x2e})},
      {"empty bytes", PickleValue::Bytes(""),
       Bytes({0x80, 0x04, 0x95, 0x04, 0, 0, 0, 0, 0, 0, 0, 0x43, 0x00, 0x94, 0x2e})},
      // {"a": [1, 2.0, None], "b": (True, "x"), 3: {}, "t": (), "l": [], "t4": (1, 2, 3, 4)}
      {"nested",
       PickleValue::Dict({{"a", PickleValue::List({1, 2.0, nullptr})},
                          {"b", PickleValue::Tuple({true, "x"})},
                          {3, PickleValue::Dict({})},
                          {"t", PickleValue::Tuple({})},
                          {"l", PickleValue::List({})},
                          {"t4", PickleValue::Tuple({1, 2, 3, 4})}}),
       Bytes({0x80, 0x04, 0x95, 0x43, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x7d, 0x94,
              0x28, 0x8c, 0x01, 0x61, 0x94, 0x5d, 0x94, 0x28, 0x4b, 0x01, 0x47, 0x40, 0x00,
              0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x4e, 0x65, 0x8c, 0x01, 0x62, 0x94, 0x88,
              0x8c, 0x01, 0x78, 0x94, 0x86, 0x94, 0x4b, 0x03, 0x7d, 0x94, 0x8c, 0x01, 0x74,
              0x94, 0x29, 0x8c, 0x01, 0x6c, 0x94, 0x5d, 0x94, 0x8c, 0x02, 0x74, 0x34, 0x94,
              0x28, 0x4b, 0x01, 0x4b, 0x02, 0x4b, 0x03, 0x4b, 0x04, 0x74, 0x94, 0x75, 0x2e})},
      {"one item", PickleValue::List({7}),
       Bytes({0x80, 0x04, 0x95, 0x06, 0, 0, 0, 0, 0, 0, 0, 0x5d, 0x94, 0x4b, 0x07, 0x61, 0x2e})},
      {"one pair", PickleValue::Dict({{"k", "v"}}),
       Bytes({0x80, 0x04, 0x95, 0x0c, 0,    0,    0,    0,    0,    0,    0,   0x7d,
              0x94, 0x8c, 0x01, 0x6b, 0x94, 0x8c, 0x01, 0x76, 0x94, 0x73, 0x2e})},
  };
}

TEST(PickleValueTest, WritesTheBytesPythonWrites) {
  for (const Fixture& f : Fixtures()) {
    EXPECT_EQ(Pickled(f.value), f.bytes) << f.name;
  }
}

TEST(PickleValueTest, ReadsTheBytesPythonWrote) {
  for (const Fixture& f : Fixtures()) {
    EXPECT_EQ(Unpickled(f.bytes), f.value) << f.name << ": " << Unpickled(f.bytes).DebugString();
  }
}

TEST(PickleValueTest, ReadsMemoReferencesToListsThatGrewAfterBeingStored) {
  // x = [1, 2]; pickle.dumps([x, x]): the second x is a BINGET of the first,
  // which was memoized while still empty.
  const std::string bytes =
      Bytes({0x80, 0x04, 0x95, 0x0e, 0,    0,    0,    0,    0,    0,    0,    0x5d, 0x94,
             0x28, 0x5d, 0x94, 0x28, 0x4b, 0x01, 0x4b, 0x02, 0x65, 0x68, 0x01, 0x65, 0x2e});
  const PickleValue x = PickleValue::List({1, 2});
  EXPECT_EQ(Unpickled(bytes), PickleValue::List({x, x}));
}

TEST(PickleValueTest, RoundTripsEveryKind) {
  const PickleValue v = PickleValue::Dict(
      {{"none", nullptr},
       {"flags", PickleValue::List({true, false})},
       {-7, int64_t{1} << 40},
       {"pi", 3.25},
       {"s", std::string(300, 'q')},
       {"b", PickleValue::Bytes(std::string(70000, '\0'))},
       {"deep", PickleValue::List({PickleValue::Tuple({PickleValue::Dict({{"x", 1}})})})},
       {"t", ember::arange(6, kFloat32).reshape({2, 3})}});
  for (int protocol : {3, 4, 5}) {
    absl::StatusOr<std::string> bytes = pickle_value(v, protocol);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    EXPECT_EQ(Unpickled(*bytes), v) << "protocol " << protocol;
  }
}

TEST(PickleValueTest, TensorsAreWrittenContiguousWithTheirValues) {
  const Tensor base = ember::arange(12, kInt64).reshape({3, 4});
  const PickleValue back = Unpickled(Pickled(base.t()));
  ASSERT_EQ(back.kind(), PickleValue::Kind::kTensor);
  const Tensor t = back.as_tensor();
  EXPECT_EQ(t.dtype(), kInt64);
  EXPECT_EQ(t.sizes(), (SizeVector{4, 3}));
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t[1][2].item<int64_t>(), 9);  // base[2][1]
}

TEST(PickleValueTest, RefusesWhatPythonCannotHold) {
  absl::StatusOr<std::string> s = pickle_value(PickleValue("\xff\xfe"));
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("not valid UTF-8"));

  s = pickle_value(PickleValue::Dict({{2.5, 1}}));
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("dict key 2.5 is a float"));

  s = pickle_value(PickleValue(Tensor()));
  EXPECT_THAT(s.status().message(), HasSubstr("undefined tensor"));

  PickleValue deep = 1;
  for (int i = 0; i < kMaxPickleValueNesting + 1; ++i) deep = PickleValue::List({deep});
  s = pickle_value(deep);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("deeper than 512"));

  s = pickle_value(1, /*protocol=*/2);
  EXPECT_THAT(s.status().message(), HasSubstr("protocol 2"));
}

absl::Status Refusal(const std::string& bytes) { return unpickle_value(bytes).status(); }
// A string literal with its NULs.
template <size_t N>
std::string Lit(const char (&s)[N]) {
  return std::string(s, N - 1);
}

TEST(PickleValueTest, RefusesUnknownGlobals) {
  // pickle.dumps of os.system's reduce: GLOBAL 'posix system' ... REDUCE.
  absl::Status s =
      Refusal(Lit("\x80\x02"
                  "cposix\nsystem\nq\x00X\x02\x00\x00\x00idq\x01\x85q\x02Rq\x03."));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("refused global 'posix.system'"));
  // STACK_GLOBAL builtins.eval.
  s =
      Refusal(Lit("\x80\x04\x8c\x08"
                  "builtins\x8c\x04"
                  "eval\x93."));
  EXPECT_THAT(std::string(s.message()), HasSubstr("refused global 'builtins.eval'"));
  // A storage class is only allowed inside a storage's bytes.
  s =
      Refusal(Lit("\x80\x02"
                  "ctorch\nFloatStorage\n."));
  EXPECT_THAT(std::string(s.message()), HasSubstr("refused global 'torch.FloatStorage'"));
  // BUILD (object state) and persistent ids outside a storage.
  s = Refusal(Lit("\x80\x02}b."));
  EXPECT_THAT(std::string(s.message()), HasSubstr("opcode 0x62"));
  s = Refusal(Lit("\x80\x02NQ."));
  EXPECT_THAT(std::string(s.message()), HasSubstr("BINPERSID"));
}

TEST(PickleValueTest, RefusesTruncatedAndMalformedInput) {
  for (const Fixture& f : Fixtures()) {
    for (size_t n = 0; n < f.bytes.size(); ++n) {
      absl::Status s = Refusal(f.bytes.substr(0, n));
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << f.name << " cut at " << n;
    }
  }
  EXPECT_THAT(std::string(Refusal(Lit("\x80\x04\x8c\x10"
                                      "abc"))
                              .message()),
              HasSubstr("runs past"));
  EXPECT_THAT(std::string(Refusal(Lit("\x80\x04h\x05.")).message()), HasSubstr("memo reference 5"));
  EXPECT_THAT(std::string(Refusal(Lit("\x80\x04"
                                      "a."))
                              .message()),
              HasSubstr("empty stack"));
  EXPECT_THAT(std::string(Refusal(Lit("\x80\x04K")).message()), HasSubstr("needs 1 more bytes"));
  EXPECT_THAT(std::string(Refusal(Lit("\x80\x04K\x01K\x02.")).message()),
              HasSubstr("2 values on the stack"));
  EXPECT_THAT(std::string(Refusal(Lit("\x80\x09N.")).message()), HasSubstr("protocol 9"));
  // An int past int64 (2**64).
  EXPECT_THAT(
      std::string(Refusal(Lit("\x80\x04\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\x01.")).message()),
      HasSubstr("does not fit int64"));
  // A dict keyed by a tuple.
  EXPECT_THAT(std::string(Refusal(Lit("\x80\x04}K\x01\x85K\x02s.")).message()),
              HasSubstr("dict key"));
}

TEST(PickleValueTest, RefusesDeepNestingWithoutRecursing) {
  // A million TUPLE1s: nested a million levels, in two megabytes.
  std::string bytes = "\x80\x04N";
  bytes += std::string(1000000, '\x85');
  bytes += ".";
  absl::Status s = Refusal(bytes);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("deeper than 512"));
  // A list appended into itself.
  s =
      Refusal(Lit("\x80\x04]\x94h\x00"
                  "a."));
  EXPECT_THAT(std::string(s.message()), HasSubstr("refers to itself"));
}

TEST(PickleValueTest, RefusesMemoBombs) {
  // Each level is [prev, prev] by memo reference: 2**40 leaves in ~300 bytes.
  std::string bytes =
      "\x80\x04N\x94"
      "0";
  for (int i = 0; i < 40; ++i) {
    bytes += "h";
    bytes.push_back(static_cast<char>(i));
    bytes += "h";
    bytes.push_back(static_cast<char>(i));
    bytes +=
        "\x86\x94"
        "0";  // TUPLE2, MEMOIZE, POP
  }
  bytes += "h";
  bytes.push_back(40);
  bytes += ".";
  absl::Status s = Refusal(bytes);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("expand the pickle"));
}

TEST(PickleValueTest, RefusesTensorsThatDoNotFitTheirStorage) {
  std::string bytes = Pickled(ember::arange(3, kFloat32));
  // The size tuple (3,) is "K\x03\x85"; claim 4 elements.
  const size_t at = bytes.find("K\x03\x85");
  ASSERT_NE(at, std::string::npos);
  bytes[at + 1] = 4;
  absl::Status s = Refusal(bytes);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("does not fit its storage of 3 elements"));
}

// --- Against Python's pickle and PyTorch ------------------------------------

std::string TempDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

void WriteFile(const std::string& path, const std::string& data) {
  std::ofstream(path, std::ios::binary) << data;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The values of pickle_value_check.py's cases().
PickleValue Case(const std::string& name) {
  if (name == "scalars") {
    return PickleValue::List({nullptr, true, false, 0, -1, 255, 256, 65535, 65536, int64_t{1} << 31,
                              -(int64_t{1} << 31) - 1, INT64_MAX, INT64_MIN, 1.5, -0.0, "",
                              "\xc3\xbcn\xc3\xaf\x63\xc3\xb6\x64\xc3\xa9", PickleValue::Bytes(""),
                              PickleValue::Bytes(Bytes({0, 0xff}))});
  }
  if (name == "nested") {
    return PickleValue::Dict(
        {{"a", PickleValue::List(
                   {1, PickleValue::List({2, PickleValue::List({3, PickleValue::List({})})})})},
         {"b", PickleValue::Tuple(
                   {nullptr, PickleValue::Tuple({"x"}), PickleValue::Tuple({1, 2, 3, 4})})},
         {7, PickleValue::Dict({{"k", PickleValue::Dict({})}})}});
  }
  if (name == "big") {
    L words, many;
    for (int i = 0; i < 30000; ++i) words.push_back(absl::StrCat("w", i));
    for (int i = 0; i < 2500; ++i) many.push_back(i);
    return PickleValue::Dict({{"words", PickleValue::List(words)},
                              {"blob", PickleValue::Bytes(std::string(3 << 20, '\x5a'))},
                              {"text", std::string(100000, 't')},
                              {"many", PickleValue::List(many)}});
  }
  return PickleValue::Dict({{"f", ember::arange(6, kFloat32).reshape({2, 3})},
                            {"i", ember::tensor(std::vector<int64_t>{-3, 4})},
                            {"scalar", ember::full({}, 2.5, kFloat64)}});
}

absl::Status RunCheck(const std::string& python, const std::vector<std::string>& args) {
  std::string command = python + " " + kCheck;
  for (const std::string& a : args) command += " " + a;
  command += " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return absl::InternalError("popen failed");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
  const int status = pclose(pipe);
  if (status != 0) return absl::InternalError(absl::StrCat(command, ": ", out));
  return absl::OkStatus();
}

std::vector<std::pair<std::string, std::string>> Pythons() {
  std::vector<std::pair<std::string, std::string>> pythons;
  if (absl::StatusOr<std::string> p = ember::testing::torch2_python(); p.ok()) {
    pythons.emplace_back("PyTorch 2.15", *p);
  }
  if (std::system("/usr/bin/python3 -c 'import torch' 2>/dev/null") == 0) {
    pythons.emplace_back("PyTorch 1.13", "/usr/bin/python3");
  }
  return pythons;
}

TEST(PickleValueTorchTest, PythonLoadsEmberPicklesAndWritesTheSameBytes) {
  const auto pythons = Pythons();
  if (pythons.empty()) GTEST_SKIP() << "neither PyTorch peer is installed";
  for (const std::string name : {"scalars", "nested", "big", "tensor"}) {
    const std::string path = absl::StrCat(TempDir(), "/", name, ".pkl");
    WriteFile(path, Pickled(Case(name)));
    for (const auto& [which, python] : pythons) {
      absl::Status s = RunCheck(python, {"load", name, path});
      EXPECT_TRUE(s.ok()) << which << ": " << s;
    }
  }
}

TEST(PickleValueTorchTest, ReadsWhatTorchPickles) {
  const auto pythons = Pythons();
  if (pythons.empty()) GTEST_SKIP() << "neither PyTorch peer is installed";
  for (const auto& [which, python] : pythons) {
    SCOPED_TRACE(which);
    ASSERT_TRUE(RunCheck(python, {"dump", TempDir()}).ok());
    PickleValue v = Unpickled(ReadFile(TempDir() + "/tensor_view.pkl"));
    // torch.arange(10, dtype=torch.int32)[2:8:2]: a strided view at offset 2.
    const Tensor view = v.at("v")->as_tensor();
    EXPECT_EQ(view.dtype(), kInt32);
    EXPECT_TRUE(view.equal(ember::tensor(std::vector<int32_t>{2, 4, 6})));

    EXPECT_EQ(Unpickled(ReadFile(TempDir() + "/ordered.pkl")),
              PickleValue::Dict({{"z", 1}, {"a", PickleValue::List({2.5, nullptr})}}));

    v = Unpickled(ReadFile(TempDir() + "/parameter.pkl"));
    EXPECT_TRUE(v.as_tensor().equal(ember::ones({2, 2}, kFloat64)));

    v = Unpickled(ReadFile(TempDir() + "/bool_tensor.pkl"));
    const Tensor b = v.items()[0].as_tensor();
    EXPECT_EQ(b.dtype(), kBool);
    EXPECT_TRUE(b.to(kInt64).equal(ember::tensor(std::vector<int64_t>{1, 0, 1})));
  }
}

}  // namespace
}  // namespace ember::serialization
