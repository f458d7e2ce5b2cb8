// PyTorch 2.x's TCPStore and Ember's side by side (testdata/torch_store.py):
// a PyTorch client of Ember's server, and Ember's client of PyTorch's server
// (libuv and classic), each checking what the other wrote. Skips, saying
// why, where the PyTorch 2.x peer is not installed (tools/install_peers.sh).
#include <stdio.h>
#include <sys/wait.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/testing/peers.h"
#include "distributed/tcp_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ember::distributed {
namespace {

using ::testing::HasSubstr;

constexpr char kScript[] = "distributed/testdata/torch_store.py";

// A running script: its stdout, line by line, and its exit status.
class Script {
 public:
  explicit Script(const std::string& args) {
    absl::StatusOr<std::string> python = ember::testing::torch2_python();
    if (!python.ok()) {
      skip_ = std::string(python.status().message());
      return;
    }
    pipe_ = popen(absl::StrCat(*python, " ", kScript, " ", args).c_str(), "r");
  }
  ~Script() { Finish(); }

  const std::string& skip() const { return skip_; }

  std::string Line() {
    char line[4096];
    if (pipe_ == nullptr || fgets(line, sizeof(line), pipe_) == nullptr) return "";
    std::string text(line);
    while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
    return text;
  }

  // The rest of its output and whether it exited 0.
  bool Finish() {
    if (pipe_ == nullptr) return false;
    std::string rest;
    for (std::string line = Line(); !line.empty(); line = Line()) rest += line + "\n";
    int status = pclose(pipe_);
    pipe_ = nullptr;
    output_ += rest;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  const std::string& output() const { return output_; }

 private:
  std::string skip_;
  FILE* pipe_ = nullptr;
  std::string output_;
};

TEST(TcpStoreTorchTest, PyTorchClientOfEmbersServer) {
  TcpStoreOptions options;
  options.is_server = true;
  options.timeout = absl::Seconds(60);
  std::unique_ptr<TcpStore> store = TcpStore::create(options).value();
  ASSERT_TRUE(store->set("cc/hello", "from ember").ok());
  ASSERT_EQ(store->add("cc/n", 3).value(), 3);
  ASSERT_TRUE(store->queue_push("cc/q", "queued by ember").ok());
  Script torch(absl::StrCat("client ", store->port()));
  if (!torch.skip().empty()) GTEST_SKIP() << torch.skip();
  ASSERT_TRUE(store->wait({"py/done"}, absl::Seconds(60)).ok());
  EXPECT_EQ(store->get("py/k").value(), "from torch");
  EXPECT_EQ(store->get("py/n").value(), "5");
  EXPECT_EQ(store->get("cc/n").value(), "4");
  EXPECT_EQ(store->get("py/cas").value(), "first");
  EXPECT_EQ(store->get("py/log").value(), "ab");
  EXPECT_EQ(store->get("py/m1").value(), "1");
  EXPECT_FALSE(store->check({"py/m2"}).value());
  EXPECT_EQ(store->queue_pop("py/q", false).value(), "queued by torch");
  ASSERT_TRUE(store->set("cc/verdict", "ok").ok());
  EXPECT_TRUE(torch.Finish()) << torch.output();
  EXPECT_THAT(torch.output(), HasSubstr("ok"));
}

void EmberClientOfPyTorchsServer(bool libuv) {
  Script torch(absl::StrCat("server ", libuv ? 1 : 0));
  if (!torch.skip().empty()) GTEST_SKIP() << torch.skip();
  int port = 0;
  ASSERT_TRUE(absl::SimpleAtoi(torch.Line(), &port)) << torch.output();
  TcpStoreOptions options;
  options.port = port;
  options.timeout = absl::Seconds(60);
  std::unique_ptr<TcpStore> store = TcpStore::create(options).value();
  EXPECT_FALSE(store->server_is_ember());
  EXPECT_EQ(store->get("py/hello").value(), "from torch");
  ASSERT_TRUE(store->set("cc/k", "from ember").ok());
  EXPECT_EQ(store->add("cc/n", 3).value(), 3);
  EXPECT_EQ(store->add("cc/n", 4).value(), 7);
  EXPECT_EQ(store->compare_set("cc/cas", "", "first").value(), "first");
  EXPECT_EQ(store->compare_set("cc/cas", "first", "second").value(), "second");
  EXPECT_TRUE(store->check({"py/hello", "cc/k"}).value());
  absl::Status missing = store->wait({"cc/k", "py/never"}, absl::Milliseconds(200));
  EXPECT_EQ(missing.code(), absl::StatusCode::kDeadlineExceeded) << missing;
  EXPECT_THAT(missing.message(), HasSubstr("py/never"));
  EXPECT_THAT(missing.message(), ::testing::Not(HasSubstr("cc/k")));
  ASSERT_TRUE(store->append("cc/log", "a").ok());
  ASSERT_TRUE(store->append("cc/log", "b").ok());
  ASSERT_TRUE(store->multi_set({"cc/m1", "cc/m2"}, {"x", "y"}).ok());
  EXPECT_THAT(store->multi_get({"cc/m2", "cc/m1"}).value(), ::testing::ElementsAre("y", "x"));
  ASSERT_TRUE(store->set("cc/deleted", "soon").ok());
  EXPECT_TRUE(store->delete_key("cc/deleted").value());
  if (libuv) {  // the classic server has no queues
    EXPECT_EQ(store->queue_pop("py/q", false).value(), "queued by torch");
    ASSERT_TRUE(store->queue_push("cc/q", "queued by ember").ok());
  }
  std::vector<std::string> keys = store->list_keys().value();
  EXPECT_THAT(keys, ::testing::IsSupersetOf({"py/hello", "cc/k", "cc/n"}));
  // PyTorch's server drops a connection that adds to text; the store opens
  // another and goes on.
  absl::StatusOr<int64_t> on_text = store->add("py/text", 1);
  EXPECT_EQ(on_text.status().code(), absl::StatusCode::kUnavailable) << on_text.status();
  EXPECT_EQ(store->get("py/text").value(), "not a number");
  // A get that waits: the value comes once the other side sets it.
  ASSERT_TRUE(store->set("cc/done", "1").ok());
  EXPECT_EQ(store->get("py/verified", absl::Seconds(60)).value(), "1");
  ASSERT_TRUE(store->set("cc/exit", "1").ok());
  EXPECT_TRUE(torch.Finish()) << torch.output();
}

TEST(TcpStoreTorchTest, EmberClientOfPyTorchsLibuvServer) { EmberClientOfPyTorchsServer(true); }

TEST(TcpStoreTorchTest, EmberClientOfPyTorchsClassicServer) { EmberClientOfPyTorchsServer(false); }

}  // namespace
}  // namespace ember::distributed
