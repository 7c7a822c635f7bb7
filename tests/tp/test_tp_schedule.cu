// CPU tests of the tensor-parallel schedules (kernels/tp_common/schedule.hpp) for W = 2..8 and of
// the tuner's cache (include/weave/runtime/tuner.hpp). Each schedule is executed on the CPU for
// every rank and block: every output tile is produced once per contributing rank, every wait's
// expected count equals the signals sent to it, and no wait depends on work scheduled after it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <chrono>
#include <map>
#include <thread>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <random>
#include <array>
#include <set>
#include <sstream>
#include <tuple>
#include <vector>

#include "ag_gemm/copy_engine.hpp"
#include "tp_common/host.hpp"
#include "tp_common/schedule.hpp"
#include "weave/lcsc.cuh"
#include "weave/runtime/tuner.hpp"

using namespace weave::tp;

namespace {

const int kMs[] = {1, 7, 128, 300, 1000, 3000, 4096, 8192 + 5};
const int kNs[] = {8, 256, 1000, 2048, 4096};
const int kSms[] = {132, 78};
const int kComm[] = {0, 1, 4, 16, 32};

int blocks_for(long long work, int sms, int ncomm) {
  weave::lcsc::Config cfg;
  cfg.num_comm_sms = ncomm;
  return weave::lcsc::make_plan(work, sms, cfg, 1, 1).compute_blocks;
}

}  // namespace

TEST(TpSchedule, ShardsCoverRowsAndVirtualTilesCoverShards) {
  for (int W = 2; W <= 8; ++W)
    for (int M : kMs) {
      int next = 0;
      const Layout L = make_layout(M, 256, W, 8);
      for (int q = 0; q < W; ++q) {
        const Range s = shard(M, W, q);
        EXPECT_EQ(s.begin, next);
        next += s.size;
        EXPECT_GE(L.tm[q] * kBM, s.size);
        EXPECT_LT((L.tm[q] - 1) * kBM, s.size > 0 ? s.size : 1);
        EXPECT_EQ(L.off[q + 1] - L.off[q], L.tm[q]);
      }
      EXPECT_EQ(next, M);
    }
}

TEST(TpSchedule, GemmRsEveryTileOnceAndSignalsMatchWaits) {
  for (int v = 0; v < 3; ++v)  // 0: owner first, 1: zero first, 2: inter-SM
    for (int W = 2; W <= 8; ++W)
      for (int M : kMs)
        for (int N : kNs)
          for (int gm : {8, 16}) {
            if (M < W) continue;
            const Layout L = make_layout(M, N, W, gm);
            // contributions[(owner, i, n)] = {rank -> (plain, add)}
            std::map<std::tuple<int, int, int>, std::map<int, std::pair<int, int>>> contrib;
            std::map<std::pair<int, int>, unsigned long long> sent;  // (dst rank, idx) -> signals
            std::map<std::pair<int, int>, int> sent_phase;           // producer's phase
            std::vector<std::tuple<int, int, unsigned long long, int>> waits;  // (rank, idx, expected, phase)
            std::map<std::pair<int, int>, unsigned long long> inter_ready;      // v2: (owner, idx)
            for (int r = 0; r < W; ++r)
              for (int w = 0; w < L.work(); ++w) {
                const Item t = rs_order(L, r, w, v);
                ASSERT_GE(t.i, 0);
                ASSERT_LT(t.i, L.tm[t.owner]);
                ASSERT_LT(t.n, L.tiles_n);
                ASSERT_EQ(t.owner, v == 2 ? t.phase : (r + t.phase) % W);  // v2: one order for all ranks
                const Range s = shard(M, W, t.owner);
                ASSERT_GE(t.a_row, s.begin);
                ASSERT_LT(t.a_row, s.begin + s.size);
                auto& c = contrib[{t.owner, t.i, t.n}][r];
                const int idx = rs_ready_index(L, t);
                ASSERT_GE(idx, 0);
                ASSERT_LT(idx, rs_ready_count(L));
                if (v == 2) {  // inter-SM: a plain store into the local scratch, ready on the owner
                  ++c.first;
                  EXPECT_EQ(rs_order(L, 0, w, 2).owner, t.owner) << "every rank walks the same order";
                  inter_ready[{t.owner, idx}] += 1;
                } else if (v == 1) {  // zero first: every contribution is an add, no per-tile wait
                  ++c.second;
                  if (w < W * rs_split(L).t_lo) EXPECT_EQ(t.phase, w % W) << "own and peer tiles interleave";
                } else if (t.owner == r) {
                  ++c.first;
                  EXPECT_EQ(t.phase, 0) << "own tiles come first";
                  for (int p = 0; p < W; ++p)
                    if (p != r) {
                      sent[{p, idx}] += 1;
                      sent_phase[{p, idx}] = t.phase;
                    }
                } else {
                  ++c.second;
                  EXPECT_GE(t.phase, 1);
                  waits.emplace_back(r, idx, rs_ready_expected(), t.phase);
                }
              }
            long long tiles = 0;
            for (auto& [k, by] : contrib) {
              ++tiles;
              ASSERT_EQ(static_cast<int>(by.size()), W) << "every rank contributes to every tile";
              for (auto& [r, pa] : by) {
                if (v == 2 || (v == 0 && r == std::get<0>(k))) EXPECT_EQ(pa, std::make_pair(1, 0));
                else EXPECT_EQ(pa, std::make_pair(0, 1));
              }
            }
            EXPECT_EQ(tiles, L.work());
            for (auto& [r, idx, exp, phase] : waits) {
              EXPECT_EQ(sent[std::make_pair(r, idx)], exp) << "W=" << W << " M=" << M << " N=" << N;
              EXPECT_LT(sent_phase[std::make_pair(r, idx)], phase) << "a wait on work scheduled after it";
            }
            EXPECT_EQ(waits.size(), sent.size());
            if (v == 2) {  // each owner's communicator blocks reduce each of its tiles once, after W signals
              for (int nc : {1, 4, 16}) {
                std::map<std::pair<int, int>, int> reduced;
                for (int q = 0; q < W; ++q)
                  for (int c = 0; c < nc; ++c)
                    for (int j = c; j < L.owner_tiles(q); j += nc) {
                      const weave::gemm::TileCoord t = weave::gemm::grouped_tile(j, L.tm[q], L.tiles_n, gm);
                      const int idx = (L.off[q] + t.m) * L.tiles_n + t.n;
                      EXPECT_EQ(inter_ready[std::make_pair(q, idx)], rs_inter_ready_expected(L));
                      ++reduced[{q, idx}];
                    }
                EXPECT_EQ(reduced.size(), inter_ready.size());
                for (auto& [k, n] : reduced) EXPECT_EQ(n, 1);
                EXPECT_EQ(static_cast<unsigned long long>(reduced.size()), rs_inter_done_expected(L));
              }
              continue;
            }
            for (int sms : kSms) {
              const int blocks = blocks_for(L.work(), sms, 0);
              for (int q = 0; q < W; ++q) {
                unsigned long long adds = 0;
                for (int p = 0; p < W; ++p)
                  for (int b = 0; b < blocks; ++b) adds += rs_block_adds(L, p, b, blocks, q, v);
                EXPECT_EQ(adds, rs_done_expected(L, q));
                if (v == 1) {  // the blocks' zero ranges cover the owner's output exactly once
                  const long long elems = static_cast<long long>(shard(M, W, q).size) * N;
                  long long next = 0;
                  for (int b = 0; b < blocks; ++b) {
                    long long e0, e1;
                    rs_zero_range(elems, b, blocks, &e0, &e1);
                    EXPECT_EQ(e0, next);
                    EXPECT_GE(e1, e0);
                    next = e1;
                  }
                  EXPECT_EQ(next, elems);
                  EXPECT_EQ(rs_zeroed_expected(blocks), static_cast<unsigned long long>(blocks));
                }
              }
            }
          }
}

