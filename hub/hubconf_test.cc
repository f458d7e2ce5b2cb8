// hubconf.textproto parsing and validation, and hubconf.py read statically.
#include "hub/hubconf.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hub/hubconf_py.h"

namespace ember::hub {
namespace {

using ::testing::HasSubstr;

// The entry point `name` of `conf`, or null when get_entry_point finds none.
const EntryPoint* Entry(const HubConf& conf, absl::string_view name) {
  absl::StatusOr<const EntryPoint*> e = get_entry_point(conf, name, "test");
  return e.ok() ? *e : nullptr;
}

constexpr char kGood[] = R"pb(
  dependencies: "mlp"
  entry_points {
    name: "tiny_mlp"
    doc: "A two-layer perceptron."
    builder: "mlp"
    kwargs {
      key: "hidden"
      value { int_value: 8 }
    }
    weights { file: "weights/tiny_mlp.safetensors" sha256: "0123abcd" }
  }
  entry_points { name: "fresh" builder: "mlp" }
)pb";

TEST(HubConfTest, ParsesEntryPoints) {
  absl::StatusOr<HubConf> conf = parse_hubconf(kGood, "x/hubconf.textproto");
  ASSERT_TRUE(conf.ok()) << conf.status();
  ASSERT_EQ(conf->entry_points_size(), 2);
  const EntryPoint* e = Entry(*conf, "tiny_mlp");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->doc(), "A two-layer perceptron.");
  EXPECT_EQ(e->kwargs().at("hidden").int_value(), 8);
  EXPECT_EQ(e->weights().file(), "weights/tiny_mlp.safetensors");
  absl::StatusOr<const EntryPoint*> missing = get_entry_point(*conf, "nope", "alice/models");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(missing.status().message(),
            "cannot find callable nope in hubconf of alice/models (entry points: tiny_mlp, fresh)");
}

TEST(HubConfTest, SyntaxErrorNamesSourceAndLine) {
  absl::StatusOr<HubConf> conf = parse_hubconf("entry_points {\n name: 3 }", "r/hubconf.textproto");
  ASSERT_FALSE(conf.ok());
  EXPECT_EQ(conf.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(conf.status().message(), HasSubstr("r/hubconf.textproto"));
  EXPECT_THAT(conf.status().message(), HasSubstr("line 2"));
}

TEST(HubConfTest, UnknownFieldIsAnError) {
  absl::StatusOr<HubConf> conf = parse_hubconf("entrypoints { name: \"a\" }", "f");
  ASSERT_FALSE(conf.ok());
  EXPECT_THAT(conf.status().message(), HasSubstr("entrypoints"));
}

TEST(HubConfTest, RejectsInconsistentEntries) {
  auto error = [](const char* text) {
    return std::string(parse_hubconf(text, "f").status().message());
  };
  EXPECT_THAT(error("entry_points { name: \"a\" builder: \"mlp\" } "
                    "entry_points { name: \"a\" builder: \"mlp\" }"),
              HasSubstr("'a' is defined twice"));
  EXPECT_THAT(error("entry_points { name: \"a\" }"), HasSubstr("names no builder"));
  EXPECT_THAT(error("entry_points { name: \"a\" builder: \"b\" weights { url: "
                    "\"https://x/w.pt\" } }"),
              HasSubstr("has no sha256"));
  EXPECT_THAT(error("entry_points { name: \"a\" builder: \"b\" weights { file: "
                    "\"w\" url: \"u\" sha256: \"00112233\" } }"),
              HasSubstr("exactly one"));
  EXPECT_THAT(error("entry_points { name: \"a\" builder: \"b\" weights { file: "
                    "\"../w\" } }"),
              HasSubstr("relative path inside"));
  EXPECT_THAT(error("entry_points { name: \"a\" builder: \"b\" weights { file: "
                    "\"w\" sha256: \"xyz12345\" } }"),
              HasSubstr("not 8 to 64 hex digits"));
  EXPECT_THAT(error("entry_points { name: \"a\" builder: \"b\" kwargs { key: "
                    "\"pretrained\" value { bool_value: true } } }"),
              HasSubstr("`pretrained`"));
}

TEST(HubConfTest, MissingDependenciesAreListed) {
  absl::StatusOr<HubConf> conf =
      parse_hubconf("dependencies: \"mlp\" dependencies: \"vit\" dependencies: \"bert\"", "f");
  ASSERT_TRUE(conf.ok()) << conf.status();
  EXPECT_TRUE(check_dependencies(*conf, {"mlp", "vit", "bert"}).ok());
  absl::Status s = check_dependencies(*conf, {"mlp", "resnet18"});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("missing dependencies: vit, bert"));
  EXPECT_THAT(s.message(), HasSubstr("mlp, resnet18"));
}

}  // namespace
}  // namespace ember::hub

