// Tests for server/cluster_env.h: Slurm's compact node lists (and their errors), and the task
// plan of each rank from fake Slurm and MPI environments and from --role by hand: roles by
// rank, the coordinator's host, the advertise host, and the task-count errors.
#include "server/cluster_env.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace downpour {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<std::string> Nodes(std::string_view text) {
  std::vector<std::string> hosts;
  const Status s = ParseNodeList(text, &hosts);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return hosts;
}

std::string NodeError(std::string_view text) {
  std::vector<std::string> hosts;
  const Status s = ParseNodeList(text, &hosts);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << text;
  EXPECT_THAT(s.message(), HasSubstr(fmt::format("'{}'", text)));
  return s.message();
}

TEST(NodeList, ExpandsSlurmsCompactForm) {
  EXPECT_THAT(Nodes("n1"), ElementsAre("n1"));
  EXPECT_THAT(Nodes("n[1-3,7]"), ElementsAre("n1", "n2", "n3", "n7"));
  EXPECT_THAT(Nodes("gpu[01-03],cpu5"), ElementsAre("gpu01", "gpu02", "gpu03", "cpu5"));
  EXPECT_THAT(Nodes("rack[1-2]-n[1-2]"), ElementsAre("rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"));
  EXPECT_THAT(Nodes("n[8-11]"), ElementsAre("n8", "n9", "n10", "n11"));
  EXPECT_THAT(Nodes("node[098-101]"), ElementsAre("node098", "node099", "node100", "node101"));
  EXPECT_THAT(Nodes("a,b[2],c.example.org"), ElementsAre("a", "b2", "c.example.org"));
  EXPECT_THAT(Nodes("n[1-2]x"), ElementsAre("n1x", "n2x"));
}

TEST(NodeList, BadTextNamesTheTextAndThePosition) {
  EXPECT_THAT(NodeError(""), HasSubstr("empty"));
  EXPECT_THAT(NodeError("n[1-3"), HasSubstr("'[' without a closing ']' at position 1"));
  EXPECT_THAT(NodeError("n1-3]"), HasSubstr("']' without an opening '[' at position 4"));
  EXPECT_THAT(NodeError("n[3-1]"), HasSubstr("range '3-1' runs backwards at position 2"));
  EXPECT_THAT(NodeError("n[a-b]"), HasSubstr("'a-b' is not a number"));
  EXPECT_THAT(NodeError("n[]"), HasSubstr("empty brackets"));
  EXPECT_THAT(NodeError("n[1,,2]"), HasSubstr("an empty range at position 4"));
  EXPECT_THAT(NodeError("n1,,n2"), HasSubstr("an empty host name at position 3"));
  EXPECT_THAT(NodeError("n[[1]]"), HasSubstr("nested '['"));
  EXPECT_THAT(NodeError("n1 n2"), HasSubstr("white space at position 2"));
  EXPECT_THAT(NodeError("n[1-99999999]"), HasSubstr("too large"));
}

PlanInputs Shape(int servers, int workers) {
  PlanInputs in;
  in.servers = servers;
  in.workers = workers;
  in.config_coordinator = "127.0.0.1:5555";
  return in;
}

Environment SlurmEnv(int procid, int ntasks, const std::string& node) {
  return {{"SLURM_PROCID", std::to_string(procid)},
          {"SLURM_NTASKS", std::to_string(ntasks)},
          {"SLURM_STEP_NODELIST", "n[1-2]"},
          {"SLURM_JOB_NODELIST", "n[1-2]"},
          {"SLURMD_NODENAME", node},
          {"SLURM_JOB_ID", "42"},
          {"SLURM_STEP_ID", "0"}};
}

