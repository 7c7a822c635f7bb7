// LL128 under stress, on 2+ ranks (weave-run). Two parts:
//
// Lines: every rank writes 128-byte lines into the next rank's memory exactly as the LL128
// kernels do (8 lanes of a warp, one 16-byte store each, the flag in lane 7's last word) while
// the previous rank's lines arrive and are polled, round after round. Half the lines are read the
// way LL128 used to (the data taken from the one load that saw the flag), half through
// detail::receive (the data from a load issued after the flag was seen). For each, the test
// counts lines whose data words do not belong to the flag's round. A non-zero count for the
// single load shows the race that receive() closes; receive()'s count must be 0 (if it were not,
// the writes themselves arrived in pieces, which LL128 cannot survive).
//
// Calls: forced-LL128 all_reduce / all_gather / reduce_scatter at random sizes (4 KiB-8 MiB,
// within LL128's limit) and shapes, in place or not, with one rank held back 0-20 us by a spin
// kernel before each call, PDL on and off. Inputs are small integers, a function of (call, rank,
// index), whose sums are exact in every dtype: every call's output is checked bit for bit.
//
// Seeds are printed; WEAVE_TEST_SEED=<n> replays one. The default size runs in well under a
// minute; WEAVE_STRESS_SCALE=<k> multiplies the rounds and calls by k. Issue 23's full scale (about
// 1e10 lines read, 1e6 calls) is reached in chunks by scripts/two-gpu-session.sh's ll128 step, which
// measures a unit of k on the machine and sums the counts over its runs.
// Ranks sharing one GPU (weave-run --share-gpus) get a token version: their kernels take turns.
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "collectives/ll128_line.cuh"
#include "common.hpp"
#include "weave/pdl.cuh"

using namespace ct;
using coll::kLL128Pieces;
using coll::kLL128Threads;
using coll::kLL128Words;
using coll::ll128_slot_word;
namespace lld = weave::coll::detail;

namespace {

// ---------------------------------------------------------------------------------------------
// Lines.

// Data word w of line L in the round whose flag is `flag` (never equal across rounds w.h.p.).
__host__ __device__ inline uint32_t line_word(unsigned flag, long long L, int w) {
  return static_cast<uint32_t>(ref::mix64((uint64_t(flag) << 40) ^ (uint64_t(L) << 5) ^ uint64_t(w)) >> 17);
}

struct LineCounts {
  unsigned long long polled_once, bad_once, received, bad_received;
};

// Each warp, per round k (flag base + k): writes its steps' lines of region k % 2 into the next
// rank, and after each step polls line step s - lag of the same region from the previous rank.
// Even steps are read with one load (data from the load that saw the flag), odd steps through
// detail::receive. Region k % 2 is rewritten two rounds later only after this warp saw its twin's
// round k + 1 line, which the twin wrote after reading all of round k (ll.cuh's reuse argument,
// per warp pair).
__global__ void __launch_bounds__(kLL128Threads)
    line_kernel(unsigned char* to_next, const unsigned char* mine, long long region_lines, int steps, int rounds,
                unsigned base, int lag, signals sig, LineCounts* counts) {
  const lld::LL128Lane l;
  const int from = (sig.rank + sig.world - 1) % sig.world;
  const int flag_lane = (threadIdx.x & 31) | 7, group_shift = l.group * 8;
  unsigned long long once = 0, bad_once = 0, recv = 0, bad_recv = 0;
  for (int k = 1; k <= rounds; ++k) {
    const unsigned flag = base + k;
    const size_t region = size_t(k % 2) * region_lines * 128;
    uint4* out = reinterpret_cast<uint4*>(to_next + region);
    const uint4* in = reinterpret_cast<const uint4*>(mine + region);
    for (int s = 0; s < steps + lag; ++s) {
      if (s < steps) {
        const long long L = l.line(s);
        const uint4 v = lld::pack(l, L, L * kLL128Words + kLL128Words, flag,
                                     [&](long long i) { return line_word(flag, L, static_cast<int>(i - L * kLL128Words)); });
        __syncwarp();
        lld::st_piece(out + L * kLL128Pieces + l.j, v);
      }
      if (s < lag) continue;
      const long long L = l.line(s - lag);
      uint4 v;
      const bool single = (s - lag) % 2 == 0;  // warp-uniform
      if (single) {
        const uint4* p = in + L * kLL128Pieces + l.j;
        bool ok = false;
        unsigned seen = 0;
        weave::detail::poll(
            sig, from, flag,
            [&] {
              if (!ok) v = lld::ld_piece(p);
              const unsigned f = __shfl_sync(0xffffffffu, v.w, flag_lane);
              if (!ok) ok = f == flag, seen = f;
              return __all_sync(0xffffffffu, ok) != 0;
            },
            [&] { return __reduce_min_sync(0xffffffffu, seen); });
      } else {
        v = lld::receive(sig, l, in, L, true, from, flag);
      }
      bool bad = false;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int w = ll128_slot_word(l.j, q);
        if (w >= 0 && (&v.x)[q] != line_word(flag, L, w)) bad = true;
      }
      const unsigned lines_bad = __ballot_sync(0xffffffffu, bad);
      if (l.j == 0) {
        const bool line_bad = (lines_bad >> group_shift) & 0xffu;
        if (single) ++once, bad_once += line_bad;
        else ++recv, bad_recv += line_bad;
      }
    }
  }
  if (l.j == 0) {
    atomicAdd(&counts->polled_once, once);
    atomicAdd(&counts->bad_once, bad_once);
    atomicAdd(&counts->received, recv);
    atomicAdd(&counts->bad_received, bad_recv);
  }
}

