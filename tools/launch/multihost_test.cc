// Two "hosts" on one machine: two network namespaces joined by a veth pair.
// A launcher runs in each (--nnodes=2, --nproc_per_node=2) and the four
// workers all_reduce across them through the tcp backend, so the traffic
// between the hosts crosses the veth link. Needs root and iproute2's `ip`;
// skips with a message where namespaces cannot be made. A second case
// rendezvous by IP multicast across the two hosts, ranks assigned. Then
// post-mortems across the hosts (a rank on the second host stalled,
// stopped, killed, or passing another size; tcp and gloo), the same for an
// mpi job at 2 and 4 ranks (mpirun on host 0 reaching host 1 through a
// launch agent in ssh's place), and an elastic job that loses a host.
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
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
    for (const std::string& path : files_) std::remove(path.c_str());
    for (const std::string& name : created_) rmdir(absl::StrCat("/etc/netns/", name).c_str());
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

  // Names each namespace's host after the namespace in an /etc/hosts of its
  // own (`ip netns exec` mounts /etc/netns/<name>/hosts over /etc/hosts), as
  // a cluster's DNS would: a program that runs with the namespace's name as
  // its host name (unshare --uts) finds the other host by name.
  std::string AddHostNames() {
    const std::string hosts = absl::StrCat("127.0.0.1 localhost\n", addresses_[0], " ", names_[0],
                                           "\n", addresses_[1], " ", names_[1], "\n");
    for (const std::string& name : names_) {
      const std::string dir = absl::StrCat("/etc/netns/", name);
      mkdir("/etc/netns", 0755);
      if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
        return absl::StrCat("cannot create ", dir, ": ", strerror(errno));
      }
      files_.push_back(dir + "/hosts");
      std::ofstream out(files_.back());
      out << hosts;
      if (!out.good()) return absl::StrCat("cannot write ", files_.back());
    }
    return "";
  }

  // The subnet of the veth link, for Open MPI's *_if_include.
  std::string Subnet() const { return addresses_[0].substr(0, addresses_[0].rfind('.')) + ".0/24"; }

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
  std::vector<std::string> names_, addresses_, created_, files_;
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

