#include "hub/hubconf_py.h"

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "hub/hubconf.h"
#include "serialization/printable.h"

namespace ember::hub {

using ::ember::serialization::append_utf8;
using ::ember::serialization::parse_hex_digits;

namespace {

struct Token {
  enum Kind { kName, kString, kOp, kOther };
  Kind kind;
  std::string text;           // kName, kOp, kOther: as written; kString: its value
  bool plain_string = false;  // kString: a str literal (not bytes, not an f-string)
  int line = 0;
  size_t column = 0;
};
using LogicalLine = std::vector<Token>;

bool IsNameStart(char c) {
  return absl::ascii_isalpha(c) || c == '_' || static_cast<unsigned char>(c) >= 0x80;
}
bool IsNameChar(char c) { return IsNameStart(c) || absl::ascii_isdigit(c); }

// Splits Python source into logical lines of tokens: enough of Python's
// tokenizer to find top-level statements (strings, comments, brackets and
// backslash continuations are honoured; numbers and operators are opaque).
class Tokenizer {
 public:
  Tokenizer(absl::string_view text, absl::string_view source) : text_(text), source_(source) {
    if (text_.substr(0, 3) == "\xEF\xBB\xBF") pos_ = 3;  // a UTF-8 byte order mark
  }

  absl::StatusOr<std::vector<LogicalLine>> Run() {
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (c == '\n') {
        NewPhysicalLine();
        if (depth_ == 0) EndLogicalLine();
      } else if (c == ' ' || c == '\t' || c == '\r' || c == '\f') {
        ++pos_;
      } else if (c == '#') {
        while (pos_ < text_.size() && text_[pos_] != '\n') ++pos_;
      } else if (c == '\\' &&
                 (text_.substr(pos_ + 1, 1) == "\n" || text_.substr(pos_ + 1, 2) == "\r\n")) {
        pos_ += text_[pos_ + 1] == '\r' ? 2 : 1;
        NewPhysicalLine();  // a continuation: the logical line goes on
      } else if (c == '"' || c == '\'') {
        if (absl::Status s = String(""); !s.ok()) return s;
      } else if (IsNameStart(c)) {
        size_t start = pos_;
        while (pos_ < text_.size() && IsNameChar(text_[pos_])) ++pos_;
        std::string name(text_.substr(start, pos_ - start));
        if (pos_ < text_.size() && (text_[pos_] == '"' || text_[pos_] == '\'') && IsPrefix(name)) {
          pos_ = start;  // re-read from the prefix
          Column();
          if (absl::Status s = String(absl::AsciiStrToLower(name)); !s.ok()) return s;
        } else {
          Emit(Token::kName, std::move(name), start);
        }
      } else if (absl::ascii_isdigit(c)) {
        size_t start = pos_;
        while (pos_ < text_.size() && (IsNameChar(text_[pos_]) || text_[pos_] == '.')) ++pos_;
        Emit(Token::kOther, std::string(text_.substr(start, pos_ - start)), start);
      } else {
        if (c == '(' || c == '[' || c == '{') {
          if (depth_++ == 0) open_line_ = line_;
        } else if ((c == ')' || c == ']' || c == '}') && depth_ > 0) {
          --depth_;
        }
        Emit(Token::kOp, std::string(1, c), pos_);
        ++pos_;
      }
    }
    if (depth_ > 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          source_, ":", open_line_, ": a bracket opened here is never closed; is this Python?"));
    }
    EndLogicalLine();
    return std::move(lines_);
  }

 private:
  static bool IsPrefix(absl::string_view name) {
    const std::string p = absl::AsciiStrToLower(name);
    return p == "r" || p == "u" || p == "b" || p == "f" || p == "br" || p == "rb" || p == "fr" ||
           p == "rf";
  }
  void NewPhysicalLine() {
    ++pos_;
    ++line_;
    line_start_ = pos_;
  }
  size_t Column() const { return pos_ - line_start_; }
  void Emit(Token::Kind kind, std::string text, size_t at) {
    current_.push_back(Token{kind, std::move(text), false, line_, at - line_start_});
  }
  void EndLogicalLine() {
    if (!current_.empty()) lines_.push_back(std::move(current_));
    current_.clear();
  }

  // A string literal at pos_ (after its `prefix`, lower-cased).
  absl::Status String(const std::string& prefix) {
    const int start_line = line_;
    const size_t column = pos_ - line_start_;
    pos_ += prefix.size();
    const char quote = text_[pos_];
    const bool triple = text_.substr(pos_, 3) == std::string(3, quote);
    pos_ += triple ? 3 : 1;
    const bool raw = prefix.find('r') != std::string::npos;
    const bool decode =
        !raw && prefix.find('b') == std::string::npos && prefix.find('f') == std::string::npos;
    std::string value;
    while (true) {
      if (pos_ >= text_.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat(source_, ":", start_line, ": a string starting here never ends"));
      }
      const char c = text_[pos_];
      if (c == quote && (!triple || text_.substr(pos_, 3) == std::string(3, quote))) {
        pos_ += triple ? 3 : 1;
        break;
      }
      if (c == '\n') {
        if (!triple) {
          return absl::InvalidArgumentError(absl::StrCat(
              source_, ":", start_line, ": a string starting here ends at the end of the line"));
        }
        value.push_back('\n');
        NewPhysicalLine();
        continue;
      }
      if (c != '\\' || pos_ + 1 >= text_.size()) {
        value.push_back(c);
        ++pos_;
        continue;
      }
      const char e = text_[pos_ + 1];
      if (e == '\n') {  // backslash-newline: the string goes on, without both
        if (!decode) value += "\\\n";
        ++pos_;
        NewPhysicalLine();
        continue;
      }
      pos_ += 2;
      if (!decode) {
        value.push_back('\\');
        value.push_back(e);
        continue;
      }
      Escape(e, &value);
    }
    Token t{Token::kString, std::move(value),
            prefix.find('b') == std::string::npos && prefix.find('f') == std::string::npos,
            start_line, column};
    current_.push_back(std::move(t));
    return absl::OkStatus();
  }

  // Appends what the escape "\<e>..." stands for (pos_ is past `e`).
  void Escape(char e, std::string* out) {
    auto hex = [&](size_t digits) -> std::optional<uint32_t> {
      if (text_.size() - pos_ < digits) return std::nullopt;
      std::optional<uint32_t> v = parse_hex_digits(text_.substr(pos_, digits));
      if (v) pos_ += digits;
      return v;
    };
    switch (e) {
      case '\\':
      case '\'':
      case '"':
        out->push_back(e);
        return;
      case 'n':
        out->push_back('\n');
        return;
      case 't':
        out->push_back('\t');
        return;
      case 'r':
        out->push_back('\r');
        return;
      case 'a':
        out->push_back('\a');
        return;
      case 'b':
        out->push_back('\b');
        return;
      case 'f':
        out->push_back('\f');
        return;
      case 'v':
        out->push_back('\v');
        return;
      case 'x':
      case 'u':
      case 'U': {
        const size_t start = pos_;
        if (std::optional<uint32_t> cp = hex(e == 'x'   ? 2
                                             : e == 'u' ? 4
                                                        : 8);
            cp && *cp <= 0x10FFFF) {
          append_utf8(out, *cp);
          return;
        }
        pos_ = start;
        break;
      }
      default:
        if (e >= '0' && e <= '7') {  // up to three octal digits
          uint32_t v = e - '0';
          for (int k = 0; k < 2 && pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '7';
               ++k) {
            v = v * 8 + (text_[pos_++] - '0');
          }
          append_utf8(out, v);
          return;
        }
        break;
    }
    out->push_back('\\');  // not an escape Python knows (or \N{...}): kept
    out->push_back(e);
  }

  absl::string_view text_;
  std::string source_;
  size_t pos_ = 0;
  int line_ = 1;
  size_t line_start_ = 0;
  int depth_ = 0;
  int open_line_ = 0;
  LogicalLine current_;
  std::vector<LogicalLine> lines_;
};

