// The eight primitives on 2+ ranks (run through weave-run), on fresh random data each run:
// tile stores and store-adds at tile coordinates of peers, tile reduce/all_reduce against an
// exact host reference, signal/wait ordering, back-to-back launches, registered buffers, and
// bad input rejected before any launch.
#include <cstdlib>
#include <functional>

#include "common.hpp"
#include "weave/reduce.cuh"
#include "weave/runtime/pgl_host.hpp"
#include "weave/signal.cuh"
#include "weave/store.cuh"

using namespace weave;
using weave::runtime::make_pgl;
using wt::comm;

namespace {

constexpr int kRows = 1000, kCols = 776, kLd = 792;  // not tile multiples; padding columns kept poisoned
constexpr int kTR = 64, kTC = 64;
constexpr size_t kN = size_t(kRows) * kLd;

// Each block copies tiles of `src` (rows x cols, pitch ld) into shared memory and sends them to
// the same tile coordinates of `dst` on rank `dst_rank` (-1: every rank), plain or adding.
template <class T>
__global__ void send_tiles(const __grid_constant__ pgl<T> dst, const T* src, int dst_rank, bool add) {
  extern __shared__ __align__(128) unsigned char smem[];
  T* tile = reinterpret_cast<T*>(smem);
  const int tr = dst.tiles_r(), tc = dst.tiles_c();
  for (int t = blockIdx.x; t < tr * tc; t += gridDim.x) {
    const int R = t / tc, C = t % tc;
    for (int i = threadIdx.x; i < dst.tile_rows * dst.tile_cols; i += blockDim.x) {
      int r = R * dst.tile_rows + i / dst.tile_cols, c = C * dst.tile_cols + i % dst.tile_cols;
      tile[i] = (r < dst.rows && c < dst.cols) ? src[r * dst.ld + c] : T(0);
    }
    tile::fence_proxy_async_shared();
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int r = 0; r < dst.world; ++r) {
        if (dst_rank >= 0 && r != dst_rank) continue;
        if (add) store_add_async(dst, r, tile, R, C);
        else store_async(dst, r, tile, R, C);
      }
      store_wait();
    }
    __syncthreads();
  }
}

template <ReduceOp Op, class T>
__global__ void reduce_tiles(const __grid_constant__ pgl<T> p, T* out) {
  const int n = p.tiles_r() * p.tiles_c();
  for (int t = blockIdx.x; t < n; t += gridDim.x) {
    const int R = t / p.tiles_c(), C = t % p.tiles_c();
    reduce<Op>(p, R, C, out + (R * p.tile_rows) * p.ld + C * p.tile_cols, p.ld);
  }
}

// Tile t is all-reduced by rank t % world: one reducer per tile.
template <ReduceOp Op, class T>
__global__ void all_reduce_tiles(const __grid_constant__ pgl<T> p) {
  const int n = p.tiles_r() * p.tiles_c();
  for (int t = p.rank + blockIdx.x * p.world; t < n; t += gridDim.x * p.world)
    all_reduce<Op>(p, t / p.tiles_c(), t % p.tiles_c());
}

struct PeerSlots {
  int* p[kMaxWorld];
};

template <class T>
void check_copy(const std::vector<T>& got, const std::vector<T>& want) {
  size_t bad = 0, pad_bad = 0;
  for (int r = 0; r < kRows; ++r)
    for (int c = 0; c < kLd; ++c) {
      size_t i = size_t(r) * kLd + c;
      if (c < kCols) bad += wt::bits(got[i]) != wt::bits(want[i]);
      else pad_bad += wt::bits(got[i]) != wt::bits(wt::poison<T>());
    }
  EXPECT_EQ(bad, 0u) << "elements not equal to what the peer sent";
  EXPECT_EQ(pad_bad, 0u) << "padding outside the tensor was written";
}

