// The LCSC template with a toy kernel: every role runs, each work item goes through loader,
// consumers and storer exactly the expected number of times on compute blocks only, each
// communicator block runs once, for several num_comm_sms; a kernel whose shared memory
// exceeds the device limit is rejected with a clear message. With dynamic tasks: work items and
// other tasks handed out at run time each run exactly once, other tasks on every consumer thread,
// every task accounted, every block's exit called once.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "weave/lcsc.cuh"
#include "weave/memory_order.cuh"

using namespace weave;

namespace {

struct ToyGlobals {
  int* loads;      // per work item: loader calls
  int* consumes;   // per work item: consumer-warpgroup calls
  int* finishes;   // per work item: consumer finish calls
  int* stores;     // per work item: storer calls
  int* store_blk;  // per work item: the block that stored it
  int* comm;       // per communicator block: runs
  int* comm_n;     // per communicator block: the count it was told
  int work, iters;
};

template <int Stages, int StageBytes>
struct Toy {
  using Globals = ToyGlobals;
  static constexpr int kStages = Stages, kConsumers = 2, kProducerRegs = 40, kConsumerRegs = 232, kReleaseLag = 1,
                       kOutputParts = 2;
  static constexpr uint32_t kStageTxBytes = 0;
  struct alignas(1024) Stage {
    unsigned char bytes[StageBytes];
  };
  struct alignas(1024) Output {
    int v[32];
  };
  struct ConsumerState {
    int n;
  };
  static __host__ __device__ int num_work(const Globals& g) { return g.work; }
  static __device__ int num_iters(const Globals& g, int) { return g.iters; }
  static __device__ void prologue(const Globals&) {}
  static __device__ void load(const Globals& g, Stage&, tile::Mbarrier&, int w, int) { atomicAdd(&g.loads[w], 1); }
  static __device__ void consume(const Globals& g, ConsumerState& st, Stage&, int w, int it, int) {
    if (threadIdx.x % 128 == 0) atomicAdd(&g.consumes[w], 1);
    st.n = it;
  }
  static __device__ void drain(ConsumerState&) {}
  static __device__ void finish(const Globals& g, ConsumerState&, Output& o, int w, int c, int p) {
    if (threadIdx.x % 128 == 0) {
      o.v[c] = w * 2 + p;
      atomicAdd(&g.finishes[w], 1);
    }
  }
  static __device__ void store(const Globals& g, Output& o, int w, int p) {
    // Counts only hand-offs where both consumers' part p is visible.
    if (o.v[0] == w * 2 + p && o.v[1] == w * 2 + p) atomicAdd(&g.stores[w], 1);
    g.store_blk[w] = blockIdx.x;
  }
  static __device__ void communicator(const Globals& g, void*, int i, int n) {
    __syncthreads();
    if (threadIdx.x == 0) {
      atomicAdd(&g.comm[i], 1);
      g.comm_n[i] = n;
    }
  }
};

// Dynamic tasks: each block's loader alternates between claiming a work item and an other task
// (global claim counters), so that work items and other tasks interleave in every block's ring.
// With `dep`, block 0 claims work items only, and other task i waits until work item dep_of[i] is
// stored, where dep_of[i] is the next work item not yet claimed when i was handed out: a block
// that then claimed that item itself and queued it behind i would never finish i; the template's
// loader waits for an other task's end before choosing again, so block 0 (or another) stores it.
struct DynGlobals : ToyGlobals {
  int* claims;       // [0]: work items claimed, [1]: other tasks claimed
  int* other_runs;   // per other task: consumer threads that ran it
  int* other_after;  // per other task: consumer threads that saw every thread's run after the sync
  int* finished;     // [0]: work tasks finished, [1]: other tasks finished
  int* exits;        // per block: block_exit calls
  int* dep_of;       // per other task (dep): the work item it waits for
  int* timed_out;    // other tasks whose wait passed 10 s (dep)
  int others, dep;
};

template <int Stages>
struct DynToy : Toy<Stages, 1024> {
  using Globals = DynGlobals;
  static constexpr bool kDynamicTasks = true;
  struct TaskState {
    int n = 0;
  };
  static __device__ lcsc::Task next_task(const Globals& g, TaskState& st, int) {
    static_assert(kDynamicTasks);
    for (int tries = 0; tries < 2; ++tries, ++st.n) {
      const int kind = g.dep && blockIdx.x == 0 ? 0 : st.n % 2;
      const int limit = kind == 0 ? g.work : g.others;
      if (atomicAdd(&g.claims[kind], 0) >= limit) continue;
      const int next_work = atomicAdd(&g.claims[0], 0);
      const int i = atomicAdd(&g.claims[kind], 1);
      if (i < limit) {
        ++st.n;
        if (kind == 1 && g.dep) g.dep_of[i] = next_work;
        return {kind == 0 ? lcsc::TaskKind::Work : lcsc::TaskKind::Other, i};
      }
    }
    if (g.dep && blockIdx.x == 0 && atomicAdd(&g.claims[1], 0) < g.others) return next_task_other(g);
    return {};
  }
  // Block 0 in dep mode, once the work items are gone: the other tasks left (nothing to wait for).
  static __device__ lcsc::Task next_task_other(const Globals& g) {
    const int i = atomicAdd(&g.claims[1], 1);
    if (i >= g.others) return {};
    g.dep_of[i] = g.work;
    return {lcsc::TaskKind::Other, i};
  }
  static __device__ unsigned long long other_task(const Globals& g, int i, int t, int n) {
    if (g.dep && t == 0 && g.dep_of[i] < g.work) {
      const volatile int* stored = g.stores + g.dep_of[i];
      const unsigned long long t0 = globaltimer();
      while (*stored < 2)
        if (globaltimer() - t0 > 10000000000ull) {
          atomicAdd(g.timed_out, 1);
          break;
        }
    }
    atomicAdd(&g.other_runs[i], 1);
    lcsc::consumers_sync<DynToy>();
    if (atomicAdd(&g.other_runs[i], 0) == n) atomicAdd(&g.other_after[i], 1);
    lcsc::consumers_sync<DynToy>();
    return t == 0 ? 1 : 0;
  }
  static __device__ void task_finished(const Globals& g, lcsc::Task t, unsigned long long) {
    atomicAdd(&g.finished[t.kind == lcsc::TaskKind::Work ? 0 : 1], 1);
  }
  static __device__ void block_exit(const Globals& g, int) { atomicAdd(&g.exits[blockIdx.x], 1); }
};

std::vector<int> fetch(const int* d, int n) {
  std::vector<int> h(n);
  WEAVE_CUDA_CHECK(cudaMemcpy(h.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost));
  return h;
}

}  // namespace

