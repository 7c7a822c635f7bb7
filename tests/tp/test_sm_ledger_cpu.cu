// CPU tests of the adaptive SM split's ledger and claim protocol (kernels/tp_common/sm_ledger.cuh):
// the same __host__ __device__ code a kernel's blocks would run, here in threads, one per block, as
// the blocks of W ranks of GEMM + all-reduce (gemm_ar v0's division of work: every rank computes
// every tile into its own buffer and signals the tile's owner; the owner's communication task waits
// until every rank wrote the tile, sums the W partials in rank order and writes the sum into every
// rank's buffer, then signals `done` on every rank). Several launches in a row on the same ledgers
// and counters, as on a stream. Checked: every task handed out exactly once per launch, every
// output exact, the ledger zero after every launch (the last block out zeroed it), and no launch
// stalls (every wait has a deadline; a missed one fails the test instead of hanging it). Then the
// same for AG + GEMM (ag_gemm v10), whose compute tasks have an input: a peer's pushed rows.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "check/seed.hpp"
#include "tp_common/schedule.hpp"
#include "tp_common/sm_ledger.cuh"

using namespace weave::tp::sm_split;

namespace {

using Clock = std::chrono::steady_clock;
// The unit tests' inputs are in place as soon as they have begun.
const auto in_place_now = [](long long) { return true; };

// The unit tests' launch: B blocks, the task counts, a compute task of 1 cycle and `comm_prior`
// cycles per reduction until one is measured.
LedgerParams params(int blocks, long long compute_tasks, long long comm_tasks, double comm_prior) {
  LedgerParams p;
  p.blocks = blocks, p.compute_tasks = compute_tasks, p.comm_tasks = comm_tasks;
  p.compute_prior = 1, p.comm_prior = comm_prior;
  return p;
}

struct Config {
  int W, B, tiles;
  int launches;
  double compute_us, comm_us;        // a task's busy time (jittered)
  double compute_prior, comm_prior;  // what the policy assumes before measuring (ns)
};

// The W ranks' memory: partial / summed tiles (8 values each), the owners' ready counters, the
// done counters, each rank's ledger; and the test's own per-task execution counts.
struct World {
  static constexpr int kValues = 8;
  Config c;
  std::vector<long long> buf;                             // [rank][tile][value]
  std::unique_ptr<std::atomic<unsigned long long>[]> ready;  // [rank][tile], on the owner
  std::unique_ptr<std::atomic<unsigned long long>[]> done;   // [rank]
  std::vector<Ledger> ledger;
  std::unique_ptr<std::atomic<int>[]> computed, reduced;  // [rank][tile] this launch
  std::atomic<bool> failed{false};
  std::string why;
  std::atomic<int> why_set{0};
  Clock::time_point deadline;

  explicit World(const Config& cfg)
      : c(cfg),
        buf(static_cast<size_t>(cfg.W) * cfg.tiles * kValues, 0),
        ready(new std::atomic<unsigned long long>[static_cast<size_t>(cfg.W) * cfg.tiles]),
        done(new std::atomic<unsigned long long>[cfg.W]),
        ledger(cfg.W, Ledger{}),
        computed(new std::atomic<int>[static_cast<size_t>(cfg.W) * cfg.tiles]),
        reduced(new std::atomic<int>[static_cast<size_t>(cfg.W) * cfg.tiles]) {
    for (int i = 0; i < cfg.W * cfg.tiles; ++i) ready[i] = 0, computed[i] = 0, reduced[i] = 0;
    for (int r = 0; r < cfg.W; ++r) done[r] = 0;
  }
  long long* tile(int rank, int t) { return &buf[(static_cast<size_t>(rank) * c.tiles + t) * kValues]; }
  static long long partial(int launch, int rank, int t, int e) { return 1000003LL * launch + 7919LL * rank + 31 * t + e; }
  int comm_tasks(int rank) const { return rank < c.tiles ? (c.tiles - rank + c.W - 1) / c.W : 0; }

