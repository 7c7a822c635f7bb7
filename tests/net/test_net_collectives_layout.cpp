// The inter-node collectives' schedule on the CPU, for N = 1..16 nodes x G in {1, 2, 4, 8} ranks
// per node, ragged sizes and several chunk sizes: each call runs on host buffers exactly as the
// host entry enqueues it (G = 1: the network phase alone; G > 1: node_phase.hpp's stages, the
// single-node collectives emulated by their row shards) and as the kernel moves bytes
// (kernels/net_collectives/layout.hpp: every piece a rank receives is exactly one piece a rail peer
// queues, same chunk id, bytes and landing offset; chunk ids and regions stay inside what the host
// entry checks; the command counts the send gate relies on match the pushes; the ring all_reduce
// runs as the kernel's blocks do, without deadlock). Results against the reference: all_gather
// writes every other shard into every rank exactly once, reduce_scatter and all_reduce sum every
// rank's input exactly once (uint32 elements of random bits, wrapping sums: a missing or doubled
// partial shows), reduce_scatter leaves the other shards as they were.
#include "net_collectives/node_phase.hpp"  // first: the headers compile as plain C++
#include "net_collectives/net_coll_fused_schedule.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace {

using namespace weave::net;
using namespace weave::net::coll;

using Elem = uint32_t;
constexpr Elem kPoison = 0xdeadbeefu;
const int kGpus[] = {1, 2, 4, 8};

Elem input(int r, long long i) {
  uint64_t x = (static_cast<uint64_t>(r) << 40) ^ static_cast<uint64_t>(i) ^ 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return static_cast<Elem>(x ^ (x >> 31));
}

const char* name(Coll c) {
  return c == Coll::all_gather ? "all_gather" : c == Coll::reduce_scatter ? "reduce_scatter" : "all_reduce";
}
std::string where(Coll c, Topo t, long long bytes, long long chunk) {
  return std::string(name(c)) + " N=" + std::to_string(t.nodes) + " G=" + std::to_string(t.gpus) +
         " bytes=" + std::to_string(bytes) + " chunk=" + std::to_string(chunk);
}

// dst[i] = a[i] + b[i] over `bytes` (whole elements), wrapping.
void add(char* dst, const char* a, const char* b, long long bytes) {
  for (long long e = 0; e < bytes / 4; ++e) {
    Elem x, y;
    std::memcpy(&x, a + 4 * e, 4);
    std::memcpy(&y, b + 4 * e, 4);
    x += y;
    std::memcpy(dst + 4 * e, &x, 4);
  }
}

// One call of `c` on every rank's host buffers.
struct Sim {
  Coll c;
  Topo t;
  Layout L;
  int W;
  long long count;
  int blocks;  // the ring kernel's grid
  std::vector<std::vector<Elem>> buf;
  std::vector<std::vector<char>> scratch, tails, send, recv;
  std::vector<std::vector<int>> copies;  // all_gather: copies into each element of each rank
  std::vector<std::map<uint32_t, int>> raised;  // per receiver: chunk id -> arrivals not consumed
  std::vector<long long> pushed;

  Sim(Coll coll, Topo topo, long long n, long long chunk, int grid)
      : c(coll), t(topo), L(make_layout(coll, topo, n * 4, chunk)), W(topo.world()), count(n), blocks(grid) {
    buf.assign(W, std::vector<Elem>(count));
    for (int r = 0; r < W; ++r) {
      const Bytes own = shard(L.plan, r);
      for (long long i = 0; i < count; ++i) {
        const bool mine = i * 4 >= own.off && i * 4 < own.off + own.size;
        buf[r][i] = c == Coll::all_gather && !mine ? kPoison : input(r, i);
      }
    }
    scratch.assign(W, std::vector<char>(scratch_needed(L) + 1, 0));
    tails.assign(W, std::vector<char>(t.gpus * 16, 0));
    send.assign(W, std::vector<char>(send_needed(L) + 1, 0));
    recv.assign(W, std::vector<char>(recv_needed(L) + 1, 0));
    copies.assign(W, std::vector<int>(count, 0));
    raised.assign(W, {});
    pushed.assign(W, 0);
  }

