#include "weave/runtime/launch.hpp"

#include <unistd.h>

#include <optional>

#include "weave/common/error.hpp"
#include "weave/runtime/env.hpp"

namespace weave::runtime {
namespace {

using detail::concat;

// The four variables each launcher sets, named so that errors point at the exact variable.
struct Vars {
  const char* launcher;
  const char* rank;
  const char* world;
  const char* local_rank;
  const char* local_world;
};

// Set but empty is malformed here, not "use the default": a launcher that sets the variable
// means a rank, and there is no default rank.
int read_int(const Vars& v, const char* name) {
  auto s = env::raw(name);
  if (!s) throw Error(concat("weave: ", v.launcher, " environment is incomplete: ", name, " is not set"));
  try {
    return env::parse_int(name, *s);
  } catch (const Error& e) {
    throw Error(concat(e.what(), " (", v.launcher, " environment)"));
  }
}

LaunchInfo read_vars(const Vars& v) {
  LaunchInfo li;
  li.launcher = v.launcher;
  li.rank = read_int(v, v.rank);
  li.world = read_int(v, v.world);
  li.local_rank = read_int(v, v.local_rank);
  li.local_world = read_int(v, v.local_world);
  auto fail = [&](const std::string& what) { throw Error(concat("weave: invalid ", v.launcher, " environment: ", what)); };
  if (li.world < 1) fail(concat(v.world, "=", li.world, " must be >= 1"));
  if (li.rank < 0 || li.rank >= li.world) fail(concat(v.rank, "=", li.rank, " is outside [0, ", v.world, "=", li.world, ")"));
  if (li.local_world < 1) fail(concat(v.local_world, "=", li.local_world, " must be >= 1"));
  if (li.local_world > li.world)
    fail(concat(v.local_world, "=", li.local_world, " exceeds ", v.world, "=", li.world));
  if (li.local_rank < 0 || li.local_rank >= li.local_world)
    fail(concat(v.local_rank, "=", li.local_rank, " is outside [0, ", v.local_world, "=", li.local_world, ")"));
  return li;
}

// WEAVE_JOB_ID, when set, names the job for every launcher (e.g. for a launcher whose own ids
// are missing or not unique per node).
std::optional<std::string> job_override() {
  auto id = env::raw("WEAVE_JOB_ID");
  if (id && id->empty()) throw Error("weave: WEAVE_JOB_ID is set but empty");
  return id;
}

bool any_set(std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (env::raw(n)) return true;
  return false;
}

}  // namespace

LaunchInfo detect_launch() {
  if (any_set({"WEAVE_RANK", "WEAVE_WORLD_SIZE", "WEAVE_LOCAL_RANK", "WEAVE_LOCAL_WORLD_SIZE"})) {
    LaunchInfo li = read_vars({"weave-run", "WEAVE_RANK", "WEAVE_WORLD_SIZE", "WEAVE_LOCAL_RANK", "WEAVE_LOCAL_WORLD_SIZE"});
    auto id = job_override();
    if (!id) throw Error("weave: weave-run environment is incomplete: WEAVE_JOB_ID is not set");
    li.job_id = *id;
    return li;
  }
  if (any_set({"RANK", "WORLD_SIZE"})) {
    LaunchInfo li = read_vars({"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"});
    if (auto id = job_override()) {
      li.job_id = *id;
      return li;
    }
    // The rendezvous id alone is often the default "none"; the master's address and port make
    // it unique among the jobs running at the same time.
    auto run = env::raw("TORCHELASTIC_RUN_ID"), addr = env::raw("MASTER_ADDR"), port = env::raw("MASTER_PORT");
    if (!run && !port)
      throw Error("weave: torchrun environment has neither TORCHELASTIC_RUN_ID nor MASTER_PORT to derive a job id; "
                  "set WEAVE_JOB_ID to a value unique per job");
    li.job_id = concat("torchrun-", run.value_or(""), "-", addr.value_or(""), "-", port.value_or(""));
    return li;
  }
  if (any_set({"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"})) {
    LaunchInfo li = read_vars({"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                               "OMPI_COMM_WORLD_LOCAL_SIZE"});
    if (auto id = job_override()) {
      li.job_id = *id;
      return li;
    }
    for (const char* name : {"PMIX_NAMESPACE", "OMPI_MCA_orte_hnp_uri", "OMPI_MCA_ess_base_jobid"}) {
      if (auto v = env::raw(name); v && !v->empty()) {
        li.job_id = concat("mpirun-", *v);
        return li;
      }
    }
    throw Error("weave: OpenMPI environment has none of PMIX_NAMESPACE, OMPI_MCA_orte_hnp_uri, "
                "OMPI_MCA_ess_base_jobid to derive a job id; set WEAVE_JOB_ID to a value unique per job");
  }
  LaunchInfo li;
  li.launcher = "single";
  li.job_id = job_override().value_or(concat("single-", ::getpid()));
  return li;
}

}  // namespace weave::runtime
