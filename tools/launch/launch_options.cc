#include "tools/launch/launch_options.h"

#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

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

}  // namespace

std::string Usage() {
  return "usage: launch [--nproc_per_node=N] [--nnodes=M] [--node_rank=K] [--master_addr=ADDR]\n"
         "              [--master_port=PORT] [--use_env] [--max_restarts=R] [--serve_store]\n"
         "              program [args...]\n"
         "Starts N workers of `program` on this node (node K of M) with MASTER_ADDR, MASTER_PORT,\n"
         "WORLD_SIZE, RANK and LOCAL_RANK set for env:// rendezvous; passes --local_rank=i unless\n"
         "--use_env. --serve_store: node 0's launcher serves the store for Ember programs.\n"
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
    if (arg.rfind("--", 0) != 0) break;  // the program
    std::string name = arg.substr(2);
    std::optional<std::string> value;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    if (name == "help") return UsageError("help requested");
    if (name == "use_env" || name == "serve_store") {
      if (value) return UsageError(absl::StrCat("--", name, " takes no value"));
      (name == "use_env" ? options.use_env : options.serve_store) = true;
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
      if (absl::Status s = ParseInt(name, *value, 1, 65536, options.nnodes); !s.ok()) return s;
    } else if (name == "node_rank") {
      if (absl::Status s = ParseInt(name, *value, 0, 65535, options.node_rank); !s.ok()) return s;
    } else if (name == "master_port") {
      if (absl::Status s = ParseInt(name, *value, 1, 65535, options.master_port); !s.ok()) return s;
    } else if (name == "max_restarts") {
      if (absl::Status s = ParseInt(name, *value, 0, 1000000, options.max_restarts); !s.ok())
        return s;
    } else if (name == "master_addr") {
      if (value->empty()) return UsageError("--master_addr is empty");
      options.master_addr = *value;
    } else {
      return UsageError(absl::StrCat("unknown option --", name));
    }
  }
  options.program.assign(args.begin() + i, args.end());
  if (options.program.empty()) return UsageError("no program to launch");
  if (options.node_rank >= options.nnodes) {
    return UsageError(absl::StrCat("--node_rank=", options.node_rank,
                                   " is not in [0, --nnodes=", options.nnodes, ")"));
  }
  return options;
}

WorkerSpec MakeWorkerSpec(const LaunchOptions& options, int local_rank, int restart_count,
                          bool omp_num_threads_set) {
  WorkerSpec spec;
  spec.local_rank = local_rank;
  spec.rank = options.node_rank * options.nproc_per_node + local_rank;
  spec.argv.push_back(options.program[0]);
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
  if (options.serve_store) spec.env["EMBER_STORE_SERVED_BY_LAUNCHER"] = "1";
  return spec;
}

}  // namespace ember::launch