template <class T>
void store_test(int tile_rows, int tile_cols) {
  auto& c = comm();
  const int W = c.world(), me = c.rank();
  const uint64_t seed = wt::job_seed();
  runtime::SymmetricTensor<T> dst(c, kN);
  T* src = nullptr;
  WEAVE_CUDA_CHECK(cudaMalloc(&src, kN * sizeof(T)));
  wt::to_device(src, wt::random_matrix<T>(seed, me, kN));
  wt::to_device(dst.data(), std::vector<T>(kN, wt::poison<T>()));
  wt::settle();
  auto p = make_pgl<T>(c, dst.data(), kRows, kCols, kLd, tile_rows, tile_cols);
  const int smem = tile_rows * tile_cols * sizeof(T);
  send_tiles<T><<<c.sm_count(), 256, smem>>>(p, src, (me + 1) % W, false);
  WEAVE_CUDA_CHECK(cudaGetLastError());
  wt::settle();
  check_copy(wt::to_host(dst.data(), kN), wt::random_matrix<T>(seed, (me + W - 1) % W, kN));
  WEAVE_CUDA_CHECK(cudaFree(src));
}

// Every rank adds its random matrix into every rank's copy, which starts from a rank-specific
// random matrix: the result is that start plus the sum over ranks (rounding in T at each add).
template <class T>
void store_add_test() {
  auto& c = comm();
  const int W = c.world(), me = c.rank();
  const uint64_t seed = wt::job_seed();
  runtime::SymmetricTensor<T> dst(c, kN);
  T* src = nullptr;
  WEAVE_CUDA_CHECK(cudaMalloc(&src, kN * sizeof(T)));
  wt::to_device(src, wt::random_matrix<T>(seed, me, kN));
  auto start = wt::random_matrix<T>(seed, 1000 + me, kN);
  for (int r = 0; r < kRows; ++r)
    for (int col = kCols; col < kLd; ++col) start[size_t(r) * kLd + col] = wt::poison<T>();
  wt::to_device(dst.data(), start);
  wt::settle();
  auto p = make_pgl<T>(c, dst.data(), kRows, kCols, kLd, kTR, kTC);
  send_tiles<T><<<c.sm_count(), 256, kTR * kTC * sizeof(T)>>>(p, src, -1, true);
  WEAVE_CUDA_CHECK(cudaGetLastError());
  wt::settle();
  auto got = wt::to_host(dst.data(), kN);
  std::vector<std::vector<T>> srcs;
  for (int r = 0; r < W; ++r) srcs.push_back(wt::random_matrix<T>(seed, r, kN));
  const float eps = std::is_same_v<T, float> ? 1e-6f : std::is_same_v<T, __half> ? 1e-3f : 8e-3f;
  size_t bad = 0, pad_bad = 0;
  for (int r = 0; r < kRows; ++r)
    for (int col = 0; col < kLd; ++col) {
      size_t i = size_t(r) * kLd + col;
      if (col >= kCols) {
        pad_bad += wt::bits(got[i]) != wt::bits(wt::poison<T>());
        continue;
      }
      float ref = wt::to_f(start[i]), mag = std::fabs(ref);
      for (int s = 0; s < W; ++s) ref += wt::to_f(srcs[s][i]), mag += std::fabs(wt::to_f(srcs[s][i]));
      float g = wt::to_f(got[i]);
      bad += !(std::fabs(g - ref) <= eps * (W + 1) * mag + 1e-7f);
    }
  EXPECT_EQ(bad, 0u) << "store_add results off by more than rounding";
  EXPECT_EQ(pad_bad, 0u) << "padding outside the tensor was written";
  WEAVE_CUDA_CHECK(cudaFree(src));
}

template <ReduceOp Op>
float host_op(float a, float b) {
  return Op == ReduceOp::sum ? a + b : Op == ReduceOp::max ? std::fmax(a, b) : std::fmin(a, b);
}

// Exact reference: fp32 accumulation in rank order 0..W-1, rounded to T once, as the device does.
template <ReduceOp Op, class T>
std::vector<T> host_reduce(uint64_t seed, int W) {
  std::vector<std::vector<T>> x;
  for (int r = 0; r < W; ++r) x.push_back(wt::random_matrix<T>(seed, 2000 + r, kN));
  std::vector<T> out(kN);
  for (size_t i = 0; i < kN; ++i) {
    float a = wt::to_f(x[0][i]);
    for (int r = 1; r < W; ++r) a = host_op<Op>(a, wt::to_f(x[r][i]));
    out[i] = wt::from_f<T>(a);
  }
  return out;
}

