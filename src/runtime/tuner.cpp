// The tuner: the cost model's pick or a bounded search, in-memory and JSON-file cache (see tuner.hpp).
#include "weave/runtime/tuner.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <chrono>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <utility>
#include <sstream>

#include "weave/common/error.hpp"
#include "weave/common/hash.hpp"
#include "weave/common/median.hpp"
#include "weave/runtime/communicator.hpp"
#include "weave/runtime/env.hpp"

namespace weave::runtime {

std::string tune_key(const std::string& kernel, const std::vector<long long>& shape, int world,
                     const std::string& device) {
  std::string k = kernel + "|";
  for (size_t i = 0; i < shape.size(); ++i) k += (i ? "x" : "") + std::to_string(shape[i]);
  return k + "|w" + std::to_string(world) + "|" + device;
}

std::string candidate_set(const std::vector<TuneCandidate>& candidates) {
  std::vector<std::pair<int, int>> v;
  for (const TuneCandidate& c : candidates) v.emplace_back(c.variant, c.num_comm_sms);
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  std::string s;
  for (const auto& [variant, sms] : v) s += (s.empty() ? "" : ",") + std::to_string(variant) + ":" + std::to_string(sms);
  return s;
}

Tuner& Tuner::global() {
  static Tuner t;
  return t;
}

TuneMode tune_mode_from_env() {
  const std::string v = env::get_string("WEAVE_TUNER");
  if (v == "model") return TuneMode::model;
  if (v == "search") return TuneMode::search;
  throw Error("WEAVE_TUNER=" + v + " is neither `model` (the cost model's pick for a new shape, the default) nor "
              "`search` (time the candidates)");
}

const char* mode_name(TuneMode m) { return m == TuneMode::search ? "search" : "model"; }

Tuner::Tuner(std::string cache_file)
    : path_(cache_file.empty() ? default_path() : std::move(cache_file)),
      budget_s_(env::get_seconds("WEAVE_TUNER_BUDGET_S")),
      mode_(tune_mode_from_env()) {}

namespace {
thread_local double sample_window_us = 0;  // the search in progress on this thread (0: none)
}  // namespace

double search_sample_window_us() { return sample_window_us; }

std::string Tuner::default_path() {
  if (std::string e = env::get_string("WEAVE_TUNER_CACHE"); !e.empty()) return e;
  if (std::string x = env::get_string("XDG_CACHE_HOME"); !x.empty()) return x + "/weave/tuner.json";
  if (std::string h = env::get_string("HOME"); !h.empty()) return h + "/.cache/weave/tuner.json";
  return "off";
}

// ---- a small JSON reader for the cache's shape: objects, strings, numbers (others skipped) ----
namespace {
struct Reader {
  const std::string& s;
  size_t i = 0;
  std::string err;
  void ws() {
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  }
  bool fail(const std::string& m) {
    if (err.empty()) err = m + " at byte " + std::to_string(i);
    return false;
  }
  bool lit(char c) {
    ws();
    if (i < s.size() && s[i] == c) {
      ++i;
      return true;
    }
    return fail(std::string("expected '") + c + "'");
  }
  bool str(std::string* out) {
    ws();
    if (i >= s.size() || s[i] != '"') return fail("expected a string");
    ++i;
    out->clear();
    while (i < s.size() && s[i] != '"') {
      if (s[i] == '\\') {
        if (++i >= s.size()) break;
        const char c = s[i];
        out->push_back(c == 'n' ? '\n' : c == 't' ? '\t' : c);
      } else {
        out->push_back(s[i]);
      }
      ++i;
    }
    if (i >= s.size()) return fail("unterminated string");
    ++i;
    return true;
  }
  bool num(double* out) {
    ws();
    const char* b = s.c_str() + i;
    char* e = nullptr;
    errno = 0;
    const double v = std::strtod(b, &e);
    if (e == b || errno) return fail("expected a number");
    i += static_cast<size_t>(e - b);
    *out = v;
    return true;
  }
  bool skip() {  // any value
    ws();
    if (i >= s.size()) return fail("unexpected end");
    const char c = s[i];
    if (c == '"') {
      std::string t;
      return str(&t);
    }
    if (c == '{' || c == '[') {
      const char close = c == '{' ? '}' : ']';
      ++i;
      ws();
      if (i < s.size() && s[i] == close) return ++i, true;
      for (;;) {
        if (c == '{') {
          std::string k;
          if (!str(&k) || !lit(':')) return false;
        }
        if (!skip()) return false;
        ws();
        if (i < s.size() && s[i] == ',') {
          ++i;
          continue;
        }
        return lit(close);
      }
    }
    for (const char* w : {"true", "false", "null"})
      if (s.compare(i, std::strlen(w), w) == 0) return i += std::strlen(w), true;
    double d;
    return num(&d);
  }
  // { "k": value, ... } calling f(key) for each value
  template <class F>
  bool object(F&& f) {
    if (!lit('{')) return false;
    ws();
    if (i < s.size() && s[i] == '}') return ++i, true;
    for (;;) {
      std::string k;
      if (!str(&k) || !lit(':') || !f(k)) return false;
      ws();
      if (i < s.size() && s[i] == ',') {
        ++i;
        continue;
      }
      return lit('}');
    }
  }
};
}  // namespace

bool Tuner::parse(const std::string& text, std::map<std::string, TuneResult>* out, std::string* error) {
  Reader r{text};
  std::map<std::string, TuneResult> got;
  bool have_entries = false;
  double version = 0;
  const bool ok = r.object([&](const std::string& k) {
    if (k == "version") return r.num(&version);
    if (k != "entries") return r.skip();
    have_entries = true;
    return r.object([&](const std::string& key) {
      TuneResult t;
      bool has_sms = false;
      const bool e_ok = r.object([&](const std::string& f) {
        double v = 0;
        if (f == "variant") return r.num(&v) && (t.choice.variant = static_cast<int>(v), true);
        if (f == "num_comm_sms") return r.num(&v) && (t.choice.num_comm_sms = static_cast<int>(v), has_sms = true);
        if (f == "time_us") return r.num(&t.time_us);
        if (f == "candidates") return r.str(&t.candidates);
        return r.skip();
      });
      if (!e_ok) return false;
      if (!has_sms || t.choice.num_comm_sms < 0) return r.fail("entry '" + key + "' has no valid num_comm_sms");
      got[key] = t;
      return true;
    });
  });
  r.ws();
  std::string why;
  if (!ok) why = r.err;
  else if (r.i != text.size()) why = "trailing characters at byte " + std::to_string(r.i);
  else if (version != kTunerCacheVersion)
    why = "cache version " + std::to_string(static_cast<int>(version)) + ", this weave reads version " +
          std::to_string(kTunerCacheVersion) + " (entries of other versions are re-tuned)";
  else if (!have_entries) why = "no \"entries\" object";
  if (!why.empty()) {
    if (error) *error = why;
    out->clear();
    return false;
  }
  *out = std::move(got);
  return true;
}

std::string Tuner::serialize(const std::map<std::string, TuneResult>& entries) {
  std::ostringstream o;
  o << "{\n  \"version\": " << kTunerCacheVersion << ",\n  \"entries\": {";
  bool first = true;
  auto quote = [](const std::string& k) {
    std::string q;
    for (char c : k) {
      if (c == '"' || c == '\\') q += '\\';
      q += c;
    }
    return q;
  };
  for (const auto& [k, v] : entries) {
    const std::string q = quote(k);
    char t[64];
    std::snprintf(t, sizeof t, "%.3f", v.time_us);
    o << (first ? "\n" : ",\n") << "    \"" << q << "\": {\"variant\": " << v.choice.variant
      << ", \"num_comm_sms\": " << v.choice.num_comm_sms << ", \"time_us\": " << t << ", \"candidates\": \""
      << quote(v.candidates) << "\"}";
    first = false;
  }
  o << (first ? "}\n}\n" : "\n  }\n}\n");
  return o.str();
}

std::map<std::string, TuneResult> Tuner::read_file(bool warn) {
  std::map<std::string, TuneResult> m;
  if (path_ == "off") return m;
  std::ifstream f(path_);
  if (!f) return m;
  std::stringstream ss;
  ss << f.rdbuf();
  std::string err;
  if (!parse(ss.str(), &m, &err) && warn)
    std::fprintf(stderr, "weave tuner: ignoring the cache %s (%s); it will be rewritten\n", path_.c_str(),
                 err.c_str());
  return m;
}

bool Tuner::lookup(const std::string& key, TuneResult* out) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = mem_.find(key);
  if (it == mem_.end() || it->second.from_model) {  // a measured choice in the file wins over the model
    auto file = read_file(true);
    auto f = file.find(key);
    if (f != file.end()) it = mem_.insert_or_assign(key, f->second).first;
    if (it == mem_.end()) return false;
  }
  *out = it->second;
  out->from_cache = true;
  return true;
}

