// launch --nnodes=MIN:MAX end to end on one host: three launchers (three
// "nodes", one worker each) train examples/elastic_train together; one
// launcher is SIGKILLed mid-training and the other two go on in a new round;
// a fourth launcher started later joins the round after; the job finishes
// with its steps continuing from the checkpoint. With MIN=2, killing two of
// three leaves the last one failing with a message that names the
// rendezvous and MIN.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "distributed/testing/free_port.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ember::launch {
namespace {

using ::testing::HasSubstr;

std::string Runfile(const std::string& path) {
  return absl::StrCat(std::getenv("TEST_SRCDIR"), "/", std::getenv("TEST_WORKSPACE"), "/", path);
}

std::string Tmp(const std::string& name) {
  return absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// One launcher ("node") of the job, its output in `log`.
struct Node {
  pid_t pid = -1;
  std::string log;
};

Node StartNode(const std::string& name, int port, const std::string& nnodes,
               const std::string& job, int steps) {
  Node node{.log = Tmp(absl::StrCat(job, "_", name, ".log"))};
  std::vector<std::string> argv = {
      Runfile("tools/launch/launch"),
      "--nproc_per_node=1",
      absl::StrCat("--nnodes=", nnodes),
      absl::StrCat("--rdzv_endpoint=127.0.0.1:", port),
      absl::StrCat("--rdzv_id=", job),
      "--rdzv_conf=join_timeout=15,last_call_timeout=1,heartbeat_timeout=2",
      "--monitor_interval=0.2",
      "--max_restarts=3",
      Runfile("examples/elastic_train"),
      absl::StrCat("--steps=", steps),
      "--save_every=5",
      "--step_delay_ms=40",
      absl::StrCat("--checkpoint=", Tmp(job + ".ckpt")),
      absl::StrCat("--log=", Tmp(job + "_steps.txt")),
  };
  node.pid = fork();
  if (node.pid == 0) {
    int fd = open(node.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    std::vector<char*> args;
    for (std::string& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  return node;
}

// The node's exit code (-1 after `timeout`, when it is killed).
int Wait(const Node& node, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  int status = 0;
  while (waitpid(node.pid, &status, WNOHANG) == 0) {
    if (absl::Now() >= deadline) {
      kill(node.pid, SIGKILL);
      waitpid(node.pid, &status, 0);
      return -1;
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Waits until `path` contains `text`; false after `timeout`.
bool WaitFor(const std::string& path, const std::string& text, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (ReadFile(path).find(text) != std::string::npos) return true;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return false;
}

struct StepLine {
  int round = 0, world = 0, step = 0;
};
// elastic_train's --log lines: "round R world W step S loss L".
std::vector<StepLine> Steps(const std::string& path) {
  std::vector<StepLine> out;
  for (absl::string_view line : absl::StrSplit(ReadFile(path), '\n', absl::SkipEmpty())) {
    std::vector<std::string> f = absl::StrSplit(line, ' ');
    StepLine s;
    if (f.size() >= 6 && absl::SimpleAtoi(f[1], &s.round) && absl::SimpleAtoi(f[3], &s.world) &&
        absl::SimpleAtoi(f[5], &s.step)) {
      out.push_back(s);
    }
  }
  return out;
}

TEST(ElasticLaunchTest, ALostNodeAndANewNodeEachStartARoundAndTrainingGoesOn) {
  const int port = distributed::testing::FreePort();
  const std::string job = "grow";
  std::vector<Node> nodes;
  for (int i = 0; i < 3; ++i) nodes.push_back(StartNode(absl::StrCat("n", i), port, "2:3", job, 400));
  const std::string steps = Tmp(job + "_steps.txt");
  ASSERT_TRUE(WaitFor(steps, "round 0 world 3 step 30", absl::Seconds(60)))
      << ReadFile(nodes[0].log);
  // A launcher that is not the endpoint's (nodes[0] binds first only by
  // chance, so pick one whose log does not say it serves).
  size_t victim = 0;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (ReadFile(nodes[i].log).find("(served here)") == std::string::npos) victim = i;
  }
  kill(nodes[victim].pid, SIGKILL);
  waitpid(nodes[victim].pid, nullptr, 0);
  const absl::Time killed = absl::Now();
  // The others form round 1 of two nodes within the heartbeat timeout + 5 s.
  ASSERT_TRUE(WaitFor(steps, "world 2", absl::Seconds(2 + 5) + absl::Seconds(10)))
      << ReadFile(nodes[(victim + 1) % 3].log);
  const absl::Duration to_training = absl::Now() - killed;
  std::printf("from a node's death to training again: %.1f s\n", absl::ToDoubleSeconds(to_training));
  // A new node joins the next round.
  const absl::Time started = absl::Now();
  Node late = StartNode("late", port, "2:3", job, 400);
  ASSERT_TRUE(WaitFor(late.log, "world size 3", absl::Seconds(30))) << ReadFile(late.log);
  // Its first step: a step of a round after the two-node one, with 3 ranks.
  int two_node_round = -1;
  for (const StepLine& s : Steps(steps)) {
    if (s.world == 2) two_node_round = std::max(two_node_round, s.round);
  }
  bool trained = false;
  while (!trained && absl::Now() - started < absl::Seconds(30)) {
    for (const StepLine& s : Steps(steps)) trained |= s.world == 3 && s.round > two_node_round;
    if (!trained) absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_TRUE(trained) << ReadFile(steps);
  std::printf("from a new node's start to its first step: %.1f s\n",
              absl::ToDoubleSeconds(absl::Now() - started));
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (i != victim) {
      EXPECT_EQ(Wait(nodes[i], absl::Seconds(120)), 0) << ReadFile(nodes[i].log);
    }
  }
  EXPECT_EQ(Wait(late, absl::Seconds(120)), 0) << ReadFile(late.log);
  // Every round resumed at or before where the previous one stopped (the
  // last checkpoint), never from the start, and the job reached its end.
  std::vector<StepLine> lines = Steps(steps);
  ASSERT_FALSE(lines.empty());
  std::map<int, std::pair<int, int>> first_last;  // round -> first and last step
  for (const StepLine& s : lines) {
    auto [it, fresh] = first_last.try_emplace(s.round, s.step, s.step);
    if (!fresh) it->second.second = s.step;
  }
  EXPECT_GE(first_last.size(), 3u);
  int previous_last = 0;
  for (const auto& [round, span] : first_last) {
    EXPECT_LE(span.first, previous_last + 1) << "round " << round;
    EXPECT_GE(span.first, previous_last - 5) << "round " << round << " lost more than a checkpoint";
    previous_last = span.second;
  }
  EXPECT_EQ(lines.back().step, 400);
}

TEST(ElasticLaunchTest, BelowMinTheLastNodeFailsNamingTheRendezvousAndMin) {
  const int port = distributed::testing::FreePort();
  const std::string job = "shrink";
  std::vector<Node> nodes;
  for (int i = 0; i < 3; ++i) nodes.push_back(StartNode(absl::StrCat("n", i), port, "2:3", job, 100000));
  ASSERT_TRUE(WaitFor(Tmp(job + "_steps.txt"), "round 0 world 3 step 10", absl::Seconds(60)));
  // Kill two that do not serve the endpoint.
  std::vector<size_t> victims;
  size_t survivor = 0;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (ReadFile(nodes[i].log).find("(served here)") == std::string::npos) {
      victims.push_back(i);
    } else {
      survivor = i;
    }
  }
  ASSERT_EQ(victims.size(), 2u);
  for (size_t v : victims) {
    kill(nodes[v].pid, SIGKILL);
    waitpid(nodes[v].pid, nullptr, 0);
  }
  EXPECT_EQ(Wait(nodes[survivor], absl::Seconds(60)), 1);
  const std::string out = ReadFile(nodes[survivor].log);
  EXPECT_THAT(out, HasSubstr("elastic rendezvous 'shrink'"));
  EXPECT_THAT(out, HasSubstr("needs at least 2"));
}

}  // namespace
}  // namespace ember::launch
