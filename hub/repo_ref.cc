#include "hub/repo_ref.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace ember::hub {
namespace {

// Characters GitHub allows in owner and repository names.
bool IsNameChar(char c) {
  return absl::ascii_isalnum(c) || c == '-' || c == '_' || c == '.';
}

bool IsValidName(absl::string_view s) {
  return !s.empty() && s != "." && s != ".." &&
         std::all_of(s.begin(), s.end(), IsNameChar);
}

// A ref that can only be a commit: 7 to 40 hex digits, with at least one digit
// (so that words such as "deadbeef"-like branch names made of letters only are
// still taken as branches).
bool LooksLikeCommit(absl::string_view ref) {
  if (ref.size() < 7 || ref.size() > 40) return false;
  bool digit = false;
  for (char c : ref) {
    if (!absl::ascii_isxdigit(c) || absl::ascii_isupper(c)) return false;
    digit |= absl::ascii_isdigit(c);
  }
  return digit;
}

bool IsValidRef(absl::string_view ref) {
  if (ref.empty() || ref.front() == '/' || ref.back() == '/' ||
      ref.find("..") != absl::string_view::npos) {
    return false;
  }
  return std::all_of(ref.begin(), ref.end(),
                     [](char c) { return IsNameChar(c) || c == '/'; });
}

}  // namespace

absl::StatusOr<RepoRef> parse_repo_ref(absl::string_view text) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "invalid repository '", text, "': ", why,
        "; expected owner/repo or owner/repo:ref (tag or branch)"));
  };
  RepoRef r;
  absl::string_view rest = text;
  if (size_t colon = rest.find(':'); colon != absl::string_view::npos) {
    absl::string_view ref = rest.substr(colon + 1);
    rest = rest.substr(0, colon);
    if (!IsValidRef(ref))
      return bad(absl::StrCat("ref '", ref, "' is not a tag or branch name"));
    if (LooksLikeCommit(ref)) {
      return absl::InvalidArgumentError(
          absl::StrCat("invalid repository '", text, "': ref '", ref,
                       "' looks like a commit; the hub takes a tag or a branch "
                       "(a commit may belong to a fork), "
                       "so tag the commit and load owner/repo:<tag>"));
    }
    r.ref = std::string(ref);
  }
  size_t slash = rest.find('/');
  if (slash == absl::string_view::npos)
    return bad("no '/' between owner and repo");
  r.owner = std::string(rest.substr(0, slash));
  r.repo = std::string(rest.substr(slash + 1));
  if (!IsValidName(r.owner))
    return bad(absl::StrCat("owner '", r.owner, "' is not a valid name"));
  if (!IsValidName(r.repo))
    return bad(absl::StrCat("repo '", r.repo, "' is not a valid name"));
  return r;
}

std::string cache_dir_name(absl::string_view owner, absl::string_view repo, absl::string_view ref) {
  std::string name = absl::StrCat(owner, "_", repo, "_", ref);
  std::replace(name.begin() + owner.size() + repo.size() + 2, name.end(), '/',
               '_');
  return name;
}

}  // namespace ember::hub
