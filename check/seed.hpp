// Replayable random seeds for tests and benchmarks. Every run draws a fresh seed unless
// WEAVE_TEST_SEED is set (decimal or 0x-hex); the seed is printed once so a failure can be
// replayed with the same inputs.
#pragma once
#include <cstdint>
#include <string_view>

namespace weave::check {

// The process's seed: WEAVE_TEST_SEED if set; else, under weave-run (WEAVE_JOB_ID and WEAVE_RANK
// set), drawn from the job's id (every rank of the job the same); else drawn once from the OS.
// The first call prints "WEAVE_TEST_SEED=<seed>" to stdout. A malformed WEAVE_TEST_SEED throws
// weave::Error naming the variable.
uint64_t test_seed();

// test_seed's choice from the values of WEAVE_TEST_SEED, WEAVE_JOB_ID and WEAVE_RANK (null:
// unset); Os: the caller draws the value.
struct SeedChoice {
  enum Kind { Env, Job, Os } kind;
  uint64_t value;
};
SeedChoice choose_seed(const char* test_seed_env, const char* job_id, const char* weave_rank);

// The seed every rank of the job named `job_id` (weave-run's WEAVE_JOB_ID) draws without
// WEAVE_TEST_SEED.
uint64_t job_seed(std::string_view job_id);

// True when WEAVE_TEST_SEED was given (multi-rank code then uses it as is on every rank).
bool seed_from_env();

// A stream of independent seeds derived from a base: derive(base, a, b) differs for every (a, b).
uint64_t derive(uint64_t base, uint64_t a, uint64_t b = 0);

// The seed of input `what` of this process's next test case (each call is a new case): the same
// sequence of cases replays from the same WEAVE_TEST_SEED. Cases count from the last
// begin_test_cases (from the process's start without one), so that one test replays alone.
uint64_t case_seed(uint64_t what);

// Starts test `name`'s cases: case_seed counts from 0 again, under a seed derived from the name.
// The test main calls it before every GoogleTest test, so `WEAVE_TEST_SEED=s --gtest_filter=T`
// draws the inputs test T drew in the full run.
void begin_test_cases(std::string_view name);

}  // namespace weave::check
