// Two "hosts" on one machine: two network namespaces joined by a veth pair.
// A launcher runs in each (--nnodes=2, --nproc_per_node=2) and the four
// workers all_reduce across them through the tcp backend, so the traffic
// between the hosts crosses the veth link. Needs root and iproute2's `ip`;
// skips with a message where namespaces cannot be made. A second case
// rendezvous by IP multicast across the two hosts, ranks assigned. Then
// post-mortems across the hosts (a rank on the second host stalled,
// stopped, killed, or passing another size; tcp and gloo), and an elastic
// job that loses a host.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace ember::launch {
namespace {

std::string Runfile(const std::string& path) {
  return absl::StrCat(std::getenv("TEST_SRCDIR"), "/", std::getenv("TEST_WORKSPACE"), "/", path);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::optional<std::string> FindIp() {
  for (const char* path : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
    if (access(path, X_OK) == 0) return std::string(path);
  }
  return std::nullopt;
}

// Starts `argv` with stdout and stderr to `log`.
pid_t Spawn(std::vector<std::string> argv, const std::string& log) {
  pid_t pid = fork();
  if (pid == 0) {
    int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    std::vector<char*> args;
    for (std::string& arg : argv) args.push_back(arg.data());
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  return pid;
}

// Exit code of `pid`, waiting up to `timeout` (-1 and SIGKILL after that).
int Wait(pid_t pid, absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (absl::Now() >= deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Runs `argv` to completion; its exit code and output.
std::pair<int, std::string> Run(const std::vector<std::string>& argv) {
  std::string log = absl::StrCat(std::getenv("TEST_TMPDIR"), "/cmd.log");
  int code = Wait(Spawn(argv, log), absl::Seconds(20));
  return {code, ReadFile(log)};
}

// Two namespaces and the veth between them; removed on destruction.
class TwoHosts {
 public:
  TwoHosts(std::string ip) : ip_(std::move(ip)) {
    int id = getpid() % 60000;
    names_ = {absl::StrCat("emb", id, "a"), absl::StrCat("emb", id, "b")};
    addresses_ = {absl::StrCat("10.", 200 + id % 50, ".", id % 250, ".1"),
                  absl::StrCat("10.", 200 + id % 50, ".", id % 250, ".2")};
  }
  ~TwoHosts() {
    for (const std::string& name : created_) Run({ip_, "netns", "del", name});
  }

  // An empty string, or why the namespaces could not be made.
  std::string SetUp() {
    for (const std::string& name : names_) {
      auto [code, out] = Run({ip_, "netns", "add", name});
      if (code != 0) return absl::StrCat("`ip netns add ", name, "` failed: ", out);
      created_.push_back(name);
    }
    std::string veth_a = names_[0] + "v", veth_b = names_[1] + "v";
    std::vector<std::vector<std::string>> steps = {
        {ip_, "link", "add", veth_a, "type", "veth", "peer", "name", veth_b},
        {ip_, "link", "set", veth_a, "netns", names_[0]},
        {ip_, "link", "set", veth_b, "netns", names_[1]},
        {ip_, "-n", names_[0], "addr", "add", addresses_[0] + "/24", "dev", veth_a},
        {ip_, "-n", names_[1], "addr", "add", addresses_[1] + "/24", "dev", veth_b},
        {ip_, "-n", names_[0], "link", "set", veth_a, "up"},
        {ip_, "-n", names_[1], "link", "set", veth_b, "up"},
        {ip_, "-n", names_[0], "link", "set", "lo", "up"},
        {ip_, "-n", names_[1], "link", "set", "lo", "up"},
    };
    for (const auto& step : steps) {
      auto [code, out] = Run(step);
      if (code != 0) return absl::StrCat("`", absl::StrJoin(step, " "), "` failed: ", out);
    }
    return "";
  }

  // Routes multicast out of the veth link in both namespaces.
  std::string AddMulticastRoutes() {
    for (int host = 0; host < 2; ++host) {
      auto [code, out] = Run({ip_, "-n", names_[host], "route", "add", "224.0.0.0/4", "dev", names_[host] + "v"});
      if (code != 0) return absl::StrCat("adding a multicast route failed: ", out);
    }
    return "";
  }

  // Bytes sent over the veth end of `host` so far.
  int64_t TxBytes(int host) const {
    auto [code, out] = Run({ip_, "netns", "exec", names_[host], "cat",
                            absl::StrCat("/sys/class/net/", names_[host], "v/statistics/tx_bytes")});
    return code == 0 ? std::atoll(out.c_str()) : -1;
  }

  const std::string& ip() const { return ip_; }
  const std::string& name(int host) const { return names_[host]; }
  const std::string& address(int host) const { return addresses_[host]; }

 private:
  std::string ip_;
  std::vector<std::string> names_, addresses_, created_;
};

// Makes the two hosts, or says why not (then the caller skips).
std::string MakeHosts(std::unique_ptr<TwoHosts>& hosts) {
  if (geteuid() != 0) return "network namespaces need root; run this test as root to cover two hosts";
  std::optional<std::string> ip = FindIp();
  if (!ip) return "iproute2's `ip` is not installed (apt-get install iproute2)";
  hosts = std::make_unique<TwoHosts>(*ip);
  if (std::string problem = hosts->SetUp(); !problem.empty()) {
    return absl::StrCat("cannot make network namespaces here (", problem,
                        "); the test needs root outside a sandbox (it is tagged no-sandbox)");
  }
  return "";
}

// Runs `launch --nnodes=2 --nproc_per_node=2` in each namespace with the
// worker and `worker_args`, and checks all four ranks reduced correctly over
// the veth link.
void RunTwoNodes(const TwoHosts& hosts, const std::vector<std::string>& worker_args) {
  std::vector<pid_t> launchers;
  std::vector<std::string> logs;
  const int64_t tx_before[2] = {hosts.TxBytes(0), hosts.TxBytes(1)};
  for (int node = 0; node < 2; ++node) {
    logs.push_back(absl::StrCat(std::getenv("TEST_TMPDIR"), "/node", node, ".log"));
    std::vector<std::string> argv = {hosts.ip(), "netns", "exec", hosts.name(node), Runfile("tools/launch/launch"),
                                     "--nnodes=2", absl::StrCat("--node_rank=", node), "--nproc_per_node=2",
                                     "--master_addr=" + hosts.address(0), "--master_port=29500", "--use_env",
                                     Runfile("tools/launch/multihost_worker")};
    argv.insert(argv.end(), worker_args.begin(), worker_args.end());
    launchers.push_back(Spawn(argv, logs.back()));
  }
  for (int node = 0; node < 2; ++node) {
    EXPECT_EQ(Wait(launchers[node], absl::Seconds(90)), 0) << "node " << node << ":\n" << ReadFile(logs[node]);
  }
  // The reduced data crossed the link both ways (4 ranks x 16 KiB).
  EXPECT_GT(hosts.TxBytes(0) - tx_before[0], 16 * 1024);
  EXPECT_GT(hosts.TxBytes(1) - tx_before[1], 16 * 1024);
  std::string all = ReadFile(logs[0]) + ReadFile(logs[1]);
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_NE(all.find(absl::StrCat("rank ", rank, " of 4: all_reduce gave 10")), std::string::npos) << all;
  }
}

TEST(MultiHostTest, AllReduceAcrossTwoNetworkNamespaces) {
  std::unique_ptr<TwoHosts> hosts;
  if (std::string why = MakeHosts(hosts); !why.empty()) GTEST_SKIP() << why;
  RunTwoNodes(*hosts, {});  // env://, as launch sets it
}

TEST(MultiHostTest, MulticastRendezvousAssignsRanksAcrossHosts) {
  std::unique_ptr<TwoHosts> hosts;
  if (std::string why = MakeHosts(hosts); !why.empty()) GTEST_SKIP() << why;
  if (std::string why = hosts->AddMulticastRoutes(); !why.empty()) GTEST_SKIP() << why;
  RunTwoNodes(*hosts, {"tcp://239.255.77.1:29600"});
}

// Post-mortems across hosts: two launchers (one per namespace, 2 ranks
// each, a 3 s timeout) run post_mortem_worker, and rank 3, on node 1, does
// `fault` where all_reduce #3 is due. Returns each node's launcher output;
// both launchers must fail.
struct NodeLogs {
  std::string node0, node1;
};
NodeLogs RunFaultOnTwoHosts(const TwoHosts& hosts, const std::string& backend,
                            const std::string& fault, int port) {
  std::vector<pid_t> launchers;
  std::vector<std::string> logs;
  for (int node = 0; node < 2; ++node) {
    logs.push_back(
        absl::StrCat(std::getenv("TEST_TMPDIR"), "/pm_", backend, "_", fault, "_node", node, ".log"));
    // gloo takes the address of the veth link, which the host name need not resolve to.
    launchers.push_back(Spawn(
        {hosts.ip(), "netns", "exec", hosts.name(node), "/usr/bin/env",
         absl::StrCat("GLOO_SOCKET_IFNAME=", hosts.name(node), "v"), Runfile("tools/launch/launch"),
         "--nnodes=2", absl::StrCat("--node_rank=", node), "--nproc_per_node=2",
         "--master_addr=" + hosts.address(0), absl::StrCat("--master_port=", port), "--use_env",
         "--serve_store", Runfile("tools/launch/post_mortem_worker"), "--backend=" + backend,
         "--fault=" + fault, "--fault_rank=3"},
        logs.back()));
  }
  for (int node = 0; node < 2; ++node) {
    EXPECT_NE(Wait(launchers[node], absl::Seconds(90)), 0) << ReadFile(logs[node]);
  }
  return {ReadFile(logs[0]), ReadFile(logs[1])};
}

// Rank 3 stays in its own code before all_reduce #3. Node 0's ranks time out
// and their error's desync report, read from the store, names rank 3 and its
// last collective; node 1's launcher names rank 3 from its own dumps.
TEST(MultiHostTest, AStalledRankOnTheOtherHostIsNamed) {
  std::unique_ptr<TwoHosts> hosts;
  if (std::string why = MakeHosts(hosts); !why.empty()) GTEST_SKIP() << why;
  NodeLogs logs = RunFaultOnTwoHosts(*hosts, "tcp", "skip", 29501);
  EXPECT_NE(logs.node0.find("desync report: rank 3 is behind: its last collective is #2 all_reduce"),
            std::string::npos)
      << logs.node0;
  EXPECT_NE(logs.node1.find("root cause: rank 3 (flight recorder): all_reduce #3 (group 0, 32 B "
                            "float32): rank 2 entered it; rank 3 never did"),
            std::string::npos)
      << logs.node1;
}

// The same over gloo.
TEST(MultiHostTest, AStalledRankOnTheOtherHostIsNamedOverGloo) {
  std::unique_ptr<TwoHosts> hosts;
  if (std::string why = MakeHosts(hosts); !why.empty()) GTEST_SKIP() << why;
  NodeLogs logs = RunFaultOnTwoHosts(*hosts, "gloo", "skip", 29502);
  EXPECT_NE(logs.node0.find("all_reduce (collective #3): timed out waiting for rank 3"),
            std::string::npos)
      << logs.node0;
  EXPECT_NE(logs.node0.find("desync report: rank 3 is behind: its last collective is #2 all_reduce"),
            std::string::npos)
      << logs.node0;
  EXPECT_NE(logs.node1.find("root cause: rank 3 (flight recorder): all_reduce #3 (group 0, 32 B "
                            "float32): rank 2 entered it; rank 3 never did"),
            std::string::npos)
      << logs.node1;
}

// Rank 3 is SIGSTOPped: node 0's desync report names it (where it got to
// depends on whether its last progress was published before it stopped,
// Note [Desync reports]); node 1's launcher reports it stopped.
TEST(MultiHostTest, AStoppedRankOnTheOtherHostIsNamed) {
  std::unique_ptr<TwoHosts> hosts;
  if (std::string why = MakeHosts(hosts); !why.empty()) GTEST_SKIP() << why;
  NodeLogs logs = RunFaultOnTwoHosts(*hosts, "tcp", "sigstop", 29503);
  EXPECT_NE(logs.node0.find("desync report: rank 3 "), std::string::npos) << logs.node0;
  EXPECT_NE(logs.node1.find("stopped (SIGSTOP or a debugger)"), std::string::npos) << logs.node1;
  EXPECT_NE(logs.node1.find("rank 3"), std::string::npos) << logs.node1;
}

// Rank 3 is SIGKILLed: node 0's ranks lose it and say so; node 1's launcher
// puts rank 3 first.
TEST(MultiHostTest, AKilledRankOnTheOtherHostIsNamed) {
  std::unique_ptr<TwoHosts> hosts;
  if (std::string why = MakeHosts(hosts); !why.empty()) GTEST_SKIP() << why;
  NodeLogs logs = RunFaultOnTwoHosts(*hosts, "tcp", "sigkill", 29504);
  EXPECT_NE(logs.node0.find("all_reduce (collective #3): lost rank 3"), std::string::npos)
      << logs.node0;
  EXPECT_NE(logs.node1.find("root cause: rank 3"), std::string::npos) << logs.node1;
}

// Rank 3 passes twice the elements: the call check (Note [Call checks])
// fails every rank at once, and node 0's ranks name rank 3's call.
TEST(MultiHostTest, AnotherSizeOnTheOtherHostIsNamed) {
  std::unique_ptr<TwoHosts> hosts;
  if (std::string why = MakeHosts(hosts); !why.empty()) GTEST_SKIP() << why;
  NodeLogs logs = RunFaultOnTwoHosts(*hosts, "tcp", "other_size", 29505);
  EXPECT_NE(logs.node0.find("mismatched collectives: all_reduce (collective #3): rank 3 ran "
                            "all_reduce of 64 B float32 (SUM) but this rank (0) ran all_reduce of "
                            "32 B float32 (SUM)"),
            std::string::npos)
      << logs.node0;
  EXPECT_NE(logs.node1.find("rank 3 ran all_reduce of 64 B float32"), std::string::npos)
      << logs.node1;
}

// An elastic job across the two hosts: two launchers on host 0 (one serves
// the rendezvous endpoint) and one on host 1, --nnodes=2:3. Host 1's launcher
// is SIGKILLed mid-training: the two on host 0 go on in a new round; a new
// launcher on host 1 then joins the next round, and the job finishes.
TEST(MultiHostTest, ElasticNodesAcrossHostsSurviveALossAndAdmitANewNode) {
  std::unique_ptr<TwoHosts> hosts;
  if (std::string why = MakeHosts(hosts); !why.empty()) GTEST_SKIP() << why;
  const std::string dir = std::getenv("TEST_TMPDIR");
  const std::string steps = dir + "/elastic_steps.txt";
  auto start = [&](int host, const std::string& name) {
    std::vector<std::string> argv = {
        hosts->ip(), "netns", "exec", hosts->name(host), Runfile("tools/launch/launch"),
        "--nproc_per_node=1", "--nnodes=2:3",
        absl::StrCat("--rdzv_endpoint=", hosts->address(0), ":29410"), "--rdzv_id=mh",
        "--rdzv_conf=join_timeout=30,last_call_timeout=1,heartbeat_timeout=2",
        "--monitor_interval=0.2", "--max_restarts=3", "--local_addr=" + hosts->address(host),
        Runfile("examples/elastic_train"), "--steps=300", "--save_every=5", "--step_delay_ms=40",
        "--checkpoint=" + dir + "/elastic.pt", "--log=" + steps};
    return std::make_pair(Spawn(argv, dir + "/elastic_" + name + ".log"),
                          dir + "/elastic_" + name + ".log");
  };
  auto a0 = start(0, "a0");
  absl::SleepFor(absl::Milliseconds(300));  // the endpoint's server first
  auto a1 = start(0, "a1");
  auto b0 = start(1, "b0");
  auto wait_for = [&](const std::string& path, const std::string& text, absl::Duration d) {
    const absl::Time until = absl::Now() + d;
    while (absl::Now() < until) {
      if (ReadFile(path).find(text) != std::string::npos) return true;
      absl::SleepFor(absl::Milliseconds(50));
    }
    return false;
  };
  ASSERT_TRUE(wait_for(steps, "world 3 step 20", absl::Seconds(60))) << ReadFile(a0.second);
  kill(b0.first, SIGKILL);
  Wait(b0.first, absl::Seconds(5));
  ASSERT_TRUE(wait_for(steps, "world 2 step", absl::Seconds(2 + 5) + absl::Seconds(10)))
      << ReadFile(a0.second);
  auto b1 = start(1, "b1");
  ASSERT_TRUE(wait_for(b1.second, "world size 3", absl::Seconds(30))) << ReadFile(b1.second);
  EXPECT_EQ(Wait(a0.first, absl::Seconds(120)), 0) << ReadFile(a0.second);
  EXPECT_EQ(Wait(a1.first, absl::Seconds(120)), 0) << ReadFile(a1.second);
  EXPECT_EQ(Wait(b1.first, absl::Seconds(120)), 0) << ReadFile(b1.second);
  EXPECT_NE(ReadFile(steps).find("step 300 "), std::string::npos);
}

}  // namespace
}  // namespace ember::launch
