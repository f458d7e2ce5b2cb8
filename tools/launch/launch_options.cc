#include "tools/launch/launch_options.h"

#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "tensor/status_macros.h"

namespace ember::launch {
namespace {

absl::Status UsageError(std::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat("launch: ", std::string(problem), "\n", Usage()));
}

absl::Status ParseInt(const std::string& name, const std::string& text, int min, int max,
                      int& out) {
  if (!absl::SimpleAtoi(text, &out) || out < min || out > max) {
    return UsageError(
        absl::StrCat("--", name, "=", text, " is not an integer in [", min, ", ", max, "]"));
  }
  return absl::OkStatus();
}

absl::Status ParseSeconds(const std::string& name, const std::string& text, absl::Duration& out) {
  double seconds = 0;
  if (!absl::SimpleAtod(text, &seconds) || !(seconds > 0) || seconds > 1e7) {
    return UsageError(absl::StrCat("--", name, "=", text, " is not a positive number of seconds"));
  }
  out = absl::Seconds(seconds);
  return absl::OkStatus();
}

// --nnodes=N or --nnodes=MIN:MAX.
absl::Status ParseNodes(const std::string& text, LaunchOptions& options) {
  const size_t colon = text.find(':');
  if (colon == std::string::npos) {
    EMBER_RETURN_IF_ERROR(ParseInt("nnodes", text, 1, 65536, options.nnodes));
    options.min_nodes = options.max_nodes = options.nnodes;
    return absl::OkStatus();
  }
  int lo = 0, hi = 0;
  if (!absl::SimpleAtoi(text.substr(0, colon), &lo) ||
      !absl::SimpleAtoi(text.substr(colon + 1), &hi) || lo < 1 || hi < lo || hi > 65536) {
    return UsageError(absl::StrCat("--nnodes=", text, " is not N or MIN:MAX with 1 <= MIN <= MAX"));
  }
  options.min_nodes = lo;
  options.max_nodes = hi;
  options.nnodes = hi;
  return absl::OkStatus();
}

// --rdzv_conf=key=value,...
absl::Status ParseRdzvConf(const std::string& text, LaunchOptions& options) {
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    const size_t eq = item.find('=');
    const std::string key(item.substr(0, eq));
    const std::string value(eq == absl::string_view::npos ? "" : item.substr(eq + 1));
    absl::Duration* target = key == "join_timeout"        ? &options.rdzv_join_timeout
                             : key == "last_call_timeout" ? &options.rdzv_last_call
                             : key == "heartbeat_timeout" ? &options.rdzv_heartbeat_timeout
                                                          : nullptr;
    if (target == nullptr) {
      return UsageError(absl::StrCat("--rdzv_conf: unknown key '", key,
                                     "' (known: join_timeout, last_call_timeout, heartbeat_timeout)"));
    }
    EMBER_RETURN_IF_ERROR(ParseSeconds(absl::StrCat("rdzv_conf ", key), value, *target));
  }
  return absl::OkStatus();
}

}  // namespace

