// The hub binary run as a real process against the loopback HTTPS server:
// output, exit codes, errors on stderr, and the progress bar on a real
// pseudo-terminal.
#include <fcntl.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hub/sha256.h"
#include "hub/testing/test_server.h"
#include "serialization/serialization.h"
#include "tensor/factories.h"

namespace ember::hub {
namespace {

using ::ember::hub::testing::ReadFile;
using ::ember::hub::testing::TestServer;
using ::ember::hub::testing::WriteArchive;
using ::ember::hub::testing::WriteFile;
using ::testing::HasSubstr;
using ::testing::Not;

struct Result {
  int code;
  std::string out;
  std::string err;
};

class HubBinaryTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string tmp = std::getenv("TEST_TMPDIR");
    base_ = new std::string(tmp);
    ASSERT_TRUE(WriteArchive(tmp + "/www/alice/models/zipball/main", "zip",
                             {{"top/hubconf.textproto",
                               "entry_points { name: \"tiny\" builder: \"mlp\" "
                               "doc: \"A tiny MLP.\" }\n"
                               "entry_points { name: \"cnn\" builder: "
                               "\"small_cnn\" doc: \"A small CNN.\" }"}})
                    .ok());
    // Repository text that would drive a terminal: an OSC title sequence and
    // a carriage return in a doc; a name that is a path.
    ASSERT_TRUE(WriteArchive(tmp + "/www/mallory/docs/zipball/main", "zip",
                             {{"top/hubconf.textproto",
                               "entry_points { name: \"m\" builder: \"mlp\" "
                               "doc: \"line one\\x1b]0;pwned\\x07\\nline two\\rhidden\" }"}})
                    .ok());
    ASSERT_TRUE(WriteArchive(tmp + "/www/mallory/names/zipball/main", "zip",
                             {{"top/hubconf.textproto",
                               "entry_points { name: \"../../x\\x1b[2J\" builder: \"mlp\" }"}})
                    .ok());
    std::string escapes_path = tmp + "/escapes.safetensors";
    ASSERT_TRUE(ember::save({{"w\x1b[2J", ::ember::zeros({2})}}, escapes_path).ok());
    std::string escapes = *ReadFile(escapes_path);
    ASSERT_TRUE(
        WriteFile(tmp + "/www/w/escapes-" + sha256_hex(escapes).substr(0, 8) + ".safetensors",
                  escapes)
            .ok());
    escapes_name_ = new std::string("escapes-" + sha256_hex(escapes).substr(0, 8) + ".safetensors");
    std::string weights = *ReadFile("serialization/testdata/tensors.pt");
    name_ = new std::string("tensors-" + sha256_hex(weights).substr(0, 8) + ".pt");
    ASSERT_TRUE(WriteFile(tmp + "/www/w/" + *name_, weights).ok());
    // A 1 MB checkpoint for the progress bar (served slowly under /slow/).
    std::string big_path = tmp + "/big.safetensors";
    ASSERT_TRUE(ember::save({{"w", ::ember::zeros({250000})}}, big_path).ok());
    std::string big = *ReadFile(big_path);
    big_name_ = new std::string("big-" + sha256_hex(big).substr(0, 8) + ".safetensors");
    big_size_ = big.size();
    ASSERT_TRUE(WriteFile(tmp + "/www/w/" + *big_name_, big).ok());
    absl::StatusOr<TestServer> s = TestServer::Start(tmp + "/www", tmp + "/server");
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = new TestServer(std::move(*s));
  }
  static void TearDownTestSuite() {
    delete server_;
    delete base_;
    delete name_;
    delete big_name_;
  }
  // Runs tools/hub/hub with `args` (a shell-quoted string).
  Result Run(const std::string& args) {
    std::string out = *base_ + "/stdout", err = *base_ + "/stderr";
    std::string cmd = "EMBER_HUB_BASE_URL=" + server_->base_url() +
                      " EMBER_HUB_CA_BUNDLE=" + server_->ca_bundle() + " TORCH_HUB_DIR=" + *base_ +
                      "/hub tools/hub/hub " + args + " >" + out + " 2>" + err + " </dev/null";
    int status = std::system(cmd.c_str());
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, *ReadFile(out), *ReadFile(err)};
  }
  // Runs tools/hub/hub with `args` (one per element) with stderr on a
  // pseudo-terminal (no output processing, so bytes arrive as written) and
  // stdout in a file. Reads the terminal until the child closes it, for at
  // most 30 s.
  Result RunOnTerminal(const std::vector<std::string>& args) {
    std::string out = *base_ + "/tty_stdout";
    termios raw{};
    cfmakeraw(&raw);
    int master = -1;
    pid_t pid = forkpty(&master, nullptr, &raw, nullptr);
    if (pid < 0) return {-1, "", std::string("forkpty: ") + strerror(errno)};
    if (pid == 0) {
      int fd = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      int null = open("/dev/null", O_RDONLY);
      if (fd < 0 || null < 0) _exit(126);
      dup2(fd, STDOUT_FILENO);
      dup2(null, STDIN_FILENO);
      setenv("EMBER_HUB_CA_BUNDLE", server_->ca_bundle().c_str(), 1);
      setenv("TORCH_HUB_DIR", (*base_ + "/hub").c_str(), 1);
      std::vector<char*> argv = {const_cast<char*>("tools/hub/hub")};
      for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    std::string tty;
    absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (absl::Now() < deadline) {
      pollfd p{master, POLLIN, 0};
      int ready = poll(&p, 1, 200);
      if (ready < 0 && errno != EINTR) break;
      if (ready <= 0) continue;
      char buf[4096];
      ssize_t n = read(master, buf, sizeof buf);
      if (n <= 0) break;  // EIO once the child has exited and closed the slave
      tty.append(buf, n);
    }
    int status = 0;
    pid_t done = 0;
    while ((done = waitpid(pid, &status, WNOHANG)) == 0 && absl::Now() < deadline)
      absl::SleepFor(absl::Milliseconds(10));
    if (done == 0) {  // still running past 30 s
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      ADD_FAILURE() << "hub " << args[0] << " did not finish in 30 s";
    }
    close(master);
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, *ReadFile(out), tty};
  }
  static std::string* base_;
  static std::string* name_;
  static std::string* big_name_;
  static std::string* escapes_name_;
  static size_t big_size_;
  static TestServer* server_;
};
std::string* HubBinaryTest::base_ = nullptr;
std::string* HubBinaryTest::name_ = nullptr;
std::string* HubBinaryTest::big_name_ = nullptr;
std::string* HubBinaryTest::escapes_name_ = nullptr;
size_t HubBinaryTest::big_size_ = 0;
TestServer* HubBinaryTest::server_ = nullptr;