template <ReduceOp Op, class T>
void reduce_test() {
  auto& c = comm();
  const int W = c.world(), me = c.rank();
  const uint64_t seed = wt::job_seed();
  runtime::SymmetricTensor<T> buf(c, kN);
  T* out = nullptr;
  WEAVE_CUDA_CHECK(cudaMalloc(&out, kN * sizeof(T)));
  auto mine = wt::random_matrix<T>(seed, 2000 + me, kN);
  wt::to_device(buf.data(), mine);
  wt::to_device(out, std::vector<T>(kN, wt::poison<T>()));
  wt::settle();
  auto p = make_pgl<T>(c, buf.data(), kRows, kCols, kLd, kTR, kTC);
  reduce_tiles<Op, T><<<c.sm_count(), 256>>>(p, out);
  WEAVE_CUDA_CHECK(cudaGetLastError());
  wt::settle();
  auto ref = host_reduce<Op, T>(seed, W);
  {
    auto got = wt::to_host(out, kN);
    auto want = ref;
    for (int r = 0; r < kRows; ++r)
      for (int col = kCols; col < kLd; ++col) want[size_t(r) * kLd + col] = wt::poison<T>();
    SCOPED_TRACE("reduce");
    check_copy(got, want);
  }
  // all_reduce in place: every copy becomes the reduction, bit-identical on every rank.
  all_reduce_tiles<Op, T><<<c.sm_count(), 256>>>(p);
  WEAVE_CUDA_CHECK(cudaGetLastError());
  wt::settle();
  auto got = wt::to_host(buf.data(), kN);
  size_t bad = 0, pad_changed = 0;
  for (int r = 0; r < kRows; ++r)
    for (int col = 0; col < kLd; ++col) {
      size_t i = size_t(r) * kLd + col;
      if (col < kCols) bad += wt::bits(got[i]) != wt::bits(ref[i]);
      else pad_changed += wt::bits(got[i]) != wt::bits(mine[i]);
    }
  EXPECT_EQ(bad, 0u) << "all_reduce differs from the exact reference";
  EXPECT_EQ(pad_changed, 0u) << "all_reduce wrote outside the tensor";
  WEAVE_CUDA_CHECK(cudaFree(out));
}

// Rank r sends `iters` rounds to rank r+1: TMA-store a tile holding the round number, wait for
// the write to complete, signal; the receiver waits, reads the tile with ordinary loads, counts
// stale elements, and acknowledges so the slot can be reused.
__global__ void ping_ring(const __grid_constant__ pgl<float> slot, signals s, unsigned long long base, int iters,
                          int* stale) {
  __shared__ __align__(128) float tile[kTR * kTC / 4];
  const int W = slot.world, me = slot.rank, next = (me + 1) % W;
  if (blockIdx.x == 0) {  // producer
    for (int it = 1; it <= iters; ++it) {
      if (threadIdx.x == 0 && it > 1) wait(s, 1, base + it - 1);  // next rank consumed round it-1
      __syncthreads();
      for (int i = threadIdx.x; i < kTR * kTC / 4; i += blockDim.x) tile[i] = float(it * 7 + me);
      tile::fence_proxy_async_shared();
      __syncthreads();
      if (threadIdx.x == 0) {
        store_async(slot, next, tile, 0, 0);
        store_wait();
        signal(s, next, 0);
      }
    }
  } else {  // consumer of the previous rank's rounds
    const int prev = (me + W - 1) % W;
    for (int it = 1; it <= iters; ++it) {
      if (threadIdx.x == 0) wait(s, 0, base + it);
      __syncthreads();
      int bad = 0;
      const volatile float* data = slot.ptr[me];
      for (int i = threadIdx.x; i < kTR * kTC / 4; i += blockDim.x) bad += data[i] != float(it * 7 + prev);
      if (bad) atomicAdd(stale, bad);
      __syncthreads();
      if (threadIdx.x == 0) signal(s, prev, 1);
    }
  }
}