// Rank 3 is SIGKILLed: node 0's ranks lose it and say so, whether a rank
// noticed while receiving from rank 3 or while sending to it; node 1's
// launcher puts rank 3 first.
TEST(MultiHostTest, AKilledRankOnTheOtherHostIsNamed) {
  std::unique_ptr<TwoHosts> hosts;
  if (std::string why = MakeHosts(hosts); !why.empty()) GTEST_SKIP() << why;
  NodeLogs logs = RunFaultOnTwoHosts(*hosts, "tcp", "sigkill", 29504);
  const bool lost_receiving =
      logs.node0.find("all_reduce (collective #3): lost rank 3 (") != std::string::npos;
  const bool lost_sending = logs.node0.find("all_reduce (collective #3): sending to rank 3 (") !=
                                std::string::npos &&
                            logs.node0.find("): lost rank 3 (") != std::string::npos;
  EXPECT_TRUE(lost_receiving || lost_sending) << logs.node0;
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

// --- mpi across the two hosts ----------------------------------------------------------
// mpirun runs on host 0 and reaches host 1 through a launch agent (Open
// MPI's plm_rsh_agent, ssh's place) that enters host 1's namespace; each
// host runs under its own name (unshare --uts; AddHostNames), so Open MPI
// keeps the hosts apart and the ranks on host 1 find the group's store on
// rank 0's host by name (Note [mpi's store]). Open MPI's TCP (its own
// wire-up and the ranks' traffic) is pinned to the veth link. The ranks run
// distributed/mpi:fault_worker with a 3 s timeout; the faulty rank is the
// last one, on host 1.

std::optional<std::string> FindProgram(const char* name) {
  for (const char* dir : {"/usr/bin/", "/bin/", "/usr/sbin/", "/usr/local/bin/"}) {
    const std::string path = absl::StrCat(dir, name);
    if (access(path.c_str(), X_OK) == 0) return path;
  }
  return std::nullopt;
}

struct MpiJob {
  int exit_code = -1;
  std::string output;  // mpirun's and the ranks'
  std::string dumps;   // the directory of the ranks' flight recorder dumps
};

// Runs an mpirun job of `ranks` ranks (half on each host) of fault_worker
// with `fault`; `mpirun_args` and `env` (NAME=VALUE, passed to the ranks)
// are added.
MpiJob RunMpiOnTwoHosts(const TwoHosts& hosts, const std::string& mpirun, int ranks,
                        const std::string& fault, const std::vector<std::string>& mpirun_args = {},
                        const std::vector<std::string>& env = {}) {
  const std::string tmp = std::getenv("TEST_TMPDIR");
  const std::string name = absl::StrCat("mpi_", fault, "_", ranks, "_", mpirun_args.size());
  MpiJob job;
  job.dumps = absl::StrCat(tmp, "/", name, "_dumps");
  mkdir(job.dumps.c_str(), 0755);
  const std::string agent = absl::StrCat(tmp, "/mpi_agent.sh");
  {
    // ssh's place: "<agent> <host> <command...>"; the host's namespace and
    // name, then the command through a shell, as ssh runs it.
    std::ofstream out(agent);
    out << "#!/bin/sh\n"
        << "case \"$1\" in\n  " << hosts.name(0) << "|" << hosts.name(1) << ") ;;\n"
        << "  *) echo \"mpi_agent.sh: no host '$1'\" >&2; exit 1 ;;\nesac\n"
        << "host=$1\nshift\n"
        << "exec " << hosts.ip() << " netns exec \"$host\" unshare --uts /bin/sh -c "
        << "'hostname \"$0\" && exec /bin/sh -c \"$1\"' \"$host\" \"$*\"\n";
  }
  chmod(agent.c_str(), 0755);
  const std::string hostfile = absl::StrCat(tmp, "/mpi_hosts");
  {
    std::ofstream out(hostfile);
    out << hosts.name(0) << " slots=" << ranks / 2 << "\n"
        << hosts.name(1) << " slots=" << ranks / 2 << "\n";
  }
  char shm[] = "/tmp/ember-mh-XXXXXX";  // vader's segments, this job's own
  if (mkdtemp(shm) == nullptr) return job;
  std::vector<std::string> argv = {
      hosts.ip(), "netns", "exec", hosts.name(0), "unshare", "--uts", "/bin/sh", "-c",
      "hostname \"$0\" && exec \"$@\"", hosts.name(0), mpirun, "--allow-run-as-root", "-np",
      absl::StrCat(ranks), "--hostfile", hostfile, "--mca", "plm_rsh_agent", agent, "--mca",
      "oob_tcp_if_include", hosts.Subnet(), "--mca", "btl_tcp_if_include", hosts.Subnet(), "--mca",
      "btl", "self,vader,tcp", "--mca", "btl_vader_backing_directory", shm, "--timeout", "60",
      "-x", absl::StrCat("TORCH_FR_DUMP_TEMP_FILE=", job.dumps, "/trace_")};
  for (const std::string& e : env) argv.insert(argv.end(), {"-x", e});
  argv.insert(argv.end(), mpirun_args.begin(), mpirun_args.end());
  argv.insert(argv.end(), {Runfile("distributed/mpi/fault_worker"), "--fault=" + fault});
  const std::string log = absl::StrCat(tmp, "/", name, ".log");
  job.exit_code = Wait(Spawn(argv, log), absl::Seconds(90));
  job.output = ReadFile(log);
  Run({"/bin/rm", "-rf", shm});
  return job;
}

// fr_trace over a job's dumps.
std::string Trace(const std::string& dumps, int ranks) {
  auto [code, out] =
      Run({Runfile("tools/launch/fr_trace"), absl::StrCat("--world_size=", ranks), dumps});
  EXPECT_EQ(code, 0) << out;
  return out;
}

// fr_trace's words for all_reduce #3 that every rank but the last entered.
std::string EnteredByAllButTheLast(int ranks) {
  std::vector<int> others;
  for (int r = 0; r + 1 < ranks; ++r) others.push_back(r);
  return absl::StrCat("all_reduce #3 (group 0, 32 B float32): ", others.size() == 1 ? "rank " : "ranks ",
                      absl::StrJoin(others, ", "), " entered it; rank ", ranks - 1);
}

// Each rank r but the last reported all_reduce #3's failure, from its host,
// within the timeout (3 s) + 2 s, with text(r) in its error.
void ExpectSurvivorsName(const TwoHosts& hosts, const MpiJob& job, int ranks,
                         const std::function<std::string(int)>& text) {
  for (int r = 0; r + 1 < ranks; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    const std::string head = absl::StrCat("mpi_fault_worker rank ", r, " of ", ranks, " on ",
                                          hosts.name(r < ranks / 2 ? 0 : 1),
                                          ": all_reduce #3 failed after ");
    const size_t at = job.output.find(head);
    ASSERT_NE(at, std::string::npos) << job.output;
    const std::string line = job.output.substr(at, job.output.find('\n', at) - at);
    ASSERT_TRUE(std::isdigit(static_cast<unsigned char>(line[head.size()]))) << line;
    const long long ms = std::atoll(line.c_str() + head.size());
    EXPECT_LT(ms, 5000) << line;
    std::printf("%s\n", line.substr(0, head.size() + 12).c_str());  // the figure, for the log
    EXPECT_NE(line.find(text(r)), std::string::npos) << line;
  }
}

class MpiMultiHostTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    if (std::string why = MakeHosts(hosts_); !why.empty()) GTEST_SKIP() << why;
    std::optional<std::string> mpirun = FindProgram("mpirun");
    if (!mpirun) GTEST_SKIP() << "Open MPI's mpirun is not installed (apt-get install openmpi-bin)";
    if (!FindProgram("unshare")) GTEST_SKIP() << "util-linux's unshare is not installed";
    if (std::string why = hosts_->AddHostNames(); !why.empty()) GTEST_SKIP() << why;
    mpirun_ = *mpirun;
  }
  int ranks() const { return GetParam(); }
  std::string last() const { return absl::StrCat("rank ", ranks() - 1); }
  // The desync report that names the last rank, stopped after collective #2.
  std::function<std::string(int)> Behind() const {
    return [text = absl::StrCat("desync report: ", last(),
                                " is behind: its last collective is #2 all_reduce")](int) {
      return text;
    };
  }

  std::unique_ptr<TwoHosts> hosts_;
  std::string mpirun_;
};

