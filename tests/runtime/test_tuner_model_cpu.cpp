// The tuner's miss path with a cost model (runtime/tuner.hpp): by default a key the cache does not
// hold takes the model's pick without timing anything and keeps it in memory only; search mode
// ($WEAVE_TUNER=search or Tuner::set_mode) times the candidates, also for a key the model answered
// before, and its measured winner, written to the file, wins over the model from then on, in this
// process and the next. In a group, rank 0's model decides for every rank, and a later call of the
// key (a CUDA graph capture's, through agreed()) finds that pick.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <barrier>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "weave/common/error.hpp"
#include "weave/runtime/tuner.hpp"

namespace {

using weave::runtime::TuneCandidate;
using weave::runtime::TuneMode;
using weave::runtime::TuneResult;
using weave::runtime::Tuner;

const std::vector<TuneCandidate> kCands = {{0, 4}, {0, 8}, {2, 0}};

// A search callback that must not run: the model's path times nothing.
double no_timing(const TuneCandidate& c) {
  ADD_FAILURE() << "a launch of variant " << c.variant << ", " << c.num_comm_sms << " SMs was timed";
  return 1;
}

std::string fresh_file(const char* tag) {
  const std::string p = testing::TempDir() + "weave_tuner_model_" + tag + "_" + std::to_string(getpid()) + ".json";
  std::remove(p.c_str());
  return p;
}
std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// Sets an environment variable for a scope (the tuner reads $WEAVE_TUNER at construction).
struct ScopedEnv {
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = getenv(name)) had_ = true, old_ = old;
    setenv(name, value, 1);
  }
  ~ScopedEnv() { had_ ? setenv(name_, old_.c_str(), 1) : unsetenv(name_); }
  const char* name_;
  bool had_ = false;
  std::string old_;
};

TEST(TunerModel, MissTakesTheModelsPickWithoutTiming) {
  ScopedEnv env("WEAVE_TUNER", "model");
  const std::string path = fresh_file("miss");
  Tuner t(path);
  t.set_verbose(false);
  ASSERT_EQ(t.mode(), TuneMode::model);
  int asked = 0;
  auto model = [&] { return ++asked, TuneCandidate{0, 8}; };
  TuneResult r = t.choose(nullptr, "k|1|w1|d", kCands, no_timing, model);
  EXPECT_EQ(r.choice, (TuneCandidate{0, 8}));
  EXPECT_TRUE(r.from_model);
  EXPECT_FALSE(r.from_cache);
  EXPECT_EQ(asked, 1);
  EXPECT_EQ(t.searches(), 0u);
  // Answered from memory after that: the model is not asked again.
  r = t.choose(nullptr, "k|1|w1|d", kCands, no_timing, model);
  EXPECT_TRUE(r.from_cache && r.from_model);
  EXPECT_EQ(asked, 1);
  // Never written to the file as if measured: a new process does not find it.
  EXPECT_EQ(slurp(path).find("k|1|w1|d"), std::string::npos) << slurp(path);
  Tuner next(path);
  TuneResult got;
  EXPECT_FALSE(next.lookup("k|1|w1|d", &got));
}

TEST(TunerModel, SearchModeTimesAndReplacesTheModelsPick) {
  ScopedEnv env("WEAVE_TUNER", "model");
  const std::string path = fresh_file("search");
  Tuner t(path);
  t.set_verbose(false);
  t.set_budget_s(0);
  auto model = [] { return TuneCandidate{0, 8}; };
  EXPECT_EQ(t.choose(nullptr, "k|2|w1|d", kCands, no_timing, model).choice, (TuneCandidate{0, 8}));
  // weave.tune's switch: the same key is searched now, and the measured winner replaces the pick.
  t.set_mode(TuneMode::search);
  int timed = 0;
  auto measure = [&](const TuneCandidate& c) { return ++timed, c.variant == 2 ? 5.0 : 9.0; };
  TuneResult r = t.choose(nullptr, "k|2|w1|d", kCands, measure, model);
  EXPECT_GT(timed, 0);
  EXPECT_EQ(t.searches(), 1u);
  EXPECT_EQ(r.choice, (TuneCandidate{2, 0}));
  EXPECT_FALSE(r.from_model);
  EXPECT_NE(slurp(path).find("k|2|w1|d"), std::string::npos) << "the measured winner goes to the file";
  // Back in model mode the measured choice answers, in this process and in the next one.
  t.set_mode(TuneMode::model);
  r = t.choose(nullptr, "k|2|w1|d", kCands, no_timing, model);
  EXPECT_EQ(r.choice, (TuneCandidate{2, 0}));
  EXPECT_FALSE(r.from_model);
  Tuner next(path);
  next.set_verbose(false);
  r = next.choose(nullptr, "k|2|w1|d", kCands, no_timing, model);
  EXPECT_EQ(r.choice, (TuneCandidate{2, 0}));
  EXPECT_TRUE(r.from_cache);
}

