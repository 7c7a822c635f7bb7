// Ring and Ulysses attention on W ranks (weave-run -n W) against the cuBLAS float32 attention
// reference (check/attention_ref.hpp), which shares no code with weave's kernels: every rank
// regenerates the whole normal Q, K, V (logit spread ~3, a peaked softmax) from the job seed on
// its GPU, computes the reference of its own rows over the whole sequence, and checks every
// element of its O per tile (128 rows x D of one head) against a per-element bound, and ring's
// LSE per 128 rows (Ulysses returns none). A case passes only when it passes on every rank.
// Ragged S, zigzag and contiguous sharding, causal and not, GQA (incl. Hkv < W), D 64 and 128,
// outputs poisoned (NaN) first; 50 back-to-back launches alternating two input sets, the output
// re-poisoned before each launch and each launch checked on its own (monotonic counters, buffer
// reuse); the same captured in a CUDA graph and replayed; shapes that differ across ranks and
// Hq % W != 0 rejected before any launch.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "../primitives/common.hpp"
#include "check/attention_ref.hpp"
#include "check/seed.hpp"
#include "ring_attention/ring_attention.hpp"
#include "ulysses/ulysses.hpp"

using weave::check::AttnProblem;
using weave::check::AttnReport;
using weave::check::RowRange;
using weave::sp::bf16;

