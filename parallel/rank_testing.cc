#include "parallel/rank_testing.h"

#include <cstdlib>
#include <map>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "base/testing/peers.h"
#include "gtest/gtest.h"
#include "tensor/error.h"

namespace ember::parallel::rank_testing {

absl::Status Guard(const std::function<absl::Status()>& body) {
  try {
    return body();
  } catch (const Error& e) {
    return absl::InternalError(e.what());
  }
}

std::string Describe(const std::vector<distributed::testing::ProcessResult>& results) {
  std::vector<std::string> lines;
  for (size_t r = 0; r < results.size(); ++r) {
    lines.push_back(absl::StrCat("rank ", r, ": exit ", results[r].exit_code, " signal ",
                                 results[r].signal, " output: ", results[r].output));
  }
  return absl::StrJoin(lines, "\n");
}

void ExpectAllSucceeded(const std::vector<distributed::testing::ProcessResult>& results) {
  for (const distributed::testing::ProcessResult& r : results) {
    EXPECT_EQ(r.exit_code, 0) << Describe(results);
  }
}

Tensor Get(const StateDict& state, const std::string& name) {
  for (const auto& [key, t] : state) {
    if (key == name) return t;
  }
  return Tensor();
}

const TorchRun& RunTorchOnce(const std::string& script, const std::string& dir_name) {
  static absl::Mutex mu(absl::kConstInit);
  static auto* runs = new std::map<std::string, std::unique_ptr<TorchRun>>();
  absl::MutexLock lock(&mu);
  std::unique_ptr<TorchRun>& run = (*runs)[script];
  if (run != nullptr) return *run;
  run = std::make_unique<TorchRun>();
  const char* tmp = std::getenv("TEST_TMPDIR");
  run->dir = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/", dir_name);
  if (std::system(absl::StrCat("rm -rf '", run->dir, "' && mkdir -p '", run->dir, "'").c_str()) !=
      0) {
    run->status = absl::InternalError("cannot make " + run->dir);
    return *run;
  }
  absl::StatusOr<std::string> out = ::ember::testing::run_torch2(script, {run->dir});
  run->status = out.ok() ? absl::OkStatus() : out.status();
  if (out.ok() && out->find("done") == std::string::npos) {
    run->status = absl::InternalError(absl::StrCat(script, " printed: ", *out));
  }
  return *run;
}

}  // namespace ember::parallel::rank_testing
