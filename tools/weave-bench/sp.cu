// weave-bench sp: the sequence-parallel attention kernels (ring attention, Ulysses) under
// weave-run, weave only; bench/torch_sp.py appends the unfused PyTorch baselines (NCCL + cuDNN)
// for the same shapes to the same JSON file and prints the ratio table (--report). Also weave's
// single-GPU attention on the whole sequence on each GPU (impl "weave-1gpu"): the per-GPU
// throughput the ring target compares with.
//
// Correctness of the timed calls themselves: two input sets (normal, logit spread ~3 so the
// softmax is peaked; a function of the seed and the global element, so every rank regenerates
// the whole sequence) alternate by pointer from call to call; outputs are poisoned (NaN) before
// timing and the last timed call is checked on every rank against the cuBLAS float32 reference
// over the whole sequence (check/attention_ref.hpp, no weave code): O per tile (128 rows x D of
// one head) with a per-element bound, and LSE where the kernel returns it (ring, weave-1gpu; not
// Ulysses); then one more call on the other input set into freshly poisoned outputs, checked the
// same way (recheck.hpp says why). All of a rank's rows where that is cheap (B*H*L*S <= 2^36), else
// sampled rows of every chunk (its first and last 64 and two more pieces of 64, all batches and
// heads). A row is
// correct only if it is on every rank; any wrong row makes the command exit 1. The seed comes from
// WEAVE_TEST_SEED (rank 0's, printed; set it to replay).
// TFLOP/s: useful FLOPs 4*B*S^2*H*D (halved for causal); `tflops` is the total over the W GPUs,
// `tflops_per_gpu` = tflops / W (for weave-1gpu: the one GPU's rate).
//
//   weave-bench sp [--json FILE] [--seqs 8192,16384,32768,65536,131072] [--batch 4]
//                  [--heads-ring 16] [--heads-ulysses 32] [--head-dim 128] [--causal 0,1]
//                  [--kernels ring_attention,ulysses] [--num-comm-sms N] [--single 1]
//                  [--target-ms 200] [--check auto|all|sample]
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "attention/attention.hpp"
#include "bench.hpp"
#include "check/attention_ref.hpp"
#include "check/seed.hpp"
#include "ring_attention/ring_attention.hpp"
#include "ulysses/ulysses.hpp"
#include "weave/runtime/communicator.hpp"

using namespace weave;
using bf16 = __nv_bfloat16;

