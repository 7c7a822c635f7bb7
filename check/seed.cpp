#include "check/seed.hpp"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <random>
#include <string>

#include "weave/common/error.hpp"
#include "weave/common/hash.hpp"
#include "weave/runtime/env.hpp"

namespace weave::check {

SeedChoice choose_seed(const char* test_seed_env, const char* job_id, const char* weave_rank) {
  if (test_seed_env && *test_seed_env) {
    char* end = nullptr;
    errno = 0;
    const unsigned long long x = std::strtoull(test_seed_env, &end, 0);
    WEAVE_CHECK(errno == 0 && end != test_seed_env && *end == 0, "WEAVE_TEST_SEED='", test_seed_env,
                "' is not an unsigned integer (decimal or 0x-hex)");
    return {SeedChoice::Env, x};
  }
  // The ranks of one weave-run job (a fresh random id per launch) draw the same seed: the seed
  // any rank prints after a failure is the one that replays the whole job, as when
  // WEAVE_TEST_SEED is given (multi-rank tests take rank 0's seed on every rank). Only weave-run's
  // id (it sets WEAVE_RANK beside it): a WEAVE_JOB_ID a user fixes for another launcher would give
  // every run the same inputs.
  if (job_id && *job_id && weave_rank) return {SeedChoice::Job, job_seed(job_id)};
  return {SeedChoice::Os, 0};
}

namespace {
struct SeedState {
  uint64_t value = 0;
  bool from_env = false;
  bool from_job = false;
};

const SeedState& state() {
  static const SeedState s = [] {
    SeedState st;
    const auto seed = env::raw("WEAVE_TEST_SEED"), job = env::raw("WEAVE_JOB_ID"), rank = env::raw("WEAVE_RANK");
    const auto c_str = [](const std::optional<std::string>& v) { return v ? v->c_str() : nullptr; };
    const SeedChoice c = choose_seed(c_str(seed), c_str(job), c_str(rank));
    st.value = c.value;
    st.from_env = c.kind == SeedChoice::Env;
    st.from_job = c.kind == SeedChoice::Job;
    if (c.kind == SeedChoice::Os) {
      std::random_device rd;
      st.value = (uint64_t(rd()) << 32) ^ rd();
    }
    std::printf("WEAVE_TEST_SEED=%llu%s\n", static_cast<unsigned long long>(st.value),
                st.from_env   ? " (from the environment)"
                : st.from_job ? " (drawn from the job id, the same on every rank; set it to replay this run)"
                              : " (set it to replay this run)");
    std::fflush(stdout);
    return st;
  }();
  return s;
}
}  // namespace

uint64_t test_seed() { return state().value; }

uint64_t job_seed(std::string_view job_id) { return derive(fnv1a(job_id), 0x7E57); }
bool seed_from_env() { return state().from_env; }

uint64_t derive(uint64_t base, uint64_t a, uint64_t b) {
  // splitmix64 finaliser over a combination that differs for every (a, b).
  uint64_t x = base ^ (a * 0x9E3779B97F4A7C15ull) ^ (b * 0xC2B2AE3D27D4EB4Full + 0x165667B19E3779F9ull);
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

namespace {
struct Cases {
  std::mutex m;
  uint64_t scope = 0;  // a hash of the current test's name (0 before the first)
  uint64_t n = 0;      // cases drawn in this scope
};
Cases& cases() {
  static Cases c;
  return c;
}
}  // namespace

uint64_t case_seed(uint64_t what) {
  Cases& c = cases();
  std::lock_guard<std::mutex> lock(c.m);
  return derive(test_seed() ^ c.scope, c.n++, what);
}

void begin_test_cases(std::string_view name) {
  Cases& c = cases();
  std::lock_guard<std::mutex> lock(c.m);
  c.scope = fnv1a(name);
  c.n = 0;
}

}  // namespace weave::check
