// Ring and Ulysses attention on 2 ranks (weave-run -n 2) against weave's single-GPU attention
// on the gathered sequence (every rank builds the whole random Q, K, V from the job seed and
// computes the reference on its own GPU): ragged S, zigzag and contiguous sharding, causal and
// not, GQA (incl. Hkv < W), D 64 and 128, outputs poisoned (NaN) first, LSE checked for ring;
// 50 back-to-back launches alternating two input sets (monotonic counters, buffer reuse);
// shapes that differ across ranks and Hq % W != 0 rejected before any launch.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <vector>

#include "../primitives/common.hpp"
#include "attention/attention.hpp"
#include "ring_attention/ring_attention.hpp"
#include "ulysses/ulysses.hpp"

using weave::sp::bf16;

namespace {

const int kTunerOff = (setenv("WEAVE_TUNER_CACHE", "off", 1), 0);

struct Dev {
  void* p = nullptr;
  explicit Dev(size_t bytes) { WEAVE_CUDA_CHECK(cudaMalloc(&p, bytes ? bytes : 16)); }
  ~Dev() { cudaFree(p); }
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

struct Full {  // the whole sequence, as every rank regenerates it
  int B, S, Hq, Hkv, D;
  std::vector<bf16> q, k, v;
};
Full make_full(int B, int S, int Hq, int Hkv, int D, uint64_t seed) {
  Full f{B, S, Hq, Hkv, D, {}, {}, {}};
  f.q = wt::random_matrix<bf16>(seed, 1, size_t(B) * S * Hq * D);
  f.k = wt::random_matrix<bf16>(seed, 2, size_t(B) * S * Hkv * D);
  f.v = wt::random_matrix<bf16>(seed, 3, size_t(B) * S * Hkv * D);
  return f;
}

// Rows [r.begin, r.begin + r.rows) of each listed range, back to back: (B, L, H, D).
std::vector<bf16> take_rows(const std::vector<bf16>& t, int B, int S, int H, int D,
                            const std::vector<std::pair<long long, long long>>& ranges) {
  long long L = 0;
  for (auto& r : ranges) L += r.second;
  std::vector<bf16> out(size_t(B) * L * H * D);
  const size_t row = size_t(H) * D;
  for (int b = 0; b < B; ++b) {
    long long off = 0;
    for (auto& r : ranges) {
      std::copy(t.begin() + (size_t(b) * S + r.first) * row, t.begin() + (size_t(b) * S + r.first + r.second) * row,
                out.begin() + (size_t(b) * L + off) * row);
      off += r.second;
    }
  }
  return out;
}

struct Ref {
  std::vector<bf16> o;     // (B, S, Hq, D)
  std::vector<float> lse;  // (B, Hq, S)
};
Ref reference(const Full& f, bool causal) {
  const size_t nq = f.q.size(), nk = f.k.size();
  Dev q(nq * 2), k(nk * 2), v(nk * 2), o(nq * 2), lse(size_t(f.B) * f.Hq * f.S * 4);
  wt::to_device(q.as<bf16>(), f.q);
  wt::to_device(k.as<bf16>(), f.k);
  wt::to_device(v.as<bf16>(), f.v);
  weave::attention::Shape s{f.B, f.S, f.Hq, f.Hkv, f.D};
  weave::attention::Options opt;
  opt.causal = causal;
  weave::attention::forward(q.as<bf16>(), k.as<bf16>(), v.as<bf16>(), o.as<bf16>(), lse.as<float>(), s, opt);
  WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
  return {wt::to_host(o.as<bf16>(), nq), wt::to_host(lse.as<float>(), size_t(f.B) * f.Hq * f.S)};
}

// Every element of `got` (B, L, H, D) against the reference rows; relative Frobenius and max abs.
void expect_close(const std::vector<bf16>& got, const std::vector<bf16>& ref, const char* what) {
  ASSERT_EQ(got.size(), ref.size());
  double num = 0, den = 0, mx = 0;
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double a = wt::to_f(got[i]), b = wt::to_f(ref[i]);
    if (!std::isfinite(a)) {
      ++bad;
      continue;
    }
    num += (a - b) * (a - b);
    den += b * b;
    mx = std::max(mx, std::fabs(a - b));
  }
  EXPECT_EQ(bad, 0u) << what << ": non-finite outputs (unwritten rows?)";
  EXPECT_LT(std::sqrt(num / std::max(den, 1e-30)), 1e-2) << what;
  EXPECT_LT(mx, 2e-2) << what;
}

std::vector<std::pair<long long, long long>> ring_ranges(long long S, int W, weave::sp::Sharding sh, int r) {
  std::vector<std::pair<long long, long long>> v;
  for (int i = 0; i < weave::sp::chunks_per_rank(sh); ++i) {
    const auto c = weave::sp::chunk_range(S, W, sh, r, i);
    v.push_back({c.begin, c.rows});
  }
  return v;
}

struct RingCase {
  int B, S, Hq, Hkv, D;
};

void run_ring(const RingCase& c, bool causal, weave::sp::Sharding sh, int ncomm, uint64_t seed) {
  auto& comm = wt::comm();
  const int W = comm.world(), r = comm.rank();
  const Full f = make_full(c.B, c.S, c.Hq, c.Hkv, c.D, seed);
  const Ref ref = reference(f, causal);
  const auto ranges = ring_ranges(c.S, W, sh, r);
  const long long L = weave::sp::local_rows(c.S, W, sh, r);
  const auto lq = take_rows(f.q, c.B, c.S, c.Hq, c.D, ranges), lk = take_rows(f.k, c.B, c.S, c.Hkv, c.D, ranges),
             lv = take_rows(f.v, c.B, c.S, c.Hkv, c.D, ranges);
  Dev q(lq.size() * 2), k(lk.size() * 2), v(lv.size() * 2), o(lq.size() * 2), lse(size_t(c.B) * c.Hq * L * 4);
  wt::to_device(q.as<bf16>(), lq);
  wt::to_device(k.as<bf16>(), lk);
  wt::to_device(v.as<bf16>(), lv);
  WEAVE_CUDA_CHECK(cudaMemset(o.p, 0xff, lq.size() * 2));
  WEAVE_CUDA_CHECK(cudaMemset(lse.p, 0xff, size_t(c.B) * c.Hq * L * 4));
  weave::sp::RingAttention ra(comm);
  weave::sp::RingOptions opt;
  opt.causal = causal;
  opt.sharding = sh;
  opt.num_comm_sms = ncomm;
  const weave::sp::RingLaunchInfo li = ra.forward(q.as<bf16>(), k.as<bf16>(), v.as<bf16>(), o.as<bf16>(),
                                                  lse.as<float>(), {c.B, c.S, c.Hq, c.Hkv, c.D}, opt);
  wt::settle();
  const std::string what = "ring S=" + std::to_string(c.S) + " D=" + std::to_string(c.D) + " Hq/Hkv=" +
                           std::to_string(c.Hq) + "/" + std::to_string(c.Hkv) + " causal=" + std::to_string(causal) +
                           " zigzag=" + std::to_string(int(sh)) + " ncomm=" + std::to_string(ncomm);
  bool aligned = true;  // own rows in place exactly where every own chunk starts and ends on a key block (or at S)
  for (auto& rg : ranges)
    aligned = aligned && rg.first % 128 == 0 && ((rg.first + rg.second) % 128 == 0 || rg.first + rg.second == c.S);
  EXPECT_EQ(li.own_in_place, aligned) << what;
  expect_close(wt::to_host(o.as<bf16>(), lq.size()), take_rows(ref.o, c.B, c.S, c.Hq, c.D, ranges), what.c_str());
  // LSE (B, Hq, L): local row l of the shard is global row ranges[...]
  const auto got = wt::to_host(lse.as<float>(), size_t(c.B) * c.Hq * L);
  double worst = 0;
  for (int b = 0; b < c.B; ++b)
    for (int h = 0; h < c.Hq; ++h) {
      long long l = 0;
      for (auto& rg : ranges)
        for (long long i = rg.first; i < rg.first + rg.second; ++i, ++l) {
          const double a = got[(size_t(b) * c.Hq + h) * L + l], e = ref.lse[(size_t(b) * c.Hq + h) * c.S + i];
          worst = std::isfinite(a) ? std::max(worst, std::fabs(a - e) / std::max(1.0, std::fabs(e))) : 1e9;
        }
    }
  EXPECT_LT(worst, 1e-3) << what << " LSE";
}

}  // namespace

