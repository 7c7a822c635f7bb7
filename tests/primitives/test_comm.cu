// Communicator lifecycle on 2+ ranks: 100 create/destroy cycles leak neither file descriptors
// nor device memory; the heap is really shared (a peer's write lands in my memory).
#include <dirent.h>

#include <optional>

#include "common.hpp"
#include "weave/runtime/env.hpp"

using weave::runtime::CommOptions;
using weave::runtime::Communicator;

namespace {
int open_fds() {
  int n = 0;
  DIR* d = opendir("/proc/self/fd");
  while (readdir(d)) ++n;
  closedir(d);
  return n;
}
size_t free_device_bytes() {
  size_t f = 0, t = 0;
  WEAVE_CUDA_CHECK(cudaMemGetInfo(&f, &t));
  return f;
}
__global__ void write_peer(int* peer, int v) { *peer = v; }
}  // namespace

TEST(Communicator, HundredCreateDestroyCyclesLeakNothing) {
  CommOptions o;
  o.heap_bytes = size_t(64) << 20;
  int fds_after_first = 0;
  size_t free_after_first = 0;
  for (int i = 0; i < 100; ++i) {
    {
      Communicator c(o);
      ASSERT_GE(c.world(), 2);
      int* x = static_cast<int*>(c.alloc(4096));
      auto peers = c.peers(x, sizeof(int));
      write_peer<<<1, 1>>>(static_cast<int*>(peers[(c.rank() + 1) % c.world()]), 1000 + i * 8 + c.rank());
      WEAVE_CUDA_CHECK(cudaGetLastError());
      c.sync();
      c.barrier();
      int h = 0;
      WEAVE_CUDA_CHECK(cudaMemcpy(&h, x, sizeof h, cudaMemcpyDeviceToHost));
      ASSERT_EQ(h, 1000 + i * 8 + (c.rank() + c.world() - 1) % c.world()) << "cycle " << i;
      c.free(x);
    }
    if (i == 0) {
      fds_after_first = open_fds();
      free_after_first = free_device_bytes();
    }
  }
  EXPECT_EQ(open_fds(), fds_after_first) << "file descriptors leaked over 99 cycles";
  // 2 MiB of slack: the driver's own bookkeeping may move by a page; a leaked heap is 64 MiB each.
  EXPECT_GE(free_device_bytes() + (size_t(2) << 20), free_after_first) << "device memory leaked over 99 cycles";
}

TEST(Communicator, ReportsTheDevice) {
  Communicator c;
  int ndev = 0;
  WEAVE_CUDA_CHECK(cudaGetDeviceCount(&ndev));
  if (weave::env::get_bool("WEAVE_SHARE_GPUS")) {  // weave-run --share-gpus: ranks take turns on the GPUs
    EXPECT_EQ(c.device(), c.local_rank() % ndev);
  } else {
    EXPECT_EQ(c.device(), c.local_rank());
    EXPECT_LE(c.world(), ndev);
  }
  EXPECT_GT(c.sm_count(), 0);
  EXPECT_GE(c.smem_optin(), size_t(48) << 10);
}

TEST(Communicator, WorldLargerThanTheGpusIsRefused) {
  int ndev = 0;
  WEAVE_CUDA_CHECK(cudaGetDeviceCount(&ndev));
  // With kMaxWorld GPUs visible, one more rank is refused by the compile-time maximum instead.
  const bool over_max = ndev + 1 > weave::kMaxWorld;
  // Without GPU sharing, which is what this test is about (restored when the test ends).
  const std::optional<std::string> share = weave::env::raw("WEAVE_SHARE_GPUS");
  const std::string saved = share.value_or("");
  unsetenv("WEAVE_SHARE_GPUS");
  struct Restore {
    const std::string& v;
    bool had;
    ~Restore() {
      if (had) setenv("WEAVE_SHARE_GPUS", v.c_str(), 1);
    }
  } restore{saved, share.has_value()};
  weave::runtime::LaunchInfo li;
  li.world = li.local_world = ndev + 1;
  li.rank = li.local_rank = 0;
  li.job_id = "too-large";
  try {
    Communicator c(li, CommOptions{});
    FAIL() << "a world larger than the GPUs was accepted";
  } catch (const weave::Error& e) {
    EXPECT_NE(std::string(e.what()).find(over_max ? "outside 1.." : "larger than the"), std::string::npos) << e.what();
  }
}