static void make_dirs(const std::string& dir) {
  for (size_t p = 1; p <= dir.size(); ++p)
    if (p == dir.size() || dir[p] == '/') {
      const std::string d = dir.substr(0, p);
      if (mkdir(d.c_str(), 0755) != 0 && errno != EEXIST) return;
    }
}

void Tuner::remember(const std::string& key, const TuneResult& r, bool write_file) {
  std::lock_guard<std::mutex> g(mu_);
  TuneResult v = r;
  v.from_cache = false;
  mem_[key] = v;
  // The file holds measured choices only: a model's pick there would read as measured in the next
  // process, and a later search could not tell it apart.
  if (!write_file || v.from_model || path_ == "off") return;
  auto file = read_file(false);
  file[key] = v;
  const size_t slash = path_.rfind('/');
  if (slash != std::string::npos) make_dirs(path_.substr(0, slash));
  const std::string tmp = path_ + ".tmp." + std::to_string(getpid());
  {
    std::ofstream f(tmp, std::ios::trunc);
    if (!f) {
      std::fprintf(stderr, "weave tuner: cannot write %s; keeping the choice in memory only\n", tmp.c_str());
      return;
    }
    f << serialize(file);
  }
  if (std::rename(tmp.c_str(), path_.c_str()) != 0) {
    std::fprintf(stderr, "weave tuner: cannot replace %s: %s\n", path_.c_str(), std::strerror(errno));
    std::remove(tmp.c_str());
  }
}