namespace {

const int kTunerOff = (setenv("WEAVE_TUNER_CACHE", "off", 1), 0);

struct Dev {
  void* p = nullptr;
  explicit Dev(size_t bytes) { WEAVE_CUDA_CHECK(cudaMalloc(&p, bytes ? bytes : 16)); }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(p);
  }
};
struct Sym {
  void* p;
  explicit Sym(size_t bytes) : p(wt::comm().alloc(bytes ? bytes : 16)) {}
  ~Sym() { wt::comm().free(p); }
  template <class T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

weave::check::AttentionRef& aref() {
  static weave::check::AttentionRef r;
  return r;
}

// The whole sequence's Q (B, S, Hq, D), K and V (B, S, Hkv, D) on this rank's GPU, identical on
// every rank (a function of the seed and the global element only).
struct Full {
  int B, S, Hq, Hkv, D;
  Dev q, k, v;
  Full(int B_, int S_, int Hq_, int Hkv_, int D_, uint64_t seed)
      : B(B_),
        S(S_),
        Hq(Hq_),
        Hkv(Hkv_),
        D(D_),
        q(size_t(B_) * S_ * Hq_ * D_ * 2),
        k(size_t(B_) * S_ * Hkv_ * D_ * 2),
        v(size_t(B_) * S_ * Hkv_ * D_ * 2) {
    const float sd = float(weave::check::qk_std(D, 0.f));
    weave::check::fill_normal(q.as<bf16>(), B, S, Hq * D, weave::check::derive(seed, 1), sd);
    weave::check::fill_normal(k.as<bf16>(), B, S, Hkv * D, weave::check::derive(seed, 2), sd);
    weave::check::fill_normal(v.as<bf16>(), B, S, Hkv * D, weave::check::derive(seed, 3), 1.f);
    WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
  }
};

using Ranges = std::vector<std::pair<long long, long long>>;  // (global begin, rows) per local chunk

long long rows_of(const Ranges& r) {
  long long L = 0;
  for (auto& x : r) L += x.second;
  return L;
}

// This rank's rows of a (B, S, H, D) device tensor, chunks back to back: (B, L, H, D).
std::unique_ptr<Dev> take_rows(const Dev& t, int B, int S, int H, int D, const Ranges& ranges) {
  const long long L = rows_of(ranges);
  const size_t row = size_t(H) * D;
  auto out = std::make_unique<Dev>(size_t(B) * L * row * 2);
  for (int b = 0; b < B; ++b) {
    long long off = 0;
    for (auto& r : ranges) {
      WEAVE_CUDA_CHECK(cudaMemcpy(out->as<bf16>() + (size_t(b) * L + off) * row,
                                  t.as<bf16>() + (size_t(b) * S + r.first) * row, r.second * row * 2,
                                  cudaMemcpyDeviceToDevice));
      off += r.second;
    }
  }
  return out;
}

// The reference problem and row ranges of this rank's output: q = the full Q, output rows local.
AttnProblem problem(const Full& f, const Ranges& ranges, bool causal) {
  AttnProblem p;
  p.B = f.B, p.Hq = f.Hq, p.Hkv = f.Hkv, p.D = f.D, p.Skv = f.S, p.Lq = f.S, p.Lo = rows_of(ranges);
  p.causal = causal;
  return p;
}
std::vector<RowRange> row_ranges(const Ranges& ranges) {
  std::vector<RowRange> v;
  long long off = 0;
  for (auto& r : ranges) {
    v.push_back({r.first, off, r.first, r.second});
    off += r.second;
  }
  return v;
}

// True when `ok` on every rank; otherwise one failure naming the ranks that were wrong, on every
// rank (each rank's own report was printed by that rank). Collective.
bool all_ranks(bool ok, const std::string& what) {
  auto& comm = wt::comm();
  int mine = ok ? 1 : 0;
  std::vector<int> all(comm.world());
  comm.bootstrap().all_gather(&mine, all.data(), sizeof mine);
  std::string bad;
  for (int r = 0; r < comm.world(); ++r)
    if (!all[r]) bad += " " + std::to_string(r);
  EXPECT_TRUE(bad.empty()) << what << ": wrong on rank(s)" << bad;
  return bad.empty();
}

void report(const AttnReport& rep, const std::string& what) {
  std::printf("[rank %d] %s: O worst %.3f%s%s\n", wt::comm().rank(), what.c_str(), rep.o.worst,
              rep.has_lse ? (", LSE worst " + std::to_string(rep.lse.worst)).c_str() : "", rep.ok() ? "" : "  WRONG");
  if (!rep.ok()) std::printf("[rank %d]   %s\n", wt::comm().rank(), rep.str().c_str());
  std::fflush(stdout);
}

Ranges ring_ranges(long long S, int W, weave::sp::Sharding sh, int r) {
  Ranges v;
  for (int i = 0; i < weave::sp::chunks_per_rank(sh); ++i) {
    const auto c = weave::sp::chunk_range(S, W, sh, r, i);
    v.push_back({c.begin, c.rows});
  }
  return v;
}

struct RingCase {
  int B, S, Hq, Hkv, D;
};

// Returns whether the case passed on every rank (collective: every rank returns the same).
bool run_ring(const RingCase& c, bool causal, weave::sp::Sharding sh, int ncomm, uint64_t seed) {
  auto& comm = wt::comm();
  const int W = comm.world(), r = comm.rank();
  const Full f(c.B, c.S, c.Hq, c.Hkv, c.D, seed);
  const auto ranges = ring_ranges(c.S, W, sh, r);
  const long long L = rows_of(ranges);
  const auto q = take_rows(f.q, c.B, c.S, c.Hq, c.D, ranges), k = take_rows(f.k, c.B, c.S, c.Hkv, c.D, ranges),
             v = take_rows(f.v, c.B, c.S, c.Hkv, c.D, ranges);
  const size_t on = size_t(c.B) * L * c.Hq * c.D, nl = size_t(c.B) * c.Hq * L;
  Dev o(on * 2), lse(nl * 4);
  weave::check::poison(o.as<bf16>(), on);
  weave::check::poison(lse.as<float>(), nl);
  weave::sp::RingAttention ra(comm);
  weave::sp::RingOptions opt;
  opt.causal = causal;
  opt.sharding = sh;
  opt.num_comm_sms = ncomm;
  const weave::sp::RingLaunchInfo li = ra.forward(q->as<bf16>(), k->as<bf16>(), v->as<bf16>(), o.as<bf16>(),
                                                  lse.as<float>(), {c.B, c.S, c.Hq, c.Hkv, c.D}, opt);
  wt::settle();
  const std::string what = "ring S=" + std::to_string(c.S) + " D=" + std::to_string(c.D) +
                           " Hq/Hkv=" + std::to_string(c.Hq) + "/" + std::to_string(c.Hkv) +
                           " causal=" + std::to_string(causal) + " zigzag=" + std::to_string(int(sh)) +
                           " ncomm=" + std::to_string(ncomm);
  bool aligned = true;  // own rows in place exactly where every own chunk starts and ends on a key block (or at S)
  for (auto& rg : ranges)
    aligned = aligned && rg.first % 128 == 0 && ((rg.first + rg.second) % 128 == 0 || rg.first + rg.second == c.S);
  EXPECT_EQ(li.own_in_place, aligned) << what;
  const AttnReport rep = aref().check(problem(f, ranges, causal), f.q.as<bf16>(), f.k.as<bf16>(), f.v.as<bf16>(),
                                      row_ranges(ranges), o.as<bf16>(), lse.as<float>());
  report(rep, what);
  EXPECT_TRUE(rep.has_lse) << what;
  return all_ranks(rep.ok() && li.own_in_place == aligned, what);
}

}  // namespace