  char* B(int r) { return reinterpret_cast<char*>(buf[r].data()); }
  // The kernel's `src`: reduce_scatter's partials (the node scratch when staged).
  char* src(int r) { return L.staged ? scratch[r].data() : B(r); }
  void copy_into(int r, long long off, const char* from, long long bytes) {
    ASSERT_GE(off, 0);
    ASSERT_LE(off + bytes, count * 4);
    std::memcpy(B(r) + off, from, bytes);
    for (long long e = off / 4; e < (off + bytes) / 4; ++e) copies[r][e]++;
  }
  void raise(int to, uint32_t id) {
    ASSERT_LT(id, flags_needed(L));
    ASSERT_EQ(raised[to][id], 0) << "chunk " << id << " raised twice";
    raised[to][id] = 1;
  }

  // ---- the network phase ----------------------------------------------------------------------

  // all_gather / reduce_scatter: the send blocks' pieces, then the receive blocks' (every piece
  // is in the peer's slot before any receiver looks: the kernel's waits make that so).
  void net_direct() {
    const bool ag = c == Coll::all_gather;
    for (int r = 0; r < W; ++r) {
      for (int s = 0; s < steps(L); ++s)
        for (int p = 0; p < step_pieces(L, r, s); ++p) {
          const PieceCmd pc = piece_cmd(L, r, s, p);
          ASSERT_TRUE(t.rail_peers(r, pc.peer)) << r << " -> " << pc.peer;
          ASSERT_EQ(pc.src_off % 16, 0);
          ASSERT_LE(pc.src_off + pc.bytes, send_needed(L));
          ASSERT_LE(pc.dst_off + pc.bytes, recv_needed(L));
          if (!ag && L.staged) ASSERT_LE(pc.part_off + pc.bytes, scratch_needed(L));
          std::memcpy(send[r].data() + pc.src_off, ag ? B(r) + pc.data_off : src(r) + pc.part_off, pc.bytes);
          std::memcpy(recv[pc.peer].data() + pc.dst_off, send[r].data() + pc.src_off, pc.bytes);
          raise(pc.peer, pc.chunk);
          if (::testing::Test::HasFatalFailure()) return;
          ++pushed[r];
        }
      ASSERT_EQ(pushed[r], commands(L, r)) << "rank " << r;
    }
    for (int r = 0; r < W; ++r) {
      if (ag) {
        for (int s = 0; s < steps(L); ++s)
          for (int p = 0; p < recv_pieces(L, r, s); ++p) {
            const PieceRecv v = piece_recv(L, r, s, p);
            ASSERT_EQ(raised[r][v.chunk], 1) << "chunk " << v.chunk;
            copy_into(r, v.data_off, recv[r].data() + v.recv_off, v.bytes);
            raised[r][v.chunk] = 0;
          }
      } else {
        const int np = steps(L) ? recv_pieces(L, r, 0) : 0;
        for (int p = 0; p < np; ++p) {
          const PieceRecv v0 = piece_recv(L, r, 0, p);
          if (L.staged) ASSERT_LE(v0.part_off + v0.bytes, scratch_needed(L));
          std::vector<char> acc(src(r) + v0.part_off, src(r) + v0.part_off + v0.bytes);
          for (int s = 0; s < steps(L); ++s) {
            const PieceRecv v = piece_recv(L, r, s, p);
            ASSERT_EQ(recv_pieces(L, r, s), np);
            ASSERT_EQ(v.data_off, v0.data_off);
            ASSERT_EQ(raised[r][v.chunk], 1) << "chunk " << v.chunk;
            add(acc.data(), acc.data(), recv[r].data() + v.recv_off, v.bytes);
            raised[r][v.chunk] = 0;
          }
          std::memcpy(B(r) + v0.data_off, acc.data(), v0.bytes);
        }
      }
    }
  }

