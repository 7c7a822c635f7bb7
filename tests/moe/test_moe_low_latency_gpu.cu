// The MoE low-latency mode (kernels/moe/low_latency.hpp) on W ranks (weave-run; no NCCL, so
// WEAVE_SHARE_GPUS=1 runs both ranks on one GPU), against references every rank builds on the CPU
// from every rank's inputs (regenerated from rank 0's seed; the layout from
// low_latency_schedule.hpp's ll_plan, itself checked against a brute-force layout on the CPU):
// - dispatch: every (token, slot) routed to this rank holds its token's row bit for bit at the
//   plan's row, with its metadata (source, token, slot, expert); per-expert counts, per-source
//   counts and offsets; every row of an expert's region past its count still poison;
// - combine: out[t] = sum_j w[t, j] y[t, j] against float64 under 2^-8 |r| + 2^-19 sum_j |w y|
//   (test_moe_exchange_gpu's bound: the fp32 fma chain of k <= 16 terms, then one bf16 rounding),
//   the expert outputs y a hash of (rank, row, column) filled on the device;
// - the decode layer: dispatch -> grouped GEMM (up, row_stride) -> swiglu_strided -> grouped GEMM
//   (down, row_stride) -> combine against the float64 layer reference of check/moe_ref.hpp;
// Shapes: H = 7168 and ragged H (1032, 264, 200), k = 1, 2, 4, 8, T = 0, 1, 37, 128, 255, 256
// (different per rank), E = 8W and 64; routings random, Dirichlet-skewed, every token on expert 0
// (a full expert region), a token's experts on one rank, repeated ids, half the experts empty.
// Then 200 dispatch + combine calls back to back (no host synchronisation) with changing routing
// and T, every one checked; device-found errors (an out-of-range id, too many rows of one rank on
// one expert) reported by check() with the same message on every rank, zero counts and NaN
// outputs, then a correct call; host-found errors (T > max_tokens, a misaligned x, a short y, a
// dispatch twice, a combine without dispatch, bad configs, check() on a capturing stream) thrown on
// every rank before anything is launched, then a correct call. The decode layer captured in a CUDA
// graph and replayed with changing routing, eager calls between, every replay checked.
#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "../primitives/common.hpp"
#include "check/error_of.hpp"
#include "check/seed.hpp"
#include "common.hpp"
#include "layer_check.hpp"
#include "moe/grouped_gemm.hpp"
#include "moe/layer.hpp"
#include "moe/low_latency.hpp"
#include "routing.hpp"

