// Shared pieces of the multi-rank GPU tests: one communicator per process, a job-wide seed,
// host-side reference data regenerable for any rank.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "check/host_copy.hpp"
#include "check/seed.hpp"
#include "weave/common/error.hpp"
#include "weave/memory_order.cuh"
#include "weave/runtime/communicator.hpp"

namespace wt {

inline std::unique_ptr<weave::runtime::Communicator>& comm_slot() {
  static std::unique_ptr<weave::runtime::Communicator> c;
  return c;
}
inline weave::runtime::Communicator& comm() {
  auto& c = comm_slot();
  if (!c) {
    weave::runtime::CommOptions o;
    o.heap_bytes = size_t(256) << 20;
    c = std::make_unique<weave::runtime::Communicator>(o);
  }
  return *c;
}

// A seed that is fresh for every call and identical on every rank: the n-th call derives from
// rank 0's check::test_seed() (WEAVE_TEST_SEED replays a run; the test main prints it).
inline uint64_t job_seed() {
  static uint64_t calls = 0;
  uint64_t mine = weave::check::derive(weave::check::test_seed(), 0x5EED, calls++);
  std::vector<uint64_t> all(comm().world());
  comm().bootstrap().all_gather(&mine, all.data(), sizeof mine);
  return all[0];
}

template <class T>
inline float to_f(T x) {
  if constexpr (std::is_same_v<T, float>) return x;
  else if constexpr (std::is_same_v<T, __half>) return __half2float(x);
  else return __bfloat162float(x);
}
template <class T>
inline T from_f(float x) {
  if constexpr (std::is_same_v<T, float>) return x;
  else if constexpr (std::is_same_v<T, __half>) return __float2half_rn(x);
  else return __float2bfloat16_rn(x);
}
template <class T>
inline uint32_t bits(T x) {
  uint32_t b = 0;
  std::memcpy(&b, &x, sizeof(T));
  return b;
}
template <class T>
inline T poison() {  // a NaN in every format, easy to spot
  T x;
  std::memset(&x, 0xff, sizeof(T));
  return x;
}

// rows x ld values, uniform in [-1, 1], from (seed, stream): any rank can regenerate any rank's data.
template <class T>
inline std::vector<T> random_matrix(uint64_t seed, uint64_t stream, size_t n) {
  std::mt19937_64 rng(seed ^ (stream * 0xD1B54A32D192ED03ull));
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<T> v(n);
  for (auto& x : v) x = from_f<T>(u(rng));
  return v;
}

using weave::check::to_device;
using weave::check::to_host;

// A CUDA graph of what `calls` enqueues on `s` (captured in `mode`), instantiated.
struct Graph {
  cudaGraph_t g = nullptr;
  cudaGraphExec_t e = nullptr;
  template <class F>
  Graph(cudaStream_t s, F&& calls, cudaStreamCaptureMode mode = cudaStreamCaptureModeThreadLocal) {
    WEAVE_CUDA_CHECK(cudaStreamBeginCapture(s, mode));
    calls();
    WEAVE_CUDA_CHECK(cudaStreamEndCapture(s, &g));
    WEAVE_CUDA_CHECK(cudaGraphInstantiate(&e, g, 0));
  }
  ~Graph() {
    if (e) cudaGraphExecDestroy(e);
    if (g) cudaGraphDestroy(g);
  }
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  void launch(cudaStream_t s) const { WEAVE_CUDA_CHECK(cudaGraphLaunch(e, s)); }
};

// Runs `call` while `s` captures a CUDA graph (relaxed mode); returns the weave::Error message
// it threw ("" if none) and how many nodes the capture recorded.
template <class F>
inline std::pair<std::string, size_t> under_capture(cudaStream_t s, F&& call) {
  WEAVE_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
  std::string msg;
  try {
    call();
  } catch (const weave::Error& e) {
    msg = e.what();
  }
  cudaGraph_t g = nullptr;
  WEAVE_CUDA_CHECK(cudaStreamEndCapture(s, &g));
  size_t nodes = 0;
  if (g) {
    WEAVE_CUDA_CHECK(cudaGraphGetNodes(g, nullptr, &nodes));
    WEAVE_CUDA_CHECK(cudaGraphDestroy(g));
  }
  return {msg, nodes};
}

// Expects `call`, issued on `s` while it captures a CUDA graph, to throw weave's capture error
// naming `what`, with nothing enqueued into the graph.
template <class F>
inline void expect_capture_rejected(cudaStream_t s, const char* what, F&& call) {
  const auto [msg, nodes] = under_capture(s, call);
  EXPECT_NE(msg.find("capturing a CUDA graph"), std::string::npos) << what << ": " << msg;
  EXPECT_NE(msg.find(what), std::string::npos) << msg;
  EXPECT_EQ(nodes, 0u) << what << ": something was enqueued into the graph";
}

// Device work done and every rank past this point.
inline void settle() {
  comm().sync();
  comm().barrier();
}

// Whether some ranks share a GPU (weave-run --share-gpus on a machine with fewer GPUs than ranks):
// their kernels then take turns instead of running side by side. Collective on its first call
// (every rank, `c` of the job's ranks), remembered after it.
inline bool gpus_shared(weave::runtime::Communicator& c) {
  static const bool shared = [&c] {
    const cudaDeviceProp& p = c.props();
    const long long mine = (static_cast<long long>(p.pciDomainID) << 32) | (p.pciBusID << 8) | p.pciDeviceID;
    std::vector<long long> all(c.world());
    c.bootstrap().all_gather(&mine, all.data(), sizeof mine);
    std::sort(all.begin(), all.end());
    return std::adjacent_find(all.begin(), all.end()) != all.end();
  }();
  return shared;
}

// Busy-waits `ns` on the global timer.
__device__ inline void spin_for_ns(unsigned long long ns) {
  const unsigned long long t0 = weave::globaltimer();
  while (weave::globaltimer() - t0 < ns) {
  }
}
namespace {
// Holds a stream for `ns` (a rank arriving late at the next call).
__global__ void spin_ns(unsigned long long ns) { spin_for_ns(ns); }
}  // namespace

}  // namespace wt
