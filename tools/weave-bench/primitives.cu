// weave-bench primitives: TMA store / store-add bandwidth to a peer against issuing blocks and
// message (tile) size, one-way signal latency (ping-pong) and barrier latency, under weave-run.
// Every row is checked: each timed launch stores another value (small integers, exact in bf16
// sums), the destination is poisoned (store) or zeroed (store-add) before the loop and compared
// afterwards with what the last launch (or the sum of all launches) must have left; the latency
// rows check the counters' final values; the copy-engine rows alternate two sources. A wrong row
// is written correct: false and makes the run exit 1.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "bench.hpp"
#include "weave/common/driver.hpp"
#include "weave/runtime/communicator.hpp"
#include "weave/memory_order.cuh"
#include "weave/runtime/pgl_host.hpp"
#include "weave/signal.cuh"
#include "weave/store.cuh"

namespace {

using namespace weave;
using bf16 = __nv_bfloat16;

// Each block streams its share of the destination's tiles to rank `dst` from one shared tile, every
// element `value`.
template <bool Add>
__global__ void stream_tiles(const __grid_constant__ pgl<bf16> p, int dst, float value) {
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* tile = reinterpret_cast<bf16*>(smem);
  const int n = p.tile_rows * p.tile_cols;
  for (int i = threadIdx.x; i < n; i += blockDim.x) tile[i] = __float2bfloat16(value);
  tile::fence_proxy_async_shared();
  __syncthreads();
  if (threadIdx.x != 0) return;
  const int tc = p.tiles_c(), total = p.tiles_r() * tc;
  for (int t = blockIdx.x; t < total; t += gridDim.x) {
    if constexpr (Add) store_add_async(p, dst, tile, t / tc, t % tc);
    else store_async(p, dst, tile, t / tc, t % tc);
  }
  store_wait();
}

// The value launch n of a loop stores: -2..2, so that consecutive launches differ and the sum of a
// loop's launches (store-add) stays an integer that bf16 holds exactly (|sum| <= 256).
float launch_value(long long n) { return static_cast<float>(n % 5 - 2); }

// 16-byte words of [p, p + bytes) that differ from `want` (the expected bytes repeated).
__global__ void count_unlike(const uint4* p, size_t words, uint4 want, unsigned long long* bad) {
  unsigned long long n = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < words; i += size_t(gridDim.x) * blockDim.x) {
    const uint4 v = p[i];
    n += v.x != want.x || v.y != want.y || v.z != want.z || v.w != want.w;
  }
  if (n) atomicAdd(bad, n);
}
uint4 repeat16(uint16_t x) {
  const uint32_t w = uint32_t(x) | uint32_t(x) << 16;
  return make_uint4(w, w, w, w);
}
uint4 repeat8(uint8_t x) { return repeat16(static_cast<uint16_t>(x | x << 8)); }
uint16_t bf16_bits(float x) {
  const bf16 b = __float2bfloat16(x);
  uint16_t u;
  std::memcpy(&u, &b, 2);
  return u;
}

// Counts, on `st`, the 16-byte words of [p, p + bytes) unlike `want` (p may be a peer's memory).
class Verifier {
 public:
  Verifier() { WEAVE_CUDA_CHECK(cudaMalloc(&bad_, sizeof *bad_)); }
  ~Verifier() { cudaFree(bad_); }
  unsigned long long unlike(const void* p, size_t bytes, uint4 want, cudaStream_t st) {
    WEAVE_CUDA_CHECK(cudaMemsetAsync(bad_, 0, sizeof *bad_, st));
    count_unlike<<<264, 512, 0, st>>>(static_cast<const uint4*>(p), bytes / 16, want, bad_);
    WEAVE_CUDA_CHECK(cudaGetLastError());
    unsigned long long h = 0;
    WEAVE_CUDA_CHECK(cudaMemcpyAsync(&h, bad_, sizeof h, cudaMemcpyDeviceToHost, st));
    WEAVE_CUDA_CHECK(cudaStreamSynchronize(st));
    return h;
  }

 private:
  unsigned long long* bad_ = nullptr;
};

// Every rank's verdict: true when `ok` on all of them.
bool all_ranks(runtime::Communicator& c, bool ok) {
  const int mine = ok ? 1 : 0;
  std::vector<int> all(c.world());
  c.bootstrap().all_gather(&mine, all.data(), sizeof mine);
  return std::all_of(all.begin(), all.end(), [](int x) { return x != 0; });
}

