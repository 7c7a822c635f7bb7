// weave-bench net_ring: the inter-node ring attention (kernels/net_ring_attention: NetRingAttention)
// between nodes of one rank each, against the same transfers and attention without overlap, and
// against weave's attention + NCCL restricted to its network transport (issue 22).
//
//   weave-run -n N --nodes N [--share-gpus] -- weave-bench net_ring [--json FILE]
//       [--seqs 4096,8192,16384] [--heads 32] [--kv-heads 8] [--dim 128] [--batch 1] [--causal 0,1]
//       [--impls weave,weave-unfused,nccl] [--chunk 1M] [--send-blocks 2] [--recv-blocks 4]
//       [--iters 20] [--warmup 5] [--provider tcp] [--domain lo] [--notify ordered|unordered]
//       [--max-bounce 4G] [--check auto|all|sample]
//
// Problems, per S of --seqs and causal flag: the whole sequence of S rows, bf16 Q (B, S, Hq, D), K
// and V (B, S, Hkv, D), sharded over the N nodes as sp::RingAttention shards it: zigzag when causal
// (2N chunks, rank r holds chunks r and 2N-1-r), contiguous otherwise (as weave-bench sp). Each rank
// computes O (B, L, Hq, D) and the LSE (B, Hq, L) of its L query rows against the whole sequence.
// Implementations (rows "impl", kernel "net_ring_attention"):
//   weave          NetRingAttention::forward: K and V travel over the network path inside the
//                  attention's persistent kernel (--send-blocks, --recv-blocks; no chunk option: its
//                  unit is the kernel's 512-row slice of a chunk, docs/bench-net-ring.md says why).
//   weave-unfused  the same network path without overlap: one NetCollectives::all_gather in place
//                  of every rank's K and V (rank q's slot of the buffer: its K, then its V), then weave's
//                  single-GPU attention. That kernel takes one sequence length for Q and K/V and no
//                  query offset, so it cannot attend a shard's rows to the whole sequence in one
//                  call; the exact equivalent is the unfused ring's: one call per (own query chunk,
//                  key chunk) pair of equal lengths (non-causal: every pair; causal: the key chunks
//                  before the query chunk in full and its own chunk with the causal mask, which is
//                  then the global mask; later chunks skipped), then an fp32 LSE merge of the pairs
//                  into O and LSE (lse_merge.cuh). Zigzag with B > 1: the chunks are not batch-strided
//                  tensors, so the own Q chunks and the gathered K/V chunks are first packed
//                  chunk-major (cudaMemcpy2DAsync, inside the timed call). Same chunk and blocks as
//                  the fused row. Needs equal chunks (S a multiple of the chunk count) and the
//                  collectives' 16-byte shards equal to the ranks' slots; otherwise skipped.
//   nccl           one ncclAllGather of the same K/V slots in place, NCCL restricted to its network
//                  transport (net_bench.hpp: NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NET=Socket,
//                  NCCL_SOCKET_IFNAME=lo on simulated nodes; each set where unset), + the same
//                  attention and merge as weave-unfused. Only with a GPU of its own per rank.
// The unfused and nccl rows also carry transfer_us (their gather alone) and compute_us (the
// pair calls and merges alone, on gathered K/V), timed the same way: where compute_us ~ transfer_us
// is where overlap can pay most.
//
// Timing as weave-bench net_tp (net_bench.hpp): --warmup calls, then --iters calls each alone, the
// ranks released together by a barrier, CUDA events around the call; the slowest rank's time per
// iteration, the median over iterations. TFLOP/s: the attention's useful FLOPs over all ranks,
// 4 * B * S^2 * Hq * D, halved for causal (weave-bench sp's convention), divided by time_us
// (`tflops`; `tflops_per_gpu` = tflops / nodes). weave rows carry ratio_vs_unfused and
// ratio_vs_nccl (the other row's time over weave's).
//
// Checks (every row): the last timed call runs on a second input set (every earlier call on the
// first), into outputs (and the gathered K/V) poisoned just before it. Every rank regenerates the
// whole sequence from the job seed and checks its O and LSE against the float32 attention
// reference over the whole sequence (check/attention_ref.hpp: cuBLAS scores, float64 softmax, no
// code shared with weave's kernels), per element with attention_o_bound() (per tile of 128 rows x D
// of one head) and attention_lse_bound(); a dropped or stale peer chunk breaks the bound
// (docs/testing.md). Every row of the rank where B * Hq * L * S <= 2^36 (--check auto), else sampled
// rows of every chunk (the first and last 64 and two more pieces of 64, all batches and heads). A
// row is correct only if it is on every rank; any incorrect row makes the command exit 1.
//
// The network path is made once, its bounce buffers sized for the largest problem; a problem that
// would take more than --max-bounce of pinned memory per rank is skipped with a message. Fewer than
// 2 ranks, no rendezvous address or a single node: a message and exit 0. More than one rank per
// node: exit 2. With --share-gpus the times are not meaningful (the ranks time-slice one GPU).
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "attention/attention.hpp"
#include "bench.hpp"
#include "check/attention_ref.hpp"
#include "check/device_buffer.hpp"
#include "check/seed.hpp"
#include "lse_merge.cuh"
#include "net_bench.hpp"
#include "net_collectives/layout.hpp"
#include "net_collectives/net_collectives.hpp"
#include "net_ring_attention/layout.hpp"
#include "net_ring_attention/net_ring_attention.hpp"
#include "net_start.hpp"
#include "ring_attention/ring_attention.hpp"
#include "weave/net/net_path.hpp"
#include "weave/runtime/device_copy.hpp"
#include "weave/runtime/launch.hpp"

