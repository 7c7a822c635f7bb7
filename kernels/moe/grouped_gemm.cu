// Host side of the grouped GEMM: validation, tensor maps, the status words, launch. The kernel
// instantiations (B as N x K and as K x N; packed and fixed-stride rows) live here.
#include <algorithm>
#include <cstdint>
#include <mutex>

#include "gemm/gemm.hpp"
#include "gemm/split_k_workspace.hpp"
#include "moe/grouped_gemm.hpp"
#include "moe/grouped_gemm_kernel.cuh"
#include "weave/common/error.hpp"
#include "weave/common/extent.hpp"
#include "weave/lcsc.cuh"
#include "weave/tile/tma.hpp"

namespace weave::moe {

namespace {

// W as E stacked matrices: the 2-D map of one expert's matrix with E as the outermost dimension,
// so that a box never crosses into the next expert (rows or K past the end read as zero).
tile::TmaParams stacked(tile::TmaParams p, int E, uint64_t rows, uint64_t cols) {
  p.rank = 3;
  p.dims[2] = static_cast<uint64_t>(E);
  p.strides[1] = rows * cols * sizeof(__nv_bfloat16);
  p.box[2] = 1;
  return p;
}

}  // namespace

GroupedGlobals grouped_globals(gemm::BLayout layout, const __nv_bfloat16* X, const __nv_bfloat16* W,
                               __nv_bfloat16* Y, const int* counts, int E, int N, int K, int R_cap, int group_m,
                               int* status) {
  using tile::Swizzle;
  constexpr int BM = kGroupedBM, BN = kGroupedBN;
  GroupedGlobals g{};
  g.a = tile::encode(tile::tma_2d(X, R_cap, K, K, BM, 64, Swizzle::B128));
  if (layout == gemm::BLayout::NK)
    g.b = tile::encode(stacked(tile::tma_2d(W, N, K, K, BN, 64, Swizzle::B128), E, N, K));
  else
    g.b = tile::encode(stacked(tile::tma_2d(W, K, N, N, 64, 64, Swizzle::B128), E, K, N));
  if (Y) {
    g.c = tile::encode(tile::tma_2d(static_cast<const __nv_bfloat16*>(Y), R_cap, N, N, BM, 64, Swizzle::B128));
    g.c8 = tile::encode(tile::tma_2d(static_cast<const __nv_bfloat16*>(Y), R_cap, N, N, 8, 64, Swizzle::B128));
  }
  g.M = R_cap;
  g.N = N;
  g.K = K;
  g.tiles_m = gemm::ceil_div(R_cap, BM);  // unused by the grouped kernel's order
  g.tiles_n = gemm::ceil_div(N, BN);
  g.group_m = group_m;
  g.accumulate = 0;
  g.y = Y;
  g.counts = counts;
  g.status = status;
  g.experts = E;
  g.capacity = R_cap;
  return g;
}

namespace {

// The packed layout: GroupedSplitKernel with a workspace for its last round's split; the plain
// kernel when split_k = 1.
template <gemm::BLayout L>
lcsc::Plan run(const __nv_bfloat16* X, const __nv_bfloat16* W, __nv_bfloat16* Y, const int* counts, int E, int N,
               int K, int R_cap, int group_m, int split_k, int* status, const lcsc::Config& cfg, cudaStream_t stream) {
  using Kern = GroupedSplitKernel<L>;
  GroupedSplitGlobals g{};
  static_cast<GroupedGlobals&>(g) = grouped_globals(L, X, W, Y, counts, E, N, K, R_cap, group_m, status);
  if (split_k != 1) {
    g.split_k = split_k;
    const lcsc::Plan p = lcsc::plan_for<Kern>(Kern::num_work(g), cfg);  // what launch() will compute
    if (p.compute_blocks > 0) {
      const size_t areas = size_t(p.compute_blocks) * grouped_split_slots(split_k) * 2;
      g.workers = p.compute_blocks;
      const gemm::SplitKWorkspace ws = gemm::split_k_workspace(
          stream, areas * Kern::kSlotFloats * sizeof(float), size_t(p.compute_blocks) * 2 * sizeof(int));
      g.partials = ws.partials;
      g.counters = ws.counters;
      return lcsc::launch<Kern>(g, cfg, stream);
    }
  }
  return lcsc::launch<GroupedKernel<L>>(g, cfg, stream);
}

// The fixed-stride layout (row_stride > 0): its own instantiations.
template <gemm::BLayout L>
lcsc::Plan run_strided(const __nv_bfloat16* X, const __nv_bfloat16* W, __nv_bfloat16* Y, const int* counts, int E,
                       int N, int K, int R_cap, int row_stride, int group_m, int* status, const lcsc::Config& cfg,
                       cudaStream_t stream) {
  StridedGroupedGlobals g{};
  static_cast<GroupedGlobals&>(g) = grouped_globals(L, X, W, Y, counts, E, N, K, R_cap, group_m, status);
  g.row_stride = row_stride;
  return lcsc::launch<GroupedKernel<L, true>>(g, cfg, stream);
}

}  // namespace

void validate_grouped(const void* X, const void* W, const void* Y, const int* counts, int E, int N, int K,
                      int R_cap) {
  WEAVE_CHECK(E >= 1 && E <= kMaxGroupedExperts, "moe grouped_gemm: E = ", E, " experts, want 1..",
              kMaxGroupedExperts);
  WEAVE_CHECK(N >= 1 && K >= 1, "moe grouped_gemm: N and K must be positive, got N = ", N, ", K = ", K);
  WEAVE_CHECK(K % 8 == 0, "moe grouped_gemm: K = ", K, " is not a multiple of 8 (TMA needs 16-byte row pitches)");
  WEAVE_CHECK(N % 8 == 0, "moe grouped_gemm: N = ", N, " is not a multiple of 8 (TMA needs 16-byte row pitches)");
  WEAVE_CHECK(R_cap >= 1, "moe grouped_gemm: capacity R_cap = ", R_cap, " rows, want >= 1");
  WEAVE_CHECK(X && W && Y && counts, "moe grouped_gemm: null pointer (X, W, Y or counts)");
  WEAVE_CHECK(is_aligned(X), "moe grouped_gemm: X is not 16-byte aligned");
  WEAVE_CHECK(is_aligned(W), "moe grouped_gemm: W is not 16-byte aligned");
  WEAVE_CHECK(is_aligned(Y), "moe grouped_gemm: Y is not 16-byte aligned");
  WEAVE_CHECK(is_aligned(counts, 4), "moe grouped_gemm: counts is not 4-byte aligned");
  const long long work = max_work(R_cap, E, (N + kGroupedBN - 1) / kGroupedBN);
  WEAVE_CHECK(work < (1ll << 31), "moe grouped_gemm: ", work, " possible tiles (R_cap ", R_cap, ", N ", N,
              ") overflow the work index");
}

void validate_row_stride(int E, int R_cap, int row_stride) {
  WEAVE_CHECK(row_stride >= 0, "moe grouped_gemm: row_stride = ", row_stride, ", want >= 0 (0: packed rows)");
  if (row_stride == 0) return;
  WEAVE_CHECK(static_cast<long long>(E) * row_stride <= R_cap, "moe grouped_gemm: E x row_stride = ", E, " x ",
              row_stride, " = ", static_cast<long long>(E) * row_stride, " rows, more than R_cap = ", R_cap);
}

void validate_grouped_options(const GroupedGemmOptions& opt, int E, int R_cap, int sm_count) {
  validate_row_stride(E, R_cap, opt.row_stride);
  WEAVE_CHECK(opt.split_k >= 0 && opt.split_k <= kMaxGroupedSplits, "moe grouped_gemm: split_k = ", opt.split_k,
              ", want 0 (the model), 1 (never) or up to ", kMaxGroupedSplits, " ways");
  if (opt.status) check_extent("moe grouped_gemm", "status", opt.status, kStatusWords * sizeof(int));
  // Whatever the launch plan would refuse of the config (without an SM count, the plan itself).
  if (sm_count > 0) lcsc::compute_room(opt.lcsc, sm_count, 1, opt.lcsc.max_clusters);
}

lcsc::Config fused_grouped_config(const GroupedGemmOptions& opt, int min_sms) {
  lcsc::Config cfg = opt.lcsc;
  cfg.balance_waves = false;
  // The fused kernels have no communicator SM. The grid is sized from this config before the
  // call's own checks, on every rank alike; a caller's other num_comm_sms (which could make the
  // plan throw on one rank alone, its peers then waiting for it) is refused by those checks.
  cfg.num_comm_sms = 0;
  cfg.max_compute_blocks = cfg.max_compute_blocks > 0 ? std::min(cfg.max_compute_blocks, min_sms) : min_sms;
  return cfg;
}

std::string GroupedStatus::message() const {
  using ::weave::detail::concat;
  if (error == kGroupedOverflow)
    return concat("moe grouped_gemm: capacity ", capacity, " rows exceeded at expert ", expert, " (", count,
                  " rows; rows end at ", rows, "); the launch wrote nothing");
  if (error == kGroupedStrideOverflow)
    return concat("moe grouped_gemm: expert ", expert, " has ", count, " rows, more than its row_stride of ", capacity,
                  " (rows would end at ", rows, "); the launch wrote nothing");
  if (error == kGroupedNegativeCount)
    return concat("moe grouped_gemm: expert ", expert, " has a negative row count (", count,
                  "); the launch wrote nothing");
  if (error != 0) return concat("moe grouped_gemm: unknown status ", error);
  return "moe grouped_gemm: ok";
}

int* device_status() {
  static std::mutex mu;
  static int* words[64] = {};
  int dev = 0;
  WEAVE_CUDA_CHECK(cudaGetDevice(&dev));
  WEAVE_CHECK(dev >= 0 && dev < 64, "moe grouped_gemm: device ordinal ", dev, " out of range");
  std::lock_guard<std::mutex> lock(mu);
  if (!words[dev]) {
    int* p = nullptr;
    WEAVE_CUDA_CHECK(cudaMalloc(&p, kStatusWords * sizeof(int)));
    WEAVE_CUDA_CHECK(cudaMemset(p, 0, kStatusWords * sizeof(int)));
    WEAVE_CUDA_CHECK(cudaDeviceSynchronize());  // zeroed before any stream's launch reads it
    words[dev] = p;
  }
  return words[dev];
}

GroupedStatus take_status(cudaStream_t stream, int* status) {
  int* p = status ? status : device_status();
  WEAVE_CUDA_CHECK(cudaStreamSynchronize(stream));
  int w[kStatusWords] = {};
  WEAVE_CUDA_CHECK(cudaMemcpyAsync(w, p, sizeof w, cudaMemcpyDeviceToHost, stream));
  WEAVE_CUDA_CHECK(cudaMemsetAsync(p, 0, sizeof w, stream));
  WEAVE_CUDA_CHECK(cudaStreamSynchronize(stream));
  GroupedStatus s;
  s.error = w[kStatusError];
  s.expert = w[kStatusExpert];
  s.count = w[kStatusCount];
  s.rows = w[kStatusRows];
  s.capacity = w[kStatusCapacity];
  s.splits = w[kStatusSplits];
  if (!s.any()) s.expert = -1;
  return s;
}

void check_status(cudaStream_t stream, int* status) {
  const GroupedStatus s = take_status(stream, status);
  WEAVE_CHECK(!s.any(), s.message());
}

lcsc::Plan grouped_gemm(const __nv_bfloat16* X, const __nv_bfloat16* W, __nv_bfloat16* Y, const int* counts, int E,
                        int N, int K, int R_cap, cudaStream_t stream, const GroupedGemmOptions& opt) {
  validate_grouped(X, W, Y, counts, E, N, K, R_cap);
  validate_grouped_options(opt, E, R_cap, 0);
  const size_t b = sizeof(__nv_bfloat16);
  check_extent("moe grouped_gemm", "X", X, size_t(R_cap) * K * b);
  check_extent("moe grouped_gemm", "W", W, size_t(E) * N * K * b);
  check_extent("moe grouped_gemm", "Y", Y, size_t(R_cap) * N * b);
  check_extent("moe grouped_gemm", "counts", counts, size_t(E) * sizeof(int));
  int* status = opt.status ? opt.status : device_status();  // opt.status: checked above
  const int group_m = opt.group_m > 0 ? opt.group_m : gemm::default_group_m(gemm::Tile::M128N256, K);
  // The host sizes the grid for the most tiles the capacity allows; balancing waves for that
  // bound would shrink the grid for a count the device may never see, so every SM gets a block.
  lcsc::Config cfg = opt.lcsc;
  cfg.balance_waves = false;
  if (opt.row_stride > 0)
    return opt.layout == gemm::BLayout::NK
               ? run_strided<gemm::BLayout::NK>(X, W, Y, counts, E, N, K, R_cap, opt.row_stride, group_m, status, cfg,
                                                stream)
               : run_strided<gemm::BLayout::KN>(X, W, Y, counts, E, N, K, R_cap, opt.row_stride, group_m, status, cfg,
                                                stream);
  return opt.layout == gemm::BLayout::NK
             ? run<gemm::BLayout::NK>(X, W, Y, counts, E, N, K, R_cap, group_m, opt.split_k, status, cfg, stream)
             : run<gemm::BLayout::KN>(X, W, Y, counts, E, N, K, R_cap, group_m, opt.split_k, status, cfg, stream);
}

}  // namespace weave::moe