  // all_reduce: the ring kernel's `blocks` blocks per rank: block b takes items b, b + blocks, ...
  // in order, each a small state machine that advances once its arrival is there, and a block
  // moves to its next item only when the current one is done (a wait blocks it). No block may be
  // left stuck (a deadlock would leave one).
  void net_ring() {
    const int N = t.nodes;
    for (int r = 0; r < W; ++r)
      for (int s = 0; s < N - 1; ++s) {  // hierarchy's net_rs step s sends sub-chunk n - s, net_ag n + 1 - s
        const int first = phase_steps(c, t, Phase::intra_rs);
        const Xfer rs = weave::net::send(L.plan, r, first + s, 0), ag = weave::net::send(L.plan, r, first + N - 1 + s, 0);
        ASSERT_EQ(rs.dst, t.rail_peer(r, 1));
        ASSERT_EQ(ag.dst, t.rail_peer(r, 1));
        ASSERT_EQ(rs.off, ring_sub_of(L, r, (t.node(r) - s + N) % N).off);
        ASSERT_EQ(ag.off, ring_sub_of(L, r, (t.node(r) + 1 - s + N) % N).off);
      }
    const auto deliver = [&](int r, int which, int cc, int p, const Bytes& pc) {
      const int to = t.rail_peer(r, 1);
      const long long off = ring_slot_off(L, r, which, pc);
      ASSERT_GE(off, which * ring_area(L));
      ASSERT_LE(off + pc.size, (which + 1) * ring_area(L));
      std::memcpy(recv[to].data() + off, send[r].data() + off, pc.size);
      raise(to, ring_chunk_id(L, which, cc, p));
      ++pushed[r];
    };
    std::vector<std::vector<int>> state(W);
    std::vector<std::vector<long long>> current(W, std::vector<long long>(blocks));
    for (int r = 0; r < W; ++r) {
      state[r].assign(ring_items(L, r), 0);
      for (int b = 0; b < blocks; ++b) current[r][b] = b;
    }
    for (bool progress = true; progress;) {
      progress = false;
      for (int r = 0; r < W; ++r)
        for (int b = 0; b < blocks; ++b) {
          const long long j = current[r][b];
          if (j >= ring_items(L, r)) continue;
          int cc, p;
          ring_item(L, r, j, &cc, &p);
          const Bytes pc = ring_piece(L, r, cc, p);
          const int d = ring_dist(L, r, cc), e = (d + 1) % N;
          char* data = B(r) + pc.off;
          const long long sums = ring_slot_off(L, r, 0, pc), results = ring_slot_off(L, r, 1, pc);
          if (state[r][j] == 0) {
            const uint32_t id = ring_chunk_id(L, 0, cc, p);
            if (d == 0) {
              std::memcpy(send[r].data() + sums, data, pc.size);
            } else {
              if (!raised[r][id]) continue;
              if (d <= N - 2) {
                add(send[r].data() + sums, data, recv[r].data() + sums, pc.size);
              } else {
                add(send[r].data() + results, data, recv[r].data() + sums, pc.size);
                std::memcpy(data, send[r].data() + results, pc.size);
              }
              raised[r][id] = 0;  // consumed
            }
            deliver(r, d <= N - 2 ? 0 : 1, cc, p, pc);
            if (::testing::Test::HasFatalFailure()) return;
            state[r][j] = 1;
            progress = true;
          }
          if (state[r][j] == 1) {
            if (e == 0) {
              state[r][j] = 2;
            } else {
              const uint32_t id = ring_chunk_id(L, 1, cc, p);
              if (!raised[r][id]) continue;
              std::memcpy(data, recv[r].data() + results, pc.size);
              if (e <= N - 2) {
                std::memcpy(send[r].data() + results, recv[r].data() + results, pc.size);
                deliver(r, 1, cc, p, pc);
                if (::testing::Test::HasFatalFailure()) return;
              }
              raised[r][id] = 0;
              state[r][j] = 2;
              progress = true;
            }
          }
          if (state[r][j] == 2) current[r][b] += blocks;
        }
    }
    for (int r = 0; r < W; ++r) {
      for (size_t j = 0; j < state[r].size(); ++j) ASSERT_EQ(state[r][j], 2) << "rank " << r << " item " << j << " stuck";
      ASSERT_EQ(pushed[r], commands(L, r)) << "rank " << r;
    }
  }

  void net() { c == Coll::all_reduce ? net_ring() : net_direct(); }

  // ---- the NVLink stages (G > 1), the single-node collectives by their row shards ---------------

  char* at(int r, const Place& p, long long bytes) {
    const long long cap = p.where == Where::buffer ? count * 4 : p.where == Where::scratch ? scratch_needed(L) : t.gpus * 16;
    EXPECT_GE(p.off, 0);
    EXPECT_LE(p.off + bytes, cap) << "rank " << r << " past its region " << static_cast<int>(p.where);
    return (p.where == Where::buffer ? B(r) : p.where == Where::scratch ? scratch[r].data() : tails[r].data()) + p.off;
  }

  // A single-node collective's pointer: it checks a byte there even for an empty shard.
  char* arg(int r, const Place& p, long long bytes) { return at(r, p, bytes > 0 ? bytes : 1); }

