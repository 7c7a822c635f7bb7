// Timing of ring and Ulysses attention (and weave's single-GPU attention on the same whole
// shape) under weave-run, for the READMEs' tables until `weave-bench sp` exists:
//   weave-run -n 2 -- weave_sp_bench [--seqs 8192,131072] [--causal 0,1] [--ncomm 4 | -1 (tuner)]
//                                    [--kernels ring,ulysses,single] [--iters 3]
// One JSON line per configuration on rank 0: the slowest rank's mean time; TFLOP/s per GPU =
// useful FLOPs (4 B S^2 H D, halved for causal) / W / time (single: / time on one GPU).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "attention/attention.hpp"
#include "gemm/reference.cuh"
#include "ring_attention/ring_attention.hpp"
#include "ulysses/ulysses.hpp"
#include "weave/common/error.hpp"
#include "weave/runtime/communicator.hpp"

using weave::sp::bf16;

namespace {

std::vector<long long> parse_list(const std::string& s) {
  std::vector<long long> v;
  std::stringstream ss(s);
  std::string x;
  while (std::getline(ss, x, ',')) v.push_back(std::atoll(x.c_str()));
  return v;
}

template <class F>
double time_us(F&& f, int iters) {
  f();  // warm-up (and the tuner's search, when it runs)
  WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
  cudaEvent_t a, b;
  WEAVE_CUDA_CHECK(cudaEventCreate(&a));
  WEAVE_CUDA_CHECK(cudaEventCreate(&b));
  WEAVE_CUDA_CHECK(cudaEventRecord(a));
  for (int i = 0; i < iters; ++i) f();
  WEAVE_CUDA_CHECK(cudaEventRecord(b));
  WEAVE_CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  WEAVE_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return 1e3 * ms / iters;
}

double slowest(weave::runtime::Communicator& c, double us) {
  std::vector<double> all(c.world());
  c.bootstrap().all_gather(&us, all.data(), sizeof us);
  return *std::max_element(all.begin(), all.end());
}

// Every element finite (the outputs were poisoned first).
bool finite(const bf16* p, size_t n) {
  std::vector<bf16> h(n);
  WEAVE_CUDA_CHECK(cudaMemcpy(h.data(), p, n * 2, cudaMemcpyDeviceToHost));
  for (auto x : h)
    if (!std::isfinite(__bfloat162float(x))) return false;
  return true;
}

void* dev(size_t bytes) {
  void* p = nullptr;
  WEAVE_CUDA_CHECK(cudaMalloc(&p, bytes));
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<long long> seqs = {8192, 16384, 32768, 65536, 131072}, causals = {0, 1};
  int ncomm = 4, iters = 3, B = 4, D = 128, Hr = 16, Hu = 32;
  std::string kernels = "ring,ulysses,single";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--seqs") seqs = parse_list(v);
    else if (k == "--causal") causals = parse_list(v);
    else if (k == "--ncomm") ncomm = std::atoi(v.c_str());
    else if (k == "--iters") iters = std::atoi(v.c_str());
    else if (k == "--kernels") kernels = v;
    else if (k == "--batch") B = std::atoi(v.c_str());
  }
  weave::runtime::CommOptions co;
  co.heap_bytes = size_t(24) << 30;
  weave::runtime::Communicator c(co);
  const int W = c.world(), r = c.rank();
  auto has = [&](const char* k) { return kernels.find(k) != std::string::npos; };
  auto report = [&](const char* kernel, long long S, int H, bool causal, double us, bool ok, int nc) {
    const double fl = 4.0 * B * double(S) * S * H * D * (causal ? 0.5 : 1.0);
    const int w = std::string(kernel) == "attention" ? 1 : W;
    if (r == 0)
      std::printf(
          "{\"kernel\": \"%s\", \"impl\": \"weave\", \"B\": %d, \"S\": %lld, \"H\": %d, \"D\": %d, \"causal\": %d, "
          "\"world\": %d, \"num_comm_sms\": %d, \"time_us\": %.1f, \"tflops\": %.1f, \"tflops_per_gpu\": %.1f, "
          "\"correct\": %s}\n",
          kernel, B, S, H, D, causal ? 1 : 0, w, nc, us, fl / us * 1e-6, fl / us * 1e-6 / w, ok ? "true" : "false");
    std::fflush(stdout);
  };
  for (long long S : seqs)
    for (long long cz : causals) {
      const bool causal = cz != 0;
      if (has("ring")) {
        const auto sh = causal ? weave::sp::Sharding::Zigzag : weave::sp::Sharding::Contiguous;
        const long long L = weave::sp::local_rows(S, W, sh, r);
        const size_t n = size_t(B) * L * Hr * D;
        bf16 *q = static_cast<bf16*>(dev(n * 2)), *k = static_cast<bf16*>(dev(n * 2)),
             *v = static_cast<bf16*>(dev(n * 2)), *o = static_cast<bf16*>(dev(n * 2));
        float* lse = static_cast<float*>(dev(size_t(B) * Hr * L * 4));
        weave::gemm::ref::fill_uniform(q, n, 11 + r);
        weave::gemm::ref::fill_uniform(k, n, 22 + r);
        weave::gemm::ref::fill_uniform(v, n, 33 + r);
        weave::gemm::ref::poison(o, n);
        weave::sp::RingAttention ra(c);
        weave::sp::RingOptions opt;
        opt.causal = causal;
        opt.sharding = sh;
        opt.num_comm_sms = ncomm;
        int used = 0;
        const double us = time_us(
            [&] { used = ra.forward(q, k, v, o, lse, {B, S, Hr, Hr, D}, opt).num_comm_sms; }, iters);
        c.sync();
        report("ring_attention", S, Hr, causal, slowest(c, us), finite(o, std::min<size_t>(n, 1 << 22)), used);
        cudaFree(q), cudaFree(k), cudaFree(v), cudaFree(o), cudaFree(lse);
      }
      if (has("ulysses")) {
        const auto shd = weave::sp::ulysses_shard(S, W, r);
        const size_t n = size_t(B) * shd.rows * Hu * D, nmax = size_t(B) * (S / W + 1) * Hu * D;
        bf16 *q = static_cast<bf16*>(dev(n * 2)), *k = static_cast<bf16*>(dev(n * 2)),
             *v = static_cast<bf16*>(dev(n * 2));
        bf16* o = static_cast<bf16*>(c.alloc(nmax * 2));
        weave::gemm::ref::fill_uniform(q, n, 44 + r);
        weave::gemm::ref::fill_uniform(k, n, 55 + r);
        weave::gemm::ref::fill_uniform(v, n, 66 + r);
        weave::gemm::ref::poison(o, n);
        WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
        c.barrier();
        {
          weave::sp::Ulysses u(c);
          weave::sp::UlyssesOptions opt;
          opt.causal = causal;
          opt.num_comm_sms = ncomm;
          int used = 0;
          const double us = time_us([&] { used = u.forward(q, k, v, o, {B, S, Hu, Hu, D}, opt).num_comm_sms; }, iters);
          c.sync();
          report("ulysses", S, Hu, causal, slowest(c, us), finite(o, std::min<size_t>(n, 1 << 22)), used);
          c.barrier();
        }
        c.free(o);
        cudaFree(q), cudaFree(k), cudaFree(v);
      }
      if (has("single")) {
        for (int H : {Hr, Hu}) {
          if (H == Hu && !has("ulysses")) continue;
          if (H == Hr && !has("ring")) continue;
          const size_t n = size_t(B) * S * H * D;
          bf16 *q = static_cast<bf16*>(dev(n * 2)), *k = static_cast<bf16*>(dev(n * 2)),
               *v = static_cast<bf16*>(dev(n * 2)), *o = static_cast<bf16*>(dev(n * 2));
          weave::gemm::ref::fill_uniform(q, n, 1);
          weave::gemm::ref::fill_uniform(k, n, 2);
          weave::gemm::ref::fill_uniform(v, n, 3);
          weave::gemm::ref::poison(o, n);
          weave::attention::Options opt;
          opt.causal = causal;
          const double us = time_us(
              [&] { weave::attention::forward(q, k, v, o, nullptr, {B, static_cast<int>(S), H, H, D}, opt); }, iters);
          report("attention", S, H, causal, us, finite(o, std::min<size_t>(n, 1 << 22)), 0);
          cudaFree(q), cudaFree(k), cudaFree(v), cudaFree(o);
        }
      }
    }
  c.sync();
  c.barrier();
  return 0;
}