namespace {

using namespace weave;
using namespace weave::moe;
using check::error_of;
using bf16 = __nv_bfloat16;

using test::BoundCheck;
using test::comm;
using test::DeviceInput;
using test::DevFree;
using test::make_input;
using test::RankInput;
using test::Routing;
using test::stream;

// Expert outputs y of rank `rank` (the combine's input): (q - 128) / 128 for a splitmix64 byte q of
// (seed, rank, element): exact in bf16, any rank computes any element on the host.
__host__ __device__ inline float y_value(uint64_t seed, int rank, uint64_t i) {
  uint64_t z = seed ^ (static_cast<uint64_t>(rank + 1) * 0xD1B54A32D192ED03ull) ^ ((i + 1) * 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(static_cast<int>(z >> 56) - 128) / 128.f;
}

__global__ void fill_y(bf16* y, size_t n, uint64_t seed, int rank) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    y[i] = __float2bfloat16_rn(y_value(seed, rank, i));
}

void fill_y_async(bf16* y, size_t n, uint64_t seed, int rank, cudaStream_t s) {
  fill_y<<<512, 256, 0, s>>>(y, n, seed, rank);
  WEAVE_CUDA_CHECK(cudaGetLastError());
}

bool same_bits(bf16 a, bf16 b) { return wt::bits(a) == wt::bits(b); }

struct LlCase {
  Routing routing;
  int L, k, H, max_tokens;
  int T0, dT;          // rank s has T0 + dT s tokens (clamped to 0..max_tokens)
  int zero_rank = -1;  // this rank has none
  int E = 0;           // 0: L W experts
};

int tokens_of(const LlCase& c, int s) {
  return s == c.zero_rank ? 0 : std::clamp(c.T0 + c.dT * s, 0, c.max_tokens);
}

Geometry geometry_of(const LlCase& c) {
  const int W = comm().world();
  return Geometry{W, c.E > 0 ? c.E : c.L * W};
}

LowLatencyConfig config_of(const LlCase& c) {
  LowLatencyConfig cf;
  cf.experts = geometry_of(c).experts;
  cf.hidden = c.H;
  cf.topk = c.k;
  cf.max_tokens = c.max_tokens;
  return cf;
}

std::vector<RankInput> inputs_of(const LlCase& c, const Geometry& g, uint64_t seed) {
  std::vector<RankInput> in;
  for (int s = 0; s < g.world; ++s) in.push_back(make_input(seed, c.routing, g, tokens_of(c, s), c.k, c.H, s));
  return in;
}

LlPlan plan_of(const std::vector<RankInput>& in, const Geometry& g, int k, int max_tokens) {
  std::vector<const int*> idx;
  std::vector<int> T;
  for (const RankInput& r : in) idx.push_back(r.idx.data()), T.push_back(r.T);
  return ll_plan(idx, T, k, g, max_tokens);
}

// What one call left on this rank.
struct Snapshot {
  std::vector<bf16> rows;  // L x S x H (or only what the call's checks need)
  std::vector<LlRowMeta> meta;
  std::vector<int> counts, src_counts, src_offsets;
  std::vector<bf16> out;
};

// A call's results on this rank, read back: `rows` receive rows (and their metadata), L local
// experts of W sources, T tokens of H columns out.
Snapshot snapshot(const bf16* rows_d, const LlRowMeta* meta_d, const int* counts, const int* src_counts,
                  const int* src_offsets, const bf16* out, size_t rows, int L, int W, int T, int H) {
  Snapshot snap;
  snap.rows = wt::to_host(rows_d, rows * H);
  snap.meta = wt::to_host(meta_d, rows);
  snap.counts = wt::to_host(counts, L);
  snap.src_counts = wt::to_host(src_counts, static_cast<size_t>(L) * W);
  snap.src_offsets = wt::to_host(src_offsets, static_cast<size_t>(L) * W);
  snap.out = wt::to_host(out, static_cast<size_t>(T) * H);
  return snap;
}

// The checks of one call on this rank (`tail_poisoned`: rows past each expert's count must still
// be poison); y_seed: the expert outputs combine summed (y_value).
void verify(const LlPlan& p, const std::vector<RankInput>& in, int H, const Snapshot& got, bool tail_poisoned,
            uint64_t y_seed, const std::string& what) {
  const Geometry& g = p.g;
  const int me = comm().rank(), W = g.world, L = g.local_experts(), k = p.k, S = p.stride;
  ASSERT_TRUE(p.verdict.ok()) << what << ": the test's routing must be valid: " << p.verdict.message();
  for (int l = 0; l < L; ++l) {
    ASSERT_EQ(got.counts[l], p.rows_of(me, l)) << what << ": count of local expert " << l;
    for (int s = 0; s < W; ++s) {
      const size_t at = (static_cast<size_t>(me) * L + l) * W + s;
      ASSERT_EQ(got.src_counts[l * W + s], p.cnt[at]) << what << ": rows of local expert " << l << " from rank " << s;
      ASSERT_EQ(got.src_offsets[l * W + s], p.off[at]) << what << ": offset of rank " << s << " in local expert " << l;
    }
  }
  long long bad_rows = 0, rows = 0;
  std::string first_bad;
  for (int s = 0; s < W; ++s)
    for (int t = 0; t < in[s].T; ++t)
      for (int j = 0; j < k; ++j) {
        const size_t i = static_cast<size_t>(t) * k + j;
        const int e = in[s].idx[i];
        if (g.rank_of(e) != me) continue;
        ++rows;
        const int row = p.row[s][i];
        const LlRowMeta& m = got.meta[row];
        bool ok = m.src == s && m.token == t && m.slot == j && m.expert == e;
        for (int h = 0; ok && h < H; ++h)
          ok = same_bits(got.rows[static_cast<size_t>(row) * H + h], in[s].x[static_cast<size_t>(t) * H + h]);
        if (!ok && bad_rows++ == 0)
          first_bad = "row " + std::to_string(row) + " (rank " + std::to_string(s) + ", token " + std::to_string(t) +
                      ", slot " + std::to_string(j) + "; meta src " + std::to_string(m.src) + " token " +
                      std::to_string(m.token) + " slot " + std::to_string(m.slot) + " expert " +
                      std::to_string(m.expert) + ")";
      }
  EXPECT_EQ(bad_rows, 0) << what << ": " << bad_rows << " of " << rows << " received rows wrong, first " << first_bad;
  if (tail_poisoned) {
    long long touched = 0;
    for (int l = 0; l < L; ++l)
      for (size_t i = (static_cast<size_t>(l) * S + p.rows_of(me, l)) * H; i < static_cast<size_t>(l + 1) * S * H; ++i)
        touched += wt::bits(got.rows[i]) != 0xffffu;
    EXPECT_EQ(touched, 0) << what << ": " << touched << " elements past the experts' counts were written";
  }
  const RankInput& mine = in[me];
  BoundCheck chk;
  for (int t = 0; t < mine.T; ++t)
    for (int h = 0; h < H; ++h) {
      double r = 0, a = 0;
      for (int j = 0; j < k; ++j) {
        const size_t i = static_cast<size_t>(t) * k + j;
        const int d = g.rank_of(mine.idx[i]);
        const double y = y_value(y_seed, d, static_cast<uint64_t>(p.row[me][i]) * H + h);
        r += static_cast<double>(mine.w[i]) * y;
        a += std::fabs(static_cast<double>(mine.w[i]) * y);
      }
      const double bound = std::ldexp(std::fabs(r), -8) + std::ldexp(a, -19);
      chk.add(wt::to_f(got.out[static_cast<size_t>(t) * H + h]), r, bound > 0 ? bound : 1e-30, t, h);
    }
  chk.expect(what + ": combine");
}

// One checked dispatch + combine: the receive buffer and the output poisoned, every rank's y
// filled (hash of y_seed), the call, the snapshots.
Snapshot run_once(MoeLowLatency& ll, const std::vector<RankInput>& in, uint64_t y_seed, DevFree& mem) {
  const LowLatencyConfig& cf = ll.config();
  const int me = comm().rank(), T = in[me].T, H = cf.hidden, k = cf.topk, L = ll.local_experts(), W = comm().world();
  const size_t rows = static_cast<size_t>(L) * ll.row_stride();
  cudaStream_t s = stream();
  const DeviceInput in_d(in[me], H, k, mem);
  bf16* y = mem.add<bf16>(rows * H);
  fill_y_async(y, rows * H, y_seed, me, s);
  WEAVE_CUDA_CHECK(cudaMemsetAsync(ll.receive_buffer(), 0xff, rows * H * sizeof(bf16), s));
  WEAVE_CUDA_CHECK(cudaStreamSynchronize(s));
  comm().barrier();
  const LowLatencyDispatched d = ll.dispatch(in_d.x, in_d.idx, T, s);
  ll.combine(y, in_d.w, in_d.out, T, s);
  ll.check(s);
  Snapshot snap = snapshot(d.rows, d.meta, d.counts, d.src_counts, d.src_offsets, in_d.out, rows, L, W, T, H);
  comm().barrier();
  return snap;
}

std::string label(const LlCase& c, const Geometry& g) {
  return std::string(name(c.routing)) + " E " + std::to_string(g.experts) + " k " + std::to_string(c.k) + " H " +
         std::to_string(c.H) + " T0 " + std::to_string(c.T0) + " max_tokens " + std::to_string(c.max_tokens);
}

void run_case(const LlCase& c) {
  const Geometry g = geometry_of(c);
  const uint64_t seed = wt::job_seed();
  const std::vector<RankInput> in = inputs_of(c, g, seed);
  const LlPlan p = plan_of(in, g, c.k, c.max_tokens);
  DevFree mem;
  MoeLowLatency ll(comm(), config_of(c));
  const uint64_t y_seed = check::derive(seed, 3);
  const Snapshot snap = run_once(ll, in, y_seed, mem);
  verify(p, in, c.H, snap, true, y_seed, label(c, g));
}

}  // namespace