namespace ember::hub {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(HubConfNamesTest, EntryPointNamesAreIdentifiers) {
  for (const char* bad :
       {"../evil", "two\\nlines", "esc\\x1b[31m", "9lives", "class", "a-b", "caf\\xc3\\xa9"}) {
    SCOPED_TRACE(bad);
    absl::StatusOr<HubConf> conf =
        parse_hubconf(absl::StrCat("entry_points { name: \"", bad, "\" builder: \"mlp\" }"),
                      "r/hubconf.textproto");
    EXPECT_EQ(conf.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(conf.status().message(), HasSubstr("is not an identifier"));
    EXPECT_THAT(conf.status().message(), Not(HasSubstr("\x1b")));
    EXPECT_THAT(conf.status().message(), Not(HasSubstr("\n")));
  }
  EXPECT_TRUE(check_entry_point_name("_private2", "x").ok());
}

TEST(HubConfNamesTest, PositionalParametersAreDistinctIdentifiers) {
  absl::StatusOr<HubConf> conf = parse_hubconf(
      "entry_points { name: \"m\" builder: \"mlp\" positional: \"pretrained\" "
      "positional: \"hidden\" }",
      "r/hubconf.textproto");
  ASSERT_TRUE(conf.ok()) << conf.status();
  EXPECT_THAT(conf->entry_points(0).positional(), ElementsAre("pretrained", "hidden"));
  conf = parse_hubconf("entry_points { name: \"m\" builder: \"mlp\" positional: \"a b\" }",
                       "r/hubconf.textproto");
  EXPECT_EQ(conf.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(conf.status().message(),
              HasSubstr("r/hubconf.textproto: entry point 'm': positional parameter 'a b' is not "
                        "an identifier"));
  conf = parse_hubconf(
      "entry_points { name: \"m\" builder: \"mlp\" positional: \"depth\" positional: "
      "\"depth\" }",
      "r/hubconf.textproto");
  EXPECT_EQ(conf.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(conf.status().message(), HasSubstr("lists positional parameter 'depth' twice"));
}

TEST(HubConfNamesTest, WeightUrlsMustBeHttps) {
  for (const char* url :
       {"file:///etc/passwd", "ftp://example.org/w.pt", "weights.pt", "javascript:alert(1)"}) {
    SCOPED_TRACE(url);
    absl::StatusOr<HubConf> conf =
        parse_hubconf(absl::StrCat("entry_points { name: \"m\" builder: \"mlp\" weights { url: \"",
                                   url, "\" sha256: \"0123abcd\" } }"),
                      "r/hubconf.textproto");
    EXPECT_EQ(conf.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(conf.status().message(), HasSubstr("is not an https:// URL"));
  }
  // https always; http passes parsing (Load allows it only from the host of
  // a plain-http base URL the caller set).
  for (const char* url : {"https://example.org/w-0123abcd.pt", "HTTP://127.0.0.1:8/w.pt"}) {
    EXPECT_TRUE(parse_hubconf(absl::StrCat("entry_points { name: \"m\" builder: \"mlp\" weights { "
                                           "url: \"",
                                           url, "\" sha256: \"0123abcd\" } }"),
                              "r/hubconf.textproto")
                    .ok())
        << url;
  }
  EXPECT_EQ(url_origin("HTTPS://Example.org:8443/a/b?c"), "https://example.org:8443");
  EXPECT_EQ(url_origin("no-scheme"), "");
}

TEST(HubConfPyTest, ReadsAVisionRepositoryWithoutRunningIt) {
  const std::string path = "hub/testdata/hubconf_vision/hubconf.py";
  absl::StatusOr<HubConf> conf = parse_hubconf_py(ReadText(path), path);
  ASSERT_TRUE(conf.ok()) << conf.status();
  std::vector<std::string> names;
  for (const EntryPoint& e : conf->entry_points()) {
    names.push_back(e.name());
    EXPECT_TRUE(e.python());
    EXPECT_EQ(e.builder(), e.name());
  }
  // Sorted, as torch.hub.list; names from `from m import` (under their
  // alias), but no `import m`, private helpers or imports, nested defs,
  // methods or defs inside strings.
  EXPECT_THAT(names,
              ElementsAre("ResNet", "deeplab", "entry_with_r_string", "load_state_dict_from_url",
                          "load_weights", "mlp", "mobilenet_v2", "resnet18", "small_cnn"));
  // What positional arguments bind to: the parameters before *, *args, **.
  auto positional = [&](const char* name) {
    const EntryPoint* e = Entry(*conf, name);
    return std::vector<std::string>(e->positional().begin(), e->positional().end());
  };
  EXPECT_THAT(positional("resnet18"), ElementsAre("pretrained", "progress"));
  EXPECT_THAT(positional("mobilenet_v2"), ElementsAre("pretrained", "progress"));
  EXPECT_THAT(positional("small_cnn"), ElementsAre("pretrained"));
  EXPECT_THAT(positional("mlp"), ElementsAre("in_features"));
  EXPECT_THAT(positional("entry_with_r_string"), ::testing::IsEmpty());
  EXPECT_THAT(positional("deeplab"), ::testing::IsEmpty());  // imported: unknown
  EXPECT_EQ(Entry(*conf, "deeplab")->doc(), "");
  EXPECT_THAT(conf->python_dependencies(), ElementsAre("torch", "torchvision"));
  EXPECT_EQ(Entry(*conf, "resnet18")->doc(),
            "ResNet-18 model from\n"
            "`\"Deep Residual Learning for Image Recognition\" "
            "<https://arxiv.org/pdf/1512.03385.pdf>`_\n"
            "\n"
            "Args:\n"
            "    pretrained (bool): If True, returns a model pre-trained on ImageNet\n"
            "    progress (bool): If True, displays a progress bar of the download to stderr");
  EXPECT_EQ(Entry(*conf, "mobilenet_v2")->doc(),
            "MobileNetV2: \"Inverted Residuals and Linear Bottlenecks\".\n"
            "\n"
            "Triple-single-quoted, with a 'quoted' word and a tab        escape.\n"
            "    Indented more: kept relative.");
  EXPECT_EQ(Entry(*conf, "small_cnn")->doc(),
            "A decorated def with its docstring on the same line.");
  EXPECT_EQ(Entry(*conf, "mlp")->doc(), "");
  EXPECT_EQ(Entry(*conf, "entry_with_r_string")->doc(), "Raw: \\d+ stays as written.");
}

// Python's ast on the same file: top-level defs and `from m import` names
// not starting with '_', in statement order (a later binding wins), each
// "name\0doc\0positional parameters joined by ','\0", sorted by name.
std::string EntriesByPython(const std::string& path) {
  const std::string out = std::string(std::getenv("TEST_TMPDIR")) + "/py_entries";
  const std::string cmd =
      "/usr/bin/python3 -c \"import ast, inspect, sys\n"
      "tree = ast.parse(open(sys.argv[1], encoding='utf-8').read())\n"
      "defs = {}\n"
      "for n in tree.body:\n"
      "  if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):\n"
      "    params = [a.arg for a in n.args.posonlyargs + n.args.args]\n"
      "    defs[n.name] = (inspect.cleandoc(ast.get_docstring(n, clean=False) or ''), params)\n"
      "  elif isinstance(n, ast.ImportFrom) and n.module != '__future__':\n"
      "    for a in n.names:\n"
      "      if a.name != '*': defs[a.asname or a.name] = ('', [])\n"
      "open(sys.argv[2], 'w').write(''.join(k + chr(0) + defs[k][0] + chr(0) + "
      "','.join(defs[k][1]) + chr(0) for k in sorted(defs) if not k.startswith('_')))\" " +
      path + " " + out;
  if (std::system(cmd.c_str()) != 0) return "";
  return ReadText(out);
}

std::string EntriesByEmber(const HubConf& conf) {
  std::string ours;
  for (const EntryPoint& e : conf.entry_points()) {
    ours += e.name() + '\0' + e.doc() + '\0' + absl::StrJoin(e.positional(), ",") + '\0';
  }
  return ours;
}

TEST(HubConfPyTest, AgreesWithPythonsOwnParser) {
  const std::string path = "hub/testdata/hubconf_vision/hubconf.py";
  const std::string python = EntriesByPython(path);
  if (python.empty()) GTEST_SKIP() << "/usr/bin/python3 is not available";
  absl::StatusOr<HubConf> conf = parse_hubconf_py(ReadText(path), path);
  ASSERT_TRUE(conf.ok()) << conf.status();
  EXPECT_EQ(EntriesByEmber(*conf), python);
}

// Signatures and imports in the shapes Python allows, checked against ast.
TEST(HubConfPyTest, SignaturesAndImportsAgreeWithPython) {
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/signatures.py";
  std::ofstream(path) << R"py(from __future__ import annotations
from typing import (Optional,
                    Any as _Any)
from .models import a_model as renamed, b_model
from . import sibling
import os.path as osp, json
def posonly(a, b=2, /, c: "int" = (1, 2), *, d=3, **kw): pass
def star_args(x, *args, y=[1, {"k": (2, 3)}]): pass
def bare_star(*, only_kw=None): pass
def defaults_with_commas(s=",", t={"a": 1, "b": (2, 3)}, u=f(1, 2)) -> dict: pass
async def coroutine(first,
                    second: Optional[int] = None,
                    ): "Async."
def b_model(pretrained=False): "Redefined after its import: the def wins."
from .again import coroutine
)py";
  const std::string python = EntriesByPython(path);
  if (python.empty()) GTEST_SKIP() << "/usr/bin/python3 is not available";
  absl::StatusOr<HubConf> conf = parse_hubconf_py(ReadText(path), path);
  ASSERT_TRUE(conf.ok()) << conf.status();
  EXPECT_EQ(EntriesByEmber(*conf), python);
  // And what Python says, written out, so that a broken Python check
  // cannot pass an empty agreement.
  const EntryPoint* e = Entry(*conf, "posonly");
  ASSERT_NE(e, nullptr);
  EXPECT_THAT(e->positional(), ElementsAre("a", "b", "c"));
  EXPECT_THAT(Entry(*conf, "defaults_with_commas")->positional(), ElementsAre("s", "t", "u"));
  EXPECT_EQ(Entry(*conf, "b_model")->doc(), "Redefined after its import: the def wins.");
  EXPECT_EQ(Entry(*conf, "coroutine")->doc(), "");  // re-imported last
  EXPECT_EQ(get_entry_point(*conf, "annotations", "test").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(get_entry_point(*conf, "osp", "test").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(get_entry_point(*conf, "renamed", "test").ok());
  EXPECT_TRUE(get_entry_point(*conf, "sibling", "test").ok());
}

TEST(HubConfPyTest, TextprotoWinsWhenBothExist) {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/both";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/hubconf.py") << "def from_python():\n    'py'\n";
  absl::StatusOr<HubConf> conf = read_hubconf(dir);
  ASSERT_TRUE(conf.ok()) << conf.status();
  EXPECT_EQ(conf->entry_points(0).name(), "from_python");
  std::ofstream(dir + "/hubconf.textproto")
      << "entry_points { name: \"from_proto\" builder: \"mlp\" }";
  conf = read_hubconf(dir);
  ASSERT_TRUE(conf.ok()) << conf.status();
  EXPECT_EQ(conf->entry_points(0).name(), "from_proto");
  EXPECT_EQ(read_hubconf(dir + "/missing").status().code(), absl::StatusCode::kNotFound);
}

TEST(HubConfPyTest, BrokenSourcesAreErrorsNamingTheLine) {
  absl::StatusOr<HubConf> conf = parse_hubconf_py("x = 1\ndef f():\n    '''never ends\n", "h.py");
  EXPECT_EQ(conf.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(conf.status().message(), HasSubstr("h.py:3: a string starting here never ends"));
  conf = parse_hubconf_py("deps = [\n 'a',\n", "h.py");
  EXPECT_THAT(conf.status().message(), HasSubstr("h.py:1: a bracket opened here is never closed"));
  conf = parse_hubconf_py("def caf\xc3\xa9():\n  pass\n", "h.py");
  EXPECT_THAT(conf.status().message(), HasSubstr("h.py:1: entry point name 'caf\xc3\xa9'"));
  // Not Python at all: nothing to list, no crash.
  conf = parse_hubconf_py(std::string("\0\xff\x01", 3), "h.py");
  ASSERT_TRUE(conf.ok());
  EXPECT_EQ(conf->entry_points_size(), 0);
}

}  // namespace
}  // namespace ember::hub
