// The persistent attention kernel takes tiles from a counter zeroed before each launch. Many
// launches in flight at once must never share a live counter (one zeroing another's, or two
// drawing from one, leaves tiles of a launch uncomputed). Here 80 streams, more than the old
// 64-counter pool, each with two launches on its own inputs, all held behind one gate kernel and
// released together; then one launch captured into a CUDA graph and replayed on several streams
// next to eager launches. Every output starts as NaN: all of it must be overwritten (a skipped
// tile stays NaN), and rows of every stream are checked against a float64 CPU reference.
#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "attention/attention.hpp"
#include "check/seed.hpp"
#include "weave/common/error.hpp"
#include "weave/memory_order.cuh"

using namespace weave;
using bf16 = __nv_bfloat16;

namespace {

// Ragged S (not a multiple of the 128-row tile), grouped-query heads, and 8 x 2 x 16 = 256 tiles:
// more than an H200's 132 SMs, so every persistent CTA draws from the counter.
constexpr int kB = 2, kS = 1000, kHq = 16, kHkv = 4, kD = 128;
constexpr size_t kNq = size_t(kB) * kS * kHq * kD, kNk = size_t(kB) * kS * kHkv * kD, kNl = size_t(kB) * kHq * kS;

// Input element i of tensor `which` (0 q, 1 k, 2 v) of stream input set `set`: a hash, so that
// the CPU reference recomputes any element without copies.
__host__ __device__ inline uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
__host__ __device__ inline bf16 input(uint64_t seed, int set, int which, size_t i) {
  const uint64_t h = mix(seed ^ mix((uint64_t(set) << 40) ^ (uint64_t(which) << 36) ^ i));
  return __float2bfloat16_rn(float(h >> 40) * (2.0f / 16777216.0f) - 1.0f);
}
__global__ void fill(bf16* p, size_t n, uint64_t seed, int set, int which) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = input(seed, set, which, i);
}
// Elements of o (bf16) and lse (fp32) that are NaN: the poison, never overwritten.
__global__ void count_nan(const bf16* o, size_t no, const float* lse, size_t nl, unsigned long long* bad) {
  unsigned long long n = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < no; i += size_t(gridDim.x) * blockDim.x)
    n += isnan(__bfloat162float(o[i]));
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < nl; i += size_t(gridDim.x) * blockDim.x)
    n += isnan(lse[i]);
  if (n) atomicAdd(bad, n);
}
// Spins until the host sets *flag (or 20 s pass: a lost release must not hang the test).
__global__ void gate(const volatile int* flag) {
  const unsigned long long t0 = globaltimer();
  do {
    __nanosleep(2000);
  } while (*flag == 0 && globaltimer() - t0 < 20'000'000'000ull);
}

struct Set {
  bf16 *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr;
  float* lse = nullptr;
  Set(uint64_t seed, int set, cudaStream_t s) {
    WEAVE_CUDA_CHECK(cudaMalloc(&q, kNq * 2));
    WEAVE_CUDA_CHECK(cudaMalloc(&k, kNk * 2));
    WEAVE_CUDA_CHECK(cudaMalloc(&v, kNk * 2));
    WEAVE_CUDA_CHECK(cudaMalloc(&o, kNq * 2));
    WEAVE_CUDA_CHECK(cudaMalloc(&lse, kNl * 4));
    fill<<<256, 256, 0, s>>>(q, kNq, seed, set, 0);
    fill<<<256, 256, 0, s>>>(k, kNk, seed, set, 1);
    fill<<<256, 256, 0, s>>>(v, kNk, seed, set, 2);
    poison(s);
  }
  void poison(cudaStream_t s) {
    WEAVE_CUDA_CHECK(cudaMemsetAsync(o, 0xff, kNq * 2, s));  // NaN in bf16 and fp32
    WEAVE_CUDA_CHECK(cudaMemsetAsync(lse, 0xff, kNl * 4, s));
  }
  ~Set() {
    cudaFree(q), cudaFree(k), cudaFree(v), cudaFree(o), cudaFree(lse);
  }
};

attention::Options persistent() {
  attention::Options opt;
  opt.schedule = attention::Options::Schedule::Persistent;
  return opt;
}
void forward(const Set& x, cudaStream_t s) {
  attention::Shape sh;
  sh.B = kB, sh.S = kS, sh.Hq = kHq, sh.Hkv = kHkv, sh.D = kD;
  attention::forward(x.q, x.k, x.v, x.o, x.lse, sh, persistent(), s);
}

// Row (b, i, h) of O and its LSE in float64 from the hashed inputs of set `set`.
void reference_row(uint64_t seed, int set, int b, int i, int h, std::vector<double>& o, double& lse) {
  const int hk = h / (kHq / kHkv);
  const double scale = 1.0 / std::sqrt(double(kD));
  auto f = [](bf16 x) { return double(__bfloat162float(x)); };
  std::vector<double> q(kD), sc(kS);
  for (int d = 0; d < kD; ++d) q[d] = f(input(seed, set, 0, ((size_t(b) * kS + i) * kHq + h) * kD + d));
  double mx = -INFINITY;
  for (int j = 0; j < kS; ++j) {
    double acc = 0;
    const size_t base = ((size_t(b) * kS + j) * kHkv + hk) * kD;
    for (int d = 0; d < kD; ++d) acc += q[d] * f(input(seed, set, 1, base + d));
    sc[j] = acc * scale;
    mx = std::max(mx, sc[j]);
  }
  double sum = 0;
  for (int j = 0; j < kS; ++j) sum += (sc[j] = std::exp(sc[j] - mx));
  o.assign(kD, 0.0);
  for (int j = 0; j < kS; ++j) {
    const size_t base = ((size_t(b) * kS + j) * kHkv + hk) * kD;
    for (int d = 0; d < kD; ++d) o[d] += sc[j] / sum * f(input(seed, set, 2, base + d));
  }
  lse = mx + std::log(sum);
}

// Every element of the set's O and LSE written, and `rows` random rows (the first and last of
// the sequence among them) equal to the reference within bf16's rounding.
void check_set(const Set& x, uint64_t seed, int set, std::mt19937_64& rng, int rows, const std::string& what) {
  SCOPED_TRACE(what);
  unsigned long long* bad = nullptr;
  WEAVE_CUDA_CHECK(cudaMalloc(&bad, sizeof *bad));
  WEAVE_CUDA_CHECK(cudaMemset(bad, 0, sizeof *bad));
  count_nan<<<132, 256>>>(x.o, kNq, x.lse, kNl, bad);
  unsigned long long nan = 0;
  WEAVE_CUDA_CHECK(cudaMemcpy(&nan, bad, sizeof nan, cudaMemcpyDeviceToHost));
  WEAVE_CUDA_CHECK(cudaFree(bad));
  EXPECT_EQ(nan, 0u) << "elements never written (tiles skipped)";
  std::vector<bf16> got(kD);
  std::vector<double> want;
  for (int r = 0; r < rows; ++r) {
    const int b = rng() % kB, h = rng() % kHq, i = r == 0 ? 0 : r == 1 ? kS - 1 : static_cast<int>(rng() % kS);
    double lse = 0;
    reference_row(seed, set, b, i, h, want, lse);
    WEAVE_CUDA_CHECK(cudaMemcpy(got.data(), x.o + ((size_t(b) * kS + i) * kHq + h) * kD, kD * 2,
                                cudaMemcpyDeviceToHost));
    float got_lse = 0;
    WEAVE_CUDA_CHECK(cudaMemcpy(&got_lse, x.lse + (size_t(b) * kHq + h) * kS + i, 4, cudaMemcpyDeviceToHost));
    int off = 0;
    double worst = 0;
    for (int d = 0; d < kD; ++d) {
      const double err = std::abs(double(__bfloat162float(got[d])) - want[d]);
      // bf16 output (8 bits) and bf16 probabilities in the P.V product: a few parts in 1e3 of the
      // row's scale, far below the ~1e-2 spread between different inputs' rows.
      if (!(err <= 1e-3 + 1e-2 * std::abs(want[d]))) ++off, worst = std::max(worst, err);
    }
    EXPECT_EQ(off, 0) << "row b=" << b << " i=" << i << " h=" << h << ": " << off << " of " << kD
                      << " values off the float64 reference, worst by " << worst;
    EXPECT_NEAR(got_lse, lse, 1e-3 * std::abs(lse) + 1e-3) << "LSE of row b=" << b << " i=" << i << " h=" << h;
  }
}

TEST(AttentionStreams, EightyStreamsReleasedAtOnce) {
  constexpr int kStreams = 80, kPerStream = 2;
  const uint64_t seed = check::derive(check::test_seed(), 80);
  std::mt19937_64 rng(seed);
  std::vector<cudaStream_t> st(kStreams);
  for (auto& s : st) WEAVE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaStream_t gs;
  WEAVE_CUDA_CHECK(cudaStreamCreateWithFlags(&gs, cudaStreamNonBlocking));
  // Two input sets per stream; the warm-up launch (attributes, counter storage) before the gate,
  // so that nothing enqueued behind it can need a synchronizing allocation.
  std::vector<std::unique_ptr<Set>> sets;
  for (int i = 0; i < kStreams * kPerStream; ++i) sets.push_back(std::make_unique<Set>(seed, i, gs));
  forward(*sets[0], gs);
  sets[0]->poison(gs);
  WEAVE_CUDA_CHECK(cudaStreamSynchronize(gs));

  int* flag = nullptr;
  int* flag_dev = nullptr;
  WEAVE_CUDA_CHECK(cudaHostAlloc(&flag, sizeof(int), cudaHostAllocMapped));
  *flag = 0;
  WEAVE_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&flag_dev), flag, 0));
  cudaEvent_t open;
  WEAVE_CUDA_CHECK(cudaEventCreateWithFlags(&open, cudaEventDisableTiming));
  gate<<<1, 1, 0, gs>>>(flag_dev);
  WEAVE_CUDA_CHECK(cudaGetLastError());
  WEAVE_CUDA_CHECK(cudaEventRecord(open, gs));
  for (auto& s : st) WEAVE_CUDA_CHECK(cudaStreamWaitEvent(s, open, 0));
  // Launch n goes to stream n mod 80: both of a stream's launches queue behind the gate with
  // every other stream's.
  for (int n = 0; n < kStreams * kPerStream; ++n) forward(*sets[n], st[n % kStreams]);
  const auto released = std::chrono::steady_clock::now();
  __atomic_store_n(flag, 1, __ATOMIC_SEQ_CST);
  for (auto& s : st) WEAVE_CUDA_CHECK(cudaStreamSynchronize(s));
  WEAVE_CUDA_CHECK(cudaStreamSynchronize(gs));
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - released).count();
  std::printf("%d launches on %d streams ran in %.1f ms after the release\n", kStreams * kPerStream, kStreams, ms);
  for (int n = 0; n < kStreams * kPerStream; ++n)
    check_set(*sets[n], seed, n, rng, n < 4 ? 6 : 3,
              "launch " + std::to_string(n) + " on stream " + std::to_string(n % kStreams));
  WEAVE_CUDA_CHECK(cudaEventDestroy(open));
  WEAVE_CUDA_CHECK(cudaFreeHost(flag));
  for (auto& s : st) WEAVE_CUDA_CHECK(cudaStreamDestroy(s));
  WEAVE_CUDA_CHECK(cudaStreamDestroy(gs));
}