  void fail(const std::string& s) {
    if (why_set.exchange(1) == 0) why = s;
    failed = true;
  }
  // A poll with the test's deadline: a stalled protocol fails the test instead of hanging it.
  template <class Pred>
  bool wait(Pred&& ok, const char* what, int rank, long long index) {
    while (!ok()) {
      if (failed) return false;
      if (Clock::now() > deadline) {
        fail(std::string("stalled: rank ") + std::to_string(rank) + " waiting for " + what + " " + std::to_string(index));
        return false;
      }
      std::this_thread::yield();
    }
    return true;
  }
};

void busy(double us, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> j(0.8, 1.2);
  const auto end = Clock::now() + std::chrono::nanoseconds(static_cast<long long>(us * 1000 * j(rng)));
  while (Clock::now() < end) {
  }
}

// One block of one rank for one launch (`round` counts launches from 1).
// One launch: every rank's B blocks as threads (each with its own seed), within a 60 s deadline.
template <class W, class Block>
void run_launch(W& w, Block block, int ranks, int B, int launch, unsigned long long seed) {
  w.deadline = Clock::now() + std::chrono::seconds(60);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    for (int b = 0; b < B; ++b)
      threads.emplace_back(block, std::ref(w), r, b, launch, weave::check::derive(seed, launch, r * B + b));
  for (std::thread& t : threads) t.join();
}

void block(World& w, int rank, int b, int round, unsigned long long seed) {
  const Config& c = w.c;
  std::mt19937_64 rng(seed);
  LedgerParams p;
  p.blocks = c.B;
  p.compute_tasks = c.tiles;
  p.comm_tasks = w.comm_tasks(rank);
  p.compute_prior = c.compute_prior;
  p.comm_prior = c.comm_prior;
  Ledger& l = w.ledger[rank];
  const unsigned long long want = static_cast<unsigned long long>(round) * c.W;  // every rank's signal
  auto owned_tile = [&](long long k) { return static_cast<int>(rank + k * c.W); };
  auto begun = [&](long long k) {
    return w.ready[static_cast<size_t>(rank) * c.tiles + owned_tile(k)].load(std::memory_order_relaxed) > want - c.W;
  };
  Role role = Role::Compute;
  while (!w.failed) {
    auto in_place = [&](long long k) {
      return w.ready[static_cast<size_t>(rank) * c.tiles + owned_tile(k)].load(std::memory_order_relaxed) >= want;
    };
    const Task task = next_task(l, p, role, begun, in_place);
    if (task.role == Role::Done) break;
    const auto t0 = Clock::now();
    if (task.role == Role::Compute) {
      const int t = static_cast<int>(task.index);  // the same tile order on every rank
      busy(c.compute_us, rng);
      long long* out = w.tile(rank, t);
      for (int e = 0; e < World::kValues; ++e) out[e] = World::partial(round, rank, t, e);
      w.computed[rank * c.tiles + t]++;
      w.ready[static_cast<size_t>(t % c.W) * c.tiles + t].fetch_add(1, std::memory_order_release);
    } else {
      const int t = owned_tile(task.index);
      auto& rd = w.ready[static_cast<size_t>(rank) * c.tiles + t];
      if (!w.wait([&] { return rd.load(std::memory_order_acquire) >= want; }, "tile", rank, t)) break;
      busy(c.comm_us, rng);
      long long sum[World::kValues] = {};
      for (int q = 0; q < c.W; ++q)
        for (int e = 0; e < World::kValues; ++e) sum[e] += w.tile(q, t)[e];
      for (int q = 0; q < c.W; ++q)
        for (int e = 0; e < World::kValues; ++e) w.tile(q, t)[e] = sum[e];
      w.reduced[rank * c.tiles + t]++;
      for (int q = 0; q < c.W; ++q) w.done[q].fetch_add(1, std::memory_order_release);
    }
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
    task_done(l, task.role, static_cast<unsigned long long>(ns));
  }
  if (w.failed) return;
  // As gemm_ar v0's communicator block 0: the call ends once every tile's sum reached this rank.
  if (block_exit(l, c.B)) {
    const unsigned long long all = static_cast<unsigned long long>(round) * c.tiles;
    w.wait([&] { return w.done[rank].load(std::memory_order_acquire) >= all; }, "done", rank, static_cast<long long>(all));
  }
}

// Runs c.launches launches of every rank's B blocks (one thread each) and checks each.
void run(const Config& c, unsigned long long seed) {
  World w(c);
  const std::string where = "W " + std::to_string(c.W) + " B " + std::to_string(c.B) + " tiles " +
                            std::to_string(c.tiles) + " priors " + std::to_string(c.compute_prior) + "/" +
                            std::to_string(c.comm_prior);
  for (int launch = 1; launch <= c.launches; ++launch) {
    for (long long& v : w.buf) v = -1;  // poison
    for (int i = 0; i < c.W * c.tiles; ++i) w.computed[i] = 0, w.reduced[i] = 0;
    run_launch(w, block, c.W, c.B, launch, seed);
    ASSERT_FALSE(w.failed) << where << " launch " << launch << ": " << w.why;
    for (int r = 0; r < c.W; ++r) {
      for (int t = 0; t < c.tiles; ++t) {
        ASSERT_EQ(w.computed[r * c.tiles + t].load(), 1) << where << ": rank " << r << " tile " << t << " computed";
        ASSERT_EQ(w.reduced[r * c.tiles + t].load(), t % c.W == r ? 1 : 0)
            << where << ": rank " << r << " tile " << t << " reduced";
        for (int e = 0; e < World::kValues; ++e) {
          long long want = 0;
          for (int q = 0; q < c.W; ++q) want += World::partial(launch, q, t, e);
          ASSERT_EQ(w.tile(r, t)[e], want) << where << ": rank " << r << " tile " << t << " value " << e;
        }
      }
      const Ledger& l = w.ledger[r];
      const unsigned long long words[] = {l.compute_claimed, l.compute_done, l.compute_cycles, l.comm_claimed,
                                          l.comm_done,       l.comm_cycles,  l.comm_blocks,    l.exited};
      for (unsigned long long x : words) ASSERT_EQ(x, 0ull) << where << ": rank " << r << "'s ledger after the launch";
      ASSERT_EQ(l.launches, static_cast<unsigned long long>(launch)) << where << ": rank " << r;
      ASSERT_LE(l.peak_comm, static_cast<unsigned long long>(c.B > 1 ? c.B - 1 : 0)) << where << ": rank " << r;
      ASSERT_EQ(w.done[r].load(), static_cast<unsigned long long>(launch) * c.tiles) << where;
    }
  }
}

// Grids from one block to more blocks than tasks, tile counts from one to several per block,
// W 1..4, and priors that push the policy to either end (communication thought free or dear) as
// well as neutral ones: the guarantees hold whatever the policy decides.
TEST(SmLedger, EveryTaskOnceEveryLaunchNoStall) {
  const unsigned long long seed = weave::check::test_seed();
  std::mt19937_64 rng(seed);
  int configs = 0;
  for (int W : {1, 2, 3, 4})
    for (int B : {1, 2, 3, 6})
      for (int tiles : {1, 5, 24})
        for (double comm_prior : {1.0, 1e3, 1e9}) {
          const double compute_us = std::uniform_real_distribution<double>(1, 20)(rng);
          const double comm_us = std::uniform_real_distribution<double>(1, 40)(rng);
          run({W, B, tiles, 3, compute_us, comm_us, 1e3, comm_prior}, weave::check::derive(seed, ++configs));
          if (HasFatalFailure()) return;
        }
  std::printf("%d configurations, 3 launches each\n", configs);
}

// More blocks than SMs would be on a real grid's share, many tiles: the claim counters contend.
TEST(SmLedger, ContendedClaims) {
  const unsigned long long seed = weave::check::test_seed();
  run({2, 16, 200, 4, 0.5, 2.0, 1e3, 1e3}, seed);
}

// One block: it computes while compute is left (the target is capped at B - 1 = 0), then
// reduces; the sequence of tasks it is handed is exactly that.
TEST(SmLedger, OneBlockComputesThenCommunicates) {
  Ledger l{};
  const LedgerParams p = params(1, 5, 3, 1e9);  // communication thought dear: it would want every block
  Role role = Role::Compute;
  auto always = [](long long) { return true; };
  for (long long i = 0; i < 5; ++i) {
    const Task t = next_task(l, p, role, always, in_place_now);
    ASSERT_EQ(t.role, Role::Compute);
    ASSERT_EQ(t.index, i);
    task_done(l, t.role, 10);
  }
  for (long long k = 0; k < 3; ++k) {
    const Task t = next_task(l, p, role, always, in_place_now);
    ASSERT_EQ(t.role, Role::Comm);
    ASSERT_EQ(t.index, k);
    EXPECT_EQ(l.comm_blocks, 1ull);
    task_done(l, t.role, 10);
  }
  EXPECT_EQ(next_task(l, p, role, always, in_place_now).role, Role::Done);
  EXPECT_EQ(l.comm_blocks, 0ull);  // Done left the communication role
  EXPECT_EQ(l.early_comm, 0ull);   // every reduction came after the last tile was claimed
  EXPECT_EQ(l.peak_comm, 0ull);
  EXPECT_TRUE(block_exit(l, 1));
  EXPECT_EQ(l.launches, 1ull);
  EXPECT_EQ(l.compute_claimed, 0ull);
  EXPECT_EQ(l.comm_claimed, 0ull);
  EXPECT_EQ(l.exited, 0ull);
}

// Two blocks, communication dear: the second block joins the communication role once an input
// has begun to arrive, a third join is refused (the cap B - 1 while compute is left), and a
// communication block goes back to compute when the next input has not begun.
TEST(SmLedger, JoinCappedAndStalledWorkReturnsToCompute) {
  Ledger l{};
  const LedgerParams p = params(3, 100, 50, 1e6);  // target B - 1 = 2
  bool arrived = false;
  auto begun = [&](long long) { return arrived; };
  Role r0 = Role::Compute, r1 = Role::Compute, r2 = Role::Compute;
  EXPECT_EQ(next_task(l, p, r0, begun, in_place_now).role, Role::Compute);  // nothing arrived: compute
  arrived = true;
  EXPECT_EQ(next_task(l, p, r1, begun, in_place_now).role, Role::Comm);
  EXPECT_EQ(next_task(l, p, r2, begun, in_place_now).role, Role::Comm);
  EXPECT_EQ(l.comm_blocks, 2ull);
  const Task t = next_task(l, p, r0, begun, in_place_now);  // at the cap: r0 keeps computing
  EXPECT_EQ(t.role, Role::Compute);
  EXPECT_EQ(t.index, 1);
  EXPECT_EQ(l.comm_blocks, 2ull);
  arrived = false;
  EXPECT_EQ(next_task(l, p, r1, begun, in_place_now).role, Role::Compute);  // stalled: back to compute
  EXPECT_EQ(r1, Role::Compute);
  EXPECT_EQ(l.comm_blocks, 1ull);
  EXPECT_EQ(l.comm_claimed, 2ull);  // the two communication tasks handed out, no index held
  EXPECT_EQ(l.early_comm, 2ull);    // both while tiles were left
  EXPECT_EQ(l.peak_comm, 2ull);
}

// A join decided on a snapshot that did not show another block's join: refused at the target
// while compute is left (B = 2, target 1, one block already communicating), so some block keeps
// computing; accepted once every compute task is claimed.
TEST(SmLedger, StaleJoinRefusedAtTheCap) {
  Ledger l{};
  const LedgerParams p = params(2, 10, 5, 1e6);
  const View stale = snapshot(l, p);  // no communication block yet
  ASSERT_EQ(target_comm_blocks(stale), 1);
  l.comm_blocks = 1;  // the other block joined after that snapshot
  EXPECT_FALSE(join_comm(l, stale));
  EXPECT_EQ(l.comm_blocks, 1ull);
  l.compute_claimed = 10;  // nothing left to compute: every block may communicate
  EXPECT_TRUE(join_comm(l, snapshot(l, p)));
  EXPECT_EQ(l.comm_blocks, 2ull);
}

// Races forced deterministically: `begun` runs between a block's snapshot and its claims, so a
// test lets another block act there. The last compute task taken by another block after this
// block's snapshot showed it free: this block is not handed it (nor an index past the end) but
// decides again, and communicates.
TEST(SmLedger, LastComputeTaskTakenMeanwhile) {
  Ledger l{};
  const LedgerParams p = params(2, 1, 3, 1);
  Role r0 = Role::Compute, r1 = Role::Compute;
  Task other;
  bool nested = false;
  auto begun = [&](long long) {
    if (!nested) {
      nested = true;
      other = next_task(l, p, r1, [](long long) { return false; }, in_place_now);
    }
    return false;  // r0 would rather compute
  };
  const Task t = next_task(l, p, r0, begun, in_place_now);
  EXPECT_EQ(other.role, Role::Compute);
  EXPECT_EQ(other.index, 0);
  EXPECT_EQ(t.role, Role::Comm);
  EXPECT_EQ(t.index, 0);
}

// Two communication blocks read the same next index: the one that loses the compare-and-swap is
// handed the following task, never the same one.
TEST(SmLedger, ConcurrentCommClaimsAreDistinct) {
  Ledger l{};
  const LedgerParams p = params(4, 10, 5, 1e6);  // target 3
  Role r0 = Role::Compute, r1 = Role::Compute;
  auto always = [](long long) { return true; };
  ASSERT_EQ(next_task(l, p, r0, always, in_place_now).role, Role::Comm);  // task 0; r0 now communicates
  Task other;
  bool nested = false;
  auto begun = [&](long long) {
    if (!nested) {
      nested = true;
      other = next_task(l, p, r1, always, in_place_now);  // takes task 1 after r0's snapshot read index 1
    }
    return true;
  };
  const Task t = next_task(l, p, r0, begun, in_place_now);
  EXPECT_EQ(other.role, Role::Comm);
  EXPECT_EQ(other.index, 1);
  EXPECT_EQ(t.role, Role::Comm);
  EXPECT_EQ(t.index, 2);
  EXPECT_EQ(l.comm_claimed, 3ull);
}

// A communication task is claimed only once its input is in place on every rank: until then the
// block polls, holding no index (another block could take it), and then it is handed the task.
TEST(SmLedger, InputInPlaceBeforeClaim) {
  Ledger l{};
  const LedgerParams p = params(2, 10, 5, 1e6);  // target B - 1 = 1
  Role role = Role::Compute;
  int polls = 0;
  bool held = false;
  const Task t = next_task(l, p, role, [](long long) { return true; }, [&](long long k) {
    held = held || l.comm_claimed != 0;
    return ++polls > 2 && k == 0;
  });
  EXPECT_EQ(t.role, Role::Comm);
  EXPECT_EQ(t.index, 0);
  EXPECT_EQ(polls, 3);
  EXPECT_FALSE(held) << "an index was claimed before its input was in place";
  EXPECT_EQ(l.comm_claimed, 1ull);
}

// ---- AG + GEMM (ag_gemm v10): compute tasks with an input ------------------------------------
// The same ledger and claims with compute_ready, run by threads as the blocks of W ranks of
// AG + GEMM (ag_gemm v10's division of work; tp_common/schedule.hpp's layout and orders): rank r's
// compute tasks are every output tile in item()'s order (own shard first), those of owner q != r
// reading q's row tile from r's gathered buffer once ready[r][vrow] reached round * P; its
// communication tasks are its push units (unit u: row tile u / P, slice u % P), each writing its
// value into every peer's gathered buffer and adding 1 to the peer's ready[vrow], once every rank
// arrived (block 0 of each rank announces it first). Ranks start late and run slow or fast. Checked:
// every task once per launch, every tile handed out only with its rows in place and reading this
// launch's values, every unit only after the arrival, the ledger zero after each launch, no stall.
struct AgConfig {
  int W, B, tm, tn, P, launches;
  double compute_us, push_us;
  double push_prior;  // the policy's prior for a unit (a tile: 1e3)
};

struct AgWorld {
  AgConfig c;
  weave::tp::Layout L;
  std::vector<std::atomic<long long>> gathered;              // [rank][vrow][slice]: the pushed value
  std::unique_ptr<std::atomic<unsigned long long>[]> ready;  // [rank][vrow]
  std::unique_ptr<std::atomic<unsigned long long>[]> arrive;  // [rank]
  std::vector<Ledger> ledger;
  std::unique_ptr<std::atomic<int>[]> computed, pushed;  // [rank][tile], [rank][unit] this launch
  std::vector<double> delay_us, speed;                   // per rank, per launch
  std::atomic<bool> failed{false};
  std::string why;
  std::atomic<int> why_set{0};
  Clock::time_point deadline;