TEST(LL128Stress, LinesAreReadWhole) {
  const int W = comm().world(), me = comm().rank();
  std::mt19937_64 rng(stress_seed() ^ 0xA5A5);
  const int blocks = comm().sm_count(), steps = 4;
  const long long warps = static_cast<long long>(blocks) * kLL128Threads / 32;
  const long long region_lines = warps * 4 * steps;
  const size_t bytes = size_t(2) * region_lines * 128;
  runtime::SymmetricTensor<unsigned char> buf(comm(), bytes);
  WEAVE_CUDA_CHECK(cudaMemsetAsync(buf.data(), 0, bytes, ctx().s));  // settle() below: zero on every rank first
  auto sig = comm().signals("LL128 stress line from rank", 1);
  LineCounts* counts = nullptr;
  WEAVE_CUDA_CHECK(cudaMalloc(&counts, sizeof(LineCounts)));
  WEAVE_CUDA_CHECK(cudaMemsetAsync(counts, 0, sizeof(LineCounts), ctx().s));
  settle();
  auto* next = static_cast<unsigned char*>(comm().peers(buf.data(), bytes)[(me + 1) % W]);
  // Ranks sharing a GPU take turns, so each step waits for a context switch: a token run there
  // (and no race to find: the lines never cross a link).
  const int launches = gpus_shared() ? 1 : 200 * stress_scale(), rounds = gpus_shared() ? 2 : 64;
  unsigned base = 0;
  for (int i = 0; i < launches; ++i) {
    // Grids of every size (fewer warps: more steps in flight per warp, other timing), lag 0 (a
    // line polled right after its twin wrote it) or 1; the same on every rank (shared seed).
    const int g = gpus_shared() ? blocks : 1 + static_cast<int>(rng() % blocks), lag = static_cast<int>(rng() % 2);
    const long long gw = static_cast<long long>(g) * kLL128Threads / 32;
    const int s = static_cast<int>(region_lines / (gw * 4));
    comm().barrier();  // both ranks start together, so that lines are polled while they arrive
    line_kernel<<<g, kLL128Threads, 0, ctx().s>>>(next, buf.data(), region_lines, s, rounds, base, lag, sig.view(),
                                                   counts);
    WEAVE_CUDA_CHECK(cudaGetLastError());
    base += rounds;
    comm().sync(ctx().s);
  }
  LineCounts h{};
  WEAVE_CUDA_CHECK(cudaMemcpy(&h, counts, sizeof h, cudaMemcpyDeviceToHost));
  WEAVE_CUDA_CHECK(cudaFree(counts));
  std::printf("rank %d: LL128 lines from rank %d: %llu read with the load that saw the flag, %llu of them with data "
              "from an older round; %llu read through receive(), %llu with older data\n",
              me, (me + W - 1) % W, h.polled_once, h.bad_once, h.received, h.bad_received);
  EXPECT_GT(h.polled_once, 0u);
  EXPECT_GT(h.received, 0u);
  EXPECT_EQ(h.bad_received, 0u) << "receive() returned a line whose data did not match its flag: the line's "
                                   "writes did not land as one";
  settle();
}

// ---------------------------------------------------------------------------------------------
// Calls.