TEST(TpSchedule, AgGemmEveryTileOncePushesMatchWaits) {
  for (int W = 2; W <= 8; ++W)
    for (int M : kMs)
      for (int N : {8, 1000, 4096})
        for (int nc : kComm) {
          if (M < W) continue;
          const Layout L = make_layout(M, N, W, 16);
          std::map<std::pair<int, int>, unsigned long long> sent;  // (dst, idx)
          const int K = 64 * (1 + (M + N) % 40);  // K boxes from 1 to 40: slices 1, 2, 4 or 8
          // nc = 0: the aux-warp pushes (variants 2..6; the variant from the shape), one pusher
          // per 2^(v-3)-th compute block (v2: every block); else nc communicator blocks.
          const int v = 2 + (M + N) % 5, blocks = blocks_for(L.work(), 132, 0);
          // Rows of bf16 or fp8 (the pushes count bytes).
          const long long rb = static_cast<long long>(K) * (1 + (M + N + W + nc) % 2);
          const int P = nc == 0 ? ag_slices_aux(L, rb) : ag_slices(rb);
          const int pushers = nc > 0 ? nc : v == 2 ? blocks : ag_aux_pushers(blocks, v);
          if (nc == 0 && v >= 3) {  // the pushing blocks are exactly pushers 0..n-1
            int n = 0;
            for (int b = 0; b < blocks; ++b)
              if (b % ag_aux_stride(v) == 0) EXPECT_EQ(b / ag_aux_stride(v), n++);
            EXPECT_EQ(n, pushers);
          }
          ASSERT_GE(P, 1);
          if (nc > 0) EXPECT_EQ(((rb + 127) / 128) % P, 0);
          for (int q = 0; q < W; ++q) {  // the units' byte ranges tile the shard exactly
            long long next = 0;
            for (int u = 0; u < ag_units(L, q, P); ++u) {
              long long b0, b1;
              ag_unit_bytes(L, q, rb, P, u, &b0, &b1);
              EXPECT_EQ(b0 % 16, 0);
              EXPECT_EQ(b1 % 16, 0);
              if (b1 > b0) {
                EXPECT_EQ(b0, next);
                next = b1;
              }
            }
            EXPECT_EQ(next, rb * shard(M, W, q).size);
          }
          for (int q = 0; q < W; ++q)  // pushers of owner q, as the kernel walks them
            for (int c = 0; c < pushers; ++c)
              for (int u = c; u < ag_units(L, q, P); u += pushers) {
                const int i = u / P;
                ASSERT_LT(i, L.tm[q]);
                for (int d = 0; d < W; ++d)
                  if (d != q) sent[{d, L.off[q] + i}] += 1;
              }
          for (int r = 0; r < W; ++r) {
            std::set<std::tuple<int, int, int>> seen;
            int waits = 0;
            for (int w = 0; w < L.work(); ++w) {
              const Item t = item(L, r, w);
              EXPECT_TRUE(seen.insert({t.owner, t.i, t.n}).second) << "tile computed twice";
              EXPECT_EQ(t.owner == r, t.phase == 0) << "local rows first";
              if (t.owner != r) {
                ++waits;
                ASSERT_LT(t.vrow, ag_ready_count(L));
                EXPECT_EQ(sent[std::make_pair(r, t.vrow)], ag_ready_expected(P));
              }
            }
            EXPECT_EQ(static_cast<int>(seen.size()), L.work());
            (void)waits;
          }
          // Every pushed row tile is waited for by someone (so the gathered A is complete when
          // the kernel ends), and each exactly once per destination.
          for (auto& [k, v] : sent) EXPECT_EQ(v, static_cast<unsigned long long>(P));
          EXPECT_EQ(sent.size(), size_t(W - 1) * L.row_tiles());
        }
}