TEST(SpGpu, RingMatchesSingleGpuAttention) {
  const uint64_t seed = wt::job_seed();
  const int W = wt::comm().world();
  // Ragged chunks (own rows copied into the gathered buffers), and chunks that start and end on
  // 128-row key blocks under both shardings (own rows read in place from the input).
  const RingCase cases[] = {{1, 1000, 4, 2, 128}, {2, 3001, 4, 4, 64}, {1, 777, 8, 1, 128}, {1, 300, 2, 2, 64},
                            {1, 512 * W, 4, 2, 128}, {2, 256 * W, 4, 4, 64}};
  int i = 0;
  for (const RingCase& c : cases)
    for (bool causal : {false, true})
      for (auto sh : {weave::sp::Sharding::Zigzag, weave::sp::Sharding::Contiguous}) {
        run_ring(c, causal, sh, (i % 2) ? 5 : 2, seed + i);
        ++i;
        if (HasFailure()) return;
      }
}

TEST(SpGpu, RingTunerPicksAndStaysCorrect) {
  run_ring({1, 1000, 4, 2, 128}, true, weave::sp::Sharding::Zigzag, -1, wt::job_seed());
}

namespace {

struct UlyCase {
  int B, S, Hq, Hkv, D;
};

void run_ulysses(const UlyCase& c, bool causal, int ncomm, uint64_t seed) {
  auto& comm = wt::comm();
  const int W = comm.world(), r = comm.rank();
  const Full f = make_full(c.B, c.S, c.Hq, c.Hkv, c.D, seed);
  const Ref ref = reference(f, causal);
  const auto sh = weave::sp::ulysses_shard(c.S, W, r);
  const std::vector<std::pair<long long, long long>> ranges = {{sh.begin, sh.rows}};
  const auto lq = take_rows(f.q, c.B, c.S, c.Hq, c.D, ranges), lk = take_rows(f.k, c.B, c.S, c.Hkv, c.D, ranges),
             lv = take_rows(f.v, c.B, c.S, c.Hkv, c.D, ranges);
  // o in the symmetric heap: the same size on every rank (the largest shard).
  const size_t o_elems = size_t(c.B) * (c.S / W + 1) * c.Hq * c.D;
  Sym o(o_elems * 2);
  Dev q(lq.size() * 2), k(lk.size() * 2), v(lv.size() * 2);
  wt::to_device(q.as<bf16>(), lq);
  wt::to_device(k.as<bf16>(), lk);
  wt::to_device(v.as<bf16>(), lv);
  WEAVE_CUDA_CHECK(cudaMemset(o.p, 0xff, o_elems * 2));
  comm.barrier();  // every rank's o poisoned before anyone writes into it
  weave::sp::Ulysses u(comm);
  weave::sp::UlyssesOptions opt;
  opt.causal = causal;
  opt.num_comm_sms = ncomm;
  u.forward(q.as<bf16>(), k.as<bf16>(), v.as<bf16>(), o.as<bf16>(), {c.B, c.S, c.Hq, c.Hkv, c.D}, opt);
  WEAVE_CUDA_CHECK(cudaStreamSynchronize(nullptr));  // o complete on return of the stream: no barrier first
  const std::string what = "ulysses S=" + std::to_string(c.S) + " D=" + std::to_string(c.D) + " Hq/Hkv=" +
                           std::to_string(c.Hq) + "/" + std::to_string(c.Hkv) + " causal=" + std::to_string(causal) +
                           " ncomm=" + std::to_string(ncomm);
  expect_close(wt::to_host(o.as<bf16>(), lq.size()), take_rows(ref.o, c.B, c.S, c.Hq, c.D, ranges), what.c_str());
  wt::settle();
}

}  // namespace

