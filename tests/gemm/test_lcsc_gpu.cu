// The LCSC template with a toy kernel: every role runs, each work item goes through loader,
// consumers and storer exactly the expected number of times on compute blocks only, each
// communicator block runs once, for several num_comm_sms; a kernel whose shared memory
// exceeds the device limit is rejected with a clear message.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "weave/lcsc.cuh"

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