void Tuner::forget_memory() {
  std::lock_guard<std::mutex> g(mu_);
  mem_.clear();
  agreed_.clear();
}

TuneGroup tune_group(Communicator& c) {
  TuneGroup g;
  g.id = c.uid();
  g.rank = c.rank();
  g.world = c.world();
  g.check_same = [&c](const std::string& what, const std::vector<long long>& v) { c.check_same(what, v); };
  g.all_gather = [&c](const void* mine, void* all, size_t bytes) { c.bootstrap().all_gather(mine, all, bytes); };
  return g;
}

bool Tuner::agreed(unsigned long long group_id, const std::string& key, TuneResult* out) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = agreed_.find({group_id, key});
  if (it == agreed_.end()) return false;
  *out = it->second;
  out->from_cache = true;
  return true;
}

TuneResult Tuner::choose(Communicator* comm, const std::string& key, const std::vector<TuneCandidate>& cands,
                         const std::function<double(const TuneCandidate&)>& measure_us, const TuneModel& model) {
  if (!comm) return choose_for(nullptr, key, cands, measure_us, model);
  const TuneGroup g = tune_group(*comm);
  return choose_for(&g, key, cands, measure_us, model);
}

TuneResult Tuner::choose(const TuneGroup& group, const std::string& key, const std::vector<TuneCandidate>& cands,
                         const std::function<double(const TuneCandidate&)>& measure_us, const TuneModel& model) {
  return choose_for(&group, key, cands, measure_us, model);
}

unsigned long long Tuner::searches() const { return searches_.load(std::memory_order_relaxed); }

