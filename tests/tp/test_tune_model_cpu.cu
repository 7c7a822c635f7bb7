// CPU tests of the tuner's cost models (kernels/tp_common/tune_model.hpp for ag_gemm, gemm_rs and
// gemm_ar; kernels/ring_attention/tune_model.hpp for ring attention and Ulysses):
// - the pick is always one of the offered candidates (W = 2..8, ragged, tiny and huge shapes,
//   several SM counts, any subset of candidates);
// - against the searches measured on 2 x H200: for every shape where every candidate (or a sweep
//   over them) was timed, the time of the model's pick over the best time, per shape, printed, and
//   within kTolerance (below). The rows are read from the checked-in results themselves;
// - where only the search's pick was recorded (its time, not the others'), whether the model picks
//   the same candidate (printed; a different pick has no measured time to compare).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "ring_attention/tune_model.hpp"
#include "tp_common/copy_engine.hpp"
#include "tp_common/tune_model.hpp"

namespace {

using weave::runtime::TuneCandidate;
namespace tpm = weave::tp::model;
namespace spm = weave::sp::model;

bool offered(const std::vector<TuneCandidate>& cands, const TuneCandidate& c) {
  return std::find(cands.begin(), cands.end(), c) != cands.end();
}

// Every non-empty subset of `all` (at most 2^12 of them: the first 12 candidates vary, the rest
// come along), so that every candidate is at some point the only one, or beside any other.
template <class F>
void for_subsets(const std::vector<TuneCandidate>& all, F&& f) {
  const size_t vary = std::min<size_t>(all.size(), 12);
  for (unsigned mask = 1; mask < (1u << vary); ++mask) {
    std::vector<TuneCandidate> s;
    for (size_t i = 0; i < all.size(); ++i)
      if (i >= vary || (mask >> i) & 1u) s.push_back(all[i]);
    f(s);
  }
}

// Every variant of the family with communicator counts from 1 to past half the SMs.
std::vector<TuneCandidate> every_candidate(tpm::Family f) {
  const int variants = f == tpm::Family::ag_gemm ? weave::tp::kAgVariants
                       : f == tpm::Family::gemm_rs ? weave::tp::kRsVariants
                                                   : weave::tp::kArVariants;
  std::vector<TuneCandidate> v;
  for (int n : {1, 4, 16, 70})
    for (int var = 0; var < variants; ++var) v.push_back({var, n});
  for (int var = 0; var < variants; ++var) v.push_back({var, 0});
  return v;
}

TEST(TuneModel, TpPicksOnlyOfferedCandidates) {
  long long checked = 0;
  for (tpm::Family f : {tpm::Family::ag_gemm, tpm::Family::gemm_rs, tpm::Family::gemm_ar})
    for (int W = 2; W <= 8; ++W)
      for (int sms : {132, 114, 78, 16})
        for (auto [M, N, K] : {std::tuple{W, 8, 8}, std::tuple{1000 + 3 * W, 1048, 2056}, std::tuple{4097, 24, 520},
                               std::tuple{131072, 65536, 65536}, std::tuple{2147483647 / 65536, 57344, 8192}})
          for (bool fp8 : {false, true}) {
            const tpm::Problem p{f, M, N, fp8 ? K / 16 * 16 + 16 : K, W, fp8};
            const weave::runtime::DeviceRates r = weave::runtime::device_rates(sms);
            for (const TuneCandidate& c : every_candidate(f)) {
              const double t = tpm::predicted_us(p, c, r);
              ASSERT_TRUE(std::isfinite(t) && t > 0) << "variant " << c.variant << ", " << c.num_comm_sms << " SMs";
            }
            for_subsets(every_candidate(f), [&](const std::vector<TuneCandidate>& s) {
              ASSERT_TRUE(offered(s, tpm::choose(p, s, r))) << "family " << int(f) << " W " << W << " " << M << " x "
                                                            << N << " x " << K;
              ++checked;
            });
          }
  std::printf("%lld candidate lists checked\n", checked);
}

TEST(TuneModel, AttentionPicksOnlyOfferedCandidates) {
  const std::vector<TuneCandidate> counts = {{0, 1}, {0, 4}, {0, 8}, {0, 16}, {0, 24}, {0, 64}};
  for (spm::Family f : {spm::Family::ring, spm::Family::ulysses})
    for (int W = 2; W <= 8; ++W)
      for (int sms : {132, 114, 16})
        for (long long S : {static_cast<long long>(W), 1000LL + W, 131072LL, 4194304LL})
          for (auto [Hq, Hkv] : {std::pair{W, 1}, std::pair{8 * W, 8 * W}, std::pair{8 * W, 2}, std::pair{64 * W, W}})
            for (bool causal : {false, true}) {
              const spm::Problem p{f, 3, S, Hq, Hkv, 128, W, causal};
              const weave::runtime::DeviceRates r = weave::runtime::device_rates(sms);
              for_subsets(counts, [&](const std::vector<TuneCandidate>& s) {
                const TuneCandidate c = spm::choose(p, s, r);
                ASSERT_TRUE(offered(s, c)) << "W " << W << " S " << S << " Hq " << Hq << " Hkv " << Hkv;
                ASSERT_TRUE(std::isfinite(spm::predicted_us(p, c.num_comm_sms, r)));
              });
            }
}

// ---- the checked-in measurements ----

// "file:line" of a row of a results file, without the folder.
std::string where(const std::string& rel, size_t index) {
  return rel.substr(rel.rfind('/') + 1) + ":" + std::to_string(index + 1);
}
std::vector<std::string> lines_of(const std::string& rel) {
  std::ifstream f(std::string(WEAVE_SOURCE_DIR) + "/" + rel);
  std::vector<std::string> v;
  for (std::string l; std::getline(f, l);) v.push_back(l);
  return v;
}
// A field of a one-line JSON object as weave-bench writes it ("key": value).
bool field(const std::string& line, const std::string& key, std::string* out) {
  const std::string k = "\"" + key + "\": ";
  const size_t at = line.find(k);
  if (at == std::string::npos) return false;
  size_t b = at + k.size(), e = b;
  if (line[b] == '"') e = line.find('"', ++b);
  else e = line.find_first_of(",}", b);
  *out = line.substr(b, e - b);
  return true;
}
double num(const std::string& line, const std::string& key) {
  std::string v;
  return field(line, key, &v) ? std::stod(v) : -1;
}

struct Timed {
  TuneCandidate c;
  double us;
  std::string where;  // file:line
};
// One measured shape: every candidate timed in the same run.
struct Shape {
  std::string name;
  std::vector<Timed> rows;
};

// The tolerance on (time of the model's pick) / (best measured time) per shape. The model's worst
// shape measures 1.040 (Ulysses 4 x 8192 x 32 x 32 x 128 non-causal, c6 run: 16 communicators
// 4459 us, 8 of them 4287), as large as the gap between the two runs of that search (16: 4251 us
// in c4); the other shapes are within 2.4 % (the printed tables).
constexpr double kTolerance = 1.05;

double report(const char* what, const std::vector<std::pair<Shape, TuneCandidate>>& picks) {
  double worst = 1;
  std::printf("%-44s %-10s %-10s %10s %10s %7s  %s\n", what, "model", "best", "model us", "best us", "ratio",
              "measured at");
  for (const auto& [s, pick] : picks) {
    const Timed* best = &s.rows[0];
    const Timed* got = nullptr;
    for (const Timed& t : s.rows) {
      if (t.us < best->us) best = &t;
      if (t.c == pick) got = &t;
    }
    EXPECT_NE(got, nullptr) << s.name << ": the model picked a candidate that was not offered";
    if (!got) continue;
    const double ratio = got->us / best->us;
    worst = std::max(worst, ratio);
    std::printf("%-44s v%d/%-7d v%d/%-7d %10.1f %10.1f %7.3f  %s\n", s.name.c_str(), pick.variant, pick.num_comm_sms,
                best->c.variant, best->c.num_comm_sms, got->us, best->us, ratio, got->where.c_str());
    EXPECT_LE(ratio, kTolerance) << s.name;
  }
  return worst;
}

// weave-bench tp --sweep rows (impl "weave" with a "sweep" field): every candidate of the swept
// shapes, timed in turns in one run on 2 x H200.
const char* const kTpSweeps = "bench/results/2026-11-30-h200x2-session7-tp.jsonl";

std::vector<std::pair<tpm::Problem, Shape>> tp_sweeps() {
  std::map<std::tuple<std::string, int, int, int>, Shape> by;
  const std::vector<std::string> lines = lines_of(kTpSweeps);
  for (size_t i = 0; i < lines.size(); ++i) {
    std::string kernel, impl, sweep;
    if (!field(lines[i], "sweep", &sweep) || !field(lines[i], "impl", &impl) || impl != "weave" ||
        !field(lines[i], "kernel", &kernel))
      continue;
    const int M = int(num(lines[i], "M")), N = int(num(lines[i], "N")), K = int(num(lines[i], "K"));
    Shape& s = by[{kernel, M, N, K}];
    s.name = kernel + " " + std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K) + " w2";
    s.rows.push_back({{int(num(lines[i], "variant")), int(num(lines[i], "num_comm_sms"))}, num(lines[i], "time_us"),
                      where(kTpSweeps, i)});
  }
  std::vector<std::pair<tpm::Problem, Shape>> v;
  for (auto& [k, s] : by) {
    const std::string& kernel = std::get<0>(k);
    const tpm::Family f = kernel == "ag_gemm" ? tpm::Family::ag_gemm
                          : kernel == "gemm_rs" ? tpm::Family::gemm_rs
                                                : tpm::Family::gemm_ar;
    v.push_back({tpm::Problem{f, std::get<1>(k), std::get<2>(k), std::get<3>(k), 2, false}, s});
  }
  return v;
}