TEST_F(HubBinaryTest, FetchListHelp) {
  Result r = Run("fetch alice/models");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, *base_ + "/hub/alice_models_main\n");
  EXPECT_EQ(r.err, "");  // no terminal: no progress bar
  r = Run("list alice/models");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "tiny\ncnn\n");
  r = Run("help alice/models cnn");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "A small CNN.\n");
  r = Run("list " + *base_ + "/hub/alice_models_main --local");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "tiny\ncnn\n");
}

TEST_F(HubBinaryTest, FailuresGoToStderrWithStatusOne) {
  Result r = Run("help alice/models nope");
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_THAT(r.err, HasSubstr("cannot find callable nope"));
  EXPECT_THAT(r.err, HasSubstr("tiny, cnn"));
  r = Run("fetch bob/missing");
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("neither a master nor a main branch"));
  r = Run("fetch alice/models:0123abcdef");
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("looks like a commit"));
}

TEST_F(HubBinaryTest, UsageErrorsExitTwo) {
  EXPECT_EQ(Run("").code, 2);
  Result r = Run("frobnicate x/y");
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("unknown command 'frobnicate'"));
  EXPECT_THAT(r.err, HasSubstr("usage: hub fetch"));
  EXPECT_EQ(Run("list a/b --bogus").code, 2);
  EXPECT_EQ(Run("help a/b").code, 2);
}