TEST(SpGpu, RingMatchesReference) {
  const uint64_t seed = wt::job_seed();
  const int W = wt::comm().world();
  // Ragged chunks (own rows copied into the gathered buffers), and chunks that start and end on
  // 128-row key blocks under both shardings (own rows read in place from the input).
  const RingCase cases[] = {{1, 1000, 4, 2, 128}, {2, 3001, 4, 4, 64},     {1, 777, 8, 1, 128},
                            {1, 300, 2, 2, 64},   {1, 512 * W, 4, 2, 128}, {2, 256 * W, 4, 4, 64}};
  int i = 0;
  for (const RingCase& c : cases)
    for (bool causal : {false, true})
      for (auto sh : {weave::sp::Sharding::Zigzag, weave::sp::Sharding::Contiguous}) {
        if (!run_ring(c, causal, sh, (i % 2) ? 5 : 2, weave::check::derive(seed, i))) return;
        ++i;
      }
}

TEST(SpGpu, RingTunerPicksAndStaysCorrect) {
  run_ring({1, 1000, 4, 2, 128}, true, weave::sp::Sharding::Zigzag, -1, wt::job_seed());
}

namespace {

struct UlyCase {
  int B, S, Hq, Hkv, D;
};

bool run_ulysses(const UlyCase& c, bool causal, int ncomm, uint64_t seed) {
  auto& comm = wt::comm();
  const int W = comm.world(), r = comm.rank();
  const Full f(c.B, c.S, c.Hq, c.Hkv, c.D, seed);
  const auto sh = weave::sp::ulysses_shard(c.S, W, r);
  const Ranges ranges = {{sh.begin, sh.rows}};
  const auto q = take_rows(f.q, c.B, c.S, c.Hq, c.D, ranges), k = take_rows(f.k, c.B, c.S, c.Hkv, c.D, ranges),
             v = take_rows(f.v, c.B, c.S, c.Hkv, c.D, ranges);
  // o in the symmetric heap: the same size on every rank (the largest shard).
  const size_t o_elems = size_t(c.B) * (c.S / W + 1) * c.Hq * c.D;
  Sym o(o_elems * 2);
  weave::check::poison(o.as<bf16>(), o_elems);
  WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
  comm.barrier();  // every rank's o poisoned before anyone writes into it
  weave::sp::Ulysses u(comm);
  weave::sp::UlyssesOptions opt;
  opt.causal = causal;
  opt.num_comm_sms = ncomm;
  u.forward(q->as<bf16>(), k->as<bf16>(), v->as<bf16>(), o.as<bf16>(), {c.B, c.S, c.Hq, c.Hkv, c.D}, opt);
  WEAVE_CUDA_CHECK(cudaStreamSynchronize(nullptr));  // o complete on return of the stream: no barrier first
  const std::string what = "ulysses S=" + std::to_string(c.S) + " D=" + std::to_string(c.D) +
                           " Hq/Hkv=" + std::to_string(c.Hq) + "/" + std::to_string(c.Hkv) +
                           " causal=" + std::to_string(causal) + " ncomm=" + std::to_string(ncomm);
  const AttnReport rep = aref().check(problem(f, ranges, causal), f.q.as<bf16>(), f.k.as<bf16>(), f.v.as<bf16>(),
                                      row_ranges(ranges), o.as<bf16>(), nullptr);  // Ulysses returns no LSE
  report(rep, what);
  wt::settle();
  return all_ranks(rep.ok(), what);
}

}  // namespace

