// What the adaptive SM split did over a kernel's calls on this rank (sm_ledger.cuh's statistics),
// as the host reads it back; plain C++, so that host-only code (weave-bench, the tests) can hold it.
#pragma once

namespace weave::tp {

// Launches ended, communication tasks (reductions) handed out while compute tasks were still
// unclaimed, and the most blocks communicating then.
struct AdaptiveStats {
  unsigned long long launches = 0, early_reductions = 0, peak_comm_blocks = 0;
};

}  // namespace weave::tp