TEST(SlurmPlan, RanksMapToCoordinatorServersWorkers) {
  const PlanInputs in = Shape(2, 3);  // 6 tasks
  std::vector<std::string> names;
  for (int r = 0; r < 6; ++r) {
    TaskPlan p;
    ASSERT_TRUE(PlanSlurmTask(SlurmEnv(r, 6, r < 3 ? "n1" : "n2"), in, &p).ok());
    names.push_back(p.Name());
    EXPECT_EQ(p.coordinator, "n1:5555") << "first node of the step, port of cluster.coordinator";
    EXPECT_EQ(p.size, 6);
    EXPECT_EQ(p.job_id, "42.0");
  }
  EXPECT_THAT(names, ElementsAre("coordinator", "server 0", "server 1", "worker 0", "worker 1", "worker 2"));
  TaskPlan p;
  ASSERT_TRUE(PlanSlurmTask(SlurmEnv(4, 6, "n2"), in, &p).ok());
  EXPECT_EQ(p.role, TaskRole::kWorker);
  EXPECT_EQ(p.id, 1);
  EXPECT_EQ(p.FileStem(), "worker-1");
  EXPECT_EQ(p.node, "n2");
  EXPECT_EQ(p.advertise, "n2");
  EXPECT_EQ(p.advertise_from, "SLURMD_NODENAME");
  EXPECT_EQ(p.origin, "slurm task 4/6 (SLURM_PROCID=4 of SLURM_NTASKS=6) on n2");
}

TEST(SlurmPlan, AdvertiseAndCoordinatorFlagsWin) {
  PlanInputs in = Shape(1, 1);
  in.config_advertise = "n2.ib";
  TaskPlan p;
  ASSERT_TRUE(PlanSlurmTask(SlurmEnv(1, 3, "n2"), in, &p).ok());
  EXPECT_EQ(p.advertise, "n2.ib");
  EXPECT_EQ(p.advertise_from, "cluster.advertise");
  in.flag_advertise = "10.0.0.2";
  in.flag_coordinator = "head:7000";
  ASSERT_TRUE(PlanSlurmTask(SlurmEnv(1, 3, "n2"), in, &p).ok());
  EXPECT_EQ(p.advertise, "10.0.0.2");
  EXPECT_EQ(p.advertise_from, "--advertise");
  EXPECT_EQ(p.coordinator, "head:7000");
}

TEST(SlurmPlan, StepNodeListBeforeJobNodeList) {
  Environment env = SlurmEnv(0, 3, "gpu07");
  env["SLURM_STEP_NODELIST"] = "gpu[07-08]";
  env["SLURM_JOB_NODELIST"] = "gpu[01-08]";
  TaskPlan p;
  ASSERT_TRUE(PlanSlurmTask(env, Shape(1, 1), &p).ok());
  EXPECT_EQ(p.coordinator, "gpu07:5555");
  env.erase("SLURM_STEP_NODELIST");
  ASSERT_TRUE(PlanSlurmTask(env, Shape(1, 1), &p).ok());
  EXPECT_EQ(p.coordinator, "gpu01:5555");
}

TEST(SlurmPlan, HeterogeneousStepCountsEveryComponent) {
  Environment env = SlurmEnv(3, 2, "n2");  // SLURM_NTASKS of this component only
  env["SLURM_HET_SIZE"] = "2";
  env["SLURM_NTASKS_HET_GROUP_0"] = "3";
  env["SLURM_NTASKS_HET_GROUP_1"] = "2";
  env["SLURM_STEP_NODELIST_HET_GROUP_0"] = "n1";
  env["SLURM_STEP_NODELIST"] = "n2";
  TaskPlan p;
  const Status s = PlanSlurmTask(env, Shape(2, 2), &p);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(p.Name(), "worker 0");
  EXPECT_EQ(p.size, 5);
  EXPECT_EQ(p.coordinator, "n1:5555");
}

// A bare `srun -n3 A : -n2 B` (srun making its own allocation; Slurm 22.05) sets the total
// SLURM_NTASKS and only the older *_PACK_GROUP_<i> node lists.
TEST(SlurmPlan, BareHeterogeneousSrunUsesThePackGroupNodeList) {
  Environment env = SlurmEnv(1, 5, "n1");
  env.erase("SLURM_STEP_NODELIST");
  env["SLURM_HET_SIZE"] = "2";
  env["SLURM_JOB_NODELIST"] = "n[1-2]";
  env["SLURM_JOB_NODELIST_PACK_GROUP_0"] = "n2";
  env["SLURM_JOB_NODELIST_PACK_GROUP_1"] = "n1";
  TaskPlan p;
  const Status s = PlanSlurmTask(env, Shape(2, 2), &p);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(p.Name(), "server 0");
  EXPECT_EQ(p.size, 5);
  EXPECT_EQ(p.coordinator, "n2:5555");
}

