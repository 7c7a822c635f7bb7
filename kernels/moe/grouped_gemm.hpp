// Host entry of the MoE grouped GEMM (kernels/moe/README.md, "Grouped GEMM"): one launch over all
// local experts, per-expert row counts read on the device, no host synchronisation.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <string>

#include "gemm/layout.hpp"
#include "weave/lcsc.cuh"

namespace weave::moe {

struct GroupedGemmOptions {
  // NK: W[e] is N x K (nn.Linear's out x in): Y = X W[e]^T. KN: W[e] is K x N: Y = X W[e].
  gemm::BLayout layout = gemm::BLayout::NK;
  int group_m = 0;        // tile rows per raster group inside an expert; 0 = gemm's default for K
  int* status = nullptr;  // 8 ints of device memory, zeroed before first use; null: the device's own
  lcsc::Config lcsc;      // num_comm_sms, max_compute_blocks (balance_waves is ignored: see .cu)
  // 0: the packed layout below. S > 0: the fixed-stride layout of the low-latency dispatch
  // (low_latency.hpp): expert e's rows are [e S, e S + counts[e]) whatever the other counts, each
  // count must lie in 0..S (a count above S is refused like an overflow, kGroupedStrideOverflow),
  // and E S <= R_cap. Rows between experts are neither read for a kept output nor written.
  int row_stride = 0;
  // The packed layout's last partial round of tiles (tiles % compute blocks) split along K, decided
  // on the device once the counts are read (moe::grouped_split): 0 (the default), where the dense
  // GEMM's split model gains >= 5 % (at most 4 ways, at most one split item per compute block); 1:
  // never (the kernel without the split's work items); S in 2..kMaxGroupedSplits: S ways whenever
  // there is a partial round. Needs the split-K workspace (128 KB per compute block and forced
  // split; the dense GEMM's: cached per stream, or owned by the graph a launch is captured into,
  // gemm/split_k_workspace.hpp). The fixed-stride layout never splits, nor do the fused
  // dispatch_gemm / gemm_combine; the layers (layer.hpp) run their GEMMs with 0 as 1, so that the
  // non-fused, fused and low-latency layers give the same bits. Why 0 is the default: the
  // measurements in kernels/moe/README.md.
  int split_k = 0;
};
inline constexpr int kMaxGroupedSplits = 16;

// Y[rows of e] = X[rows of e] * W[e]^T for e = 0 .. E-1, where expert e's rows are
// [off_e, off_e + counts[e]) with off_e = counts[0] + ... + counts[e-1] (the receiver layout of
// moe/layout.hpp; no padding between experts), or off_e = e * opt.row_stride when that is set
// (the low-latency dispatch's fixed-stride layout).
//   X: R_cap x K bf16 row-major; W: E x N x K (NK) or E x K x N (KN) bf16; Y: R_cap x N bf16;
//   counts: E int32 in device memory, read by the kernel only (the host never waits for them).
// Rows of Y past sum(counts) are not written. Counts summing past R_cap (or a negative count)
// make the launch write nothing and record the first such expert in the status words; nothing
// is reported on the host until take_status / check_status reads them (no synchronisation on the
// forward path). Throws weave::Error at once for bad arguments: E outside 1..1024, N or K not a
// positive multiple of 8, R_cap < 1, pointers not 16-byte aligned (counts: 4), or a buffer whose
// device allocation is shorter than the shape needs. Returns the grid it launched.
lcsc::Plan grouped_gemm(const __nv_bfloat16* X, const __nv_bfloat16* W, __nv_bfloat16* Y, const int* counts, int E,
                        int N, int K, int R_cap, cudaStream_t stream = nullptr, const GroupedGemmOptions& opt = {});

// What the first refused launch since the last read saw (error 0: none).
struct GroupedStatus {
  int error = 0;  // 1: capacity exceeded, 2: negative count (GroupedError in grouped_gemm_schedule.hpp)
  int expert = -1, count = 0;
  int rows = 0;  // rows of experts 0..expert, i.e. where the bad expert's rows end
  int capacity = 0;
  // Not an error: the last-round split of the last launch that could split (split_k != 1, workspace
  // had) since the last read; 1: it did not split; 0: no such launch.
  int splits = 0;
  bool any() const { return error != 0; }
  std::string message() const;
};

// Synchronises `stream`, reads the status words (`status`, or the current device's own when
// null) and clears them.
GroupedStatus take_status(cudaStream_t stream = nullptr, int* status = nullptr);
// take_status, throwing weave::Error with the message when a launch refused its counts, e.g.
// "moe grouped_gemm: capacity 4096 rows exceeded at expert 3 (900 rows; rows end at 4500); the
// launch wrote nothing".
void check_status(cudaStream_t stream = nullptr, int* status = nullptr);
// The current device's status words (allocated and zeroed on first use; never freed).
int* device_status();

// The launch config of the fused kernels built on the grouped GEMM's kernel (gemm_combine,
// dispatch_gemm): no wave balancing (the grid is sized for the bound, as grouped_gemm's), at most
// `min_sms` compute blocks (the smallest SM count of all ranks: every rank launches as many, which
// their signal counts assume), no communicator SM whatever opt asks (the calls refuse another).
lcsc::Config fused_grouped_config(const GroupedGemmOptions& opt, int min_sms);

// Pure checks (CPU-tested): everything grouped_gemm refuses before touching the device, bar the
// extents.
void validate_grouped(const void* X, const void* W, const void* Y, const int* counts, int E, int N, int K, int R_cap);
// The fixed-stride layout's own checks (row_stride > 0): E * row_stride <= R_cap; a negative
// row_stride is refused, 0 (the packed layout) accepted.
void validate_row_stride(int E, int R_cap, int row_stride);
// The options' own rules: row_stride (above), the status words' extent when given, and, with
// sm_count > 0, whatever the launch plan would refuse of opt.lcsc (lcsc::compute_room: a negative
// or too large num_comm_sms, a negative max_compute_blocks, max_clusters leaving no room). grouped_gemm checks them, and the layers check them before
// their dispatch, so that no rank throws alone between its dispatch and its combine.
void validate_grouped_options(const GroupedGemmOptions& opt, int E, int R_cap, int sm_count);

}  // namespace weave::moe
