// weave-bench quantize: the fp8 quantiser (kernels/gemm_fp8/quantize.hpp), bf16 X (rows x cols) ->
// fp8 Q (+ its transpose Qt) and the scales gemm_fp8 takes, against the floor and against the
// two-step path a user has without it. Rows per (shape, mode, transpose):
//   weave     one quantize_fp8* call (Q, and Qt from the same read of X when transposing)
//   two_step  (transposing rows whose Qt is Q's bytes transposed: tensor, current, 128x128) the same
//             call without Qt, then transpose_fp8(Q -> Qt) (and, for 128x128, the scale array
//             transposed by a small kernel): what a user does without the fused copy
// Modes: tensor (the caller's scale, amax returned), current (amax first: two kernels), 1x128 (Q
// 1 x 128; Qt 1 x 128 along the tokens: a gradient dY), 1x128-128x128 (Q 1 x 128, Qt 128 x 128: an
// activation X; transposing only), 128x128 (Q and Qt 128 x 128: a weight).
// gbs = floor bytes / time (X read once, Q and Qt written once, the scale arrays; quantize_floor_bytes),
// of_peak = that rate / 4.8 TB/s (H200's HBM peak), so of_peak is the fraction of the floor reached
// (a copy reaches ~0.75-0.8); current scaling's second read of X counts as time, not bytes.
// Method as the other benches: inputs alternate between two sets of X (each larger than L2 at the
// default shapes) between timed calls, the outputs poisoned first (fp8 bytes 0xff, a NaN code the
// finite inputs never produce; scales NaN); time = median of 5 repeats of ~target-ms; then the last
// timed call's outputs are compared with a fresh reference of that call's input set and one more
// call on the other set into re-poisoned outputs is compared too (recheck.hpp): every byte of Q and
// Qt and every scale bit for bit, and amax / the current scale. The reference is plain device code
// that shares nothing with the kernel but the stated arithmetic: block maxima by one thread per
// row or column segment, then one thread per element computing scale_from_amax, 1 / scale
// (__frcp_rn), x * that (__fmul_rn) and __nv_cvt_float_to_fp8 (satfinite). worst = mismatching
// elements. Any incorrect row makes the exit status 1. Inputs derive from WEAVE_TEST_SEED (printed).
//
//   weave-bench quantize [--json FILE] [--shapes RxC,...] [--modes tensor,current,1x128,1x128-128x128,128x128]
//                        [--transpose 0,1] [--dtype e4m3|e5m2] [--impl weave,two_step] [--target-ms T]
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "bench.hpp"
#include "bitwise.cuh"
#include "check/device_buffer.hpp"
#include "check/seed.hpp"
#include "check/tile_check.hpp"
#include "check/gemm_baseline.cuh"
#include "gemm_fp8/quantize.hpp"
#include "gemm_fp8/transpose.hpp"
#include "recheck.hpp"

using namespace weave;
using namespace weave::bench;
using bf16 = __nv_bfloat16;
using gemm_fp8::Blocks;
using gemm_fp8::Fp8;

namespace {

constexpr double kPeakGBs = 4800;  // H200 HBM3e

struct Mode {
  const char* name;
  bool per_tensor, current;
  Blocks q, qt;         // block kinds (per tensor: None)
  bool transpose_only;  // the mode differs from another only in Qt
  bool byte_transpose;  // Qt's bytes are Q's transposed (a two-step path exists)
};
const Mode kModes[] = {
    {"tensor", true, false, Blocks::None, Blocks::None, false, true},
    {"current", true, true, Blocks::None, Blocks::None, false, true},
    {"1x128", false, false, Blocks::Row128, Blocks::Row128, false, false},
    {"1x128-128x128", false, false, Blocks::Row128, Blocks::Block128, true, false},
    {"128x128", false, false, Blocks::Block128, Blocks::Block128, false, true},
};

// x (rows x cols, uniform in [-1, 1) from gemm::ref::fill_uniform) times 2^[-4, 4] per row, so
// that the rows' scales differ (exact: a power of two).
__global__ void scale_rows_kernel(bf16* x, int rows, int cols, uint64_t seed) {
  const size_t n = size_t(rows) * cols;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const int e = int(gemm::ref::mix(seed + i / cols) % 9) - 4;
    x[i] = __float2bfloat16(ldexpf(__bfloat162float(x[i]), e));
  }
}