// The issue's target shape (DeepSeek-like: H 7168, 64 experts, top-8, 128 tokens per rank).
TEST(MoeLowLatency, DeepSeekDecode128) { run_case({Routing::random, 0, 8, 7168, 128, 128, 0, -1, 64}); }
TEST(MoeLowLatency, DeepSeekFull256Dirichlet) { run_case({Routing::dirichlet, 0, 8, 7168, 256, 256, -1, -1, 64}); }
TEST(MoeLowLatency, RaggedHiddenTop2) { run_case({Routing::random, 8, 2, 1032, 64, 37, -36}); }  // T 37 and 1
TEST(MoeLowLatency, Top1OneToken) { run_case({Routing::random, 8, 1, 1032, 1, 1, 0}); }
TEST(MoeLowLatency, Top1EmptyRank) { run_case({Routing::random, 4, 1, 264, 128, 128, 0, 0}); }
TEST(MoeLowLatency, AllTokensOnOneExpertFillsItsRegion) {
  run_case({Routing::all_to_one, 0, 8, 1032, 256, 256, 0, -1, 64});
}
TEST(MoeLowLatency, ExpertsOnOneRank) { run_case({Routing::same_rank, 8, 8, 1032, 128, 128, -91}); }
TEST(MoeLowLatency, RepeatedIds) { run_case({Routing::random_repeats, 4, 8, 264, 256, 37, 3}); }
TEST(MoeLowLatency, EmptyExpertsTop4) { run_case({Routing::empty_experts, 8, 4, 1032, 200, 199, 1}); }
TEST(MoeLowLatency, BalancedE8) { run_case({Routing::balanced, 0, 2, 7168, 256, 255, 1, -1, 8}); }