// The tuner's searches of ring attention and Ulysses (weave-bench sp, unbounded search, 2 x H200),
// two runs: per key the median of every candidate's five samples.
std::vector<std::pair<spm::Problem, Shape>> sp_searches() {
  std::vector<std::pair<spm::Problem, Shape>> v;
  for (const char* file : {"bench/results/2026-11-30-h200x2-session9-c4-sp.log",
                           "bench/results/2026-11-30-h200x2-session9-c6-sp.log"}) {
    const std::vector<std::string> lines = lines_of(file);
    EXPECT_FALSE(lines.empty()) << file;
    for (size_t i = 0; i < lines.size(); ++i) {
      char kernel[32], dims[128];
      int w = 0;
      if (std::sscanf(lines[i].c_str(), "weave tuner: %31[a-z_]|%127[0-9x]|w%d|", kernel, dims, &w) != 3 ||
          lines[i].find("searching") == std::string::npos)
        continue;
      std::vector<long long> d;
      std::stringstream ss(dims);
      for (std::string x; std::getline(ss, x, 'x');) d.push_back(std::stoll(x));
      const bool ring = std::string(kernel) == "ring_attention";
      spm::Problem p{ring ? spm::Family::ring : spm::Family::ulysses, d[0], d[1], int(d[2]), int(d[3]), int(d[4]), w,
                     d[5] != 0};
      Shape s;
      s.name = std::string(ring ? "ring " : "ulysses ") + dims + " w" + std::to_string(w) + (std::string(file).find("-c4-") != std::string::npos ? " (c4)" : " (c6)");
      for (size_t j = i + 1; j < lines.size() && lines[j].find("chose") == std::string::npos; ++j) {
        int var = 0, n = 0;
        double us = 0;
        const size_t at = lines[j].find("variant");
        if (at != std::string::npos &&
            std::sscanf(lines[j].c_str() + at, "variant %d, num_comm_sms %d: median %lf", &var, &n, &us) == 3)
          s.rows.push_back({{var, n}, us, where(file, j)});
      }
      v.push_back({p, s});
    }
  }
  return v;
}

