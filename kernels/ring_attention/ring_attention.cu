// Host side of ring attention: validation, the cross-rank check, gathered K/V buffers and
// signal sets per shape, maps, tuner. The kernel is attention/gathered_kernel.cuh.
#include <cmath>
#include <cstring>

#include "gathered_attention/gather_buffer.hpp"
#include "gathered_attention/gathered.hpp"
#include "gathered_attention/sp_call.hpp"
#include "ring_attention/ring_attention.hpp"
#include "ring_attention/ring_globals.hpp"
#include "ring_attention/schedule.hpp"
#include "ring_attention/tune_model.hpp"
#include "weave/runtime/call.hpp"
#include "weave/runtime/device_copy.hpp"
#include "weave/runtime/tuner.hpp"
#include "weave/runtime/tuner_launch.hpp"
#include "weave/signal.cuh"

namespace weave::sp {

namespace gs = attention::gathered;

int chunks_per_rank(Sharding sh) { return ring::chunks_per_rank(sh == Sharding::Zigzag); }
ChunkRange chunk_range(long long S, int W, Sharding sh, int rank, int i) {
  const gs::Rows r = ring::chunk(S, W, sh == Sharding::Zigzag, rank, i);
  return {r.begin, r.rows};
}
long long local_rows(long long S, int W, Sharding sh, int rank) {
  return ring::local_rows(S, W, sh == Sharding::Zigzag, rank);
}

struct RingAttention::Impl {
  runtime::Communicator& c;
  runtime::ShapeSignals sig{"sp.ring"};
  attention::GatherBuffer kv;  // gathered K then V
  runtime::CallOrder order;
  // The layout of the previous call's gathered buffers. A causal call ends on a rank before the
  // peers' pushes of rows past its queries (it never waits for them) have landed; those land
  // where a different layout may put this rank's own rows, which the next call copies in before
  // its kernel, so a change of layout first drains every rank: on the host, or, once a CUDA
  // graph captured a call (the host no longer sees the order of layouts on the device), on the
  // device before every copy of own rows (drain_kernel: every rank's previous kernel has ended).
  std::vector<long long> last_key;
  bool captured = false;
  runtime::SignalSet drain;
  explicit Impl(runtime::Communicator& cc) : c(cc), kv(cc), drain(cc.signals("sp.ring drain", 1)) {}
  RingLaunchInfo launch(const bf16* q, const bf16* k, const bf16* v, bf16* o, float* lse, const RingShape& s,
                        const RingOptions& opt, int ncomm, cudaStream_t stream);
};

RingAttention::RingAttention(runtime::Communicator& c) : impl_(std::make_unique<Impl>(c)) {}
RingAttention::~RingAttention() = default;

namespace detail {

std::string ring_input_problem(const RingShape& s, const RingOptions& o, int W, int rank, int sm_count, const void* q,
                               const void* k, const void* v, const void* out, const void* lse,
                               const ExtentCheck& extent) {
  try {
    attention::check_common("ring_attention", s.B, s.Hq, s.Hkv, s.D, o.softmax_scale, o.num_comm_sms, sm_count, q, k,
                            v, out);
    WEAVE_CHECK(o.sharding == Sharding::Zigzag || o.sharding == Sharding::Contiguous, "ring_attention: bad sharding ",
                static_cast<int>(o.sharding));
    const int zz = o.sharding == Sharding::Zigzag ? 1 : 0;
    const int n = ring::num_chunks(W, zz);
    WEAVE_CHECK(s.S >= n && s.S < (1ll << 30), "ring_attention: S = ", s.S, " must be in [", n,
                " (one row per chunk), 2^30)");
    WEAVE_CHECK(reinterpret_cast<uintptr_t>(lse) % 4 == 0, "ring_attention: lse must be 4-byte aligned");
    // The communicators read k and v while the tiles write o and lse; a tile reads its query
    // rows before it writes their output, so o may be q itself (in place) but not overlap it
    // otherwise.
    const long long L = ring::local_rows(s.S, W, zz, rank);
    const size_t nq = size_t(s.B) * L * s.Hq * s.D * 2, nkv = size_t(s.B) * L * s.Hkv * s.D * 2;
    const size_t nl = lse ? size_t(s.B) * s.Hq * L * 4 : 0;
    WEAVE_CHECK(!runtime::overlap(out, nq, k, nkv) && !runtime::overlap(out, nq, v, nkv),
                "ring_attention: o overlaps k or v (they are read while o is written)");
    WEAVE_CHECK(out == q || !runtime::overlap(out, nq, q, nq),
                "ring_attention: o overlaps q without being q (in place is allowed, a shifted overlap is not)");
    WEAVE_CHECK(!runtime::overlap(lse, nl, q, nq) && !runtime::overlap(lse, nl, k, nkv) &&
                    !runtime::overlap(lse, nl, v, nkv) && !runtime::overlap(lse, nl, out, nq),
                "ring_attention: lse overlaps q, k, v or o");
    if (extent) {
      extent("q", q, nq), extent("k", k, nkv), extent("v", v, nkv), extent("o", out, nq);
      if (lse) extent("lse", lse, nl);
    }
  } catch (const Error& e) {
    return e.what();
  }
  return {};
}

}  // namespace detail

namespace ring {

void fill_globals(attention::GatheredGlobals& g, const bf16* q, const bf16* k, const bf16* v, bf16* o, float* lse,
                  const RingShape& s, const RingOptions& opt, int W, int r, bf16* gk, bf16* gv) {
  const int zz = opt.sharding == Sharding::Zigzag ? 1 : 0;
  const int S = static_cast<int>(s.S), D = s.D, Hq = s.Hq, Hkv = s.Hkv;
  const long long L = ring::local_rows(S, W, zz, r);
  const int nmine = ring::chunks_per_rank(zz);
  g.n_qchunks = nmine;
  g.n_otargets = nmine;
  g.o_by_owner = 0;
  for (int i = 0; i < nmine; ++i) {
    const gs::Rows ch = ring::chunk(S, W, zz, r, i);
    const long long off = ring::local_offset(S, W, zz, r, i);
    g.q_begin[i] = static_cast<int>(ch.begin);
    g.q_rows[i] = static_cast<int>(ch.rows);
    g.q_lse_off[i] = static_cast<int>(off);
    g.start_row[i] = static_cast<int>(ch.begin);
    g.q[i] = attention::map_rows(q + off * Hq * D, D, Hq, ch.rows, s.B, L * Hq * D, 64, 1, 128, true);
    g.o[i] = attention::map_rows(o + off * Hq * D, D, Hq, ch.rows, s.B, L * Hq * D, 64, 1, 64, true);
    g.o_begin[i] = static_cast<int>(ch.begin);
    g.o_rows[i] = static_cast<int>(ch.rows);
    g.mine[i] = ring::chunk_id(W, zz, r, i);
  }
  g.k = attention::map_rows(gk, D, Hkv, S, s.B, static_cast<long long>(S) * Hkv * D, 64, 1, 128, true);
  g.v = attention::map_rows(gv, D, Hkv, S, s.B, static_cast<long long>(S) * Hkv * D, 64, 1, 128, true);
  g.lse = lse;
  g.lse_rows = static_cast<int>(L);
  g.B = s.B, g.S = S, g.H = Hq;
  g.group = Hq / Hkv, g.head_base = 0, g.kv_base = 0;
  g.scale = opt.softmax_scale > 0.f ? opt.softmax_scale : 1.f / std::sqrt(static_cast<float>(D));
  g.scale_log2 = g.scale * 1.4426950408889634f;
  g.causal = opt.causal ? 1 : 0;

  // One head group: a piece (batch, rows of a chunk, all kv heads) is contiguous at both ends,
  // so it moves as 1-D bulk copies in 16 KB pieces (long NVLink writes; tensor boxes of 2 KB
  // rows measured ~10 GB/s per communicator CTA, README.md).
  g.group_heads = Hkv;
  g.groups = 1;
  g.contig = 1;
  g.row_bytes = static_cast<long long>(Hkv) * D * 2;
  g.src_bstride = L * g.row_bytes;
  g.dst_bstride = static_cast<long long>(S) * g.row_bytes;
  g.slices = gs::num_slices(S);
  g.n_chunks = ring::num_chunks(W, zz);
  g.wait_q = 0;
  g.rank = r, g.world = W;
  g.n_mine = nmine;
  // This rank's own rows are never pushed (the communicators' NVLink pushes carry only
  // peer-bound data). Where every own chunk starts on a key block and ends on one (or at S), the
  // kernel reads those blocks from the local input in place; otherwise a copy kernel puts them
  // into the gathered buffers before the launch (4 % of the 8K call, perf-notes). Either way this
  // rank alone decides: nobody else reads or writes its own rows there.
  g.skip_self = 1;
  g.n_own = 0;
  for (int i = 0; i < nmine; ++i) {
    const gs::Rows ch = ring::chunk(S, W, zz, r, i);
    const long long end = ch.begin + ch.rows;
    if (ch.begin % gs::kBlockRows || (end % gs::kBlockRows && end != S)) {
      g.n_own = 0;
      break;
    }
    const long long off = ring::local_offset(S, W, zz, r, i);
    g.own_b0[i] = static_cast<int>(ch.begin / gs::kBlockRows);
    g.own_b1[i] = static_cast<int>((end + gs::kBlockRows - 1) / gs::kBlockRows);
    g.own_row0[i] = static_cast<int>(ch.begin);
    g.k_own[i] = attention::map_rows(k + off * Hkv * D, D, Hkv, ch.rows, s.B, L * Hkv * D, 64, 1, 128, true);
    g.v_own[i] = attention::map_rows(v + off * Hkv * D, D, Hkv, ch.rows, s.B, L * Hkv * D, 64, 1, 128, true);
    g.n_own = i + 1;
  }
}

void copy_own_rows(const bf16* k, const bf16* v, bf16* gk, bf16* gv, const RingShape& s, int W, int r, int zz,
                   cudaStream_t stream) {
  const int S = static_cast<int>(s.S), D = s.D, Hkv = s.Hkv;
  const long long L = ring::local_rows(S, W, zz, r);
  const int nmine = ring::chunks_per_rank(zz);
  // One 2-D copy per chunk and tensor: a row per batch (the gathered buffer's batch pitch S rows,
  // the input's L rows).
  const size_t row = size_t(Hkv) * D * sizeof(bf16), dpitch = size_t(S) * row, spitch = size_t(L) * row;
  for (int i = 0; i < nmine; ++i) {
    const gs::Rows ch = ring::chunk(S, W, zz, r, i);
    const long long off = ring::local_offset(S, W, zz, r, i);
    for (int t = 0; t < 2; ++t)
      runtime::device_copy_2d((t ? gv : gk) + ch.begin * Hkv * D, dpitch, (t ? v : k) + off * Hkv * D, spitch,
                              ch.rows * row, static_cast<size_t>(s.B), stream);
  }
}

}  // namespace ring

namespace {
__global__ void drain_kernel(const signals s, const Round round) { barrier(s, 0, round); }
}  // namespace

RingLaunchInfo RingAttention::Impl::launch(const bf16* q, const bf16* k, const bf16* v, bf16* o, float* lse,
                                           const RingShape& s, const RingOptions& opt, int ncomm, cudaStream_t stream) {
  Impl& m = *this;
  const int W = m.c.world(), r = m.c.rank(), zz = opt.sharding == Sharding::Zigzag ? 1 : 0;
  const int S = static_cast<int>(s.S), D = s.D, Hq = s.Hq, Hkv = s.Hkv;
  const long long L = ring::local_rows(S, W, zz, r);
  const std::vector<long long> key = {s.B, S, Hq, Hkv, D, zz};
  const bool cap = runtime::capturing(stream);
  // Everything a capture cannot make (the shape's signal sets, a larger buffer) first: a call
  // refused under capture then changes nothing.
  const std::vector<int> counts = {s.B * gs::num_slices(S), 1};  // one kv head group (g.groups below)
  runtime::SignalSet& rd = m.sig.get(m.c, key, counts, 0, cap);
  runtime::SignalSet& ar = m.sig.get(m.c, key, counts, 1, cap);
  const size_t kv_elems = size_t(s.B) * S * Hkv * D;
  bf16* gk = static_cast<bf16*>(m.kv.get(2 * kv_elems * sizeof(bf16), cap));
  if (!m.captured && !cap && !m.last_key.empty() && key != m.last_key) {  // every rank: the shapes agree
    WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
    m.c.barrier();
  }
  m.captured = m.captured || cap;
  m.last_key = key;
  m.order.before(stream, cap);
  bf16* gv = gk + kv_elems;
  const runtime::PeerPtrs pk = m.c.peers(gk, 2 * kv_elems * sizeof(bf16));

  attention::GatheredGlobals g{};
  const int nmine = ring::chunks_per_rank(zz);
  ring::fill_globals(g, q, k, v, o, lse, s, opt, W, r, gk, gv);
  g.num_comm = ncomm;
  if (m.captured) {  // every rank alike (whether a rank copies depends on its chunks)
    drain_kernel<<<1, 1, 0, stream>>>(m.drain.view(), m.drain.next_round(stream, cap));
    WEAVE_CUDA_CHECK(cudaGetLastError());
  }
  if (g.n_own == 0) ring::copy_own_rows(k, v, gk, gv, s, W, r, zz, stream);
  g.n_push = 2;
  for (int t = 0; t < 2; ++t) {
    attention::PushTensor& pt = g.push[t];
    const bf16* src = t == 0 ? k : v;
    const size_t dst_off = t == 0 ? 0 : kv_elems;
    for (int i = 0; i < nmine; ++i) {
      const gs::Rows ch = ring::chunk(S, W, zz, r, i);
      const long long off = ring::local_offset(S, W, zz, r, i);
      pt.src_ptr[i] = reinterpret_cast<const uint8_t*>(src + off * Hkv * D);
      for (int d = 0; d < W; ++d)
        pt.dst_ptr[d][i] = reinterpret_cast<uint8_t*>(static_cast<bf16*>(pk[d]) + dst_off + ch.begin * Hkv * D);
    }
    for (int d = 0; d < W; ++d) pt.head0[d] = 0, pt.heads[d] = Hkv;
  }
  g.ready = rd.view();
  g.arrive = ar.view();
  g.count_o = 0;
  attention::launch_gathered(g, D, stream, [&](attention::GatheredGlobals& gg) {
    gg.ready_round = rd.next_round(stream, cap);
    gg.arrive_round = ar.next_round(stream, cap);
  });
  m.order.after(stream, cap);
  return {ncomm, m.c.sm_count() - ncomm, false, g.n_own > 0};
}

RingLaunchInfo RingAttention::forward(const bf16* q, const bf16* k, const bf16* v, bf16* o, float* lse,
                                      const RingShape& s, const RingOptions& opt, cudaStream_t stream) {
  Impl& m = *impl_;
  const int W = m.c.world();
  int scale_bits = 0;
  std::memcpy(&scale_bits, &opt.softmax_scale, sizeof scale_bits);
  const std::string problem = detail::ring_input_problem(s, opt, W, m.c.rank(), m.c.sm_count(), q, k, v, o, lse,
                                         [&](const char* name, const void* p, size_t bytes) {
                                           m.c.check_buffer("ring_attention", name, p, bytes);
                                         });
  m.c.agree_call("ring_attention", "B, S, Hq, Hkv, D, causal, sharding, scale, num_comm_sms",
                 {s.B, s.S, s.Hq, s.Hkv, s.D, opt.causal, static_cast<int>(opt.sharding), scale_bits,
                  opt.num_comm_sms},
                 problem, stream);
  if (opt.num_comm_sms >= 0) return m.launch(q, k, v, o, lse, s, opt, opt.num_comm_sms, stream);
  std::vector<runtime::TuneCandidate> cands;
  for (int n : {4, 8, 16})
    if (n <= m.c.sm_count() / 4) cands.push_back({0, n});
  const std::string key =
      runtime::tune_key("ring_attention", {s.B, s.S, s.Hq, s.Hkv, s.D, opt.causal, static_cast<int>(opt.sharding)}, W,
                        runtime::device_key(m.c));
  const runtime::TuneResult t = runtime::tuned_choice(
      m.c, key, cands, stream, "ring_attention",
      [&] {
        return model::choose({model::Family::ring, s.B, s.S, s.Hq, s.Hkv, s.D, W, opt.causal}, cands,
                             runtime::device_rates(m.c.sm_count()));
      },
      [&](const runtime::TuneCandidate& c) { m.launch(q, k, v, o, lse, s, opt, c.num_comm_sms, stream); });
  RingLaunchInfo li = m.launch(q, k, v, o, lse, s, opt, t.choice.num_comm_sms, stream);
  li.tuned = true;
  return li;
}

}  // namespace weave::sp