TEST_F(HubBinaryTest, Weights) {
  Result r = Run("weights " + server_->url("/w/" + *name_) + " --check-hash");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr(*base_ + "/hub/checkpoints/" + *name_ + "\n"));
  EXPECT_THAT(r.out, HasSubstr("linear.weight float32 [4, 3]\n"));
  EXPECT_THAT(r.out, HasSubstr("bn.num_batches_tracked int64 []\n"));
  r = Run("weights " + server_->url("/w/missing-01234567.pt"));
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("HTTP 404"));
}

TEST_F(HubBinaryTest, RepositoryTextIsPrintedEscaped) {
  Result r = Run("help mallory/docs m");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "line one\\x1b]0;pwned\\x07\nline two\\x0dhidden\n");
  r = Run("list mallory/names");
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_THAT(r.err, HasSubstr("entry point name '../../x\\x1b[2J' is not an identifier"));
  EXPECT_EQ(r.err.find('\x1b'), std::string::npos);
  r = Run("weights " + server_->url("/w/" + *escapes_name_) + " --check-hash");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("w\\x1b[2J float32 [2]\n"));
  EXPECT_EQ(r.out.find('\x1b'), std::string::npos);
}

TEST_F(HubBinaryTest, WeightsNamesUnsupportedSchemesAndLeavesNoLockFiles) {
  const std::string dir = *base_ + "/schemes";
  Result r = Run("weights ftp://127.0.0.1/x-01234567.pt --model-dir " + dir);
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("unsupported URL scheme 'ftp'"));
  EXPECT_THAT(r.err, Not(HasSubstr("redirect")));
  r = Run("weights " + server_->url("/w/" + *name_) + " --model-dir " + dir);
  EXPECT_EQ(r.code, 0) << r.err;
  r = Run("weights " + server_->url("/w/missing-01234567.pt") + " --model-dir " + dir);
  EXPECT_EQ(r.code, 1);
  std::vector<std::string> left;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    left.push_back(e.path().filename());
  EXPECT_THAT(left, ::testing::ElementsAre(*name_));  // the checkpoint, no .lock files
}

// What a user watching a long download sees: one line, rewritten with '\r',
// naming the file and its size, ending at 100% and a newline; stdout gets
// only the results.
TEST_F(HubBinaryTest, ProgressBarOnATerminal) {
  std::string dir = *base_ + "/tty_models";
  Result r = RunOnTerminal(
      {"weights", server_->url("/slow/w/" + *big_name_), "--check-hash", "--model-dir", dir});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, dir + "/" + *big_name_ + "\nw float32 [250000]\n");
  // Rewritten in place: several draws, one newline, at the very end.
  EXPECT_GE(std::count(r.err.begin(), r.err.end(), '\r'), 3) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  ASSERT_FALSE(r.err.empty());
  EXPECT_EQ(r.err.back(), '\n');
  EXPECT_EQ(r.err.front(), '\r');
  // Every draw names the file; the last one is complete.
  std::string last = r.err.substr(r.err.rfind('\r') + 1);
  EXPECT_EQ(big_size_ / 100000, 10u);  // 1.0 MB, as the bar rounds it
  EXPECT_EQ(last, *big_name_ + ": 100%|" + std::string(25, '#') + "| 1.0/1.0 MB\n");
  size_t draws = std::count(r.err.begin(), r.err.end(), '\r');
  size_t named = 0;
  for (size_t at = r.err.find('\r' + *big_name_ + ": "); at != std::string::npos;
       at = r.err.find('\r' + *big_name_ + ": ", at + 1))
    ++named;
  EXPECT_EQ(named, draws);
  // Some draw showed the download part-way.
  EXPECT_THAT(r.err, ::testing::ContainsRegex("\r[^\r]*: +[1-9][0-9]?%\\|"));
  EXPECT_EQ(r.out.find('\r'), std::string::npos);
  EXPECT_EQ(r.out.find('%'), std::string::npos);
}

