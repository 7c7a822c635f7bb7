// The float32 attention reference: scores by cuBLAS (bf16 in, fp32 pedantic accumulation and
// out), softmax and LSE in float64 on the GPU, P*V in fp32 with pedantic cuBLAS (no TF32), and
// each output element's scale s = sqrt(sum_j p_ij^2 v_jd^2) for tile_check's bound. It shares
// nothing with weave's attention kernels (no tiles, no online softmax, no bf16 P), so a bug in
// their shared GEMM, mask, softmax or pack pieces cannot hide in both.
//
// Layouts follow weave::attention: Q (B, Lq, Hq, D), K and V (B, Skv, Hkv, D) bf16, O (B, L, Hq,
// D), LSE (B, Hq, L), natural log with the scale included; GQA maps query head h to kv head
// h / (Hq / Hkv). Query rows may be any ranges of the key sequence (a rank's shard, sampled
// rows): every range carries the global position of its first row, and causal attention lets a
// query at position p see keys j <= p (weave's convention).
//
// Memory: the scores of one head over at most `score_bytes` (rows x visible keys) live at a time,
// plus V and V^2 of one kv head in fp32; the reference outputs are the caller's (compute) or
// bounded pieces of at most `max_rows_per_piece` rows (check).
#pragma once
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "check/tile_check.hpp"

namespace weave::check {

struct AttnProblem {
  int B = 1, Hq = 1, Hkv = 1, D = 128;
  long long Skv = 1;  // keys: the whole sequence, global order
  long long Lq = 1;   // rows per batch of the q tensor handed to the reference
  long long Lo = 1;   // rows per batch of the output being checked (o (B, Lo, Hq, D), lse (B, Hq, Lo))
  bool causal = false;
  float scale = 0.f;  // 0: 1/sqrt(D)
};

// `rows` query rows: rows [q_row0, q_row0 + rows) of q, [o_row0, o_row0 + rows) of the checked
// output, at global positions [pos0, pos0 + rows).
struct RowRange {
  long long q_row0 = 0, o_row0 = 0, pos0 = 0, rows = 0;
};

// Reference rows of some ranges, concatenated in range order: o and s (B, n, Hq, D), lse (B, Hq,
// n), n = sum of the ranges' rows. Device memory owned by the object.
struct AttnRefRows {
  std::vector<RowRange> ranges;
  long long n = 0;
  float *o = nullptr, *s = nullptr, *lse = nullptr;
  AttnRefRows() = default;
  AttnRefRows(AttnRefRows&&) noexcept;
  AttnRefRows& operator=(AttnRefRows&&) noexcept;
  AttnRefRows(const AttnRefRows&) = delete;
  AttnRefRows& operator=(const AttnRefRows&) = delete;
  ~AttnRefRows();
};

// O and LSE reports of one check, merged over ranges and batches (tiles: 128 rows x D of one
// head for O, 128 rows of one head for LSE). worst_row / worst_col of the merged reports are
// rows of the checked output (Lo indexing) and columns h * D + d (O) or h (LSE); `where_*`
// spells the worst element out with its batch and global position.
struct AttnReport {
  Report o, lse;
  bool has_lse = false;  // the kernel returns LSE and it was compared
  std::string where_o, where_lse;
  bool ok() const { return o.ok && (!has_lse || lse.ok); }
  std::string str() const;  // one line; no LSE part when has_lse is false
};

// Bounds for weave's attention output against this reference:
// - O: 2^-8 |r| for the final bf16 rounding of O, plus 3 * 2^-8 s for the bf16 rounding of P
//   before P*V (each p_ij rounds by at most 2^-9 relative; the sum of those errors over j is of
//   the order of 2^-9 s and rarely near 2^-8 s; 3 leaves room for the tails over 1e9 elements).
//   Detection: a missing or wrong contribution of a set K of keys changes O_id by about
//   sqrt(sum_{j in K} p_ij^2 v_jd^2) = s * sqrt(share of K in s^2), so it fails as soon as K
//   holds more than (4 * 2^-8)^2 ~ 2.4e-4 of the squared weight of some element of a tile.
// - LSE: 1e-3 absolute (fp32 max and sum over at most 128K keys err by ~1e-6).
inline Bound attention_o_bound() { return Bound{kBf16Round, 3 * kBf16Round, 0}; }
inline Bound attention_lse_bound() { return Bound{0, 0, 1e-3}; }

class AttentionRef {
 public:
  explicit AttentionRef(size_t score_bytes = size_t(1) << 30, long long max_rows_per_piece = 8192);
  ~AttentionRef();
  AttentionRef(const AttentionRef&) = delete;
  AttentionRef& operator=(const AttentionRef&) = delete;

