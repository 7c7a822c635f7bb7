// weave-bench plumbing: subcommand registry, options, JSON lines, event timing.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "weave/common/error.hpp"
#include "weave/common/event_time.hpp"
#include "weave/common/median.hpp"

namespace weave::bench {

// Command-line options after the subcommand: `--key value` pairs and bare `--flag`s.
struct Args {
  std::map<std::string, std::string> kv;
  // Every key a subcommand asked about, given or not (copies share it): main reports given keys
  // that were never asked about (a misspelling, or an option of another subcommand).
  std::shared_ptr<std::set<std::string>> asked = std::make_shared<std::set<std::string>>();
  bool has(const std::string& k) const {
    asked->insert(k);
    return kv.count(k) != 0;
  }
  std::string get(const std::string& k, const std::string& dflt = "") const {
    asked->insert(k);
    auto it = kv.find(k);
    return it == kv.end() ? dflt : it->second;
  }
  long long get_int(const std::string& k, long long dflt) const {
    return has(k) ? std::stoll(get(k)) : dflt;
  }
  // Comma-separated values of `k` (or of `dflt`), empty items skipped.
  std::vector<std::string> names(const std::string& k, const std::string& dflt) const {
    std::vector<std::string> v;
    std::stringstream ss(get(k, dflt));
    std::string x;
    while (std::getline(ss, x, ','))
      if (!x.empty()) v.push_back(x);
    return v;
  }
  std::vector<long long> numbers(const std::string& k, const std::string& dflt) const {
    std::vector<long long> v;
    for (const std::string& x : names(k, dflt)) v.push_back(std::stoll(x));
    return v;
  }
  // Given keys no one asked about, as "--a, --b" ("" when none).
  std::string never_asked() const {
    std::string out;
    for (const auto& [k, v] : kv)
      if (!asked->count(k)) out += (out.empty() ? "--" : ", --") + k;
    return out;
  }
};

using Fn = std::function<int(const Args&)>;
struct Entry {
  std::string help;
  Fn fn;
};
inline std::map<std::string, Entry>& registry() {
  static std::map<std::string, Entry> r;
  return r;
}
struct Register {
  Register(const char* name, const char* help, Fn fn) { registry()[name] = {help, std::move(fn)}; }
};
#define WEAVE_BENCH(name, help, fn) static ::weave::bench::Register weave_bench_reg_##name(#name, help, fn)

// One JSON object per line; values are numbers, booleans or strings.
class JsonLine {
 public:
  JsonLine& add(const std::string& k, const std::string& v) { return raw(k, quote(v)); }
  JsonLine& add(const std::string& k, const char* v) { return raw(k, quote(v)); }
  JsonLine& add(const std::string& k, bool v) { return raw(k, v ? "true" : "false"); }
  JsonLine& add(const std::string& k, double v) {
    std::ostringstream s;
    s.precision(6);
    s << v;
    return raw(k, s.str());
  }
  JsonLine& add(const std::string& k, long long v) { return raw(k, std::to_string(v)); }
  JsonLine& add(const std::string& k, int v) { return raw(k, std::to_string(v)); }
  JsonLine& add(const std::string& k, size_t v) { return raw(k, std::to_string(v)); }
  std::string str() const { return "{" + body_ + "}"; }

 private:
  JsonLine& raw(const std::string& k, const std::string& v) {
    if (!body_.empty()) body_ += ", ";
    body_ += quote(k) + ": " + v;
    return *this;
  }
  static std::string quote(const std::string& s) {
    std::string o = "\"";
    for (char c : s) {
      if (c == '"' || c == '\\') o += '\\';
      o += c;
    }
    return o + "\"";
  }
  std::string body_;
};

// Appends JSON lines to --json FILE when given (only the writer rank should call write()).
class JsonSink {
 public:
  explicit JsonSink(const Args& a) {
    if (a.has("json")) {
      f_ = std::make_unique<std::ofstream>(a.get("json"), std::ios::app);
      WEAVE_CHECK(f_->good(), "cannot open --json file ", a.get("json"));
    }
  }
  void write(const JsonLine& j) {
    if (f_) (*f_) << j.str() << "\n" << std::flush;
  }

