// cluster_env.cc — see cluster_env.h.
#include "server/cluster_env.h"

#include <fmt/format.h>

#include <charconv>

#include "common/net_address.h"

extern char** environ;

namespace downpour {
namespace {

constexpr size_t kMaxHosts = 1 << 20;  // a list that expands further is a typo, not a cluster

Status NodeListError(std::string_view text, size_t pos, std::string_view what) {
  return InvalidArgument("node list '{}': {} at position {}", text, what, pos);
}

// One "lo-hi" or "n" of a bracket group → the numbers, zero-padded to the width of `lo`
// as written (Slurm keeps "01").
Status ExpandRange(std::string_view text, size_t pos, std::string_view range, std::vector<std::string>* out) {
  const size_t dash = range.find('-');
  const std::string_view lo_text = range.substr(0, dash);
  const std::string_view hi_text = dash == std::string_view::npos ? lo_text : range.substr(dash + 1);
  auto number = [](std::string_view t, uint64_t* v) {
    if (t.empty() || t.size() > 18) return false;
    const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), *v);
    return ec == std::errc() && end == t.data() + t.size();
  };
  uint64_t lo = 0, hi = 0;
  if (!number(lo_text, &lo) || !number(hi_text, &hi)) {
    return NodeListError(text, pos, fmt::format("'{}' is not a number or a range of numbers (like 1-3)", range));
  }
  if (hi < lo) return NodeListError(text, pos, fmt::format("range '{}' runs backwards", range));
  if (hi - lo >= kMaxHosts) return NodeListError(text, pos, fmt::format("range '{}' is too large", range));
  const size_t width = lo_text.size();
  for (uint64_t v = lo; v <= hi; ++v) out->push_back(fmt::format("{:0{}}", v, width));
  return Status::Ok();
}

// The expansions of one bracket group "[1-3,7]" starting at text[open]; `*close` = the ']'.
Status ExpandBracket(std::string_view text, size_t open, size_t* close, std::vector<std::string>* out) {
  const size_t end = text.find(']', open);
  if (end == std::string_view::npos) return NodeListError(text, open, "'[' without a closing ']'");
  const size_t nested = text.find('[', open + 1);
  if (nested != std::string_view::npos && nested < end) return NodeListError(text, nested, "nested '['");
  if (end == open + 1) return NodeListError(text, open, "empty brackets");
  size_t start = open + 1;
  while (start <= end) {
    size_t comma = text.find(',', start);
    if (comma == std::string_view::npos || comma > end) comma = end;
    if (comma == start) return NodeListError(text, start, "an empty range");
    DP_RETURN_IF_ERROR(ExpandRange(text, start, text.substr(start, comma - start), out));
    start = comma + 1;
  }
  *close = end;
  return Status::Ok();
}

// One host expression (no top-level comma): literal text and bracket groups, each group
// multiplying the names so far.
Status ExpandHostExpression(std::string_view text, size_t begin, size_t end, std::vector<std::string>* hosts) {
  std::vector<std::string> names = {""};
  size_t i = begin;
  while (i < end) {
    if (text[i] == ']') return NodeListError(text, i, "']' without an opening '['");
    if (text[i] != '[') {
      const size_t next = std::min(text.find_first_of("[]", i), end);
      for (std::string& n : names) n.append(text.substr(i, next - i));
      i = next;
      continue;
    }
    size_t close = 0;
    std::vector<std::string> parts;
    DP_RETURN_IF_ERROR(ExpandBracket(text, i, &close, &parts));
    if (names.size() * parts.size() > kMaxHosts) return NodeListError(text, i, "the list expands to too many hosts");
    std::vector<std::string> grown;
    grown.reserve(names.size() * parts.size());
    for (const std::string& n : names) {
      for (const std::string& p : parts) grown.push_back(n + p);
    }
    names = std::move(grown);
    i = close + 1;
  }
  for (std::string& n : names) {
    if (n.empty()) return NodeListError(text, begin, "an empty host name");
    hosts->push_back(std::move(n));
  }
  return Status::Ok();
}