// 200 calls back to back (no host synchronisation between them), routing, T and inputs changing
// every call; each call's receive rows, counts and metadata are copied out in stream order before
// the next dispatch overwrites them, the expert outputs y are copied into one buffer before each
// combine (as a GEMM would write them), then every call is checked.
TEST(MoeLowLatency, BackToBack200) {
  const int W = comm().world(), me = comm().rank(), kCalls = 200, L = 8, k = 4, H = 264, maxT = 128;
  const Geometry g{W, L * W};
  LowLatencyConfig cf;
  cf.experts = g.experts, cf.hidden = H, cf.topk = k, cf.max_tokens = maxT;
  MoeLowLatency ll(comm(), cf);
  const int S = ll.row_stride();
  const size_t rows = static_cast<size_t>(L) * S;
  cudaStream_t s = stream();
  DevFree mem;
  const Routing kinds[] = {Routing::balanced,   Routing::random,    Routing::dirichlet,     Routing::empty_experts,
                           Routing::all_to_one, Routing::same_rank, Routing::random_repeats};
  struct Call {
    std::vector<RankInput> in;
    std::unique_ptr<LlPlan> plan;
    uint64_t y_seed;
    bf16 *x, *y, *rows, *out;
    int *idx, *counts, *src_counts, *src_offsets;
    float* w;
    LlRowMeta* meta;
  };
  std::vector<Call> calls(kCalls);
  const uint64_t seed = wt::job_seed();
  bf16* ybuf = mem.add<bf16>(rows * H);
  for (int c = 0; c < kCalls; ++c) {
    Call& call = calls[c];
    const uint64_t cs = check::derive(seed, 100, c);
    std::mt19937_64 rng(cs);
    const Routing kind = kinds[c % 7];
    for (int r = 0; r < W; ++r) {
      const int T = c % 23 == 5 ? 0 : static_cast<int>(rng() % (maxT + 1));
      call.in.push_back(make_input(cs, kind, g, T, k, H, r));
    }
    call.plan = std::make_unique<LlPlan>(plan_of(call.in, g, k, maxT));
    ASSERT_TRUE(call.plan->verdict.ok()) << "call " << c << ": " << call.plan->verdict.message();
    call.y_seed = check::derive(cs, 3);
    const int T = call.in[me].T;
    call.x = mem.add<bf16>(static_cast<size_t>(T) * H);
    call.idx = mem.add<int>(static_cast<size_t>(T) * k);
    call.w = mem.add<float>(static_cast<size_t>(T) * k);
    call.out = mem.add<bf16>(static_cast<size_t>(T) * H);
    call.y = mem.add<bf16>(rows * H);
    call.rows = mem.add<bf16>(rows * H);
    call.meta = mem.add<LlRowMeta>(rows);
    call.counts = mem.add<int>(L);
    call.src_counts = mem.add<int>(static_cast<size_t>(L) * W);
    call.src_offsets = mem.add<int>(static_cast<size_t>(L) * W);
    if (T) {
      wt::to_device(call.x, call.in[me].x);
      wt::to_device(call.idx, call.in[me].idx);
      wt::to_device(call.w, call.in[me].w);
      WEAVE_CUDA_CHECK(cudaMemset(call.out, 0xff, static_cast<size_t>(T) * H * sizeof(bf16)));
    }
    fill_y_async(call.y, rows * H, call.y_seed, me, s);
  }
  WEAVE_CUDA_CHECK(cudaMemsetAsync(ll.receive_buffer(), 0xff, rows * H * sizeof(bf16), s));
  WEAVE_CUDA_CHECK(cudaStreamSynchronize(s));
  comm().barrier();
  for (int c = 0; c < kCalls; ++c) {
    Call& call = calls[c];
    const int T = call.in[me].T;
    const LowLatencyDispatched d = ll.dispatch(call.x, call.idx, T, s);
    WEAVE_CUDA_CHECK(cudaMemcpyAsync(call.rows, d.rows, rows * H * sizeof(bf16), cudaMemcpyDeviceToDevice, s));
    WEAVE_CUDA_CHECK(cudaMemcpyAsync(call.meta, d.meta, rows * sizeof(LlRowMeta), cudaMemcpyDeviceToDevice, s));
    WEAVE_CUDA_CHECK(cudaMemcpyAsync(call.counts, d.counts, L * sizeof(int), cudaMemcpyDeviceToDevice, s));
    WEAVE_CUDA_CHECK(
        cudaMemcpyAsync(call.src_counts, d.src_counts, L * W * sizeof(int), cudaMemcpyDeviceToDevice, s));
    WEAVE_CUDA_CHECK(
        cudaMemcpyAsync(call.src_offsets, d.src_offsets, L * W * sizeof(int), cudaMemcpyDeviceToDevice, s));
    WEAVE_CUDA_CHECK(cudaMemcpyAsync(ybuf, call.y, rows * H * sizeof(bf16), cudaMemcpyDeviceToDevice, s));
    ll.combine(ybuf, call.w, call.out, T, s);
  }
  ll.check(s);
  comm().barrier();
  for (int c = 0; c < kCalls; ++c) {
    const Call& call = calls[c];
    const int T = call.in[me].T;
    const Snapshot snap =
        snapshot(call.rows, call.meta, call.counts, call.src_counts, call.src_offsets, call.out, rows, L, W, T, H);
    // Rows past the counts hold earlier calls' rows (the buffer is poisoned once): not checked.
    verify(*call.plan, call.in, H, snap, false, call.y_seed, "call " + std::to_string(c) + " (" + name(kinds[c % 7]) + ")");
    if (HasFatalFailure() || HasNonfatalFailure()) break;
  }
}