TEST(SpGpu, UlyssesMatchesSingleGpuAttention) {
  const uint64_t seed = wt::job_seed();
  const UlyCase cases[] = {{1, 1000, 8, 1, 128}, {2, 3001, 4, 4, 64}, {1, 777, 8, 2, 128}, {2, 300, 2, 2, 64}};
  int i = 0;
  for (const UlyCase& c : cases)
    for (bool causal : {false, true}) {
      run_ulysses(c, causal, (i % 2) ? 3 : 2, seed + 100 + i);
      ++i;
      if (HasFailure()) return;
    }
  run_ulysses({1, 1000, 4, 4, 128}, true, -1, seed + 200);  // the tuner's pick
}

// Long, few heads (GQA), ragged or block-aligned chunks: hundreds of query tiles per head, more
// than one wave of CTAs, so non-causal tiles started after the first wave begin at the block
// their head's front recorded (gathered_schedule.hpp, aligned_start) rather than at their own
// rows.
TEST(SpGpu, LongSequenceFewHeadsTilesJoinTheirHeadsFront) {
  const uint64_t seed = wt::job_seed();
  run_ring({1, 49229, 2, 1, 128}, false, weave::sp::Sharding::Contiguous, 2, seed + 300);
  if (HasFailure()) return;
  run_ring({1, 49152, 2, 1, 64}, false, weave::sp::Sharding::Zigzag, 4, seed + 301);  // own rows in place
  if (HasFailure()) return;
  run_ulysses({1, 49229, 4, 2, 128}, false, 2, seed + 302);
}

