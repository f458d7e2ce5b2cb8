// The command line of the `launch` binary and the environment it gives each
// worker, as PyTorch's launcher (torch.distributed.launch) defines them:
//
//   launch --nproc_per_node=4 [--nnodes=2 --node_rank=0 --master_addr=10.0.0.1
//          --master_port=29500] [--use_env] [--max_restarts=3] program args...
//   launch --nproc_per_node=4 --nnodes=1:3 --rdzv_endpoint=10.0.0.1:29400
//          --rdzv_id=job7 [--max_restarts=3] [--monitor_interval=0.1] program args...
//
// Worker i of node K gets MASTER_ADDR, MASTER_PORT, WORLD_SIZE
// (= nnodes * nproc_per_node), RANK (= K * nproc_per_node + i), LOCAL_RANK
// (= i), LOCAL_WORLD_SIZE, GROUP_RANK (= K), TORCHELASTIC_RESTART_COUNT and
// TORCHELASTIC_MAX_RESTARTS, OMP_NUM_THREADS=1 when it is unset and
// nproc_per_node > 1, and, unless --use_env, the argument --local_rank=i
// before the program's own arguments.
//
// --replica_groups [--lighthouse=HOST:PORT] (an Ember extension): each
// worker is a replica group of a fault-tolerant job and is restarted alone
// when it fails (LaunchOptions::replica_groups).
//
// --serve_store (an Ember extension): the launcher of node 0 serves the
// job's TcpStore on master_port itself, afresh for every attempt, and sets
// EMBER_STORE_SERVED_BY_LAUNCHER=1 so that Ember's env:// rendezvous connects
// rank 0 to it instead of serving, and TORCHELASTIC_USE_AGENT_STORE=True so
// that PyTorch's env:// does the same (the store speaks c10d's protocol). The
// store then outlives any worker.
//
// Thread-safety: plain functions on values.
#ifndef EMBER_TOOLS_LAUNCH_LAUNCH_OPTIONS_H_
#define EMBER_TOOLS_LAUNCH_LAUNCH_OPTIONS_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ember::launch {

struct LaunchOptions {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  bool use_env = false;
  bool serve_store = false;
  int max_restarts = 0;
  // Elastic jobs, as torchrun's c10d rendezvous (tools/launch/elastic_agent.h):
  // --rdzv_endpoint=HOST[:PORT] turns them on, --nnodes=MIN:MAX (or N) bounds
  // the nodes, --rdzv_id names the job, --monitor_interval is how often the
  // launcher checks its workers and the other nodes, --rdzv_conf=
  // join_timeout=S,last_call_timeout=S,heartbeat_timeout=S tunes the
  // rendezvous (seconds). node_rank, master_addr and master_port then come
  // from each round.
  int min_nodes = 1;
  int max_nodes = 1;
  std::string rdzv_endpoint_host;  // empty: not elastic
  int rdzv_endpoint_port = 29400;
  std::string rdzv_id = "none";
  // --local_addr: this node's address as the other nodes reach it (torchrun's
  // --local-addr); empty: the host name.
  std::string local_addr;
  absl::Duration monitor_interval = absl::Milliseconds(100);
  absl::Duration rdzv_join_timeout = absl::Seconds(600);
  absl::Duration rdzv_last_call = absl::Seconds(30);
  absl::Duration rdzv_heartbeat_timeout = absl::Seconds(15);
  bool elastic() const { return !rdzv_endpoint_host.empty(); }
  // How long workers get to exit after SIGTERM before SIGKILL.
  absl::Duration stop_grace = absl::Seconds(10);
  std::vector<std::string> program;  // the program and its own arguments
  // How the program runs, as torchrun has it: a program ending in ".py" runs
  // as `python3 -u program` (python3 from PATH) unless --no-python; with -m
  // (--module) the program is a module, `python3 -u -m program`. Anything
  // else is an executable, run as it is.
  bool module = false;
  bool no_python = false;
  // --replica_groups (an Ember extension, for parallel/fault_tolerance.h):
  // every worker is a replica group of a fault-tolerant job, with
  // REPLICA_GROUP_ID=<rank> (and TORCHFT_LIGHTHOUSE=--lighthouse when given);
  // a worker that fails is restarted alone, up to --max_restarts times each,
  // while the others keep training. Not with --nnodes=MIN:MAX.
  bool replica_groups = false;
  std::string lighthouse;  // --lighthouse=HOST:PORT
};

// The command line that runs options.program, before its own arguments:
// {"python3", "-u", "train.py"}, {"python3", "-u", "-m", "pkg.train"} or
// {"./trainer"}.
std::vector<std::string> ProgramCommand(const LaunchOptions& options);

// The usage text printed for --help and after a usage error.
std::string Usage();

// Parses argv[1..]: launcher options ("--name=value" or "--name value") up to
// the program, which is the first argument not starting with "--" (or the
// one after "--"). kInvalidArgument names the offending option or value.
absl::StatusOr<LaunchOptions> ParseLaunchArgs(const std::vector<std::string>& args);

// The worker's command line and the variables to add to its environment.
struct WorkerSpec {
  int rank;
  int local_rank;
  std::vector<std::string> argv;
  std::map<std::string, std::string> env;
};
WorkerSpec MakeWorkerSpec(const LaunchOptions& options, int local_rank, int restart_count,
                          bool omp_num_threads_set);

}  // namespace ember::launch

#endif  // EMBER_TOOLS_LAUNCH_LAUNCH_OPTIONS_H_