// One launch of the back-to-back test: write `value` into slot[parity][me] on every rank, meet at a
// fresh barrier round, then every rank's entry must be `value`. Two parities keep a fast rank's
// next launch from overwriting what a slow rank still reads.
__global__ void exchange_once(int* slots_local, PeerSlots peers, signals s, unsigned long long round, int value,
                              int* bad) {
  if (threadIdx.x != 0) return;
  const int W = s.world, me = s.rank, par = value & 1;
  for (int r = 0; r < W; ++r) peers.p[r][par * W + me] = value;
  barrier(s, 0, round);
  for (int r = 0; r < W; ++r)
    if (reinterpret_cast<volatile int*>(slots_local)[par * W + r] != value) atomicAdd(bad, 1);
}

}  // namespace

TEST(StoreAsync, Bf16) { store_test<__nv_bfloat16>(kTR, kTC); }
TEST(StoreAsync, Fp16) { store_test<__half>(kTR, kTC); }
TEST(StoreAsync, Fp32) { store_test<float>(kTR, kTC); }
TEST(StoreAsync, Bf16TallNarrowTiles) { store_test<__nv_bfloat16>(128, 8); }
TEST(StoreAsync, Fp32WideTiles) { store_test<float>(16, 256); }

TEST(StoreAddAsync, Bf16) { store_add_test<__nv_bfloat16>(); }
TEST(StoreAddAsync, Fp16) { store_add_test<__half>(); }
TEST(StoreAddAsync, Fp32) { store_add_test<float>(); }

TEST(Reduce, SumBf16) { reduce_test<ReduceOp::sum, __nv_bfloat16>(); }
TEST(Reduce, MaxBf16) { reduce_test<ReduceOp::max, __nv_bfloat16>(); }
TEST(Reduce, MinBf16) { reduce_test<ReduceOp::min, __nv_bfloat16>(); }
TEST(Reduce, SumFp16) { reduce_test<ReduceOp::sum, __half>(); }
TEST(Reduce, MaxFp16) { reduce_test<ReduceOp::max, __half>(); }
TEST(Reduce, MinFp16) { reduce_test<ReduceOp::min, __half>(); }
TEST(Reduce, SumFp32) { reduce_test<ReduceOp::sum, float>(); }
TEST(Reduce, MaxFp32) { reduce_test<ReduceOp::max, float>(); }
TEST(Reduce, MinFp32) { reduce_test<ReduceOp::min, float>(); }

TEST(Signal, DataWrittenBeforeSignalIsWhatTheWaiterReads) {
  auto& c = comm();
  runtime::SymmetricTensor<float> slot(c, kTR * kTC / 4);
  auto s = c.signals("ping", 2);
  auto p = make_pgl<float>(c, slot.data(), 16, kTR * kTC / 64, kTR * kTC / 64, 16, kTR * kTC / 64);
  int* stale = nullptr;
  WEAVE_CUDA_CHECK(cudaMalloc(&stale, sizeof(int)));
  WEAVE_CUDA_CHECK(cudaMemset(stale, 0, sizeof(int)));
  const int iters = 5000;
  for (int launch = 0; launch < 3; ++launch) {  // counters carry over between launches
    ping_ring<<<2, 256>>>(p, s.view(), static_cast<unsigned long long>(launch) * iters, iters, stale);
    WEAVE_CUDA_CHECK(cudaGetLastError());
    wt::settle();
  }
  int h = -1;
  WEAVE_CUDA_CHECK(cudaMemcpy(&h, stale, sizeof h, cudaMemcpyDeviceToHost));
  EXPECT_EQ(h, 0) << "the waiter read data older than the signal it acquired";
  WEAVE_CUDA_CHECK(cudaFree(stale));
}