// The value of `name`, or "" when it is unset.
std::string Get(const Environment& env, const std::string& name) {
  const auto it = env.find(name);
  return it == env.end() ? std::string() : it->second;
}

// A non-negative integer environment variable; errors name the variable and its value.
Status GetInt(const Environment& env, const std::string& name, int* value) {
  const auto it = env.find(name);
  if (it == env.end()) return NotFound("{} is not set", name);
  const std::string& text = it->second;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *value);
  if (ec != std::errc() || end != text.data() + text.size() || *value < 0) {
    return InvalidArgument("{}={}: expected a non-negative integer", name, text);
  }
  return Status::Ok();
}

// Role and id of `rank` in a job of S servers and W workers.
void AssignRole(int rank, const PlanInputs& in, TaskPlan* out) {
  out->rank = rank;
  if (rank == 0) {
    out->role = TaskRole::kCoordinator;
    out->id = 0;
  } else if (rank <= in.servers) {
    out->role = TaskRole::kServer;
    out->id = rank - 1;
  } else {
    out->role = TaskRole::kWorker;
    out->id = rank - 1 - in.servers;
  }
}

// The task count must be exactly S+W+1: fewer leaves roles unstarted (the job would wait for
// them forever), more leaves tasks with no role.
Status CheckTaskCount(int size, const std::string& size_var, const PlanInputs& in, std::string_view fix) {
  const int need = in.servers + in.workers + 1;
  if (size == need) return Status::Ok();
  return InvalidArgument(
      "{}={} but this job needs {} tasks (1 coordinator + {} server(s) + {} worker(s)): {}, or change "
      "--servers/--workers (cluster.servers/cluster.workers)",
      size_var, size, need, in.servers, in.workers, fmt::format(fmt::runtime(fix), need));
}

// --advertise, else cluster.advertise, else what the resource manager calls this node.
void ChooseAdvertise(const PlanInputs& in, const std::string& node, const std::string& node_var, TaskPlan* out) {
  if (!in.flag_advertise.empty()) {
    out->advertise = in.flag_advertise;
    out->advertise_from = "--advertise";
  } else if (!in.config_advertise.empty()) {
    out->advertise = in.config_advertise;
    out->advertise_from = "cluster.advertise";
  } else if (!node.empty()) {
    out->advertise = node;
    out->advertise_from = node_var;
  }
}

// <host>:<port of cluster.coordinator>.
Status CoordinatorOnHost(const std::string& host, const PlanInputs& in, std::string* out) {
  HostPort configured;
  DP_RETURN_IF_ERROR(ParseHostPort(in.config_coordinator, "cluster.coordinator", &configured));
  *out = FormatHostPort(host, configured.port);
  return Status::Ok();
}

// First host of a compact node list held in `var`.
Status FirstNode(const Environment& env, const std::string& var, std::string* host) {
  std::vector<std::string> hosts;
  const Status s = ParseNodeList(Get(env, var), &hosts);
  if (!s.ok()) return InvalidArgument("{}: {}", var, s.message());
  *host = hosts.front();
  return Status::Ok();
}

// A heterogeneous step numbers its tasks across components (SLURM_PROCID is global) while
// SLURM_NTASKS may be the component's: count SLURM_NTASKS_HET_GROUP_<i> over the components.
Status SlurmTaskCount(const Environment& env, int* size, std::string* size_var) {
  int components = 0;
  if (GetInt(env, "SLURM_HET_SIZE", &components).ok() && components > 1) {
    int total = 0;
    for (int i = 0; i < components; ++i) {
      int n = 0;
      const std::string var = fmt::format("SLURM_NTASKS_HET_GROUP_{}", i);
      if (!GetInt(env, var, &n).ok()) {
        total = -1;
        break;
      }
      total += n;
    }
    if (total > 0) {
      *size = total;
      *size_var = fmt::format("the {} components' SLURM_NTASKS_HET_GROUP_<i> (sum)", components);
      return Status::Ok();
    }
  }
  *size_var = "SLURM_NTASKS";
  return GetInt(env, "SLURM_NTASKS", size);
}

}  // namespace