// There is no size threshold (hub/README.md): a small file on a terminal
// gets the same bar, complete; --no-progress silences it; errors still show.
TEST_F(HubBinaryTest, SmallDownloadOnATerminal) {
  std::string dir = *base_ + "/tty_small";
  Result r = RunOnTerminal({"weights", server_->url("/w/" + *name_), "--model-dir", dir});
  ASSERT_EQ(r.code, 0) << r.err;
  // Its size in kB, one decimal, so a small file does not read "0.0 MB".
  size_t size = ReadFile("serialization/testdata/tensors.pt")->size();
  ASSERT_LT(size, 1000000u);
  char kb[32];
  std::snprintf(kb, sizeof kb, "%.1f/%.1f kB", size / 1e3, size / 1e3);
  EXPECT_THAT(r.err,
              ::testing::EndsWith(*name_ + ": 100%|" + std::string(25, '#') + "| " + kb + "\n"));
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_THAT(r.out, HasSubstr(dir + "/" + *name_ + "\n"));

  r = RunOnTerminal({"weights", server_->url("/w/" + *name_), "--model-dir", *base_ + "/tty_quiet",
                     "--no-progress"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err, "");

  // A 404 draws no bar for its error page; the error names the URL.
  r = RunOnTerminal({"weights", server_->url("/w/missing-01234567.pt"), "--model-dir", dir});
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err.find('%'), std::string::npos) << r.err;
  EXPECT_THAT(r.err, HasSubstr("/w/missing-01234567.pt"));
  EXPECT_THAT(r.err, HasSubstr("HTTP 404"));
}

TEST_F(HubBinaryTest, NetworkFailureExitsOne) {
  // A port nothing listens on: connection refused, after the retries.
  Result r = Run("weights https://127.0.0.1:1/w/x-01234567.pt --model-dir " + *base_ + "/netfail");
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_THAT(r.err, HasSubstr("https://127.0.0.1:1/w/x-01234567.pt"));
  EXPECT_THAT(r.err, HasSubstr("after 3 attempts"));
}

TEST_F(HubBinaryTest, HashMismatchExitsOneAndKeepsFiles) {
  // Served under a name whose hash digits are wrong: nothing is cached.
  std::string weights = *ReadFile("serialization/testdata/tensors.pt");
  ASSERT_TRUE(WriteFile(*base_ + "/www/w/bad-00000000.pt", weights).ok());
  std::string dir = *base_ + "/mismatch";
  Result r =
      Run("weights " + server_->url("/w/bad-00000000.pt") + " --check-hash --model-dir " + dir);
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_THAT(r.err, HasSubstr(server_->url("/w/bad-00000000.pt")));
  EXPECT_THAT(r.err, HasSubstr("'00000000'"));
  EXPECT_THAT(r.err, HasSubstr(sha256_hex(weights)));
  EXPECT_FALSE(std::filesystem::exists(dir + "/bad-00000000.pt"));

  // A cached file that no longer matches its name is reported and left alone.
  ASSERT_TRUE(WriteFile(dir + "/old-00000000.pt", "old contents").ok());
  r = Run("weights " + server_->url("/w/old-00000000.pt") + " --check-hash --model-dir " + dir);
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr(dir + "/old-00000000.pt"));
  EXPECT_THAT(r.err, HasSubstr("'00000000'"));
  EXPECT_EQ(*ReadFile(dir + "/old-00000000.pt"), "old contents");
}

}  // namespace
}  // namespace ember::hub
