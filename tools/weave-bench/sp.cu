// weave-bench sp: the sequence-parallel attention kernels (ring attention, Ulysses) under
// weave-run, weave only; bench/torch_sp.py appends the unfused PyTorch baselines (NCCL + cuDNN)
// for the same shapes to the same JSON file and prints the ratio table (--report).
// Per configuration: inputs random (per rank), output poisoned, one call checked (every element
// finite, sampled rows and their LSE against float64 over the gathered sequence), then timed
// (slowest rank). Also weave's single-GPU attention on the whole sequence on each GPU (impl
// "weave-1gpu"): the per-GPU throughput the ring target compares with.
// TFLOP/s: useful FLOPs 4*B*S^2*H*D (halved for causal); `tflops` is the total over the W GPUs,
// `tflops_per_gpu` = tflops / W (for weave-1gpu: the one GPU's rate).
//
//   weave-bench sp [--json FILE] [--seqs 8192,16384,32768,65536,131072] [--batch 4]
//                  [--heads-ring 16] [--heads-ulysses 32] [--head-dim 128] [--causal 0,1]
//                  [--kernels ring_attention,ulysses] [--num-comm-sms N] [--single 1]
//                  [--target-ms 200]
#include <cuda_bf16.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "attention/attention.hpp"
#include "bench.hpp"
#include "gemm/reference.cuh"
#include "nonfinite.cuh"
#include "ring_attention/ring_attention.hpp"
#include "ulysses/ulysses.hpp"
#include "weave/runtime/communicator.hpp"

using namespace weave;
using bf16 = __nv_bfloat16;