Status ParseNodeList(std::string_view text, std::vector<std::string>* hosts) {
  hosts->clear();
  if (text.empty()) return InvalidArgument("node list '' is empty");
  size_t begin = 0;
  int depth = 0;
  for (size_t i = 0; i <= text.size(); ++i) {
    const char c = i < text.size() ? text[i] : ',';
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (c == ',' && (depth <= 0 || i == text.size())) {
      if (i == begin) return NodeListError(text, i, "an empty host name");
      DP_RETURN_IF_ERROR(ExpandHostExpression(text, begin, i, hosts));
      if (hosts->size() > kMaxHosts) return NodeListError(text, i, "the list expands to too many hosts");
      begin = i + 1;
      depth = 0;
    }
    if (i < text.size() && (c == ' ' || c == '\t' || c == '\n')) return NodeListError(text, i, "white space");
  }
  return Status::Ok();
}

Environment ProcessEnvironment() {
  Environment env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string_view entry(*e);
    const size_t eq = entry.find('=');
    if (eq != std::string_view::npos) env.emplace(entry.substr(0, eq), entry.substr(eq + 1));
  }
  return env;
}

const char* TaskRoleName(TaskRole role) {
  switch (role) {
    case TaskRole::kCoordinator:
      return "coordinator";
    case TaskRole::kServer:
      return "server";
    case TaskRole::kWorker:
      return "worker";
  }
  return "?";
}

bool ParseTaskRole(std::string_view text, TaskRole* role) {
  for (TaskRole r : {TaskRole::kCoordinator, TaskRole::kServer, TaskRole::kWorker}) {
    if (text == TaskRoleName(r)) {
      *role = r;
      return true;
    }
  }
  return false;
}

std::string TaskPlan::Name() const {
  return role == TaskRole::kCoordinator ? "coordinator" : fmt::format("{} {}", TaskRoleName(role), id);
}

std::string TaskPlan::FileStem() const {
  return role == TaskRole::kCoordinator ? "coordinator" : fmt::format("{}-{}", TaskRoleName(role), id);
}