TEST(TunerModel, EnvironmentSelectsTheMode) {
  {
    ScopedEnv env("WEAVE_TUNER", "search");
    Tuner t("off");
    t.set_verbose(false);
    EXPECT_EQ(t.mode(), TuneMode::search);
    int timed = 0;
    t.choose(nullptr, "k|3|w1|d", kCands, [&](const TuneCandidate&) { return ++timed, 1.0; },
             [] { return TuneCandidate{0, 4}; });
    EXPECT_GT(timed, 0) << "WEAVE_TUNER=search did not search";
  }
  {
    ScopedEnv env("WEAVE_TUNER", "");  // empty: the default
    EXPECT_EQ(Tuner("off").mode(), TuneMode::model);
  }
  ScopedEnv env("WEAVE_TUNER", "fast");
  EXPECT_THROW(Tuner("off"), weave::Error);
}

// A caller without a model (the search API as it was) searches in either mode.
TEST(TunerModel, NoModelMeansSearch) {
  ScopedEnv env("WEAVE_TUNER", "model");
  Tuner t("off");
  t.set_verbose(false);
  int timed = 0;
  t.choose(nullptr, "k|4|w1|d", kCands, [&](const TuneCandidate&) { return ++timed, 1.0; });
  EXPECT_GT(timed, 0);
}

// A model that answers something it was not offered is not launched: the tuner searches instead.
TEST(TunerModel, AnUnofferedPickIsSearchedInstead) {
  ScopedEnv env("WEAVE_TUNER", "model");
  Tuner t("off");
  t.set_verbose(false);
  int timed = 0;
  const TuneResult r = t.choose(nullptr, "k|5|w1|d", kCands, [&](const TuneCandidate&) { return ++timed, 1.0; },
                                [] { return TuneCandidate{7, 0}; });
  EXPECT_GT(timed, 0);
  EXPECT_FALSE(r.from_model);
}

// Two ranks as threads (each its own tuner, as each process has one): all_gather through slots
// between two barrier phases.
struct Pair {
  std::barrier<> sync{2};
  std::vector<char> slot[2];
  weave::runtime::TuneGroup member(int rank) {
    weave::runtime::TuneGroup g;
    g.id = 7, g.rank = rank, g.world = 2;
    g.all_gather = [this, rank](const void* mine, void* all, size_t bytes) {
      slot[rank].assign(static_cast<const char*>(mine), static_cast<const char*>(mine) + bytes);
      sync.arrive_and_wait();
      for (int r = 0; r < 2; ++r) std::copy(slot[r].begin(), slot[r].end(), static_cast<char*>(all) + r * bytes);
      sync.arrive_and_wait();
    };
    g.check_same = [g](const std::string& what, const std::vector<long long>& v) {
      std::vector<long long> both(2 * v.size());
      g.all_gather(v.data(), both.data(), v.size() * sizeof(long long));
      if (!std::equal(v.begin(), v.end(), both.begin()) || !std::equal(v.begin(), v.end(), both.begin() + v.size()))
        throw weave::Error("ranks differ: " + what);
    };
    return g;
  }
};

// Rank 0's model decides (here the ranks' models disagree, as rates read on different cards
// could): both ranks launch rank 0's pick, and the group's later calls, a capture's included
// (agreed()), find it without asking the model again.
TEST(TunerModel, RankZerosPickIsTheGroupsChoice) {
  ScopedEnv env("WEAVE_TUNER", "model");
  Tuner proc[2] = {Tuner("off"), Tuner("off")};
  Pair pair;
  TuneResult got[2];
  int asked[2] = {0, 0};
  std::thread ranks[2];
  for (int r = 0; r < 2; ++r)
    ranks[r] = std::thread([&, r] {
      proc[r].set_verbose(false);
      got[r] = proc[r].choose(pair.member(r), "g|1|w2|d", kCands, no_timing,
                              [&, r] { return ++asked[r], r == 0 ? TuneCandidate{2, 0} : TuneCandidate{0, 4}; });
    });
  for (auto& t : ranks) t.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(got[r].choice, (TuneCandidate{2, 0})) << "rank " << r;
    EXPECT_TRUE(got[r].from_model);
    TuneResult agreed;
    ASSERT_TRUE(proc[r].agreed(7, "g|1|w2|d", &agreed)) << "rank " << r;
    EXPECT_EQ(agreed.choice, (TuneCandidate{2, 0}));
    // The next call of the group: no communication (no peer is running), no model.
    EXPECT_EQ(proc[r].choose(pair.member(r), "g|1|w2|d", kCands, no_timing, [] { return TuneCandidate{0, 8}; }).choice,
              (TuneCandidate{2, 0}));
  }
  EXPECT_EQ(asked[0], 1);
  EXPECT_EQ(asked[1], 0) << "only rank 0's model is asked";
  // Ranks in different modes fail together rather than one searching alone.
  proc[1].set_mode(TuneMode::search);
  std::string err[2];
  for (int r = 0; r < 2; ++r)
    ranks[r] = std::thread([&, r] {
      try {
        proc[r].choose(pair.member(r), "g|2|w2|d", kCands, no_timing, [] { return TuneCandidate{0, 4}; });
      } catch (const weave::Error& e) {
        err[r] = e.what();
      }
    });
  for (auto& t : ranks) t.join();
  for (int r = 0; r < 2; ++r) EXPECT_NE(err[r].find("mode (WEAVE_TUNER)"), std::string::npos) << "rank " << r << ": " << err[r];
}

}  // namespace
