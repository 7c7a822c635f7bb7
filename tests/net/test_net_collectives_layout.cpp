// The inter-node collectives' layout (kernels/net_collectives/layout.hpp) on the CPU: for 1..16
// nodes, ragged sizes and several chunk sizes, every piece a rank receives is exactly one piece
// its sender queues (same chunk id, bytes, landing offset), chunk ids and regions stay inside
// what the host entry checks, the command counts the gate relies on match the pushes, and the
// collectives (all_gather, reduce_scatter, the ring all_reduce) executed piece by piece on host
// buffers give the reference results.
#include "net_collectives/layout.hpp"  // first: the header compiles as plain C++

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

namespace {

using namespace weave::net;
using namespace weave::net::coll;

std::string where(Coll c, int world, long long bytes, long long chunk) {
  return std::string(c == Coll::all_gather ? "all_gather" : "reduce_scatter") + " N=" + std::to_string(world) +
         " bytes=" + std::to_string(bytes) + " chunk=" + std::to_string(chunk);
}

// Runs one call on host memory exactly as the kernel moves bytes: each rank's send blocks copy
// pieces into its send buffer and "post" them into the peer's receive slot; receivers take them
// out (all_gather) or add them (reduce_scatter, int32 elements so that sums are exact).
void simulate(Coll c, int world, long long count, long long chunk) {
  SCOPED_TRACE(where(c, world, count * 4, chunk));
  const long long bytes = count * 4;
  const Layout L = make_layout(c, world, bytes, chunk);
  std::vector<std::vector<int32_t>> buf(world, std::vector<int32_t>(count));
  for (int r = 0; r < world; ++r)
    for (long long i = 0; i < count; ++i) buf[r][i] = static_cast<int32_t>(1000 * r + i % 997);
  const std::vector<std::vector<int32_t>> in = buf;
  std::vector<std::vector<char>> send(world, std::vector<char>(send_needed(L) + 1, 0)),
      recv(world, std::vector<char>(recv_needed(L) + 1, 0));
  std::vector<std::map<uint32_t, int>> raised(world);  // per receiver: chunk id -> arrivals
  for (int r = 0; r < world; ++r) {
    long long pushed = 0;
    for (int s = 0; s < steps(L); ++s)
      for (int p = 0; p < step_pieces(L, r, s); ++p) {
        const PieceCmd pc = piece_cmd(L, r, s, p);
        ASSERT_GE(pc.src_off, 0);
        ASSERT_LE(pc.src_off + pc.bytes, send_needed(L));
        ASSERT_LE(pc.dst_off + pc.bytes, recv_needed(L));
        ASSERT_LT(pc.chunk, flags_needed(L));
        ASSERT_NE(pc.peer, r);
        ASSERT_EQ(pc.src_off % 16, 0);
        std::memcpy(send[r].data() + pc.src_off, reinterpret_cast<char*>(buf[r].data()) + pc.data_off, pc.bytes);
        std::memcpy(recv[pc.peer].data() + pc.dst_off, send[r].data() + pc.src_off, pc.bytes);
        raised[pc.peer][pc.chunk]++;
        ++pushed;
      }
    ASSERT_EQ(pushed, commands(L, r));
  }
  for (int r = 0; r < world; ++r) {
    std::set<uint32_t> waited;
    if (c == Coll::all_gather) {
      for (int s = 0; s < steps(L); ++s)
        for (int p = 0; p < recv_pieces(L, r, s); ++p) {
          const PieceRecv v = piece_recv(L, r, s, p);
          ASSERT_EQ(raised[r][v.chunk], 1) << "chunk " << v.chunk;
          ASSERT_TRUE(waited.insert(v.chunk).second);
          std::memcpy(reinterpret_cast<char*>(buf[r].data()) + v.data_off, recv[r].data() + v.recv_off, v.bytes);
        }
      for (int q = 0; q < world; ++q) {
        const Bytes sh = shard(L.plan, q);
        for (long long i = sh.off / 4; i < (sh.off + sh.size) / 4; ++i) ASSERT_EQ(buf[r][i], in[q][i]) << "rank " << r;
      }
    } else {
      const int np = steps(L) ? recv_pieces(L, r, 0) : 0;
      for (int p = 0; p < np; ++p) {
        for (int s = 0; s < steps(L); ++s) {
          const PieceRecv v = piece_recv(L, r, s, p);
          ASSERT_EQ(recv_pieces(L, r, s), np);
          ASSERT_EQ(raised[r][v.chunk], 1) << "chunk " << v.chunk;
          ASSERT_TRUE(waited.insert(v.chunk).second);
          const int32_t* part = reinterpret_cast<const int32_t*>(recv[r].data() + v.recv_off);
          for (long long i = 0; i < v.bytes / 4; ++i) buf[r][v.data_off / 4 + i] += part[i];
        }
      }
      const Bytes sh = shard(L.plan, r);
      for (long long i = sh.off / 4; i < (sh.off + sh.size) / 4; ++i) {
        int64_t want = 0;
        for (int q = 0; q < world; ++q) want += in[q][i];
        ASSERT_EQ(buf[r][i], want) << "rank " << r << " element " << i;
      }
    }
    // Every chunk that arrived was waited for: nothing is left raised for a later call.
    ASSERT_EQ(waited.size(), raised[r].size()) << "rank " << r;
  }
}

// The ring all_reduce executed as the kernel's `blocks` blocks per rank do: block b takes items b,
// b + blocks, ... in order, each a small state machine that advances once its arrival is there,
// and a block moves to its next item only when the current one is done (a wait blocks it). Every
// rank ends with the sums, each arrival raised once and consumed, no block stuck (a deadlock
// would leave one), and the commands pushed are the count the gate relies on. Ring steps are
// checked against hierarchy's.
void simulate_ring(int world, long long count, long long chunk, int blocks) {
  SCOPED_TRACE(std::string("all_reduce N=") + std::to_string(world) + " bytes=" + std::to_string(count * 4) +
               " chunk=" + std::to_string(chunk) + " blocks=" + std::to_string(blocks));
  const long long bytes = count * 4;
  const Layout L = make_layout(Coll::all_reduce, world, bytes, chunk);
  const int N = world;
  for (int r = 0; r < N; ++r)
    for (int s = 0; s < N - 1; ++s) {  // hierarchy: net_rs step s sends sub-chunk r - s, net_ag r + 1 - s
      const Xfer rs = send(L.plan, r, s, 0), ag = send(L.plan, r, N - 1 + s, 0);
      ASSERT_EQ(rs.dst, (r + 1) % N);
      ASSERT_EQ(rs.off, shard(L.plan, ring_dist(L, r, s)).off);  // ring_dist(r, s) = r - s mod N
      ASSERT_EQ(ag.off, shard(L.plan, (r + 1 - s + N) % N).off);
      ASSERT_EQ(ag.dst, (r + 1) % N);
    }
  std::vector<std::vector<int32_t>> buf(N, std::vector<int32_t>(count));
  for (int r = 0; r < N; ++r)
    for (long long i = 0; i < count; ++i) buf[r][i] = static_cast<int32_t>(7 * r - 3 + i % 101);
  const std::vector<std::vector<int32_t>> in = buf;
  const long long area = ring_area(L);
  std::vector<std::vector<char>> send(N, std::vector<char>(send_needed(L) + 1)), recv(N, std::vector<char>(recv_needed(L) + 1));
  std::vector<std::map<uint32_t, int>> raised(N);
  std::vector<long long> pushed(N, 0);
  const auto deliver = [&](int r, int which, int c, int p, const Bytes& pc) {
    const int to = (r + 1) % N;
    const long long off = which * area + pc.off;
    ASSERT_LE(off + pc.size, send_needed(L));
    std::memcpy(recv[to].data() + off, send[r].data() + off, pc.size);
    const uint32_t id = ring_chunk_id(L, which, c, p);
    ASSERT_LT(id, flags_needed(L));
    ASSERT_EQ(raised[to][id], 0) << "chunk " << id << " raised twice";
    raised[to][id] = 1;
    ++pushed[r];
  };
  const auto add = [&](int r, char* dst, const Bytes& pc, long long from) {  // buf + recv area 0 -> dst
    for (long long i = 0; i < pc.size / 4; ++i) {
      const int32_t v = buf[r][pc.off / 4 + i] + reinterpret_cast<const int32_t*>(recv[r].data() + from)[i];
      std::memcpy(dst + 4 * i, &v, 4);
    }
  };
  const long long items = ring_items(L);
  std::vector<std::vector<int>> stage(N, std::vector<int>(items, 0));
  std::vector<std::vector<long long>> current(N, std::vector<long long>(blocks));
  for (int r = 0; r < N; ++r)
    for (int b = 0; b < blocks; ++b) current[r][b] = b;
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < N; ++r)
      for (int b = 0; b < blocks; ++b) {
        const long long j = current[r][b];
        if (j >= items) continue;
        int c, p;
        ring_item(L, j, &c, &p);
        const Bytes pc = ring_piece(L, c, p);
        const int d = ring_dist(L, r, c), e = (d + 1) % N;
        char* data = reinterpret_cast<char*>(buf[r].data()) + pc.off;
        if (stage[r][j] == 0) {
          const uint32_t id = ring_chunk_id(L, 0, c, p);
          if (d == 0) {
            std::memcpy(send[r].data() + pc.off, data, pc.size);
          } else {
            if (!raised[r][id]) continue;
            if (d <= N - 2) {
              add(r, send[r].data() + pc.off, pc, pc.off);
            } else {
              add(r, send[r].data() + area + pc.off, pc, pc.off);
              std::memcpy(data, send[r].data() + area + pc.off, pc.size);
            }
            raised[r][id] = 0;  // consumed
          }
          deliver(r, d <= N - 2 ? 0 : 1, c, p, pc);
          stage[r][j] = 1;
          progress = true;
        }
        if (stage[r][j] == 1) {
          if (e == 0) {
            stage[r][j] = 2;
          } else {
            const uint32_t id = ring_chunk_id(L, 1, c, p);
            if (!raised[r][id]) continue;
            std::memcpy(data, recv[r].data() + area + pc.off, pc.size);
            if (e <= N - 2) {
              std::memcpy(send[r].data() + area + pc.off, recv[r].data() + area + pc.off, pc.size);
              deliver(r, 1, c, p, pc);
            }
            raised[r][id] = 0;
            stage[r][j] = 2;
            progress = true;
          }
        }
        if (stage[r][j] == 2) current[r][b] += blocks;
      }
  }
  for (int r = 0; r < N; ++r) {
    for (long long j = 0; j < items; ++j) ASSERT_EQ(stage[r][j], 2) << "rank " << r << " item " << j << " stuck";
    ASSERT_EQ(pushed[r], commands(L, r)) << "rank " << r;
    for (const auto& [id, v] : raised[r]) ASSERT_EQ(v, 0) << "rank " << r << " chunk " << id << " never consumed";
    for (long long i = 0; i < count; ++i) {
      int64_t want = 0;
      for (int q = 0; q < N; ++q) want += in[q][i];
      ASSERT_EQ(buf[r][i], want) << "rank " << r << " element " << i;
    }
  }
}

