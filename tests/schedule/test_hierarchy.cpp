// The hierarchical (multi-node) schedules of kernels/net_common/hierarchy.hpp, executed on the CPU
// for every N = 1..16 nodes and G in {1, 2, 4, 8} GPUs per node, ragged sizes included:
// - all_reduce / all_gather / reduce_scatter: every step's transfers applied to per-rank host
//   buffers give the collective's definition; every network transfer is between rail peers, every
//   NVLink transfer inside a node; no transfer of a step reads or writes what another of the same
//   step writes; each byte crosses the network 2(N-1) (all_reduce) or N-1 times, and for
//   all_gather / reduce_scatter a node's share goes to every other node exactly once; N = 1 is the
//   single-node two-shot / direct schedule (collectives/plan.hpp) with no network step.
// - AG+GEMM / GEMM+RS tile orders: every output tile once per rank; remote chunks consumed in the
//   order they are sent (AG+GEMM) or sent in the order they are completed (GEMM+RS); N = 1 is the
//   single-node order (tp_common/schedule.hpp's item / rs_chain_item).
// - ring attention: every rank attends to every K/V slice once, each slice on hand when needed,
//   one network crossing into every other node, at most 4 slices held at a time.
#include "net_common/hierarchy.hpp"  // first: the header compiles as plain C++, without CUDA headers

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include "collectives/plan.hpp"
#include "tp_common/schedule.hpp"

using namespace weave::net;

namespace {

const int kGpus[] = {1, 2, 4, 8};
constexpr int kMaxNodes = 16;

template <class F>
void for_each_topo(F&& f) {
  for (int N = 1; N <= kMaxNodes; ++N)
    for (int G : kGpus) f(Topo{N, G});
}

TEST(Hierarchy, Topology) {
  for_each_topo([](const Topo& t) {
    for (int r = 0; r < t.world(); ++r) {
      ASSERT_EQ(t.rank(t.node(r), t.local(r)), r);
      std::set<int> rails;
      for (int k = 1; k < t.nodes; ++k) {
        const int p = t.rail_peer(r, k);
        ASSERT_TRUE(t.rail_peers(r, p));
        ASSERT_FALSE(t.same_node(r, p));
        ASSERT_EQ(t.rail_peer(p, -k), r);
        rails.insert(p);
      }
      ASSERT_EQ(static_cast<int>(rails.size()), t.nodes - 1);
      for (int m = 0; m < t.nodes; ++m) ASSERT_EQ(t.local(t.rail_peer_on(r, m)), t.local(r));
    }
  });
}

// ---- collectives -----------------------------------------------------------------------------

// Executes plan p on per-rank uint32 buffers (sums wrap: exact in any order).
struct CollSim {
  const CollPlan& p;
  std::vector<std::vector<uint32_t>> buf;
  std::vector<int> crossings;                // per element
  std::map<std::pair<int, int>, long long> node_bytes;  // network bytes (source node, destination node)

  explicit CollSim(const CollPlan& plan) : p(plan), crossings(plan.bytes / 4, 0) {}