namespace {

// The decode layer on the fixed-stride layout (moe_low_latency_forward: dispatch -> grouped GEMM (up,
// row_stride S) -> swiglu_strided -> grouped GEMM (down, row_stride S) -> combine), `calls` calls
// back to back with changing routing and T, each output checked against the float64 layer
// reference, and its scratch checked for writes past each expert's rows.
struct LayerSpec {
  int L, k, H, F, max_tokens, calls;
  uint64_t stream;
};

void run_layer(const LayerSpec& b) {
  const int W = comm().world(), me = comm().rank(), H = b.H, F = b.F, k = b.k, L = b.L;
  const Geometry g{W, L * W};
  const uint64_t seed = wt::job_seed();
  const test::Weights wts(seed, g.experts, H, F);
  LowLatencyConfig cf;
  cf.experts = g.experts, cf.hidden = H, cf.topk = k, cf.max_tokens = b.max_tokens;
  MoeLowLatency ll(comm(), cf);
  const int S = ll.row_stride(), R = L * S;
  DevFree mem;
  const test::RankWeights rw(wts, L, mem);
  bf16 *up = rw.up, *down = rw.down;
  MoeLowLatencyScratch sc(ll, F);
  ASSERT_EQ(sc.rows(), R);
  bf16* G = sc.up_output();
  bf16* Hb = sc.swiglu_output();
  bf16* Y = sc.expert_output();
  WEAVE_CUDA_CHECK(cudaMemset(G, 0xff, static_cast<size_t>(R) * 2 * F * sizeof(bf16)));
  WEAVE_CUDA_CHECK(cudaMemset(Hb, 0xff, static_cast<size_t>(R) * F * sizeof(bf16)));
  WEAVE_CUDA_CHECK(cudaMemset(Y, 0xff, static_cast<size_t>(R) * H * sizeof(bf16)));
  WEAVE_CUDA_CHECK(cudaMemset(ll.receive_buffer(), 0xff, static_cast<size_t>(R) * H * sizeof(bf16)));
  const Routing kinds[] = {Routing::random, Routing::dirichlet, Routing::all_to_one, Routing::same_rank,
                           Routing::random_repeats};
  std::vector<RankInput> mine;
  std::vector<std::unique_ptr<DeviceInput>> dev;
  for (int c = 0; c < b.calls; ++c) {
    const uint64_t cs = check::derive(seed, b.stream, c);
    std::mt19937_64 rng(cs);
    std::vector<int> T(W);
    for (int r = 0; r < W; ++r) T[r] = c == 1 && r == 0 ? 0 : static_cast<int>(rng() % (b.max_tokens + 1));
    mine.push_back(make_input(cs, kinds[c % 5], g, T[me], k, H, me));
    dev.push_back(std::make_unique<DeviceInput>(mine.back(), H, k, mem));
  }
  cudaStream_t s = stream();
  WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
  comm().barrier();
  int* counts = mem.add<int>(static_cast<size_t>(b.calls) * L);  // every call's counts, copied in stream order
  for (int c = 0; c < b.calls; ++c) {
    const LowLatencyDispatched d = moe_low_latency_forward(ll, sc, dev[c]->x, dev[c]->idx, dev[c]->w, mine[c].T, up,
                                                           down, dev[c]->out, s);
    WEAVE_CUDA_CHECK(cudaMemcpyAsync(counts + c * L, d.counts, L * sizeof(int), cudaMemcpyDeviceToDevice, s));
  }
  ll.check(s);
  check_status(s);
  comm().barrier();
  for (int c = 0; c < b.calls; ++c) {
    const std::vector<bf16> out = wt::to_host(dev[c]->out, static_cast<size_t>(mine[c].T) * H);
    test::verify_layer(wts, mine[c], k, out, "decode layer call " + std::to_string(c) + " (" + name(kinds[c % 5]) + ")");
  }
  // The strided GEMMs and SwiGLU never wrote past an expert's count: rows at or past the largest
  // count any call gave the expert are still poison in G, Hb and Y.
  const std::vector<int> cnt = wt::to_host(counts, static_cast<size_t>(b.calls) * L);
  const std::vector<bf16> hg = wt::to_host(G, static_cast<size_t>(R) * 2 * F), hh = wt::to_host(Hb, static_cast<size_t>(R) * F),
                          hy = wt::to_host(Y, static_cast<size_t>(R) * H);
  long long touched = 0;
  for (int l = 0; l < L; ++l) {
    int most = 0;
    for (int c = 0; c < b.calls; ++c) most = std::max(most, cnt[static_cast<size_t>(c) * L + l]);
    ASSERT_LE(most, S);
    for (size_t r = static_cast<size_t>(l) * S + most; r < static_cast<size_t>(l + 1) * S; ++r) {
      for (int q = 0; q < 2 * F; ++q) touched += wt::bits(hg[r * 2 * F + q]) != 0xffffu;
      for (int q = 0; q < F; ++q) touched += wt::bits(hh[r * F + q]) != 0xffffu;
      for (int q = 0; q < H; ++q) touched += wt::bits(hy[r * H + q]) != 0xffffu;
    }
  }
  EXPECT_EQ(touched, 0) << "elements of G, H or Y past the experts' counts were written";
}

}  // namespace