TEST(NetCollectivesLayout, RingAllReduceCompletesWithTheSums) {
  for (int world = 2; world <= 16; ++world)  // one rank: the host entry launches nothing
    for (long long count : {0LL, 1LL, 3LL, 4LL, 37LL, 1000LL, 4099LL, 65536LL + 5})
      for (long long chunk : {16LL, 256LL, 4096LL, 1LL << 20}) {
        if (count * 4 / chunk > 5000) continue;  // keeps the run short
        for (int blocks : {1, 3, 12}) {
          simulate_ring(world, count, chunk, blocks);
          if (HasFatalFailure()) return;
        }
      }
}

TEST(NetCollectivesLayout, EveryPieceLandsOnceAndTheResultsMatch) {
  for (int world = 1; world <= 16; ++world)
    for (long long count : {0LL, 1LL, 3LL, 4LL, 37LL, 1000LL, 4099LL, 65536LL + 5})
      for (long long chunk : {16LL, 256LL, 4096LL, 1LL << 20}) {
        if (count * 4 / chunk > 20000) continue;  // keeps the run short
        simulate(Coll::all_gather, world, count, chunk);
        simulate(Coll::reduce_scatter, world, count, chunk);
        if (HasFatalFailure()) return;
      }
}

// Every sender is heard from in every call, even with empty shards: the slot reuse rule needs it.
TEST(NetCollectivesLayout, EveryRankHearsFromEveryPeer) {
  for (Coll c : {Coll::all_gather, Coll::reduce_scatter})
    for (int world = 2; world <= 16; ++world)
      for (long long bytes : {0LL, 4LL, 16LL, 48LL}) {
        const Layout L = make_layout(c, world, bytes, 64);
        for (int r = 0; r < world; ++r) {
          std::set<int> senders;
          for (int s = 0; s < steps(L); ++s) {
            ASSERT_GE(recv_pieces(L, r, s), 1);
            senders.insert(piece_recv(L, r, s, 0).sender);
          }
          ASSERT_EQ(static_cast<int>(senders.size()), world - 1) << where(c, world, bytes, 64);
          ASSERT_EQ(senders.count(r), 0u);
        }
      }
}

}  // namespace