  void run_stage(int i) {
    const Stage s0 = stage(L, 0, i);
    if (s0.op == StageOp::net) return net();
    for (int n = 0; n < t.nodes; ++n) {
      const auto rank = [&](int l) { return t.rank(n, l); };
      std::vector<Stage> st(t.gpus);
      for (int l = 0; l < t.gpus; ++l) {
        st[l] = stage(L, rank(l), i);
        ASSERT_EQ(st[l].op, s0.op);
        if (s0.op == StageOp::copy) continue;  // each rank's own
        // One call of the node's single-node collectives: the same arguments on every rank of the
        // node; all_reduce's output at the same offset (its two-shot writes peers' outputs).
        ASSERT_EQ(st[l].rows.off, s0.rows.off);
        ASSERT_EQ(st[l].rows.rows, s0.rows.rows);
        ASSERT_EQ(st[l].tail.off, s0.tail.off);
        ASSERT_EQ(st[l].tail.size, s0.tail.size);
        if (s0.op == StageOp::tail_sum) {
          ASSERT_EQ(st[l].out.where, stage(L, rank(0), i).out.where);
          ASSERT_EQ(st[l].out.off, stage(L, rank(0), i).out.off);
        }
      }
      // Empty calls are skipped on every rank alike (the host entry does).
      const bool rows = s0.op == StageOp::ag_rows || s0.op == StageOp::rs_rows;
      if (rows ? s0.rows.rows == 0 : s0.op != StageOp::copy && s0.tail.size == 0) continue;
      if (s0.op == StageOp::ag_rows) {
        for (int l = 0; l < t.gpus; ++l) {
          const Bytes sh = row_shard(s0.rows, t.gpus, l);
          const char* in = arg(rank(l), st[l].in, sh.size);
          arg(rank(l), st[l].out, s0.rows.rows * 16);
          if (::testing::Test::HasFailure()) return;
          ASSERT_TRUE(sh.size == 0 || (st[l].in.where == Where::buffer && st[l].in.off == sh.off));  // in place
          for (int j = 0; j < t.gpus; ++j)
            if (j != l) copy_into(rank(j), sh.off, in, sh.size);
        }
      } else if (s0.op == StageOp::rs_rows || s0.op == StageOp::tail_sum) {
        std::vector<std::vector<char>> sum(t.gpus);
        for (int l = 0; l < t.gpus; ++l) {
          const Bytes in = s0.op == StageOp::rs_rows ? row_shard(s0.rows, t.gpus, l) : s0.tail;
          if (s0.op == StageOp::rs_rows) arg(rank(l), st[l].in, s0.rows.rows * 16);
          ASSERT_LE(in.off + in.size, count * 4);
          sum[l].assign(in.size, 0);
          for (int j = 0; j < t.gpus; ++j) add(sum[l].data(), sum[l].data(), B(rank(j)) + in.off, in.size);
        }
        for (int l = 0; l < t.gpus; ++l) {
          char* out = arg(rank(l), st[l].out, sum[l].size());
          if (::testing::Test::HasFailure()) return;
          std::memcpy(out, sum[l].data(), sum[l].size());
        }
      } else if (s0.op == StageOp::tail_from_last) {
        ASSERT_LT(s0.tail.size, 16);
        ASSERT_EQ(s0.tail.off + s0.tail.size, count * 4);
        for (int j = 0; j < t.gpus - 1; ++j)
          copy_into(rank(j), s0.tail.off, B(rank(t.gpus - 1)) + s0.tail.off, s0.tail.size);
      } else {
        ASSERT_EQ(s0.op, StageOp::copy);
        for (int l = 0; l < t.gpus; ++l) {
          const char* from = at(rank(l), st[l].in, st[l].size);
          char* to = at(rank(l), st[l].out, st[l].size);
          if (::testing::Test::HasFailure()) return;
          std::memmove(to, from, st[l].size);
        }
      }
    }
  }

  void run() {
    if (count == 0 || W == 1) return;  // the host entry launches nothing
    if (t.gpus == 1) return net();
    ASSERT_EQ(L.staged, c == Coll::reduce_scatter);
    for (int i = 0; i < num_stages(L); ++i) {
      for (int r = 1; r < W; ++r) ASSERT_EQ(stage(L, r, i).op, stage(L, 0, i).op) << "stage " << i;
      run_stage(i);
      if (::testing::Test::HasFailure()) return;
    }
  }