TuneResult Tuner::choose_for(const TuneGroup* group, const std::string& key, const std::vector<TuneCandidate>& cands,
                             const std::function<double(const TuneCandidate&)>& measure_us, const TuneModel& model) {
  // With a group, after the ranks compared their candidates: a rank alone without any (fewer SMs
  // than its peers) would leave them waiting in the comparison.
  if (!group) WEAVE_CHECK(!cands.empty(), "tuner: no candidates for ", key);
  const std::string set = candidate_set(cands);
  // A search is due for what the cache does not hold with a measured choice; otherwise the model.
  const bool searching = mode_.load() == TuneMode::search || !model;
  // A cached choice answers only the candidate set it was chosen from, and only with one of them;
  // a model's pick not when a search is asked for.
  auto usable = [&](const TuneResult& r) {
    return r.candidates == set && std::find(cands.begin(), cands.end(), r.choice) != cands.end() &&
           !(r.from_model && searching);
  };
  {  // Every rank of a group learns the group's choice at the same call (below), so that choice
     // answers later calls without communication. The memory, which every group of this process
     // fills, answers only calls without a group.
    std::lock_guard<std::mutex> g(mu_);
    if (group) {
      auto it = agreed_.find({group->id, key});
      if (it != agreed_.end() && usable(it->second)) {
        TuneResult r = it->second;
        r.from_cache = true;
        return r;
      }
    } else if (auto it = mem_.find(key); it != mem_.end() && usable(it->second)) {
      TuneResult r = it->second;
      r.from_cache = true;
      return r;
    }
  }
  const int rank = group ? group->rank : 0, world = group ? group->world : 1;
  const double budget_s = budget_s_.load();
  if (group) {
    // The candidates themselves, in order, not only their number: a search picks by index in each
    // rank's list.
    std::string order;
    for (const TuneCandidate& c : cands) order += std::to_string(c.variant) + ":" + std::to_string(c.num_comm_sms) + ",";
    group->check_same("tuner candidates, search budget (µs) and mode (WEAVE_TUNER) for " + key,
                      {static_cast<long long>(cands.size()), static_cast<long long>(fnv1a(order) >> 1),
                       std::llround(budget_s * 1e6), searching ? 1 : 0});
    WEAVE_CHECK(!cands.empty(), "tuner: no candidates for ", key);
  }
  auto agree = [&](const TuneResult& r) {
    if (!group) return;
    std::lock_guard<std::mutex> g(mu_);
    agreed_[{group->id, key}] = r;
  };
  // Rank 0's cache, and else its model, decide, so every rank takes the same branch and choice.
  enum : int { kSearch, kMeasured, kModelKept, kModelNew };
  struct Hit {
    int found, variant, sms;
    double t;
  } mine{kSearch, 0, 0, 0};
  TuneResult cached;
  if (rank == 0 && lookup(key, &cached)) {
    if (usable(cached)) {
      mine = {cached.from_model ? kModelKept : kMeasured, cached.choice.variant, cached.choice.num_comm_sms,
              cached.time_us};
    } else if (verbose_ && !cached.from_model) {
      std::fprintf(stderr,
                   "weave tuner: %s: the cached choice (variant %d, num_comm_sms %d) was made from candidates "
                   "{%s}, now {%s}: re-tuning\n",
                   key.c_str(), cached.choice.variant, cached.choice.num_comm_sms, cached.candidates.c_str(),
                   set.c_str());
    }
  }
  if (rank == 0 && mine.found == kSearch && !searching) {
    const TuneCandidate c = model();
    // Only an offered candidate; anything else (a model's bug) is searched rather than launched.
    if (std::find(cands.begin(), cands.end(), c) != cands.end()) mine = {kModelNew, c.variant, c.num_comm_sms, 0};
  }
  if (group) {
    std::vector<Hit> all(world);
    group->all_gather(&mine, all.data(), sizeof(Hit));
    mine = all[0];
  }
  if (mine.found != kSearch) {
    const bool fresh = mine.found == kModelNew;
    TuneResult r{{mine.variant, mine.sms}, mine.t, !fresh, set, mine.found != kMeasured};
    if (rank != 0 || fresh) remember(key, r, false);
    agree(r);
    if (fresh && verbose_ && rank == 0)
      std::fprintf(stderr,
                   "weave tuner: %s: the cost model chose variant %d, num_comm_sms %d among {%s} (no search; "
                   "weave.tune([...]) or WEAVE_TUNER=search measures the candidates and caches the winner)\n",
                   key.c_str(), r.choice.variant, r.choice.num_comm_sms, set.c_str());
    return r;
  }
  TuneResult best = search(group, key, cands, measure_us, budget_s);
  remember(key, best, rank == 0);
  agree(best);
  if (verbose_ && rank == 0)
    std::fprintf(stderr, "weave tuner: %s: chose variant %d, num_comm_sms %d (%.1f us); cache %s\n", key.c_str(),
                 best.choice.variant, best.choice.num_comm_sms, best.time_us, path_.c_str());
  return best;
}