namespace {

using Ranges = std::vector<std::pair<long long, long long>>;

// This rank's rows of both input sets' q, k, v on the device: in[3 * set + {0, 1, 2}].
std::vector<std::unique_ptr<Dev>> upload(const Full (&f)[2], const Ranges& ranges) {
  std::vector<std::unique_ptr<Dev>> in;
  for (int s = 0; s < 2; ++s)
    for (const auto* t : {&f[s].q, &f[s].k, &f[s].v}) {
      const int H = t == &f[s].q ? f[s].Hq : f[s].Hkv;
      const auto rows = take_rows(*t, f[s].B, f[s].S, H, f[s].D, ranges);
      in.push_back(std::make_unique<Dev>(rows.size() * 2));
      wt::to_device(in.back()->as<bf16>(), rows);
    }
  return in;
}

// Launch i's output (copied aside into hist) against reference i % 2 of a (B, S, Hq, D) output.
void check_history(const Dev& hist, size_t on, int N, const Ref (&ref)[2], int B, int S, int Hq, int D,
                   const Ranges& ranges, const std::string& what) {
  const auto all = wt::to_host(hist.as<bf16>(), on * N);
  for (int i = 0; i < N && !::testing::Test::HasFailure(); ++i)
    expect_close(std::vector<bf16>(all.begin() + i * on, all.begin() + (i + 1) * on),
                 take_rows(ref[i % 2].o, B, S, Hq, D, ranges), (what + std::to_string(i)).c_str());
}

}  // namespace