namespace {

namespace net = weave::net;
namespace sp = weave::sp;
namespace check = weave::check;
namespace netb = weave::bench::netb;
using bf16 = __nv_bfloat16;
using weave::Error;
using weave::detail::concat;
using Dev = check::DeviceBuffer<bf16>;
using DevF = check::DeviceBuffer<float>;
using netb::kImplNccl;
using netb::kImplUnfused;
using netb::kImplWeave;
using netb::Room;

constexpr const char* kWho = "weave-bench net_ring";
// Reference work above which --check auto samples rows, in (query row, key, head) triples: 2^36 is
// about a second of the reference (weave-bench sp's limit).
constexpr double kAllRowsLimit = 68719476736.0;

// ---- options ------------------------------------------------------------------------------

struct Config : netb::NetOptions {
  std::vector<long long> seqs;
  std::vector<int> causal;
  int B = 1, Hq = 32, Hkv = 8, D = 128;
  std::string check = "auto";
};

Config parse(const weave::bench::Args& a) {
  static const std::set<std::string> known{"json",        "seqs",  "heads",  "kv-heads", "dim",      "batch",
                                           "causal",      "impls", "chunk",  "send-blocks", "recv-blocks", "iters",
                                           "warmup",      "provider", "domain", "notify", "max-bounce", "check"};
  for (const auto& [k, v] : a.kv)
    if (!known.count(k)) throw Error(concat(kWho, ": unknown option --", k, " (see weave-bench net_ring --help)"));
  Config c;
  for (const std::string& s : a.names("seqs", "4096,8192,16384"))
    c.seqs.push_back(weave::bench::parse_count(kWho, "seqs", s, 1, 1LL << 30));
  if (c.seqs.empty()) throw Error(concat(kWho, ": --seqs names no length"));
  for (const std::string& s : a.names("causal", "0,1"))
    c.causal.push_back(static_cast<int>(weave::bench::parse_count(kWho, "causal", s, 0, 1)));
  if (c.causal.empty()) throw Error(concat(kWho, ": --causal names no mode"));
  if (a.has("heads")) c.Hq = static_cast<int>(weave::bench::parse_count(kWho, "heads", a.get("heads"), 1, 1024));
  if (a.has("kv-heads")) c.Hkv = static_cast<int>(weave::bench::parse_count(kWho, "kv-heads", a.get("kv-heads"), 1, 1024));
  if (!a.has("kv-heads") && c.Hq % c.Hkv) c.Hkv = c.Hq;  // --heads alone: not grouped when 8 kv heads do not divide it
  if (c.Hq % c.Hkv) throw Error(concat(kWho, ": --heads ", c.Hq, " is not a multiple of --kv-heads ", c.Hkv));
  if (a.has("dim")) c.D = static_cast<int>(weave::bench::parse_count(kWho, "dim", a.get("dim"), 64, 128));
  if (c.D != 64 && c.D != 128) throw Error(concat(kWho, ": --dim ", c.D, " is not 64 or 128"));
  if (a.has("batch")) c.B = static_cast<int>(weave::bench::parse_count(kWho, "batch", a.get("batch"), 1, 1024));
  c.check = a.get("check", "auto");
  if (c.check != "auto" && c.check != "all" && c.check != "sample")
    throw Error(concat(kWho, ": --check: '", c.check, "' is not auto, all or sample"));
  c.send_blocks = net::NetRingOptions{}.send_blocks;
  c.recv_blocks = net::NetRingOptions{}.recv_blocks;
  netb::parse_net_options(kWho, a, c);
  return c;
}

// ---- problems and the room they take on the network path ------------------------------------

struct Shape {
  int B;
  long long S;
  int Hq, Hkv, D;
  bool causal;
  sp::Sharding sharding() const { return causal ? sp::Sharding::Zigzag : sp::Sharding::Contiguous; }
  int zz() const { return causal ? 1 : 0; }
  long long row_bytes() const { return static_cast<long long>(Hkv) * D * 2; }
  std::string str() const { return concat("B", B, " S", S, " H", Hq, "/", Hkv, " D", D, causal ? " causal" : ""); }
};

// Chunks of the sequence (sp's sharding) and this layout's facts shared by the rows of a problem.
int chunks_per_rank(const Shape& s) { return sp::chunks_per_rank(s.sharding()); }
int n_chunks(const Shape& s, int nodes) { return chunks_per_rank(s) * nodes; }
// Every rank's block of K (or V) has the same rows only when every chunk does.
bool equal_chunks(const Shape& s, int nodes) { return s.S % n_chunks(s, nodes) == 0; }
long long local_rows(const Shape& s, int nodes, int q) { return sp::local_rows(s.S, nodes, s.sharding(), q); }
long long max_local_rows(const Shape& s, int nodes) {
  long long m = 0;
  for (int q = 0; q < nodes; ++q) m = std::max(m, local_rows(s, nodes, q));
  return m;
}
// Elements of one rank's K (or V), (B, L, Hkv, D). The unfused rows gather every rank's K and V
// in one call: rank q's slot of the gathered buffer holds its K then its V (2 blocks).
long long block_elems(const Shape& s, int nodes) { return s.B * max_local_rows(s, nodes) * s.Hkv * s.D; }

// The kernel's and the collectives' own plans (the functions their host entries check with).
Room room_of(const std::string& impl, const Shape& s, const Config& c, int nodes) {
  if (impl == kImplWeave) {
    namespace rn = net::ring_net;
    const rn::RingPlan R = rn::make_plan(nodes, s.zz(), s.B, s.S, s.row_bytes());
    return {rn::send_needed(R), rn::recv_needed(R), rn::flags_needed(R)};
  }
  if (impl == kImplUnfused) {
    const long long bytes = 2LL * nodes * 2 * block_elems(s, nodes);
    const net::coll::Layout L = net::coll::make_layout(net::Coll::all_gather, net::Topo{nodes, 1}, bytes, c.chunk);
    return {net::coll::send_needed(L), net::coll::recv_needed(L), static_cast<long long>(net::coll::flags_needed(L))};
  }
  return {};  // nccl: its own buffers
}

// Why the unfused rows (gathers in place, then the pair calls) cannot run this problem ("" if they
// can); the nccl rows need the equal chunks only.
std::string chunks_unequal(const Shape& s, int nodes) {
  if (equal_chunks(s, nodes)) return "";
  return concat("S = ", s.S, " is not a multiple of the ", n_chunks(s, nodes),
                " chunks (the single-GPU kernel takes one length for a query chunk and a key chunk)");
}
std::string unfused_skip(const Shape& s, int nodes) {
  if (std::string why = chunks_unequal(s, nodes); !why.empty()) return why;
  const long long slot = 2 * block_elems(s, nodes);
  for (int q = 0; q < nodes; ++q) {
    long long first = 0, n = 0;
    net::NetCollectives::shard(nodes, nodes * slot, net::NetDtype::bf16, q, &first, &n);
    if (first != q * slot || n != slot)
      return concat("NetCollectives gives rank ", q, " elements [", first, ", +", n, ") of the gathered K/V, not its slot [",
                    q * slot, ", +", slot, ") (shards are near-equal in 16-byte units)");
  }
  return "";
}

// ---- the job ------------------------------------------------------------------------------

// The run's fields (path, stream, rank, seed, nccl, ...: net_bench.hpp) with this suite's options
// and reference.
struct Job : netb::JobBase {
  const Config& c;
  check::AttentionRef& ref;
  Job(netb::Run& r, weave::bench::JsonSink& s, const Config& cfg, check::AttentionRef& a)
      : JobBase(r, s), c(cfg), ref(a) {}
};

// The whole sequence's Q, K and V of one input set (identical on every rank, from the seed), and
// this rank's rows of them (chunks back to back, as the ring takes them).
struct InputSet {
  Dev fq, fk, fv;  // (B, S, H, D)
  Dev q, k, v;     // (B, L, H, D)
  InputSet(const Shape& s, long long L, const std::vector<sp::ChunkRange>& mine, uint64_t seed, cudaStream_t st)
      : fq(size_t(s.B) * s.S * s.Hq * s.D), fk(size_t(s.B) * s.S * s.Hkv * s.D), fv(fk.n),
        q(size_t(s.B) * L * s.Hq * s.D), k(size_t(s.B) * L * s.Hkv * s.D), v(k.n) {
    const float sd = static_cast<float>(check::qk_std(s.D, 0.f));  // a logit spread of ~3: a peaked softmax
    check::fill_normal(fq.p, s.B, s.S, static_cast<long long>(s.Hq) * s.D, check::derive(seed, 1), sd, st);
    check::fill_normal(fk.p, s.B, s.S, static_cast<long long>(s.Hkv) * s.D, check::derive(seed, 2), sd, st);
    check::fill_normal(fv.p, s.B, s.S, static_cast<long long>(s.Hkv) * s.D, check::derive(seed, 3), 1.f, st);
    take_rows(q.p, fq.p, s, L, s.Hq, mine, st);
    take_rows(k.p, fk.p, s, L, s.Hkv, mine, st);
    take_rows(v.p, fv.p, s, L, s.Hkv, mine, st);
  }
  static void take_rows(bf16* dst, const bf16* full, const Shape& s, long long L, int H,
                        const std::vector<sp::ChunkRange>& mine, cudaStream_t st) {
    const size_t row = size_t(H) * s.D * sizeof(bf16);
    long long off = 0;
    for (const sp::ChunkRange& ch : mine) {  // every batch's rows of one chunk: one 2-D copy
      weave::runtime::device_copy_2d(reinterpret_cast<char*>(dst) + off * row, L * row,
                                     reinterpret_cast<const char*>(full) + ch.begin * row, s.S * row, ch.rows * row,
                                     s.B, st);
      off += ch.rows;
    }
  }
};

struct Verdict {
  bool ok = false;
  double o_worst = NAN, lse_worst = NAN;  // worst |x - r| / bound over ranks (> 1: wrong)
  long long rows = 0;                     // query rows checked, over ranks
  bool all_rows = true;
};

// One problem's inputs, outputs and the unfused rows' buffers.
struct Problem {
  Job& j;
  Shape sh;
  int W, cpr;
  std::vector<sp::ChunkRange> mine;
  long long L = 0, Lc = 0;  // local rows; chunk rows (equal chunks only)
  std::unique_ptr<InputSet> set[2];
  Dev o;
  DevF lse;
  // Unfused rows: the gathered K and V (every rank's slot, its K then its V, in rank order), the
  // pair outputs, and (zigzag with B > 1) the chunk-major copies of the own Q chunks and of every
  // gathered chunk.
  std::unique_ptr<Dev> gkv, part_o, pq, pk, pv;
  std::unique_ptr<DevF> part_lse;
  bool pack = false;

