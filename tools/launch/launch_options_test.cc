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
  options.serve_store = true;
  EXPECT_EQ(MakeWorkerSpec(options, 0, 0, true).env.at("EMBER_STORE_SERVED_BY_LAUNCHER"), "1");
}

TEST(LaunchOptionsTest, ErrorsNameTheOption) {
  EXPECT_THAT(ParseLaunchArgs({"--max_restarts=-1", "p"}).status().message(), HasSubstr("--max_restarts=-1"));
  EXPECT_THAT(ParseLaunchArgs({"--use_env=1", "p"}).status().message(), HasSubstr("--use_env takes no value"));
  EXPECT_THAT(ParseLaunchArgs({"--serve_store=yes", "p"}).status().message(),
              HasSubstr("--serve_store takes no value"));
  EXPECT_THAT(ParseLaunchArgs({"--nnodes=x", "p"}).status().message(), HasSubstr("--nnodes=x"));
}

}  // namespace
}  // namespace ember::launch