  void check() {
    for (int r = 0; r < W; ++r) {
      for (const auto& [id, v] : raised[r]) ASSERT_EQ(v, 0) << "rank " << r << " chunk " << id << " never consumed";
      const Bytes own = shard(L.plan, r);
      for (long long i = 0; i < count; ++i) {
        Elem want = 0;
        if (c == Coll::all_gather) {
          int owner = 0;
          for (int q = 0; q < W; ++q) {
            const Bytes sh = shard(L.plan, q);
            if (i * 4 >= sh.off && i * 4 < sh.off + sh.size) owner = q;
          }
          want = input(owner, i);
          ASSERT_EQ(copies[r][i], owner == r ? 0 : 1) << "rank " << r << " element " << i << " (owner " << owner << ")";
        } else if (c == Coll::reduce_scatter && (i * 4 < own.off || i * 4 >= own.off + own.size)) {
          want = input(r, i);
        } else {
          for (int q = 0; q < W; ++q) want += input(q, i);
        }
        ASSERT_EQ(buf[r][i], want) << "rank " << r << " element " << i;
      }
    }
  }
};

void simulate(Coll c, Topo t, long long count, long long chunk, int blocks) {
  SCOPED_TRACE(where(c, t, count * 4, chunk) + " blocks=" + std::to_string(blocks));
  Sim s(c, t, count, chunk, blocks);
  s.run();
  if (::testing::Test::HasFailure()) return;
  s.check();
}

TEST(NetCollectivesLayout, EveryCollectiveMatchesTheReference) {
  for (int N = 1; N <= 16; ++N)
    for (int G : kGpus)
      for (long long count : {0LL, 1LL, 3LL, 4LL, 37LL, 1000LL, 4099LL, 65536LL + 5})
        for (long long chunk : {16LL, 256LL, 4096LL, 1LL << 20}) {
          const long long pieces = count * 4 / chunk;
          // Keeps the run short: the largest sizes and finest chunks at up to 16 ranks.
          if (pieces > 5000 || (N * G > 16 && (pieces > 64 || count > 1000))) continue;
          for (Coll c : {Coll::all_gather, Coll::reduce_scatter, Coll::all_reduce})
            for (int blocks : {1, 3, 12}) {
              // The grid matters to the ring only; its block schedule is the same at any G.
              if ((c != Coll::all_reduce || G > 1) && blocks != (c == Coll::all_reduce ? 3 : 1)) continue;
              simulate(c, Topo{N, G}, count, chunk, blocks);
              if (HasFailure()) return;
            }
        }
}

// The single-node collectives' row shards are the network phase's shards: node m's block split
// over the node's G ranks gives shards (m, 0 .. G - 1), the whole buffer's rows give the node
// parts; only the tail (under 16 bytes, the last rank's) is left out.
TEST(NetCollectivesLayout, NodeRowsAreTheShards) {
  for (int N = 1; N <= 16; ++N)
    for (int G : kGpus) {
      const Topo t{N, G};
      for (long long bytes = 0; bytes <= 16 * N * G * 3 + 40; bytes += 4) {
        const Layout L = make_layout(Coll::all_gather, t, bytes, 64);
        const Bytes tl = tail(L);
        ASSERT_LT(tl.size, 16);
        ASSERT_EQ(tl.off + tl.size, bytes);
        ASSERT_EQ(tl.off % 16, 0);
        for (int r = 0; r < t.world(); ++r) {
          const Bytes sh = shard(L.plan, r), rs = row_shard(node_block(L, t.node(r)), G, t.local(r));
          ASSERT_EQ(rs.off, sh.off) << "N=" << N << " G=" << G << " bytes=" << bytes << " rank " << r;
          ASSERT_EQ(rs.size, sh.size - (r == t.world() - 1 ? tl.size : 0)) << "N=" << N << " G=" << G << " rank " << r;
        }
        for (int l = 0; l < G; ++l) {
          const Bytes part = node_part(L.plan, l), rs = row_shard(all_rows(L), G, l);
          ASSERT_EQ(rs.off, part.off);
          ASSERT_EQ(rs.size, part.size - (l == G - 1 ? tl.size : 0));
        }
      }
    }
}