Status PlanSlurmTask(const Environment& env, const PlanInputs& in, TaskPlan* out) {
  *out = TaskPlan{};
  out->mode = LaunchMode::kSlurm;
  int rank = 0, size = 0;
  std::string size_var;
  const Status rank_status = GetInt(env, "SLURM_PROCID", &rank);
  if (!rank_status.ok()) {
    return InvalidArgument("--slurm: {} (run it as a task of a Slurm job step: srun downpour-launch --slurm ...)",
                           rank_status.message());
  }
  DP_RETURN_IF_ERROR(SlurmTaskCount(env, &size, &size_var));
  DP_RETURN_IF_ERROR(CheckTaskCount(size, size_var, in, "set #SBATCH --ntasks={0} (or srun -n {0})"));
  if (rank >= size) return InvalidArgument("SLURM_PROCID={} is not below {}={}", rank, size_var, size);
  AssignRole(rank, in, out);
  out->size = size;

  // The coordinator (rank 0) runs on the first node of the step (of component 0 in a
  // heterogeneous step), where Slurm's block distribution puts task 0.
  std::string list_var;
  int components = 0;
  const bool het = GetInt(env, "SLURM_HET_SIZE", &components).ok() && components > 1;
  const std::vector<const char*> lists =
      // A bare `srun A : B` (srun making its own allocation) sets only the older *_PACK_GROUP_<i>
      // names (Slurm 22.05); the whole step's list is the last resort.
      het ? std::vector<const char*>{"SLURM_STEP_NODELIST_HET_GROUP_0", "SLURM_JOB_NODELIST_HET_GROUP_0",
                                     "SLURM_JOB_NODELIST_PACK_GROUP_0", "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"}
          : std::vector<const char*>{"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"};
  for (const char* var : lists) {
    if (!Get(env, var).empty()) {
      list_var = var;
      break;
    }
  }
  std::string first;
  if (!in.flag_coordinator.empty()) {
    out->coordinator = in.flag_coordinator;
  } else {
    if (list_var.empty()) {
      return InvalidArgument(
          "--slurm: no node list to find the coordinator's node in (none of {} is set); pass "
          "--coordinator HOST:PORT",
          fmt::join(lists, ", "));
    }
    DP_RETURN_IF_ERROR(FirstNode(env, list_var, &first));
    DP_RETURN_IF_ERROR(CoordinatorOnHost(first, in, &out->coordinator));
  }
  out->node = Get(env, "SLURMD_NODENAME");
  ChooseAdvertise(in, out->node, "SLURMD_NODENAME", out);
  const std::string job = Get(env, "SLURM_JOB_ID").empty() ? Get(env, "SLURM_JOBID") : Get(env, "SLURM_JOB_ID");
  const std::string step = Get(env, "SLURM_STEP_ID").empty() ? Get(env, "SLURM_STEPID") : Get(env, "SLURM_STEP_ID");
  out->job_id = job.empty() ? "" : (step.empty() ? job : job + "." + step);
  out->origin = fmt::format("slurm task {}/{} (SLURM_PROCID={} of {}={}){}", rank, size, rank, size_var, size,
                            out->node.empty() ? "" : " on " + out->node);
  return Status::Ok();
}

Status PlanMpiTask(const Environment& env, const PlanInputs& in, TaskPlan* out) {
  *out = TaskPlan{};
  out->mode = LaunchMode::kMpi;
  std::string rank_var = "OMPI_COMM_WORLD_RANK", size_var = "OMPI_COMM_WORLD_SIZE";
  if (Get(env, rank_var).empty()) {
    rank_var = "PMI_RANK";
    size_var = "PMI_SIZE";
  }
  if (Get(env, rank_var).empty()) {
    return InvalidArgument(
        "--mpi: neither OMPI_COMM_WORLD_RANK (Open MPI) nor PMI_RANK (MPICH, Intel MPI) is set (run it under "
        "mpirun -np N downpour-launch --mpi ...)");
  }
  int rank = 0, size = 0;
  DP_RETURN_IF_ERROR(GetInt(env, rank_var, &rank));
  DP_RETURN_IF_ERROR(GetInt(env, size_var, &size));
  DP_RETURN_IF_ERROR(CheckTaskCount(size, size_var, in, "run mpirun -np {0}"));
  if (rank >= size) return InvalidArgument("{}={} is not below {}={}", rank_var, rank, size_var, size);
  AssignRole(rank, in, out);
  out->size = size;
  // MPI says nothing portable about where rank 0 runs: --coordinator, else (mpirun inside a
  // Slurm allocation) the allocation's first node, where mpirun maps rank 0 by default, else
  // cluster.coordinator as written.
  if (!in.flag_coordinator.empty()) {
    out->coordinator = in.flag_coordinator;
  } else if (!Get(env, "SLURM_JOB_NODELIST").empty()) {
    std::string first;
    DP_RETURN_IF_ERROR(FirstNode(env, "SLURM_JOB_NODELIST", &first));
    DP_RETURN_IF_ERROR(CoordinatorOnHost(first, in, &out->coordinator));
  } else {
    out->coordinator = in.config_coordinator;
  }
  ChooseAdvertise(in, "", "", out);
  for (const char* var : {"PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid", "PMI_JOBID"}) {
    if (!Get(env, var).empty()) {
      out->job_id = Get(env, var);
      break;
    }
  }
  out->origin = fmt::format("mpi rank {}/{} ({}={} of {}={})", rank, size, rank_var, rank, size_var, size);
  return Status::Ok();
}