// 50 launches without a host sync in between, inputs alternating between two sets; each
// launch's output is copied aside on the stream and checked.
TEST(SpGpu, BackToBackLaunchesAlternatingInputs) {
  auto& comm = wt::comm();
  const int W = comm.world(), r = comm.rank();
  const uint64_t seed = wt::job_seed();
  const int B = 1, S = 1000, Hq = 4, Hkv = 2, D = 128, N = 50;
  const Full f[2] = {make_full(B, S, Hq, Hkv, D, seed + 1), make_full(B, S, Hq, Hkv, D, seed + 2)};
  {  // ring, zigzag, causal
    const auto ranges = ring_ranges(S, W, weave::sp::Sharding::Zigzag, r);
    const Ref ref[2] = {reference(f[0], true), reference(f[1], true)};
    const auto in = upload(f, ranges);
    const long long L = weave::sp::local_rows(S, W, weave::sp::Sharding::Zigzag, r);
    const size_t on = size_t(B) * L * Hq * D;
    Dev o(on * 2), lse(size_t(B) * Hq * L * 4), hist(on * 2 * N);
    weave::sp::RingAttention ra(comm);
    weave::sp::RingOptions opt;
    opt.causal = true;
    opt.num_comm_sms = 3;
    for (int i = 0; i < N; ++i) {
      const int s = i % 2;
      WEAVE_CUDA_CHECK(cudaMemsetAsync(o.p, 0xff, on * 2));
      ra.forward(in[3 * s]->as<bf16>(), in[3 * s + 1]->as<bf16>(), in[3 * s + 2]->as<bf16>(), o.as<bf16>(),
                 lse.as<float>(), {B, S, Hq, Hkv, D}, opt);
      WEAVE_CUDA_CHECK(cudaMemcpyAsync(hist.as<bf16>() + i * on, o.p, on * 2, cudaMemcpyDeviceToDevice));
    }
    wt::settle();
    check_history(hist, on, N, ref, B, S, Hq, D, ranges, "ring launch ");
  }
  {  // Ulysses, non-causal
    const auto sh = weave::sp::ulysses_shard(S, W, r);
    const std::vector<std::pair<long long, long long>> ranges = {{sh.begin, sh.rows}};
    const Ref ref[2] = {reference(f[0], false), reference(f[1], false)};
    const auto in = upload(f, ranges);
    const size_t on = size_t(B) * sh.rows * Hq * D, omax = size_t(B) * (S / W + 1) * Hq * D;
    Sym o(omax * 2);
    Dev hist(on * 2 * N);
    weave::sp::Ulysses u(comm);
    weave::sp::UlyssesOptions opt;
    opt.num_comm_sms = 2;
    for (int i = 0; i < N; ++i) {
      const int s = i % 2;
      u.forward(in[3 * s]->as<bf16>(), in[3 * s + 1]->as<bf16>(), in[3 * s + 2]->as<bf16>(), o.as<bf16>(),
                {B, S, Hq, Hkv, D}, opt);
      WEAVE_CUDA_CHECK(cudaMemcpyAsync(hist.as<bf16>() + i * on, o.p, on * 2, cudaMemcpyDeviceToDevice));
    }
    wt::settle();
    check_history(hist, on, N, ref, B, S, Hq, D, ranges, "ulysses launch ");
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

// A call on a stream that is capturing a CUDA graph is rejected on every rank with nothing
// captured (its signal rounds are fixed when it is enqueued: a replay would reuse them), and
// the objects work afterwards.
TEST(SpGpu, GraphCaptureRejected) {
  auto& comm = wt::comm();
  const int W = comm.world();
  const weave::sp::RingShape rs{1, 256 * W, 2, 2, 64};
  const weave::sp::UlyssesShape us{1, 256 * W, 2 * W, 2 * W, 64};
  Sym bq(size_t(1) << 20), bk(size_t(1) << 20), bv(size_t(1) << 20), bo(size_t(1) << 20), bl(size_t(1) << 20);
  bf16 *q = bq.as<bf16>(), *k = bk.as<bf16>(), *v = bv.as<bf16>(), *o = bo.as<bf16>();
  weave::sp::RingAttention ra(comm);
  weave::sp::Ulysses u(comm);
  weave::sp::RingOptions ro;
  ro.num_comm_sms = 4;
  weave::sp::UlyssesOptions uo;
  uo.num_comm_sms = 4;
  cudaStream_t st;
  WEAVE_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  wt::expect_capture_rejected(st, "ring_attention", [&] { ra.forward(q, k, v, o, bl.as<float>(), rs, ro, st); });
  wt::expect_capture_rejected(st, "ulysses", [&] { u.forward(q, k, v, o, us, uo, st); });
  WEAVE_CUDA_CHECK(cudaMemsetAsync(q, 0, size_t(1) << 20, st));
  WEAVE_CUDA_CHECK(cudaMemsetAsync(k, 0, size_t(1) << 20, st));
  WEAVE_CUDA_CHECK(cudaMemsetAsync(v, 0, size_t(1) << 20, st));
  ra.forward(q, k, v, o, bl.as<float>(), rs, ro, st);
  u.forward(q, k, v, o, us, uo, st);
  WEAVE_CUDA_CHECK(cudaStreamSynchronize(st));
  WEAVE_CUDA_CHECK(cudaStreamDestroy(st));
  wt::settle();
}
