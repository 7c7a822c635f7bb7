// Host side of Ulysses attention: validation, the cross-rank check, gathered Q/K/V buffers and
// signal sets per shape, per-owner O maps, tuner. The kernel is gathered_attention/gathered_kernel.cuh.
#include <cmath>
#include <cstring>

#include "gathered_attention/gather_buffer.hpp"
#include "gathered_attention/gathered.hpp"
#include "gathered_attention/sp_call.hpp"
#include "ring_attention/tune_model.hpp"
#include "ulysses/schedule.hpp"
#include "ulysses/ulysses.hpp"
#include "weave/runtime/call.hpp"
#include "weave/runtime/tuner.hpp"
#include "weave/runtime/tuner_launch.hpp"

namespace weave::sp {

namespace gs = attention::gathered;

RowShard ulysses_shard(long long S, int W, int rank) {
  const gs::Rows r = uly::shard(S, W, rank);
  return {r.begin, r.rows};
}

struct Ulysses::Impl {
  runtime::Communicator& c;
  runtime::ShapeSignals sig{"sp.ulysses"};
  attention::GatherBuffer buf;  // gathered Q, K, V
  runtime::CallOrder order;
  explicit Impl(runtime::Communicator& cc) : c(cc), buf(cc) {}
  UlyssesLaunchInfo launch(const bf16* q, const bf16* k, const bf16* v, bf16* o, const UlyssesShape& s,
                           const UlyssesOptions& opt, int ncomm, cudaStream_t stream);
};

Ulysses::Ulysses(runtime::Communicator& c) : impl_(std::make_unique<Impl>(c)) {}
Ulysses::~Ulysses() = default;

namespace detail {

std::string ulysses_input_problem(const UlyssesShape& s, const UlyssesOptions& o, int W, int rank, int sm_count,
                                  const void* q, const void* k, const void* v, const void* out,
                                  const ExtentCheck& extent) {
  try {
    attention::check_common("ulysses", s.B, s.Hq, s.Hkv, s.D, o.softmax_scale, o.num_comm_sms, sm_count, q, k, v, out);
    WEAVE_CHECK(s.Hq % W == 0, "ulysses: Hq = ", s.Hq, " query heads cannot be split over ", W,
                " ranks (Hq must be a multiple of the world size)");
    WEAVE_CHECK(s.S >= W && s.S < (1ll << 30), "ulysses: S = ", s.S, " must be in [", W,
                " (one row per rank), 2^30)");
    // Peers write this rank's o while its communicators still read q, k and v.
    const long long L = uly::shard(s.S, W, rank).rows;
    const size_t nq = size_t(s.B) * L * s.Hq * s.D * 2, nkv = size_t(s.B) * L * s.Hkv * s.D * 2;
    WEAVE_CHECK(!runtime::overlap(out, nq, q, nq) && !runtime::overlap(out, nq, k, nkv) &&
                    !runtime::overlap(out, nq, v, nkv),
                "ulysses: o overlaps q, k or v (peers write o while q, k, v are still being read)");
    if (extent) extent("q", q, nq), extent("k", k, nkv), extent("v", v, nkv);
  } catch (const Error& e) {
    return e.what();
  }
  return {};
}

}  // namespace detail

namespace {

// The bytes of o every rank's peers may write: the largest shard's (B, rows, Hq, D), so every
// rank checks the same extent of the symmetric allocation and all agree whether it fits.
size_t o_bytes(const UlyssesShape& s, int W) {
  return size_t(s.B) * uly::shard(s.S, W, 0).rows * s.Hq * s.D * sizeof(bf16);
}

}  // namespace

UlyssesLaunchInfo Ulysses::Impl::launch(const bf16* q, const bf16* k, const bf16* v, bf16* o, const UlyssesShape& s,
                                        const UlyssesOptions& opt, int ncomm, cudaStream_t stream) {
  Impl& m = *this;
  const int W = m.c.world(), r = m.c.rank();
  const int S = static_cast<int>(s.S), D = s.D, Hq = s.Hq, Hkv = s.Hkv;
  const int hp = uly::q_heads(Hq, W), hkm = uly::kv_heads_max(Hq, Hkv, W);
  const gs::Rows mine = uly::shard(S, W, r);
  const long long L = mine.rows;
  const bool cap = runtime::capturing(stream);
  // What a capture cannot make (the shape's signal sets, a larger buffer) first: a call refused
  // under capture then changes nothing.
  const std::vector<long long> key = {s.B, S, Hq, Hkv, D};
  const std::vector<int> counts = {s.B * gs::num_slices(S), 1, 1};  // one head group (g.groups below)
  runtime::SignalSet& rd = m.sig.get(m.c, key, counts, 0, cap);
  runtime::SignalSet& ar = m.sig.get(m.c, key, counts, 1, cap);
  runtime::SignalSet& od = m.sig.get(m.c, key, counts, 2, cap);
  const size_t q_elems = size_t(s.B) * S * hp * D, kv_elems = size_t(s.B) * S * hkm * D;
  const size_t bytes = (q_elems + 2 * kv_elems) * sizeof(bf16);
  bf16* gq = static_cast<bf16*>(m.buf.get(bytes, cap));
  m.order.before(stream, cap);
  bf16* gk = gq + q_elems;
  bf16* gv = gk + kv_elems;
  const runtime::PeerPtrs pg = m.c.peers(gq, bytes);
  const runtime::PeerPtrs po = m.c.peers(o, o_bytes(s, W));

  attention::GatheredGlobals g{};
  g.n_qchunks = 1;
  g.q_begin[0] = 0, g.q_rows[0] = S, g.q_lse_off[0] = 0;
  g.start_row[0] = static_cast<int>(mine.begin);
  g.q[0] = attention::map_rows(gq, D, hp, S, s.B, static_cast<long long>(S) * hp * D, 64, 1, 128, true);
  g.k = attention::map_rows(gk, D, hkm, S, s.B, static_cast<long long>(S) * hkm * D, 64, 1, 128, true);
  g.v = attention::map_rows(gv, D, hkm, S, s.B, static_cast<long long>(S) * hkm * D, 64, 1, 128, true);
  g.n_otargets = W, g.o_by_owner = 1, g.o_heads = Hq;
  for (int p = 0; p < W; ++p) {
    const gs::Rows sp = uly::shard(S, W, p);
    g.o[p] = attention::map_rows(po[p], D, Hq, sp.rows, s.B, sp.rows * Hq * D, 64, 1, 64, true);
    g.o_ptr[p] = static_cast<bf16*>(po[p]);
    g.o_begin[p] = static_cast<int>(sp.begin);
    g.o_rows[p] = static_cast<int>(sp.rows);
  }
  g.lse = nullptr;
  g.lse_rows = 0;
  g.B = s.B, g.S = S, g.H = hp;
  g.group = Hq / Hkv, g.head_base = r * hp, g.kv_base = uly::kv_first(Hq, Hkv, W, r);
  g.scale = opt.softmax_scale > 0.f ? opt.softmax_scale : 1.f / std::sqrt(static_cast<float>(D));
  g.scale_log2 = g.scale * 1.4426950408889634f;
  g.causal = opt.causal ? 1 : 0;
  g.groups = 1, g.group_heads = 1 << 20;
  g.slices = gs::num_slices(S);
  g.n_chunks = W;
  g.wait_q = 1;
  g.num_comm = ncomm, g.rank = r, g.world = W;
  g.n_mine = 1, g.mine[0] = r;
  g.skip_self = 0;  // the own head slice is pushed like the others (strided: one 2-D copy per batch otherwise)
  g.n_push = 3;
  for (int t = 0; t < 3; ++t) {
    attention::PushTensor& pt = g.push[t];
    const bool isq = t == 0;
    const int Hsrc = isq ? Hq : Hkv, Hdst = isq ? hp : hkm;
    const bf16* src = t == 0 ? q : (t == 1 ? k : v);
    const size_t dst_off = t == 0 ? 0 : (t == 1 ? q_elems : q_elems + kv_elems);
    int bh = 0, br = 0;
    attention::push_box(D, Hdst, &bh, &br);
    pt.box_heads = bh, pt.box_rows = br;
    pt.box_bytes = static_cast<uint32_t>(2 * D * bh * br);
    pt.src[0] = attention::map_rows(src, D, Hsrc, L, s.B, L * Hsrc * D, D, bh, br, false);
    for (int d = 0; d < W; ++d) {
      pt.dst[d][0] = attention::map_rows(static_cast<bf16*>(pg[d]) + dst_off + mine.begin * Hdst * D, D, Hdst, L, s.B,
                                         static_cast<long long>(S) * Hdst * D, D, bh, br, false);
      pt.head0[d] = isq ? d * hp : uly::kv_first(Hq, Hkv, W, d);
      pt.heads[d] = isq ? hp : uly::kv_count(Hq, Hkv, W, d);
    }
  }
  g.ready = rd.view();
  g.arrive = ar.view();
  g.odone = od.view();
  g.count_o = 1;
  g.odone_per = static_cast<unsigned long long>(uly::o_stores(S, W, s.B, Hq, r));
  attention::launch_gathered(g, D, stream, [&](attention::GatheredGlobals& gg) {
    gg.ready_round = rd.next_round(stream, cap);
    gg.arrive_round = ar.next_round(stream, cap);
    gg.odone_round = od.next_round(stream, cap);
  });
  m.order.after(stream, cap);
  return {ncomm, m.c.sm_count() - ncomm, false};
}

UlyssesLaunchInfo Ulysses::forward(const bf16* q, const bf16* k, const bf16* v, bf16* o, const UlyssesShape& s,
                                   const UlyssesOptions& opt, cudaStream_t stream) {
  Impl& m = *impl_;
  const int W = m.c.world();
  std::string problem = detail::ulysses_input_problem(s, opt, W, m.c.rank(), m.c.sm_count(), q, k, v, o,
                                            [&](const char* name, const void* p, size_t bytes) {
                                              m.c.check_buffer("ulysses", name, p, bytes);
                                            });
  if (problem.empty()) {
    try {
      m.c.peers(o, o_bytes(s, W));
    } catch (const Error& e) {
      problem = std::string(e.what()) +
                " (ulysses: o must be in the symmetric heap or registered, with room for the largest shard)";
    }
  }
  int scale_bits = 0;
  std::memcpy(&scale_bits, &opt.softmax_scale, sizeof scale_bits);
  m.c.agree_call("ulysses", "B, S, Hq, Hkv, D, causal, scale, num_comm_sms",
                 {s.B, s.S, s.Hq, s.Hkv, s.D, opt.causal, scale_bits, opt.num_comm_sms}, problem, stream, {o});
  if (opt.num_comm_sms >= 0) return m.launch(q, k, v, o, s, opt, opt.num_comm_sms, stream);
  std::vector<runtime::TuneCandidate> cands;
  for (int n : {4, 8, 16})
    if (n <= m.c.sm_count() / 4) cands.push_back({0, n});
  const std::string key =
      runtime::tune_key("ulysses", {s.B, s.S, s.Hq, s.Hkv, s.D, opt.causal}, W, runtime::device_key(m.c));
  const runtime::TuneResult t = runtime::tuned_choice(
      m.c, key, cands, stream, "ulysses",
      [&] {
        return model::choose({model::Family::ulysses, s.B, s.S, s.Hq, s.Hkv, s.D, W, opt.causal}, cands,
                             runtime::device_rates(m.c.sm_count()));
      },
      [&](const runtime::TuneCandidate& c) { m.launch(q, k, v, o, s, opt, c.num_comm_sms, stream); });
  UlyssesLaunchInfo li = m.launch(q, k, v, o, s, opt, t.choice.num_comm_sms, stream);
  li.tuned = true;
  return li;
}

}  // namespace weave::sp