  Problem(Job& job, const Shape& s, uint64_t seed, bool gathered)
      : j(job), sh(s), W(job.nodes), cpr(chunks_per_rank(s)), L(local_rows(s, W, j.rank)),
        o(size_t(s.B) * L * s.Hq * s.D), lse(size_t(s.B) * s.Hq * L) {
    for (int i = 0; i < cpr; ++i) mine.push_back(sp::chunk_range(s.S, W, s.sharding(), j.rank, i));
    for (int t = 0; t < 2; ++t) set[t] = std::make_unique<InputSet>(s, L, mine, check::derive(seed, t), j.st);
    if (gathered) {
      Lc = L / cpr;
      const size_t blk = size_t(block_elems(s, W)), chunk_q = size_t(s.B) * Lc * s.Hq * s.D;
      gkv = std::make_unique<Dev>(W * 2 * blk);
      part_o = std::make_unique<Dev>(size_t(n_chunks(s, W)) * chunk_q);  // at most every key chunk per query chunk
      part_lse = std::make_unique<DevF>(size_t(n_chunks(s, W)) * s.B * s.Hq * Lc);
      pack = cpr > 1 && s.B > 1;
      if (pack) {
        pq = std::make_unique<Dev>(cpr * chunk_q);
        pk = std::make_unique<Dev>(W * blk);
        pv = std::make_unique<Dev>(W * blk);
      }
    }
  }
  Problem(const Problem&) = delete;
  Problem& operator=(const Problem&) = delete;

