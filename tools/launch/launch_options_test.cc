// ParseLaunchArgs and MakeWorkerSpec: option forms, where the program starts,
// and the worker's argv and environment.
#include "tools/launch/launch_options.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ember::launch {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(LaunchOptionsTest, BothOptionFormsAndTheProgramsOwnOptions) {
  LaunchOptions options = ParseLaunchArgs({"--nproc_per_node", "4", "--nnodes=3", "--node_rank=2",
                                           "--master_addr", "node0", "--master_port=1000", "train",
                                           "--nproc_per_node=99", "--lr=0.1"})
                              .value();
  EXPECT_EQ(options.nproc_per_node, 4);
  EXPECT_EQ(options.nnodes, 3);
  EXPECT_EQ(options.node_rank, 2);
  EXPECT_EQ(options.master_addr, "node0");
  EXPECT_EQ(options.master_port, 1000);
  EXPECT_FALSE(options.use_env);
  EXPECT_THAT(options.program, ElementsAre("train", "--nproc_per_node=99", "--lr=0.1"));
}

TEST(LaunchOptionsTest, DoubleDashStartsTheProgram) {
  LaunchOptions options = ParseLaunchArgs({"--use_env", "--", "--weird-name", "x"}).value();
  EXPECT_TRUE(options.use_env);
  EXPECT_THAT(options.program, ElementsAre("--weird-name", "x"));
}

TEST(LaunchOptionsTest, WorkerSpec) {
  LaunchOptions options = ParseLaunchArgs({"--nproc_per_node=2", "--nnodes=2", "--node_rank=1", "prog", "a"}).value();
  WorkerSpec spec = MakeWorkerSpec(options, 1, 0, /*omp_num_threads_set=*/false);
  EXPECT_EQ(spec.rank, 3);
  EXPECT_THAT(spec.argv, ElementsAre("prog", "--local_rank=1", "a"));
  EXPECT_EQ(spec.env.at("RANK"), "3");
  EXPECT_EQ(spec.env.at("WORLD_SIZE"), "4");
  EXPECT_EQ(spec.env.at("LOCAL_RANK"), "1");
  EXPECT_EQ(spec.env.at("OMP_NUM_THREADS"), "1");
  EXPECT_FALSE(MakeWorkerSpec(options, 0, 0, /*omp_num_threads_set=*/true).env.contains("OMP_NUM_THREADS"));
  options.use_env = true;
  EXPECT_THAT(MakeWorkerSpec(options, 0, 2, true).argv, ElementsAre("prog", "a"));
  EXPECT_EQ(MakeWorkerSpec(options, 0, 2, true).env.at("TORCHELASTIC_RESTART_COUNT"), "2");
  EXPECT_FALSE(MakeWorkerSpec(options, 0, 0, true).env.contains("EMBER_STORE_SERVED_BY_LAUNCHER"));
  EXPECT_FALSE(MakeWorkerSpec(options, 0, 0, true).env.contains("TORCHELASTIC_USE_AGENT_STORE"));
  options.serve_store = true;
  EXPECT_EQ(MakeWorkerSpec(options, 0, 0, true).env.at("EMBER_STORE_SERVED_BY_LAUNCHER"), "1");
  EXPECT_EQ(MakeWorkerSpec(options, 0, 0, true).env.at("TORCHELASTIC_USE_AGENT_STORE"), "True");
}

TEST(LaunchOptionsTest, PythonProgramsRunAsTorchrunRunsThem) {
  LaunchOptions script = ParseLaunchArgs({"--use_env", "train.py", "--lr=1"}).value();
  EXPECT_THAT(MakeWorkerSpec(script, 0, 0, true).argv,
              ElementsAre("python3", "-u", "train.py", "--lr=1"));
  LaunchOptions module = ParseLaunchArgs({"-m", "pkg.train", "x"}).value();
  EXPECT_THAT(MakeWorkerSpec(module, 1, 0, true).argv,
              ElementsAre("python3", "-u", "-m", "pkg.train", "--local_rank=1", "x"));
  LaunchOptions as_is = ParseLaunchArgs({"--no-python", "--use_env", "./run.py"}).value();
  EXPECT_THAT(MakeWorkerSpec(as_is, 0, 0, true).argv, ElementsAre("./run.py"));
  LaunchOptions binary = ParseLaunchArgs({"--use_env", "./trainer"}).value();
  EXPECT_THAT(MakeWorkerSpec(binary, 0, 0, true).argv, ElementsAre("./trainer"));
  EXPECT_THAT(ParseLaunchArgs({"-m", "--no-python", "p"}).status().message(),
              HasSubstr("-m and --no-python exclude each other"));
}

