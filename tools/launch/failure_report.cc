#include "tools/launch/failure_report.h"

#include <signal.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace ember::launch {

// Note [Failure summary]
// The worker that exits first is often not the one at fault: when rank 1
// stalls, rank 0's collective times out and rank 0 exits, reporting rank 1.
// So when a worker fails, before stopping the others, the launcher notes
// each one's state (a SIGSTOPped rank shows as stopped) and sends SIGUSR1
// to the workers that catch it (Ember programs with a process group: their
// flight recorder dumps on SIGUSR1; a program that does not catch it is not
// sent it, since it would die of it); it waits up to a second for their
// dumps, then stops everyone. The summary starts with the root cause: the
// analyser's culprit when the dumps name one (unless the first failure was
// SIGKILLed, which leaves no dump for the analyser to see), else the first
// failure. Each
// worker's message comes from its TORCHELASTIC_ERROR_FILE (written by
// distributed/error_file.h's record()), else from the last lines of its
// stderr, which the launcher forwards and keeps a tail of.

std::string ProcessState(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string text;
  if (!std::getline(in, text)) return "gone";
  // pid (comm) S ...: the state follows the last ')'.
  const size_t close = text.rfind(')');
  if (close == std::string::npos || close + 2 >= text.size()) return "unknown";
  switch (text[close + 2]) {
    case 'R':
      return "running";
    case 'S':
      return "sleeping";
    case 'D':
      return "in uninterruptible sleep";
    case 'T':
    case 't':
      return "stopped (SIGSTOP or a debugger)";
    case 'Z':
      return "zombie";
  }
  return "unknown";
}

bool CatchesSignal(pid_t pid, int sig) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (!absl::StartsWith(line, "SigCgt:")) continue;
    uint64_t mask = 0;
    if (!absl::SimpleHexAtoi(absl::StripAsciiWhitespace(absl::string_view(line).substr(7)),
                             &mask)) {
      return false;
    }
    return (mask >> (sig - 1)) & 1u;
  }
  return false;
}

void OutputTail::Add(std::string_view bytes) {
  partial_.append(bytes.data(), bytes.size());
  size_t start = 0;
  while (true) {
    const size_t nl = partial_.find('\n', start);
    if (nl == std::string::npos) break;
    lines_.push_back(partial_.substr(start, nl - start));
    if (lines_.size() > max_lines_) lines_.pop_front();
    start = nl + 1;
  }
  partial_.erase(0, start);
  if (partial_.size() > 4096) partial_.erase(0, partial_.size() - 4096);
}

std::vector<std::string> OutputTail::Lines() const {
  std::vector<std::string> out(lines_.begin(), lines_.end());
  if (!partial_.empty()) out.push_back(partial_);
  if (out.size() > max_lines_) out.erase(out.begin(), out.end() - max_lines_);
  return out;
}

namespace {

// The JSON string value that starts at text[i] (just past the opening
// quote), unescaped.
std::string JsonString(const std::string& text, size_t i) {
  std::string out;
  while (i < text.size() && text[i] != '"') {
    char c = text[i++];
    if (c != '\\' || i >= text.size()) {
      out.push_back(c);
      continue;
    }
    char e = text[i++];
    if (e == 'n') {
      out.push_back('\n');
    } else if (e == 't') {
      out.push_back('\t');
    } else if (e == 'u' && i + 4 <= text.size()) {
      int code = 0;
      absl::SimpleHexAtoi(absl::string_view(text).substr(i, 4), &code);
      out.push_back(code < 0x80 ? static_cast<char>(code) : '?');
      i += 4;
    } else {
      out.push_back(e);
    }
  }
  return out;
}

// The value of the first "key": "..." at or after `from`.
std::optional<std::string> JsonField(const std::string& text, const std::string& key,
                                     size_t from = 0) {
  const std::string needle = absl::StrCat("\"", key, "\"");
  size_t at = text.find(needle, from);
  while (at != std::string::npos) {
    size_t i = at + needle.size();
    while (i < text.size() && (text[i] == ' ' || text[i] == ':')) ++i;
    if (i < text.size() && text[i] == '"') return JsonString(text, i + 1);
    at = text.find(needle, at + 1);
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::string> ReadErrorFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  std::optional<std::string> message = JsonField(text, "message");
  if (!message || message->empty()) return std::nullopt;
  std::optional<std::string> stack = JsonField(text, "py_callstack");
  if (stack && !stack->empty()) {
    while (!stack->empty() && stack->back() == '\n') stack->pop_back();
    return absl::StrCat(*message, "\n", *stack);
  }
  return message;
}

namespace {

std::string Who(const WorkerReport& w) {
  return absl::StrCat("rank ", w.rank, " (local_rank ", w.local_rank, ", pid ", w.pid,
                      w.host.empty() ? "" : absl::StrCat(" on ", w.host), ")");
}

void AddMessage(std::vector<std::string>& lines, const WorkerReport& w) {
  if (w.message.empty()) {
    lines.push_back("  message: none (no error file, nothing on stderr)");
    return;
  }
  lines.push_back(absl::StrCat("  message (", w.message_source, "):"));
  for (absl::string_view line : absl::StrSplit(w.message, '\n')) {
    lines.push_back(absl::StrCat("    ", line));
  }
}

}  // namespace

std::vector<std::string> FailureSummary(const WorkerReport& first,
                                        const std::vector<WorkerReport>& others,
                                        const std::optional<flight::Verdict>& verdict,
                                        const std::string& dump_dir,
                                        const std::string& dump_problem) {
  std::vector<std::string> lines;
  lines.push_back("==== failure summary ====");
  // A rank SIGKILLed leaves no dump, so the analyser cannot see it and
  // blames a rank left waiting for it: then its culprits stand only if they
  // name the killed rank itself.
  const bool first_unseen = first.signal == SIGKILL;
  const bool trust_verdict =
      verdict && verdict->diverged && !verdict->culprits.empty() &&
      (!first_unseen || std::find(verdict->culprits.begin(), verdict->culprits.end(),
                                  first.rank) != verdict->culprits.end());
  if (trust_verdict) {
    std::vector<std::string> ranks;
    for (int r : verdict->culprits) ranks.push_back(absl::StrCat(r));
    lines.push_back(absl::StrCat("root cause: rank", ranks.size() > 1 ? "s " : " ",
                                 absl::StrJoin(ranks, ", "),
                                 " (flight recorder): ", verdict->text));
  } else {
    lines.push_back(absl::StrCat("root cause: ", Who(first), " ", first.outcome));
  }
  lines.push_back(absl::StrCat("first failure: ", Who(first), " ", first.outcome, " at ",
                               absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", first.when,
                                                absl::UTCTimeZone())));
  AddMessage(lines, first);
  if (!others.empty()) {
    lines.push_back("other ranks when it failed:");
    for (const WorkerReport& w : others) {
      lines.push_back(absl::StrCat("  ", Who(w), ": ", w.outcome));
      if (!w.message.empty() && w.message_source == "error file") {
        lines.push_back(absl::StrCat("    error file: ", w.message.substr(0, w.message.find('\n'))));
      }
    }
  }
  if (verdict) {
    lines.push_back(absl::StrCat("flight recorder (", dump_dir, "): ", verdict->text));
  } else if (!dump_problem.empty()) {
    lines.push_back(absl::StrCat("flight recorder (", dump_dir,
                                 "): the dumps could not be read: ", dump_problem));
  }
  lines.push_back("=========================");
  return lines;
}

}  // namespace ember::launch