// Every rank hears from every rail peer in every call, even with empty shards: the slot reuse
// rule needs it.
TEST(NetCollectivesLayout, EveryRankHearsFromEveryRailPeer) {
  for (Coll c : {Coll::all_gather, Coll::reduce_scatter})
    for (int N = 2; N <= 16; ++N)
      for (int G : kGpus)
        for (long long bytes : {0LL, 4LL, 16LL, 48LL}) {
          const Topo t{N, G};
          const Layout L = make_layout(c, t, bytes, 64);
          for (int r = 0; r < t.world(); ++r) {
            std::set<int> senders;
            for (int s = 0; s < steps(L); ++s) {
              ASSERT_GE(recv_pieces(L, r, s), 1);
              const int q = piece_recv(L, r, s, 0).sender;
              ASSERT_TRUE(t.rail_peers(q, r));
              senders.insert(q);
            }
            ASSERT_EQ(static_cast<int>(senders.size()), N - 1) << where(c, t, bytes, 64);
          }
        }
}

// ---- the fused kernel's schedule (net_coll_fused_schedule.hpp) ----------------------------------
// Every rank's roles as tasks on host buffers: node_reduce and node_gather per item, the network
// per piece (all_reduce: the ring's item between the N rail peers as one task; the others: each
// send and each receive, through receive slots and arrival flags at layout.hpp's offsets). A task
// runs only once the counter or flags it waits for are raised, in a random order among those that
// may run; a pass that runs none with tasks left is a deadlock. Every output element of every rank
// must be written exactly once (node peers' writes included) and hold the reference.
struct FusedSim {
  Coll c;
  Topo t;
  Layout L;
  long long count;
  std::vector<std::vector<Elem>> buf, scratch, slot, in;
  std::vector<std::vector<int>> counters, written, flags;
  std::vector<std::pair<std::string, std::function<bool()>>> tasks;  // false: may not run yet

  FusedSim(Coll c_, Topo t_, long long count_, long long chunk) : c(c_), t(t_), count(count_) {
    L = make_layout(c, t, count * 4, chunk);
    const int W = t.world();
    buf.resize(W), scratch.resize(W), slot.resize(W), counters.resize(W), written.resize(W), flags.resize(W);
    for (int r = 0; r < W; ++r) {
      const Bytes own = shard(L.plan, r);
      for (long long i = 0; i < count; ++i) {
        const bool mine = i * 4 >= own.off && i * 4 < own.off + own.size;
        buf[r].push_back(c == Coll::all_gather && !mine ? kPoison : input(r, i));
      }
      scratch[r].assign(scratch_needed(L) / 4, kPoison);
      slot[r].assign(recv_needed(L) / 4 + 1, kPoison);
      counters[r].assign(fused_counters(L), 0);
      written[r].assign(count, 0);
      flags[r].assign(flags_needed(L), 0);
    }
    in = buf;
  }
  Elem* at(int r, long long byte_off) { return buf[r].data() + byte_off / 4; }
  void write(int r, long long off, const Elem* src, long long bytes) {
    for (long long i = 0; i < bytes / 4; ++i) at(r, off)[i] = src[i], ++written[r][off / 4 + i];
  }