namespace {

// Reference work above which only sampled rows are checked, in (query row, key, head) triples:
// 2^36 is about a second of the reference.
constexpr double kAllRowsLimit = 68719476736.0;

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

struct DevBuf {
  void* p = nullptr;
  explicit DevBuf(size_t bytes) { WEAVE_CUDA_CHECK(cudaMalloc(&p, bytes ? bytes : 16)); }
  ~DevBuf() { cudaFree(p); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

// One input set: the whole sequence's Q, K, V (B, S, H, D), identical on every rank.
struct FullSet {
  DevBuf q, k, v;
  FullSet(int B, long long S, int H, int D, uint64_t seed, cudaStream_t st)
      : q(bytes(B, S, H, D)), k(bytes(B, S, H, D)), v(bytes(B, S, H, D)) {
    const float sd = float(check::qk_std(D, 0.f));
    check::fill_normal(q.as<bf16>(), B, S, H * D, check::derive(seed, 1), sd, st);
    check::fill_normal(k.as<bf16>(), B, S, H * D, check::derive(seed, 2), sd, st);
    check::fill_normal(v.as<bf16>(), B, S, H * D, check::derive(seed, 3), 1.f, st);
  }
  static size_t bytes(int B, long long S, int H, int D) { return size_t(B) * S * H * D * 2; }
};

// A rank's rows of a (B, S, H, D) tensor, chunks back to back: (B, L, H, D).
void take_rows(bf16* dst, const bf16* full, int B, long long S, long long L, size_t row_elems, const Chunks& chunks,
               cudaStream_t st) {
  for (int b = 0; b < B; ++b) {
    long long off = 0;
    for (const auto& c : chunks) {
      WEAVE_CUDA_CHECK(cudaMemcpyAsync(dst + (size_t(b) * L + off) * row_elems,
                                       full + (size_t(b) * S + c.begin) * row_elems, size_t(c.rows) * row_elems * 2,
                                       cudaMemcpyDeviceToDevice, st));
      off += c.rows;
    }
  }
}

double slowest(runtime::Communicator& c, double t) {
  std::vector<double> all(c.world());
  c.bootstrap().all_gather(&t, all.data(), sizeof t);
  for (double x : all) t = std::max(t, x);
  return t;
}
double largest(runtime::Communicator& c, double x) { return slowest(c, x); }
long long total(runtime::Communicator& c, long long x) {
  std::vector<long long> all(c.world());
  c.bootstrap().all_gather(&x, all.data(), sizeof x);
  long long s = 0;
  for (long long v : all) s += v;
  return s;
}
bool everywhere(runtime::Communicator& c, bool ok) {
  int mine = ok;
  std::vector<int> all(c.world());
  c.bootstrap().all_gather(&mine, all.data(), sizeof mine);
  for (int x : all) ok = ok && x;
  return ok;
}

// The check of one timed output, combined over ranks.
struct Verdict {
  bool ok = true;
  double o_ratio = 0, lse_ratio = 0;
  long long o_bad_tiles = 0, rows = 0;
  bool all_rows = true;
};
Verdict verdict(runtime::Communicator& comm, const check::AttnReport& rep, long long rows, bool all_rows,
                const char* what) {
  if (!rep.ok()) std::printf("[rank %d] %s: %s\n", comm.rank(), what, rep.str().c_str());
  Verdict v;
  v.ok = everywhere(comm, rep.ok());
  v.o_ratio = largest(comm, rep.o.worst);
  v.lse_ratio = largest(comm, rep.has_lse ? rep.lse.worst : 0.0);
  v.o_bad_tiles = total(comm, rep.o.bad_tiles);
  v.rows = total(comm, rows);
  v.all_rows = everywhere(comm, all_rows);
  return v;
}

// The verdict of two checks of one row (the last timed call's and a fresh call's, recheck.hpp):
// the failing one, else the one with the larger O error.
Verdict worse(const Verdict& a, const Verdict& b) { return !b.ok || (a.ok && b.o_ratio > a.o_ratio) ? b : a; }

// Rows to check of the chunks of a rank's output (o rows local, q rows and positions global).
std::vector<check::RowRange> rows_to_check(const Chunks& chunks, bool all, uint64_t seed, long long* n) {
  std::vector<check::RowRange> out;
  long long off = 0;
  int i = 0;
  for (const auto& c : chunks) {
    const auto r = all ? check::all_rows(c.begin, off, c.begin, c.rows)
                       : check::sample_rows(c.begin, off, c.begin, c.rows, check::derive(seed, i++));
    out.insert(out.end(), r.begin(), r.end());
    off += c.rows;
  }
  *n = 0;
  for (const auto& r : out) *n += r.rows;
  return out;
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
  const std::string check_mode = args.get("check", "auto");
  WEAVE_CHECK(check_mode == "auto" || check_mode == "all" || check_mode == "sample", "unknown --check '", check_mode,
              "' (auto, all, sample)");
  const auto kernels = args.names("kernels", "ring_attention,ulysses");
  for (const std::string& x : kernels)
    WEAVE_CHECK(x == "ring_attention" || x == "ulysses", "unknown kernel '", x, "' (ring_attention, ulysses)");
  long long maxS = 0;
  for (long long S : seqs) maxS = std::max(maxS, S);
  const int maxH = std::max(Hr, Hu);
  // The output (B x S_local x H x D) plus the kernels' gathered buffers (at most Q, K and V over
  // the whole sequence; they grow with S), each doubled for the first-fit heap's fragmentation
  // as sizes grow. Inputs, the input sets and the reference are ordinary device memory.
  const runtime::LaunchInfo li = runtime::detect_launch();
  const size_t full = size_t(B) * maxS * maxH * D * 2;
  runtime::CommOptions co;
  co.heap_bytes = 2 * (full / std::max(1, li.world) + 3 * full) + (size_t(512) << 20);
  co.wait_timeout_s = 120;  // one 128K-token call runs for seconds
  runtime::Communicator comm(li, co);
  const int W = comm.world(), rank = comm.rank();
  uint64_t seed = check::test_seed();  // rank 0's, on every rank
  {
    std::vector<uint64_t> all(W);
    comm.bootstrap().all_gather(&seed, all.data(), sizeof seed);
    seed = all[0];
  }
  sp::RingAttention ring(comm);
  sp::Ulysses uly(comm);
  check::AttentionRef ref;
  cudaStream_t st = nullptr;
  if (rank == 0) {
    std::printf("weave-bench sp: world %d, %s, %d SMs, B=%d D=%d, heads ring %d / ulysses %d, seed %llu\n", W,
                comm.props().name, comm.sm_count(), B, D, Hr, Hu, static_cast<unsigned long long>(seed));
    std::printf("%-15s %-10s %7s %3s %6s %11s %9s %8s %8s %8s %5s\n", "kernel", "impl", "S", "H", "causal", "time_us",
                "TF/s/GPU", "o_ratio", "lse_rat", "rows", "comm");
  }
  bool all_ok = true;
  for (const std::string& kernel : kernels)
    for (long long S : seqs)
      for (long long causal : causals) {
        const bool is_ring = kernel == "ring_attention";
        const int H = is_ring ? Hr : Hu;
        const Config cf{kernel, B, H, D, S, causal != 0};
        const Chunks mine = cf.chunks_of(rank, W);
        long long L = 0, Lmax = 0;
        for (auto& c : mine) L += c.rows;
        for (int s = 0; s < W; ++s) {
          long long n = 0;
          for (auto& c : cf.chunks_of(s, W)) n += c.rows;
          Lmax = std::max(Lmax, n);
        }
        const size_t n = size_t(B) * L * H * D, nl = size_t(B) * H * L, row = size_t(H) * D;
        const size_t nmax = size_t(B) * Lmax * H * D;  // heap allocations are the same size on every rank
        const uint64_t cfg_seed =
            check::derive(seed, (is_ring ? 1ull : 2ull) << 40 | uint64_t(S) << 1 | uint64_t(causal));
        std::unique_ptr<FullSet> set[2];
        std::unique_ptr<DevBuf> lq[2], lk[2], lv[2];
        for (int s = 0; s < 2; ++s) {
          set[s] = std::make_unique<FullSet>(B, S, H, D, check::derive(cfg_seed, s), st);
          lq[s] = std::make_unique<DevBuf>(n * 2);
          lk[s] = std::make_unique<DevBuf>(n * 2);
          lv[s] = std::make_unique<DevBuf>(n * 2);
          take_rows(lq[s]->as<bf16>(), set[s]->q.as<bf16>(), B, S, L, row, mine, st);
          take_rows(lk[s]->as<bf16>(), set[s]->k.as<bf16>(), B, S, L, row, mine, st);
          take_rows(lv[s]->as<bf16>(), set[s]->v.as<bf16>(), B, S, L, row, mine, st);
        }
        runtime::SymmetricTensor<bf16> o(comm, nmax);
        DevBuf lse(nl * 4);
        WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
        comm.barrier();
        int ncomm = 0;
        long long calls = 0;
        std::function<void()> fn;
        if (is_ring) {
          sp::RingOptions ro;
          ro.causal = cf.causal;
          ro.sharding = cf.causal ? sp::Sharding::Zigzag : sp::Sharding::Contiguous;
          ro.num_comm_sms = fixed_comm;
          const sp::RingShape rs{B, S, H, H, D};
          ncomm = ring.forward(lq[0]->as<bf16>(), lk[0]->as<bf16>(), lv[0]->as<bf16>(), o.data(), lse.as<float>(), rs,
                               ro, st)
                      .num_comm_sms;
          ro.num_comm_sms = ncomm;  // timed calls reuse the tuner's choice
          fn = [&, ro, rs] {
            const int s = static_cast<int>(calls++ % 2);
            ring.forward(lq[s]->as<bf16>(), lk[s]->as<bf16>(), lv[s]->as<bf16>(), o.data(), lse.as<float>(), rs, ro,
                         st);
          };
        } else {
          sp::UlyssesOptions uo;
          uo.causal = cf.causal;
          uo.num_comm_sms = fixed_comm;
          const sp::UlyssesShape us{B, S, H, H, D};
          ncomm =
              uly.forward(lq[0]->as<bf16>(), lk[0]->as<bf16>(), lv[0]->as<bf16>(), o.data(), us, uo, st).num_comm_sms;
          uo.num_comm_sms = ncomm;
          fn = [&, uo, us] {
            const int s = static_cast<int>(calls++ % 2);
            uly.forward(lq[s]->as<bf16>(), lk[s]->as<bf16>(), lv[s]->as<bf16>(), o.data(), us, uo, st);
          };
        }
        comm.sync(st);
        comm.barrier();  // no peer still writes into o (Ulysses) when it is poisoned
        check::poison(o.data(), nmax, st);
        check::poison(lse.as<float>(), nl, st);
        comm.sync(st);
        comm.barrier();
        const double flop = 4.0 * B * double(S) * double(S) * H * D / (cf.causal ? 2 : 1);
        auto json_row = [&](const char* impl, int world, double us) {
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
        // The last timed call's output (input set `last`; query rows `mine` of the sequence, `lo` of
        // them here) against the reference on the whole sequence, combined over ranks.
        auto check_call = [&](int last, const Chunks& mine_rows, long long lo, uint64_t salt, const bf16* out,
                              const float* out_lse, const char* name) {
          check::AttnProblem p;
          p.B = B, p.Hq = H, p.Hkv = H, p.D = D, p.Skv = S, p.Lq = S, p.Lo = lo, p.causal = cf.causal;
          const bool all =
              check_mode == "all" || (check_mode == "auto" && double(B) * H * double(lo) * double(S) <= kAllRowsLimit);
          long long nrows = 0;
          const auto rows = rows_to_check(mine_rows, all, check::derive(cfg_seed, salt, rank), &nrows);
          const check::AttnReport rep =
              ref.check(p, set[last]->q.as<bf16>(), set[last]->k.as<bf16>(), set[last]->v.as<bf16>(), rows, out,
                        out_lse, check::attention_o_bound(), check::attention_lse_bound(), st);
          return verdict(comm, rep, nrows, all, name);
        };
        auto add_check = [&](bench::JsonLine& j, const Verdict& v, bool has_lse) {
          j.add("check", v.all_rows ? "last timed call and a fresh one, every row vs cuBLAS fp32"
                                    : "last timed call and a fresh one, sampled rows of every chunk (all batches, "
                                      "heads) vs cuBLAS fp32")
              .add("checked_rows", v.rows)
              .add("o_err_ratio", v.o_ratio)
              .add("o_bad_tiles", v.o_bad_tiles);
          if (has_lse) j.add("lse_err_ratio", v.lse_ratio);
          j.add("seed", std::to_string(seed)).add("correct", v.ok);
        };
        const double est_us = flop / W / 500e12 * 1e6;
        const int iters = std::max(1, std::min(50, static_cast<int>(target_ms * 1e3 / est_us)));
        comm.barrier();
        double t = bench::time_us(st, fn, est_us > 1e5 ? 1 : 2, iters, 3);
        comm.sync(st);
        comm.barrier();  // every rank's output complete (Ulysses: peers write this rank's rows)
        t = slowest(comm, t);
        {
          Verdict v = check_call(static_cast<int>((calls - 1) % 2), mine, L, 0x5A, o.data(),
                                 is_ring ? lse.as<float>() : nullptr, kernel.c_str());
          if (v.ok) {  // one more call, on the other input set into fresh poison (recheck.hpp says why)
            check::poison(o.data(), nmax, st);
            check::poison(lse.as<float>(), nl, st);
            comm.sync(st);
            comm.barrier();  // every rank's output poisoned before a peer writes into it (Ulysses)
            fn();
            comm.sync(st);
            comm.barrier();
            v = worse(v, check_call(static_cast<int>((calls - 1) % 2), mine, L, 0x5B, o.data(),
                                    is_ring ? lse.as<float>() : nullptr, kernel.c_str()));
          }
          all_ok = all_ok && v.ok;
          if (rank == 0) {
            const double tf = flop / t * 1e-6;
            char lr[16] = "-";
            if (is_ring) std::snprintf(lr, sizeof lr, "%.3f", v.lse_ratio);
            std::printf("%-15s %-10s %7lld %3d %6d %11.1f %9.1f %8.3f %8s %8lld %5d%s\n", kernel.c_str(), "weave", S, H,
                        int(causal), t, tf / W, v.o_ratio, lr, v.rows, ncomm, v.ok ? "" : "  WRONG");
            std::fflush(stdout);
            bench::JsonLine j = json_row("weave", W, t);
            j.add("sharding", is_ring ? (cf.causal ? "zigzag" : "contiguous") : "contiguous")
                .add("num_comm_sms", ncomm);
            add_check(j, v, is_ring);
            sink.write(j);
          }
        }
        lq[0].reset(), lk[0].reset(), lv[0].reset(), lq[1].reset(), lk[1].reset(), lv[1].reset();
        if (single) {
          // The whole problem on each GPU with the single-GPU kernel (the per-GPU ceiling), on the
          // same two input sets, checked the same way (the rows of the whole sequence).
          const attention::Shape s1{B, static_cast<int>(S), H, H, D};
          const size_t n1 = size_t(B) * S * H * D, nl1 = size_t(B) * H * S;
          DevBuf o1(n1 * 2), lse1(nl1 * 4);
          attention::Options ao;
          ao.causal = cf.causal;
          const double est1 = flop / 500e12 * 1e6;
          const int it1 = std::max(1, std::min(50, static_cast<int>(target_ms * 1e3 / est1)));
          check::poison(o1.as<bf16>(), n1, st);
          check::poison(lse1.as<float>(), nl1, st);
          long long calls1 = 0;
          comm.barrier();
          double t1 = bench::time_us(
              st,
              [&] {
                const int s = static_cast<int>(calls1++ % 2);
                attention::forward(set[s]->q.as<bf16>(), set[s]->k.as<bf16>(), set[s]->v.as<bf16>(), o1.as<bf16>(),
                                   lse1.as<float>(), s1, ao, st);
              },
              est1 > 1e5 ? 1 : 2, it1, est1 > 1e6 ? 1 : 3);  // a reference taking seconds per call is timed once
          WEAVE_CUDA_CHECK(cudaStreamSynchronize(st));
          t1 = slowest(comm, t1);
          Verdict v = check_call(static_cast<int>((calls1 - 1) % 2), Chunks{{0, S}}, S, 0x1C, o1.as<bf16>(),
                                 lse1.as<float>(), "weave-1gpu");
          if (v.ok) {  // one more call, on the other input set into fresh poison
            check::poison(o1.as<bf16>(), n1, st);
            check::poison(lse1.as<float>(), nl1, st);
            const int s = static_cast<int>(calls1++ % 2);
            attention::forward(set[s]->q.as<bf16>(), set[s]->k.as<bf16>(), set[s]->v.as<bf16>(), o1.as<bf16>(),
                               lse1.as<float>(), s1, ao, st);
            WEAVE_CUDA_CHECK(cudaStreamSynchronize(st));
            v = worse(v, check_call(s, Chunks{{0, S}}, S, 0x1D, o1.as<bf16>(), lse1.as<float>(), "weave-1gpu"));
          }
          all_ok = all_ok && v.ok;
          if (rank == 0) {
            const double tf1 = flop / t1 * 1e-6;
            std::printf("%-15s %-10s %7lld %3d %6d %11.1f %9.1f %8.3f %8.3f %8lld%s\n", kernel.c_str(), "weave-1gpu", S,
                        H, int(causal), t1, tf1, v.o_ratio, v.lse_ratio, v.rows, v.ok ? "" : "  WRONG");
            std::fflush(stdout);
            bench::JsonLine j = json_row("weave-1gpu", 1, t1);
            add_check(j, v, true);
            sink.write(j);
          }
        }
      }
  if (rank == 0) std::printf(all_ok ? "all results correct\n" : "SOME RESULTS WRONG\n");
  return all_ok ? 0 : 1;
}

}  // namespace

WEAVE_BENCH(sp,
            "ring attention and Ulysses under weave-run (--seqs 8192,...,131072 --batch 4 --heads-ring 16 "
            "--heads-ulysses 32 --head-dim 128 --causal 0,1 --kernels ring_attention,ulysses --num-comm-sms N "
            "--single 1 --check auto|all|sample)",
            run_sp);