// gemm_rs v3 (one plain GEMM per owner, chained): every rank's stream as a sequence of ops
// (signal, wait, GEMM into an owner's output), run in random interleavings for several calls in a
// row, W = 2..8. Checked: no deadlock; each owner's output is written, per call, first plainly by
// rank q + 1 (step 1), then added to by every other rank in chain order and last by q itself, so
// it ends as the sum of all W contributions; no rank writes an owner's output before that owner
// entered the call (its previous call, own add included, is over); the counters end at what the
// waits expected.
TEST(TpSchedule, GemmRsChainWritesEachOutputInOrder) {
  using weave::tp::rs_chain_expected;
  using weave::tp::rs_chain_owner;
  struct Op {
    enum Kind { signal, wait, write } kind;
    int rank_or_owner, index;
    unsigned long long expected;
    bool plain;
    int call;
  };
  std::mt19937 rng(11);
  for (int W = 2; W <= 8; ++W)
    for (int trial = 0; trial < 40; ++trial) {
      const int calls = 3;
      std::vector<std::vector<Op>> prog(W);
      for (int r = 0; r < W; ++r) {
        const int next = (r + 1) % W;
        for (int k = 1; k <= calls; ++k) {
          auto& p = prog[r];
          p.push_back({Op::signal, next, 0, 0, false, k});
          p.push_back({Op::wait, r, 0, static_cast<unsigned long long>(k), false, k});
          for (int t = 1; t <= W - 1; ++t) {
            if (t >= 2) p.push_back({Op::wait, r, 1, rs_chain_expected(k, t, W), false, k});
            p.push_back({Op::write, rs_chain_owner(r, t, W), 0, 0, t == 1, k});
            p.push_back({Op::signal, next, 1, 0, false, k});
            if (t == W - 1) p.push_back({Op::wait, r, 1, rs_chain_expected(k, W, W), false, k});
          }
          p.push_back({Op::write, r, 0, 0, false, k});
        }
      }
      std::vector<size_t> pc(W, 0);
      std::vector<std::array<unsigned long long, 2>> ctr(W, {0, 0});
      std::vector<long long> value(W, -1);            // owner's output: sum of contributions (ids)
      std::vector<int> writes(W, 0), out_call(W, 0);  // writes this call, the call they belong to
      std::vector<int> entered(W, 0);                 // the call each rank's stream has reached
      for (;;) {
        std::vector<int> runnable;
        bool done = true;
        for (int r = 0; r < W; ++r) {
          if (pc[r] == prog[r].size()) continue;
          done = false;
          const Op& o = prog[r][pc[r]];
          if (o.kind != Op::wait || ctr[r][o.index] >= o.expected) runnable.push_back(r);
        }
        if (done) break;
        ASSERT_FALSE(runnable.empty()) << "deadlock at W = " << W;
        const int r = runnable[rng() % runnable.size()];
        const Op& o = prog[r][pc[r]++];
        entered[r] = o.call;
        if (o.kind == Op::signal) {
          ++ctr[o.rank_or_owner][o.index];
        } else if (o.kind == Op::write) {
          const int q = o.rank_or_owner;
          ASSERT_GE(entered[q], o.call) << "rank " << r << " writes owner " << q << "'s output of call " << o.call
                                        << " before " << q << " entered it (W = " << W << ")";
          const int contribution = o.call * 100 + r;
          if (o.plain) {
            ASSERT_EQ(r, (q + 1) % W);
            if (out_call[q]) ASSERT_EQ(writes[q], W) << "previous call's adds not all in, owner " << q;
            value[q] = contribution, writes[q] = 1, out_call[q] = o.call;
          } else {
            ASSERT_EQ(out_call[q], o.call) << "an add before the call's plain store, owner " << q;
            ASSERT_EQ(r, (q + 1 + writes[q]) % W) << "adds out of chain order, owner " << q;
            value[q] += contribution, ++writes[q];
          }
        }
      }
      for (int q = 0; q < W; ++q) {
        long long want = 0;
        for (int r = 0; r < W; ++r) want += calls * 100 + r;
        EXPECT_EQ(writes[q], W);
        EXPECT_EQ(value[q], want) << "W = " << W << " owner " << q;
        EXPECT_EQ(ctr[q][0], static_cast<unsigned long long>(calls));
        EXPECT_EQ(ctr[q][1], rs_chain_expected(calls, W, W));
      }
    }
}

// Variant 5 (the chain in one kernel) run tile by tile: `blocks` storers per rank walk their
// tiles in rs_chain_item order, with the kernel's waits and (lagged) signals, in random interleavings and
// over several calls (a rank's next kernel starts when all its blocks ended). Each output tile
// gets one plain store from rank owner + 1 after the owner entered the call, then the adds of
// owner + 2, ... and the owner's own last; every wait's expected count is what was sent to it.
TEST(TpSchedule, GemmRsChainKernelWritesEachTileInOrder) {
  std::mt19937 rng(5);
  for (int W = 1; W <= 8; ++W)
    for (int M : {W, 300, 1000 + W})
      for (int N : {256, 1000}) {
        if (M < W) continue;
        const Layout L = make_layout(M, N, W, 8);
        for (int blocks : {1, 3, 7}) {
          const int calls = 3, R = L.work();
          // per rank: entered counter, ready[idx]; per owner tile (vrow, n): writes this call, call
          std::vector<unsigned long long> entered(W, 0);
          std::vector<std::vector<unsigned long long>> ready(W, std::vector<unsigned long long>(R, 0));
          std::vector<int> writes(R, 0), tile_call(R, 0), last_writer(R, -1);
          std::vector<int> call(W, 1), ended(W, 0), kernel_started(W, 0);
          std::vector<std::vector<int>> next_w(W, std::vector<int>(blocks));
          const int idle = blocks > R ? blocks - R : 0;  // blocks without a tile end at once
          for (int r = 0; r < W; ++r) {
            ended[r] = idle;
            for (int b = 0; b < blocks; ++b) next_w[r][b] = b;
          }
          std::vector<std::vector<bool>> waited(W, std::vector<bool>(R, false));
          // the kernel's lagged signal: per block, the tile stored but not yet signalled (-1: none);
          // it goes out after the next tile's store, before a wait, or at the block's end
          std::vector<std::vector<int>> pending(W, std::vector<int>(blocks, -1));
          for (;;) {
            std::vector<std::pair<int, int>> runnable;  // (rank, block); block -1: the kernel starts
            bool all_done = true;
            for (int r = 0; r < W; ++r) {
              if (call[r] > calls) continue;
              all_done = false;
              if (kernel_started[r] < call[r]) {
                runnable.emplace_back(r, -1);
                continue;
              }
              for (int b = 0; b < blocks; ++b) {
                const int w = next_w[r][b];
                if (w >= R) continue;
                const Item t = rs_order(L, r, w, 5);
                const bool first = t.phase == 1 && W > 1;
                const int idx = rs_ready_index(L, t);
                bool ok = true;
                if (first && w == b) ok = entered[r] >= static_cast<unsigned long long>(call[r]);
                if (!first && W > 1) ok = pending[r][b] >= 0 || ready[r][idx] >= static_cast<unsigned long long>(call[r]);
                if (ok) runnable.emplace_back(r, b);
              }
            }
            if (all_done) break;
            ASSERT_FALSE(runnable.empty()) << "deadlock at W = " << W << " M = " << M << " N = " << N;
            const auto [r, b] = runnable[rng() % runnable.size()];
            if (b < 0) {  // the kernel's aux warps: entered on rank r + 1
              kernel_started[r] = call[r];
              if (W > 1) ++entered[(r + 1) % W];
              continue;
            }
            const int w = next_w[r][b];
            const Item t = rs_order(L, r, w, 5);
            const int idx = rs_ready_index(L, t), q = t.owner;
            if (t.phase > 1 && W > 1 && pending[r][b] >= 0) {  // the flush before the wait
              ++ready[(r + 1) % W][pending[r][b]];
              pending[r][b] = -1;
              continue;
            }
            ASSERT_EQ(q, rs_chain_owner(r, t.phase, W));
            ASSERT_EQ(t.phase == W, q == r) << "the own rows come last";
            const Range sh = shard(M, W, q);
            ASSERT_GE(t.a_row, sh.begin);
            ASSERT_LT(t.a_row, sh.begin + sh.size);
            if (t.phase > 1) waited[r][idx] = true;
            if (t.phase == 1) {  // plain store: the owner is in this call, the last call's adds are in
              ASSERT_GE(kernel_started[q], call[r]) << "store into owner " << q << " before it entered the call";
              if (tile_call[idx]) ASSERT_EQ(writes[idx], W) << "previous call's adds not all in";
              writes[idx] = 1, tile_call[idx] = call[r];
            } else {
              ASSERT_EQ(tile_call[idx], call[r]) << "an add before the call's plain store";
              ASSERT_EQ(last_writer[idx], (r - 1 + W) % W) << "adds out of chain order";
              ++writes[idx];
            }
            last_writer[idx] = r;
            if (t.phase < W) {
              if (pending[r][b] >= 0) ++ready[(r + 1) % W][pending[r][b]];
              pending[r][b] = idx;
            }
            next_w[r][b] += blocks;
            if (next_w[r][b] >= R && pending[r][b] >= 0) {  // store_done's flush
              ++ready[(r + 1) % W][pending[r][b]];
              pending[r][b] = -1;
            }
            if (next_w[r][b] >= R && ++ended[r] == blocks) {  // the rank's kernel ended
              ended[r] = idle;
              ++call[r];
              for (int bb = 0; bb < blocks; ++bb) next_w[r][bb] = call[r] > calls ? R : bb;
            }
          }
          for (int i = 0; i < R; ++i) {
            EXPECT_EQ(writes[i], W) << "tile " << i;
            EXPECT_EQ(tile_call[i], calls);
          }
          for (int r = 0; r < W; ++r) {
            EXPECT_EQ(entered[r], W > 1 ? static_cast<unsigned long long>(calls) : 0ull);
            for (int i = 0; i < R; ++i)
              EXPECT_EQ(ready[r][i], waited[r][i] ? static_cast<unsigned long long>(calls) : 0ull)
                  << "rank " << r << " ready[" << i << "]: signals sent != the count its wait expects";
          }
        }
      }
}