// The machine the checked-in sweeps ran on: an H200's SM count (/work/shared/HARDWARE.md), the
// data's, not a default (the kernels read theirs from the runtime).
constexpr int kMeasuredSms = 132;
const weave::runtime::DeviceRates kH200 = weave::runtime::device_rates(kMeasuredSms);

TEST(TuneModel, TpPicksAgainstMeasuredSweeps) {
  std::vector<std::pair<Shape, TuneCandidate>> picks;
  std::vector<double> errors;  // |predicted / measured - 1| of every timed candidate
  for (auto& [p, s] : tp_sweeps()) {
    std::vector<TuneCandidate> cands;
    for (const Timed& t : s.rows) {
      cands.push_back(t.c);
      errors.push_back(std::fabs(tpm::predicted_us(p, t.c, kH200) / t.us - 1));
    }
    picks.push_back({s, tpm::choose(p, cands, kH200)});
  }
  std::sort(errors.begin(), errors.end());
  std::printf("predicted / measured time of each of the %zu timed candidates: median error %.1f %%, worst %.1f %%\n",
              errors.size(), 100 * errors[errors.size() / 2], 100 * errors.back());
  ASSERT_EQ(picks.size(), 4u) << "ag_gemm and gemm_ar at 4096 and 16384 in " << kTpSweeps;
  std::printf("worst ratio %.3f (tolerance %.2f)\n", report("TP sweep (2 x H200)", picks), kTolerance);
}

