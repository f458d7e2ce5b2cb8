#include "tools/launch/flight_analysis.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace ember::launch::flight {

// Note [First divergence]
// Collective #n of a group is the n-th collective every rank issued on it
// (Note [Flight recorder] in distributed/flight_recorder.cc), so the
// analyser walks each group's sequence numbers upwards and stops at the
// first one where the ranks' records differ:
// - some ranks have entry #n and others do not: the others never entered
//   it (they are behind: stopped, dead, stuck in their own code, or on
//   another path); each is named with its last completed op;
// - every rank has it but with different ops, dtypes, sizes or roots: a
//   mismatch, shown from both sides;
// - every rank entered it but not all completed it: the ranks still inside
//   it (or, when all gave up, the ones that failed) are named.
// A rank whose ring no longer holds #n (it wrapped) counts as having
// completed it. A rank with no dump at all (SIGKILL and SIGSTOP leave none)
// is named as such. Across groups, the divergence whose op was entered
// first wins.

namespace {

using Fields = std::map<std::string, std::string>;

// key=value tokens; values in "..." may hold spaces and escapes.
absl::StatusOr<Fields> Tokens(absl::string_view line) {
  Fields f;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && line[i] == ' ') ++i;
    if (i >= line.size()) break;
    const size_t eq = line.find('=', i);
    const size_t space = line.find(' ', i);
    if (eq == absl::string_view::npos || (space != absl::string_view::npos && space < eq)) {
      // A bare word (the line's kind).
      const size_t end = space == absl::string_view::npos ? line.size() : space;
      f[""] = std::string(line.substr(i, end - i));
      i = end;
      continue;
    }
    std::string key(line.substr(i, eq - i));
    i = eq + 1;
    std::string value;
    if (i < line.size() && line[i] == '"') {
      ++i;
      bool closed = false;
      while (i < line.size()) {
        const char c = line[i++];
        if (c == '"') {
          closed = true;
          break;
        }
        if (c != '\\' || i >= line.size()) {
          value.push_back(c);
          continue;
        }
        const char e = line[i++];
        if (e == 'n') {
          value.push_back('\n');
        } else if (e == 't') {
          value.push_back('\t');
        } else if (e == 'x' && i + 2 <= line.size()) {
          int code = 0;
          absl::SimpleHexAtoi(line.substr(i, 2), &code);
          value.push_back(static_cast<char>(code));
          i += 2;
        } else {
          value.push_back(e);
        }
      }
      if (!closed) return absl::DataLossError("an unterminated quoted value");
    } else {
      const size_t end = line.find(' ', i);
      value = std::string(line.substr(i, end == absl::string_view::npos ? end : end - i));
      i = end == absl::string_view::npos ? line.size() : end;
    }
    f[key] = std::move(value);
  }
  return f;
}

int64_t Int(const Fields& f, const std::string& key, int64_t fallback = 0) {
  auto it = f.find(key);
  int64_t v = fallback;
  if (it == f.end() || !absl::SimpleAtoi(it->second, &v)) return fallback;
  return v;
}
std::string Str(const Fields& f, const std::string& key) {
  auto it = f.find(key);
  return it == f.end() ? "" : it->second;
}

constexpr absl::string_view kHeader = "# Ember flight recorder dump";

std::string RankList(const std::vector<int>& ranks) {
  return absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ", absl::StrJoin(ranks, ", "));
}

// "all_reduce of 4 MiB float32 with root 1".
std::string Call(const DumpOp& op) {
  std::string text = op.op;
  if (op.op == "barrier" || op.op == "monitored_barrier") return text;
  absl::StrAppend(&text, " of ", HumanBytes(op.bytes), " ", op.dtype);
  if (op.peer >= 0) absl::StrAppend(&text, " with root ", op.peer);
  return text;
}

bool SameCall(const DumpOp& a, const DumpOp& b) {
  return a.op == b.op && a.dtype == b.dtype && a.bytes == b.bytes && a.peer == b.peer;
}

struct Member {
  const RankDump* dump;
  const DumpGroup* group;
  std::map<int64_t, const DumpOp*> by_seq;  // collectives
  int64_t lo = 0;                           // lowest seq still in the ring
  int64_t hi = -1;                          // highest recorded
};

// The member's last completed collective, for "its last completed op is
// #56 broadcast".
std::string LastCompleted(const Member& m) {
  for (auto it = m.by_seq.rbegin(); it != m.by_seq.rend(); ++it) {
    if (it->second->state == "completed") {
      return absl::StrCat("#", it->first, " ", it->second->op);
    }
  }
  if (m.group->last_completed >= 0) return absl::StrCat("#", m.group->last_completed);
  return "none (it completed no collective of this group)";
}