TEST(SpGpu, UlyssesMatchesReference) {
  const uint64_t seed = wt::job_seed();
  const UlyCase cases[] = {{1, 1000, 8, 1, 128}, {2, 3001, 4, 4, 64}, {1, 777, 8, 2, 128}, {2, 300, 2, 2, 64}};
  int i = 0;
  for (const UlyCase& c : cases)
    for (bool causal : {false, true}) {
      if (!run_ulysses(c, causal, (i % 2) ? 3 : 2, weave::check::derive(seed, 100 + i))) return;
      ++i;
    }
  run_ulysses({1, 1000, 4, 4, 128}, true, -1, weave::check::derive(seed, 200));  // the tuner's pick
}

// Long, few heads (GQA), ragged or block-aligned chunks: hundreds of query tiles per head, more
// than one wave of CTAs, so non-causal tiles started after the first wave begin at the block
// their head's front recorded (gathered_schedule.hpp, aligned_start) rather than at their own
// rows.
TEST(SpGpu, LongSequenceFewHeadsTilesJoinTheirHeadsFront) {
  const uint64_t seed = wt::job_seed();
  if (!run_ring({1, 49229, 2, 1, 128}, false, weave::sp::Sharding::Contiguous, 2, weave::check::derive(seed, 300)))
    return;
  if (!run_ring({1, 49152, 2, 1, 64}, false, weave::sp::Sharding::Zigzag, 4, weave::check::derive(seed, 301)))
    return;  // own rows in place
  run_ulysses({1, 49229, 4, 2, 128}, false, 2, weave::check::derive(seed, 302));
}

namespace {

// This rank's rows of both input sets' q, k, v on the device: in[3 * set + {0, 1, 2}].
std::vector<std::unique_ptr<Dev>> upload(const Full& f0, const Full& f1, const Ranges& ranges) {
  std::vector<std::unique_ptr<Dev>> in;
  for (const Full* f : {&f0, &f1}) {
    in.push_back(take_rows(f->q, f->B, f->S, f->Hq, f->D, ranges));
    in.push_back(take_rows(f->k, f->B, f->S, f->Hkv, f->D, ranges));
    in.push_back(take_rows(f->v, f->B, f->S, f->Hkv, f->D, ranges));
  }
  return in;
}

// The float32 reference of this rank's rows (`ranges`) for each of the two input sets.
std::array<weave::check::AttnRefRows, 2> refs_of(const AttnProblem& p, const Full& f0, const Full& f1,
                                                 const Ranges& ranges) {
  std::array<weave::check::AttnRefRows, 2> r;
  const Full* f[2] = {&f0, &f1};
  for (int i = 0; i < 2; ++i)
    r[i] = aref().compute(p, f[i]->q.as<bf16>(), f[i]->k.as<bf16>(), f[i]->v.as<bf16>(), row_ranges(ranges));
  return r;
}

// Launch i's output (and LSE, when lse_hist is given), copied aside, against reference i % 2;
// every launch on its own. Collective (the verdict is combined over ranks).
bool check_history(const AttnProblem& p, const std::array<weave::check::AttnRefRows, 2>& ref, const Dev& o_hist,
                   size_t on, const Dev* lse_hist, size_t nl, int N, const std::string& what) {
  int bad = 0, first_bad = -1;
  double worst_o = 0, worst_l = 0;
  for (int i = 0; i < N; ++i) {
    const AttnReport rep = weave::check::AttentionRef::compare(p, ref[i % 2], o_hist.as<bf16>() + i * on,
                                                               lse_hist ? lse_hist->as<float>() + i * nl : nullptr);
    worst_o = std::max(worst_o, rep.o.worst);
    worst_l = std::max(worst_l, rep.lse.worst);
    if (!rep.ok()) {
      if (bad++ == 0) first_bad = i;
      if (bad <= 3) std::printf("[rank %d] %s launch %d: %s\n", wt::comm().rank(), what.c_str(), i, rep.str().c_str());
    }
  }
  std::printf("[rank %d] %s: %d launches, %d wrong (first %d), O worst %.3f%s\n", wt::comm().rank(), what.c_str(), N,
              bad, first_bad, worst_o, lse_hist ? (", LSE worst " + std::to_string(worst_l)).c_str() : "");
  std::fflush(stdout);
  return all_ranks(bad == 0, what);
}

}  // namespace