enum class Kind { all_reduce, all_gather, reduce_scatter };

struct Call {
  Kind kind;
  DType t;
  long long count = 0;  // all_reduce
  Shape full;           // all_gather / reduce_scatter
  int dim = 0;
  bool in_place = false;
  int late_rank = 0;
  unsigned long long delay_ns = 0;
  uint64_t seed = 0;
  std::string str() const {
    std::string s = kind == Kind::all_reduce   ? "all_reduce count " + std::to_string(count)
                    : kind == Kind::all_gather ? "all_gather " + ct::str(full) + " dim " + std::to_string(dim)
                                               : "reduce_scatter " + ct::str(full) + " dim " + std::to_string(dim);
    return s + " " + dtype_name(t) + (in_place ? " in place" : "") + ", rank " + std::to_string(late_rank) +
           " late by " + std::to_string(delay_ns) + " ns";
  }
};

// A random call within LL128's limits whose shape LL128 can carry (every shard row whole 4-byte
// words); `bytes` is the per-rank input of all_reduce, the shard of all_gather and the full input of
// reduce_scatter, log-uniform in 4 KiB..8 MiB.
Call random_call(std::mt19937_64& rng, int W) {
  Call c;
  c.kind = static_cast<Kind>(rng() % 3);
  c.t = kTypes[rng() % 3];
  const long long e = dtype_size(c.t), cap = static_cast<long long>(coll::Collectives::ll128_max_bytes(W));
  const double lg = std::log(4096.0) + (std::log(8.0 * (1 << 20)) - std::log(4096.0)) * (rng() % 100001) / 1e5;
  long long bytes = static_cast<long long>(std::exp(lg));
  c.late_rank = static_cast<int>(rng() % W);
  c.delay_ns = rng() % 20001;
  if (c.kind == Kind::all_reduce) {
    c.count = std::max<long long>(1, std::min(bytes, cap) / e - static_cast<long long>(rng() % 7));
    c.in_place = rng() % 2;
    return c;
  }
  // all_gather: the shard is `bytes`; reduce_scatter: the full input is.
  long long shard_bytes = c.kind == Kind::all_gather ? bytes : bytes / W;
  shard_bytes = std::clamp<long long>(shard_bytes, 4 * e, cap - 64 * e);
  c.dim = static_cast<int>(rng() % 2);
  c.full.ndim = 2;
  if (c.dim == 0) {
    // Rows of an even number of elements (whole words in 16-bit types), ragged over the ranks.
    const long long cols = 2 * (1 + static_cast<long long>(rng() % 2048));
    const long long rows_per = std::max<long long>(1, shard_bytes / (cols * e));
    c.full.d[0] = rows_per * W - static_cast<long long>(rng() % W);
    c.full.d[1] = cols;
    c.in_place = rng() % 4 == 0;
  } else {
    // 16-bit types: every shard an even number of columns (cols a multiple of 2W); fp32 ragged.
    const long long unit = e == 2 ? 2LL * W : 1;
    const long long cols = unit * (1 + static_cast<long long>(rng() % (4096 / unit)));
    const long long rows = std::max<long long>(1, shard_bytes / (((cols + W - 1) / W) * e));
    c.full.d[0] = rows;
    c.full.d[1] = cols;
  }
  return c;
}

struct CallBuffers {
  Buf in, out;
  CallBuffers(long long elems) : in(elems, DType::fp32), out(elems, DType::fp32) {}
};