struct Candidate {
  Verdict verdict;
  int64_t entered_us = 0;  // when the first rank entered the op
};

std::optional<Candidate> GroupDivergence(const std::string& name, std::vector<Member>& members,
                                         int group_size, bool all_dumps_expected) {
  if (members.empty()) return std::nullopt;
  std::sort(members.begin(), members.end(),
            [](const Member& a, const Member& b) { return a.group->rank < b.group->rank; });
  std::set<int> present;
  for (const Member& m : members) present.insert(m.group->rank);
  std::vector<int> no_dump;  // group ranks
  for (int r = 0; r < group_size && all_dumps_expected; ++r) {
    if (!present.contains(r)) no_dump.push_back(r);
  }
  const bool whole_group = static_cast<int>(members.size()) == group_size;
  int64_t top = -1;
  for (const Member& m : members) top = std::max(top, m.hi);
  int64_t start = 0;
  for (const Member& m : members) start = std::max(start, m.lo);

  auto global = [&](const Member& m) { return m.dump->rank; };
  for (int64_t s = start; s <= top; ++s) {
    std::vector<const Member*> entered, never;
    const DumpOp* first = nullptr;
    for (const Member& m : members) {
      auto it = m.by_seq.find(s);
      if (it != m.by_seq.end()) {
        entered.push_back(&m);
        if (first == nullptr || it->second->created_us < first->created_us) first = it->second;
      } else if (m.hi < s) {
        never.push_back(&m);
      }
    }
    if (first == nullptr) continue;
    Candidate c;
    c.entered_us = first->created_us;
    Verdict& v = c.verdict;
    v.group = name;
    v.seq = s;
    v.op = first->op;
    const std::string where =
        first->op == "barrier" || first->op == "monitored_barrier"
            ? absl::StrCat(first->op, " #", s, " (group ", name, ")")
            : absl::StrCat(first->op, " #", s, " (group ", name, ", ", HumanBytes(first->bytes),
                           " ", first->dtype, ")");
    std::vector<int> in_ranks;
    for (const Member* m : entered) in_ranks.push_back(global(*m));
    // Ranks that never entered it.
    auto no_dump_part = [&](std::vector<std::string>& parts) {
      // Group ranks equal global ranks in the default group ("0"); other
      // groups only know the group rank.
      if (name == "0") v.culprits.insert(v.culprits.end(), no_dump.begin(), no_dump.end());
      parts.push_back(absl::StrCat(name == "0" ? "" : "group ", RankList(no_dump),
                                   " left no dump (killed or stopped?)"));
    };
    if (!never.empty()) {
      v.diverged = true;
      std::vector<std::string> parts;
      parts.push_back(absl::StrCat(RankList(in_ranks), " entered it"));
      for (const Member* m : never) {
        v.culprits.push_back(global(*m));
        parts.push_back(absl::StrCat("rank ", global(*m), " never did, its last completed op is ",
                                     LastCompleted(*m)));
      }
      if (!no_dump.empty()) no_dump_part(parts);
      v.text = absl::StrCat(where, ": ", absl::StrJoin(parts, "; "));
      return c;
    }
    // Every rank entered: do they agree on the call?
    std::vector<std::pair<const DumpOp*, std::vector<int>>> calls;
    for (const Member* m : entered) {
      const DumpOp* op = m->by_seq.at(s);
      auto same = std::find_if(calls.begin(), calls.end(),
                               [&](const auto& k) { return SameCall(*k.first, *op); });
      if (same == calls.end()) {
        calls.push_back({op, {global(*m)}});
      } else {
        same->second.push_back(global(*m));
      }
    }
    if (calls.size() > 1) {
      v.diverged = true;
      std::vector<std::string> sides;
      size_t smallest = 0;
      for (size_t k = 0; k < calls.size(); ++k) {
        sides.push_back(absl::StrCat(RankList(calls[k].second), " ran ", Call(*calls[k].first)));
        if (calls[k].second.size() < calls[smallest].second.size()) smallest = k;
      }
      const size_t fewest = calls[smallest].second.size();
      const bool unique = std::count_if(calls.begin(), calls.end(), [&](const auto& k) {
                            return k.second.size() == fewest;
                          }) == 1;
      // The minority; without one, every side but the lowest rank's.
      for (size_t k = 0; k < calls.size(); ++k) {
        if (unique ? k == smallest : k != 0) {
          v.culprits.insert(v.culprits.end(), calls[k].second.begin(), calls[k].second.end());
        }
      }
      v.text = absl::StrCat("collective #", s, " (group ", name,
                            "): the ranks disagree: ", absl::StrJoin(sides, "; "));
      return c;
    }
    // Same call everywhere: did everyone complete it?
    std::vector<int> inside, failed;
    std::string error;
    for (const Member* m : entered) {
      const DumpOp* op = m->by_seq.at(s);
      if (op->state == "failed") {
        failed.push_back(global(*m));
        if (error.empty()) error = op->error;
      } else if (op->state != "completed") {
        inside.push_back(global(*m));
      }
    }
    if (inside.empty() && failed.empty()) continue;
    v.diverged = true;
    std::vector<std::string> parts;
    if (!no_dump.empty()) {
      // The ranks without a dump are the likely reason this one is stuck.
      parts.push_back(absl::StrCat(RankList(in_ranks), " entered it"));
      no_dump_part(parts);
      v.text = absl::StrCat(where, ": ", absl::StrJoin(parts, "; "));
      return c;
    }
    parts.push_back(absl::StrCat("every rank entered it"));
    if (!inside.empty()) {
      v.culprits = inside;
      parts.push_back(absl::StrCat(RankList(inside), " did not finish it"));
    } else if (whole_group) {
      v.culprits = failed;
    }
    if (!whole_group) parts[0] = "every rank with a dump here entered it";
    if (!failed.empty()) {
      parts.push_back(absl::StrCat(RankList(failed), " failed it: ", error));
    }
    v.text = absl::StrCat(where, ": ", absl::StrJoin(parts, "; "));
    return c;
  }
  if (!no_dump.empty()) {
    Candidate c;
    c.verdict.diverged = true;
    c.verdict.group = name;
    c.verdict.text = absl::StrCat("group ", name, ": ", RankList(no_dump),
                                  " left no dump (killed or stopped?); the others agree");
    if (name == "0") c.verdict.culprits = no_dump;
    c.entered_us = INT64_MAX;
    return c;
  }
  return std::nullopt;
}

}  // namespace

