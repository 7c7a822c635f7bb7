// Host side of the attention forward: validation, tensor maps, tile order, launch. The kernel
// instantiations (D 64 / 128, ping-pong on / off, persistent or not) live here so that users compile none of them.
#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "attention/attention.hpp"
#include "attention/attention_kernel.cuh"
#include "attention/host_shared.hpp"
#include "weave/common/capture.hpp"
#include "weave/common/error.hpp"
#include "weave/common/extent.hpp"
#include "weave/lcsc.cuh"
#include "weave/tile/tma.hpp"

namespace weave::attention {

CUtensorMap map_rows(const void* base, int D, int H, long long rows, int B, long long batch_stride, uint32_t box_d,
                     uint32_t box_h, uint32_t box_rows, bool swizzle) {
  tile::TmaParams p;
  p.type = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  p.elem_bytes = 2;
  p.rank = 4;
  p.dims[0] = static_cast<uint64_t>(D);
  p.dims[1] = static_cast<uint64_t>(H);
  p.dims[2] = static_cast<uint64_t>(rows);
  p.dims[3] = static_cast<uint64_t>(B);
  p.strides[0] = static_cast<uint64_t>(D) * 2;
  p.strides[1] = static_cast<uint64_t>(H) * D * 2;
  p.strides[2] = static_cast<uint64_t>(batch_stride) * 2;
  p.box[0] = box_d;
  p.box[1] = box_h;
  p.box[2] = box_rows;
  p.box[3] = 1;
  p.swizzle = swizzle ? tile::Swizzle::B128 : tile::Swizzle::None;
  p.base = base;
  WEAVE_CHECK(p.strides[2] < (1ull << 40), "attention: tensor too large for TMA (batch stride ", p.strides[2],
              " bytes)");
  WEAVE_CHECK(reinterpret_cast<uintptr_t>(base) % 16 == 0, "attention: TMA base must be 16-byte aligned");
  return tile::encode(p);
}

namespace detail {

namespace {
constexpr int kDevices = 64;
std::mutex scratch_mu;  // guards the per-device scratch below
void check_device(int dev) {
  WEAVE_CHECK(dev >= 0 && dev < kDevices, "attention: device ordinal ", dev, " out of range");
}
}  // namespace

// Tile counters of the persistent kernels, zeroed on the caller's stream before each launch.
// A counter must never serve two launches that can run at once, whatever the number of streams:
// one zeroing another's live counter makes tiles be skipped. Launches from one host thread on
// one stream run one after the other (the zeroing of the next waits for the previous kernel), so
// each (stream, thread) pair gets a counter of its own, kept for the process's life; the stream
// is named by its id (cudaStreamGetId), which a new stream never reuses, unlike a destroyed
// stream's handle, whose kernels may still run. The thread is part of the key because two threads
// enqueueing on one stream could interleave as zero, zero, kernel, kernel. A launch captured
// into a CUDA graph gets a counter no other launch ever uses: the graph may be replayed on any
// stream next to anything (replays of one executable graph are serialized by CUDA). Counters
// are 128-byte lines in chunks allocated as needed; the lookup is a map lookup under a mutex.
int* tile_counter(int dev, cudaStream_t stream) {
  constexpr int kLineInts = 32, kChunkLines = 1024;
  struct Pool {
    std::vector<int*> chunks;
    int used = kChunkLines;  // lines taken from the last chunk
    std::map<std::pair<unsigned long long, std::thread::id>, int*> bound;
    int* fresh() {
      if (used == kChunkLines) {
        int* c = nullptr;
        WEAVE_CUDA_CHECK(cudaMalloc(&c, size_t(kChunkLines) * kLineInts * sizeof(int)));
        chunks.push_back(c);
        used = 0;
      }
      return chunks.back() + size_t(used++) * kLineInts;
    }
  };
  static Pool pools[kDevices];
  check_device(dev);
  const bool capture = capturing(stream);
  unsigned long long id = 0;
  if (!capture) WEAVE_CUDA_CHECK(cudaStreamGetId(stream, &id));
  int* c = nullptr;
  {
    std::lock_guard<std::mutex> lock(scratch_mu);
    Pool& p = pools[dev];
    if (capture) {
      c = p.fresh();
    } else {
      int*& b = p.bound[{id, std::this_thread::get_id()}];
      if (!b) b = p.fresh();
      c = b;
    }
  }
  WEAVE_CUDA_CHECK(cudaMemsetAsync(c, 0, sizeof(int), stream));
  return c;
}

// The gathered kernel's front words (GatheredGlobals::front), zeroed once, and the tag of each
// launch. Launches never clear them: a word from another launch carries another tag and is
// ignored, and two launches in flight at once (different streams) at worst start tiles at each
// other's blocks, which costs L2 sharing, never correctness (any start visits the same blocks).
unsigned long long* front_words(int dev, unsigned* tag) {
  static unsigned long long* bufs[kDevices] = {};
  static unsigned tags[kDevices] = {};
  check_device(dev);
  std::lock_guard<std::mutex> lock(scratch_mu);
  if (bufs[dev] == nullptr) {
    WEAVE_CUDA_CHECK(cudaMalloc(&bufs[dev], kFrontWords * sizeof(unsigned long long)));
    WEAVE_CUDA_CHECK(cudaMemset(bufs[dev], 0, kFrontWords * sizeof(unsigned long long)));
  }
  if (++tags[dev] == 0) ++tags[dev];
  *tag = tags[dev];
  return bufs[dev];
}

// Heads whose K and V (together) fit in half of L2 run side by side; query blocks vary
// slowest inside a section, so the CTAs in flight share a few heads' K/V.
int heads_per_section(int l2, long long S, int D, int group) {
  const double kv_bytes_per_head = 2.0 * S * D * 2 / group;
  int G = static_cast<int>(0.5 * l2 / kv_bytes_per_head);
  return G < 1 ? 1 : (G > 16 ? 16 : G);
}

}  // namespace detail

namespace {

// A (B, S, H, D) bf16 tensor as the 4-D TMA map {D, H, S, B} read in boxes of `rows`
// sequence positions x 64 head-dim elements of one (batch, head).
CUtensorMap map_bshd(const void* base, const Shape& s, int H, uint32_t rows) {
  return map_rows(base, s.D, H, s.S, s.B, static_cast<long long>(s.S) * H * s.D, 64, 1, rows, true);
}

template <class K>
void launch(const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v, __nv_bfloat16* o, float* lse,
            const Shape& s, const Options& opt, cudaStream_t stream) {
  int dev = 0;
  WEAVE_CUDA_CHECK(cudaGetDevice(&dev));
  const lcsc::DeviceInfo info = lcsc::device_info(dev);
  WEAVE_CHECK(K::kSmemBytes <= info.smem_optin, "attention: kernel needs ", K::kSmemBytes,
              " bytes of shared memory per block but the device allows ", info.smem_optin);
  const int l2 = info.l2_bytes;

  AttnGlobals g{};
  g.q = map_bshd(q, s, s.Hq, K::BM);
  g.k = map_bshd(k, s, s.Hkv, K::BN);
  g.v = map_bshd(v, s, s.Hkv, K::BN);
  g.o = map_bshd(o, s, s.Hq, 64);
  g.lse = lse;
  g.B = s.B;
  g.S = s.S;
  g.Hq = s.Hq;
  g.Hkv = s.Hkv;
  g.group = s.Hq / s.Hkv;
  g.m_blocks = (s.S + K::BM - 1) / K::BM;
  g.heads_per_section = opt.heads_per_section > 0 ? opt.heads_per_section
                                                  : detail::heads_per_section(l2, s.S, s.D, g.group);
  g.scale = opt.softmax_scale > 0.f ? opt.softmax_scale : 1.f / std::sqrt(static_cast<float>(s.D));
  g.scale_log2 = g.scale * 1.4426950408889634f;
  g.causal = opt.causal ? 1 : 0;

  const long long tiles = static_cast<long long>(g.m_blocks) * s.B * s.Hq;
  WEAVE_CHECK(tiles < (1ll << 31), "attention: too many tiles (", tiles, ")");
  g.total_tiles = static_cast<int>(tiles);
  long long grid = tiles;
  if constexpr (K::kPersistent) {
    grid = std::min<long long>(tiles, info.sm_count);
    g.counter = detail::tile_counter(dev, stream);
  }
  static bool attr_set[64] = {};
  if (dev >= 64 || !attr_set[dev]) {
    WEAVE_CUDA_CHECK(cudaFuncSetAttribute(attention_kernel<K>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(K::kSmemBytes)));
    if (dev < 64) attr_set[dev] = true;
  }
  attention_kernel<K><<<static_cast<unsigned>(grid), K::kThreads, K::kSmemBytes, stream>>>(g);
  WEAVE_CUDA_CHECK(cudaGetLastError());
}

template <int D>
void dispatch(const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v, __nv_bfloat16* o, float* lse,
              const Shape& s, const Options& opt, cudaStream_t stream) {
  constexpr int stages = 2;
  const Options::Schedule sched = opt.schedule == Options::Schedule::Auto ? auto_schedule(s, opt.causal) : opt.schedule;
  if (sched == Options::Schedule::Persistent) {
    if (opt.pingpong)
      launch<AttnKernel<D, kBlockN, stages, true, true>>(q, k, v, o, lse, s, opt, stream);
    else
      launch<AttnKernel<D, kBlockN, stages, false, true>>(q, k, v, o, lse, s, opt, stream);
  } else {
    if (opt.pingpong)
      launch<AttnKernel<D, kBlockN, stages, true, false>>(q, k, v, o, lse, s, opt, stream);
    else
      launch<AttnKernel<D, kBlockN, stages, false, false>>(q, k, v, o, lse, s, opt, stream);
  }
}

}  // namespace

void validate(const Shape& s, const void* q, const void* k, const void* v, const void* o, const void* lse) {
  WEAVE_CHECK(s.B >= 1 && s.S >= 1 && s.Hq >= 1 && s.Hkv >= 1, "attention: B, S, Hq, Hkv must be positive, got B=",
              s.B, " S=", s.S, " Hq=", s.Hq, " Hkv=", s.Hkv);
  WEAVE_CHECK(s.D == 64 || s.D == 128, "attention: head dim D must be 64 or 128, got ", s.D);
  WEAVE_CHECK(s.Hq % s.Hkv == 0, "attention: Hq = ", s.Hq, " is not a multiple of Hkv = ", s.Hkv,
              " (grouped-query attention)");
  WEAVE_CHECK(q && k && v && o, "attention: null Q, K, V or O");
  auto aligned = [](const void* p, uintptr_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; };
  WEAVE_CHECK(aligned(q, 16) && aligned(k, 16) && aligned(v, 16) && aligned(o, 16),
              "attention: Q, K, V and O must be 16-byte aligned (TMA)");
  WEAVE_CHECK(aligned(lse, 4), "attention: LSE must be 4-byte aligned");
}

int num_kv_blocks(int S, int m_block, bool causal) {
  return visible_blocks<kBlockN>(S, (m_block + 1) * kBlockM, causal);
}

// Measured on H200 (README.md): persistent CTAs win where tiles are short and equal (D = 128,
// non-causal, S = 4096: +12%) and lose 2-9% elsewhere, where one CTA per tile keeps up better.
Options::Schedule auto_schedule(const Shape& s, bool causal) {
  (void)causal;  // since the persistent consumers' tile id is warp-uniform, causal gains too (README)
  return s.S <= 8192 && s.D == 128 ? Options::Schedule::Persistent : Options::Schedule::PerTile;
}

double flops(const Shape& s, bool causal) {
  const double f = 4.0 * s.B * double(s.S) * s.S * s.Hq * s.D;
  return causal ? f / 2 : f;
}

void forward(const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v, __nv_bfloat16* o, float* lse,
             const Shape& s, const Options& opt, cudaStream_t stream) {
  validate(s, q, k, v, o, lse);
  const size_t rows = size_t(s.B) * s.S, e = sizeof(__nv_bfloat16);
  check_extent("attention", "q", q, rows * s.Hq * s.D * e);
  check_extent("attention", "k", k, rows * s.Hkv * s.D * e);
  check_extent("attention", "v", v, rows * s.Hkv * s.D * e);
  check_extent("attention", "o", o, rows * s.Hq * s.D * e);
  if (lse) check_extent("attention", "lse", lse, rows * s.Hq * sizeof(float));
  WEAVE_CHECK(opt.softmax_scale >= 0.f && std::isfinite(opt.softmax_scale),
              "attention: softmax_scale must be finite and >= 0 (0 = 1/sqrt(D)), got ", opt.softmax_scale);
  WEAVE_CHECK(opt.heads_per_section >= 0, "attention: heads_per_section must be >= 0 (0 = from L2), got ",
              opt.heads_per_section);
  if (s.D == 64) dispatch<64>(q, k, v, o, lse, s, opt, stream);
  else dispatch<128>(q, k, v, o, lse, s, opt, stream);
}

}  // namespace weave::attention