TEST(SlurmPlan, WrongTaskCountSaysHowToFixIt) {
  TaskPlan p;
  Status s = PlanSlurmTask(SlurmEnv(0, 4, "n1"), Shape(2, 2), &p);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("SLURM_NTASKS=4 but this job needs 5 tasks (1 coordinator + 2 server(s) + 2 "
                                     "worker(s))"));
  EXPECT_THAT(s.message(), HasSubstr("#SBATCH --ntasks=5"));
  EXPECT_THAT(s.message(), HasSubstr("--servers/--workers"));
  s = PlanSlurmTask(SlurmEnv(0, 9, "n1"), Shape(2, 2), &p);
  EXPECT_THAT(s.message(), HasSubstr("SLURM_NTASKS=9 but this job needs 5 tasks"));
}

TEST(SlurmPlan, MissingOrBadVariablesAreNamed) {
  TaskPlan p;
  Environment env = SlurmEnv(0, 3, "n1");
  env.erase("SLURM_PROCID");
  Status s = PlanSlurmTask(env, Shape(1, 1), &p);
  EXPECT_THAT(s.message(), HasSubstr("SLURM_PROCID is not set"));
  EXPECT_THAT(s.message(), HasSubstr("srun"));
  env = SlurmEnv(0, 3, "n1");
  env["SLURM_NTASKS"] = "three";
  s = PlanSlurmTask(env, Shape(1, 1), &p);
  EXPECT_THAT(s.message(), HasSubstr("SLURM_NTASKS=three: expected a non-negative integer"));
  env = SlurmEnv(0, 3, "n1");
  env["SLURM_STEP_NODELIST"] = "n[1-";
  s = PlanSlurmTask(env, Shape(1, 1), &p);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("SLURM_STEP_NODELIST: node list 'n[1-'"));
  env = SlurmEnv(0, 3, "n1");
  env.erase("SLURM_STEP_NODELIST");
  env.erase("SLURM_JOB_NODELIST");
  s = PlanSlurmTask(env, Shape(1, 1), &p);
  EXPECT_THAT(s.message(), HasSubstr("none of SLURM_STEP_NODELIST, SLURM_JOB_NODELIST, SLURM_NODELIST is set"));
  EXPECT_THAT(s.message(), HasSubstr("--coordinator HOST:PORT"));
}

TEST(MpiPlan, OpenMpiThenPmiVariables) {
  TaskPlan p;
  Environment env = {{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"PMIX_NAMESPACE", "prterun-x@1"}};
  ASSERT_TRUE(PlanMpiTask(env, Shape(2, 1), &p).ok());
  EXPECT_EQ(p.Name(), "server 1");
  EXPECT_EQ(p.coordinator, "127.0.0.1:5555") << "cluster.coordinator as written";
  EXPECT_EQ(p.job_id, "prterun-x@1");
  EXPECT_EQ(p.origin, "mpi rank 2/4 (OMPI_COMM_WORLD_RANK=2 of OMPI_COMM_WORLD_SIZE=4)");
  env = {{"PMI_RANK", "3"}, {"PMI_SIZE", "4"}, {"SLURM_JOB_NODELIST", "c[5-6]"}};
  ASSERT_TRUE(PlanMpiTask(env, Shape(2, 1), &p).ok());
  EXPECT_EQ(p.Name(), "worker 0");
  EXPECT_EQ(p.coordinator, "c5:5555") << "inside a Slurm allocation: its first node";
  PlanInputs in = Shape(2, 1);
  in.flag_coordinator = "[::1]:6000";
  ASSERT_TRUE(PlanMpiTask(env, in, &p).ok());
  EXPECT_EQ(p.coordinator, "[::1]:6000");
}

TEST(MpiPlan, WrongSizeAndMissingRankAreErrors) {
  TaskPlan p;
  Status s = PlanMpiTask({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "3"}}, Shape(2, 2), &p);
  EXPECT_THAT(s.message(), HasSubstr("OMPI_COMM_WORLD_SIZE=3 but this job needs 5 tasks"));
  EXPECT_THAT(s.message(), HasSubstr("mpirun -np 5"));
  s = PlanMpiTask({}, Shape(1, 1), &p);
  EXPECT_THAT(s.message(), HasSubstr("neither OMPI_COMM_WORLD_RANK"));
}