// The decode layer captured in a CUDA graph after an eager call, replayed with fresh routing and
// tokens copied into the captured inputs (T fixed per rank, the graph's), each replay's output
// poisoned first and checked against the float64 reference; eager calls between and after
// (layer_check.hpp's captured_replays).
TEST(MoeLowLatency, CapturedDecodeLayerReplays) {
  // max_tokens above T: a repeated id puts up to 2 T rows of a rank on one expert.
  const int W = comm().world(), me = comm().rank(), L = 4, k = 8, H = 200, F = 136, maxT = 96, kReplays = 12;
  const Geometry g{W, L * W};
  const uint64_t seed = wt::job_seed();
  const test::Weights wts(seed, g.experts, H, F);
  LowLatencyConfig cf;
  cf.experts = g.experts, cf.hidden = H, cf.topk = k, cf.max_tokens = maxT;
  MoeLowLatency ll(comm(), cf);
  MoeLowLatencyScratch sc(ll, F);
  const int T = 45 - 3 * me;
  DevFree mem;
  const test::RankWeights rw(wts, L, mem);
  DeviceInput d(T, H, k, mem);
  cudaStream_t s = stream();
  const Routing kinds[] = {Routing::random, Routing::dirichlet, Routing::all_to_one, Routing::same_rank,
                           Routing::random_repeats};
  auto prepare = [&](int c) {
    RankInput in = make_input(check::derive(seed, 700, c), kinds[c % 5], g, T, k, H, me);
    comm().barrier();  // every rank's previous call is over (check() synchronised its stream)
    d.load(in);
    WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
    comm().barrier();
    return in;
  };
  auto enqueue = [&] { moe_low_latency_forward(ll, sc, d.x, d.idx, d.w, T, rw.up, rw.down, d.out, s); };
  auto check_call = [&](const RankInput& in, const std::string& what) {
    ll.check(s);
    check_status(s);
    test::verify_layer(wts, in, k, wt::to_host(d.out, static_cast<size_t>(T) * H), what);
  };
  test::captured_replays(s, kReplays, prepare, enqueue, check_call,
                         [&](int c) { return std::string(name(kinds[c % 5])); });
}

TEST(MoeLowLatency, DecodeLayer) { run_layer({4, 4, 1024, 256, 64, 4, 200}); }
TEST(MoeLowLatency, DecodeLayerRaggedTop8) { run_layer({4, 8, 200, 136, 40, 3, 300}); }
TEST(MoeLowLatency, DecodeLayerTop1) { run_layer({8, 1, 264, 64, 37, 3, 400}); }