TEST(LaunchOptionsTest, ReplicaGroupsNameEachWorkerAndTheLighthouse) {
  LaunchOptions options = ParseLaunchArgs({"--nproc_per_node=3", "--replica_groups",
                                           "--lighthouse=10.0.0.5:29510", "prog"})
                              .value();
  EXPECT_TRUE(options.replica_groups);
  WorkerSpec spec = MakeWorkerSpec(options, 2, 1, false);
  EXPECT_EQ(spec.env["REPLICA_GROUP_ID"], "2");
  EXPECT_EQ(spec.env["TORCHFT_LIGHTHOUSE"], "10.0.0.5:29510");
  EXPECT_EQ(spec.env["TORCHELASTIC_RESTART_COUNT"], "1");
  EXPECT_EQ(MakeWorkerSpec(ParseLaunchArgs({"prog"}).value(), 0, 0, false).env.count(
                "REPLICA_GROUP_ID"),
            0u);
  EXPECT_THAT(ParseLaunchArgs({"--lighthouse=h:1", "prog"}).status().message(),
              HasSubstr("--lighthouse is for --replica_groups jobs"));
  EXPECT_THAT(ParseLaunchArgs({"--replica_groups", "--lighthouse=nohost", "prog"}).status().message(),
              HasSubstr("--lighthouse=nohost is not HOST:PORT"));
  EXPECT_THAT(ParseLaunchArgs({"--replica_groups", "--nnodes=1:2", "--rdzv_endpoint=h:1", "prog"})
                  .status()
                  .message(),
              HasSubstr("does not combine with an elastic --rdzv_endpoint"));
}

TEST(LaunchOptionsTest, ErrorsNameTheOption) {
  EXPECT_THAT(ParseLaunchArgs({"--max_restarts=-1", "p"}).status().message(), HasSubstr("--max_restarts=-1"));
  EXPECT_THAT(ParseLaunchArgs({"--use_env=1", "p"}).status().message(), HasSubstr("--use_env takes no value"));
  EXPECT_THAT(ParseLaunchArgs({"--serve_store=yes", "p"}).status().message(),
              HasSubstr("--serve_store takes no value"));
  EXPECT_THAT(ParseLaunchArgs({"--nnodes=x", "p"}).status().message(), HasSubstr("--nnodes=x"));
}

TEST(LaunchOptionsTest, ElasticOptions) {
  LaunchOptions options =
      ParseLaunchArgs({"--nnodes=1:3", "--rdzv_endpoint=head:1234", "--rdzv_id=job7",
                       "--rdzv_backend=c10d", "--monitor_interval=0.5",
                       "--rdzv_conf=join_timeout=20,last_call_timeout=2,heartbeat_timeout=3",
                       "--local_addr=10.0.0.7", "train"})
          .value();
  EXPECT_TRUE(options.elastic());
  EXPECT_EQ(options.min_nodes, 1);
  EXPECT_EQ(options.max_nodes, 3);
  EXPECT_EQ(options.rdzv_endpoint_host, "head");
  EXPECT_EQ(options.rdzv_endpoint_port, 1234);
  EXPECT_EQ(options.rdzv_id, "job7");
  EXPECT_EQ(options.local_addr, "10.0.0.7");
  EXPECT_EQ(options.monitor_interval, absl::Milliseconds(500));
  EXPECT_EQ(options.rdzv_join_timeout, absl::Seconds(20));
  EXPECT_EQ(options.rdzv_last_call, absl::Seconds(2));
  EXPECT_EQ(options.rdzv_heartbeat_timeout, absl::Seconds(3));
  // The endpoint's port defaults to torchrun's 29400; a fixed size is elastic too.
  LaunchOptions fixed = ParseLaunchArgs({"--nnodes=2", "--rdzv_endpoint=head", "p"}).value();
  EXPECT_EQ(fixed.rdzv_endpoint_port, 29400);
  EXPECT_EQ(fixed.min_nodes, 2);
  EXPECT_EQ(fixed.max_nodes, 2);
  EXPECT_FALSE(ParseLaunchArgs({"--nnodes=2", "p"}).value().elastic());
}

TEST(LaunchOptionsTest, ElasticErrorsNameTheOption) {
  EXPECT_THAT(ParseLaunchArgs({"--nnodes=1:3", "p"}).status().message(),
              HasSubstr("--nnodes=1:3 needs --rdzv_endpoint"));
  EXPECT_THAT(ParseLaunchArgs({"--nnodes=3:1", "--rdzv_endpoint=h", "p"}).status().message(),
              HasSubstr("--nnodes=3:1"));
  EXPECT_THAT(ParseLaunchArgs({"--rdzv_endpoint=:99", "p"}).status().message(),
              HasSubstr("--rdzv_endpoint has no host"));
  EXPECT_THAT(ParseLaunchArgs({"--rdzv_backend=etcd", "--rdzv_endpoint=h", "p"}).status().message(),
              HasSubstr("--rdzv_backend=etcd is not supported"));
  EXPECT_THAT(ParseLaunchArgs({"--rdzv_conf=timeout=3", "p"}).status().message(),
              HasSubstr("unknown key 'timeout'"));
  EXPECT_THAT(ParseLaunchArgs({"--monitor_interval=0", "p"}).status().message(),
              HasSubstr("--monitor_interval=0"));
}

}  // namespace
}  // namespace ember::launch