  // Rank q's K (t = 0) or V (t = 1) in the gathered buffer.
  bf16* gathered(int t, int q) const { return gkv->p + size_t(2 * q + t) * block_elems(sh, W); }
  // This rank's K and V in its slot of the gathered buffer (the in-place gather's input).
  void inputs(int t) {
    if (!gkv) return;
    const size_t bytes = size_t(block_elems(sh, W)) * sizeof(bf16);
    WEAVE_CUDA_CHECK(cudaMemcpyAsync(gathered(0, j.rank), set[t]->k.p, bytes, cudaMemcpyDeviceToDevice, j.st));
    WEAVE_CUDA_CHECK(cudaMemcpyAsync(gathered(1, j.rank), set[t]->v.p, bytes, cudaMemcpyDeviceToDevice, j.st));
  }
  // NaN in every output, and in the gathered K/V (inputs() then puts the own block back), so that
  // a peer block that does not arrive, or arrives from an earlier call, is seen.
  void poison() {
    check::poison(o.p, o.n, j.st);
    check::poison(lse.p, lse.n, j.st);
    if (gkv) {
      check::poison(gkv->p, gkv->n, j.st);
      check::poison(part_o->p, part_o->n, j.st);
      check::poison(part_lse->p, part_lse->n, j.st);
    }
  }

