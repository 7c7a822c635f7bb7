// Tuner: picks a kernel's variant and num_comm_sms per (kernel, shape, world, device) key, on
// first use of the key. By default ($WEAVE_TUNER unset or `model`) a key the cache does not hold
// takes the cost model's pick, which the caller supplies (weave/runtime/tune_model.hpp and the
// kernels' models): no launch is timed, the first call stalls for nothing but its plan, and the
// pick is kept in memory only, never written to the file as if measured. A search times every
// candidate instead, bounded by $WEAVE_TUNER_BUDGET_S: asked for by `WEAVE_TUNER=search`,
// set_mode() (weave.tune, weave-bench), or by a caller without a model. Progress is printed (rank
// 0, stderr); a searched winner is kept in memory and in a JSON file, by default
// $XDG_CACHE_HOME/weave/tuner.json (else ~/.cache/weave/tuner.json; $WEAVE_TUNER_CACHE names
// another file, "off" disables the file), and wins over the model. A corrupt or unreadable file is
// reported and replaced, never fatal. Every entry records the candidate set it was chosen from,
// and the file its format version: an entry chosen from other candidates (a kernel that gained or
// lost variants) or with a choice outside the current candidates, or a file of another version,
// is re-tuned, never trusted. Kernels take an explicit num_comm_sms that bypasses the tuner.
#pragma once
#include <atomic>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace weave::runtime {

class Communicator;

struct TuneCandidate {
  int variant = 0;
  int num_comm_sms = 0;
  bool operator==(const TuneCandidate& o) const { return variant == o.variant && num_comm_sms == o.num_comm_sms; }
};

struct TuneResult {
  TuneCandidate choice;
  double time_us = 0;       // the winner's median sample (each sample the slowest rank's) when it was measured
  bool from_cache = false;  // memory or file, no search this time
  std::string candidates;   // candidate_set() of the candidates it was chosen from
  bool from_model = false;  // the cost model's pick, not measured: memory only, and a search replaces it
};

// How a key the cache does not hold is answered: the cost model's pick, or a search.
enum class TuneMode { model, search };
// $WEAVE_TUNER: `model` (or unset, empty) or `search`; weave::Error naming the variable otherwise.
TuneMode tune_mode_from_env();
const char* mode_name(TuneMode m);

// The cost model's pick among a call's candidates (one of them), asked only on a miss.
using TuneModel = std::function<TuneCandidate()>;

// The cache file's format version; a file of another version is ignored and rewritten.
inline constexpr int kTunerCacheVersion = 2;

// A canonical text of a candidate set ("variant:num_comm_sms,..." sorted, duplicates once), so
// that a cached choice is used only for the set it was chosen from.
std::string candidate_set(const std::vector<TuneCandidate>& candidates);

// "kernel|d0xd1x...|wW|device": the cache key (device: name and SM count).
std::string tune_key(const std::string& kernel, const std::vector<long long>& shape, int world,
                     const std::string& device);

// The ranks a choice is made for: a communicator's (tune_group), or in CPU tests threads. `id`
// names the group among this process's groups. A process may belong to several groups of one world
// size (torch subgroups: two TP groups and a group across them), and a choice one group agreed on
// must answer only that group's later calls without communication: another group's ranks may have
// learned other choices for the same key in their own groups.
struct TuneGroup {
  unsigned long long id = 0;
  int rank = 0, world = 1;
  // Communicator::check_same and Bootstrap::all_gather, or the tests' equivalents.
  std::function<void(const std::string& what, const std::vector<long long>& values)> check_same;
  std::function<void(const void* mine, void* all, size_t bytes)> all_gather;
};
TuneGroup tune_group(Communicator& c);

// The time (µs) one sample of the search running on this thread should take, warm-up included
// (Tuner::choose sets it from its budget); 0 outside a search or when the search is unbounded: a
// sample then warms up to the power cap's steady state (event_time.hpp).
double search_sample_window_us();