TEST(TuneModel, AttentionPicksAgainstMeasuredSearches) {
  std::vector<std::pair<Shape, TuneCandidate>> picks;
  for (auto& [p, s] : sp_searches()) {
    std::vector<TuneCandidate> cands;
    for (const Timed& t : s.rows) cands.push_back(t.c);
    picks.push_back({s, spm::choose(p, cands, kH200)});
  }
  ASSERT_EQ(picks.size(), 24u) << "ring and Ulysses, 6 shapes each, two runs";
  std::printf("worst ratio %.3f (tolerance %.2f)\n", report("search (2 x H200)", picks), kTolerance);
}

// The candidates the TP kernels offer on 2 x H200 with room in the heap and 64-bit stream memory
// operations (ag_gemm.cu, gemm_rs.cu and gemm_ar.cu, run paths; the READMEs' Variants tables).
std::vector<TuneCandidate> offered_on_h200(const tpm::Problem& p) {
  const int W = p.W, sms = kMeasuredSms, rows = weave::tp::shard(p.M, W, 0).size;
  const int row_tiles = (rows + weave::tp::kBM - 1) / weave::tp::kBM, tiles_n = (p.N + weave::tp::kBN - 1) / weave::tp::kBN;
  std::vector<TuneCandidate> v;
  if (p.family == tpm::Family::ag_gemm) {
    for (int var = 2; var <= 6; ++var) v.push_back({var, 0});
    if (size_t(rows) * p.K * 2 >= weave::tp::CopyEngine::kChunkBytes) v.push_back({7, 0}), v.push_back({8, 0});
    v.push_back({9, 0});
    for (int var : {0, 1})
      for (int n : {2, 4, 8, 12, 16, 24, 32})
        if (n <= row_tiles && n < sms / 2) v.push_back({var, n});
  } else if (p.family == tpm::Family::gemm_rs) {
    for (int var : {0, 1, 3, 5}) v.push_back({var, 0});
    if (size_t(rows) * p.N * 2 >= weave::tp::CopyEngine::kChunkBytes) v.push_back({4, 0});
    for (int n : {4, 8, 16, 32})
      if (n <= row_tiles * tiles_n && n < sms / 2) v.push_back({2, n});
  } else {
    v.push_back({1, 0});
    const int owned = ((p.M + weave::tp::kBM - 1) / weave::tp::kBM * tiles_n + W - 1) / W;
    for (int n : {4, 8, 16, 24, 32, 48})
      if (n <= owned && n < sms / 2) v.push_back({0, n});
  }
  return v;
}

TEST(TuneModel, TpPicksBesideTheSearchesPicks) {
  std::printf("%-36s %-8s %-8s %10s  %s\n", "shape (2 x H200)", "model", "search", "search us", "measured at");
  int same = 0, rows = 0;
  const std::vector<std::string> lines = lines_of(kTpSweeps);
  for (size_t i = 0; i < lines.size(); ++i) {
    std::string kernel, impl, sweep;
    if (field(lines[i], "sweep", &sweep) || !field(lines[i], "impl", &impl) || impl != "weave" ||
        !field(lines[i], "kernel", &kernel))
      continue;
    const tpm::Family f = kernel == "ag_gemm" ? tpm::Family::ag_gemm
                          : kernel == "gemm_rs" ? tpm::Family::gemm_rs
                                                : tpm::Family::gemm_ar;
    const tpm::Problem p{f, int(num(lines[i], "M")), int(num(lines[i], "N")), int(num(lines[i], "K")), 2, false};
    const std::vector<TuneCandidate> cands = offered_on_h200(p);
    const TuneCandidate searched{int(num(lines[i], "variant")), int(num(lines[i], "num_comm_sms"))};
    ASSERT_TRUE(offered(cands, searched)) << kernel << " row " << i + 1 << ": the search's pick is not offered today";
    const TuneCandidate m = tpm::choose(p, cands, kH200);
    ++rows;
    same += m == searched;
    std::printf("%-36s v%d/%-5d v%d/%-5d %10.1f  %s%s\n",
                (kernel + " " + std::to_string(p.M) + "x" + std::to_string(p.N) + "x" + std::to_string(p.K)).c_str(),
                m.variant, m.num_comm_sms, searched.variant, searched.num_comm_sms, num(lines[i], "time_us"),
                where(kTpSweeps, i).c_str(), m == searched ? "" : "  (the model's pick: not measured in this run)");
  }
  EXPECT_EQ(rows, 20);
  std::printf("the model picks the search's candidate at %d of %d shapes\n", same, rows);
}

}  // namespace