// Enqueues one call (fill, the late rank's spin, the collective, the check tagged `tag`) on the
// context's stream; no host synchronization.
void enqueue(const Call& c, CallBuffers& b, coll::Collectives& co, int tag) {
  Ctx& x = ctx();
  const int W = comm().world(), me = comm().rank();
  const long long e = dtype_size(c.t);
  void* in = b.in.p;
  void* out = c.in_place ? b.in.p : b.out.p;
  OutMap m;
  long long in_n = 0;
  if (c.kind == Kind::all_reduce) {
    in_n = c.count;
    m = ref::map_all_reduce(c.count, W, me);
  } else {
    const ref::Split sp = ref::split(c.full, c.dim);
    const long long slice = sp.outer * coll::shard(sp.n, W, me).begin * sp.inner * e;
    if (c.kind == Kind::all_gather) {
      in_n = ref::shard_numel(c.full, c.dim, W, me);
      m = ref::map_all_gather(c.full, c.dim, W, me);
      out = b.out.p;
      if (c.in_place) in = b.out.p + slice;
    } else {
      in_n = c.full.numel();
      m = ref::map_reduce_scatter(c.full, c.dim, W, me);
      out = c.in_place ? b.in.p + slice : b.out.p;
    }
  }
  ref::fill(in, in_n, c.t, c.seed, me, Values::integers, x.s);
  if (me == c.late_rank && c.delay_ns) spin_ns<<<1, 1, 0, x.s>>>(c.delay_ns);
  if (c.kind == Kind::all_reduce) co.all_reduce(in, out, c.count, c.t, ReduceOp::sum, x.s);
  else if (c.kind == Kind::all_gather) co.all_gather(in, out, c.full, c.dim, c.t, x.s);
  else co.reduce_scatter(in, out, c.full, c.dim, c.t, ReduceOp::sum, x.s);
  x.check.check(out, nullptr, m, c.t, c.seed, Values::integers, ReduceOp::sum, 0.f, x.s, tag);
}

TEST(LL128Stress, CallsWithOneRankLate) {
  Ctx& x = ctx();
  const int W = comm().world();
  coll::Collectives& co = x.coll;
  co.set_all_reduce_algo(coll::AllReduceAlgo::ll128);
  co.set_all_gather_algo(coll::ShardAlgo::ll128);
  co.set_reduce_scatter_algo(coll::ShardAlgo::ll128);
  if (co.all_reduce_algo(4096, false) != coll::AllReduceAlgo::ll128) {
    co.set_all_reduce_algo(coll::AllReduceAlgo::automatic);
    co.set_all_gather_algo(coll::ShardAlgo::automatic);
    co.set_reduce_scatter_algo(coll::ShardAlgo::automatic);
    GTEST_SKIP() << "LL128 is not available here (some pair of GPUs is not NVLink-connected)";
  }
  // The largest call: an all_gather output or a reduce_scatter input of W shards up to the cap.
  const long long cap = static_cast<long long>(coll::Collectives::ll128_max_bytes(W));
  CallBuffers b(W * cap / 2 + 4096);  // in fp32 elements: W * cap bytes, with room
  std::mt19937_64 rng(stress_seed() ^ 0x5EED);
  const int calls = (gpus_shared() ? 200 : 4000) * stress_scale();
  for (bool pdl : {true, false}) {
    std::optional<PdlOff> off;
    if (!pdl) off.emplace();
    std::vector<Call> list;
    for (int i = 0; i < calls; ++i) {
      Call c = random_call(rng, W);
      c.seed = ref::mix64(stress_seed() + 1000003ull * (pdl ? 1 : 2) + i);
      list.push_back(c);
    }
    // Every call must run LL128 (a fallback would test something else).
    int not_ll128 = 0;
    for (const Call& c : list) {
      const long long e = dtype_size(c.t);
      const bool ll128 =
          c.kind == Kind::all_reduce ? co.all_reduce_algo(c.count * e, c.in_place) == coll::AllReduceAlgo::ll128
          : c.kind == Kind::all_gather ? co.all_gather_algo(c.full, c.dim, c.t) == coll::ShardAlgo::ll128
                                       : co.reduce_scatter_algo(c.full, c.dim, c.t) == coll::ShardAlgo::ll128;
      if (!ll128 && not_ll128++ < 3) ADD_FAILURE() << "not LL128: " << c.str();
    }
    x.check.reset(x.s);
    settle();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) {
      enqueue(list[i], b, co, i + 1);
      if (i % 64 == 63) comm().sync(x.s);  // keeps the launch queue bounded
    }
    const auto r = x.check.result(x.s);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("rank %d: %d LL128 calls, PDL %s, one rank 0-20 us late: %s (%.1f s)\n", comm().rank(), calls,
                pdl ? "on" : "off", r.ok() ? "all exact" : "WRONG", s);
    EXPECT_TRUE(r.ok()) << "PDL " << (pdl ? "on" : "off") << ": " << r.str()
                        << (r.first_tag > 0 && r.first_tag <= calls ? "; first wrong call: " + list[r.first_tag - 1].str()
                                                                    : std::string());
    settle();
  }
  co.set_all_reduce_algo(coll::AllReduceAlgo::automatic);
  co.set_all_gather_algo(coll::ShardAlgo::automatic);
  co.set_reduce_scatter_algo(coll::ShardAlgo::automatic);
}

}  // namespace