  void step(int s) {
    const Topo& t = p.topo;
    std::vector<Xfer> xs;
    for (int r = 0; r < t.world(); ++r) {
      const int n = num_xfers(p, s);
      int dst = -1;
      for (int i = 0; i < n; ++i) {
        const Xfer x = send(p, r, s, i);
        ASSERT_EQ(x.src, r);
        ASSERT_NE(x.dst, r);
        if (dst >= 0) {
          ASSERT_EQ(x.dst, dst) << "one peer per rank and step";
        }
        dst = x.dst;
        ASSERT_TRUE(x.link == Link::network ? t.rail_peers(x.src, x.dst) : t.same_node(x.src, x.dst))
            << x.src << " -> " << x.dst;
        ASSERT_GE(x.bytes, 0);
        ASSERT_GE(x.off, 0);
        ASSERT_LE(x.off + x.bytes, p.bytes);
        ASSERT_EQ(x.off % p.unit, 0);
        ASSERT_EQ(x.bytes % 4, 0);
        xs.push_back(x);
      }
    }
    // The receive side: recv_from names the one rank whose sends land here.
    for (int r = 0; r < t.world(); ++r) {
      const int q = recv_from(p, r, s);
      for (const Xfer& x : xs) ASSERT_EQ(x.dst == r, x.src == q) << "rank " << r << " step " << s;
      for (int i = 0; i < num_xfers(p, s); ++i) {
        const Xfer a = recv(p, r, s, i), b = send(p, q, s, i);
        ASSERT_EQ(a.dst, r);
        ASSERT_EQ(a.off, b.off);
      }
    }
    // Independence inside a step: on each rank, what is written is disjoint from everything else
    // read or written in the step.
    for (int r = 0; r < t.world(); ++r) {
      std::vector<std::tuple<long long, long long, bool>> iv;  // [a, b), written
      for (const Xfer& x : xs) {
        if (x.bytes == 0) continue;
        if (x.dst == r) iv.emplace_back(x.off, x.off + x.bytes, true);
        if (x.src == r) iv.emplace_back(x.off, x.off + x.bytes, false);
      }
      for (size_t i = 0; i < iv.size(); ++i)
        for (size_t j = i + 1; j < iv.size(); ++j) {
          const auto [a0, a1, aw] = iv[i];
          const auto [b0, b1, bw] = iv[j];
          ASSERT_TRUE(!(aw || bw) || a1 <= b0 || b1 <= a0) << "rank " << r << " step " << s << ": overlap";
        }
    }
    // Apply: sources read before any destination is written (the step's transfers run together).
    std::vector<std::vector<uint32_t>> data;
    for (const Xfer& x : xs)
      data.emplace_back(buf[x.src].begin() + x.off / 4, buf[x.src].begin() + (x.off + x.bytes) / 4);
    for (size_t i = 0; i < xs.size(); ++i) {
      const Xfer& x = xs[i];
      for (size_t e = 0; e < data[i].size(); ++e) {
        uint32_t& d = buf[x.dst][x.off / 4 + e];
        d = x.op == Op::copy ? data[i][e] : d + data[i][e];
        if (x.link == Link::network) crossings[x.off / 4 + e]++;
      }
      if (x.link == Link::network) node_bytes[{t.node(x.src), t.node(x.dst)}] += x.bytes;
    }
  }
  void run() {
    for (int s = 0; s < num_steps(p.coll, p.topo); ++s) {
      step(s);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
};

std::vector<long long> byte_counts(const Topo& t, long long unit) {
  const long long W = t.world();
  return {0, 4, unit, 12 + unit, unit * W, unit * W * 3 + 8, 4 * (W * 7 + 5), unit * (2 * W + 3) + 12, 4 * W - 4};
}

void check_collective(Coll c, const Topo& t, long long bytes, long long unit, std::mt19937& rng) {
  SCOPED_TRACE(::testing::Message() << "coll " << static_cast<int>(c) << " N " << t.nodes << " G " << t.gpus
                                    << " bytes " << bytes << " unit " << unit);
  const CollPlan p{c, t, bytes, unit};
  const int W = t.world();
  const long long E = bytes / 4;
  ASSERT_EQ(num_steps(c, t), c == Coll::all_reduce ? 2 * (t.gpus - 1) + 2 * (t.nodes - 1)
                                                   : (t.gpus - 1) + (t.nodes - 1));
  // The pieces of the split tile the buffer.
  long long at = 0;
  for (int q = 0; q < W; ++q) {
    const Bytes b = shard(p, q);
    ASSERT_EQ(b.off, at);
    at += b.size;
  }
  ASSERT_EQ(at, bytes);

  CollSim sim(p);
  std::vector<std::vector<uint32_t>> in(W, std::vector<uint32_t>(E));
  for (auto& v : in)
    for (auto& e : v) e = static_cast<uint32_t>(rng());
  std::vector<uint32_t> full(E);  // all_gather's result
  for (auto& e : full) e = static_cast<uint32_t>(rng());
  sim.buf = in;
  if (c == Coll::all_gather)
    for (int r = 0; r < W; ++r) {
      const Bytes b = shard(p, r);
      std::fill(sim.buf[r].begin(), sim.buf[r].end(), 0xdeadbeefu);
      std::copy(full.begin() + b.off / 4, full.begin() + (b.off + b.size) / 4, sim.buf[r].begin() + b.off / 4);
    }
  sim.run();
  if (::testing::Test::HasFatalFailure()) return;

  for (long long e = 0; e < E; ++e) {
    uint32_t sum = 0;
    for (int r = 0; r < W; ++r) sum += in[r][e];
    for (int r = 0; r < W && c != Coll::reduce_scatter; ++r)
      ASSERT_EQ(sim.buf[r][e], c == Coll::all_reduce ? sum : full[e]) << "rank " << r << " element " << e;
    ASSERT_EQ(sim.crossings[e], net_crossings(c, t)) << "element " << e;
  }
  if (c == Coll::reduce_scatter)
    for (int r = 0; r < W; ++r) {
      const Bytes b = shard(p, r);
      for (long long e = b.off / 4; e < (b.off + b.size) / 4; ++e) {
        uint32_t sum = 0;
        for (int q = 0; q < W; ++q) sum += in[q][e];
        ASSERT_EQ(sim.buf[r][e], sum) << "rank " << r << " element " << e;
      }
    }
  // The node's share crosses once per direction: all_gather sends node a's shards to every other
  // node once, reduce_scatter sends node a's partial of node b's shards to b once.
  if (c != Coll::all_reduce)
    for (int a = 0; a < t.nodes; ++a)
      for (int b = 0; b < t.nodes; ++b) {
        if (a == b) continue;
        long long share = 0;
        for (int l = 0; l < t.gpus; ++l) share += shard(p, t.rank(c == Coll::all_gather ? a : b, l)).size;
        ASSERT_EQ(sim.node_bytes[std::make_pair(a, b)], share) << "node " << a << " -> " << b;
      }
  // N = 1: no network step, and the single-node schedules' ranges and peer order.
  if (t.nodes == 1) {
    for (int s = 0; s < num_steps(c, t); ++s)
      for (int r = 0; r < W; ++r) ASSERT_EQ(send(p, r, s, 0).link, Link::nvlink);
    for (int r = 0; r < W; ++r) {
      if (c == Coll::all_reduce && unit == 16) {  // two-shot: rank r's share of every buffer
        const weave::coll::Plan two = weave::coll::plan_all_reduce(true, bytes, W, r);
        long long lo = bytes, hi = 0, n = 0;
        for (int i = 0; i < two.n; ++i) {
          lo = std::min(lo, two.x[i].dst_off);
          hi = std::max(hi, two.x[i].dst_off + two.x[i].row_bytes);
          n += two.x[i].row_bytes;
        }
        const Bytes mine = node_part(p, r);
        if (n > 0) {
          ASSERT_EQ(mine.off, lo);
          ASSERT_EQ(mine.size, hi - lo);
        }
        ASSERT_EQ(mine.size, n);
      }
      if (c != Coll::all_reduce && bytes % unit == 0) {  // direct, along dim 0 of bytes / unit elements
        weave::coll::Shape full;
        full.d[0] = bytes / unit;
        const bool ag = c == Coll::all_gather;
        const weave::coll::Plan d = ag ? weave::coll::plan_all_gather(full, 0, static_cast<int>(unit), W, r)
                                       : weave::coll::plan_reduce_scatter(full, 0, static_cast<int>(unit), W, r);
        const Bytes mine = shard(p, r);
        ASSERT_EQ(d.n, mine.size > 0 ? 1 : 0);
        if (d.n == 0) continue;
        ASSERT_EQ(ag ? d.x[0].dst_off : d.x[0].src_off, mine.off);
        ASSERT_EQ(d.x[0].row_bytes, mine.size);
        for (int s = 0; s < num_steps(c, t); ++s)  // all_gather: the staggered order r + 1, r + 2, ...
          ASSERT_TRUE(!ag || send(p, r, s, 0).dst == d.x[0].dst_rank[s]) << "rank " << r << " step " << s;
      }
    }
  }
}

TEST(Hierarchy, Collectives) {
  std::mt19937 rng(2026);
  for_each_topo([&](const Topo& t) {
    for (long long unit : {4LL, 16LL})
      for (long long bytes : byte_counts(t, unit))
        for (Coll c : {Coll::all_reduce, Coll::all_gather, Coll::reduce_scatter}) {
          check_collective(c, t, bytes, unit, rng);
          if (HasFatalFailure()) return;
        }
  });
}

TEST(Hierarchy, NetworkPieces) {
  const Xfer x{0, 1, Link::network, Op::copy, 4096, 10000};
  for (long long chunk : {16LL, 4096LL, 10000LL, 1LL << 20}) {
    long long at = x.off;
    for (long long i = 0; i < num_pieces(x.bytes, chunk); ++i) {
      const Xfer y = piece(x, chunk, i);
      ASSERT_EQ(y.off, at);
      ASSERT_GT(y.bytes, 0);
      ASSERT_LE(y.bytes, chunk);
      at += y.bytes;
    }
    ASSERT_EQ(at, x.off + x.bytes);
  }
}

// ---- AG+GEMM / GEMM+RS -----------------------------------------------------------------------

struct TileId {
  int owner, i, n;
};

// Rank r's tiles in order, through locate with a cursor, and (owner, chunk) of each remote block.
struct Walk {
  std::vector<TileId> tiles;
  std::vector<std::pair<int, int>> remote;  // blocks with chunk >= 0 and tiles > 0, in order
};
Walk walk(const TileGrid& g, TileOrder o, int r, int group_m) {
  Walk w;
  Cursor cur;
  Block b{};
  long long j = 0;
  for (long long x = 0; locate(g, o, r, x, &cur, &b, &j); ++x) {
    const weave::gemm::TileCoord c = weave::gemm::grouped_tile(static_cast<int>(j), b.tiles, g.tiles_n, group_m);
    w.tiles.push_back({b.owner, b.tile0 + c.m, c.n});
    if (b.chunk >= 0 && (w.remote.empty() || w.remote.back() != std::make_pair(b.owner, b.chunk)))
      w.remote.emplace_back(b.owner, b.chunk);
  }
  return w;
}

void check_tiles(const TileGrid& g, TileOrder o) {
  const Topo& t = g.topo;
  const int W = t.world(), C = max_chunks(g);
  const bool ag = o == TileOrder::ag_gemm;
  SCOPED_TRACE(::testing::Message() << (ag ? "ag_gemm" : "gemm_rs") << " N " << t.nodes << " G " << t.gpus << " M "
                                    << g.M << " tiles_n " << g.tiles_n << " chunk_tiles " << g.chunk_tiles);
  std::vector<long long> first_tile(W + 1, 0);  // index of owner q's first output tile
  for (int q = 0; q < W; ++q) first_tile[q + 1] = first_tile[q] + static_cast<long long>(row_tiles(g, q)) * g.tiles_n;
  for (int q = 0; q < W; ++q) ASSERT_LE(num_chunks(g, q), C);
  // Chunks tile each shard's rows and bytes.
  for (int q = 0; q < W; ++q) {
    long long bytes = 0;
    int tiles = 0;
    for (int c = 0; c < C; ++c) {
      const Chunk ch = chunk(g, q, c);
      ASSERT_EQ(ch.tile0, std::min(c * g.chunk_tiles, row_tiles(g, q)));
      for (int i = ch.tile0; i < ch.tile0 + ch.tiles; ++i) ASSERT_EQ(chunk_of_tile(g, i), c);
      ASSERT_EQ(ch.off, (shard_rows(g, q).begin + std::min<long long>(ch.tile0 * 1LL * g.bm, shard_rows(g, q).size)) *
                            g.row_bytes);
      bytes += ch.bytes, tiles += ch.tiles;
    }
    ASSERT_EQ(bytes, shard_rows(g, q).size * g.row_bytes);
    ASSERT_EQ(tiles, row_tiles(g, q));
  }
  // Network sends: rail peers only. sent: (owner of the rows, the other node, chunk) -> send index,
  // where the other node is the destination (ag_gemm) or the source of the partial (gemm_rs).
  std::map<std::tuple<int, int, int>, int> sent;
  std::map<std::pair<int, int>, long long> net_bytes;  // (owner, other node) -> bytes
  for (int r = 0; r < W; ++r)
    for (int s = 0; s < num_net_sends(g); ++s) {
      const ChunkSend cs = net_send(g, o, r, s);
      ASSERT_TRUE(t.rail_peers(r, cs.dst));
      ASSERT_EQ(cs.chunk.owner, ag ? r : cs.dst);
      if (cs.chunk.bytes == 0) continue;
      // ag: chunk of owner r to node(dst); rs: node(r)'s partial of owner dst's chunk.
      const int other = ag ? t.node(cs.dst) : t.node(r);
      ASSERT_TRUE(sent.emplace(std::make_tuple(cs.chunk.owner, other, cs.chunk.index), s).second) << "sent twice";
      net_bytes[{cs.chunk.owner, other}] += cs.chunk.bytes;
    }
  // Each shard crosses once between its node and every other node.
  for (int q = 0; q < W; ++q)
    for (int m = 0; m < t.nodes; ++m)
      if (m != t.node(q)) {
        ASSERT_EQ(net_bytes[std::make_pair(q, m)], shard_rows(g, q).size * g.row_bytes) << "owner " << q;
      }

  std::vector<Walk> walks(W);
  for (int r = 0; r < W; ++r) {
    walks[r] = walk(g, o, r, 8);
    const Walk& w = walks[r];
    ASSERT_EQ(static_cast<long long>(w.tiles.size()), first_tile[W]) << "rank " << r;
    std::vector<char> seen(first_tile[W], 0);
    for (const TileId& x : w.tiles) {
      ASSERT_TRUE(x.owner >= 0 && x.owner < W && x.i >= 0 && x.i < row_tiles(g, x.owner) && x.n >= 0 &&
                  x.n < g.tiles_n);
      ASSERT_FALSE(seen[first_tile[x.owner] + static_cast<long long>(x.i) * g.tiles_n + x.n]++)
          << "rank " << r << ": a tile twice";
    }
    // A persistent block's strided walk meets the same tiles.
    for (int start = 0; start < 3; ++start) {
      Cursor cur;
      Block b{};
      long long j = 0;
      for (long long x = start; x < static_cast<long long>(w.tiles.size()); x += 5) {
        ASSERT_TRUE(locate(g, o, r, x, &cur, &b, &j));
        const weave::gemm::TileCoord c = weave::gemm::grouped_tile(static_cast<int>(j), b.tiles, g.tiles_n, 8);
        ASSERT_EQ(b.owner, w.tiles[x].owner);
        ASSERT_EQ(b.tile0 + c.m, w.tiles[x].i);
        ASSERT_EQ(c.n, w.tiles[x].n);
      }
    }
    if (!w.tiles.empty()) {  // own shard first (ag_gemm) or last (gemm_rs)
      const Block own = block(g, o, r, ag ? 0 : num_blocks(g) - 1);
      ASSERT_EQ(own.owner, r);
    }
    // Remote blocks: other nodes only, each one a network chunk that was sent.
    int last = -1;
    for (const auto& [q, c] : w.remote) {
      ASSERT_FALSE(t.same_node(q, r));
      const auto it = sent.find({q, t.node(r), c});
      ASSERT_TRUE(it != sent.end()) << "rank " << r << " owner " << q << " chunk " << c << " never crosses";
      if (ag) {  // consumed in send order: never waits for a chunk sent after one consumed later
        ASSERT_GE(it->second, last) << "rank " << r << " owner " << q << " chunk " << c;
        last = it->second;
      }
    }
  }
  if (!ag)  // every rank of a node computes the remote chunks in the same order ...
    for (int r = 0; r < W; ++r) {
      ASSERT_EQ(walks[r].remote, walks[t.rank(t.node(r), 0)].remote) << "rank " << r;
      // ... and the collector sends them in that order (the order they are complete).
      int last = -1;
      for (size_t pos = 0; pos < walks[r].remote.size(); ++pos) {
        const auto [q, c] = walks[r].remote[pos];
        if (t.rail_peer_on(q, t.node(r)) != r) continue;
        const int s = sent.at({q, t.node(r), c});
        ASSERT_GT(s, last);
        ASSERT_EQ(net_send(g, o, r, s).dst, q);
        last = s;
      }
    }
  // N = 1: the single-node order of tp_common/schedule.hpp.
  if (t.nodes == 1 && g.bm == weave::tp::kBM) {
    const weave::tp::Layout L = weave::tp::make_layout(static_cast<int>(g.M), g.tiles_n * weave::tp::kBN, W, 8);
    for (int r = 0; r < W; ++r)
      for (size_t x = 0; x < walks[r].tiles.size(); ++x) {
        const weave::tp::Item it = ag ? weave::tp::item(L, r, static_cast<int>(x))
                                      : weave::tp::rs_chain_item(L, r, static_cast<int>(x));
        ASSERT_EQ(walks[r].tiles[x].owner, it.owner) << "rank " << r << " tile " << x;
        ASSERT_EQ(walks[r].tiles[x].i, it.i);
        ASSERT_EQ(walks[r].tiles[x].n, it.n);
      }
  }
}

TEST(Hierarchy, TileOrders) {
  for_each_topo([](const Topo& t) {
    const long long W = t.world();
    for (int bm : {128, 16})
      for (long long M : {1LL, 100LL, 3 * W + 1, bm * W * 3 + 77, bm * W * 5})
        for (int tiles_n : {1, 3})
          for (int chunk_tiles : {1, 2, 5})
            for (TileOrder o : {TileOrder::ag_gemm, TileOrder::gemm_rs}) {
              const TileGrid g{t, M, bm, tiles_n, chunk_tiles, 8192};
              check_tiles(g, o);
              if (::testing::Test::HasFatalFailure()) return;
            }
  });
}

// ---- ring attention --------------------------------------------------------------------------

TEST(Hierarchy, RingAttention) {
  for_each_topo([](const Topo& t) {
    SCOPED_TRACE(::testing::Message() << "N " << t.nodes << " G " << t.gpus);
    const int W = t.world();
    std::vector<SliceSend> sends;
    for (int r = 0; r < W; ++r) {
      for (int j = 0; j < ring_num_net_sends(t); ++j) sends.push_back(ring_net_send(t, r, j));
      for (int x = 0; x < ring_num_nvlink_sends(t); ++x) sends.push_back(ring_nvlink_send(t, r, x));
    }
    std::stable_sort(sends.begin(), sends.end(),
                     [](const SliceSend& a, const SliceSend& b) { return a.start < b.start; });
    // arrival[r][q]: the step from which rank r holds q's slice (-1: never); first[r][q]: when the
    // incoming transfer starts (the slot is taken); release[r][q]: when r no longer needs it.
    std::vector<std::vector<int>> arrival(W, std::vector<int>(W, -1)), first(W, std::vector<int>(W, 0)),
        release(W, std::vector<int>(W, 0));
    for (int r = 0; r < W; ++r) arrival[r][r] = 0;
    std::vector<std::vector<int>> crossings(W, std::vector<int>(t.nodes, 0));  // (owner, node)
    for (const SliceSend& s : sends) {
      if (s.link == Link::network) {
        ASSERT_TRUE(t.rail_peers(s.src, s.dst));
        crossings[s.owner][t.node(s.dst)]++;
      } else {
        ASSERT_TRUE(t.same_node(s.src, s.dst));
        ASSERT_NE(s.src, s.dst);
      }
      ASSERT_LT(s.start, s.due);
      ASSERT_GE(arrival[s.src][s.owner], 0) << "rank " << s.src << " sends a slice it does not have";
      ASSERT_LE(arrival[s.src][s.owner], s.start);
      ASSERT_EQ(arrival[s.dst][s.owner], -1) << "slice " << s.owner << " reaches rank " << s.dst << " twice";
      arrival[s.dst][s.owner] = s.due;
      first[s.dst][s.owner] = s.start;
      release[s.src][s.owner] = std::max(release[s.src][s.owner], s.due);
    }
    for (int q = 0; q < W; ++q)
      for (int m = 0; m < t.nodes; ++m) ASSERT_EQ(crossings[q][m], m == t.node(q) ? 0 : 1) << "slice " << q;
    for (int r = 0; r < W; ++r) {
      std::set<int> seen;
      for (int step = 0; step < W; ++step) {
        const int q = ring_owner(t, r, step);
        ASSERT_TRUE(seen.insert(q).second) << "rank " << r << " sees slice " << q << " twice";
        ASSERT_GE(arrival[r][q], 0) << "rank " << r << " step " << step;
        ASSERT_LE(arrival[r][q], step) << "rank " << r << " step " << step;
        release[r][q] = std::max(release[r][q], step + 1);
        ASSERT_TRUE(t.nodes > 1 || q == t.local_peer(r, -step)) << "rank " << r << " step " << step;
      }
      ASSERT_EQ(ring_owner(t, r, 0), r);
      int most = 0;
      for (int step = 0; step < W; ++step) {
        int held = 0;
        for (int q = 0; q < W; ++q) held += first[r][q] <= step && step < release[r][q];
        most = std::max(most, held);
      }
      ASSERT_LE(most, 4) << "rank " << r;
    }
  });
}

}  // namespace