bool IsOp(const Token& t, char c) {
  return t.kind == Token::kOp && t.text.size() == 1 && t.text[0] == c;
}
bool IsName(const Token& t, absl::string_view name) {
  return t.kind == Token::kName && t.text == name;
}

// The docstring a statement starting at `from` in `line` is, if it is one:
// string literals alone (adjacent ones concatenate), then the end of the
// line or ';'.
std::optional<std::string> Docstring(const LogicalLine& line, size_t from) {
  std::string doc;
  size_t k = from;
  for (; k < line.size() && line[k].kind == Token::kString; ++k) {
    if (!line[k].plain_string) return std::nullopt;
    doc += line[k].text;
  }
  if (k == from || (k < line.size() && !IsOp(line[k], ';'))) return std::nullopt;
  return doc;
}

// inspect.cleandoc: tabs expanded, the first line's leading blanks and the
// other lines' common indentation removed, blank lines at either end dropped.
std::string CleanDoc(absl::string_view doc) {
  std::vector<std::string> lines;
  for (absl::string_view l : absl::StrSplit(doc, '\n')) {
    std::string expanded;
    for (char c : l) {
      if (c == '\t') {
        expanded.append(8 - expanded.size() % 8, ' ');
      } else {
        expanded.push_back(c);
      }
    }
    lines.push_back(std::move(expanded));
  }
  size_t margin = std::string::npos;
  for (size_t i = 1; i < lines.size(); ++i) {
    const size_t indent = lines[i].find_first_not_of(' ');
    if (indent != std::string::npos) margin = std::min(margin, indent);
  }
  lines[0].erase(0, std::min(lines[0].find_first_not_of(' '), lines[0].size()));
  for (size_t i = 1; i < lines.size() && margin != std::string::npos; ++i) {
    lines[i].erase(0, std::min(margin, lines[i].size()));
  }
  auto blank = [](const std::string& l) { return l.find_first_not_of(' ') == std::string::npos; };
  while (!lines.empty() && blank(lines.back())) lines.pop_back();
  size_t first = 0;
  while (first < lines.size() && blank(lines[first])) ++first;
  return absl::StrJoin(lines.begin() + first, lines.end(), "\n");
}