TEST(TpSchedule, GemmArOwnersReduceEachTileOnce) {
  for (int W = 2; W <= 8; ++W)
    for (int M : kMs)
      for (int N : kNs)
        for (int nc : kComm) {
          if (nc == 0) continue;
          const ArLayout L = make_ar_layout(M, N, W, 8);
          std::vector<int> reduced(L.work(), 0);
          for (int r = 0; r < W; ++r)
            for (int c = 0; c < nc; ++c)
              for (int k = 0;; ++k) {
                const int w = ar_comm_tile(L, r, c, nc, k);
                if (w < 0) break;
                EXPECT_EQ(ar_owner(L, w), r);
                EXPECT_EQ(ar_reducer_block(L, w, nc), c);
                ++reduced[w];
              }
          for (int w = 0; w < L.work(); ++w) EXPECT_EQ(reduced[w], 1) << "tile " << w;
          // The adaptive split's reductions per rank (gemm_ar v2): the tiles it owns.
          for (int r = 0; r < W; ++r) {
            int owned = 0;
            for (int w = 0; w < L.work(); ++w) owned += ar_owner(L, w) == r;
            EXPECT_EQ(ar_owned_tiles(L, r), owned) << "rank " << r;
          }
          // ready[w] on the owner: one signal from each rank's storer (each computes every tile).
          EXPECT_EQ(ar_ready_expected(L), static_cast<unsigned long long>(W));
          // done on each rank: one signal per reduced tile.
          long long dn = 0;
          for (int w = 0; w < L.work(); ++w) dn += reduced[w];
          EXPECT_EQ(static_cast<unsigned long long>(dn), ar_done_expected(L));
        }
}

TEST(TpSchedule, GemmArIntraSignalsMatchWaits) {
  for (int W = 2; W <= 8; ++W)
    for (int M : kMs)
      for (int N : kNs) {
        const ArLayout L = make_ar_layout(M, N, W, 8);
        // Every rank walks every tile: one ready signal per (tile, source) to each other rank,
        // read by exactly one wait there at the same position (after the waiter's own signal).
        std::map<std::pair<int, int>, unsigned long long> sent;  // (dst, idx)
        std::map<std::pair<int, int>, int> waited;
        for (int r = 0; r < W; ++r)
          for (int w = 0; w < L.work(); ++w)
            for (int k = 0; k < W; ++k) {
              const int d = (r + k) % W;
              if (k == 0) {
                for (int p = 0; p < W; ++p)
                  if (p != r) sent[{p, ar_intra_ready_index(L, w, r)}] += 1;
              } else {
                ++waited[{r, ar_intra_ready_index(L, w, d)}];
              }
            }
        for (auto& [k, n] : waited) {
          EXPECT_EQ(n, 1);
          EXPECT_LT(k.second, ar_intra_ready_count(L));
          EXPECT_EQ(sent[k], ar_intra_ready_expected());
        }
        EXPECT_EQ(sent.size(), waited.size());
        for (int sms : kSms) {
          const int blocks = blocks_for(L.work(), sms, 0);
          unsigned long long adds = 0;  // adds into one rank: every block of every peer
          for (int p = 1; p < W; ++p)
            for (int b = 0; b < blocks; ++b) {
              int n = 0;
              for (int w = b; w < L.work(); w += blocks) ++n;
              EXPECT_EQ(ar_intra_block_tiles(L, b, blocks), n);
              adds += n;
            }
          EXPECT_EQ(adds, ar_intra_done_expected(L));
        }
      }
}

// ---- tuner cache ----------------------------------------------------------------------------
namespace {
std::string temp_path(const char* tag) {
  return "/tmp/weave_tuner_test_" + std::to_string(getpid()) + "_" + tag + "/sub/tuner.json";
}
std::string slurp(const std::string& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}
}  // namespace

TEST(Tuner, ParseSerializeRoundTrip) {
  std::map<std::string, weave::runtime::TuneResult> m;
  m["ag_gemm|4096x2048x4096|w2|H200_132sm"] = {{0, 16}, 123.5, false, "0:4,0:16"};
  m["we\"ird|1|w8|x"] = {{1, 4}, 7, false, "1:4"};
  std::map<std::string, weave::runtime::TuneResult> back;
  std::string err;
  ASSERT_TRUE(weave::runtime::Tuner::parse(weave::runtime::Tuner::serialize(m), &back, &err)) << err;
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back["ag_gemm|4096x2048x4096|w2|H200_132sm"].choice.num_comm_sms, 16);
  EXPECT_EQ(back["we\"ird|1|w8|x"].choice.variant, 1);
  EXPECT_NEAR(back["ag_gemm|4096x2048x4096|w2|H200_132sm"].time_us, 123.5, 1e-3);
  EXPECT_EQ(back["ag_gemm|4096x2048x4096|w2|H200_132sm"].candidates, "0:4,0:16");
  // Another version (version 1 had no candidate sets) is not this cache: ignored, re-tuned.
  for (const char* bad : {"", "{", "garbage", "{\"version\": 2}", "{\"version\": 1, \"entries\": {}}",
                          "{\"version\": 3, \"entries\": {}}",
                          "{\"version\": 2, \"entries\": {\"k\": {\"variant\": 0}}}",
                          "{\"version\": 2, \"entries\": {}} trailing"}) {
    std::map<std::string, weave::runtime::TuneResult> x;
    EXPECT_FALSE(weave::runtime::Tuner::parse(bad, &x, &err)) << bad;
    EXPECT_TRUE(x.empty());
  }
}