  explicit AgWorld(const AgConfig& cfg)
      : c(cfg),
        L(weave::tp::make_layout(cfg.W * cfg.tm * weave::tp::kBM - 37, cfg.tn * weave::tp::kBN, cfg.W, 2)),
        gathered(static_cast<size_t>(cfg.W) * L.row_tiles() * cfg.P),
        ready(new std::atomic<unsigned long long>[static_cast<size_t>(cfg.W) * L.row_tiles()]),
        arrive(new std::atomic<unsigned long long>[cfg.W]),
        ledger(cfg.W, Ledger{}),
        computed(new std::atomic<int>[static_cast<size_t>(cfg.W) * L.work()]),
        pushed(new std::atomic<int>[static_cast<size_t>(cfg.W) * L.row_tiles() * cfg.P]),
        delay_us(cfg.W, 0),
        speed(cfg.W, 1) {
    for (auto& g : gathered) g = -1;
    for (int i = 0; i < cfg.W * L.row_tiles(); ++i) ready[i] = 0;
    for (int r = 0; r < cfg.W; ++r) arrive[r] = 0;
  }
  static long long value(int launch, int owner, int vrow, int slice) {
    return 1000003LL * launch + 7919LL * owner + 31LL * vrow + slice;
  }
  std::atomic<long long>& slot(int rank, int vrow, int slice) {
    return gathered[(static_cast<size_t>(rank) * L.row_tiles() + vrow) * c.P + slice];
  }
  std::atomic<unsigned long long>& ready_of(int rank, int vrow) { return ready[static_cast<size_t>(rank) * L.row_tiles() + vrow]; }
  void fail(const std::string& s) {
    if (why_set.exchange(1) == 0) why = s;
    failed = true;
  }
  // For the claims' polls: past the deadline the run failed (a stall), and the poll gives up.
  bool stalled(int rank, const char* what, long long index) {
    if (failed) return true;
    if (Clock::now() < deadline) return false;
    fail(std::string("stalled: rank ") + std::to_string(rank) + " polling " + what + " " + std::to_string(index));
    return true;
  }
};

void ag_block(AgWorld& w, int rank, int b, int round, unsigned long long seed) {
  const AgConfig& c = w.c;
  const weave::tp::Layout& L = w.L;
  std::mt19937_64 rng(seed);
  if (w.delay_us[rank] > 0) busy(w.delay_us[rank], rng);  // a rank that starts late
  if (b == 0)  // this rank entered the call (the kernel's block 0, in its prologue)
    for (int d = 0; d < c.W; ++d) w.arrive[d].fetch_add(1, std::memory_order_release);
  LedgerParams p;
  p.blocks = c.B;
  p.compute_tasks = L.work();
  p.comm_tasks = weave::tp::ag_units(L, rank, c.P);
  p.compute_prior = 1e3;
  p.comm_prior = c.push_prior;
  Ledger& l = w.ledger[rank];
  const unsigned long long rows_in = static_cast<unsigned long long>(round) * c.P;
  const unsigned long long entered = static_cast<unsigned long long>(round) * c.W;
  auto compute_ready = [&](long long i) {
    const weave::tp::Item t = weave::tp::item(L, rank, static_cast<int>(i));
    if (t.owner == rank || w.ready_of(rank, t.vrow).load(std::memory_order_relaxed) >= rows_in) return true;
    return w.stalled(rank, "tile", i);
  };
  auto arrived = [&](long long k) {
    return w.arrive[rank].load(std::memory_order_relaxed) >= entered || w.stalled(rank, "unit", k);
  };
  Role role = Role::Compute;
  while (!w.failed) {
    const Task task = next_task(l, p, role, compute_ready, arrived, arrived);
    if (task.role == Role::Done || w.failed) break;
    const auto t0 = Clock::now();
    if (task.role == Role::Compute) {
      const weave::tp::Item t = weave::tp::item(L, rank, static_cast<int>(task.index));
      if (t.owner != rank) {  // the kernel's tile_of: the wait, satisfied at the claim, is the acquire
        if (w.ready_of(rank, t.vrow).load(std::memory_order_acquire) < rows_in)
          return w.fail("rank " + std::to_string(rank) + ": tile " + std::to_string(task.index) +
                        " handed out before its rows arrived");
        for (int sl = 0; sl < c.P; ++sl)
          if (w.slot(rank, t.vrow, sl).load(std::memory_order_relaxed) != AgWorld::value(round, t.owner, t.vrow, sl))
            return w.fail("rank " + std::to_string(rank) + ": tile " + std::to_string(task.index) + " read a stale row");
      }
      busy(c.compute_us * w.speed[rank], rng);
      w.computed[static_cast<size_t>(rank) * L.work() + task.index]++;
    } else {
      if (w.arrive[rank].load(std::memory_order_acquire) < entered)
        return w.fail("rank " + std::to_string(rank) + ": unit " + std::to_string(task.index) + " before the arrival");
      const int u = static_cast<int>(task.index), vrow = L.off[rank] + u / c.P;
      busy(c.push_us * w.speed[rank], rng);
      for (int d = 0; d < c.W; ++d) {
        if (d == rank) continue;
        w.slot(d, vrow, u % c.P).store(AgWorld::value(round, rank, vrow, u % c.P), std::memory_order_relaxed);
        w.ready_of(d, vrow).fetch_add(1, std::memory_order_release);
      }
      w.pushed[static_cast<size_t>(rank) * L.row_tiles() * c.P + u]++;
    }
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
    task_done(l, task.role, static_cast<unsigned long long>(ns));
  }
  if (!w.failed) block_exit(l, c.B);
}

void run_ag(const AgConfig& c, unsigned long long seed) {
  AgWorld w(c);
  const weave::tp::Layout& L = w.L;
  const std::string where = "AG W " + std::to_string(c.W) + " B " + std::to_string(c.B) + " tiles " +
                            std::to_string(L.work()) + " P " + std::to_string(c.P) + " push prior " +
                            std::to_string(c.push_prior);
  std::mt19937_64 rng(seed);
  for (int launch = 1; launch <= c.launches; ++launch) {
    for (int i = 0; i < c.W * L.work(); ++i) w.computed[i] = 0;
    for (int i = 0; i < c.W * L.row_tiles() * c.P; ++i) w.pushed[i] = 0;
    // Peers: one rank late (up to 300 us), one slow (2x) or fast (0.5x), changing per launch.
    for (int r = 0; r < c.W; ++r) w.delay_us[r] = 0, w.speed[r] = 1;
    w.delay_us[rng() % c.W] = std::uniform_real_distribution<double>(0, 300)(rng);
    w.speed[rng() % c.W] = launch % 2 ? 2.0 : 0.5;
    run_launch(w, ag_block, c.W, c.B, launch, seed);
    ASSERT_FALSE(w.failed) << where << " launch " << launch << ": " << w.why;
    for (int r = 0; r < c.W; ++r) {
      for (int i = 0; i < L.work(); ++i)
        ASSERT_EQ(w.computed[static_cast<size_t>(r) * L.work() + i].load(), 1) << where << ": rank " << r << " tile " << i;
      for (int u = 0; u < weave::tp::ag_units(L, r, c.P); ++u)
        ASSERT_EQ(w.pushed[static_cast<size_t>(r) * L.row_tiles() * c.P + u].load(), 1)
            << where << ": rank " << r << " unit " << u;
      for (int v = 0; v < L.row_tiles(); ++v)
        ASSERT_EQ(w.ready_of(r, v).load(), v >= L.off[r] && v < L.off[r + 1] ? 0ull : static_cast<unsigned long long>(launch) * c.P)
            << where << ": rank " << r << " row tile " << v;
      const Ledger& l = w.ledger[r];
      const unsigned long long words[] = {l.compute_claimed, l.compute_done, l.compute_cycles, l.comm_claimed,
                                          l.comm_done,       l.comm_cycles,  l.comm_blocks,    l.exited};
      for (unsigned long long x : words) ASSERT_EQ(x, 0ull) << where << ": rank " << r << "'s ledger after the launch";
      ASSERT_EQ(l.launches, static_cast<unsigned long long>(launch)) << where << ": rank " << r;
    }
  }
}

// W 2..4 (threads are the blocks of every rank), one block to more blocks than tiles, shards of
// one and three row tiles, P 1 and 3, pushes thought free or dear.
TEST(SmLedger, AgGemmEveryTaskOnceNoStall) {
  const unsigned long long seed = weave::check::test_seed();
  std::mt19937_64 rng(seed);
  int configs = 0;
  for (int W : {2, 3, 4})
    for (int B : {1, 2, 5})
      for (int tm : {1, 3})
        for (int P : {1, 3})
          for (double push_prior : {1.0, 1e6}) {
            const double compute_us = std::uniform_real_distribution<double>(1, 20)(rng);
            const double push_us = std::uniform_real_distribution<double>(1, 20)(rng);
            run_ag({W, B, tm, 2, P, 3, compute_us, push_us, push_prior}, weave::check::derive(seed, ++configs));
            if (HasFatalFailure()) return;
          }
  std::printf("%d AG + GEMM configurations, 3 launches each\n", configs);
}

// A compute task with an input is claimed only once the input is in place: until then the block
// polls holding no index; a block whose next tile waits pushes (whatever the target: both blocks
// may); once every unit is claimed, it computes again.
TEST(SmLedger, ComputeClaimedOnceItsRowsArrive) {
  Ledger l{};
  const LedgerParams p = params(2, 3, 2, 1e-6);  // pushes thought nearly free: the target is 1
  bool rows[3] = {true, false, false}, arrived = false;
  int polls = 0, stuck = 0;
  bool held = false;
  auto compute_ready = [&](long long i) {
    if (i == 1 && !rows[1]) {
      held = held || l.compute_claimed != 1;
      if (++polls == 3) rows[1] = true;
    }
    return rows[i] || ++stuck > 1000;  // (a block left polling tile 2 gives up: a failure below, not a hang)
  };
  auto begun = [&](long long) { return arrived; };
  Role r0 = Role::Compute, r1 = Role::Compute;
  Task t = next_task(l, p, r0, compute_ready, begun, begun);
  EXPECT_EQ(t.role, Role::Compute);
  EXPECT_EQ(t.index, 0);
  t = next_task(l, p, r1, compute_ready, begun, begun);  // tile 1's rows come after 3 polls
  EXPECT_EQ(t.role, Role::Compute);
  EXPECT_EQ(t.index, 1);
  EXPECT_EQ(polls, 3);
  EXPECT_FALSE(held) << "an index was claimed before its rows were in place";
  arrived = true;
  t = next_task(l, p, r0, compute_ready, begun, begun);  // tile 2 waits: push
  EXPECT_EQ(t.role, Role::Comm);
  EXPECT_EQ(t.index, 0);
  t = next_task(l, p, r1, compute_ready, begun, begun);  // past the target 1: the cap is B
  EXPECT_EQ(t.role, Role::Comm);
  EXPECT_EQ(t.index, 1);
  EXPECT_EQ(l.comm_blocks, 2ull);
  EXPECT_EQ(l.peak_comm, 2ull);
  rows[2] = true;
  t = next_task(l, p, r0, compute_ready, begun, begun);
  EXPECT_EQ(t.role, Role::Compute);
  EXPECT_EQ(t.index, 2);
  EXPECT_EQ(l.comm_blocks, 1ull);
  EXPECT_EQ(next_task(l, p, r1, compute_ready, begun, begun).role, Role::Done);
  EXPECT_EQ(next_task(l, p, r0, compute_ready, begun, begun).role, Role::Done);
  EXPECT_EQ(l.comm_blocks, 0ull);
  EXPECT_EQ(l.compute_claimed, 3ull);  // compare-and-swap claims never run past the end
}

// One block: its own tile, then pushes while its next tile's rows are out (the target alone, capped
// at B - 1 = 0, would keep it computing and polling for ever at W = 2), then that tile.
TEST(SmLedger, OneBlockPushesWhileItsNextTileWaits) {
  Ledger l{};
  const LedgerParams p = params(1, 2, 3, 1.0);
  int stuck = 0;
  auto compute_ready = [&](long long i) { return i == 0 || ++stuck > 1000; };  // (gives up: a failure, not a hang)
  auto arrived = [](long long) { return true; };
  Role role = Role::Compute;
  Task t = next_task(l, p, role, compute_ready, arrived, arrived);
  EXPECT_EQ(t.role, Role::Compute);
  EXPECT_EQ(t.index, 0);
  for (long long k = 0; k < 3; ++k) {
    t = next_task(l, p, role, compute_ready, arrived, arrived);
    EXPECT_EQ(t.role, Role::Comm);
    EXPECT_EQ(t.index, k);
  }
  int polls = 0;
  t = next_task(l, p, role, [&](long long i) { return i == 0 || ++polls > 2; }, arrived, arrived);
  EXPECT_EQ(t.role, Role::Compute);
  EXPECT_EQ(t.index, 1);
  EXPECT_EQ(next_task(l, p, role, compute_ready, arrived, arrived).role, Role::Done);
  EXPECT_TRUE(block_exit(l, 1));
}

}  // namespace