namespace {

// A call every rank must fail alike on the device: check() throws `want` on every rank, the counts
// are zero, the combine's output NaN (zeroed first); check() then passes (reported once), and a
// correct call on the same object follows.
void expect_failed_call(MoeLowLatency& ll, const std::vector<RankInput>& in, const std::string& want,
                        const LlCase& good) {
  const int me = comm().rank(), T = in[me].T, H = ll.config().hidden, k = ll.config().topk, W = comm().world();
  const int L = ll.local_experts();
  cudaStream_t s = stream();
  DevFree mem;
  const DeviceInput in_d(in[me], H, k, mem);
  WEAVE_CUDA_CHECK(cudaMemset(in_d.out, 0, std::max<size_t>(static_cast<size_t>(T) * H, 1) * sizeof(bf16)));
  bf16* y = mem.add<bf16>(static_cast<size_t>(L) * ll.row_stride() * H);
  WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
  comm().barrier();
  const LowLatencyDispatched d = ll.dispatch(in_d.x, in_d.idx, T, s);
  ll.combine(y, in_d.w, in_d.out, T, s);
  std::string msg;
  try {
    ll.check(s);
  } catch (const Error& e) {
    msg = e.what();
  }
  EXPECT_EQ(msg, want) << "rank " << me;
  const std::vector<int> counts = wt::to_host(d.counts, L), src = wt::to_host(d.src_counts, static_cast<size_t>(L) * W);
  EXPECT_TRUE(std::all_of(counts.begin(), counts.end(), [](int c) { return c == 0; })) << "counts of a failed call";
  EXPECT_TRUE(std::all_of(src.begin(), src.end(), [](int c) { return c == 0; })) << "source counts of a failed call";
  const std::vector<bf16> o = wt::to_host(in_d.out, static_cast<size_t>(T) * H);
  long long finite = 0;
  for (bf16 v : o) finite += std::isfinite(wt::to_f(v)) ? 1 : 0;
  EXPECT_EQ(finite, 0) << "a failed call's combine must write NaN everywhere";
  ll.check(s);  // reported once
  comm().barrier();
  const Geometry g = geometry_of(good);
  const uint64_t seed = wt::job_seed();
  const std::vector<RankInput> gin = inputs_of(good, g, seed);
  const LlPlan p = plan_of(gin, g, good.k, good.max_tokens);
  DevFree mem2;
  const uint64_t y_seed = check::derive(seed, 3);
  const Snapshot snap = run_once(ll, gin, y_seed, mem2);
  verify(p, gin, good.H, snap, true, y_seed, "the call after a failed one");
}


}  // namespace

TEST(MoeLowLatency, OutOfRangeExpertIsAnErrorOnEveryRank) {
  const int W = comm().world(), bad_rank = W - 1;
  const LlCase c{Routing::random, 4, 2, 64, 50, 50, 0};
  const Geometry g = geometry_of(c);
  MoeLowLatency ll(comm(), config_of(c));
  std::vector<RankInput> in = inputs_of(c, g, wt::job_seed());
  in[bad_rank].idx[7 * c.k + 1] = g.experts + 5;  // token 7, slot 1
  in[bad_rank].idx[20 * c.k] = -1;                // a later one: the first is named
  const std::string want = "moe low-latency dispatch: expert id " + std::to_string(g.experts + 5) + " on rank " +
                           std::to_string(bad_rank) + " (token 7, slot 1) is outside 0..E-1; nothing was dispatched";
  expect_failed_call(ll, in, want, c);
}

TEST(MoeLowLatency, TooManyRowsOfOneRankOnOneExpertIsAnErrorOnEveryRank) {
  const int W = comm().world(), bad_rank = 0;
  const LlCase c{Routing::random, 4, 2, 64, 50, 50, 0};
  const Geometry g = geometry_of(c);
  MoeLowLatency ll(comm(), config_of(c));
  std::vector<RankInput> in = inputs_of(c, g, wt::job_seed());
  for (int& e : in[bad_rank].idx) e = 3;  // 100 rows of rank 0 on expert 3: every token names it twice
  const std::string want = "moe low-latency dispatch: rank 0 routes 100 rows to expert 3, more than max_tokens (50; a "
                           "token names that expert more than once); nothing was dispatched";
  (void)W;
  expect_failed_call(ll, in, want, c);
}