  // ---- the unfused rows' attention: pair calls of weave's single-GPU kernel, then the merge ----
  size_t chunk_elems(int H) const { return size_t(sh.B) * Lc * H * sh.D; }
  size_t row_elems(int H) const { return size_t(H) * sh.D; }
  // Every batch's rows of chunk i of a (B, L, H, D) block into a (B, Lc, H, D) tensor.
  void pack_chunk(bf16* dst, const bf16* block, int i, int H) const {
    const size_t row = row_elems(H) * sizeof(bf16);
    weave::runtime::device_copy_2d(dst, Lc * row, block + i * Lc * row_elems(H), L * row, Lc * row, sh.B, j.st);
  }
  // Chunk i of rank q's K (t = 0) or V (t = 1), as a (B, Lc, Hkv, D) tensor.
  const bf16* kv_chunk(int t, int q, int i) const {
    if (pack) return (t ? pv : pk)->p + size_t(q * cpr + i) * chunk_elems(sh.Hkv);
    return gathered(t, q) + size_t(i) * Lc * row_elems(sh.Hkv);
  }
  void attend(int t) {
    const bf16* q = set[t]->q.p;
    if (pack) {
      for (int i = 0; i < cpr; ++i) pack_chunk(pq->p + i * chunk_elems(sh.Hq), q, i, sh.Hq);
      for (int r = 0; r < W; ++r)
        for (int i = 0; i < cpr; ++i) {
          const size_t at = size_t(r * cpr + i) * chunk_elems(sh.Hkv);
          pack_chunk(pk->p + at, gathered(0, r), i, sh.Hkv);
          pack_chunk(pv->p + at, gathered(1, r), i, sh.Hkv);
        }
    }
    const weave::attention::Shape cs{sh.B, static_cast<int>(Lc), sh.Hq, sh.Hkv, sh.D};
    for (int i = 0; i < cpr; ++i) {
      const bf16* qc = pack ? pq->p + i * chunk_elems(sh.Hq) : q + size_t(i) * Lc * row_elems(sh.Hq);
      weave::bench::MergeArgs m{};
      for (int r = 0; r < W; ++r)
        for (int c = 0; c < cpr; ++c) {
          const long long kb = sp::chunk_range(sh.S, W, sh.sharding(), r, c).begin;
          if (sh.causal && kb > mine[i].begin) continue;  // entirely after the query chunk: masked
          weave::attention::Options ao;
          ao.causal = sh.causal && kb == mine[i].begin;  // the diagonal pair: the global mask
          bf16* po = part_o->p + size_t(m.parts) * chunk_elems(sh.Hq);
          float* pl = part_lse->p + size_t(m.parts) * sh.B * sh.Hq * Lc;
          weave::attention::forward(qc, kv_chunk(0, r, c), kv_chunk(1, r, c), po, pl, cs, ao, j.st);
          m.o[m.parts] = po;
          m.lse[m.parts] = pl;
          ++m.parts;
        }
      merged_parts = std::max(merged_parts, m.parts);
      m.out = o.p, m.out_lse = lse.p;
      m.B = sh.B, m.Lc = static_cast<int>(Lc), m.L = static_cast<int>(L), m.row0 = static_cast<int>(i * Lc);
      m.Hq = sh.Hq, m.D = sh.D;
      weave::bench::lse_merge(m, j.st);
    }
  }

  // Chunk-pair outputs the unfused rows merged (1: the fused kernel, one pass over the keys).
  int merged_parts = 1;