// A counter's value on this rank (device memory, read after the stream that wrote it is synced).
unsigned long long counter(const signals& s, int index) {
  unsigned long long h = 0;
  WEAVE_CUDA_CHECK(cudaMemcpy(&h, s.ptr[s.rank] + index, sizeof h, cudaMemcpyDeviceToHost));
  return h;
}

// Ping-pong between ranks 0 and 1; result: ns per one-way signal, measured on rank 0.
__global__ void ping_pong(signals s, unsigned long long base, int iters, int warm, unsigned long long* ns) {
  if (threadIdx.x != 0) return;
  unsigned long long t0 = 0;
  for (int i = 1; i <= iters; ++i) {
    if (i == warm + 1) t0 = globaltimer();
    if (s.rank == 0) {
      signal(s, 1, 0);
      wait(s, 0, base + i);
    } else if (s.rank == 1) {
      wait(s, 0, base + i);
      signal(s, 0, 0);
    }
  }
  *ns = (globaltimer() - t0) / (2ull * (iters - warm));
}

__global__ void barriers(signals s, unsigned long long base_round, int iters, int warm, unsigned long long* ns) {
  if (threadIdx.x != 0) return;
  unsigned long long t0 = 0;
  for (int i = 1; i <= iters; ++i) {
    if (i == warm + 1) t0 = globaltimer();
    barrier(s, 0, base_round + i);
  }
  *ns = (globaltimer() - t0) / (iters - warm);
}