// 50 launches without a host sync in between, inputs alternating between two sets; the output
// (and ring's LSE) is re-poisoned on the stream before every launch and copied aside after it,
// and every launch is checked against its own set's reference: a launch that skipped rows would
// leave NaN, one that read the other set's K/V (a stale buffer or signal) would fail the bound.
TEST(SpGpu, BackToBackLaunchesAlternatingInputs) {
  auto& comm = wt::comm();
  const int W = comm.world(), r = comm.rank();
  const uint64_t seed = wt::job_seed();
  const int B = 1, S = 1000, Hq = 4, Hkv = 2, D = 128, N = 50;
  const Full f0(B, S, Hq, Hkv, D, weave::check::derive(seed, 1)), f1(B, S, Hq, Hkv, D, weave::check::derive(seed, 2));
  {  // ring, zigzag, causal
    const auto ranges = ring_ranges(S, W, weave::sp::Sharding::Zigzag, r);
    const AttnProblem p = problem(f0, ranges, true);
    const auto ref = refs_of(p, f0, f1, ranges);
    const auto in = upload(f0, f1, ranges);
    const long long L = rows_of(ranges);
    const size_t on = size_t(B) * L * Hq * D, nl = size_t(B) * Hq * L;
    Dev o(on * 2), lse(nl * 4), o_hist(on * 2 * N), lse_hist(nl * 4 * N);
    weave::sp::RingAttention ra(comm);
    weave::sp::RingOptions opt;
    opt.causal = true;
    opt.num_comm_sms = 3;
    for (int i = 0; i < N; ++i) {
      const int s = i % 2;
      weave::check::poison(o.as<bf16>(), on);
      weave::check::poison(lse.as<float>(), nl);
      ra.forward(in[3 * s]->as<bf16>(), in[3 * s + 1]->as<bf16>(), in[3 * s + 2]->as<bf16>(), o.as<bf16>(),
                 lse.as<float>(), {B, S, Hq, Hkv, D}, opt);
      WEAVE_CUDA_CHECK(cudaMemcpyAsync(o_hist.as<bf16>() + i * on, o.p, on * 2, cudaMemcpyDeviceToDevice));
      WEAVE_CUDA_CHECK(cudaMemcpyAsync(lse_hist.as<float>() + i * nl, lse.p, nl * 4, cudaMemcpyDeviceToDevice));
    }
    wt::settle();
    if (!check_history(p, ref, o_hist, on, &lse_hist, nl, N, "ring back to back")) return;
  }
  {  // Ulysses, non-causal
    const auto sh = weave::sp::ulysses_shard(S, W, r);
    const Ranges ranges = {{sh.begin, sh.rows}};
    const AttnProblem p = problem(f0, ranges, false);
    const auto ref = refs_of(p, f0, f1, ranges);
    const auto in = upload(f0, f1, ranges);
    const size_t on = size_t(B) * sh.rows * Hq * D, omax = size_t(B) * (S / W + 1) * Hq * D;
    Sym o(omax * 2);
    Dev o_hist(on * 2 * N);
    weave::sp::Ulysses u(comm);
    weave::sp::UlyssesOptions opt;
    opt.num_comm_sms = 2;
    for (int i = 0; i < N; ++i) {
      const int s = i % 2;
      // Safe on the stream: peers write this rank's rows of launch i only after this rank's
      // communicators pushed its Q rows of launch i, i.e. after this poison; and launch i - 1
      // ended (copy-aside included) only when all its stores into o had arrived.
      weave::check::poison(o.as<bf16>(), omax);
      u.forward(in[3 * s]->as<bf16>(), in[3 * s + 1]->as<bf16>(), in[3 * s + 2]->as<bf16>(), o.as<bf16>(),
                {B, S, Hq, Hkv, D}, opt);
      WEAVE_CUDA_CHECK(cudaMemcpyAsync(o_hist.as<bf16>() + i * on, o.p, on * 2, cudaMemcpyDeviceToDevice));
    }
    wt::settle();
    check_history(p, ref, o_hist, on, nullptr, 0, N, "ulysses back to back");
  }
}