TEST(Signal, ThousandBackToBackLaunchesWithoutReset) {
  auto& c = comm();
  const int W = c.world();
  runtime::SymmetricTensor<int> slots(c, 2 * W);
  WEAVE_CUDA_CHECK(cudaMemset(slots.data(), 0xff, slots.bytes()));
  auto s = c.signals("b2b", 1);
  PeerSlots ps{};
  auto pp = c.peers(slots.data(), slots.bytes());
  for (int r = 0; r < W; ++r) ps.p[r] = static_cast<int*>(pp[r]);
  int* bad = nullptr;
  WEAVE_CUDA_CHECK(cudaMalloc(&bad, sizeof(int)));
  WEAVE_CUDA_CHECK(cudaMemset(bad, 0, sizeof(int)));
  wt::settle();
  for (int i = 1; i <= 1000; ++i) exchange_once<<<1, 32>>>(slots.data(), ps, s.view(), s.next_round(), i, bad);
  WEAVE_CUDA_CHECK(cudaGetLastError());
  wt::settle();
  int h = -1;
  WEAVE_CUDA_CHECK(cudaMemcpy(&h, bad, sizeof h, cudaMemcpyDeviceToHost));
  EXPECT_EQ(h, 0) << "a rank left a barrier before every rank's value of that launch arrived";
  unsigned long long count = 0;
  WEAVE_CUDA_CHECK(cudaMemcpy(&count, s.view().ptr[c.rank()], sizeof count, cudaMemcpyDeviceToHost));
  EXPECT_EQ(count, 1000ull * W) << "the barrier counter must count every signal, never reset";
  WEAVE_CUDA_CHECK(cudaFree(bad));
}

TEST(Registered, StoreIntoCudaMallocBuffersOfPeers) {
  auto& c = comm();
  const int W = c.world(), me = c.rank();
  const uint64_t seed = wt::job_seed();
  using T = __nv_bfloat16;
  T *dst = nullptr, *src = nullptr;
  WEAVE_CUDA_CHECK(cudaMalloc(&dst, kN * sizeof(T) + 4096));
  WEAVE_CUDA_CHECK(cudaMalloc(&src, kN * sizeof(T)));
  T* view = dst + 1024;  // registration works on an interior pointer of the allocation
  wt::to_device(src, wt::random_matrix<T>(seed, me, kN));
  wt::to_device(view, std::vector<T>(kN, wt::poison<T>()));
  c.register_buffer(view, kN * sizeof(T));
  wt::settle();
  auto p = make_pgl<T>(c, view, kRows, kCols, kLd, kTR, kTC);
  send_tiles<T><<<c.sm_count(), 256, kTR * kTC * sizeof(T)>>>(p, src, (me + 1) % W, false);
  WEAVE_CUDA_CHECK(cudaGetLastError());
  wt::settle();
  check_copy(wt::to_host(view, kN), wt::random_matrix<T>(seed, (me + W - 1) % W, kN));
  c.deregister_buffer(view);
  EXPECT_THROW(c.peers(view, 16), weave::Error);
  WEAVE_CUDA_CHECK(cudaFree(dst));
  WEAVE_CUDA_CHECK(cudaFree(src));
}

static void expect_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one containing '" << needle << "'";
  } catch (const weave::Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(BadInput, RejectedBeforeLaunch) {
  auto& c = comm();
  using T = __nv_bfloat16;
  T* foreign = nullptr;
  WEAVE_CUDA_CHECK(cudaMalloc(&foreign, 1 << 20));
  expect_error([&] { make_pgl<T>(c, foreign, 64, 64, 64, 64, 64); }, "neither in the symmetric heap nor registered");
  runtime::SymmetricTensor<T> buf(c, 1 << 16);
  expect_error([&] { make_pgl<T>(c, buf.data() + 1, 64, 64, 64, 64, 64); }, "16-byte aligned");
  expect_error([&] { make_pgl<T>(c, buf.data(), 64, 60, 60, 64, 64); }, "row pitch");
  expect_error([&] { make_pgl<T>(c, buf.data(), 64, 64, 64, 64, 4); }, "inner box");
  expect_error([&] { make_pgl<T>(c, buf.data(), 64, 64, 64, 300, 64); }, "box dimensions");
  expect_error([&] { make_pgl<T>(c, buf.data(), 2048, 64, 64, 64, 64); }, "not inside one live allocation");
  expect_error([&] { c.check_same("shape", {1000, c.rank() == 0 ? 776 : 777}); }, "shape differs across ranks");
  expect_error([&] { c.alloc(size_t(1) << 40); }, "heap exhausted");
  WEAVE_CUDA_CHECK(cudaFree(foreign));
}

TEST(BadInput, MulticastRefusedWhereDisabled) {
  // The GPU hosts set this; set it here too so the test never depends on the environment.
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  weave::runtime::CommOptions o;
  o.multicast = true;
  expect_error([&] { weave::runtime::Communicator bad(o); }, "disabled on this machine by NCCL_NVLS_ENABLE=0");
}