TEST(Lcsc, RolesAndSplit) {
  int dev = 0, sms = 0;
  WEAVE_CUDA_CHECK(cudaGetDevice(&dev));
  WEAVE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  for (int comm : {0, 1, 8, 16, 32})
    for (int work : {1, 7, sms, 5 * sms + 3}) {
      SCOPED_TRACE(testing::Message() << "num_comm_sms " << comm << " work " << work);
      const int iters = 5;
      int* buf = nullptr;
      const int total = 5 * work + 2 * sms;
      WEAVE_CUDA_CHECK(cudaMalloc(&buf, total * sizeof(int)));
      WEAVE_CUDA_CHECK(cudaMemset(buf, 0, total * sizeof(int)));
      // The recorded values (not the counts) start as -1: a storer or communicator that never
      // ran cannot leave behind a 0 that happens to be the expected block or count.
      WEAVE_CUDA_CHECK(cudaMemset(buf + 4 * work, 0xFF, work * sizeof(int)));
      WEAVE_CUDA_CHECK(cudaMemset(buf + 5 * work + sms, 0xFF, sms * sizeof(int)));
      ToyGlobals g{buf, buf + work, buf + 2 * work, buf + 3 * work, buf + 4 * work, buf + 5 * work,
                   buf + 5 * work + sms, work, iters};
      lcsc::Config c;
      c.num_comm_sms = comm;
      const lcsc::Plan p = lcsc::launch<Toy<4, 1024>>(g, c, nullptr);
      WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_EQ(p.comm_blocks, comm);
      EXPECT_LE(p.grid(), sms);
      EXPECT_GE(p.compute_blocks, 1);
      EXPECT_LE(p.compute_blocks, std::min(work, sms - comm));
      auto loads = fetch(g.loads, work), cons = fetch(g.consumes, work), fin = fetch(g.finishes, work),
           st = fetch(g.stores, work), blk = fetch(g.store_blk, work), cm = fetch(g.comm, sms),
           cn = fetch(g.comm_n, sms);
      for (int w = 0; w < work; ++w) {
        EXPECT_EQ(loads[w], iters);
        EXPECT_EQ(cons[w], 2 * iters);
        EXPECT_EQ(fin[w], 4);  // 2 consumers x 2 output parts
        EXPECT_EQ(st[w], 2);
        EXPECT_EQ(blk[w], w % p.compute_blocks);  // compute blocks only, in the documented order
      }
      for (int i = 0; i < sms; ++i) {
        EXPECT_EQ(cm[i], i < comm ? 1 : 0) << "communicator block " << i;
        if (i < comm) EXPECT_EQ(cn[i], comm);
      }
      cudaFree(buf);
    }
}