std::string Usage() {
  return "usage: launch [--nproc_per_node=N] [--nnodes=M] [--node_rank=K] [--master_addr=ADDR]\n"
         "              [--master_port=PORT] [--use_env] [--max_restarts=R] [--serve_store]\n"
         "              [--replica_groups [--lighthouse=HOST:PORT]]\n"
         "              [-m | --no-python] program [args...]\n"
         "       launch [--nproc_per_node=N] --nnodes=MIN:MAX --rdzv_endpoint=HOST[:PORT]\n"
         "              [--rdzv_id=JOB] [--rdzv_backend=c10d] [--rdzv_conf=KEY=SECONDS,...]\n"
         "              [--max_restarts=R] [--monitor_interval=SECONDS] [--local_addr=ADDR]\n"
         "              program [args...]\n"
         "Starts N workers of `program` on this node (node K of M) with MASTER_ADDR, MASTER_PORT,\n"
         "WORLD_SIZE, RANK and LOCAL_RANK set for env:// rendezvous; passes --local_rank=i unless\n"
         "--use_env. --serve_store: node 0's launcher serves the store (Ember's and PyTorch's\n"
         "env:// connect to it). --replica_groups: each worker is a replica group of a\n"
         "fault-tolerant job (REPLICA_GROUP_ID=its rank, TORCHFT_LIGHTHOUSE=--lighthouse) and a\n"
         "worker that fails is restarted alone, up to --max_restarts times each.\n"
         "A program ending in .py runs as `python3 -u program` (python3 from PATH), a module\n"
         "given with -m as `python3 -u -m module`; --no-python runs the program as it is.\n"
         "Elastic: the launchers meet at HOST:PORT (served by the launcher there), wait for MIN\n"
         "nodes (30 s more for up to MAX), and start a new round when a node is lost or joins.\n"
         "Defaults: 1 process, 1 node, node 0, 127.0.0.1:29500, no restarts.\n"
         "launch --help | --version: this text, or the version.\n"
         "Exit status: 0 every worker succeeded; the first failed worker's exit code (128 + the\n"
         "signal that killed it); 128 + the signal that stopped the launcher; 1 the launcher\n"
         "could not run the job (the reason on stderr); 2 usage error or no such program.";
}

absl::StatusOr<LaunchOptions> ParseLaunchArgs(const std::vector<std::string>& args) {
  LaunchOptions options;
  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg == "-m" || arg == "--module") {
      options.module = true;
      continue;
    }
    if (arg.rfind("--", 0) != 0) break;  // the program
    std::string name = arg.substr(2);
    std::optional<std::string> value;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    if (name == "help") return UsageError("help requested");
    if (name == "use_env" || name == "serve_store" || name == "no_python" ||
        name == "no-python" || name == "replica_groups") {
      if (value) return UsageError(absl::StrCat("--", name, " takes no value"));
      (name == "use_env"          ? options.use_env
       : name == "serve_store"    ? options.serve_store
       : name == "replica_groups" ? options.replica_groups
                                  : options.no_python) = true;
      continue;
    }
    if (!value) {
      if (i + 1 >= args.size()) return UsageError(absl::StrCat("--", name, " needs a value"));
      value = args[++i];
    }
    if (name == "nproc_per_node") {
      if (absl::Status s = ParseInt(name, *value, 1, 4096, options.nproc_per_node); !s.ok())
        return s;
    } else if (name == "nnodes") {
      if (absl::Status s = ParseNodes(*value, options); !s.ok()) return s;
    } else if (name == "rdzv_endpoint") {
      const size_t colon = value->rfind(':');
      options.rdzv_endpoint_host = value->substr(0, colon);
      if (colon != std::string::npos) {
        if (absl::Status s = ParseInt(name, value->substr(colon + 1), 1, 65535,
                                      options.rdzv_endpoint_port);
            !s.ok())
          return s;
      }
      if (options.rdzv_endpoint_host.empty()) return UsageError("--rdzv_endpoint has no host");
    } else if (name == "rdzv_id") {
      if (value->empty() || value->find('/') != std::string::npos) {
        return UsageError(absl::StrCat("--rdzv_id=", *value, " must be non-empty without '/'"));
      }
      options.rdzv_id = *value;
    } else if (name == "rdzv_backend") {
      if (*value != "c10d" && *value != "static") {
        return UsageError(absl::StrCat("--rdzv_backend=", *value,
                                       " is not supported (c10d: elastic, with --rdzv_endpoint; "
                                       "static: fixed --nnodes and --node_rank)"));
      }
    } else if (name == "local_addr") {
      if (value->empty()) return UsageError("--local_addr is empty");
      options.local_addr = *value;
    } else if (name == "rdzv_conf") {
      if (absl::Status s = ParseRdzvConf(*value, options); !s.ok()) return s;
    } else if (name == "monitor_interval") {
      if (absl::Status s = ParseSeconds(name, *value, options.monitor_interval); !s.ok()) return s;
    } else if (name == "node_rank") {
      if (absl::Status s = ParseInt(name, *value, 0, 65535, options.node_rank); !s.ok()) return s;
    } else if (name == "master_port") {
      if (absl::Status s = ParseInt(name, *value, 1, 65535, options.master_port); !s.ok()) return s;
    } else if (name == "max_restarts") {
      if (absl::Status s = ParseInt(name, *value, 0, 1000000, options.max_restarts); !s.ok())
        return s;
    } else if (name == "lighthouse") {
      if (value->find(':') == std::string::npos) {
        return UsageError(absl::StrCat("--lighthouse=", *value, " is not HOST:PORT"));
      }
      options.lighthouse = *value;
    } else if (name == "master_addr") {
      if (value->empty()) return UsageError("--master_addr is empty");
      options.master_addr = *value;
    } else {
      return UsageError(absl::StrCat("unknown option --", name));
    }
  }
  options.program.assign(args.begin() + i, args.end());
  if (options.program.empty()) return UsageError("no program to launch");
  if (options.module && options.no_python)
    return UsageError("-m and --no-python exclude each other: a module needs python");
  if (options.min_nodes != options.max_nodes && !options.elastic()) {
    return UsageError(absl::StrCat("--nnodes=", options.min_nodes, ":", options.max_nodes,
                                   " needs --rdzv_endpoint=HOST[:PORT], where the launchers meet"));
  }
  if (options.replica_groups && options.elastic()) {
    return UsageError("--replica_groups restarts workers alone; it does not combine with an "
                      "elastic --rdzv_endpoint, whose rounds restart every worker");
  }
  if (!options.lighthouse.empty() && !options.replica_groups) {
    return UsageError("--lighthouse is for --replica_groups jobs");
  }
  if (!options.elastic() && options.node_rank >= options.nnodes) {
    return UsageError(absl::StrCat("--node_rank=", options.node_rank,
                                   " is not in [0, --nnodes=", options.nnodes, ")"));
  }
  return options;
}