class Tuner {
 public:
  // The process-wide tuner on default_path().
  static Tuner& global();
  // "" = default_path(); "off" = memory only.
  explicit Tuner(std::string cache_file = "");

  static std::string default_path();
  const std::string& path() const { return path_; }
  void set_verbose(bool v) { verbose_ = v; }
  // Seconds one search may take ($WEAVE_TUNER_BUDGET_S, default 1; 0: unbounded). Every
  // candidate is measured once whatever the budget; the samples are shortened to fit (through
  // search_sample_window_us), and the rounds after the first run only while time is left.
  // Read once per search and checked to be the same on every rank (a rank running more rounds
  // than its peers would not meet them).
  void set_budget_s(double s) { budget_s_.store(s); }
  double budget_s() const { return budget_s_.load(); }
  // $WEAVE_TUNER at construction. The same on every rank of a group (checked on a miss): a rank
  // that searches while its peers take the model's pick would wait for them in the search.
  void set_mode(TuneMode m) { mode_.store(m); }
  TuneMode mode() const { return mode_.load(); }

  // The cached choice for `key`; else, in model mode with a `model`, its pick (measure_us is not
  // called); else the search: every candidate is measured by `measure_us` (this rank's time in
  // µs; it runs the kernel) once, those near the best four more times in interleaved rounds, and
  // the median decides. A model's pick answers later calls until a search replaces it (search
  // mode treats it as a miss). With a group the call is collective: every rank passes the same
  // key and candidates (and mode), rank 0's cache and model decide, times are combined as the maximum
  // over ranks, so every rank returns the same choice, which the group then holds as agreed: its
  // later calls of the key take it without communication. Without a communicator (nullptr: one
  // GPU), the memory answers.
  TuneResult choose(const TuneGroup& group, const std::string& key, const std::vector<TuneCandidate>& candidates,
                    const std::function<double(const TuneCandidate&)>& measure_us, const TuneModel& model = {});
  TuneResult choose(Communicator* comm, const std::string& key, const std::vector<TuneCandidate>& candidates,
                    const std::function<double(const TuneCandidate&)>& measure_us, const TuneModel& model = {});
  // The choice group `group_id` agreed on for `key` (false if none: no collective choose of the
  // key on that group yet).
  bool agreed(unsigned long long group_id, const std::string& key, TuneResult* out);

  // Memory, then the file.
  bool lookup(const std::string& key, TuneResult* out);
  // Memory, and the file when `write_file` and the choice was measured (read-merge-write through
  // a temporary and rename).
  void remember(const std::string& key, const TuneResult& r, bool write_file = true);
  void forget_memory();  // tests: drop the in-memory cache
  unsigned long long searches() const;  // searches this tuner ran (not answered by a cache)

  // The file format (pure; tested on the CPU). parse() returns false and says why for text that
  // is not a tuner cache; `out` then holds nothing.
  static bool parse(const std::string& text, std::map<std::string, TuneResult>* out, std::string* error);
  static std::string serialize(const std::map<std::string, TuneResult>& entries);

 private:
  TuneResult choose_for(const TuneGroup* group, const std::string& key, const std::vector<TuneCandidate>& candidates,
                        const std::function<double(const TuneCandidate&)>& measure_us, const TuneModel& model);
  TuneResult search(const TuneGroup* group, const std::string& key, const std::vector<TuneCandidate>& candidates,
                    const std::function<double(const TuneCandidate&)>& measure_us, double budget_s);
  std::map<std::string, TuneResult> read_file(bool warn);
  std::string path_;
  bool verbose_ = true;
  std::atomic<double> budget_s_{1};
  std::atomic<TuneMode> mode_{TuneMode::model};
  std::mutex mu_;
  std::map<std::string, TuneResult> mem_;
  std::map<std::pair<unsigned long long, std::string>, TuneResult> agreed_;  // (group id, key)
  std::atomic<unsigned long long> searches_{0};
};

}  // namespace weave::runtime