  // The reference of `ranges` (q: (B, p.Lq, Hq, D); k, v: (B, p.Skv, Hkv, D)). Synchronises
  // `st` before returning.
  AttnRefRows compute(const AttnProblem& p, const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v,
                      const std::vector<RowRange>& ranges, cudaStream_t st = nullptr);

  // The checked output o (B, p.Lo, Hq, D) bf16 and lse (B, Hq, p.Lo) fp32 (null: the kernel has
  // no LSE; not compared) on the reference's ranges.
  static AttnReport compare(const AttnProblem& p, const AttnRefRows& ref, const __nv_bfloat16* o, const float* lse,
                            Bound ob = attention_o_bound(), Bound lb = attention_lse_bound(),
                            cudaStream_t st = nullptr);

  // compute + compare, piece by piece (at most max_rows_per_piece rows per piece, split on
  // multiples of 128 rows from each range's start), so the reference's memory stays bounded
  // for any number of rows.
  AttnReport check(const AttnProblem& p, const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v,
                   const std::vector<RowRange>& ranges, const __nv_bfloat16* o, const float* lse,
                   Bound ob = attention_o_bound(), Bound lb = attention_lse_bound(), cudaStream_t st = nullptr);

 private:
  void ensure(float*& p, size_t& have, size_t n, cudaStream_t st);
  cublasHandle_t h_{};
  size_t score_bytes_;
  long long max_rows_;
  float *scores_ = nullptr, *vf_ = nullptr, *v2f_ = nullptr;
  size_t scores_n_ = 0, vf_n_ = 0, v2f_n_ = 0;
  bool qk_pedantic_ = true;
};

// Merges b into a (counts added, the worse element kept).
void merge_into(Report& a, const Report& b);
void merge_into(AttnReport& a, const AttnReport& b);

// Ranges covering every row of a chunk of `rows` rows (q and o rows from q_row0 / o_row0, global
// positions from pos0), or a sample of it: its first and last `piece` rows and `extra` more
// pieces of `piece` rows at seeded positions (all rows when the chunk is not longer than the
// sample).
std::vector<RowRange> all_rows(long long q_row0, long long o_row0, long long pos0, long long rows);
std::vector<RowRange> sample_rows(long long q_row0, long long o_row0, long long pos0, long long rows, uint64_t seed,
                                  int piece = 64, int extra = 2);

// Normal (Gaussian) bf16 values that depend only on (seed, global element): rows [row0, row0 +
// rows) of a (B, L, width) tensor get element (b, pos0 + i, c) of a (B, S, width) tensor drawn
// with N(0, stddev^2). Any rank can regenerate any rank's shard or the whole sequence.
void fill_normal(__nv_bfloat16* p, int B, long long L, long long width, long long row0, long long rows, long long S,
                 long long pos0, uint64_t seed, float stddev, cudaStream_t st = nullptr);
// The whole (B, S, width) tensor.
inline void fill_normal(__nv_bfloat16* p, int B, long long S, long long width, uint64_t seed, float stddev,
                        cudaStream_t st = nullptr) {
  fill_normal(p, B, S, width, 0, S, S, 0, seed, stddev, st);
}
// The standard deviation of Q and K that gives scores scale * q.k a standard deviation of
// `logit_std` (q.k of two N(0, x^2) vectors of length D has standard deviation x^2 sqrt(D)).
// A logit spread of ~3 makes the softmax peaked, as in trained models: a few keys carry most of
// the weight, so each key block's share of an output is large enough to be seen.
double qk_std(int D, float scale, double logit_std = 3.0);

}  // namespace weave::check
