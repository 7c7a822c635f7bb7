// weave-bench primitives: TMA store / store-add bandwidth to a peer against issuing blocks and
// message (tile) size, one-way signal latency (ping-pong) and barrier latency, under weave-run.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "bench.hpp"
#include "weave/common/driver.hpp"
#include "weave/runtime/communicator.hpp"
#include "weave/runtime/pgl_host.hpp"
#include "weave/signal.cuh"
#include "weave/store.cuh"

namespace {

using namespace weave;
using bf16 = __nv_bfloat16;

// Each block streams its share of the destination's tiles to rank `dst` from one shared tile.
template <bool Add>
__global__ void stream_tiles(const __grid_constant__ pgl<bf16> p, int dst) {
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* tile = reinterpret_cast<bf16*>(smem);
  const int n = p.tile_rows * p.tile_cols;
  for (int i = threadIdx.x; i < n; i += blockDim.x) tile[i] = __float2bfloat16(1.0f / 1024);
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

// Ping-pong between ranks 0 and 1; result: ns per one-way signal, measured on rank 0.
__global__ void ping_pong(signals s, unsigned long long base, int iters, int warm, unsigned long long* ns) {
  if (threadIdx.x != 0) return;
  unsigned long long t0 = 0;
  for (int i = 1; i <= iters; ++i) {
    if (i == warm + 1) t0 = detail::globaltimer();
    if (s.rank == 0) {
      signal(s, 1, 0);
      wait(s, 0, base + i);
    } else if (s.rank == 1) {
      wait(s, 0, base + i);
      signal(s, 0, 0);
    }
  }
  *ns = (detail::globaltimer() - t0) / (2ull * (iters - warm));
}

__global__ void barriers(signals s, unsigned long long base_round, int iters, int warm, unsigned long long* ns) {
  if (threadIdx.x != 0) return;
  unsigned long long t0 = 0;
  for (int i = 1; i <= iters; ++i) {
    if (i == warm + 1) t0 = detail::globaltimer();
    barrier(s, 0, base_round + i);
  }
  *ns = (detail::globaltimer() - t0) / (iters - warm);
}

// What the copy-engine paths (ag_gemm v7) are built from: cudaMemcpyAsync from local memory into
// a peer's heap (as mapped here) by message size, on 1 and 4 streams, and the one-way latency of
// a stream memory write into a peer's counter answered by a stream wait (ping-pong, no kernel).
void copy_engine(runtime::Communicator& c, bench::JsonSink& json, void* heap_buf, size_t buf_bytes) {
  const bool lead = c.rank() == 0;
  constexpr int kStreams = 4;
  cudaStream_t ss[kStreams];
  for (auto& x : ss) WEAVE_CUDA_CHECK(cudaStreamCreateWithFlags(&x, cudaStreamNonBlocking));
  void* src = nullptr;
  WEAVE_CUDA_CHECK(cudaMalloc(&src, buf_bytes));
  WEAVE_CUDA_CHECK(cudaMemset(src, 1, buf_bytes));
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
        auto launch = [&] {
          WEAVE_CUDA_CHECK(cudaEventRecord(fork, ss[0]));
          for (int k = 1; k < ns; ++k) WEAVE_CUDA_CHECK(cudaStreamWaitEvent(ss[k], fork, 0));
          int k = 0;
          for (size_t off = 0; off < total; off += msg, k = (k + 1) % ns)
            WEAVE_CUDA_CHECK(cudaMemcpyAsync(dst + off, static_cast<char*>(src) + off, std::min(msg, total - off),
                                             cudaMemcpyDeviceToDevice, ss[k]));
          for (int j = 1; j < ns; ++j) {
            WEAVE_CUDA_CHECK(cudaEventRecord(join[j], ss[j]));
            WEAVE_CUDA_CHECK(cudaStreamWaitEvent(ss[0], join[j], 0));
          }
        };
        us = bench::time_us(ss[0], launch, 2, 5, 3);
        const double gbs = total / us / 1e3;
        std::printf("  %4zu MiB pieces, %d stream(s): %7.1f GB/s (%.1f us per %zu MiB)\n", msg >> 20, ns, gbs, us,
                    total >> 20);
        json.write(bench::JsonLine().add("kernel", "copy_engine").add("impl", "cuda").add("world", c.world())
                       .add("streams", ns).add("msg_bytes", static_cast<long long>(msg))
                       .add("bytes", static_cast<long long>(total)).add("time_us", us).add("gbs", gbs));
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
  if (lead) {
    std::printf("stream memory op one-way latency (cuStreamWriteValue64 into the peer, cuStreamWaitValue64 here, "
                "%d round trips): %.2f us\n", iters, us);
    json.write(bench::JsonLine().add("kernel", "stream_memop_signal").add("impl", "cuda").add("world", c.world())
                   .add("latency_us", us));
  }
  c.barrier();
  WEAVE_CUDA_CHECK(cudaFree(src));
  for (auto& x : ss) WEAVE_CUDA_CHECK(cudaStreamDestroy(x));
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
          auto launch = [&] {
            if (add) stream_tiles<true><<<b, 128, smem, st>>>(p, 1);
            else stream_tiles<false><<<b, 128, smem, st>>>(p, 1);
          };
          us = bench::time_us(st, launch, 2, 5, 3);
          WEAVE_CUDA_CHECK(cudaGetLastError());
          double gbs = buf_bytes / us / 1e3;
          std::printf(" %11.1f", gbs);
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
                         .add("gbs", gbs));
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
      c.barrier();
      const double us = bench::time_us(st, [&] { stream_tiles<false><<<b, 128, smem, st>>>(p, next); }, 2, 5, 3);
      WEAVE_CUDA_CHECK(cudaGetLastError());
      std::vector<double> all(c.world());
      c.bootstrap().all_gather(&us, all.data(), sizeof us);
      const double worst = *std::max_element(all.begin(), all.end()), gbs = buf_bytes / worst / 1e3;
      if (lead) {
        std::printf(" %11.1f", gbs);
        std::fflush(stdout);
        json.write(bench::JsonLine().add("kernel", "tma_store_bidir").add("impl", "weave").add("dtype", "bf16")
                       .add("world", c.world()).add("blocks", b).add("msg_bytes", smem).add("bytes", buf_bytes)
                       .add("time_us", worst).add("gbs", gbs));
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
    if (lead) {
      std::printf("one-way signal latency (ping-pong rank 0 <-> 1, %d round trips): %.2f us\n", iters - warm, h / 1e3);
      json.write(bench::JsonLine().add("kernel", "signal").add("impl", "weave").add("world", c.world())
                     .add("latency_us", h / 1e3));
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
    if (lead) {
      std::printf("barrier latency (%d ranks, slowest rank): %.2f us\n", c.world(), worst / 1e3);
      json.write(bench::JsonLine().add("kernel", "barrier").add("impl", "weave").add("world", c.world())
                     .add("latency_us", worst / 1e3));
    }
  }
  WEAVE_CUDA_CHECK(cudaFree(ns));
  WEAVE_CUDA_CHECK(cudaStreamDestroy(st));
  copy_engine(c, json, buf.data(), buf.bytes());
  return 0;
}

}  // namespace

WEAVE_BENCH(primitives,
            "TMA store/store-add bandwidth to a peer, signal and barrier latency, copy engine into a peer's heap and "
            "stream-memop latency (2+ ranks; --mib 256 --tiles RxC,... --iters N)",
            run);