  void add_tasks() {
    const int W = t.world(), N = t.nodes, G = t.gpus;
    for (int r = 0; r < W; ++r) {
      const int n = t.node(r), l = t.local(r);
      for (long long j = 0; j < fused_items(L, r); ++j) {
        const FusedItem it = fused_item(L, r, j);
        if (c != Coll::all_gather)
          tasks.push_back({"node_reduce", [=, this] {
                             std::vector<Elem> sum(it.src.size / 4, 0);
                             for (int d = 0; d < G; ++d)
                               for (size_t i = 0; i < sum.size(); ++i) sum[i] += at(t.rank(n, d), it.src.off)[i];
                             if (c == Coll::all_reduce) {
                               EXPECT_EQ(it.dst, it.src.off);
                               for (size_t i = 0; i < sum.size(); ++i) at(r, it.dst)[i] = sum[i];
                               if (N == 1) for (size_t i = 0; i < sum.size(); ++i) ++written[r][it.dst / 4 + i];
                             } else {
                               EXPECT_LE(it.dst + it.src.size, scratch_needed(L));
                               std::copy(sum.begin(), sum.end(), scratch[r].begin() + it.dst / 4);
                             }
                             counters[r][ready_counter(L, j)] = 1;
                             return true;
                           }});
        if (c != Coll::reduce_scatter)
          tasks.push_back({"node_gather", [=, this] {
                             if (c == Coll::all_reduce && !counters[r][N > 1 ? result_counter(L, j) : ready_counter(L, j)])
                               return false;
                             const std::vector<Elem> v(at(r, it.src.off), at(r, it.src.off) + it.src.size / 4);
                             for (int d = 0; d < G; ++d)
                               if (d != l) write(t.rank(n, d), it.src.off, v.data(), it.src.size);
                             return true;
                           }});
        if (c == Coll::all_reduce && N > 1 && n == 0)  // the ring of item j between the rail peers
          tasks.push_back({"ring", [=, this] {
                             for (int m = 0; m < N; ++m)
                               if (!counters[t.rank(m, l)][ready_counter(L, j)]) return false;
                             std::vector<Elem> sum(it.src.size / 4, 0);
                             for (int m = 0; m < N; ++m) {
                               const FusedItem o = fused_item(L, t.rank(m, l), j);
                               EXPECT_EQ(o.src.off, it.src.off);
                               EXPECT_EQ(o.src.size, it.src.size);
                               for (size_t i = 0; i < sum.size(); ++i) sum[i] += at(t.rank(m, l), it.src.off)[i];
                             }
                             for (int m = 0; m < N; ++m) {
                               write(t.rank(m, l), it.src.off, sum.data(), it.src.size);
                               counters[t.rank(m, l)][result_counter(L, j)] = 1;
                             }
                             return true;
                           }});
        if (c == Coll::reduce_scatter && j < commands(L, r)) {  // the send of command j
          EXPECT_EQ(rs_item_pieces(L, r, it.step), step_pieces(L, r, it.step));
          tasks.push_back({"send", [=, this] {
                             if (!counters[r][ready_counter(L, j)]) return false;
                             const PieceCmd pc = piece_cmd(L, r, it.step, it.piece);
                             EXPECT_EQ(pc.part_off, it.dst);
                             std::copy_n(scratch[r].begin() + pc.part_off / 4, pc.bytes / 4,
                                         slot[pc.peer].begin() + pc.dst_off / 4);
                             ++flags[pc.peer][pc.chunk];
                             return true;
                           }});
        }
      }
      if (c == Coll::reduce_scatter)
        for (int p = 0; p < pieces(L, shard(L.plan, r).size); ++p)
          tasks.push_back({"recv", [=, this] {
                             if (!counters[r][ready_counter(L, own_item(L, r, p))]) return false;
                             for (int s = 0; s < N - 1; ++s)
                               if (!flags[r][piece_recv(L, r, s, p).chunk]) return false;
                             const Bytes sh = shard(L.plan, r), pc = piece_of(L, sh.size, p);
                             std::vector<Elem> sum(scratch[r].begin() + partial_off(L, r, pc.off) / 4,
                                                   scratch[r].begin() + (partial_off(L, r, pc.off) + pc.size) / 4);
                             for (int s = 0; s < N - 1; ++s)
                               for (size_t i = 0; i < sum.size(); ++i)
                                 sum[i] += slot[r][piece_recv(L, r, s, p).recv_off / 4 + i];
                             write(r, sh.off + pc.off, sum.data(), pc.size);
                             return true;
                           }});
      if (c == Coll::all_gather && N > 1)
        for (int s = 0; s < steps(L); ++s) {
          for (int p = 0; p < step_pieces(L, r, 0); ++p)
            tasks.push_back({"send", [=, this] {
                               const PieceCmd pc = piece_cmd(L, r, s, p);
                               std::copy_n(at(r, pc.data_off), pc.bytes / 4, slot[pc.peer].begin() + pc.dst_off / 4);
                               ++flags[pc.peer][pc.chunk];
                               return true;
                             }});
          for (int p = 0; p < recv_pieces(L, r, s); ++p)
            tasks.push_back({"recv", [=, this] {
                               const PieceRecv v = piece_recv(L, r, s, p);
                               if (!flags[r][v.chunk]) return false;
                               for (int d = 0; d < G; ++d)
                                 write(t.rank(n, d), v.data_off, slot[r].data() + v.recv_off / 4, v.bytes);
                               return true;
                             }});
        }
    }
  }