Status CheckOneHost(const Environment& env, const TaskPlan& plan, std::string_view what) {
  auto spans = [&](const std::string& evidence) {
    return InvalidArgument("{} needs every process of the job on one host, but {}: use cluster.transport = \"tcp\"",
                           what, evidence);
  };
  switch (plan.mode) {
    case LaunchMode::kSlurm: {
      for (const char* var : {"SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES", "SLURM_NNODES"}) {
        int nodes = 0;
        if (GetInt(env, var, &nodes).ok()) {
          if (nodes > 1) return spans(fmt::format("{}={}", var, nodes));
          return Status::Ok();
        }
      }
      for (const char* var : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}) {
        std::vector<std::string> hosts;
        if (Get(env, var).empty() || !ParseNodeList(Get(env, var), &hosts).ok()) continue;
        if (hosts.size() > 1) return spans(fmt::format("{}={} lists {} nodes", var, Get(env, var), hosts.size()));
        return Status::Ok();
      }
      return Status::Ok();
    }
    case LaunchMode::kMpi:
      for (const char* var : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"}) {
        int local = 0;
        if (GetInt(env, var, &local).ok()) {
          if (local < plan.size) return spans(fmt::format("{}={} of {} ranks run on this node", var, local, plan.size));
          return Status::Ok();
        }
      }
      return Status::Ok();
    case LaunchMode::kByHand: {
      HostPort coordinator;
      if (!ParseHostPort(plan.coordinator, "--coordinator", &coordinator).ok()) return Status::Ok();
      if (IsLoopbackLiteral(coordinator.host) || coordinator.host == "localhost") return Status::Ok();
      return spans(fmt::format("--coordinator {} is not a loopback address", plan.coordinator));
    }
  }
  return Status::Ok();
}

Status PlanByHandTask(const PlanInputs& in, TaskPlan* out) {
  *out = TaskPlan{};
  out->mode = LaunchMode::kByHand;
  TaskRole role;
  if (!ParseTaskRole(in.flag_role, &role)) {
    return InvalidArgument("--role '{}': expected coordinator, server or worker", in.flag_role);
  }
  if (in.flag_coordinator.empty()) {
    return InvalidArgument("--role {} needs --coordinator HOST:PORT (where the coordinator of this job listens)",
                           in.flag_role);
  }
  HostPort check;
  DP_RETURN_IF_ERROR(ParseHostPort(in.flag_coordinator, "--coordinator", &check));
  const int count = role == TaskRole::kServer ? in.servers : in.workers;
  if (role == TaskRole::kCoordinator) {
    if (in.flag_id > 0) return InvalidArgument("--role coordinator takes no --id (got {})", in.flag_id);
    AssignRole(0, in, out);
  } else if (in.flag_id < 0) {
    return InvalidArgument("--role {} needs --id I (0..{})", in.flag_role, count - 1);
  } else if (in.flag_id >= count) {
    return InvalidArgument("--role {} --id {}: out of range, this job has {} {}s (ids 0..{})", in.flag_role, in.flag_id,
                           count, in.flag_role, count - 1);
  } else {
    AssignRole(role == TaskRole::kServer ? 1 + in.flag_id : 1 + in.servers + in.flag_id, in, out);
  }
  out->size = in.servers + in.workers + 1;
  out->coordinator = in.flag_coordinator;
  ChooseAdvertise(in, "", "", out);
  out->origin = fmt::format("started by hand (--role {}{})", in.flag_role,
                            role == TaskRole::kCoordinator ? "" : fmt::format(" --id {}", in.flag_id));
  return Status::Ok();
}

}  // namespace downpour