// Reference maxima of |x| over 128-long segments of lines: line i's elements are x[i * line + j *
// step], j < len; out[sb * lines + i] for segment sb, one thread each. Rows (line cols, step 1):
// ra[cb * rows + r] per (row, 128-column block); columns (line 1, step cols): ca[rb * cols + c] per
// (column, 128-row block). Per 128 x 128 block ba[rb * tc + cb] from ra; the tensor's from ba (one
// block).
__global__ void ref_segment_max(const bf16* x, int lines, int len, size_t line, size_t step, float* out) {
  const int segs = (len + 127) / 128;
  for (size_t t = blockIdx.x * size_t(blockDim.x) + threadIdx.x; t < size_t(lines) * segs;
       t += size_t(gridDim.x) * blockDim.x) {
    const int i = int(t % lines), sb = int(t / lines);
    float m = 0;
    for (int j = sb * 128; j < min(len, sb * 128 + 128); ++j) m = fmaxf(m, fabsf(__bfloat162float(x[i * line + j * step])));
    out[t] = m;
  }
}
__global__ void ref_block_max(const float* ra, int rows, int cols, float* ba) {
  const int tr = (rows + 127) / 128, tc = (cols + 127) / 128;
  for (int t = blockIdx.x * blockDim.x + threadIdx.x; t < tr * tc; t += gridDim.x * blockDim.x) {
    const int rb = t / tc, cb = t % tc;
    float m = 0;
    for (int r = rb * 128; r < min(rows, rb * 128 + 128); ++r) m = fmaxf(m, ra[size_t(cb) * rows + r]);
    ba[t] = m;
  }
}
__global__ void ref_tensor_max(const float* ba, int n, float* out) {
  __shared__ float s[1024];
  float m = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) m = fmaxf(m, ba[i]);
  s[threadIdx.x] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int i = 1; i < blockDim.x; ++i) m = fmaxf(m, s[i]);
    *out = m;
  }
}

struct RefIn {
  const bf16* x;
  int rows, cols;
  bool e5;
  int qk, tk;  // 0 tensor, 1 row (1 x 128 of the copy), 2 block; tk -1: no Qt
  const float *ra, *ca, *ba, *tensor_scale;
};
__device__ float ref_scale(const RefIn& in, int kind, bool transposed, int r, int c) {
  const Fp8 t = in.e5 ? Fp8::E5M2 : Fp8::E4M3;
  const int tc = (in.cols + 127) / 128;
  if (kind == 0) return *in.tensor_scale;
  if (kind == 2) return gemm_fp8::scale_from_amax(in.ba[size_t(r / 128) * tc + c / 128], t);
  return transposed ? gemm_fp8::scale_from_amax(in.ca[size_t(r / 128) * in.cols + c], t)
                    : gemm_fp8::scale_from_amax(in.ra[size_t(c / 128) * in.rows + r], t);
}
__device__ uint8_t ref_code(float x, float s, bool e5) {
  return __nv_cvt_float_to_fp8(__fmul_rn(x, __frcp_rn(s)), __NV_SATFINITE, e5 ? __NV_E5M2 : __NV_E4M3);
}
__global__ void ref_quantize(RefIn in, uint8_t* q, uint8_t* qt) {
  const size_t n = size_t(in.rows) * in.cols;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const int r = int(i / in.cols), c = int(i % in.cols);
    const float x = __bfloat162float(in.x[i]);
    q[i] = ref_code(x, ref_scale(in, in.qk, false, r, c), in.e5);
    if (in.tk >= 0) qt[size_t(c) * in.rows + r] = ref_code(x, ref_scale(in, in.tk, true, r, c), in.e5);
  }
}
// The scale arrays as the GEMM reads them (quantize.hpp): Row128 of Q ra's layout, of Qt ca's;
// Block128 of Q ba's, of Qt ba transposed.
__global__ void ref_scales(RefIn in, float* qs, float* qts) {
  const Fp8 t = in.e5 ? Fp8::E5M2 : Fp8::E4M3;
  const int tr = (in.rows + 127) / 128, tc = (in.cols + 127) / 128;
  const size_t nq = in.qk == 1 ? size_t(tc) * in.rows : size_t(tr) * tc;
  const size_t nt = in.tk == 1 ? size_t(tr) * in.cols : size_t(tr) * tc;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < nq + nt; i += size_t(gridDim.x) * blockDim.x) {
    if (i < nq) {
      if (in.qk == 1) qs[i] = gemm_fp8::scale_from_amax(in.ra[i], t);
      if (in.qk == 2) qs[i] = gemm_fp8::scale_from_amax(in.ba[i], t);
    } else {
      const size_t j = i - nq;
      if (in.tk == 1) qts[j] = gemm_fp8::scale_from_amax(in.ca[j], t);
      if (in.tk == 2) qts[j] = gemm_fp8::scale_from_amax(in.ba[(j % tr) * tc + j / tr], t);
    }
  }
}
// dst (tc x tr) = src^T (tr x tc): the two-step path's Qt scales for 128 x 128 blocks.
__global__ void transpose_floats(const float* src, float* dst, int tr, int tc) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < tr * tc; i += gridDim.x * blockDim.x)
    dst[size_t(i % tc) * tr + i / tc] = src[i];
}