TEST(Lcsc, RejectsTooMuchSharedMemory) {
  ToyGlobals g{};
  g.work = 1;
  g.iters = 1;
  try {
    lcsc::launch<Toy<4, 64 * 1024>>(g, {}, nullptr);  // 256 KB of stages
    FAIL() << "launch accepted a kernel over the shared-memory limit";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bytes of shared memory per block"), std::string::npos) << e.what();
  }
  try {
    lcsc::Config c;
    c.num_comm_sms = 1 << 20;
    lcsc::launch<Toy<2, 1024>>(g, c, nullptr);
    FAIL() << "num_comm_sms beyond the SM count accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("num_comm_sms"), std::string::npos) << e.what();
  }
}

// Every work item and other task exactly once, every task accounted, each block's exit once;
// rings that wrap (one K step per item, thousands of items), other tasks that depend on work items
// claimed later; a hang fails the test within a minute instead of stalling it.
TEST(Lcsc, DynamicTasks) {
  int dev = 0, sms = 0;
  WEAVE_CUDA_CHECK(cudaGetDevice(&dev));
  WEAVE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  struct Case {
    int work, others, iters, dep;
  };
  std::vector<Case> cases;
  for (int work : {1, 7, 3 * sms + 5})
    for (int others : {0, 5, 2 * sms + 1}) cases.push_back({work, others, 3, 0});
  cases.push_back({40 * sms + 3, 0, 1, 0});        // work only, one K step each: the rings wrap
  cases.push_back({8 * sms + 1, 4 * sms + 3, 1, 1});  // other tasks waiting for later work items
  cases.push_back({3 * sms, 2 * sms, 4, 1});
  for (const Case& k : cases) {
    const int work = k.work, others = k.others, iters = k.iters;
    SCOPED_TRACE(testing::Message() << "work " << work << " others " << others << " iters " << iters << " dep "
                                    << k.dep);
    const int total = 5 * work + 2 + 3 * others + 2 + sms + 1;
    int* buf = nullptr;
    WEAVE_CUDA_CHECK(cudaMalloc(&buf, total * sizeof(int)));
    WEAVE_CUDA_CHECK(cudaMemset(buf, 0, total * sizeof(int)));
    DynGlobals g{};
    static_cast<ToyGlobals&>(g) = ToyGlobals{buf, buf + work, buf + 2 * work, buf + 3 * work, buf + 4 * work,
                                             nullptr, nullptr, work, iters};
    int* q = buf + 5 * work;
    g.claims = q, q += 2;
    g.other_runs = q, q += others;
    g.other_after = q, q += others;
    g.dep_of = q, q += others;
    g.finished = q, q += 2;
    g.exits = q, q += sms;
    g.timed_out = q;
    g.others = others, g.dep = k.dep;
    lcsc::Config c;
    c.balance_waves = false;
    const lcsc::Plan p = lcsc::launch<DynToy<4>>(g, c, nullptr);
    const auto t0 = std::chrono::steady_clock::now();
    cudaError_t st;
    while ((st = cudaStreamQuery(nullptr)) == cudaErrorNotReady) {
      if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(60)) {
        std::fprintf(stderr, "Lcsc.DynamicTasks: the kernel did not end within 60 s (work %d, others %d, dep %d): a "
                     "hang in the dynamic-task ring\n", work, others, k.dep);
        std::_Exit(1);  // the kernel cannot be stopped; fail now rather than at CTest's timeout
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    WEAVE_CUDA_CHECK(st);
    EXPECT_EQ(p.comm_blocks, 0);
    auto loads = fetch(g.loads, work), cons = fetch(g.consumes, work), fin = fetch(g.finishes, work),
         stv = fetch(g.stores, work), runs = fetch(g.other_runs, others), after = fetch(g.other_after, others),
         done = fetch(g.finished, 2), exits = fetch(g.exits, sms), late = fetch(g.timed_out, 1);
    for (int w = 0; w < work; ++w) {
      EXPECT_EQ(loads[w], iters) << "work item " << w;
      EXPECT_EQ(cons[w], 2 * iters) << "work item " << w;
      EXPECT_EQ(fin[w], 4) << "work item " << w;
      EXPECT_EQ(stv[w], 2) << "work item " << w;
    }
    for (int i = 0; i < others; ++i) {
      EXPECT_EQ(runs[i], 256) << "other task " << i;   // every consumer thread, once
      EXPECT_EQ(after[i], 256) << "other task " << i;  // and the sync held them together
    }
    EXPECT_EQ(done[0], work);
    EXPECT_EQ(done[1], others);
    EXPECT_EQ(late[0], 0) << "other tasks whose work item was not stored within 10 s";
    for (int b = 0; b < sms; ++b) EXPECT_EQ(exits[b], b < p.grid() ? 1 : 0) << "block " << b;
    cudaFree(buf);
  }
  DynGlobals g{};
  g.work = 1;
  lcsc::Config c;
  c.num_comm_sms = 4;
  try {
    lcsc::launch<DynToy<2>>(g, c, nullptr);
    FAIL() << "a dynamic-task kernel accepted communicator blocks";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("must be 0"), std::string::npos) << e.what();
  }
}