// The parameters of the def whose '(' is line[open]: the names before the
// first `*`, `*args` or `**kwargs` (those positional arguments bind to), with
// annotations and defaults skipped and the positional-only marker `/`
// dropped.
std::vector<std::string> PositionalParameters(const LogicalLine& line, size_t open) {
  std::vector<std::string> names;
  bool at_start = true;  // at the start of a parameter
  for (size_t k = open + 1, depth = 0; k < line.size(); ++k) {
    const Token& t = line[k];
    if (IsOp(t, '(') || IsOp(t, '[') || IsOp(t, '{')) ++depth;
    if (IsOp(t, ')') || IsOp(t, ']') || IsOp(t, '}')) {
      if (depth == 0) break;
      --depth;
    }
    if (depth > 0) continue;
    if (IsOp(t, ',')) {
      at_start = true;
      continue;
    }
    if (!at_start) continue;
    at_start = false;
    if (IsOp(t, '*')) break;  // *, *args, **kwargs: keyword arguments only from here
    if (t.kind == Token::kName) names.push_back(t.text);
  }
  return names;
}

// The names `from module import a, b as c` binds at top level (not `*`),
// or nullopt when `line` is not such a statement.
std::optional<std::vector<std::string>> ImportedNames(const LogicalLine& line) {
  // `from __future__ import ...` binds compiler flags, not callables.
  if (!IsName(line[0], "from") || (line.size() > 1 && IsName(line[1], "__future__"))) {
    return std::nullopt;
  }
  size_t k = 1;
  while (k < line.size() && !IsName(line[k], "import")) ++k;
  if (k == line.size()) return std::nullopt;
  std::vector<std::string> names;
  std::string last;
  for (++k; k < line.size() && !IsOp(line[k], ';'); ++k) {
    const Token& t = line[k];
    if (IsOp(t, ',') || IsOp(t, ')')) {
      if (!last.empty()) names.push_back(last);
      last.clear();
    } else if (t.kind == Token::kName && !IsName(t, "as")) {
      last = t.text;  // the name, then its alias if any
    }
  }
  if (!last.empty()) names.push_back(last);
  return names;
}

}  // namespace