 private:
  std::unique_ptr<std::ofstream> f_;
};

using weave::median;

// One verdict for all ranks: true only where `ok` holds on every rank, so that a row wrong on one
// rank is wrong in every rank's report (rank 0 writes the JSON). Comm is a runtime::Communicator
// (its host bootstrap carries the flags; collective: every rank calls it at the same point).
template <class Comm>
bool all_ranks_ok(Comm& c, bool ok) {
  const int mine = ok ? 1 : 0;
  std::vector<int> all(c.world());
  c.bootstrap().all_gather(&mine, all.data(), sizeof mine);
  for (int v : all) ok = ok && v != 0;
  return ok;
}
// The largest `v` over ranks (NaN and infinity win, so a broken rank's value is the one reported).
template <class Comm>
double worst_over_ranks(Comm& c, double v) {
  std::vector<double> all(c.world());
  c.bootstrap().all_gather(&v, all.data(), sizeof v);
  for (double y : all) v = std::isnan(v) || std::isnan(y) ? NAN : std::max(v, y);
  return v;
}

// The checker's worst |x - r| / bound of a row as "check_worst": a number, or the string "inf" or
// "nan" (JSON has no non-finite numbers; such a row is also written correct: false).
inline JsonLine& add_check_worst(JsonLine& j, double worst) {
  if (std::isfinite(worst)) return j.add("check_worst", worst);
  return j.add("check_worst", std::isnan(worst) ? "nan" : "inf");
}

// A benchmark's exit status: 0 when every row was correct, else 1 after listing the wrong rows on
// stderr with the seed that replays them (`print`: false on the ranks that leave it to rank 0).
inline int exit_status(const char* bench, const std::vector<std::string>& wrong, uint64_t seed, bool print = true) {
  if (wrong.empty()) return 0;
  if (print) {
    std::fprintf(stderr, "weave-bench %s: %zu incorrect row(s) (replay with WEAVE_TEST_SEED=%llu):\n", bench,
                 wrong.size(), static_cast<unsigned long long>(seed));
    for (const std::string& w : wrong) std::fprintf(stderr, "  %s\n", w.c_str());
  }
  return 1;
}

// Median over `repeats` of the mean time (µs) of `iters` back-to-back calls of fn on stream,
// after `warmup` calls. fn enqueues work on the stream.
template <class F>
double time_us(cudaStream_t stream, F&& fn, int warmup = 5, int iters = 20, int repeats = 5) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> t;
  for (int r = 0; r < repeats; ++r) t.push_back(weave::events_us(stream, [] {}, fn, iters));
  return median(t);
}

// An option's value as a byte count (4096, 64K, 1M, 4G; KiB/MiB/GiB too) or an integer in
// [lo, hi]; `who` names the subcommand in the error.
inline size_t parse_bytes(const char* who, const std::string& opt, const std::string& s) {
  size_t pos = 0;
  unsigned long long x = 0;
  try {
    x = std::stoull(s, &pos);
  } catch (const std::exception&) {
    pos = 0;
  }
  const std::string unit = s.substr(pos);
  const unsigned long long mul = unit.empty() || unit == "B"    ? 1
                                 : unit == "K" || unit == "KiB" ? 1ull << 10
                                 : unit == "M" || unit == "MiB" ? 1ull << 20
                                 : unit == "G" || unit == "GiB" ? 1ull << 30
                                                                : 0;
  if (pos == 0 || mul == 0 || x == 0 || x > (1ull << 40) / mul)
    throw Error(weave::detail::concat(who, ": --", opt, ": '", s, "' is not a size (e.g. 4096, 64K, 16M, 1G)"));
  return static_cast<size_t>(x * mul);
}
inline long long parse_count(const char* who, const std::string& opt, const std::string& s, long long lo, long long hi) {
  size_t pos = 0;
  long long x = 0;
  try {
    x = std::stoll(s, &pos);
  } catch (const std::exception&) {
    pos = 0;
  }
  if (pos == 0 || pos != s.size() || x < lo || x > hi)
    throw Error(weave::detail::concat(who, ": --", opt, ": '", s, "' is not an integer from ", lo, " to ", hi));
  return x;
}

}  // namespace weave::bench