// The job runs at all across the hosts: every rank's all_reduce #3 succeeds.
TEST_P(MpiMultiHostTest, RunsAcrossTheHosts) {
  MpiJob job = RunMpiOnTwoHosts(*hosts_, mpirun_, ranks(), "none");
  EXPECT_EQ(job.exit_code, 0) << job.output;
  for (int r = 0; r < ranks(); ++r) {
    EXPECT_NE(job.output.find(absl::StrCat("mpi_fault_worker rank ", r, " of ", ranks(), " on ",
                                           hosts_->name(r < ranks() / 2 ? 0 : 1),
                                           ": all_reduce #3 succeeded")),
              std::string::npos)
        << job.output;
  }
}

// The last rank stays in its own code: the others time out, and their desync
// reports, read from the store on host 0, name it and its last collective;
// fr_trace over the dumps (the stalled rank's written when mpirun stops it
// with SIGTERM) names it and all_reduce #3.
TEST_P(MpiMultiHostTest, AStalledRankOnTheOtherHostIsNamed) {
  MpiJob job = RunMpiOnTwoHosts(*hosts_, mpirun_, ranks(), "skip");
  EXPECT_NE(job.exit_code, 0) << job.output;
  ExpectSurvivorsName(*hosts_, job, ranks(), [](int) { return "all_reduce (collective #3)"; });
  ExpectSurvivorsName(*hosts_, job, ranks(), Behind());
  EXPECT_NE(Trace(job.dumps, ranks()).find(EnteredByAllButTheLast(ranks()) + " never did"),
            std::string::npos)
      << Trace(job.dumps, ranks());
}

