// Replayable random seeds for tests and benchmarks. Every run draws a fresh seed unless
// WEAVE_TEST_SEED is set (decimal or 0x-hex); the seed is printed once so a failure can be
// replayed with the same inputs.
#pragma once
#include <cstdint>

namespace weave::check {

// The process's seed: WEAVE_TEST_SEED if set, else drawn once from the OS. The first call
// prints "WEAVE_TEST_SEED=<seed>" to stdout. A malformed WEAVE_TEST_SEED throws weave::Error
// naming the variable.
uint64_t test_seed();

// True when WEAVE_TEST_SEED was given (multi-rank code then uses it as is on every rank).
bool seed_from_env();

// A stream of independent seeds derived from a base: derive(base, a, b) differs for every (a, b).
uint64_t derive(uint64_t base, uint64_t a, uint64_t b = 0);

// The seed of input `what` of this process's next test case (each call is a new case): the same
// sequence of cases replays from the same WEAVE_TEST_SEED.
uint64_t case_seed(uint64_t what);

}  // namespace weave::check