std::string HumanBytes(int64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int unit = 0;
  while (v >= 1024 && unit < 4) {
    v /= 1024;
    ++unit;
  }
  if (unit == 0 || v == static_cast<double>(static_cast<int64_t>(v))) {
    return absl::StrCat(static_cast<int64_t>(v), " ", kUnits[unit]);
  }
  return absl::StrFormat("%.1f %s", v, kUnits[unit]);
}

absl::StatusOr<RankDump> ParseDump(std::string_view text, const std::string& path) {
  RankDump dump;
  dump.path = path;
  int line_no = 0;
  bool ended = false;
  for (absl::string_view line : absl::StrSplit(absl::string_view(text.data(), text.size()), '\n')) {
    ++line_no;
    if (line.empty() || line[0] == '#') continue;
    absl::StatusOr<Fields> f = Tokens(line);
    if (!f.ok()) {
      return absl::DataLossError(
          absl::StrCat(path, ":", line_no, ": ", f.status().message(), "; is it a dump?"));
    }
    const std::string kind = Str(*f, "");
    if (kind == "process") {
      dump.rank = static_cast<int>(Int(*f, "rank", -1));
      dump.host = Str(*f, "host");
      dump.pid = static_cast<int>(Int(*f, "pid"));
      dump.time_us = Int(*f, "time_us");
      dump.reason = Str(*f, "reason");
    } else if (kind == "group") {
      DumpGroup g;
      g.name = Str(*f, "name");
      g.backend = Str(*f, "backend");
      g.rank = static_cast<int>(Int(*f, "rank"));
      g.size = static_cast<int>(Int(*f, "size"));
      g.recorded = Int(*f, "recorded");
      g.last_enqueued = Int(*f, "last_enqueued", -1);
      g.last_started = Int(*f, "last_started", -1);
      g.last_completed = Int(*f, "last_completed", -1);
      dump.groups.push_back(std::move(g));
    } else if (kind == "op") {
      if (dump.groups.empty()) {
        return absl::DataLossError(
            absl::StrCat(path, ":", line_no, ": an op before any group line"));
      }
      DumpOp op;
      op.group = Str(*f, "group");
      op.id = Int(*f, "id", -1);
      op.seq = Int(*f, "seq", -1);
      op.collective = Str(*f, "kind") != "p2p";
      op.op = Str(*f, "op");
      op.dtype = Str(*f, "dtype");
      op.in_numel = Int(*f, "in_numel");
      op.out_numel = Int(*f, "out_numel");
      op.bytes = Int(*f, "bytes");
      op.peer = static_cast<int>(Int(*f, "peer", -1));
      op.tag = static_cast<int>(Int(*f, "tag"));
      op.timeout_ms = Int(*f, "timeout_ms");
      op.state = Str(*f, "state");
      op.created_us = Int(*f, "created_us");
      op.started_us = Int(*f, "started_us");
      op.finished_us = Int(*f, "finished_us");
      op.error = Str(*f, "error");
      dump.groups.back().ops.push_back(std::move(op));
    } else if (kind == "end") {
      ended = true;
    } else {
      return absl::DataLossError(absl::StrCat(path, ":", line_no, ": unknown line kind '", kind,
                                              "' (expected process, group, op or end)"));
    }
  }
  if (dump.rank < 0) {
    return absl::DataLossError(absl::StrCat(path, ": no 'process' line; is it a dump?"));
  }
  if (!ended) {
    return absl::DataLossError(absl::StrCat(path, ": the dump has no 'end' line (cut short)"));
  }
  return dump;
}