TEST(Tuner, SearchesOnceThenUsesMemoryAndFile) {
  const std::string path = temp_path("search");
  std::remove(path.c_str());
  weave::runtime::Tuner t(path);
  t.set_verbose(false);
  std::vector<weave::runtime::TuneCandidate> c = {{0, 4}, {0, 8}, {0, 16}};
  int calls = 0;
  auto measure = [&](const weave::runtime::TuneCandidate& x) {
    ++calls;
    return x.num_comm_sms == 8 ? 10.0 : 20.0;
  };
  auto r = t.choose(nullptr, "k|1|w1|d", c, measure);
  EXPECT_EQ(calls, 15);  // every candidate once, then (at least the best three kept) four more rounds
  EXPECT_EQ(r.choice.num_comm_sms, 8);
  EXPECT_FALSE(r.from_cache);
  r = t.choose(nullptr, "k|1|w1|d", c, measure);
  EXPECT_EQ(calls, 15);
  EXPECT_TRUE(r.from_cache);
  EXPECT_EQ(r.choice.num_comm_sms, 8);
  // A new process (a fresh tuner on the same file) reads the winner back.
  weave::runtime::Tuner t2(path);
  t2.set_verbose(false);
  r = t2.choose(nullptr, "k|1|w1|d", c, measure);
  EXPECT_EQ(calls, 15);
  EXPECT_TRUE(r.from_cache);
  EXPECT_EQ(r.choice.num_comm_sms, 8);
  EXPECT_NE(slurp(path).find("\"num_comm_sms\": 8"), std::string::npos);
}

TEST(Tuner, MedianOverRoundsOverturnsALuckySample) {
  weave::runtime::Tuner t("off");
  t.set_verbose(false);
  std::map<int, int> seen;
  // num_comm_sms 4 measures 10 once, then 40 (a clock swing caught once); 8 measures 20 every
  // time but 9 in its third sample; 16 is 30, a near third kept; 32 and 64 are far behind.
  auto r = t.choose(nullptr, "noisy|1|w1|d", {{0, 4}, {0, 8}, {0, 16}, {0, 32}, {0, 64}},
                    [&](const weave::runtime::TuneCandidate& x) {
                      const int k = seen[x.num_comm_sms]++;
                      if (x.num_comm_sms == 4) return k == 0 ? 10.0 : 40.0;
                      if (x.num_comm_sms == 8) return k == 2 ? 9.0 : 20.0;
                      return x.num_comm_sms == 16 ? 30.0 : 100.0 + x.num_comm_sms;
                    });
  EXPECT_EQ(r.choice.num_comm_sms, 8);
  EXPECT_DOUBLE_EQ(r.time_us, 20.0);  // the median, not the lucky sample
  EXPECT_EQ(seen[4], 5);
  EXPECT_EQ(seen[16], 5);  // the best three stay in the race
  EXPECT_EQ(seen[32], 1);  // the rest is measured once
  EXPECT_EQ(seen[64], 1);
}

TEST(Tuner, KeepsEveryCandidateNearTheBest) {
  weave::runtime::Tuner t("off");
  t.set_verbose(false);
  std::map<int, int> seen;
  // Five candidates within 1.3x of the best: all five get every round; 7 (1.4x) is dropped.
  auto r = t.choose(nullptr, "near|1|w1|d", {{0, 1}, {0, 2}, {0, 3}, {0, 4}, {0, 5}, {0, 7}},
                    [&](const weave::runtime::TuneCandidate& x) {
                      ++seen[x.num_comm_sms];
                      return 10.0 + (x.num_comm_sms == 7 ? 4.0 : 0.5 * (5 - x.num_comm_sms));
                    });
  EXPECT_EQ(r.choice.num_comm_sms, 5);
  for (int n = 1; n <= 5; ++n) EXPECT_EQ(seen[n], 5) << n;
  EXPECT_EQ(seen[7], 1);
}

// A bounded search (Tuner::budget_s): every candidate measured once, each sample's window the
// budget over twice the candidates (what time_launches' plan reads), and the later rounds only
// while the budget allows them; budget 0 is the full search, with no window.
TEST(Tuner, BudgetBoundsTheSearch) {
  weave::runtime::Tuner t("off");
  t.set_verbose(false);
  t.set_budget_s(0.1);
  std::map<int, int> seen;
  double window = -1;
  const std::vector<weave::runtime::TuneCandidate> cands = {{0, 1}, {0, 2}, {0, 3}, {0, 4}, {0, 5}};
  auto r = t.choose(nullptr, "budget|1|w1|d", cands, [&](const weave::runtime::TuneCandidate& x) {
    ++seen[x.num_comm_sms];
    window = weave::runtime::search_sample_window_us();
    std::this_thread::sleep_for(std::chrono::milliseconds(30));  // round 1 alone takes 0.15 s
    return 10.0 + x.num_comm_sms;
  });
  EXPECT_EQ(r.choice.num_comm_sms, 1);
  for (int n = 1; n <= 5; ++n) EXPECT_EQ(seen[n], 1) << n;
  EXPECT_DOUBLE_EQ(window, 0.1e6 / 10);
  EXPECT_EQ(weave::runtime::search_sample_window_us(), 0.0) << "the window outlived the search";
  // Unbounded: no window, every kept candidate gets its five samples.
  t.set_budget_s(0);
  seen.clear();
  t.choose(nullptr, "budget|2|w1|d", cands, [&](const weave::runtime::TuneCandidate& x) {
    ++seen[x.num_comm_sms];
    window = weave::runtime::search_sample_window_us();
    return 10.0 + 0.1 * x.num_comm_sms;
  });
  for (int n = 1; n <= 5; ++n) EXPECT_EQ(seen[n], 5) << n;
  EXPECT_EQ(window, 0.0);
}

