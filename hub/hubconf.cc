#include "hub/hubconf.h"

#include <algorithm>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"
#include "serialization/printable.h"
#include "tensor/status_macros.h"

namespace ember::hub {

using ::ember::serialization::escape_for_terminal;

namespace {

// Keeps the first parse error with its position (protobuf would otherwise
// print it to stderr).
class FirstError : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, int column, const std::string& message) override {
    if (message_.empty())
      message_ = absl::StrCat("line ", line + 1, ", column ", column + 1, ": ", message);
  }
  void AddWarning(int, int, const std::string&) override {}
  const std::string& message() const { return message_; }

 private:
  std::string message_;
};

bool IsHex(absl::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return absl::ascii_isxdigit(c); });
}

absl::Status CheckWeights(const EntryPoint& e, absl::string_view source) {
  if (!e.has_weights()) return absl::OkStatus();
  const Weights& w = e.weights();
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": entry point '", e.name(), "': weights ", why));
  };
  if (w.file().empty() == w.url().empty()) {
    return bad("need exactly one of `file` (a path in the repository) or `url`");
  }
  if (!w.sha256().empty() &&
      (w.sha256().size() < 8 || w.sha256().size() > 64 || !IsHex(w.sha256()))) {
    return bad(
        absl::StrCat("sha256 '", escape_for_terminal(w.sha256()), "' is not 8 to 64 hex digits"));
  }
  if (const std::string origin = url_origin(w.url()); !w.url().empty() &&
                                                      !absl::StartsWith(origin, "https://") &&
                                                      !absl::StartsWith(origin, "http://")) {
    return bad(absl::StrCat("url '", escape_for_terminal(w.url()),
                            "' is not an https:// URL; publish weights over https (or as a `file` "
                            "in the repository)"));
  }
  if (!w.url().empty() && w.sha256().empty()) {
    return bad(absl::StrCat("url '", escape_for_terminal(w.url()),
                            "' has no sha256; give the file's SHA-256 (sha256sum)"));
  }
  if (!w.file().empty() && (w.file().front() == '/' || w.file().find("..") != std::string::npos)) {
    return bad(absl::StrCat("file '", escape_for_terminal(w.file()),
                            "' must be a relative path inside the repository"));
  }
  return absl::OkStatus();
}

bool IsKeyword(absl::string_view name) {
  static const char* const kKeywords[] = {
      "False", "None",     "True",  "and",    "as",   "assert", "async",  "await",    "break",
      "class", "continue", "def",   "del",    "elif", "else",   "except", "finally",  "for",
      "from",  "global",   "if",    "import", "in",   "is",     "lambda", "nonlocal", "not",
      "or",    "pass",     "raise", "return", "try",  "while",  "with",   "yield"};
  return std::find(std::begin(kKeywords), std::end(kKeywords), name) != std::end(kKeywords);
}

}  // namespace

absl::Status check_entry_point_name(absl::string_view name, absl::string_view where) {
  const bool identifier = !name.empty() && !absl::ascii_isdigit(name.front()) &&
                          std::all_of(name.begin(), name.end(),
                                      [](char c) { return absl::ascii_isalnum(c) || c == '_'; }) &&
                          !IsKeyword(name);
  if (identifier) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      where, ": entry point name '", escape_for_terminal(name),
      "' is not an identifier; name entry points as Python functions are named (ASCII letters, "
      "digits and '_', not starting with a digit, not a keyword)"));
}

std::string url_origin(absl::string_view url) {
  const size_t scheme_end = url.find("://");
  if (scheme_end == absl::string_view::npos) return "";
  const size_t host_end = url.find_first_of("/?#", scheme_end + 3);
  return absl::AsciiStrToLower(url.substr(0, host_end));
}

absl::StatusOr<HubConf> parse_hubconf(absl::string_view text, absl::string_view source) {
  HubConf conf;
  FirstError errors;
  google::protobuf::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(std::string(text), &conf)) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": not a valid hubconf (schema hub/hubconf.proto): ", errors.message()));
  }
  if (conf.python_dependencies_size() > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(source,
                     ": `python_dependencies` is set only by the hubconf.py reader; list "
                     "builders in `dependencies`"));
  }
  std::set<std::string> names;
  for (const EntryPoint& e : conf.entry_points()) {
    if (e.name().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": an entry point has no name"));
    }
    EMBER_RETURN_IF_ERROR(check_entry_point_name(e.name(), source));
    if (!names.insert(e.name()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": entry point '", e.name(), "' is defined twice"));
    }
    if (e.python()) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": entry point '", e.name(),
                       "' sets `python`, which only the hubconf.py reader sets; remove it"));
    }
    if (e.builder().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": entry point '", e.name(), "' names no builder; set builder: \"<name>\""));
    }
    if (e.kwargs().contains("pretrained")) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": entry point '", e.name(),
                       "': `pretrained` is an argument of every entry point, "
                       "not a builder kwarg"));
    }
    if (absl::Status s = CheckWeights(e, source); !s.ok()) return s;
    std::set<std::string> params;
    for (const std::string& p : e.positional()) {
      if (!check_entry_point_name(p, source).ok()) {
        return absl::InvalidArgumentError(absl::StrCat(
            source, ": entry point '", e.name(), "': positional parameter '",
            escape_for_terminal(p), "' is not an identifier (ASCII letters, digits and '_')"));
      }
      if (!params.insert(p).second) {
        return absl::InvalidArgumentError(absl::StrCat(
            source, ": entry point '", e.name(), "' lists positional parameter '", p, "' twice"));
      }
    }
  }
  return conf;
}

absl::StatusOr<const EntryPoint*> get_entry_point(const HubConf& conf, absl::string_view name,
                                                  absl::string_view where) {
  std::vector<std::string> names;
  for (const EntryPoint& e : conf.entry_points()) {
    if (e.name() == name) return &e;
    names.push_back(e.name());
  }
  return absl::NotFoundError(absl::StrCat("cannot find callable ", escape_for_terminal(name),
                                          " in hubconf of ", where,
                                          " (entry points: ", absl::StrJoin(names, ", "), ")"));
}

absl::Status check_dependencies(const HubConf& conf, const std::vector<std::string>& available) {
  std::vector<std::string> missing;
  for (const std::string& d : conf.dependencies()) {
    if (std::find(available.begin(), available.end(), d) == available.end()) missing.push_back(d);
  }
  if (missing.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("missing dependencies: ", absl::StrJoin(missing, ", "),
                   " (this loader provides: ", absl::StrJoin(available, ", "), ")"));
}

}  // namespace ember::hub