  void run(uint64_t seed) {
    add_tasks();
    std::mt19937_64 rng(seed);
    while (!tasks.empty()) {
      std::shuffle(tasks.begin(), tasks.end(), rng);
      const size_t before = tasks.size();
      std::vector<std::pair<std::string, std::function<bool()>>> left;
      for (auto& task : tasks)
        if (!task.second()) left.push_back(std::move(task));
      tasks = std::move(left);
      ASSERT_LT(tasks.size(), before) << "no task may run: " << tasks.front().first << " waits forever";
    }
  }

  void check() {
    const int W = t.world();
    for (int r = 0; r < W; ++r) {
      const Bytes own = shard(L.plan, r);
      for (long long i = 0; i < count; ++i) {
        const bool mine = i * 4 >= own.off && i * 4 < own.off + own.size;
        Elem want = 0;
        int writes = 1;
        if (c == Coll::all_gather) {
          int owner = 0;
          for (int q = 0; q < W; ++q)
            if (i * 4 >= shard(L.plan, q).off && i * 4 < shard(L.plan, q).off + shard(L.plan, q).size) owner = q;
          want = in[owner][i];
          writes = mine ? 0 : 1;
        } else if (c == Coll::reduce_scatter && !mine) {
          want = in[r][i];
          writes = 0;
        } else {
          for (int q = 0; q < W; ++q) want += in[q][i];
        }
        ASSERT_EQ(written[r][i], writes) << "rank " << r << " element " << i;
        ASSERT_EQ(buf[r][i], want) << "rank " << r << " element " << i;
      }
    }
  }
};

TEST(NetCollectivesLayout, FusedScheduleMatchesTheReference) {
  for (int N = 1; N <= 16; ++N)
    for (int G : {2, 4, 8})
      for (long long count : {0LL, 1LL, 3LL, 4LL, 37LL, 1000LL, 4099LL})
        for (long long chunk : {16LL, 256LL, 4096LL}) {
          if (count * 4 / chunk > 300 || (N * G > 32 && count * 4 / chunk > 16)) continue;
          for (Coll c : {Coll::all_gather, Coll::reduce_scatter, Coll::all_reduce}) {
            SCOPED_TRACE(std::string("fused ") + where(c, Topo{N, G}, count * 4, chunk));
            FusedSim s(c, Topo{N, G}, count, chunk);
            s.run(static_cast<uint64_t>(N * 131 + G * 17 + count + chunk));
            if (HasFailure()) return;
            s.check();
            if (HasFailure()) return;
          }
        }
}

// The roles split the grid as the host entry launches it: the network blocks as at G = 1, every
// block in exactly one role, the NVLink roles a collective needs non-empty wherever roles_fit.
// The fused kernel's done counter runs over an object's calls of every kind: each call must add
// the same count on every node rank (every block signals once), so that call k of a mixed sequence
// (all_gather, reduce_scatter, all_reduce in any order, as TwoHundredBackToBackCallsEachChecked
// calls them) waits for exactly its own and the earlier calls' signals.
TEST(NetCollectivesLayout, FusedDoneCountsMixedCollectives) {
  std::mt19937 rng(7);
  for (int G : {2, 4, 8})
    for (int grid : {12, 78, 132}) {
      unsigned long long counter = 0;
      for (unsigned long long round = 1; round <= 40; ++round) {
        const Coll c = static_cast<Coll>(rng() % 3);
        const FusedRoles f = fused_roles(c, grid, 4, 8);
        ASSERT_EQ(f.grid(), grid) << name(c);
        // Every block of every node rank signals done once.
        counter += static_cast<unsigned long long>(G) * static_cast<unsigned long long>(f.grid());
        ASSERT_EQ(done_expected(round, G, grid), counter) << name(c) << " call " << round;
      }
    }
}

TEST(NetCollectivesLayout, FusedRolesSplitTheGrid) {
  for (Coll c : {Coll::all_gather, Coll::reduce_scatter, Coll::all_reduce})
    for (int grid : {3, 4, 12, 78, 132})
      for (int sb : {1, 4, 32})
        for (int rb : {1, 8, 32}) {
          const FusedRoles f = fused_roles(c, grid, sb, rb);
          const bool fit = roles_fit(c, f);
          ASSERT_EQ(fit, grid - sb - rb >= (c == Coll::all_reduce ? 2 : 1)) << name(c) << " grid " << grid;
          if (!fit) continue;
          ASSERT_EQ(f.grid(), grid);
          ASSERT_EQ(f.net(), sb + rb);
          ASSERT_EQ(c == Coll::all_reduce ? f.ring : f.send + f.recv, sb + rb);
        }
}

}  // namespace