TEST(Tuner, CorruptFileIsReportedAndReplaced) {
  const std::string path = temp_path("corrupt");
  weave::runtime::Tuner t(path);
  t.set_verbose(false);
  t.remember("a|1|w2|d", {{0, 4}, 1.0, false, "0:4"});  // creates the folders
  { std::ofstream(path, std::ios::trunc) << "{\"version\": 2, \"entries\": {\"a|1|w2|d\": {\"num_comm_sms\": "; }
  weave::runtime::Tuner t2(path);
  t2.set_verbose(false);
  weave::runtime::TuneResult r;
  EXPECT_FALSE(t2.lookup("a|1|w2|d", &r));  // truncated file: ignored, not fatal
  int calls = 0;
  r = t2.choose(nullptr, "b|2|w2|d", {{0, 2}, {0, 6}}, [&](const weave::runtime::TuneCandidate& x) {
    ++calls;
    return static_cast<double>(x.num_comm_sms);
  });
  EXPECT_EQ(calls, 10);  // both candidates, five rounds
  EXPECT_EQ(r.choice.num_comm_sms, 2);
  std::map<std::string, weave::runtime::TuneResult> back;
  std::string err;
  EXPECT_TRUE(weave::runtime::Tuner::parse(slurp(path), &back, &err)) << err;  // rewritten, valid
  EXPECT_EQ(back.count("b|2|w2|d"), 1u);
}

// A cached choice answers only the candidate set it was chosen from: an entry chosen from other
// candidates, one whose choice is not among the current candidates (a foreign or hand-edited
// file), and a file of the previous version are all re-tuned, and the file is rewritten.
TEST(Tuner, StaleOrForeignEntriesAreReTuned) {
  EXPECT_EQ(weave::runtime::candidate_set({{0, 16}, {0, 4}, {1, 4}, {0, 4}}), "0:4,0:16,1:4");
  const std::string path = temp_path("stale");
  const std::vector<weave::runtime::TuneCandidate> now = {{0, 4}, {0, 8}, {0, 16}};
  int calls = 0;
  auto measure = [&](const weave::runtime::TuneCandidate& x) {
    ++calls;
    return x.num_comm_sms == 16 ? 5.0 : 20.0;
  };
  auto fresh = [&](const std::string& text) {
    { weave::runtime::Tuner(path).remember("seed|1|w1|d", {{0, 4}, 1.0, false, "0:4"}); }  // folders
    { std::ofstream(path, std::ios::trunc) << text; }
    calls = 0;
    weave::runtime::Tuner t(path);
    t.set_verbose(false);
    return t.choose(nullptr, "k|1|w1|d", now, measure);
  };
  const std::string entry = "{\"version\": 2, \"entries\": {\"k|1|w1|d\": {\"variant\": 0, \"num_comm_sms\": 8, "
                            "\"time_us\": 1.0, \"candidates\": ";
  // Chosen from {4, 8} only: 16 did not exist then.
  auto r = fresh(entry + "\"0:4,0:8\"}}}");
  EXPECT_FALSE(r.from_cache);
  EXPECT_GT(calls, 0);
  EXPECT_EQ(r.choice.num_comm_sms, 16);
  // The same set, but a choice outside it.
  r = fresh("{\"version\": 2, \"entries\": {\"k|1|w1|d\": {\"variant\": 0, \"num_comm_sms\": 99, \"time_us\": 1.0, "
            "\"candidates\": \"0:4,0:8,0:16\"}}}");
  EXPECT_FALSE(r.from_cache);
  EXPECT_EQ(r.choice.num_comm_sms, 16);
  // No candidate set recorded (an entry of the version-1 format, in a version-2 file).
  r = fresh("{\"version\": 2, \"entries\": {\"k|1|w1|d\": {\"variant\": 0, \"num_comm_sms\": 8, \"time_us\": 1.0}}}");
  EXPECT_FALSE(r.from_cache);
  // A version-1 file.
  r = fresh("{\"version\": 1, \"entries\": {\"k|1|w1|d\": {\"variant\": 0, \"num_comm_sms\": 8, \"time_us\": 1.0}}}");
  EXPECT_FALSE(r.from_cache);
  EXPECT_EQ(r.choice.num_comm_sms, 16);
  // The rewritten file answers the current set without a search, and records it.
  weave::runtime::Tuner t(path);
  t.set_verbose(false);
  calls = 0;
  r = t.choose(nullptr, "k|1|w1|d", now, measure);
  EXPECT_TRUE(r.from_cache);
  EXPECT_EQ(calls, 0);
  EXPECT_EQ(r.choice.num_comm_sms, 16);
  EXPECT_NE(slurp(path).find("\"candidates\": \"0:4,0:8,0:16\""), std::string::npos) << slurp(path);
  // In memory too: the same key with another candidate set searches again.
  r = t.choose(nullptr, "k|1|w1|d", {{0, 4}, {0, 8}}, measure);
  EXPECT_FALSE(r.from_cache);
  EXPECT_GT(calls, 0);
}

// Ranks of one tuner group as threads: all_gather through shared slots between two barriers.
class ThreadGroup {
 public:
  explicit ThreadGroup(int world) : world_(world), slots_(world) {}
  weave::runtime::TuneGroup member(unsigned long long id, int rank) {
    weave::runtime::TuneGroup g;
    g.id = id;
    g.rank = rank;
    g.world = world_;
    g.all_gather = [this, rank](const void* mine, void* all, size_t bytes) {
      slots_[rank].assign(static_cast<const char*>(mine), static_cast<const char*>(mine) + bytes);
      wait();
      for (int r = 0; r < world_; ++r) std::copy(slots_[r].begin(), slots_[r].end(), static_cast<char*>(all) + r * bytes);
      wait();
    };
    g.check_same = [g](const std::string& what, const std::vector<long long>& v) {
      std::vector<long long> all(v.size() * g.world);
      g.all_gather(v.data(), all.data(), v.size() * sizeof(long long));
      for (size_t i = 0; i < all.size(); ++i)
        if (all[i] != v[i % v.size()]) throw weave::Error("ranks differ: " + what);
    };
    return g;
  }

 private:
  void wait() {
    std::unique_lock<std::mutex> l(m_);
    const unsigned long long gen = gen_;
    if (++arrived_ == world_) {
      arrived_ = 0;
      ++gen_;
      cv_.notify_all();
    } else {
      cv_.wait(l, [&] { return gen_ != gen; });
    }
  }
  int world_;
  std::vector<std::vector<char>> slots_;
  std::mutex m_;
  std::condition_variable cv_;
  int arrived_ = 0;
  unsigned long long gen_ = 0;
};