absl::StatusOr<std::vector<RankDump>> ReadDumps(const std::vector<std::string>& paths) {
  std::vector<std::string> files;
  for (const std::string& path : paths) {
    struct stat st;
    if (stat(path.c_str(), &st) != 0) {
      return absl::NotFoundError(absl::StrCat("'", path, "' does not exist"));
    }
    if (!S_ISDIR(st.st_mode)) {
      files.push_back(path);
      continue;
    }
    DIR* dir = opendir(path.c_str());
    if (dir == nullptr) {
      return absl::PermissionDeniedError(absl::StrCat("cannot read the directory '", path, "'"));
    }
    std::vector<std::string> found;
    while (dirent* e = readdir(dir)) {
      const std::string name = e->d_name;
      if (name == "." || name == ".." || absl::EndsWith(name, ".tmp")) continue;
      const std::string full = absl::StrCat(path, "/", name);
      if (stat(full.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
      std::ifstream in(full);
      std::string first;
      std::getline(in, first);
      if (absl::StartsWith(first, kHeader)) found.push_back(full);
    }
    closedir(dir);
    std::sort(found.begin(), found.end());
    files.insert(files.end(), found.begin(), found.end());
  }
  std::vector<RankDump> dumps;
  for (const std::string& file : files) {
    std::ifstream in(file);
    if (!in) return absl::NotFoundError(absl::StrCat("cannot open '", file, "'"));
    std::stringstream ss;
    ss << in.rdbuf();
    absl::StatusOr<RankDump> dump = ParseDump(ss.str(), file);
    if (!dump.ok()) return dump.status();
    dumps.push_back(*std::move(dump));
  }
  std::sort(dumps.begin(), dumps.end(),
            [](const RankDump& a, const RankDump& b) { return a.rank < b.rank; });
  return dumps;
}

Verdict Analyse(const std::vector<RankDump>& dumps, int world_size) {
  // Members per group name.
  std::map<std::string, std::vector<Member>> groups;
  std::map<std::string, int> sizes;
  for (const RankDump& d : dumps) {
    for (const DumpGroup& g : d.groups) {
      Member m{&d, &g, {}, INT64_MAX, g.last_enqueued};
      for (const DumpOp& op : g.ops) {
        if (!op.collective) continue;
        m.by_seq[op.seq] = &op;
        m.lo = std::min(m.lo, op.seq);
      }
      if (m.lo == INT64_MAX) m.lo = g.last_enqueued + 1;
      groups[g.name].push_back(std::move(m));
      sizes[g.name] = std::max(sizes[g.name], g.size);
    }
  }
  std::optional<Candidate> best;
  for (auto& [name, members] : groups) {
    std::optional<Candidate> c = GroupDivergence(name, members, sizes[name], world_size > 0);
    if (c && (!best || c->entered_us < best->entered_us)) best = std::move(c);
  }
  if (best) return best->verdict;
  Verdict v;
  std::set<int> have;
  for (const RankDump& d : dumps) have.insert(d.rank);
  std::vector<int> missing;
  for (int r = 0; r < world_size; ++r) {
    if (!have.contains(r)) missing.push_back(r);
  }
  if (!missing.empty()) {
    v.diverged = true;
    v.culprits = missing;
    v.text = absl::StrCat(RankList(missing), " left no dump (killed or stopped?)");
    return v;
  }
  v.text = dumps.empty() ? "no dumps to compare"
                         : "the ranks' records agree: no collective where they diverged";
  return v;
}

std::vector<std::string> Progress(const std::vector<RankDump>& dumps) {
  std::vector<std::string> lines;
  for (const RankDump& d : dumps) {
    for (const DumpGroup& g : d.groups) {
      std::string last = "none";
      for (auto it = g.ops.rbegin(); it != g.ops.rend(); ++it) {
        if (it->collective && it->state == "completed") {
          last = absl::StrCat("#", it->seq, " ", it->op);
          break;
        }
      }
      lines.push_back(absl::StrCat("rank ", d.rank, " (", d.host, ", pid ", d.pid, "): group ",
                                   g.name, " (", g.backend, "): last completed ", last,
                                   ", last entered #", g.last_enqueued, "; dumped on: ",
                                   d.reason));
    }
  }
  return lines;
}

}  // namespace ember::launch::flight