// What the copy-engine paths (ag_gemm v7) are built from: cudaMemcpyAsync from local memory into
// a peer's heap (as mapped here) by message size, on 1 and 4 streams, and the one-way latency of
// a stream memory write into a peer's counter answered by a stream wait (ping-pong, no kernel).
// Returns whether every row was right. The copies alternate two sources (bytes 0x5a and 0xa5) call
// by call; the destination is poisoned before each row and checked against the last call's.
bool copy_engine(runtime::Communicator& c, bench::JsonSink& json, void* heap_buf, size_t buf_bytes) {
  const bool lead = c.rank() == 0;
  bool all_ok = true;
  Verifier verifier;
  constexpr int kStreams = 4;
  cudaStream_t ss[kStreams];
  for (auto& x : ss) WEAVE_CUDA_CHECK(cudaStreamCreateWithFlags(&x, cudaStreamNonBlocking));
  void* srcs[2] = {nullptr, nullptr};
  const uint8_t src_byte[2] = {0x5a, 0xa5};
  for (int i = 0; i < 2; ++i) {
    WEAVE_CUDA_CHECK(cudaMalloc(&srcs[i], buf_bytes));
    WEAVE_CUDA_CHECK(cudaMemset(srcs[i], src_byte[i], buf_bytes));
  }
  char* dst = static_cast<char*>(c.peers(heap_buf, buf_bytes)[1 % c.world()]);
  if (lead) std::printf("copy engine, rank 0 -> rank 1's heap (cudaMemcpyAsync), GB/s by message size\n");
  for (size_t msg : {size_t(1) << 20, size_t(2) << 20, size_t(8) << 20, size_t(32) << 20, size_t(128) << 20}) {
    if (msg > buf_bytes) break;
    for (int ns : {1, kStreams}) {
      double us = 0;
      if (lead) {
        // `total` bytes in `msg` pieces, round robin over ns streams, joined on ss[0].
        const size_t total = std::min(buf_bytes, std::max(msg * 8, size_t(64) << 20));
        cudaEvent_t fork, join[kStreams];
        WEAVE_CUDA_CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
        for (auto& e : join) WEAVE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
        int next = 0;  // the source of the next call
        auto launch = [&] {
          const char* src = static_cast<const char*>(srcs[next]);
          next ^= 1;
          WEAVE_CUDA_CHECK(cudaEventRecord(fork, ss[0]));
          for (int k = 1; k < ns; ++k) WEAVE_CUDA_CHECK(cudaStreamWaitEvent(ss[k], fork, 0));
          int k = 0;
          for (size_t off = 0; off < total; off += msg, k = (k + 1) % ns)
            WEAVE_CUDA_CHECK(cudaMemcpyAsync(dst + off, src + off, std::min(msg, total - off),
                                             cudaMemcpyDeviceToDevice, ss[k]));
          for (int j = 1; j < ns; ++j) {
            WEAVE_CUDA_CHECK(cudaEventRecord(join[j], ss[j]));
            WEAVE_CUDA_CHECK(cudaStreamWaitEvent(ss[0], join[j], 0));
          }
        };
        WEAVE_CUDA_CHECK(cudaMemsetAsync(dst, 0xff, total, ss[0]));
        us = bench::time_us(ss[0], launch, 2, 5, 3);
        const unsigned long long bad = verifier.unlike(dst, total, repeat8(src_byte[next ^ 1]), ss[0]);
        all_ok = all_ok && bad == 0;
        const double gbs = total / us / 1e3;
        std::printf("  %4zu MiB pieces, %d stream(s): %7.1f GB/s (%.1f us per %zu MiB)%s\n", msg >> 20, ns, gbs, us,
                    total >> 20, bad ? " WRONG" : "");
        json.write(bench::JsonLine().add("kernel", "copy_engine").add("impl", "cuda").add("world", c.world())
                       .add("streams", ns).add("msg_bytes", static_cast<long long>(msg))
                       .add("bytes", static_cast<long long>(total)).add("time_us", us).add("gbs", gbs)
                       .add("correct", bad == 0));
        WEAVE_CUDA_CHECK(cudaEventDestroy(fork));
        for (auto& e : join) WEAVE_CUDA_CHECK(cudaEventDestroy(e));
      }
      c.barrier();
    }
  }
  // Stream-memop ping-pong between ranks 0 and 1 (others idle).
  auto sig = c.signals("stream memop ping", 1);
  const signals v = sig.view();
  const int iters = 2000;
  double us = 0;
  c.barrier();
  if (c.rank() < 2) {
    cudaEvent_t a, b;
    WEAVE_CUDA_CHECK(cudaEventCreate(&a));
    WEAVE_CUDA_CHECK(cudaEventCreate(&b));
    const int peer = 1 - c.rank();
    WEAVE_CUDA_CHECK(cudaEventRecord(a, ss[0]));
    for (int i = 1; i <= iters; ++i) {
      auto wr = [&] {
        WEAVE_CU_CHECK(drv().streamWriteValue64(ss[0], reinterpret_cast<CUdeviceptr>(v.ptr[peer]), i,
                                                CU_STREAM_WRITE_VALUE_DEFAULT));
      };
      auto wt = [&] {
        WEAVE_CU_CHECK(drv().streamWaitValue64(ss[0], reinterpret_cast<CUdeviceptr>(v.ptr[c.rank()]), i,
                                               CU_STREAM_WAIT_VALUE_GEQ));
      };
      if (c.rank() == 0) wr(), wt();
      else wt(), wr();
    }
    WEAVE_CUDA_CHECK(cudaEventRecord(b, ss[0]));
    WEAVE_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    WEAVE_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    us = 1e3 * ms / (2.0 * iters);
    WEAVE_CUDA_CHECK(cudaEventDestroy(a));
    WEAVE_CUDA_CHECK(cudaEventDestroy(b));
  }
  // Each of ranks 0 and 1 ends with the peer's last write in its counter: iters.
  WEAVE_CUDA_CHECK(cudaStreamSynchronize(ss[0]));
  const bool memop_ok = all_ranks(c, c.rank() >= 2 || counter(v, 0) == static_cast<unsigned long long>(iters));
  all_ok = all_ok && memop_ok;
  if (lead) {
    std::printf("stream memory op one-way latency (cuStreamWriteValue64 into the peer, cuStreamWaitValue64 here, "
                "%d round trips): %.2f us%s\n", iters, us, memop_ok ? "" : " WRONG");
    json.write(bench::JsonLine().add("kernel", "stream_memop_signal").add("impl", "cuda").add("world", c.world())
                   .add("latency_us", us).add("correct", memop_ok));
  }
  c.barrier();
  for (void* p : srcs) WEAVE_CUDA_CHECK(cudaFree(p));
  for (auto& x : ss) WEAVE_CUDA_CHECK(cudaStreamDestroy(x));
  return all_ok;
}

