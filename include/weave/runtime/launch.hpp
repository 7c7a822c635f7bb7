// Who am I in this job: read from weave-run, torchrun or OpenMPI's environment.
#pragma once
#include <string>

namespace weave::runtime {

struct LaunchInfo {
  int rank = 0;
  int world = 1;
  int local_rank = 0;
  int local_world = 1;
  std::string job_id;    // unique per job on a node; names the bootstrap socket
  std::string launcher;  // "weave-run", "torchrun", "mpirun" or "single"
};

// weave-run: WEAVE_RANK, WEAVE_WORLD_SIZE, WEAVE_LOCAL_RANK, WEAVE_LOCAL_WORLD_SIZE, WEAVE_JOB_ID.
// torchrun: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE (job id from TORCHELASTIC_RUN_ID and
// MASTER_ADDR/MASTER_PORT). OpenMPI: OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE} (job id
// from PMIX_NAMESPACE or OMPI_MCA_orte_hnp_uri/OMPI_MCA_ess_base_jobid). None: a single rank.
// Throws weave::Error on inconsistent or malformed values.
LaunchInfo detect_launch();

}  // namespace weave::runtime