// The search itself: collective over the group, every rank measuring the same candidate at once.
TuneResult Tuner::search(const TuneGroup* group, const std::string& key, const std::vector<TuneCandidate>& cands,
                         const std::function<double(const TuneCandidate&)>& measure_us, double budget_s) {
  const int rank = group ? group->rank : 0, world = group ? group->world : 1;
  const bool talk = verbose_ && rank == 0;
  const std::string set = candidate_set(cands);
  searches_.fetch_add(1, std::memory_order_relaxed);
  if (talk) std::fprintf(stderr, "weave tuner: %s: searching %zu candidates\n", key.c_str(), cands.size());
  // A bounded search (budget_s > 0): half the budget for the first round's samples, each sample
  // shortened to fit (time_launches' plan reads the window), more rounds while time is left.
  const auto t0 = std::chrono::steady_clock::now();
  struct Window {
    explicit Window(double us) { sample_window_us = us; }
    ~Window() { sample_window_us = 0; }
  } window(budget_s > 0 ? budget_s * 1e6 / (2.0 * static_cast<double>(cands.size())) : 0);
  double spent_s = 0;  // the slowest rank's time in this search so far, the same on every rank
  // The slowest rank's time of one measurement (every rank measures the same candidate).
  auto slowest = [&](const TuneCandidate& c) {
    double t[2] = {measure_us(c), std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
    if (group) {
      std::vector<double> all(2 * world);
      group->all_gather(t, all.data(), sizeof t);
      for (int r = 0; r < world; ++r) t[0] = std::max(t[0], all[2 * r]), t[1] = std::max(t[1], all[2 * r + 1]);
    }
    spent_s = t[1];
    return t[0];
  };
  // Under the power cap of large GEMMs the SM clock swings by +-10-20 % within a second, so one
  // short sample ranks candidates by the clock it caught (session 6: ag_gemm 32768 chose a
  // variant 10 % slower than the usual winner). Round 1 measures every candidate once; those
  // within kKeep of the best (at least the best kMinKept) are measured in kRounds - 1 more
  // rounds, each round in a rotated order, and ranked by the median of their samples.
  constexpr int kRounds = 5, kMinKept = 3;
  constexpr double kKeep = 1.3;
  std::vector<std::vector<double>> samples(cands.size());
  for (size_t c = 0; c < cands.size(); ++c) {
    samples[c].push_back(slowest(cands[c]));
    if (talk)
      std::fprintf(stderr, "weave tuner:   [%zu/%zu] variant %d, num_comm_sms %3d: %10.1f us\n", c + 1, cands.size(),
                   cands[c].variant, cands[c].num_comm_sms, samples[c][0]);
  }
  std::vector<size_t> kept(cands.size());
  for (size_t c = 0; c < cands.size(); ++c) kept[c] = c;
  std::stable_sort(kept.begin(), kept.end(), [&](size_t x, size_t y) { return samples[x][0] < samples[y][0]; });
  size_t n = 0;
  while (n < kept.size() && (n < kMinKept || samples[kept[n]][0] <= kKeep * samples[kept[0]][0])) ++n;
  kept.resize(n);
  // A round is run whole or not at all (a candidate with more samples than another would be
  // ranked by a different median); whether there is time left is decided the same on every rank.
  const double per_round = kept.empty() ? 0 : spent_s / static_cast<double>(cands.size()) * kept.size();
  if (kept.size() >= 2)
    for (int round = 1; round < kRounds; ++round) {
      if (budget_s > 0 && spent_s + per_round > budget_s) break;
      for (size_t i = 0; i < kept.size(); ++i) {
        const size_t c = kept[(i + round) % kept.size()];
        samples[c].push_back(slowest(cands[c]));
      }
    }
  std::vector<double> times(cands.size(), -1);
  for (size_t c : kept) {
    times[c] = median(samples[c]);
    if (talk && kept.size() >= 2)
      std::fprintf(stderr, "weave tuner:   variant %d, num_comm_sms %3d: median %10.1f us of %zu samples\n",
                   cands[c].variant, cands[c].num_comm_sms, times[c], samples[c].size());
  }
  TuneResult best;
  best.time_us = -1;
  for (size_t c : kept)
    if (best.time_us < 0 || times[c] < best.time_us) best = {cands[c], times[c], false, set};
  return best;
}

}  // namespace weave::runtime