// Host-found problems: every rank throws before anything is launched and the object stays usable.
TEST(MoeLowLatency, ArgumentErrorsOnEveryRankThenACorrectCall) {
  const int W = comm().world(), me = comm().rank();
  // A configuration no other test uses: the dispatch's and the combine's first calls of this plan
  // are the rejected ones, where every rank waits for every rank's verdict.
  const LlCase c{Routing::random, 2, 2, 64, 61, 61, -3};
  const Geometry g = geometry_of(c);
  MoeLowLatency ll(comm(), config_of(c));
  const uint64_t seed = wt::job_seed();
  const std::vector<RankInput> in = inputs_of(c, g, seed);
  const int T = in[me].T, H = c.H, k = c.k, L = ll.local_experts();
  cudaStream_t s = stream();
  DevFree mem;
  const DeviceInput in_d(in[me], H, k, mem);
  bf16* y = mem.add<bf16>(static_cast<size_t>(L) * ll.row_stride() * H);
  const uint64_t y_seed = check::derive(seed, 3);
  fill_y_async(y, static_cast<size_t>(L) * ll.row_stride() * H, y_seed, me, s);
  bf16* x_odd = mem.add<bf16>(static_cast<size_t>(T + 1) * H);
  bf16* y_short = mem.add<bf16>(1024);
  WEAVE_CUDA_CHECK(cudaMemset(ll.receive_buffer(), 0xff, static_cast<size_t>(L) * ll.row_stride() * H * sizeof(bf16)));
  WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
  comm().barrier();
  // A misaligned x on the last rank.
  std::string msg = error_of([&] { ll.dispatch(me == W - 1 ? x_odd + 1 : in_d.x, in_d.idx, T, s); });
  EXPECT_NE(msg.find(me == W - 1 ? "must be 16-byte aligned" : "rejected its arguments"), std::string::npos)
      << "rank " << me << ": " << msg;
  // T past max_tokens everywhere.
  msg = error_of([&] { ll.dispatch(in_d.x, in_d.idx, c.max_tokens + 1, s); });
  EXPECT_NE(msg.find("T = 62 tokens outside 0..max_tokens (61)"), std::string::npos) << msg;
  // A combine before any dispatch.
  msg = error_of([&] { ll.combine(y, in_d.w, in_d.out, T, s); });
  EXPECT_NE(msg.find("no dispatch to combine"), std::string::npos) << msg;
  // check() under stream capture (it waits for the GPU).
  wt::expect_capture_rejected(s, "moe low-latency check", [&] { ll.check(s); });
  // The dispatch itself, then a second one before its combine, then a short y on the last rank.
  const LowLatencyDispatched d = ll.dispatch(in_d.x, in_d.idx, T, s);
  msg = error_of([&] { ll.dispatch(in_d.x, in_d.idx, T, s); });
  EXPECT_NE(msg.find("has not been combined yet"), std::string::npos) << msg;
  msg = error_of([&] { ll.combine(me == W - 1 ? y_short : y, in_d.w, in_d.out, T, s); });
  EXPECT_NE(msg.find(me == W - 1 ? "y (L x row_stride x H)" : "rejected its arguments"), std::string::npos)
      << "rank " << me << ": " << msg;
  msg = error_of([&] { ll.combine(y, in_d.w, in_d.out, T + 1, s); });
  EXPECT_NE(msg.find("but the dispatch had"), std::string::npos) << msg;
  // Then the combine: the call is correct.
  ll.combine(y, in_d.w, in_d.out, T, s);
  ll.check(s);
  Snapshot snap;
  const size_t rows = static_cast<size_t>(L) * ll.row_stride();
  snap.rows = wt::to_host(d.rows, rows * H);
  snap.meta = wt::to_host(d.meta, rows);
  snap.counts = wt::to_host(d.counts, L);
  snap.src_counts = wt::to_host(d.src_counts, static_cast<size_t>(L) * W);
  snap.src_offsets = wt::to_host(d.src_offsets, static_cast<size_t>(L) * W);
  snap.out = wt::to_host(in_d.out, static_cast<size_t>(T) * H);
  comm().barrier();
  verify(plan_of(in, g, k, c.max_tokens), in, H, snap, true, y_seed, "the call after rejected ones");
  // And another full call on the same object.
  DevFree mem2;
  const std::vector<RankInput> in2 = inputs_of(c, g, wt::job_seed());
  const Snapshot snap2 = run_once(ll, in2, y_seed, mem2);
  verify(plan_of(in2, g, k, c.max_tokens), in2, H, snap2, true, y_seed, "a second call after rejected ones");
}

TEST(MoeLowLatency, BadConfigsAreErrorsOnEveryRank) {
  const int W = comm().world();
  auto make = [&](int E, int H, int k, int mt) {
    return error_of([&] { MoeLowLatency ll(comm(), LowLatencyConfig{E, H, k, mt}); });
  };
  EXPECT_NE(make(8 * W, 64, 2, 257).find("max_tokens = 257 outside 1..256"), std::string::npos);
  EXPECT_NE(make(8 * W, 64, 2, 0).find("max_tokens = 0 outside 1..256"), std::string::npos);
  EXPECT_NE(make(8 * W, 64, 17, 16).find("top-k 17 outside 1..16"), std::string::npos);
  EXPECT_NE(make(8 * W, 60, 2, 16).find("multiple of 8"), std::string::npos);
  EXPECT_NE(make(2048, 64, 2, 16).find("at most 1024 experts"), std::string::npos);
  if (W > 1) EXPECT_NE(make(8 * W + 1, 64, 2, 16).find("do not divide"), std::string::npos);
}