absl::StatusOr<HubConf> parse_hubconf_py(absl::string_view text, absl::string_view source) {
  absl::StatusOr<std::vector<LogicalLine>> lines = Tokenizer(text, source).Run();
  if (!lines.ok()) return lines.status();
  struct Entry {
    std::string doc;
    std::vector<std::string> positional;
  };
  std::map<std::string, Entry> entries;  // sorted, as torch.hub.list
  std::vector<std::string> dependencies;
  for (size_t i = 0; i < lines->size(); ++i) {
    const LogicalLine& line = (*lines)[i];
    if (line.front().column != 0) continue;  // inside a block: not top level
    size_t k = IsName(line[0], "async") ? 1 : 0;
    if (line.size() > k + 1 && IsName(line[k], "def") && line[k + 1].kind == Token::kName) {
      const Token& name = line[k + 1];
      // The body starts after the ':' that closes the signature.
      size_t colon = k + 2;
      for (int depth = 0; colon < line.size(); ++colon) {
        const Token& t = line[colon];
        if (IsOp(t, '(') || IsOp(t, '[') || IsOp(t, '{')) ++depth;
        if (IsOp(t, ')') || IsOp(t, ']') || IsOp(t, '}')) --depth;
        if (depth == 0 && IsOp(t, ':')) break;
      }
      std::optional<std::string> doc;
      if (colon + 1 < line.size()) {  // def f(): "doc"; ...
        doc = Docstring(line, colon + 1);
      } else if (i + 1 < lines->size() && (*lines)[i + 1].front().column > 0) {
        doc = Docstring((*lines)[i + 1], 0);
      }
      if (name.text.front() == '_') continue;
      if (absl::Status s = check_entry_point_name(name.text, absl::StrCat(source, ":", name.line));
          !s.ok()) {
        return s;
      }
      entries[name.text] =
          Entry{doc ? CleanDoc(*doc) : "", k + 2 < line.size() && IsOp(line[k + 2], '(')
                                               ? PositionalParameters(line, k + 2)
                                               : std::vector<std::string>{}};
    } else if (std::optional<std::vector<std::string>> imported = ImportedNames(line)) {
      // What an imported name is (a function, a class, a constant) is not
      // known without running Python; it is listed, and loads when a
      // builder of its name is registered. Its doc and signature live in
      // the other module: no doc, keyword arguments only.
      for (const std::string& n : *imported) {
        if (n.front() == '_') continue;
        if (absl::Status s = check_entry_point_name(n, absl::StrCat(source, ":", line[0].line));
            !s.ok()) {
          return s;
        }
        entries[n] = Entry{};
      }
    } else if (line.size() >= 3 && IsName(line[0], "dependencies") && IsOp(line[1], '=') &&
               (IsOp(line[2], '[') || IsOp(line[2], '('))) {
      dependencies.clear();
      for (size_t t = 3; t < line.size(); ++t) {
        if (line[t].kind == Token::kString) dependencies.push_back(line[t].text);
      }
    }
  }
  HubConf conf;
  for (const auto& [name, entry] : entries) {
    EntryPoint* e = conf.add_entry_points();
    e->set_name(name);
    e->set_doc(entry.doc);
    e->set_builder(name);
    e->set_python(true);
    for (const std::string& p : entry.positional) e->add_positional(p);
  }
  for (const std::string& d : dependencies) conf.add_python_dependencies(d);
  return conf;
}

absl::StatusOr<HubConf> read_hubconf(const std::string& repo_dir) {
  for (const char* file : {kHubConfFile, kHubConfPyFile}) {
    const std::string path = absl::StrCat(repo_dir, "/", file);
    std::ifstream in(path, std::ios::binary);
    if (!in) continue;
    std::stringstream text;
    text << in.rdbuf();
    if (file == kHubConfFile) return parse_hubconf(text.str(), path);
    return parse_hubconf_py(text.str(), path);
  }
  return absl::NotFoundError(absl::StrCat("no ", kHubConfFile, " or ", kHubConfPyFile, " in ",
                                          repo_dir, ": the repository publishes no entry points"));
}

}  // namespace ember::hub