// The last rank is SIGSTOPped (mpirun continues and stops it when the job
// fails): named as a stalled one is.
TEST_P(MpiMultiHostTest, AStoppedRankOnTheOtherHostIsNamed) {
  MpiJob job = RunMpiOnTwoHosts(*hosts_, mpirun_, ranks(), "sigstop");
  EXPECT_NE(job.exit_code, 0) << job.output;
  ExpectSurvivorsName(*hosts_, job, ranks(), Behind());
  EXPECT_NE(Trace(job.dumps, ranks()).find(EnteredByAllButTheLast(ranks()) + " never did"),
            std::string::npos)
      << Trace(job.dumps, ranks());
}

// The last rank passes 16 elements instead of 8. Under
// TORCH_DISTRIBUTED_DEBUG=DETAIL the ranks compare the call through the
// group's store (Note [Call checks]) and every other rank names its call.
// (mpi has no in-band check at the default level: there MPI itself reports
// MPI_ERR_TRUNCATE, naming no rank.)
TEST_P(MpiMultiHostTest, AnotherSizeOnTheOtherHostIsNamedUnderDetail) {
  MpiJob job = RunMpiOnTwoHosts(*hosts_, mpirun_, ranks(), "other_size", {},
                                {"TORCH_DISTRIBUTED_DEBUG=DETAIL"});
  EXPECT_NE(job.exit_code, 0) << job.output;
  ExpectSurvivorsName(*hosts_, job, ranks(), [&](int r) {
    return absl::StrCat("mismatched collectives: all_reduce (collective #3): ", last(),
                        " ran all_reduce of 64 B float32 (SUM) but this rank (", r,
                        ") ran all_reduce of 32 B float32 (SUM)");
  });
}

// The last rank is SIGKILLed, with mpirun's defaults: mpirun names it and
// stops the others (SIGCONT, SIGTERM a second later, SIGKILL a second after
// that: odls_base_sigkill_timeout=1) before their timeout, so they report
// nothing themselves; but each dumps its flight recorder on the SIGTERM, and
// fr_trace over the dumps names the killed rank and all_reduce #3.
TEST_P(MpiMultiHostTest, AKilledRankOnTheOtherHostIsNamedByMpirunAndTheDumps) {
  MpiJob job = RunMpiOnTwoHosts(*hosts_, mpirun_, ranks(), "sigkill");
  EXPECT_NE(job.exit_code, 0) << job.output;
  EXPECT_NE(job.output.find(absl::StrCat("process ", last(), " with PID")), std::string::npos)
      << job.output;
  EXPECT_NE(job.output.find(absl::StrCat("on node ", hosts_->name(1), " exited on signal 9")),
            std::string::npos)
      << job.output;
  const std::string trace = Trace(job.dumps, ranks());
  EXPECT_NE(trace.find(EnteredByAllButTheLast(ranks()) + " left no dump"), std::string::npos)
      << trace;
  EXPECT_NE(trace.find("dumped on: SIGTERM"), std::string::npos) << trace;
}

// The same with --mca odls_base_sigkill_timeout 6 (longer than the timeout
// + 2 s): mpirun waits before its SIGTERM, the others reach their timeout,
// and their desync reports name the killed rank.
TEST_P(MpiMultiHostTest, AKilledRankOnTheOtherHostIsNamedByTheSurvivorsGivenTime) {
  MpiJob job = RunMpiOnTwoHosts(*hosts_, mpirun_, ranks(), "sigkill",
                                {"--mca", "odls_base_sigkill_timeout", "6"});
  EXPECT_NE(job.exit_code, 0) << job.output;
  ExpectSurvivorsName(*hosts_, job, ranks(), Behind());
  EXPECT_NE(Trace(job.dumps, ranks()).find(EnteredByAllButTheLast(ranks()) + " left no dump"),
            std::string::npos)
      << Trace(job.dumps, ranks());
}

INSTANTIATE_TEST_SUITE_P(Ranks, MpiMultiHostTest, ::testing::Values(2, 4),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat(info.param, "Ranks");
                         });

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
        "--checkpoint=" + dir + "/elastic.ckpt", "--log=" + steps};
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
