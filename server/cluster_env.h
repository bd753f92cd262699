// cluster_env.h — which role this downpour-launch task runs, from the resource manager's
// environment (Slurm, an MPI launcher) or from the command line (by hand), as torchrun and
// horovodrun do it: one launcher entry point, roles from the environment, rendezvous at a
// well-known host:port.
//
// Ranks: 0 = the coordinator, 1..S = servers 0..S-1, S+1..S+W = workers 0..W-1; a job has
// exactly S+W+1 tasks. The coordinator is reached at <host of rank 0>:<port of
// cluster.coordinator>:
//   Slurm  SLURM_PROCID, SLURM_NTASKS; hosts from SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST),
//          the coordinator on the first; this task's node SLURMD_NODENAME (its advertise host
//          unless --advertise / cluster.advertise say otherwise); job SLURM_JOB_ID.SLURM_STEP_ID.
//          A heterogeneous step (SLURM_HET_SIZE) counts the tasks of every component
//          (SLURM_NTASKS_HET_GROUP_<i>) and puts the coordinator on the first node of component 0.
//   MPI    OMPI_COMM_WORLD_RANK/SIZE, else PMI_RANK/PMI_SIZE (MPICH, Intel MPI); the coordinator
//          host from --coordinator, else inside a Slurm allocation the first node of
//          SLURM_JOB_NODELIST, else cluster.coordinator; job id PMIX_NAMESPACE or
//          OMPI_MCA_ess_base_jobid.
//   hand   --role coordinator|server|worker [--id I] --coordinator HOST:PORT.
// The environment reaches this code only as an Environment map (tests pass their own;
// ProcessEnvironment() is the real one), so nothing else reads these variables.
//
// Thread-safety: reentrant free functions over values.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace downpour {

// Expands Slurm's compact host list: "n[1-3,7]" → n1 n2 n3 n7, "gpu[01-03],cpu5" (zero
// padding kept), "rack[1-2]-n[1-2]" → rack1-n1 rack1-n2 rack2-n1 rack2-n2, as
// `scontrol show hostnames` does. Errors quote the text and name the position (0-based) of
// what is wrong.
Status ParseNodeList(std::string_view compact, std::vector<std::string>* hosts);

using Environment = std::map<std::string, std::string>;
// This process's environment.
Environment ProcessEnvironment();

enum class TaskRole { kCoordinator, kServer, kWorker };
const char* TaskRoleName(TaskRole role);  // "coordinator" | "server" | "worker"
// "coordinator" | "server" | "worker" → role; false otherwise.
bool ParseTaskRole(std::string_view text, TaskRole* role);

enum class LaunchMode { kSlurm, kMpi, kByHand };

// One task of a cluster job.
struct TaskPlan {
  LaunchMode mode = LaunchMode::kByHand;
  int rank = 0;  // 0 .. size-1 (by hand: the rank the role would have)
  int size = 0;  // S + W + 1
  TaskRole role = TaskRole::kCoordinator;
  int id = 0;                  // server or worker id; 0 for the coordinator
  std::string node;            // this task's node as the resource manager names it ("" unknown)
  std::string coordinator;     // host:port every task registers with
  std::string advertise;       // host this task advertises ("" = derive it, net_address.h)
  std::string advertise_from;  // where `advertise` came from, for errors ("SLURMD_NODENAME", ...)
  std::string job_id;          // "1234.0" (Slurm job.step), the MPI job's id, "" = none
  std::string origin;          // where the role came from, e.g. "slurm task 3/6 (SLURM_PROCID=3 of
                               // SLURM_NTASKS=6) on n2"

  // "coordinator", "server 2", "worker 0" (log prefixes).
  std::string Name() const;
  // "coordinator", "server-2", "worker-0" (file names).
  std::string FileStem() const;
};

// What the launcher knows apart from the environment.
struct PlanInputs {
  int servers = 1;                 // S (after --servers)
  int workers = 1;                 // W (after --workers)
  std::string config_coordinator;  // cluster.coordinator (host:port)
  std::string config_advertise;    // cluster.advertise ("" = none)
  std::string flag_coordinator;    // --coordinator HOST:PORT ("" = none)
  std::string flag_advertise;      // --advertise HOST ("" = none)
  std::string flag_role;           // --role (by hand)
  int flag_id = -1;                // --id (by hand; -1 = not given)
};

// Whether the job of `plan` may span hosts, for settings that need every process on one host
// (cluster.transport = "ipc"; `what` names the setting in the error). InvalidArgument, naming
// `what` and the evidence, when:
//   Slurm   the step's node count (SLURM_STEP_NUM_NODES, else SLURM_JOB_NUM_NODES / SLURM_NNODES,
//           else the node list's length) is above 1;
//   MPI     the ranks on this node (OMPI_COMM_WORLD_LOCAL_SIZE, else MPI_LOCALNRANKS) are fewer
//           than the job's; unknown = allowed;
//   hand    the coordinator's host is not a loopback address or "localhost" (a job started by
//           hand on one host names it so).
Status CheckOneHost(const Environment& env, const TaskPlan& plan, std::string_view what);

Status PlanSlurmTask(const Environment& env, const PlanInputs& in, TaskPlan* out);
Status PlanMpiTask(const Environment& env, const PlanInputs& in, TaskPlan* out);
Status PlanByHandTask(const PlanInputs& in, TaskPlan* out);

}  // namespace downpour