std::vector<std::string> ProgramCommand(const LaunchOptions& options) {
  const std::string& program = options.program[0];
  if (options.module) return {"python3", "-u", "-m", program};
  if (!options.no_python && absl::EndsWith(program, ".py")) return {"python3", "-u", program};
  return {program};
}

WorkerSpec MakeWorkerSpec(const LaunchOptions& options, int local_rank, int restart_count,
                          bool omp_num_threads_set) {
  WorkerSpec spec;
  spec.local_rank = local_rank;
  spec.rank = options.node_rank * options.nproc_per_node + local_rank;
  spec.argv = ProgramCommand(options);
  if (!options.use_env) spec.argv.push_back(absl::StrCat("--local_rank=", local_rank));
  spec.argv.insert(spec.argv.end(), options.program.begin() + 1, options.program.end());
  spec.env["MASTER_ADDR"] = options.master_addr;
  spec.env["MASTER_PORT"] = std::to_string(options.master_port);
  spec.env["WORLD_SIZE"] = std::to_string(options.nnodes * options.nproc_per_node);
  spec.env["RANK"] = std::to_string(spec.rank);
  spec.env["LOCAL_RANK"] = std::to_string(local_rank);
  spec.env["LOCAL_WORLD_SIZE"] = std::to_string(options.nproc_per_node);
  spec.env["GROUP_RANK"] = std::to_string(options.node_rank);
  spec.env["TORCHELASTIC_RESTART_COUNT"] = std::to_string(restart_count);
  spec.env["TORCHELASTIC_MAX_RESTARTS"] = std::to_string(options.max_restarts);
  if (!omp_num_threads_set && options.nproc_per_node > 1) spec.env["OMP_NUM_THREADS"] = "1";
  if (options.replica_groups) {
    spec.env["REPLICA_GROUP_ID"] = std::to_string(spec.rank);
    if (!options.lighthouse.empty()) spec.env["TORCHFT_LIGHTHOUSE"] = options.lighthouse;
  }
  if (options.serve_store) {
    spec.env["EMBER_STORE_SERVED_BY_LAUNCHER"] = "1";
    // PyTorch's env:// then connects every rank to the launcher's store too,
    // as under torchrun's agent store.
    spec.env["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  }
  return spec;
}

}  // namespace ember::launch