  // O and LSE of the last call (input set 1) against the reference over the whole sequence. The
  // unfused rows merge `merged_parts` partial outputs, each with its own bf16 roundings of P and
  // of O (each of the order of 2^-8 s, s as in attention_o_bound), so their O bound scales the s
  // term by that count; a dropped or stale chunk still moves O by about s * sqrt(its share).
  Verdict verify(const std::string& what) {
    check::AttnProblem p;
    p.B = sh.B, p.Hq = sh.Hq, p.Hkv = sh.Hkv, p.D = sh.D, p.Skv = sh.S, p.Lq = sh.S, p.Lo = L, p.causal = sh.causal;
    const bool all = j.c.check == "all" ||
                     (j.c.check == "auto" && double(sh.B) * sh.Hq * double(L) * double(sh.S) <= kAllRowsLimit);
    std::vector<check::RowRange> rows;
    long long off = 0, n = 0;
    for (size_t i = 0; i < mine.size(); ++i) {
      const auto r = all ? check::all_rows(mine[i].begin, off, mine[i].begin, mine[i].rows)
                         : check::sample_rows(mine[i].begin, off, mine[i].begin, mine[i].rows,
                                              check::derive(j.seed, j.problems, i));
      rows.insert(rows.end(), r.begin(), r.end());
      off += mine[i].rows;
    }
    for (const auto& r : rows) n += r.rows;
    const check::AttnReport rep = j.ref.check(p, set[1]->fq.p, set[1]->fk.p, set[1]->fv.p, rows, o.p, lse.p,
                                              merged_parts > 1
                                                  ? check::Bound{check::kBf16Round, 4 * check::kBf16Round * merged_parts, 0}
                                                  : check::attention_o_bound(),
                                              check::attention_lse_bound(), j.st);
    const netb::Verdict v = netb::settle(j.path, what, rep.ok(), std::max(rep.o.worst, rep.lse.worst), rep.str());
    Verdict out;
    out.ok = v.ok;
    out.o_worst = weave::bench::worst_over_ranks(j.path, rep.o.worst);
    out.lse_worst = weave::bench::worst_over_ranks(j.path, rep.lse.worst);
    std::vector<long long> all_n(static_cast<size_t>(W));
    j.boot().all_gather(&n, all_n.data(), sizeof n);
    for (long long x : all_n) out.rows += x;
    out.all_rows = weave::bench::all_ranks_ok(j.path, all);
    return out;
  }
};

// ---- the rows of one problem ------------------------------------------------------------------

struct Ops {
  net::NetRingAttention ring;
  net::NetCollectives coll;
};

struct Row {
  std::string impl;
  double us = NAN, transfer_us = NAN, compute_us = NAN;
  Verdict v;
};

struct Impl {
  const char* name;
  std::function<void(int set)> transfer;  // null: the fused row (call does everything)
  std::function<void(int set)> call;
  std::function<void()> finish;
};

// net_bench.hpp's loop over `call`. `checked`: its last call runs on set 1 into poisoned outputs
// (a row's time); else every call on set 0 (the unfused rows' parts, not checked).
double time_calls(Job& j, Problem& p, const std::function<void(int)>& call, const std::function<void()>& finish,
                  bool checked) {
  return netb::time_slowest(j.boot(), j.st, j.nodes, j.c.warmup, j.c.iters,
                            {[&] { p.inputs(0); },
                             [&] {
                               if (!checked) return;
                               p.poison();
                               p.inputs(1);
                             },
                             [&, checked](int t) { call(checked ? t : 0); }, finish});
}

std::vector<Row> run_problem(Job& j, Ops& ops, const Shape& sh, uint64_t seed) {
  std::vector<Impl> impls;
  std::vector<std::string> skipped;
  const std::string unfused_why = j.c.has_impl(kImplUnfused) ? unfused_skip(sh, j.nodes) : "";
  const std::string nccl_why = j.nccl ? chunks_unequal(sh, j.nodes) : "";
  const bool unfused = j.c.has_impl(kImplUnfused) && unfused_why.empty();
  const bool nccl = j.c.has_impl(kImplNccl) && j.nccl && nccl_why.empty();
  Problem p(j, sh, seed, unfused || nccl);
  const long long slot = 2 * block_elems(sh, j.nodes);  // one rank's K and V
  sp::RingOptions ro;
  ro.causal = sh.causal;
  ro.sharding = sh.sharding();
  const sp::RingShape rs{sh.B, sh.S, sh.Hq, sh.Hkv, sh.D};
  if (j.c.has_impl(kImplWeave))
    impls.push_back({kImplWeave, nullptr,
                     [&](int t) {
                       ops.ring.forward(p.set[t]->q.p, p.set[t]->k.p, p.set[t]->v.p, p.o.p, p.lse.p, rs, ro, j.st);
                     },
                     [&] { ops.ring.finish(j.st); }});
  const auto sync = [&] { WEAVE_CUDA_CHECK(cudaStreamSynchronize(j.st)); };
  if (j.c.has_impl(kImplUnfused)) {
    if (!unfused) {
      skipped.push_back(concat(kImplUnfused, ": skipped: ", unfused_why));
    } else {
      const auto gather = [&](int) {
        ops.coll.all_gather(p.gkv->p, j.nodes * slot, net::NetDtype::bf16, j.st);
      };
      impls.push_back({kImplUnfused, gather,
                       [&, gather](int t) {
                         gather(t);
                         p.attend(t);
                       },
                       [&] { ops.coll.finish(j.st); }});
    }
  }
  if (j.c.has_impl(kImplNccl) && j.nccl) {
    if (!nccl) {
      skipped.push_back(concat(kImplNccl, ": skipped: ", nccl_why));
    } else {
      const auto gather = [&](int) {
        WEAVE_NCCL_CHECK(ncclAllGather(p.gathered(0, j.rank), p.gkv->p, size_t(slot), ncclBfloat16, j.nccl->comm, j.st));
      };
      impls.push_back({kImplNccl, gather,
                       [&, gather](int t) {
                         gather(t);
                         p.attend(t);
                       },
                       sync});
    }
  }
  if (j.lead())
    for (const std::string& s : skipped) std::printf("  net_ring_attention %s %s\n", sh.str().c_str(), s.c_str());
  std::vector<Row> rows;
  double compute_us = NAN;  // the unfused rows' attention alone, on K/V gathered by their last call
  for (const Impl& im : impls) {
    Row r;
    r.impl = im.name;
    p.merged_parts = 1;  // set by the unfused rows' merge
    r.us = time_calls(j, p, im.call, im.finish, true);
    r.v = p.verify(concat("net_ring_attention ", im.name, " ", sh.str()));
    if (im.transfer) {
      r.transfer_us = time_calls(j, p, im.transfer, im.finish, false);
      if (std::isnan(compute_us))  // on the K/V of set 0 that the transfers just gathered
        compute_us = time_calls(j, p, [&](int t) { p.attend(t); }, sync, false);
      r.compute_us = compute_us;
    }
    rows.push_back(r);
  }
  return rows;
}

// The table lines and JSON lines of one problem's rows (weave's beside the others' times).
void emit(Job& j, const Shape& s, const std::vector<Row>& rows) {
  const netb::Baselines base = netb::baselines(rows);
  const double unfused_us = base.unfused, nccl_us = base.nccl;
  const double flop = 4.0 * s.B * double(s.S) * double(s.S) * s.Hq * s.D / (s.causal ? 2 : 1);
  for (const Row& r : rows) {
    const double tflops = flop / (r.us * 1e-6) / 1e12;
    const bool weave_row = r.impl == kImplWeave, nccl_row = r.impl == kImplNccl;
    if (!r.v.ok) j.wrong.push_back(concat("net_ring_attention ", r.impl, " ", s.str()));
    if (!j.lead()) continue;
    auto num = [](double x, const char* fmt) {
      char b[32] = "-";
      if (!std::isnan(x)) std::snprintf(b, sizeof b, fmt, x);
      return std::string(b);
    };
    std::printf("| %s | %s | %.1f | %.1f | %s | %s | %s | %s | %s %.3g / %.3g |\n", r.impl.c_str(), s.str().c_str(), r.us,
                tflops / j.nodes, num(weave_row ? unfused_us / r.us : NAN, "%.3f").c_str(),
                num(weave_row ? nccl_us / r.us : NAN, "%.3f").c_str(), num(r.transfer_us, "%.1f").c_str(),
                num(r.compute_us, "%.1f").c_str(), r.v.ok ? "ok" : "WRONG", r.v.o_worst, r.v.lse_worst);
    weave::bench::JsonLine jl;
    jl.add("kernel", "net_ring_attention").add("impl", r.impl).add("B", s.B).add("S", s.S).add("H", s.Hq);
    jl.add("H_kv", s.Hkv).add("D", s.D).add("causal", s.causal);
    jl.add("sharding", s.causal ? "zigzag" : "contiguous").add("nodes", j.nodes).add("world", j.nodes);
    jl.add("time_us", r.us).add("tflops", tflops).add("tflops_per_gpu", tflops / j.nodes);
    jl.add("iters", j.c.iters).add("warmup", j.c.warmup);
    netb::add_path_fields(jl, j.c, nccl_row, j.provider, j.notify, j.shared_gpu).add("correct", r.v.ok);
    weave::bench::add_check_worst(jl, std::isnan(r.v.o_worst) || std::isnan(r.v.lse_worst)
                                          ? static_cast<double>(NAN)
                                          : std::max(r.v.o_worst, r.v.lse_worst));
    // O's and the LSE's worst apart, as numbers or "inf" / "nan" (as check_worst).
    for (const auto& [key, x] : {std::pair<const char*, double>{"o_err_ratio", r.v.o_worst}, {"lse_err_ratio", r.v.lse_worst}}) {
      if (std::isfinite(x)) jl.add(key, x);
      else jl.add(key, std::isnan(x) ? "nan" : "inf");
    }
    jl.add("checked_rows", r.v.rows)
        .add("check", r.v.all_rows ? "last timed call, every row vs float32 attention reference"
                                   : "last timed call, sampled rows of every chunk vs float32 attention reference")
        .add("seed", std::to_string(j.seed));
    if (!std::isnan(r.transfer_us)) jl.add("transfer_us", r.transfer_us).add("compute_us", r.compute_us);
    netb::write_row(j, jl, r.impl, r.us, base);
  }
  if (j.lead()) std::fflush(stdout);
}

// ---- the command ---------------------------------------------------------------------------

int run(const weave::bench::Args& a) {
  const Config c = parse(a);
  netb::Run run;
  if (const int status = netb::begin_run(run, kWho, "net_ring", "bench-net-ring", "the inter-node ring attention is");
      status >= 0)
    return status;
  const int nodes = run.nodes();
  const bool lead = run.lead;

  // The problems to run and the path they need: each widens the path, unless that would take more
  // pinned memory than --max-bounce (then it is left out, saying so).
  std::vector<Shape> todo;
  Room room;
  for (long long S : c.seqs)
    for (int causal : c.causal) {
      const Shape sh{c.B, S, c.Hq, c.Hkv, c.D, causal != 0};
      if (S < n_chunks(sh, nodes)) {
        if (lead)
          std::printf("net_ring_attention %s: skipped: fewer rows than the %d chunks of %d nodes\n", sh.str().c_str(),
                      n_chunks(sh, nodes), nodes);
        continue;
      }
      Room need;
      for (const std::string& i : c.impls) need.widen(room_of(i, sh, c, nodes));
      if (netb::widen_within(room, need, c.max_bounce, concat("net_ring_attention ", sh.str()), "--seqs", lead))
        todo.push_back(sh);
    }
  if (todo.empty()) {
    if (lead) std::fprintf(stderr, "%s: no problem left to run (see above)\n", kWho);
    return 1;
  }

  if (const int status = netb::open_run(run, c, room, kWho, "--seqs", check::test_seed); status >= 0) return status;
  check::AttentionRef ref;
  weave::bench::JsonSink sink(a);  // every rank checks the file opens; rank 0 writes
  Job j(run, sink, c, ref);
  net::NetPath& path = *run.path;
  const net::NetPathOptions& po = run.po;
  Ops ops{net::NetRingAttention(path, {c.send_blocks, c.recv_blocks}), net::NetCollectives(path, netb::coll_options(c))};

  if (lead) {
    cudaDeviceProp prop{};
    WEAVE_CUDA_CHECK(cudaGetDeviceProperties(&prop, path.device()));
    std::printf("%s: %d nodes of one rank, %s; libfabric %s; path: %zu MiB send, 2 x %zu MiB receive, %u flags; "
                "%d send + %d receive blocks, unfused chunk %lld; %d warm-up + %d timed calls, median of the slowest "
                "rank's; seed %llu\n",
                kWho, nodes, prop.name, path.transport().describe().c_str(), po.send_bytes >> 20, po.recv_bytes >> 21,
                po.proxy.flags, c.send_blocks, c.recv_blocks, c.chunk, c.warmup, c.iters,
                static_cast<unsigned long long>(j.seed));
    netb::print_notes(run, c);
    std::printf("| impl | problem | time_us | TFLOP/s/GPU | unfused/weave | nccl/weave | transfer_us | compute_us | "
                "check (O / LSE worst error / bound) |\n|---|---|---|---|---|---|---|---|---|\n");
    std::fflush(stdout);
  }
  for (const Shape& sh : todo) {
    const uint64_t seed = check::derive(j.seed, 0x6e7272, j.problems);
    emit(j, sh, run_problem(j, ops, sh, seed));
    ++j.problems;
  }
  netb::end_run(run);
  return weave::bench::exit_status("net_ring", j.wrong, j.seed, lead);
}

}  // namespace

WEAVE_BENCH(net_ring,
            "the inter-node ring attention (kernels/net_ring_attention: row net_ring_attention) between nodes of one "
            "rank each, under weave-run -n N --nodes N (with --share-gpus on fewer GPUs: checks only, the times "
            "time-slice): impl weave (fused) vs weave-unfused (NetCollectives all_gather of K and V, then weave's "
            "single-GPU attention per chunk pair + LSE merge) vs nccl (the same attention + NCCL on its socket "
            "transport; one GPU per rank); S the whole sequence, zigzag when causal, every row checked (O and LSE), "
            "exit 1 if any is wrong [--seqs 4096,8192,16384] [--heads 32] [--kv-heads 8] [--dim 128] [--batch 1] "
            "[--causal 0,1] [--impls weave,weave-unfused,nccl] [--chunk 1M] [--send-blocks 2] [--recv-blocks 4] "
            "[--iters 20] [--warmup 5] [--provider tcp] [--domain lo] [--notify ordered|unordered] [--max-bounce 4G] "
            "[--check auto|all|sample]",
            run);