// Four processes (each its own tuner, as Tuner::global() is per process), two TP groups
// A = {P0, P1} and C = {P2, P3} that time the same key and choose differently, then a group
// B = {P0, P2} across them (torch subgroups of one world size). B's members must launch one
// choice: a choice is taken without communication only by the group that agreed on it, so B asks
// its rank 0 (P0, which holds A's). Before, P0 and P2 each answered from their own memory (A's
// variant 0, C's variant 1) and their kernels waited for signals the other's variant never sends.
TEST(Tuner, AChoiceAnswersOnlyTheGroupThatAgreedOnIt) {
  std::vector<std::unique_ptr<weave::runtime::Tuner>> proc;
  for (int p = 0; p < 4; ++p) {
    proc.push_back(std::make_unique<weave::runtime::Tuner>("off"));
    proc.back()->set_verbose(false);
  }
  const std::string key = "gemm_rs|4096x8192x4096|w2|dev";
  const std::vector<weave::runtime::TuneCandidate> cands = {{0, 0}, {1, 0}};
  auto prefer = [](int variant) {
    return [variant](const weave::runtime::TuneCandidate& c) { return c.variant == variant ? 10.0 : 20.0; };
  };
  ThreadGroup a(2), c(2), b(2);
  std::vector<weave::runtime::TuneResult> first(4), across(2);
  {
    std::vector<std::thread> t;
    for (int p = 0; p < 4; ++p)
      t.emplace_back([&, p] {
        ThreadGroup& g = p < 2 ? a : c;  // group ids are per process: each process's first group is 1
        first[p] = proc[p]->choose(g.member(1, p % 2), key, cands, prefer(p < 2 ? 0 : 1));
      });
    for (auto& x : t) x.join();
  }
  EXPECT_EQ(first[0].choice.variant, 0);
  EXPECT_EQ(first[1].choice.variant, 0);
  EXPECT_EQ(first[2].choice.variant, 1);
  EXPECT_EQ(first[3].choice.variant, 1);
  int measured = 0;
  {
    std::vector<std::thread> t;
    for (int i = 0; i < 2; ++i)
      t.emplace_back([&, i] {
        const int p = i == 0 ? 0 : 2;
        across[i] = proc[p]->choose(b.member(2, i), key, cands, [&](const weave::runtime::TuneCandidate&) {
          ++measured;
          return 10.0;
        });
      });
    for (auto& x : t) x.join();
  }
  EXPECT_EQ(across[0].choice.variant, across[1].choice.variant) << "the two ranks of group B launch different variants";
  EXPECT_EQ(across[1].choice.variant, 0) << "B's rank 0 holds A's choice, which decides";
  EXPECT_EQ(measured, 0) << "rank 0's cached choice needs no search";
  // Agreed now: B's next call takes it on both ranks without communication (no peer is running).
  EXPECT_TRUE(proc[2]->choose(b.member(2, 1), key, cands, prefer(1)).from_cache);
  EXPECT_EQ(proc[2]->choose(b.member(2, 1), key, cands, prefer(1)).choice.variant, 0);
  // C's own agreed choice is unchanged on P2.
  EXPECT_EQ(proc[2]->choose(c.member(1, 0), key, cands, prefer(1)).choice.variant, 1);
  weave::runtime::TuneResult r;
  EXPECT_TRUE(proc[2]->agreed(2, key, &r));
  EXPECT_FALSE(proc[2]->agreed(3, key, &r));
  // Ranks whose candidates differ (one has none: fewer SMs than its peers) fail together.
  ThreadGroup d(2);
  std::string err[2];
  std::vector<std::thread> t;
  for (int i = 0; i < 2; ++i)
    t.emplace_back([&, i] {
      try {
        const std::vector<weave::runtime::TuneCandidate> none, mine = i == 0 ? cands : none;
        proc[i]->choose(d.member(3, i), "other|1|w2|dev", mine, prefer(0));
      } catch (const weave::Error& e) {
        err[i] = e.what();
      }
    });
  for (auto& x : t) x.join();
  EXPECT_NE(err[0].find("ranks differ"), std::string::npos) << err[0];
  EXPECT_NE(err[1].find("ranks differ"), std::string::npos) << err[1];
}

TEST(Tuner, SampleLengthScalesWithTheLaunch) {
  const weave::SamplePlan tiny = weave::runtime::tune_plan(20);  // a few us per launch: both capped
  EXPECT_EQ(tiny.warm, 2000);
  EXPECT_EQ(tiny.iters, 200);
  const weave::SamplePlan mid = weave::runtime::tune_plan(800);  // ~100 ms warm, ~20 ms timed
  EXPECT_EQ(mid.warm, 125);
  EXPECT_EQ(mid.iters, 25);
  // A launch of 52 ms: two warm (at least 100 ms), one timed.
  const weave::SamplePlan big = weave::runtime::tune_plan(52000);
  EXPECT_EQ(big.warm, 2);
  EXPECT_EQ(big.iters, 1);
  EXPECT_EQ(weave::runtime::tune_plan(0).iters, 200);  // a nonsense time still gives a bounded plan
}

TEST(Tuner, KeyNamesKernelShapeWorldDevice) {
  EXPECT_EQ(weave::runtime::tune_key("gemm_rs", {16384, 16384, 512}, 2, "H200_132sm"), "gemm_rs|16384x16384x512|w2|H200_132sm");
  EXPECT_EQ(weave::runtime::tune_key("gemm_rs", {1, 2}, 8, "d"), "gemm_rs|1x2|w8|d");
}

// A variant-restricted call tunes apart from an unrestricted one (neither may answer the other
// with a choice it excluded); the unrestricted name stays the plain kernel name (existing caches).
TEST(Tuner, VariantRestrictedCallsHaveTheirOwnKey) {
  EXPECT_EQ(tune_name("ag_gemm", -1), "ag_gemm");
  std::set<std::string> keys;
  for (int v = -1; v <= 6; ++v)
    EXPECT_TRUE(keys.insert(weave::runtime::tune_key(tune_name("ag_gemm", v), {4096, 2048, 4096}, 2, "d")).second) << v;
  for (int v = -1; v <= 6; ++v)  // B as N x K: apart from every K x N key
    EXPECT_TRUE(keys.insert(weave::runtime::tune_key(tune_name("ag_gemm", v, weave::gemm::BLayout::NK),
                                                     {4096, 2048, 4096}, 2, "d"))
                    .second)
        << v;
  for (int v = -1; v <= 6; ++v)  // fp8 inputs: apart from both bf16 layouts
    EXPECT_TRUE(keys.insert(weave::runtime::tune_key(tune_name("ag_gemm", v, weave::gemm::BLayout::NK, true),
                                                     {4096, 2048, 4096}, 2, "d"))
                    .second)
        << v;
}