// A launch captured into a graph keeps working when the graph is replayed on other streams while
// eager launches run on the stream it was captured from.
TEST(AttentionStreams, CapturedLaunchNextToEagerOnes) {
  const uint64_t seed = check::derive(check::test_seed(), 81);
  std::mt19937_64 rng(seed);
  cudaStream_t cap, other[3];
  WEAVE_CUDA_CHECK(cudaStreamCreateWithFlags(&cap, cudaStreamNonBlocking));
  for (auto& s : other) WEAVE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  Set graph_set(seed, 0, cap), eager_set(seed, 1, cap);
  forward(eager_set, cap);  // warm-up outside the capture
  WEAVE_CUDA_CHECK(cudaStreamSynchronize(cap));
  cudaGraph_t g = nullptr;
  WEAVE_CUDA_CHECK(cudaStreamBeginCapture(cap, cudaStreamCaptureModeRelaxed));
  forward(graph_set, cap);
  WEAVE_CUDA_CHECK(cudaStreamEndCapture(cap, &g));
  cudaGraphExec_t exec = nullptr;
  WEAVE_CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
  for (int round = 0; round < 3; ++round) {
    graph_set.poison(cap);
    eager_set.poison(cap);
    WEAVE_CUDA_CHECK(cudaStreamSynchronize(cap));
    WEAVE_CUDA_CHECK(cudaGraphLaunch(exec, other[round]));
    forward(eager_set, cap);
    WEAVE_CUDA_CHECK(cudaStreamSynchronize(other[round]));
    WEAVE_CUDA_CHECK(cudaStreamSynchronize(cap));
    check_set(graph_set, seed, 0, rng, 3, "graph replay " + std::to_string(round));
    check_set(eager_set, seed, 1, rng, 3, "eager launch " + std::to_string(round));
  }
  WEAVE_CUDA_CHECK(cudaGraphExecDestroy(exec));
  WEAVE_CUDA_CHECK(cudaGraphDestroy(g));
  WEAVE_CUDA_CHECK(cudaStreamDestroy(cap));
  for (auto& s : other) WEAVE_CUDA_CHECK(cudaStreamDestroy(s));
}

}  // namespace