namespace {

// Where a rank's local rows sit in the global sequence: (global begin, rows) per stored chunk.
using Chunks = std::vector<sp::ChunkRange>;

struct Config {
  std::string kernel;
  int B, H, D;
  long long S;
  bool causal;
  Chunks chunks_of(int rank, int W) const {
    Chunks c;
    if (kernel == "ring_attention") {
      const sp::Sharding sh = causal ? sp::Sharding::Zigzag : sp::Sharding::Contiguous;
      for (int i = 0; i < sp::chunks_per_rank(sh); ++i) c.push_back(sp::chunk_range(S, W, sh, rank, i));
    } else {
      const sp::RowShard r = sp::ulysses_shard(S, W, rank);
      c.push_back({r.begin, r.rows});
    }
    return c;
  }
};

// Sampled query rows of this rank against float64 over the whole sequence: K/V rows of every
// rank are read through the symmetric heap. Returns max |O - ref| and max relative LSE error.
void check_rows(runtime::Communicator& comm, const Config& cf, const bf16* q, const bf16* k, const bf16* v,
                const bf16* o, const float* lse, double& o_err, double& l_err) {
  const int W = comm.world(), rank = comm.rank(), D = cf.D, H = cf.H;
  const Chunks mine = cf.chunks_of(rank, W);
  long long L = 0;
  for (auto& c : mine) L += c.rows;
  const size_t local_elems = size_t(cf.B) * L * H * D;
  const auto kp = comm.peers(k, local_elems * 2), vp = comm.peers(v, local_elems * 2);
  std::mt19937 g(static_cast<unsigned>(cf.S * 7 + rank + cf.causal));
  std::vector<bf16> kr(size_t(cf.S) * D), vr(size_t(cf.S) * D), qr(D), orow(D);
  const double scale = 1.0 / std::sqrt(double(D));
  o_err = l_err = 0;
  for (int t = 0; t < 6; ++t) {
    const int b = g() % cf.B, h = g() % H;
    const long long i = t == 0 ? L - 1 : t == 1 ? 0 : static_cast<long long>(g() % L);
    long long pos = 0, off = i;  // global position of local row i
    for (auto& c : mine) {
      if (off < c.rows) {
        pos = c.begin + off;
        break;
      }
      off -= c.rows;
    }
    // Head h's K and V over the whole sequence, chunk by chunk from their owners.
    for (int s = 0; s < W; ++s) {
      long long loc = 0;
      for (auto& c : cf.chunks_of(s, W)) {
        const long long Ls = [&] {
          long long n = 0;
          for (auto& x : cf.chunks_of(s, W)) n += x.rows;
          return n;
        }();
        const size_t src = ((size_t(b) * Ls + loc) * H + h) * D;
        WEAVE_CUDA_CHECK(cudaMemcpy2D(kr.data() + size_t(c.begin) * D, D * 2, static_cast<const bf16*>(kp[s]) + src,
                                      size_t(H) * D * 2, D * 2, c.rows, cudaMemcpyDeviceToHost));
        WEAVE_CUDA_CHECK(cudaMemcpy2D(vr.data() + size_t(c.begin) * D, D * 2, static_cast<const bf16*>(vp[s]) + src,
                                      size_t(H) * D * 2, D * 2, c.rows, cudaMemcpyDeviceToHost));
        loc += c.rows;
      }
    }
    const size_t row = ((size_t(b) * L + i) * H + h) * D;
    WEAVE_CUDA_CHECK(cudaMemcpy(qr.data(), q + row, D * 2, cudaMemcpyDeviceToHost));
    WEAVE_CUDA_CHECK(cudaMemcpy(orow.data(), o + row, D * 2, cudaMemcpyDeviceToHost));
    const long long jmax = cf.causal ? pos : cf.S - 1;
    std::vector<double> sc(jmax + 1), acc(D, 0.0);
    double mx = -INFINITY, sum = 0;
    for (long long j = 0; j <= jmax; ++j) {
      double a = 0;
      for (int d = 0; d < D; ++d) a += double(__bfloat162float(qr[d])) * __bfloat162float(kr[size_t(j) * D + d]);
      sc[j] = a * scale;
      mx = std::max(mx, sc[j]);
    }
    for (long long j = 0; j <= jmax; ++j) sum += (sc[j] = std::exp(sc[j] - mx));
    for (long long j = 0; j <= jmax; ++j)
      for (int d = 0; d < D; ++d) acc[d] += sc[j] / sum * __bfloat162float(vr[size_t(j) * D + d]);
    for (int d = 0; d < D; ++d) {
      const double x = __bfloat162float(orow[d]);
      o_err = std::isfinite(x) ? std::max(o_err, std::fabs(x - acc[d])) : INFINITY;
    }
    if (lse != nullptr) {
      float l = 0;
      WEAVE_CUDA_CHECK(cudaMemcpy(&l, lse + (size_t(b) * H + h) * L + i, 4, cudaMemcpyDeviceToHost));
      const double rl = mx + std::log(sum);
      l_err = std::max(l_err, std::isfinite(l) ? std::fabs(l - rl) / std::max(1.0, std::fabs(rl)) : INFINITY);
    }
  }
}

double slowest(runtime::Communicator& c, double t) {
  std::vector<double> all(c.world());
  c.bootstrap().all_gather(&t, all.data(), sizeof t);
  for (double x : all) t = std::max(t, x);
  return t;
}
bool everywhere(runtime::Communicator& c, bool ok) {
  int mine = ok;
  std::vector<int> all(c.world());
  c.bootstrap().all_gather(&mine, all.data(), sizeof mine);
  for (int x : all) ok = ok && x;
  return ok;
}

int run_sp(const bench::Args& args) {
  bench::JsonSink sink(args);
  const auto seqs = args.numbers("seqs", "8192,16384,32768,65536,131072");
  const auto causals = args.numbers("causal", "0,1");
  const int B = static_cast<int>(args.get_int("batch", 4));
  const int Hr = static_cast<int>(args.get_int("heads-ring", 16));
  const int Hu = static_cast<int>(args.get_int("heads-ulysses", 32));
  const int D = static_cast<int>(args.get_int("head-dim", 128));
  const int fixed_comm = static_cast<int>(args.get_int("num-comm-sms", -1));
  const bool single = args.get_int("single", 1) != 0;
  const double target_ms = std::stod(args.get("target-ms", "200"));
  const auto kernels = args.names("kernels", "ring_attention,ulysses");
  for (const std::string& x : kernels)
    WEAVE_CHECK(x == "ring_attention" || x == "ulysses", "unknown kernel '", x, "' (ring_attention, ulysses)");
  long long maxS = 0;
  for (long long S : seqs) maxS = std::max(maxS, S);
  const int maxH = std::max(Hr, Hu);
  // Inputs and output (4 tensors of B x S_local x H x D) plus the kernels' gathered buffers (at
  // most Q, K and V over the whole sequence; they grow with S), each doubled for the first-fit
  // heap's fragmentation as sizes grow.
  const runtime::LaunchInfo li = runtime::detect_launch();
  const size_t full = size_t(B) * maxS * maxH * D * 2;
  runtime::CommOptions co;
  co.heap_bytes = 2 * (4 * full / std::max(1, li.world) + 3 * full) + (size_t(512) << 20);
  co.wait_timeout_s = 120;  // one 128K-token call runs for seconds
  runtime::Communicator comm(li, co);
  const int W = comm.world(), rank = comm.rank();
  sp::RingAttention ring(comm);
  sp::Ulysses uly(comm);
  cudaStream_t st = nullptr;
  if (rank == 0) {
    std::printf("weave-bench sp: world %d, %s, %d SMs, B=%d D=%d, heads ring %d / ulysses %d\n", W,
                comm.props().name, comm.sm_count(), B, D, Hr, Hu);
    std::printf("%-15s %-10s %7s %3s %6s %11s %9s %9s %9s %5s\n", "kernel", "impl", "S", "H", "causal", "time_us",
                "TF/s/GPU", "o_err", "lse_err", "comm");
  }
  bool all_ok = true;
  for (const std::string& kernel : kernels)
    for (long long S : seqs)
      for (long long causal : causals) {
        const int H = kernel == "ring_attention" ? Hr : Hu;
        const Config cf{kernel, B, H, D, S, causal != 0};
        long long L = 0, Lmax = 0;
        for (auto& c : cf.chunks_of(rank, W)) L += c.rows;
        for (int s = 0; s < W; ++s) {
          long long n = 0;
          for (auto& c : cf.chunks_of(s, W)) n += c.rows;
          Lmax = std::max(Lmax, n);
        }
        const size_t n = size_t(B) * L * H * D, nl = size_t(B) * H * L;
        const size_t nmax = size_t(B) * Lmax * H * D;  // heap allocations are the same size on every rank
        runtime::SymmetricTensor<bf16> q(comm, nmax), k(comm, nmax), v(comm, nmax), o(comm, nmax);
        float* lse = nullptr;
        WEAVE_CUDA_CHECK(cudaMalloc(&lse, nl * 4));
        gemm::ref::fill_uniform(q.data(), n, 100 + 7 * rank + S);
        gemm::ref::fill_uniform(k.data(), n, 200 + 7 * rank + S);
        gemm::ref::fill_uniform(v.data(), n, 300 + 7 * rank + S);
        gemm::ref::poison(o.data(), n);
        WEAVE_CUDA_CHECK(cudaMemset(lse, 0xFF, nl * 4));
        WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
        comm.barrier();
        int ncomm = 0;
        std::function<void()> fn;
        if (kernel == "ring_attention") {
          sp::RingOptions ro;
          ro.causal = cf.causal;
          ro.sharding = cf.causal ? sp::Sharding::Zigzag : sp::Sharding::Contiguous;
          ro.num_comm_sms = fixed_comm;
          const sp::RingShape rs{B, S, H, H, D};
          ncomm = ring.forward(q.data(), k.data(), v.data(), o.data(), lse, rs, ro, st).num_comm_sms;
          ro.num_comm_sms = ncomm;  // timed calls reuse the tuner's choice
          fn = [&, ro, rs] { ring.forward(q.data(), k.data(), v.data(), o.data(), lse, rs, ro, st); };
        } else {
          sp::UlyssesOptions uo;
          uo.causal = cf.causal;
          uo.num_comm_sms = fixed_comm;
          const sp::UlyssesShape us{B, S, H, H, D};
          ncomm = uly.forward(q.data(), k.data(), v.data(), o.data(), us, uo, st).num_comm_sms;
          uo.num_comm_sms = ncomm;
          fn = [&, uo, us] { uly.forward(q.data(), k.data(), v.data(), o.data(), us, uo, st); };
        }
        comm.sync(st);
        comm.barrier();  // every rank's output is complete before anyone reads peers' K/V rows
        const unsigned long long bad = bench::count_nonfinite(o.data(), n);
        double o_err = 0, l_err = 0;
        check_rows(comm, cf, q.data(), k.data(), v.data(), o.data(), kernel == "ring_attention" ? lse : nullptr, o_err,
                   l_err);
        const bool ok = everywhere(comm, bad == 0 && o_err < 2e-2 && l_err < 2e-3);
        all_ok = all_ok && ok;
        const double flop = 4.0 * B * double(S) * double(S) * H * D / (cf.causal ? 2 : 1);
        auto row = [&](const char* impl, int world, double us) {
          return bench::JsonLine()
              .add("kernel", kernel)
              .add("impl", impl)
              .add("B", B)
              .add("S", S)
              .add("H", H)
              .add("H_kv", H)
              .add("D", D)
              .add("causal", cf.causal)
              .add("world", world)
              .add("time_us", us)
              .add("tflops", flop / us * 1e-6)
              .add("tflops_per_gpu", flop / us * 1e-6 / world);
        };
        const double est_us = flop / W / 500e12 * 1e6;
        const int iters = std::max(1, std::min(50, static_cast<int>(target_ms * 1e3 / est_us)));
        comm.barrier();
        double t = bench::time_us(st, fn, est_us > 1e5 ? 1 : 2, iters, 3);
        comm.sync(st);
        t = slowest(comm, t);
        const double tf = flop / t * 1e-6;
        if (rank == 0) {
          std::printf("%-15s %-10s %7lld %3d %6d %11.1f %9.1f %9.2e %9.2e %5d%s\n", kernel.c_str(), "weave", S, H,
                      int(causal), t, tf / W, o_err, l_err, ncomm, ok ? "" : "  WRONG");
          std::fflush(stdout);
          sink.write(row("weave", W, t)
                         .add("sharding", kernel == "ring_attention" ? (cf.causal ? "zigzag" : "contiguous")
                                                                     : "contiguous")
                         .add("num_comm_sms", ncomm)
                         .add("o_max_err", o_err)
                         .add("lse_rel_err", l_err)
                         .add("check", "sampled rows vs float64")
                         .add("correct", ok));
        }
        cudaFree(lse);
        if (single) {
          // The whole problem on each GPU with the single-GPU kernel (the per-GPU ceiling).
          const attention::Shape s1{B, static_cast<int>(S), H, H, D};
          const size_t n1 = size_t(B) * S * H * D;
          bf16 *q1, *k1, *v1, *o1;
          WEAVE_CUDA_CHECK(cudaMalloc(&q1, n1 * 2));
          WEAVE_CUDA_CHECK(cudaMalloc(&k1, n1 * 2));
          WEAVE_CUDA_CHECK(cudaMalloc(&v1, n1 * 2));
          WEAVE_CUDA_CHECK(cudaMalloc(&o1, n1 * 2));
          gemm::ref::fill_uniform(q1, n1, 400 + S);
          gemm::ref::fill_uniform(k1, n1, 500 + S);
          gemm::ref::fill_uniform(v1, n1, 600 + S);
          attention::Options ao;
          ao.causal = cf.causal;
          const double est1 = flop / 500e12 * 1e6;
          const int it1 = std::max(1, std::min(50, static_cast<int>(target_ms * 1e3 / est1)));
          gemm::ref::poison(o1, n1);
          comm.barrier();
          double t1 = bench::time_us(
              st, [&] { attention::forward(q1, k1, v1, o1, nullptr, s1, ao, st); }, est1 > 1e5 ? 1 : 2, it1,
              est1 > 1e6 ? 1 : 3);  // a reference taking seconds per call is timed once
          t1 = slowest(comm, t1);
          const bool ok1 = everywhere(comm, bench::count_nonfinite(o1, n1) == 0);  // poisoned before: every row written
          all_ok = all_ok && ok1;
          const double tf1 = flop / t1 * 1e-6;
          if (rank == 0) {
            std::printf("%-15s %-10s %7lld %3d %6d %11.1f %9.1f\n", kernel.c_str(), "weave-1gpu", S, H, int(causal), t1,
                        tf1);
            sink.write(row("weave-1gpu", 1, t1).add("check", "output finite").add("correct", ok1));
          }
          cudaFree(q1), cudaFree(k1), cudaFree(v1), cudaFree(o1);
        }
      }
  if (rank == 0) std::printf(all_ok ? "all results correct\n" : "SOME RESULTS WRONG\n");
  return all_ok ? 0 : 1;
}

}  // namespace

WEAVE_BENCH(sp,
            "ring attention and Ulysses under weave-run (--seqs 8192,...,131072 --batch 4 --heads-ring 16 "
            "--heads-ulysses 32 --head-dim 128 --causal 0,1 --kernels ring_attention,ulysses --num-comm-sms N "
            "--single 1)",
            run_sp);
