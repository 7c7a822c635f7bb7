#include <algorithm>
#include <cmath>
#include <sstream>
#include <utility>

#include "check/attention_ref.hpp"
#include "check/gemm_ref.hpp"
#include "check/seed.hpp"
#include "check/cublas_check.hpp"
#include "weave/common/error.hpp"


namespace weave::check {

namespace {

constexpr int kThreads = 256;

__device__ inline uint64_t splitmix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

__global__ void fill_normal_kernel(__nv_bfloat16* p, long long B, long long L, long long width, long long row0,
                                   long long rows, long long S, long long pos0, uint64_t seed, float stddev) {
  const unsigned long long n = static_cast<unsigned long long>(B * rows * width);
  for (unsigned long long e = blockIdx.x * 1ull * blockDim.x + threadIdx.x; e < n; e += 1ull * gridDim.x * blockDim.x) {
    const long long c = static_cast<long long>(e % width), t = static_cast<long long>(e / width);
    const long long i = t % rows, b = t / rows;
    const uint64_t g = static_cast<uint64_t>((b * S + pos0 + i) * width + c);
    const uint64_t h = splitmix(seed ^ splitmix(g));
    // Box-Muller on two 24-bit uniforms; u1 in (0, 1] keeps the log finite.
    const float u1 = (static_cast<float>(h >> 40) + 1.f) * (1.f / 16777216.f);
    const float u2 = static_cast<float>((h >> 8) & 0xFFFFFF) * (1.f / 16777216.f);
    const float z = sqrtf(-2.f * logf(u1)) * cospif(2.f * u2);
    p[(b * L + row0 + i) * width + c] = __float2bfloat16(z * stddev);
  }
}


// V and V.^2 of one (batch, kv head) as dense fp32 (Skv, D) matrices.
__global__ void gather_v_kernel(float* vf, float* v2f, const __nv_bfloat16* v, long long Skv, int Hkv, int D, int b,
                                int hkv) {
  const size_t n = size_t(Skv) * D;
  for (size_t e = blockIdx.x * size_t(blockDim.x) + threadIdx.x; e < n; e += size_t(gridDim.x) * blockDim.x) {
    const size_t j = e / D, d = e % D;
    const float x = __bfloat162float(v[((size_t(b) * Skv + j) * Hkv + hkv) * D + d]);
    vf[e] = x;
    v2f[e] = x * x;  // exact: a bf16 square has at most 16 significant bits
  }
}

__global__ void square_kernel(float* p, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = p[i] * p[i];
}

template <class T, class Op>
__device__ T block_reduce(T x, Op op, T* sh) {
  for (int o = 16; o > 0; o >>= 1) x = op(x, __shfl_xor_sync(0xffffffff, x, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // sh may still be read by the previous reduction
  if (lane == 0) sh[warp] = x;
  __syncthreads();
  T r = sh[0];
  for (int w = 1; w < int(blockDim.x >> 5); ++w) r = op(r, sh[w]);
  return r;
}

// One CTA per query row of a chunk: the row's scores (ncols keys, row-major, ld ncols) become
// its probabilities in place, masked keys 0; LSE = scale * max + log(sum), sums in float64.
__global__ void softmax_kernel(float* scores, long long ncols, long long pos_first, bool causal, double scale,
                               float* lse, long long lse_stride) {
  __shared__ double shd[32];
  __shared__ float shf[32];
  const long long i = blockIdx.x;
  float* row = scores + i * ncols;
  const long long pos = pos_first + i;
  const long long vis = causal ? min(ncols, pos + 1) : ncols;
  float mx = -INFINITY;
  for (long long j = threadIdx.x; j < vis; j += blockDim.x) mx = fmaxf(mx, row[j]);
  mx = block_reduce(
      mx, [](float a, float b) { return fmaxf(a, b); }, shf);
  double sum = 0;
  for (long long j = threadIdx.x; j < vis; j += blockDim.x) sum += exp((double(row[j]) - mx) * scale);
  sum = block_reduce(
      sum, [](double a, double b) { return a + b; }, shd);
  for (long long j = threadIdx.x; j < ncols; j += blockDim.x)
    row[j] = j < vis ? float(exp((double(row[j]) - mx) * scale) / sum) : 0.f;
  if (threadIdx.x == 0) lse[i * lse_stride] = float(double(mx) * scale + log(sum));
}

unsigned grid_for(size_t n) {
  return unsigned(std::min<size_t>(4096, std::max<size_t>(1, (n + kThreads - 1) / kThreads)));
}

}  // namespace

// ---------------------------------------------------------------------------------------------

AttnRefRows::AttnRefRows(AttnRefRows&& o) noexcept { *this = std::move(o); }
AttnRefRows& AttnRefRows::operator=(AttnRefRows&& o) noexcept {
  if (this != &o) {
    cudaFree(this->o), cudaFree(s), cudaFree(lse);
    ranges = std::move(o.ranges);
    n = o.n;
    this->o = std::exchange(o.o, nullptr);
    s = std::exchange(o.s, nullptr);
    lse = std::exchange(o.lse, nullptr);
  }
  return *this;
}
AttnRefRows::~AttnRefRows() { cudaFree(o), cudaFree(s), cudaFree(lse); }

AttentionRef::AttentionRef(size_t score_bytes, long long max_rows) : score_bytes_(score_bytes), max_rows_(max_rows) {
  WEAVE_CHECK(max_rows >= 128 && score_bytes >= (size_t(1) << 20), "AttentionRef: budget too small");
  WEAVE_CUBLAS_CHECK(cublasCreate(&h_));
}
AttentionRef::~AttentionRef() {
  cudaDeviceSynchronize();
  cudaFree(scores_), cudaFree(vf_), cudaFree(v2f_);
  cublasDestroy(h_);
}

void AttentionRef::ensure(float*& p, size_t& have, size_t n, cudaStream_t st) {
  if (have >= n) return;
  WEAVE_CUDA_CHECK(cudaStreamSynchronize(st));
  cudaFree(p);
  p = nullptr;
  WEAVE_CUDA_CHECK(cudaMalloc(&p, n * sizeof(float)));
  have = n;
}

AttnRefRows AttentionRef::compute(const AttnProblem& p, const __nv_bfloat16* q, const __nv_bfloat16* k,
                                  const __nv_bfloat16* v, const std::vector<RowRange>& ranges, cudaStream_t st) {
  WEAVE_CHECK(p.B > 0 && p.Hq > 0 && p.Hkv > 0 && p.Hq % p.Hkv == 0 && p.D > 0 && p.Skv > 0 && p.Lq > 0,
              "AttentionRef: bad problem B=", p.B, " Hq=", p.Hq, " Hkv=", p.Hkv, " D=", p.D, " Skv=", p.Skv);
  WEAVE_CHECK(p.Skv < (1ll << 31) && p.Hq * p.D < (1 << 30), "AttentionRef: sizes past cuBLAS's int");
  AttnRefRows out;
  out.ranges = ranges;
  for (const RowRange& r : ranges) {
    WEAVE_CHECK(r.rows >= 0 && r.q_row0 >= 0 && r.q_row0 + r.rows <= p.Lq && r.pos0 >= 0 && r.pos0 + r.rows <= p.Skv,
                "AttentionRef: range q_row0=", r.q_row0, " pos0=", r.pos0, " rows=", r.rows, " outside Lq=", p.Lq,
                " Skv=", p.Skv);
    out.n += r.rows;
  }
  if (out.n == 0) return out;
  const size_t no = size_t(p.B) * out.n * p.Hq * p.D, nl = size_t(p.B) * p.Hq * out.n;
  WEAVE_CUDA_CHECK(cudaMalloc(&out.o, no * sizeof(float)));
  WEAVE_CUDA_CHECK(cudaMalloc(&out.s, no * sizeof(float)));
  WEAVE_CUDA_CHECK(cudaMalloc(&out.lse, nl * sizeof(float)));
  const long long rc_max = std::max<long long>(1, std::min<long long>(out.n, score_bytes_ / (sizeof(float) * p.Skv)));
  ensure(scores_, scores_n_, size_t(rc_max) * p.Skv, st);
  ensure(vf_, vf_n_, size_t(p.Skv) * p.D, st);
  ensure(v2f_, v2f_n_, size_t(p.Skv) * p.D, st);
  WEAVE_CUBLAS_CHECK(cublasSetStream(h_, st));
  const double scale = p.scale > 0 ? double(p.scale) : 1.0 / std::sqrt(double(p.D));
  const int grp = p.Hq / p.Hkv, D = p.D;
  const float one = 1.f, zero = 0.f;
  for (int b = 0; b < p.B; ++b)
    for (int hkv = 0; hkv < p.Hkv; ++hkv) {
      gather_v_kernel<<<grid_for(size_t(p.Skv) * D), kThreads, 0, st>>>(vf_, v2f_, v, p.Skv, p.Hkv, D, b, hkv);
      WEAVE_CUDA_CHECK(cudaGetLastError());
      const __nv_bfloat16* kb = k + (size_t(b) * p.Skv * p.Hkv + hkv) * D;
      long long roff = 0;  // this range's first row among the reference's rows
      for (const RowRange& r : ranges) {
        for (long long i0 = 0; i0 < r.rows; i0 += rc_max) {
          const long long rc = std::min(rc_max, r.rows - i0);
          // Keys past the chunk's last position are masked for every row of it: not computed.
          const long long ncols = p.causal ? std::min(p.Skv, r.pos0 + i0 + rc) : p.Skv;
          for (int g = 0; g < grp; ++g) {
            const int h = hkv * grp + g;
            const __nv_bfloat16* qb = q + ((size_t(b) * p.Lq + r.q_row0 + i0) * p.Hq + h) * D;
            // Row-major scores (rc x ncols) = column-major (ncols x rc) = K^T-view(op T) x Q-view.
            // Pedantic: fp32 accumulation by the book, not by whatever tensor-core path cuBLAS picks
            // (falls back to CUBLAS_COMPUTE_32F where a cuBLAS version lacks it for bf16 inputs).
            auto qk = [&](cublasComputeType_t ct) {
              return cublasGemmEx(h_, CUBLAS_OP_T, CUBLAS_OP_N, int(ncols), int(rc), D, &one, kb, CUDA_R_16BF,
                                  p.Hkv * D, qb, CUDA_R_16BF, p.Hq * D, &zero, scores_, CUDA_R_32F, int(ncols), ct,
                                  CUBLAS_GEMM_DEFAULT);
            };
            cublasStatus_t qs = qk_pedantic_ ? qk(CUBLAS_COMPUTE_32F_PEDANTIC) : CUBLAS_STATUS_NOT_SUPPORTED;
            if (qs == CUBLAS_STATUS_NOT_SUPPORTED) {
              qk_pedantic_ = false;
              qs = qk(CUBLAS_COMPUTE_32F);
            }
            WEAVE_CHECK(qs == CUBLAS_STATUS_SUCCESS, "AttentionRef: scores GEMM failed: cublas status ", int(qs));
            float* lse = out.lse + (size_t(b) * p.Hq + h) * out.n + roff + i0;
            softmax_kernel<<<unsigned(rc), kThreads, 0, st>>>(scores_, ncols, r.pos0 + i0, p.causal, scale, lse, 1);
            WEAVE_CUDA_CHECK(cudaGetLastError());
            // O rows (column-major D x rc, ld Hq * D) = V^T (D x ncols) x P^T (ncols x rc), all fp32.
            const size_t oo = ((size_t(b) * out.n + roff + i0) * p.Hq + h) * D;
            WEAVE_CUBLAS_CHECK(cublasGemmEx(h_, CUBLAS_OP_N, CUBLAS_OP_N, D, int(rc), int(ncols), &one, vf_,
                                               CUDA_R_32F, D, scores_, CUDA_R_32F, int(ncols), &zero, out.o + oo,
                                               CUDA_R_32F, p.Hq * D, CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT));
            square_kernel<<<grid_for(size_t(rc) * ncols), kThreads, 0, st>>>(scores_, size_t(rc) * ncols);
            WEAVE_CUDA_CHECK(cudaGetLastError());
            WEAVE_CUBLAS_CHECK(cublasGemmEx(h_, CUBLAS_OP_N, CUBLAS_OP_N, D, int(rc), int(ncols), &one, v2f_,
                                               CUDA_R_32F, D, scores_, CUDA_R_32F, int(ncols), &zero, out.s + oo,
                                               CUDA_R_32F, p.Hq * D, CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT));
          }
        }
        roff += r.rows;
      }
    }
  sqrt_inplace(out.s, no, st);
  WEAVE_CUDA_CHECK(cudaStreamSynchronize(st));
  return out;
}

void merge_into(Report& a, const Report& b) {
  if (b.tiles == 0) return;
  if (a.tiles == 0) {
    a = b;
    return;
  }
  a.rows += b.rows;
  a.cols = std::max(a.cols, b.cols);
  a.tiles += b.tiles;
  a.bad_tiles += b.bad_tiles;
  a.nonfinite += b.nonfinite;
  if (b.worst_row >= 0 && (a.worst_row < 0 || b.worst > a.worst)) {
    a.worst = b.worst, a.worst_row = b.worst_row, a.worst_col = b.worst_col;
    a.got = b.got, a.want = b.want, a.bound = b.bound;
  }
  a.ok = a.ok && b.ok;
}

void merge_into(AttnReport& a, const AttnReport& b) {
  const bool take_o = b.o.tiles > 0 && (a.o.tiles == 0 || (b.o.worst_row >= 0 && b.o.worst > a.o.worst));
  const bool take_l = b.lse.tiles > 0 && (a.lse.tiles == 0 || (b.lse.worst_row >= 0 && b.lse.worst > a.lse.worst));
  merge_into(a.o, b.o);
  merge_into(a.lse, b.lse);
  if (take_o) a.where_o = b.where_o;
  if (take_l) a.where_lse = b.where_lse;
  a.has_lse = a.has_lse || b.has_lse;
}

namespace {
std::string part(const char* name, const Report& r, const std::string& where, const char* tile) {
  std::ostringstream o;
  o.precision(4);
  o << name << (r.ok ? " ok" : " WRONG") << ": worst |x-r|/bound " << r.worst;
  if (r.worst_row >= 0) o << " at " << where << ": got " << r.got << ", want " << r.want << ", bound " << r.bound;
  o << "; " << r.bad_tiles << " of " << r.tiles << " tiles (" << tile << ") over, " << r.nonfinite << " non-finite";
  return o.str();
}
}  // namespace

std::string AttnReport::str() const {
  std::string s = part("O", o, where_o, "128 rows x D");
  if (has_lse) s += " | " + part("LSE", lse, where_lse, "128 rows");
  return s;
}

AttnReport AttentionRef::compare(const AttnProblem& p, const AttnRefRows& ref, const __nv_bfloat16* o, const float* lse,
                                 Bound ob, Bound lb, cudaStream_t st) {
  AttnReport rep;
  rep.has_lse = lse != nullptr;
  const long long HD = static_cast<long long>(p.Hq) * p.D;
  long long off = 0;
  for (const RowRange& r : ref.ranges) {
    WEAVE_CHECK(r.o_row0 >= 0 && r.o_row0 + r.rows <= p.Lo, "AttentionRef::compare: rows ", r.o_row0, "+", r.rows,
                " outside Lo=", p.Lo);
    for (int b = 0; b < p.B && r.rows > 0; ++b) {
      AttnReport one;
      one.has_lse = rep.has_lse;
      const size_t xo = (size_t(b) * p.Lo + r.o_row0) * HD, ro = (size_t(b) * ref.n + off) * HD;
      one.o = check::compare(Mat<__nv_bfloat16>{o + xo, HD}, Mat<float>{ref.o + ro, HD}, Mat<float>{ref.s + ro, HD},
                             r.rows, HD, ob, 128, p.D, st);
      if (one.o.worst_row >= 0) {
        const long long i = one.o.worst_row;
        std::ostringstream w;
        w << "b=" << b << " h=" << one.o.worst_col / p.D << " row " << r.o_row0 + i << " (position " << r.pos0 + i
          << ") d=" << one.o.worst_col % p.D;
        one.where_o = w.str();
        one.o.worst_row = r.o_row0 + i;
      }
      if (lse) {
        one.lse = check::compare(Mat<float>{lse + size_t(b) * p.Hq * p.Lo + r.o_row0, p.Lo},
                                 Mat<float>{ref.lse + size_t(b) * p.Hq * ref.n + off, ref.n}, Mat<float>{}, p.Hq,
                                 r.rows, lb, 1, 128, st);
        if (one.lse.worst_row >= 0) {
          const long long h = one.lse.worst_row, i = one.lse.worst_col;
          std::ostringstream w;
          w << "b=" << b << " h=" << h << " row " << r.o_row0 + i << " (position " << r.pos0 + i << ")";
          one.where_lse = w.str();
          one.lse.worst_row = r.o_row0 + i, one.lse.worst_col = h;
        }
      }
      merge_into(rep, one);
    }
    off += r.rows;
  }
  return rep;
}

AttnReport AttentionRef::check(const AttnProblem& p, const __nv_bfloat16* q, const __nv_bfloat16* k,
                               const __nv_bfloat16* v, const std::vector<RowRange>& ranges, const __nv_bfloat16* o,
                               const float* lse, Bound ob, Bound lb, cudaStream_t st) {
  // Pieces of at most max_rows_ rows (whole 128-row tiles of their range), grouped up to
  // max_rows_ rows per reference call.
  const long long cap = std::max<long long>(128, max_rows_ / 128 * 128);
  AttnReport rep;
  rep.has_lse = lse != nullptr;
  std::vector<RowRange> group;
  long long in_group = 0;
  auto flush = [&] {
    if (group.empty()) return;
    const AttnRefRows ref = compute(p, q, k, v, group, st);
    merge_into(rep, compare(p, ref, o, lse, ob, lb, st));
    group.clear();
    in_group = 0;
  };
  for (const RowRange& r : ranges)
    for (long long i0 = 0; i0 < r.rows; i0 += cap) {
      const long long n = std::min(cap, r.rows - i0);
      if (in_group + n > cap) flush();
      group.push_back({r.q_row0 + i0, r.o_row0 + i0, r.pos0 + i0, n});
      in_group += n;
    }
  flush();
  return rep;
}

std::vector<RowRange> all_rows(long long q_row0, long long o_row0, long long pos0, long long rows) {
  return {RowRange{q_row0, o_row0, pos0, rows}};
}

std::vector<RowRange> sample_rows(long long q_row0, long long o_row0, long long pos0, long long rows, uint64_t seed,
                                  int piece, int extra) {
  if (rows <= static_cast<long long>(piece) * (2 + extra)) return all_rows(q_row0, o_row0, pos0, rows);
  std::vector<std::pair<long long, long long>> iv = {{0, piece}, {rows - piece, rows}};
  for (int e = 0; e < extra; ++e) {
    const long long span = rows - 2 * piece;  // starts in [piece, rows - piece)
    const long long a = piece + static_cast<long long>(derive(seed, 0xA77E, e) % static_cast<uint64_t>(span));
    iv.push_back({a, std::min(rows, a + piece)});
  }
  std::sort(iv.begin(), iv.end());
  std::vector<RowRange> out;
  long long a = iv[0].first, z = iv[0].second;
  auto emit = [&] { out.push_back({q_row0 + a, o_row0 + a, pos0 + a, z - a}); };
  for (size_t t = 1; t < iv.size(); ++t) {
    if (iv[t].first <= z) {
      z = std::max(z, iv[t].second);
    } else {
      emit();
      a = iv[t].first, z = iv[t].second;
    }
  }
  emit();
  return out;
}

void fill_normal(__nv_bfloat16* p, int B, long long L, long long width, long long row0, long long rows, long long S,
                 long long pos0, uint64_t seed, float stddev, cudaStream_t st) {
  WEAVE_CHECK(row0 >= 0 && row0 + rows <= L && pos0 >= 0 && pos0 + rows <= S, "fill_normal: rows ", row0, "+", rows,
              " of L=", L, " at position ", pos0, " of S=", S);
  const size_t n = size_t(B) * rows * width;
  if (n == 0) return;
  fill_normal_kernel<<<grid_for(n), kThreads, 0, st>>>(p, B, L, width, row0, rows, S, pos0, seed, stddev);
  WEAVE_CUDA_CHECK(cudaGetLastError());
}

double qk_std(int D, float scale, double logit_std) {
  const double sc = scale > 0 ? double(scale) : 1.0 / std::sqrt(double(D));
  return std::sqrt(logit_std / (sc * std::sqrt(double(D))));
}

}  // namespace weave::check
