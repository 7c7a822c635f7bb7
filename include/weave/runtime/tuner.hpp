// Tuner: picks a kernel's variant and num_comm_sms per (kernel, shape, world, device) key by a
// bounded search over the candidates the kernel offers, on first use of the key. Progress is
// printed (rank 0, stderr); the winner is kept in memory and in a JSON file, by default
// $XDG_CACHE_HOME/weave/tuner.json (else ~/.cache/weave/tuner.json; $WEAVE_TUNER_CACHE names
// another file, "off" disables the file). A corrupt or unreadable file is reported and replaced,
// never fatal. Every entry records the candidate set it was chosen from, and the file its format
// version: an entry chosen from other candidates (a kernel that gained or lost variants) or with
// a choice outside the current candidates, or a file of another version, is re-tuned, never
// trusted. Kernels take an explicit num_comm_sms that bypasses the tuner.
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
};

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

  // The cached choice for `key`, or the search: every candidate is measured by `measure_us`
  // (this rank's time in µs; it runs the kernel) once, those near the best four more times in
  // interleaved rounds, and the median decides. With a group the call is collective: every rank
  // passes the same key and candidates, rank 0's cache decides hit or miss, times are combined as
  // the maximum over ranks, so every rank returns the same choice, which the group then holds as
  // agreed: its later calls of the key take it without communication. Without a communicator
  // (nullptr: one GPU), the memory answers.
  TuneResult choose(const TuneGroup& group, const std::string& key, const std::vector<TuneCandidate>& candidates,
                    const std::function<double(const TuneCandidate&)>& measure_us);
  TuneResult choose(Communicator* comm, const std::string& key, const std::vector<TuneCandidate>& candidates,
                    const std::function<double(const TuneCandidate&)>& measure_us);
  // The choice group `group_id` agreed on for `key` (false if none: no collective choose of the
  // key on that group yet).
  bool agreed(unsigned long long group_id, const std::string& key, TuneResult* out);

  // Memory, then the file.
  bool lookup(const std::string& key, TuneResult* out);
  // Memory, and the file when `write_file` (read-merge-write through a temporary and rename).
  void remember(const std::string& key, const TuneResult& r, bool write_file = true);
  void forget_memory();  // tests: drop the in-memory cache
  unsigned long long searches() const;  // searches this tuner ran (not answered by a cache)

  // The file format (pure; tested on the CPU). parse() returns false and says why for text that
  // is not a tuner cache; `out` then holds nothing.
  static bool parse(const std::string& text, std::map<std::string, TuneResult>* out, std::string* error);
  static std::string serialize(const std::map<std::string, TuneResult>& entries);

 private:
  TuneResult choose_for(const TuneGroup* group, const std::string& key, const std::vector<TuneCandidate>& candidates,
                        const std::function<double(const TuneCandidate&)>& measure_us);
  std::map<std::string, TuneResult> read_file(bool warn);
  std::string path_;
  bool verbose_ = true;
  std::atomic<double> budget_s_{1};
  std::mutex mu_;
  std::map<std::string, TuneResult> mem_;
  std::map<std::pair<unsigned long long, std::string>, TuneResult> agreed_;  // (group id, key)
  std::atomic<unsigned long long> searches_{0};
};

}  // namespace weave::runtime