TEST(ByHandPlan, RoleIdAndCoordinatorFromFlags) {
  PlanInputs in = Shape(2, 2);
  in.flag_role = "server";
  in.flag_id = 1;
  in.flag_coordinator = "127.0.0.2:5555";
  in.flag_advertise = "127.0.0.4";
  TaskPlan p;
  ASSERT_TRUE(PlanByHandTask(in, &p).ok());
  EXPECT_EQ(p.Name(), "server 1");
  EXPECT_EQ(p.rank, 2);
  EXPECT_EQ(p.coordinator, "127.0.0.2:5555");
  EXPECT_EQ(p.advertise, "127.0.0.4");
  EXPECT_EQ(p.origin, "started by hand (--role server --id 1)");
  in.flag_role = "coordinator";
  in.flag_id = -1;
  ASSERT_TRUE(PlanByHandTask(in, &p).ok());
  EXPECT_EQ(p.Name(), "coordinator");

  const auto error = [&](const std::string& role, int id, const std::string& coordinator) {
    PlanInputs bad = Shape(2, 2);
    bad.flag_role = role;
    bad.flag_id = id;
    bad.flag_coordinator = coordinator;
    const Status s = PlanByHandTask(bad, &p);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    return s.message();
  };
  EXPECT_THAT(error("boss", 0, "h:1"), HasSubstr("--role 'boss': expected coordinator, server or worker"));
  EXPECT_THAT(error("worker", -1, "h:1"), HasSubstr("--role worker needs --id I (0..1)"));
  EXPECT_THAT(error("worker", 2, "h:1"), HasSubstr("--id 2: out of range, this job has 2 workers"));
  EXPECT_THAT(error("server", 0, ""), HasSubstr("needs --coordinator HOST:PORT"));
  EXPECT_THAT(error("server", 0, "nohost"), HasSubstr("--coordinator = 'nohost': expected host:port"));
}

// cluster.transport = "ipc" needs one host: a multi-node job is refused naming the setting and
// the evidence; one node (or no evidence) passes.
TEST(OneHost, MultiNodeJobsAreRefusedNamingTheSettingAndTheEvidence) {
  const std::string what = "cluster.transport = \"ipc\"";
  TaskPlan slurm;
  slurm.mode = LaunchMode::kSlurm;
  slurm.size = 4;
  Status s = CheckOneHost({{"SLURM_STEP_NUM_NODES", "2"}, {"SLURM_STEP_NODELIST", "n[1-2]"}}, slurm, what);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("cluster.transport = \"ipc\" needs every process of the job on one host"));
  EXPECT_THAT(s.message(), HasSubstr("SLURM_STEP_NUM_NODES=2"));
  s = CheckOneHost({{"SLURM_JOB_NODELIST", "n[1-3]"}}, slurm, what);
  EXPECT_THAT(s.message(), HasSubstr("SLURM_JOB_NODELIST=n[1-3] lists 3 nodes"));
  EXPECT_TRUE(CheckOneHost({{"SLURM_STEP_NUM_NODES", "1"}, {"SLURM_JOB_NODELIST", "n[1-3]"}}, slurm, what).ok());
  EXPECT_TRUE(CheckOneHost({{"SLURM_STEP_NODELIST", "localhost"}}, slurm, what).ok());

  TaskPlan mpi;
  mpi.mode = LaunchMode::kMpi;
  mpi.size = 6;
  s = CheckOneHost({{"OMPI_COMM_WORLD_LOCAL_SIZE", "3"}}, mpi, what);
  EXPECT_THAT(s.message(), HasSubstr("OMPI_COMM_WORLD_LOCAL_SIZE=3 of 6 ranks run on this node"));
  EXPECT_TRUE(CheckOneHost({{"MPI_LOCALNRANKS", "6"}}, mpi, what).ok());
  EXPECT_TRUE(CheckOneHost({}, mpi, what).ok());  // unknown: allowed

  TaskPlan hand;
  hand.mode = LaunchMode::kByHand;
  hand.coordinator = "n1:5555";
  s = CheckOneHost({}, hand, what);
  EXPECT_THAT(s.message(), HasSubstr("--coordinator n1:5555 is not a loopback address"));
  hand.coordinator = "127.0.0.1:5555";
  EXPECT_TRUE(CheckOneHost({}, hand, what).ok());
  hand.coordinator = "localhost:5555";
  EXPECT_TRUE(CheckOneHost({}, hand, what).ok());
}

}  // namespace
}  // namespace downpour
