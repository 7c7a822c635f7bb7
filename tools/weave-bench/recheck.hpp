// The benchmarks' correctness check of a timed implementation (docs/testing.md): the last timed
// call's output, then one more call on another input set into a freshly poisoned output, checked
// the same way; the row is correct only when both pass. The second check catches a kernel that
// leaves an earlier call's result in place (state carried between launches, e.g. a split-K
// counter; a store skipped after the first launches): the first check alone passes it whenever
// the last timed call's input set came round earlier in the loop. Used by weave-bench gemm (its
// weave rows), gemm_fp8, moe, attention, quantize, collectives and tp (its GEMM alone rows of
// gemm_rs and gemm_ar); sp, and tp's rows that share a reference (its recheck()), do the same with
// their own verdicts. Multi-rank: check() must return the verdict over every rank, so that every
// rank makes or skips the fresh (collective) call alike.
#pragma once
#include "weave/common/error.hpp"

namespace weave::bench {

// last: the input set of the last timed call, whose output is in place; sets: how many input sets
// there are (>= 2). check(set) compares the output with set's reference and returns a report with
// `bool ok` and `double worst` (check::Report, or the bench's own); poison() re-poisons the output;
// call(set) enqueues one call on input set `set`. The fresh call uses set (last + 1) % sets.
// Returns the first failing report, else the one with the larger worst.
template <class Check, class Poison, class Call>
auto check_last_and_fresh(int last, int sets, Check&& check, Poison&& poison, Call&& call) {
  WEAVE_CHECK(sets >= 2 && last >= 0 && last < sets, "check_last_and_fresh: set ", last, " of ", sets,
              " (the fresh call needs another input set)");
  auto first = check(last);
  if (!first.ok) return first;
  const int other = (last + 1) % sets;
  poison();
  call(other);
  auto second = check(other);
  if (!second.ok || !(second.worst < first.worst)) return second;
  return first;
}

}  // namespace weave::bench