TEST(SpGpu, BadInputRejectedBeforeLaunch) {
  auto& comm = wt::comm();
  const int r = comm.rank(), W = comm.world();
  // Separate q, k, v, o (o in the heap for Ulysses), so each call fails for the reason named
  // beside it and not for aliasing.
  Sym bq(size_t(1) << 20), bk(size_t(1) << 20), bv(size_t(1) << 20), bo(size_t(1) << 20);
  bf16 *q = bq.as<bf16>(), *k = bk.as<bf16>(), *v = bv.as<bf16>(), *o = bo.as<bf16>();
  weave::sp::RingAttention ra(comm);
  weave::sp::Ulysses u(comm);
  if (W > 1) {  // (at world 1 these shapes are valid)
    // Shapes that differ across ranks: every rank throws (nothing launched).
    EXPECT_THROW(ra.forward(q, k, v, o, nullptr, {1, 512 + r, 2, 2, 64}), weave::Error);
    EXPECT_THROW(u.forward(q, k, v, o, {1, 512 + r, 2, 2, 64}), weave::Error);
    // Hq not a multiple of W.
    EXPECT_THROW(u.forward(q, k, v, o, {1, 512, W + 1, 1, 64}), weave::Error);
  }
  // Bad D, GQA ratio, too short a sequence.
  EXPECT_THROW(ra.forward(q, k, v, o, nullptr, {1, 512, 2, 2, 96}), weave::Error);
  EXPECT_THROW(ra.forward(q, k, v, o, nullptr, {1, 512, 3, 2, 64}), weave::Error);
  EXPECT_THROW(ra.forward(q, k, v, o, nullptr, {1, 2 * W - 1, 2, 2, 64}), weave::Error);
  wt::settle();
}