// ag_gemm's adaptive split (v10) is a variant by number and name, capturable (its waits read device
// rounds, its ledger zeroes itself), and its cost priors are positive and grow with the unit's
// destinations; the copy-engine variants and v9 stay uncapturable.
TEST(TpHost, AgAdaptiveVariant) {
  EXPECT_EQ(kAgVariants, 11);
  EXPECT_EQ(to_int(AgVariant::Adaptive), 10);
  EXPECT_STREQ(variant_name("ag_gemm", 10), "adaptive split");
  EXPECT_STREQ(variant_name("ag_gemm", 11), "?");
  EXPECT_TRUE(capturable(AgVariant::Adaptive));
  for (AgVariant v : {AgVariant::CopyEngine, AgVariant::CopyEngineShardGemms, AgVariant::AllGatherGemm})
    EXPECT_FALSE(capturable(v)) << to_int(v);
  EXPECT_NE(std::string(capture_rule()).find("ag_gemm 0..6, 10"), std::string::npos);
  const AdaptivePriors one = ag_adaptive_priors(4096, 256 << 10, 1), two = ag_adaptive_priors(4096, 256 << 10, 2);
  EXPECT_GT(one.compute, 0);
  EXPECT_EQ(one.compute, adaptive_priors(4096, 1).compute);
  EXPECT_GT(one.comm, 0);
  EXPECT_FLOAT_EQ(two.comm, 2 * one.comm);
}

// The cross-rank check covers the options and the SM count: ranks with different variants or
// communicator SM counts would feed different signal sets, and grids are sized from the SM count.
TEST(TpHost, CheckedArgumentsIncludeTheOptions) {
  Options a, b;
  b.variant = 0;
  EXPECT_NE(checked_args(4096, 2048, 4096, a, 132), checked_args(4096, 2048, 4096, b, 132));
  b = a;
  b.num_comm_sms = 4;
  EXPECT_NE(checked_args(4096, 2048, 4096, a, 132), checked_args(4096, 2048, 4096, b, 132));
  EXPECT_NE(checked_args(4096, 2048, 4096, a, 132), checked_args(4096, 2048, 4104, a, 132));
  EXPECT_NE(checked_args(4096, 2048, 4096, a, 132), checked_args(4096, 2048, 4096, a, 114));
  EXPECT_EQ(checked_args(4096, 2048, 4096, a, 132), checked_args(4096, 2048, 4096, a, 132));
  // An fp8 rank and a bf16 rank push and read different bytes.
  EXPECT_NE(checked_args(4096, 2048, 4096, a, 132, true), checked_args(4096, 2048, 4096, a, 132, false));
}

// Operands are checked (non-null, 16-byte aligned for TMA) on the host before any cross-rank
// step, with an error that names the operand.
TEST(TpHost, OperandsNullOrMisalignedRejectedByName) {
  alignas(16) static unsigned char buf[64];
  EXPECT_NO_THROW(check_operands("gemm_rs", {{"A", buf}, {"B", buf + 16}, {"out", buf + 32}}));
  auto message = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const weave::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  std::string m = message([&] { check_operands("gemm_ar", {{"A", buf}, {"B", nullptr}, {"out", buf}}); });
  EXPECT_NE(m.find("gemm_ar: B is a null pointer"), std::string::npos) << m;
  m = message([&] { check_operands("ag_gemm", {{"a_shard", buf}, {"C", buf + 8}}); });
  EXPECT_NE(m.find("ag_gemm: C is not 16-byte aligned"), std::string::npos) << m;
}

// fp8 rows are K bytes: TMA's 16-byte pitch needs K % 16 == 0 (bf16: K % 8); the message says so.
TEST(TpHost, Fp8NeedsKMultipleOf16) {
  EXPECT_NO_THROW(validate("ag_gemm", 100, 776, 520));
  EXPECT_NO_THROW(validate("ag_gemm", 100, 776, 528, true));
  try {
    validate("gemm_rs", 100, 776, 520, true);
    ADD_FAILURE() << "K = 520 accepted for fp8";
  } catch (const weave::Error& e) {
    EXPECT_NE(std::string(e.what()).find("gemm_rs: K = 520 is not a multiple of 16"), std::string::npos) << e.what();
  }
  Inputs in;  // an fp8 operand's bytes and row offsets are in bytes of one per element
  in.fp8 = true;
  alignas(16) static unsigned char buf[4096];
  in.a = buf;
  EXPECT_EQ(in.bytes(3, 528), 3u * 528u);
  EXPECT_EQ(static_cast<const unsigned char*>(in.a_row(2, 528)), buf + 2 * 528);
  in.fp8 = false;
  EXPECT_EQ(in.bytes(3, 528), 2u * 3u * 528u);
  EXPECT_EQ(static_cast<const unsigned char*>(in.a_row(1, 528)), buf + 2 * 528);
}

// check_comm_sms rejects exactly what lcsc::make_plan rejects, so a launch never throws after it
// took its signal rounds; local_problem turns a failed local check into the rank's message.
TEST(TpHost, CommSmsCheckedLikeThePlanBeforeRoundsAreTaken) {
  for (int sms : kSms)
    for (int n : {-1, 0, 1, sms / 2, sms - 1, sms, sms + 7}) {
      weave::lcsc::Config cfg;
      cfg.num_comm_sms = n < 0 ? 0 : n;  // < 0 never reaches the plan: the tuner picks
      bool plan_ok = true;
      try {
        weave::lcsc::make_plan(1000, sms, cfg, 1, 1);
      } catch (const weave::Error&) {
        plan_ok = false;
      }
      const std::string p = weave::runtime::local_problem([&] { check_comm_sms("gemm_rs", n, sms); });
      EXPECT_EQ(p.empty(), plan_ok) << "sms " << sms << " num_comm_sms " << n << ": " << p;
      if (!p.empty()) EXPECT_NE(p.find("gemm_rs: num_comm_sms = "), std::string::npos) << p;
    }
  EXPECT_EQ(weave::runtime::local_problem([] {}), "");
}

// ag_gemm v7 copies whole row tiles in chunks of about 8 MiB (the copy engine's rate by message
// size), at least one tile per chunk.
TEST(TpHost, CopyEngineChunks) {
  using weave::tp::CopyEnginePush;
  EXPECT_EQ(CopyEnginePush::tiles_per_chunk(4096 * 2), 8);    // 1 MiB tiles
  EXPECT_EQ(CopyEnginePush::tiles_per_chunk(8192 * 2), 4);    // 2 MiB tiles
  EXPECT_EQ(CopyEnginePush::tiles_per_chunk(32768 * 2), 1);   // 8 MiB tiles
  EXPECT_EQ(CopyEnginePush::tiles_per_chunk(65536 * 2), 1);   // larger than a chunk
  EXPECT_EQ(CopyEnginePush::tiles_per_chunk(1000 * 2), 32);   // 250 KiB tiles: 32 = 8 MiB / 250 KiB, rounded down
}