struct Verdict {
  bool ok = true;
  double worst = 0;  // mismatching elements
  std::string what;
};

int run_quantize_bench(const Args& args) {
  std::vector<std::pair<int, int>> shapes;
  for (const std::string& s : args.names("shapes", "8192x4096,16384x5120,4096x14336,32768x7168,4000x4096")) {
    const size_t x = s.find('x');
    WEAVE_CHECK(x != std::string::npos, "weave-bench quantize: bad shape '", s, "' (want ROWSxCOLS)");
    shapes.push_back({std::stoi(s.substr(0, x)), std::stoi(s.substr(x + 1))});
  }
  std::vector<const Mode*> modes;
  for (const std::string& m : args.names("modes", "tensor,current,1x128,1x128-128x128,128x128")) {
    const Mode* found = nullptr;
    for (const Mode& k : kModes)
      if (m == k.name) found = &k;
    WEAVE_CHECK(found, "weave-bench quantize: unknown mode '", m,
                "' (tensor, current, 1x128, 1x128-128x128, 128x128)");
    modes.push_back(found);
  }
  const std::vector<long long> transposes = args.numbers("transpose", "0,1");
  const std::string dtype = args.get("dtype", "e4m3");
  WEAVE_CHECK(dtype == "e4m3" || dtype == "e5m2", "weave-bench quantize: --dtype e4m3 or e5m2, got ", dtype);
  const Fp8 type = dtype == "e5m2" ? Fp8::E5M2 : Fp8::E4M3;
  const bool e5 = type == Fp8::E5M2;
  const std::vector<std::string> impls = args.names("impl", "weave,two_step");
  const auto wants = [&](const char* i) { return std::find(impls.begin(), impls.end(), i) != impls.end(); };
  const double target_ms = std::stod(args.get("target-ms", "20"));
  const uint64_t seed = check::test_seed();
  JsonSink sink(args);
  cudaStream_t st = nullptr;
  int dev = 0;
  WEAVE_CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  WEAVE_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  std::printf("quantize bf16 -> %s, device %s; gbs = floor bytes (X read once, Q / Qt written once) / time, "
              "of_peak = gbs / %.0f GB/s\n",
              dtype.c_str(), prop.name, kPeakGBs);
  std::printf("%-12s %-14s %-2s %-9s %10s %8s %8s %8s %7s\n", "RxC", "mode", "T", "impl", "time_us", "GB/s",
              "of_peak", "vs_2step", "worst");
  std::vector<std::string> wrong;

  for (size_t si = 0; si < shapes.size(); ++si) {
    const auto [rows, cols] = shapes[si];
    const size_t n = size_t(rows) * cols;
    const int tr = (rows + 127) / 128, tc = (cols + 127) / 128;
    constexpr int kSets = 2;
    check::DeviceBuffer<bf16> xb0(n), xb1(n);
    bf16* const x[kSets] = {xb0.p, xb1.p};
    for (int s = 0; s < kSets; ++s) {
      gemm::ref::fill_uniform(x[s], n, check::derive(seed, si, 2 * s), 1.f, st);
      scale_rows_kernel<<<4096, 256, 0, st>>>(x[s], rows, cols, check::derive(seed, si, 2 * s + 1));
      WEAVE_CUDA_CHECK(cudaGetLastError());
    }
    const size_t max_scales = std::max(size_t(tc) * rows, size_t(tr) * cols);
    check::DeviceBuffer<uint8_t> q_b(n), qt_b(n), eq_b(n), eqt_b(n);
    check::DeviceBuffer<float> qs_b(max_scales), qts_b(max_scales), eqs_b(max_scales), eqts_b(max_scales),
        ra_b(size_t(tc) * rows), ca_b(size_t(tr) * cols), ba_b(size_t(tr) * tc), scalars_b(4);
    uint8_t *q = q_b.p, *qt = qt_b.p, *eq = eq_b.p, *eqt = eqt_b.p;
    float *qs = qs_b.p, *qts = qts_b.p, *eqs = eqs_b.p, *eqts = eqts_b.p, *ra = ra_b.p, *ca = ca_b.p, *ba = ba_b.p;
    float* scalars = scalars_b.p;  // [0] the delayed scale (input), [1] amax, [2] current scale, [3] ref amax
    // The delayed scale: this distribution's amax (<= 16) over the format's largest value.
    const float given = 16.f / gemm_fp8::fp8_max_finite(type);
    WEAVE_CUDA_CHECK(cudaMemcpy(scalars, &given, sizeof given, cudaMemcpyHostToDevice));

    for (const Mode* m : modes)
      for (long long tflag : transposes) {
        const bool trans = tflag != 0;
        if (m->transpose_only && !trans) continue;
        if (trans && rows % 16) {
          std::printf("%-12s unsupported: a transposed copy needs rows %% 16 == 0\n", (std::to_string(rows) + "x" + std::to_string(cols)).c_str());
          continue;
        }
        const Blocks qb = m->q, tb = trans ? m->qt : Blocks::None;
        const size_t nqs = gemm_fp8::quantize_scale_count(qb, rows, cols), nts = gemm_fp8::quantize_scale_count(tb, cols, rows);
        const double floor_bytes = gemm_fp8::quantize_floor_bytes(rows, cols, qb, tb, trans);
        // One quantiser call on set `s`, with Qt or without; the fused row is it with Qt (when
        // transposing), the two-step path it without Qt, then the transposes.
        const auto quantize = [&](int s, bool with_qt) {
          uint8_t* const t = with_qt ? qt : nullptr;
          if (m->current) gemm_fp8::quantize_fp8_current(x[s], rows, cols, type, q, t, scalars + 2, scalars + 1, st);
          else if (m->per_tensor) gemm_fp8::quantize_fp8(x[s], rows, cols, type, q, t, scalars, scalars + 1, st);
          else gemm_fp8::quantize_fp8_blocks(x[s], rows, cols, type, q, qb, qs, t, with_qt ? tb : Blocks::None, with_qt ? qts : nullptr, nullptr, st);
        };
        const auto fused = [&](int s) { quantize(s, trans); };
        const auto two_step = [&](int s) {
          quantize(s, false);
          gemm_fp8::transpose_fp8(q, qt, rows, cols, st);
          if (tb == Blocks::Block128) {
            transpose_floats<<<64, 256, 0, st>>>(qs, qts, tr, tc);
            WEAVE_CUDA_CHECK(cudaGetLastError());
          }
        };
        const auto poison = [&] {
          WEAVE_CUDA_CHECK(cudaMemsetAsync(q, 0xff, n, st));
          if (trans) WEAVE_CUDA_CHECK(cudaMemsetAsync(qt, 0xff, n, st));
          check::poison(qs, max_scales, st);
          check::poison(qts, max_scales, st);
          check::poison(scalars + 1, 2, st);
        };
        // The reference of set `s` and the comparison of the outputs with it.
        const auto check_set = [&](int s) {
          Verdict v;
          ref_segment_max<<<2048, 256, 0, st>>>(x[s], rows, cols, size_t(cols), 1, ra);
          ref_segment_max<<<2048, 256, 0, st>>>(x[s], cols, rows, 1, size_t(cols), ca);
          ref_block_max<<<64, 256, 0, st>>>(ra, rows, cols, ba);
          ref_tensor_max<<<1, 1024, 0, st>>>(ba, tr * tc, scalars + 3);
          WEAVE_CUDA_CHECK(cudaGetLastError());
          float sc[4];
          WEAVE_CUDA_CHECK(cudaMemcpyAsync(sc, scalars, sizeof sc, cudaMemcpyDeviceToHost, st));
          WEAVE_CUDA_CHECK(cudaStreamSynchronize(st));
          const float ref_amax = sc[3];
          const float tensor_scale = m->current ? gemm_fp8::scale_from_amax(ref_amax, type) : given;
          float* d_ts = scalars + 3;  // reuse: the tensor scale the reference applies
          WEAVE_CUDA_CHECK(cudaMemcpyAsync(d_ts, &tensor_scale, sizeof tensor_scale, cudaMemcpyHostToDevice, st));
          const int kq = m->per_tensor ? 0 : qb == Blocks::Row128 ? 1 : 2;
          const int kt = !trans ? -1 : m->per_tensor ? 0 : tb == Blocks::Row128 ? 1 : 2;
          const RefIn in{x[s], rows, cols, e5, kq, kt, ra, ca, ba, d_ts};
          ref_quantize<<<4096, 256, 0, st>>>(in, eq, eqt);
          ref_scales<<<1024, 256, 0, st>>>(in, eqs, eqts);
          WEAVE_CUDA_CHECK(cudaGetLastError());
          const auto note = [&](const char* what, unsigned long long bad) {
            if (!bad) return;
            v.ok = false, v.worst += double(bad);
            v.what += std::string(v.what.empty() ? "" : "; ") + what + ": " + std::to_string(bad) + " differ";
          };
          note("Q", mismatches_bits(q, eq, n, st));
          if (trans) note("Qt", mismatches_bits(qt, eqt, n, st));
          note("q_scales", mismatches_bits(reinterpret_cast<const uint32_t*>(qs), reinterpret_cast<const uint32_t*>(eqs), nqs, st));
          note("qt_scales", mismatches_bits(reinterpret_cast<const uint32_t*>(qts), reinterpret_cast<const uint32_t*>(eqts), nts, st));
          if (m->per_tensor) {
            float got[3];
            WEAVE_CUDA_CHECK(cudaMemcpy(got, scalars, sizeof got, cudaMemcpyDeviceToHost));
            note("amax", got[1] != ref_amax);
            if (m->current) note("scale", got[2] != tensor_scale);
          }
          return v;
        };
        const int iters = std::max(3, std::min(2000, static_cast<int>(target_ms * 1e-3 / (floor_bytes / 3.5e12))));
        double t_two = 0;
        for (const char* impl : {"two_step", "weave"}) {
          const bool is_two = impl[0] == 't';
          if (!wants(impl)) continue;
          if (is_two && (!trans || !m->byte_transpose)) continue;  // no two-step equivalent
          const auto call = [&](int s) { is_two ? two_step(s) : fused(s); };
          int it = 0, last = 0;
          poison();
          const double t = time_us(st, [&] {
            last = it++ % kSets;
            call(last);
          }, 3, iters, 5);
          const Verdict v = check_last_and_fresh(last, kSets, check_set, poison, [&](int s) { call(s); });
          const double gbs = floor_bytes / t * 1e-3;
          if (is_two) t_two = t;
          char vs[16] = "-";
          if (!is_two && t_two > 0) std::snprintf(vs, sizeof vs, "%.3f", t_two / t);
          const std::string shape = std::to_string(rows) + "x" + std::to_string(cols);
          std::printf("%-12s %-14s %-2d %-9s %10.1f %8.0f %8.3f %8s %7.0f%s\n", shape.c_str(), m->name, int(trans), impl,
                      t, gbs, gbs / kPeakGBs, vs, v.worst, v.ok ? "" : "  WRONG");
          if (!v.ok) {
            std::printf("  %s %s %s T%d: %s\n", impl, shape.c_str(), m->name, int(trans), v.what.c_str());
            wrong.push_back(std::string(impl) + " " + shape + " " + m->name + (trans ? " transpose" : ""));
          }
          JsonLine j;
          j.add("kernel", "quantize").add("impl", impl).add("rows", rows).add("cols", cols).add("mode", m->name);
          j.add("q_scales", m->per_tensor ? "tensor" : gemm_fp8::blocks_name(qb));
          j.add("qt_scales", !trans ? "none" : m->per_tensor ? "tensor" : gemm_fp8::blocks_name(tb));
          j.add("transpose", trans).add("dtype", dtype).add("time_us", t).add("gbs", gbs);
          j.add("floor_bytes", floor_bytes).add("floor_us_at_peak", floor_bytes / (kPeakGBs * 1e3)).add("of_peak", gbs / kPeakGBs);
          if (!is_two && t_two > 0) j.add("ratio_vs_two_step", t_two / t);
          j.add("correct", v.ok).add("worst", v.worst).add("seed", std::to_string(seed));
          sink.write(j);
        }
      }
    WEAVE_CUDA_CHECK(cudaStreamSynchronize(st));
  }
  return exit_status("quantize", wrong, seed);
}

}  // namespace

WEAVE_BENCH(quantize,
            "fp8 quantiser (bf16 X -> fp8 Q, its transpose Qt and gemm_fp8's scales in one pass) vs the two-step "
            "quantise + transpose_fp8 path and the floor (--shapes RxC,..., --modes "
            "tensor,current,1x128,1x128-128x128,128x128, --transpose 0,1, --dtype e4m3|e5m2, --impl weave,two_step, "
            "--target-ms T)",
            run_quantize_bench);