// Ring (zigzag, causal) and Ulysses (non-causal) captured in one CUDA graph after an eager call
// of each shape, replayed N times with the two input sets copied alternately into the captured
// inputs and the outputs poisoned first; each replay's output is copied aside and checked against
// its own set's reference (the rounds are read on the device). Between replays, eager calls of the
// captured shapes and ring calls of another length (another gathered-buffer layout: the device
// drain before own rows are copied in); a graph captured and never replayed. A shape's first call
// under capture is refused with nothing captured.
TEST(SpGpu, GraphCaptureAndReplay) {
  auto& comm = wt::comm();
  const int W = comm.world(), r = comm.rank();
  const uint64_t seed = wt::job_seed();
  const int B = 1, S = 1000, Hq = 4, Hkv = 2, D = 128, N = 30;
  const Full f0(B, S, Hq, Hkv, D, weave::check::derive(seed, 11)), f1(B, S, Hq, Hkv, D, weave::check::derive(seed, 12));
  cudaStream_t st;  // blocking: the default-stream copies and poisons below order with it
  WEAVE_CUDA_CHECK(cudaStreamCreate(&st));
  // Ring
  const auto rr = ring_ranges(S, W, weave::sp::Sharding::Zigzag, r);
  const AttnProblem rp = problem(f0, rr, true);
  const auto rref = refs_of(rp, f0, f1, rr);
  const auto rin = upload(f0, f1, rr);
  const long long L = rows_of(rr);
  const size_t rq = size_t(B) * L * Hq * D, rkv = size_t(B) * L * Hkv * D, nl = size_t(B) * Hq * L;
  Dev sq(rq * 2), sk(rkv * 2), sv(rkv * 2), ro(rq * 2), rl(nl * 4), ro_hist(rq * 2 * N), rl_hist(nl * 4 * N);
  weave::sp::RingAttention ra(comm);
  weave::sp::RingOptions ropt;
  ropt.causal = true;
  ropt.num_comm_sms = 3;
  // Ulysses
  const auto sh = weave::sp::ulysses_shard(S, W, r);
  const Ranges ur = {{sh.begin, sh.rows}};
  const AttnProblem up = problem(f0, ur, false);
  const auto uref = refs_of(up, f0, f1, ur);
  const auto uin = upload(f0, f1, ur);
  const size_t uq = size_t(B) * sh.rows * Hq * D, ukv = size_t(B) * sh.rows * Hkv * D,
               omax = size_t(B) * (S / W + 1) * Hq * D;
  Dev tq(uq * 2), tk(ukv * 2), tv(ukv * 2), uo_hist(uq * 2 * N);
  Sym uo(omax * 2);
  weave::sp::Ulysses u(comm);
  weave::sp::UlyssesOptions uopt;
  uopt.num_comm_sms = 2;
  // Another ring layout for the eager calls in between (its own inputs, checked once at the end).
  const int S2 = 777;
  const Full g2(B, S2, Hq, Hkv, D, weave::check::derive(seed, 13));
  const auto rr2 = ring_ranges(S2, W, weave::sp::Sharding::Zigzag, r);
  const auto q2 = take_rows(g2.q, B, S2, Hq, D, rr2), k2 = take_rows(g2.k, B, S2, Hkv, D, rr2),
             v2 = take_rows(g2.v, B, S2, Hkv, D, rr2);
  const long long L2 = rows_of(rr2);
  Dev o2(size_t(B) * L2 * Hq * D * 2), l2(size_t(B) * Hq * L2 * 4);

  auto ring_call = [&] { ra.forward(sq.as<bf16>(), sk.as<bf16>(), sv.as<bf16>(), ro.as<bf16>(), rl.as<float>(),
                                    {B, S, Hq, Hkv, D}, ropt, st); };
  auto uly_call = [&] { u.forward(tq.as<bf16>(), tk.as<bf16>(), tv.as<bf16>(), uo.as<bf16>(), {B, S, Hq, Hkv, D}, uopt,
                                  st); };
  auto set_inputs = [&](int s) {
    Dev* dst[6] = {&sq, &sk, &sv, &tq, &tk, &tv};
    const size_t bytes[6] = {rq * 2, rkv * 2, rkv * 2, uq * 2, ukv * 2, ukv * 2};
    for (int j = 0; j < 6; ++j)
      WEAVE_CUDA_CHECK(cudaMemcpyAsync(dst[j]->p, (j < 3 ? rin : uin)[3 * s + j % 3]->p, bytes[j],
                                       cudaMemcpyDeviceToDevice));
    weave::check::poison(ro.as<bf16>(), rq);
    weave::check::poison(rl.as<float>(), nl);
    weave::check::poison(uo.as<bf16>(), omax);
  };
  {  // a first call under capture: refused, nothing captured
    const auto [msg, nodes] = wt::under_capture(st, ring_call);
    EXPECT_NE(msg.find("eager call"), std::string::npos) << msg;
    EXPECT_EQ(nodes, 0u) << "the refused ring call captured something";
    wt::settle();
  }
  auto both = [&] {
    ring_call();
    uly_call();
  };
  set_inputs(0);
  both();
  const wt::Graph graph(st, both);
  for (int i = 0; i < N; ++i) {
    set_inputs(i % 2);
    graph.launch(st);
    WEAVE_CUDA_CHECK(cudaMemcpyAsync(ro_hist.as<bf16>() + i * rq, ro.p, rq * 2, cudaMemcpyDeviceToDevice, st));
    WEAVE_CUDA_CHECK(cudaMemcpyAsync(rl_hist.as<float>() + i * nl, rl.p, nl * 4, cudaMemcpyDeviceToDevice, st));
    WEAVE_CUDA_CHECK(cudaMemcpyAsync(uo_hist.as<bf16>() + i * uq, uo.p, uq * 2, cudaMemcpyDeviceToDevice, st));
    if (i % 5 == 2) {  // eager calls in between: another layout, then the captured shapes
      ra.forward(q2->as<bf16>(), k2->as<bf16>(), v2->as<bf16>(), o2.as<bf16>(), l2.as<float>(), {B, S2, Hq, Hkv, D},
                 ropt, st);
      set_inputs(1 - i % 2);
      both();
    }
    if (i == N / 2) {  // captured, never replayed
      const wt::Graph unplayed(st, both);
    }
  }
  WEAVE_CUDA_CHECK(cudaStreamSynchronize(st));
  wt::settle();
  const bool ring_ok = check_history(rp, rref, ro_hist, rq, &rl_hist, nl, N, "ring graph replays");
  const bool uly_ok = check_history(up, uref, uo_hist, uq, nullptr, 0, N, "ulysses graph replays");
  const AttnReport rep2 = aref().check(problem(g2, rr2, true), g2.q.as<bf16>(), g2.k.as<bf16>(), g2.v.as<bf16>(),
                                       row_ranges(rr2), o2.as<bf16>(), l2.as<float>());
  report(rep2, "ring of another length between replays");
  all_ranks(ring_ok && uly_ok && rep2.ok(), "graph capture and replay");
  WEAVE_CUDA_CHECK(cudaStreamDestroy(st));
  wt::settle();
}