int run(const bench::Args& a) {
  runtime::CommOptions o;
  const size_t buf_bytes = size_t(a.get_int("mib", 256)) << 20;
  o.heap_bytes = buf_bytes + (size_t(64) << 20);
  runtime::Communicator c(o);
  WEAVE_CHECK(c.world() >= 2, "weave-bench primitives needs at least 2 ranks (weave-run -n 2)");
  bench::JsonSink json(a);
  const bool lead = c.rank() == 0;
  cudaStream_t st;
  WEAVE_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));

  const int cols = 4096, rows = static_cast<int>(buf_bytes / (cols * sizeof(bf16)));
  runtime::SymmetricTensor<bf16> buf(c, size_t(rows) * cols);
  WEAVE_CUDA_CHECK(cudaMemset(buf.data(), 0, buf.bytes()));
  WEAVE_CUDA_CHECK(cudaFuncSetAttribute(stream_tiles<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, 128 << 10));
  WEAVE_CUDA_CHECK(cudaFuncSetAttribute(stream_tiles<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, 128 << 10));
  bool all_ok = true;
  Verifier verifier;
  // Rank 1's copy of the buffer, where rank 0's one-way stores land (rank 0 poisons and checks it).
  void* dst_of_lead = c.peers(buf.data(), buf.bytes())[1];
  struct Tile { int r, c; };
  std::vector<Tile> tiles = {{16, 64}, {64, 64}, {16, 256}, {128, 128}, {256, 128}, {256, 256}};
  if (a.has("tiles")) {  // e.g. --tiles 64x64,16x256
    tiles.clear();
    std::string spec = a.get("tiles");
    for (size_t pos = 0; pos < spec.size();) {
      size_t end = spec.find(',', pos), x = spec.find('x', pos);
      if (end == std::string::npos) end = spec.size();
      WEAVE_CHECK(x != std::string::npos && x < end, "--tiles takes ROWSxCOLS[,ROWSxCOLS...], got '", spec, "'");
      tiles.push_back({std::stoi(spec.substr(pos, x - pos)), std::stoi(spec.substr(x + 1, end - x - 1))});
      pos = end + 1;
    }
  }
  std::vector<int> blocks;
  for (int b = 1; b < c.sm_count(); b *= 2) blocks.push_back(b);
  blocks.push_back(c.sm_count());

  if (lead)
    std::printf("TMA %s to rank 1 from rank 0 (others idle), %zu MiB per launch, GB/s\n", "store / store-add",
                buf_bytes >> 20);
  if (lead) {
    std::printf("%-18s", "tile   msg bytes");
    for (int b : blocks) std::printf(" %11d", b);
    std::printf("   (blocks)\n");
  }
  for (int add = 0; add < 2; ++add)
    for (const Tile& t : tiles) {
      auto p = runtime::make_pgl<bf16>(c, buf.data(), rows, cols, cols, t.r, t.c);
      const int smem = t.r * t.c * sizeof(bf16);
      if (lead) std::printf("%-4s %3dx%-3d %6d", add ? "add" : "st", t.r, t.c, smem);
      c.barrier();
      for (int b : blocks) {
        double us = 0;
        if (lead) {
          // Launch n stores launch_value(n) everywhere: afterwards rank 1's buffer holds the last
          // launch's value (store; poisoned before) or the sum of all of them (store-add; zeroed).
          long long n = 0;
          double sum = 0;
          auto launch = [&] {
            const float v = launch_value(n++);
            sum += v;
            if (add) stream_tiles<true><<<b, 128, smem, st>>>(p, 1, v);
            else stream_tiles<false><<<b, 128, smem, st>>>(p, 1, v);
          };
          WEAVE_CUDA_CHECK(cudaMemsetAsync(dst_of_lead, add ? 0 : 0xff, buf.bytes(), st));
          us = bench::time_us(st, launch, 2, 5, 3);
          WEAVE_CUDA_CHECK(cudaGetLastError());
          const float want = add ? static_cast<float>(sum) : launch_value(n - 1);
          const bool ok = verifier.unlike(dst_of_lead, buf.bytes(), repeat16(bf16_bits(want)), st) == 0;
          all_ok = all_ok && ok;
          double gbs = buf_bytes / us / 1e3;
          std::printf(" %10.1f%s", gbs, ok ? " " : "!");
          std::fflush(stdout);
          json.write(bench::JsonLine()
                         .add("kernel", add ? "tma_store_add" : "tma_store")
                         .add("impl", "weave")
                         .add("dtype", "bf16")
                         .add("world", c.world())
                         .add("blocks", b)
                         .add("msg_bytes", smem)
                         .add("bytes", buf_bytes)
                         .add("time_us", us)
                         .add("gbs", gbs)
                         .add("correct", ok));
        }
      }
      c.sync(st);
      c.barrier();
      if (lead) std::printf("\n");
    }

  // Every rank streams to the next one at the same time: the per-direction ceiling that
  // all-reduce and the other collectives, which load both directions of NVLink, work under.
  {
    auto p = runtime::make_pgl<bf16>(c, buf.data(), rows, cols, cols, 128, 128);
    const int smem = 128 * 128 * sizeof(bf16), next = (c.rank() + 1) % c.world();
    if (lead) std::printf("%-18s", "both directions");
    for (int b : blocks) {
      // Each rank's buffer, poisoned, is written by the previous rank; every rank launches as often.
      WEAVE_CUDA_CHECK(cudaMemsetAsync(buf.data(), 0xff, buf.bytes(), st));
      c.sync(st);
      c.barrier();
      long long n = 0;
      const double us = bench::time_us(
          st, [&] { stream_tiles<false><<<b, 128, smem, st>>>(p, next, launch_value(n++)); }, 2, 5, 3);
      WEAVE_CUDA_CHECK(cudaGetLastError());
      std::vector<double> all(c.world());
      c.bootstrap().all_gather(&us, all.data(), sizeof us);
      const double worst = *std::max_element(all.begin(), all.end()), gbs = buf_bytes / worst / 1e3;
      c.sync(st);
      c.barrier();  // every rank's stores into the next rank done
      const bool ok = all_ranks(
          c, verifier.unlike(buf.data(), buf.bytes(), repeat16(bf16_bits(launch_value(n - 1))), st) == 0);
      all_ok = all_ok && ok;
      if (lead) {
        std::printf(" %10.1f%s", gbs, ok ? " " : "!");
        std::fflush(stdout);
        json.write(bench::JsonLine().add("kernel", "tma_store_bidir").add("impl", "weave").add("dtype", "bf16")
                       .add("world", c.world()).add("blocks", b).add("msg_bytes", smem).add("bytes", buf_bytes)
                       .add("time_us", worst).add("gbs", gbs).add("correct", ok));
      }
    }
    if (lead) std::printf("   (GB/s per direction, slowest rank)\n");
  }

  unsigned long long* ns = nullptr;
  WEAVE_CUDA_CHECK(cudaMalloc(&ns, sizeof(unsigned long long)));
  const int iters = static_cast<int>(a.get_int("iters", 20000)), warm = 1000;
  {
    auto s = c.signals("ping", 1);
    c.barrier();
    ping_pong<<<1, 32, 0, st>>>(s.view(), 0, iters, warm, ns);
    WEAVE_CUDA_CHECK(cudaGetLastError());
    c.sync(st);
    unsigned long long h = 0;
    WEAVE_CUDA_CHECK(cudaMemcpy(&h, ns, sizeof h, cudaMemcpyDeviceToHost));
    // Ranks 0 and 1 each received one signal per round trip; the others none.
    const bool ok = all_ranks(c, counter(s.view(), 0) == (c.rank() < 2 ? static_cast<unsigned long long>(iters) : 0));
    all_ok = all_ok && ok;
    if (lead) {
      std::printf("one-way signal latency (ping-pong rank 0 <-> 1, %d round trips): %.2f us%s\n", iters - warm,
                  h / 1e3, ok ? "" : " WRONG");
      json.write(bench::JsonLine().add("kernel", "signal").add("impl", "weave").add("world", c.world())
                     .add("latency_us", h / 1e3).add("correct", ok));
    }
  }
  {
    auto s = c.signals("barrier", 1);
    c.barrier();
    barriers<<<1, 32, 0, st>>>(s.view(), 0, iters, warm, ns);
    WEAVE_CUDA_CHECK(cudaGetLastError());
    c.sync(st);
    unsigned long long h = 0;
    WEAVE_CUDA_CHECK(cudaMemcpy(&h, ns, sizeof h, cudaMemcpyDeviceToHost));
    std::vector<unsigned long long> all(c.world());
    c.bootstrap().all_gather(&h, all.data(), sizeof h);
    unsigned long long worst = 0;
    for (auto x : all) worst = x > worst ? x : worst;
    // Every barrier brings one signal from every rank.
    const bool ok = all_ranks(c, counter(s.view(), 0) == static_cast<unsigned long long>(iters) * c.world());
    all_ok = all_ok && ok;
    if (lead) {
      std::printf("barrier latency (%d ranks, slowest rank): %.2f us%s\n", c.world(), worst / 1e3, ok ? "" : " WRONG");
      json.write(bench::JsonLine().add("kernel", "barrier").add("impl", "weave").add("world", c.world())
                     .add("latency_us", worst / 1e3).add("correct", ok));
    }
  }
  WEAVE_CUDA_CHECK(cudaFree(ns));
  WEAVE_CUDA_CHECK(cudaStreamDestroy(st));
  all_ok = copy_engine(c, json, buf.data(), buf.bytes()) && all_ok;
  // Rows checked by rank 0 alone (it alone times the one-way rows) count for every rank.
  all_ok = all_ranks(c, all_ok);
  if (lead) std::printf("%s\n", all_ok ? "every row checked and right" : "SOME ROWS ARE WRONG (marked ! or WRONG)");
  return all_ok ? 0 : 1;
}

}  // namespace

WEAVE_BENCH(primitives,
            "TMA store/store-add bandwidth to a peer, signal and barrier latency, copy engine into a peer's heap and "
            "stream-memop latency (2+ ranks; --mib 256 --tiles RxC,... --iters N)",
            run);
