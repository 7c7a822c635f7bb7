// Host entry of the collectives: validate, plan, launch one kernel per call.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "weave/runtime/call.hpp"  // local_problem, CallOrder
#include "collectives/collectives.hpp"
#include "collectives/kernel.cuh"
#include "collectives/ll.cuh"
#include "collectives/ll128.cuh"
#include "collectives/plan.hpp"
#include "collectives/push.cuh"
#include "collectives/state.cuh"
#include "weave/common/error.hpp"
#include "weave/pdl.cuh"

namespace weave::coll {

namespace {

// Bytes of work per block: one 16-byte unit per thread and step, so that small calls spread
// over many SMs and finish in one round trip of peer accesses.
template <class S>
constexpr long long block_bytes() {
  return S::Threads * 16;
}

// launch.template operator()<T, Op>() for the element type of t and the reduction op, then the
// launch error check: one place that turns runtime (dtype, op) into kernel instantiations.
template <class F>
void by_type_and_op(DType t, ReduceOp op, F&& launch) {
  auto with_type = [&]<class T>() {
    if (op == ReduceOp::sum) launch.template operator()<T, ReduceOp::sum>();
    else if (op == ReduceOp::max) launch.template operator()<T, ReduceOp::max>();
    else launch.template operator()<T, ReduceOp::min>();
  };
  if (t == DType::bf16) with_type.template operator()<__nv_bfloat16>();
  else if (t == DType::fp16) with_type.template operator()<__half>();
  else with_type.template operator()<float>();
  WEAVE_CUDA_CHECK(cudaGetLastError());
}

int largest_vec(std::initializer_list<long long> v, int elt) {
  int vec = 16;
  for (long long x : v)
    while (vec > elt && x % vec) vec /= 2;
  return vec;
}

// Element-aligned buffers (each rank checks its own, before the cross-rank check, so a peer's
// misaligned buffer is an error on that peer, never a faulting access here).
void check_aligned(const char* who, const void* in, const void* out, DType t) {
  const uintptr_t e = dtype_size(t);
  WEAVE_CHECK(reinterpret_cast<uintptr_t>(in) % e == 0 && reinterpret_cast<uintptr_t>(out) % e == 0, who,
              ": buffers must be aligned to the element size (", e, " bytes), got in ", in, ", out ", out);
}

std::vector<long long> shape_args(int kind, DType t, ReduceOp op, const Shape& s, int dim, ShardAlgo algo) {
  return {kind, static_cast<long long>(t), static_cast<long long>(op), s.ndim, s.d[0], s.d[1], s.d[2], s.d[3], dim,
          static_cast<long long>(algo)};
}
// The push all_reduce's scratch: per (pipe, source) `slots` slots of `slot_bytes`; one pipe per
// warp (PairShape's 512 threads on 2 ranks, ReduceShape's 256 on more). Measured (README): on 2
// ranks 8 KiB x 2 slots, 33 MiB on an H200 (1-2 KiB slots lose 5-15 % of the bandwidth: every
// step pays a fence per warp); at more ranks, not measured, 2 KiB x 2 (29 MiB at W = 8).
struct PushConfig {
  long long slot_bytes;
  int slots, threads;
};
constexpr int kPushSlots = 2;
static_assert(kPushSlots >= kPushLag + 1, "a slot is refilled only after its step was reduced");
PushConfig push_config(int world) {
  return {world <= 2 ? 8192 : 2048, kPushSlots, world <= PairShape::MaxSrc ? PairShape::Threads : ReduceShape::Threads};
}
uintptr_t addr(const void* p) { return reinterpret_cast<uintptr_t>(p); }
bool aligned4(const void* a, const void* b) {
  return reinterpret_cast<uintptr_t>(a) % 4 == 0 && reinterpret_cast<uintptr_t>(b) % 4 == 0;
}
void check_shape(const Shape& s, int dim) {
  WEAVE_CHECK(s.ndim >= 1 && s.ndim <= 4, "collective: tensors have 1 to 4 dimensions, got ", s.ndim);
  for (int i = 0; i < s.ndim; ++i) WEAVE_CHECK(s.d[i] >= 0, "collective: negative dimension ", s.d[i]);
  WEAVE_CHECK(dim >= 0 && dim < s.ndim, "collective: dim ", dim, " outside 0..", s.ndim - 1);
}
}  // namespace

struct Collectives::Impl {
  runtime::Communicator& comm;
  runtime::SignalSet sig;
  int blocks_max;  // the smallest SM count of all ranks: every rank launches the same grid
  bool ll128_links = false;  // every pair of ranks NVLink-connected: LL128 allowed (plan.hpp)
  // The calls' counts, on the device (state.cuh): the kernels read and advance them, so that a
  // CUDA graph's replays wait for their own counts.
  runtime::SymmetricTensor<unsigned long long> state;
  AllReduceAlgo algo = AllReduceAlgo::automatic;
  ShardAlgo ag_algo = ShardAlgo::automatic, rs_algo = ShardAlgo::automatic;

  // LL: scratch[parity][source rank] of 8-byte lines on every rank, zeroed once and at every
  // restart (plan.hpp, ll_restart_at); one call count for all LL kinds (the reuse argument in ll.cuh).
  runtime::SymmetricTensor<unsigned long long> ll_scratch;
  runtime::SignalSet ll_sig;      // names the LL flags in timeout diagnostics ("from rank" = index)
  runtime::SignalSet ll_restart;  // the restart's barrier
  unsigned ll_period = kLLFlagPeriod;
  // Calls run in issue order on the device even across streams: every count in `state` assumes it.
  runtime::CallOrder order;
  static constexpr size_t kLLLines = Collectives::kLLMaxBytes / 4;

  // LL128 steps a warp sends ahead of the one it receives (any lag >= 1 is deadlock-free, ll128.cuh).
  static constexpr int kLL128Lag = 1;
  // LL128: scratch[parity][source] of 128-byte lines, made (zeroed) by the first LL128 call, so
  // that objects which never take it do not hold ~33 MiB of heap; same counter as LL.
  std::optional<runtime::SymmetricTensor<unsigned long long>> ll128_scratch;
  size_t ll128_slot_words() const {
    return static_cast<size_t>(ll_lines(Collectives::ll128_max_bytes(comm.world()) / 4, kLL128Words)) * 16;
  }

  // Push all_reduce: scratch and counters made by the first push call (every rank takes the
  // same path, checked), so that objects which never push do not hold its scratch (33 MiB on 2
  // ranks, push_config).
  std::optional<runtime::SymmetricTensor<char>> push_scratch;
  std::optional<runtime::SignalSet> push_sig;
  PushConfig push;

  explicit Impl(runtime::Communicator& c)
      : comm(c),
        sig(c.signals("collectives", 2)),
        state(c, (sizeof(CallState) + 7) / 8),
        ll_scratch(c, Collectives::scratch_bytes(c.world()) / sizeof(unsigned long long)),
        ll_sig(c.signals("LL collective flag from rank", 1)),
        ll_restart(c.signals("LL scratch restart", 1)),
        push(push_config(c.world())) {
    // Creating ll_sig above quiesced every rank after this scratch and the state were allocated:
    // nothing still running (an earlier owner's call, here or on a peer) writes into them any more.
    WEAVE_CUDA_CHECK(cudaMemset(ll_scratch.data(), 0, ll_scratch.bytes()));
    WEAVE_CUDA_CHECK(cudaMemset(state.data(), 0, state.bytes()));
    WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
    c.barrier();  // no peer writes a line before every rank zeroed its scratch
    std::vector<int> sms(c.world());
    int mine = c.sm_count();
    c.bootstrap().all_gather(&mine, sms.data(), sizeof mine);
    blocks_max = *std::min_element(sms.begin(), sms.end());
    ll128_links = nvlink_everywhere(c);
  }

  // ll128_links_ok (plan.hpp) over every pair of this node's GPUs that ranks run on (devices
  // 0..W-1, fewer where ranks share GPUs), as each rank sees them, and agreed by every rank: the
  // algorithm choice must be the same everywhere.
  static bool nvlink_everywhere(runtime::Communicator& c) {
    int ndev = 0;
    WEAVE_CUDA_CHECK(cudaGetDeviceCount(&ndev));
    const int W = std::min(c.world(), ndev);
    std::vector<PeerLink> links(static_cast<size_t>(W) * W);
    for (int i = 0; i < W; ++i)
      for (int j = 0; j < W; ++j) {
        if (i == j) continue;
        int access = 0, atomics = 0;
        WEAVE_CUDA_CHECK(cudaDeviceGetP2PAttribute(&access, cudaDevP2PAttrAccessSupported, i, j));
        WEAVE_CUDA_CHECK(cudaDeviceGetP2PAttribute(&atomics, cudaDevP2PAttrNativeAtomicSupported, i, j));
        links[i * W + j] = {access != 0, atomics != 0};
      }
    const int mine = ll128_links_ok(links.data(), W) ? 1 : 0;
    std::vector<int> all(c.world());
    c.bootstrap().all_gather(&mine, all.data(), sizeof mine);
    return std::all_of(all.begin(), all.end(), [](int x) { return x != 0; });
  }
  AlgoEnv algo_env() const { return {comm.world(), ll128_links, ll128_fits(), push_fits()}; }

  // Every call: the arguments agreed across ranks (Communicator::agree_call: together at a plan's
  // first call, then each rank's post compared without waiting), with whether this rank found a
  // `problem` in its own (shape, alignment, buffers in the heap or registered), and the places of
  // the buffers that peers reach (`peer_buffers`, from the algorithm: the same list on every rank).
  void check_args(const char* kind, const std::vector<long long>& a, const std::string& problem, cudaStream_t s,
                  Reached reach = {}, const void* in = nullptr, const void* out = nullptr) {
    std::vector<const void*> peer_buffers;
    if (reach.in) peer_buffers.push_back(in);
    if (reach.out) peer_buffers.push_back(out);
    comm.agree_call(std::string("collectives.") + kind, "dtype, op, shape, dim, algorithm", a, problem, s, peer_buffers);
  }

  // `work` (bytes) must be the same on every rank: it sizes the grid, and every rank must know
  // every rank's grid to count the "done" signals it waits for.
  void launch(Kind kind, const Plan& plan, const void* in, size_t in_bytes, void* out, size_t out_bytes, DType t,
              ReduceOp op, long long work, cudaStream_t s) {
    const int W = comm.world(), elt = static_cast<int>(dtype_size(t));
    const runtime::PeerPtrs pin = comm.peers(in, in_bytes);
    const runtime::PeerPtrs pout = comm.peers(out, out_bytes);
    Launch L{};
    unsigned long long total = 0;
    for (int j = 0; j < plan.n; ++j) {
      const Xfer& x = plan.x[j];
      DevXfer& d = L.x[L.n++];
      d.nsrc = x.nsrc;
      d.ndst = x.ndst;
      for (int i = 0; i < x.nsrc; ++i) d.src[i] = static_cast<const char*>(pin[x.src_rank[i]]) + x.src_off;
      for (int i = 0; i < x.ndst; ++i) d.dst[i] = static_cast<char*>(pout[x.dst_rank[i]]) + x.dst_off;
      d.vec = largest_vec({x.row_bytes, x.src_pitch, x.dst_pitch, x.src_outer_pitch, x.dst_outer_pitch}, elt);
      // Every rank's pointer, not only the first: a registered buffer may sit at another offset
      // modulo 16 on a peer, and a vector access there would fault.
      for (int i = 0; i < x.nsrc; ++i) d.vec = std::min(d.vec, largest_vec({reinterpret_cast<long long>(d.src[i])}, elt));
      for (int i = 0; i < x.ndst; ++i) d.vec = std::min(d.vec, largest_vec({reinterpret_cast<long long>(d.dst[i])}, elt));
      const unsigned long long upr = x.row_bytes / d.vec, units = upr * x.rows * x.outer;
      WEAVE_CHECK(units < (1ull << 32), "collective transfer of ", units, " units of ", d.vec,
                  " bytes is too large for one launch");
      d.upr = static_cast<unsigned>(upr);
      d.rows = static_cast<unsigned>(x.rows);
      d.units = units;
      d.src_outer_pitch = x.src_outer_pitch;
      d.dst_outer_pitch = x.dst_outer_pitch;
      d.src_pitch = x.src_pitch;
      d.dst_pitch = x.dst_pitch;
      WEAVE_CHECK(x.nsrc <= direct_sources(kind, W), "collectives: internal error: a transfer of ", x.nsrc,
                  " sources in a plan of at most ", direct_sources(kind, W));
      total += units;
    }
    const DirectShape shape = direct_shape(kind, W);
    const long long per_block = shape == DirectShape::copy   ? block_bytes<CopyShape>()
                                : shape == DirectShape::pair ? block_bytes<PairShape>()
                                                             : block_bytes<ReduceShape>();
    const int blocks = static_cast<int>(std::clamp<long long>((work + per_block - 1) / per_block, 1, blocks_max));
    L.sig = sig.view();
    L.st = call_state();
    if (shape == DirectShape::copy) {  // bytes are bytes: one instantiation serves every dtype
      launch_pdl(collective_kernel<__nv_bfloat16, ReduceOp::sum, CopyShape>, blocks, CopyShape::Threads, s, L);
    } else if (shape == DirectShape::pair) {
      dispatch<PairShape>(L, blocks, t, op, s);
    } else {
      dispatch<ReduceShape>(L, blocks, t, op, s);
    }
  }

  void ulysses(bool to_head, const void* in, void* out, long long B, long long S, long long H,
               long long D, DType t, cudaStream_t s) {
    const int W = comm.world(), r = comm.rank(), elt = static_cast<int>(dtype_size(t));
    long long in_bytes = 0, out_bytes = 0;
    check_args(to_head ? "all_to_all.seq_to_head" : "all_to_all.head_to_seq",
               {3 + (to_head ? 1 : 0), static_cast<long long>(t), B, S, H, D}, runtime::local_problem([&] {
                 WEAVE_CHECK(B >= 0 && S >= 0 && H > 0 && D > 0, "all_to_all: bad shape B=", B, " S=", S, " H=", H,
                             " D=", D);
                 WEAVE_CHECK(H % W == 0, "all_to_all: ", H, " heads do not divide among ", W, " ranks");
                 check_aligned("all_to_all", in, out, t);
                 if (B == 0 || S == 0) return;
                 const long long seq_part = B * shard(S, W, r).size * H * D * elt,
                                 head_part = B * S * (H / W) * D * elt;
                 in_bytes = to_head ? seq_part : head_part, out_bytes = to_head ? head_part : seq_part;
                 WEAVE_CHECK(!bytes_overlap(addr(in), in_bytes, addr(out), out_bytes), "all_to_all: input ", in,
                             " and output ", out, " overlap (the layouts differ: it cannot run in place)");
                 comm.peers(in, std::max<long long>(in_bytes, 1));
                 comm.peers(out, std::max<long long>(out_bytes, 1));
               }), s, B == 0 || S == 0 ? Reached{} : reached_ulysses(), in, out);
    if (B == 0 || S == 0) return;
    const bool cap = runtime::capturing(s);
    order.before(s, cap);
    launch(to_head ? Kind::seq_to_head : Kind::head_to_seq, plan_ulysses(to_head, B, S, H, D, elt, W, r), in,
           std::max<long long>(in_bytes, 1), out, std::max<long long>(out_bytes, 1), t, ReduceOp::sum,
           B * S * H * D * elt / W, s);
    order.after(s, cap);
  }

  // all_gather (gather) / reduce_scatter: this rank's checks (shape, alignment, the algorithm
  // that `pick` chooses, buffers in the heap or registered), then the cross-rank check. n: the
  // full tensor's elements, mine: this rank's shard's.
  template <class Pick>
  ShardAlgo check_shard_call(bool gather, const void* in, const void* out, const Shape& full, int dim, DType t,
                             ReduceOp op, long long& n, long long& mine, cudaStream_t s, Pick&& pick) {
    const int elt = static_cast<int>(dtype_size(t));
    ShardAlgo algo = ShardAlgo::direct;
    const std::string problem = runtime::local_problem([&] {
      check_shape(full, dim);
      check_aligned(gather ? "all_gather" : "reduce_scatter", in, out, t);
      algo = pick();
      if (algo == ShardAlgo::ll128) check_prepared(ll128_scratch.has_value(), runtime::capturing(s), "LL128 scratch");
      n = full.numel();
      if (n == 0) return;
      mine = n / full.d[dim] * shard(full.d[dim], comm.world(), comm.rank()).size;
      const long long full_bytes = n * elt;
      WEAVE_CHECK(shard_overlap(gather, addr(in), addr(out), full, dim, elt, comm.world(), comm.rank()) !=
                      Overlap::bad,
                  gather ? "all_gather" : "reduce_scatter", ": input ", in, " (", gather ? mine * elt : full_bytes,
                  " bytes) and output ", out, " (", gather ? full_bytes : mine * elt,
                  " bytes) overlap; the only overlap allowed is in place, with the shard being this rank's slice of "
                  "the full tensor, which must then be contiguous (dim 0, or every dimension before dim of size 1)");
      check_buffers(gather ? "all_gather" : "reduce_scatter", algo, in, gather ? mine * elt : full_bytes, out,
                    gather ? full_bytes : mine * elt);
    });
    check_args(gather ? "all_gather" : "reduce_scatter", shape_args(gather ? 1 : 2, t, op, full, dim, algo), problem, s,
               full.numel() == 0 ? Reached{} : reached(algo, gather), in, out);
    return algo;
  }

  // A call's own buffers, `in_bytes` and `out_bytes` long (0: none used): every algorithm needs
  // them that long (Communicator::check_buffer, an error naming the buffer); where peers reach
  // them (not the LL family's, which only this rank touches) they must also be in the heap or
  // registered (Communicator::peers, which wants at least one byte).
  template <class Algo>
  void check_buffers(const char* who, Algo algo, const void* in, long long in_bytes, const void* out,
                     long long out_bytes) const {
    comm.check_buffer(who, "in", in, static_cast<size_t>(in_bytes));
    comm.check_buffer(who, "out", out, static_cast<size_t>(out_bytes));
    if (local_buffers(algo)) return;
    comm.peers(in, static_cast<size_t>(std::max<long long>(in_bytes, 1)));
    comm.peers(out, static_cast<size_t>(std::max<long long>(out_bytes, 1)));
  }

  CallState* call_state() { return reinterpret_cast<CallState*>(state.data()); }

  // An LL-family call's arguments (LLArgs or LLShardArgs) but its size or plan: its buffers, this
  // rank's alone (local_buffers); the slots of both parities in `scratch` (slot[p][q]: where this
  // rank's lines go in q's scratch, mine[p][r]: where rank r's lines arrive here); the device
  // count; and what a restart zeroes (every LL-family scratch of this rank).
  template <class Args>
  Args ll_args(const void* in, void* out, runtime::SymmetricTensor<unsigned long long>& scratch, size_t slot_words) {
    Args a{};
    a.in = static_cast<const unsigned char*>(in);
    a.out = static_cast<unsigned char*>(out);
    LLCommon& c = a.ll;
    const int W = comm.world(), me = comm.rank();
    const runtime::PeerPtrs sp = comm.peers(scratch.data(), scratch.bytes());
    for (int p = 0; p < 2; ++p)
      for (int r = 0; r < W; ++r) {
        c.slot[p][r] = static_cast<unsigned long long*>(sp[r]) + (p * W + me) * slot_words;
        c.mine[p][r] = scratch.data() + (p * W + r) * slot_words;
      }
    c.st = call_state();
    c.period = ll_period;
    c.sig = ll_sig.view();
    c.restart = ll_restart.view();
    c.zero[0] = ll_scratch.data();
    c.zero_words[0] = ll_scratch.size();
    if (ll128_scratch) {
      c.zero[1] = ll128_scratch->data();
      c.zero_words[1] = ll128_scratch->size();
    }
    return a;
  }
  // Scratch that only an eager call may make (it allocates, zeroes and synchronizes): under
  // capture a call that would need it is an error on every rank (every rank's state is the same).
  static void check_prepared(bool ready, bool capturing, const char* what) {
    if (!ready && capturing)
      throw runtime::NotPrepared(std::string("collectives: the ") + what +
                                 " is made by the first call that uses it, which cannot be inside a CUDA graph "
                                 "capture (it allocates and synchronizes); make one eager call of this kind first");
  }
  // Blocks for `lines` lines at `per_block` lines per block (LL: one per thread; LL128: one per
  // 8 threads), at most one per SM.
  int line_blocks(long long lines, int per_block) const {
    return static_cast<int>(std::clamp<long long>((lines + per_block - 1) / per_block, 1, blocks_max));
  }

  void ll_all_reduce(const void* in, void* out, long long bytes, DType t, ReduceOp op, cudaStream_t s) {
    LLArgs a = ll_args<LLArgs>(in, out, ll_scratch, kLLLines);
    a.bytes = bytes;
    const int blocks = line_blocks((bytes + 3) / 4, kLLThreads);
    by_type_and_op(t, op,
                   [&]<class T, ReduceOp Op>() { launch_pdl(ll_all_reduce_kernel<T, Op>, blocks, kLLThreads, s, a); });
  }

  // LL all_gather (gather) or reduce_scatter; the grid covers one rank's share of the lines.
  void ll_shard(bool gather, const LLPlan& plan, const void* in, void* out, DType t,
                ReduceOp op, cudaStream_t s) {
    LLShardArgs a = ll_args<LLShardArgs>(in, out, ll_scratch, kLLLines);
    a.plan = plan;
    const int blocks = line_blocks(plan.max_lines, kLLThreads);
    if (gather) {
      launch_pdl(ll_all_gather_kernel, blocks, kLLThreads, s, a);
      WEAVE_CUDA_CHECK(cudaGetLastError());
    } else {
      by_type_and_op(t, op,
                     [&]<class T, ReduceOp Op>() { launch_pdl(ll_reduce_scatter_kernel<T, Op>, blocks, kLLThreads, s, a); });
    }
  }

  // LL128 scratch bytes (2 parities x world sources) and whether it exists or fits in the heap.
  long long ll128_heap_bytes() const {
    return static_cast<long long>(2 * comm.world() * ll128_slot_words() * sizeof(unsigned long long));
  }
  bool ll128_fits() const {
    return ll128_scratch || comm.heap_fits(static_cast<size_t>(ll128_heap_bytes()));
  }
  // Makes the LL128 scratch on the first LL128 call (collective; every rank decided alike),
  // zeroed on every rank before any rank writes a line into it.
  void ll128_ready(cudaStream_t s) {
    if (ll128_scratch) return;
    ll128_scratch.emplace(comm, 2 * comm.world() * ll128_slot_words());
    WEAVE_CUDA_CHECK(cudaMemsetAsync(ll128_scratch->data(), 0, ll128_scratch->bytes(), s));
    WEAVE_CUDA_CHECK(cudaStreamSynchronize(s));
    comm.barrier();
  }
  static constexpr int kLL128LinesPerBlock = kLL128Threads / kLL128Pieces;
  void ll128_all_reduce(const void* in, void* out, long long bytes, DType t, ReduceOp op, cudaStream_t s) {
    ll128_ready(s);
    LLArgs a = ll_args<LLArgs>(in, out, *ll128_scratch, ll128_slot_words());
    a.bytes = bytes;
    a.lag = kLL128Lag;
    const int blocks = line_blocks(ll_lines((bytes + 3) / 4, kLL128Words), kLL128LinesPerBlock);
    by_type_and_op(t, op, [&]<class T, ReduceOp Op>() {
      launch_pdl(ll128_all_reduce_kernel<T, Op>, blocks, kLL128Threads, s, a);
    });
  }
  void ll128_shard(bool gather, const LLPlan& plan, const void* in, void* out, DType t, ReduceOp op, cudaStream_t s) {
    ll128_ready(s);
    LLShardArgs a = ll_args<LLShardArgs>(in, out, *ll128_scratch, ll128_slot_words());
    a.plan = plan;
    a.lag = kLL128Lag;
    const int blocks = line_blocks(plan.max_lines, kLL128LinesPerBlock);
    if (gather) {
      launch_pdl(ll128_all_gather_kernel, blocks, kLL128Threads, s, a);
      WEAVE_CUDA_CHECK(cudaGetLastError());
    } else {
      by_type_and_op(t, op, [&]<class T, ReduceOp Op>() {
        launch_pdl(ll128_reduce_scatter_kernel<T, Op>, blocks, kLL128Threads, s, a);
      });
    }
  }

  int push_pipes() const { return blocks_max * push.threads / 32; }
  // Bytes the first push call allocates: the scratch and the counters, each rounded to 256.
  long long push_heap_bytes() const {
    const int W = comm.world();
    auto round = [](long long b) { return (std::max<long long>(b, 1) + 255) / 256 * 256; };
    return round(push_scratch_bytes(W, push_pipes(), push.slot_bytes, push.slots)) +
           round(2LL * push_pipes() * W * static_cast<long long>(sizeof(unsigned long long)));
  }
  bool push_fits() const {
    return push_scratch || comm.heap_fits(static_cast<size_t>(push_heap_bytes()));
  }

  // Makes the scratch and counters on the first push call (collective: every rank calls it at the
  // same call). An allocation failure is the same on every rank (the heap's state is); with
  // `may_fail` (automatic chose push) it means "take two-shot", else it is the caller's error.
  bool push_ready(bool may_fail) {
    if (push_scratch) return true;
    const int W = comm.world(), pipes = push_pipes();
    try {
      push_scratch.emplace(comm, std::max<long long>(push_scratch_bytes(W, pipes, push.slot_bytes, push.slots), 256));
      push_sig.emplace(comm.signals("push all_reduce (data: pipe*W+src, free: (pipes+pipe)*W+dst)", 2 * pipes * W));
    } catch (const Error&) {
      push_sig.reset();
      push_scratch.reset();
      if (!may_fail) throw;
      return false;
    }
    return true;
  }

  // Push all_reduce on blocks_max blocks, one pipe per warp (every call runs every pipe: the
  // counters' totals stay one number, push_steps).
  void push_all_reduce(const void* in, void* out, long long bytes, DType t, ReduceOp op, cudaStream_t s) {
    const int W = comm.world(), elt = static_cast<int>(dtype_size(t)), pipes = push_pipes();
    PushArgs a{};
    a.in = static_cast<const char*>(in);
    const runtime::PeerPtrs pout = comm.peers(out, bytes);
    const runtime::PeerPtrs ps = comm.peers(push_scratch->data(), push_scratch->bytes());
    a.vec = largest_vec({reinterpret_cast<long long>(in)}, elt);
    for (int q = 0; q < W; ++q) {
      a.out[q] = static_cast<char*>(pout[q]);
      a.scratch[q] = static_cast<char*>(ps[q]);
      a.vec = std::min(a.vec, largest_vec({reinterpret_cast<long long>(pout[q])}, elt));
    }
    a.plan = plan_push_all_reduce(bytes, W, pipes, push.slot_bytes, push.slots, 16 * 32);
    a.sig = push_sig->view();
    a.st = call_state();
    by_type_and_op(t, op, [&]<class T, ReduceOp Op>() {
      if (W <= PairShape::MaxSrc)
        launch_pdl(push_all_reduce_kernel<T, Op, PairShape>, blocks_max, PairShape::Threads, s, a);
      else
        launch_pdl(push_all_reduce_kernel<T, Op, ReduceShape>, blocks_max, ReduceShape::Threads, s, a);
    });
  }

  template <class S>
  void dispatch(const Launch& L, int blocks, DType t, ReduceOp op, cudaStream_t s) {
    by_type_and_op(t, op,
                   [&]<class T, ReduceOp Op>() { launch_pdl(collective_kernel<T, Op, S>, blocks, S::Threads, s, L); });
  }
};

Collectives::Collectives(runtime::Communicator& comm) : impl_(std::make_unique<Impl>(comm)) {}
// The members return the object's counters and scratch to the heap, where the next allocation
// zeroes them; a call still running on this device or on a peer would then add into the new
// owner's memory. So every rank first waits until no rank has device work left (collective).
Collectives::~Collectives() {
  if (impl_) impl_->comm.quiesce();
}

void Collectives::set_all_reduce_algo(AllReduceAlgo a) { impl_->algo = a; }

AllReduceAlgo Collectives::all_reduce_algo(size_t bytes, bool in_place, bool aligned4) const {
  return choose_all_reduce(impl_->algo, impl_->algo_env(), bytes, in_place, aligned4);
}

void Collectives::all_reduce(const void* in, void* out, size_t count, DType t, ReduceOp op, cudaStream_t s) {
  Impl& m = *impl_;
  const long long bytes = static_cast<long long>(count * dtype_size(t));
  const bool cap = runtime::capturing(s);
  AllReduceAlgo algo = all_reduce_algo(bytes, in == out, aligned4(in, out));
  // Push's scratch is made by an eager call; a captured call the automatic choice sent to push
  // before any eager one did takes two-shot (the same on every rank: the scratch exists on all or none).
  if (algo == AllReduceAlgo::push && cap && !m.push_scratch && m.algo == AllReduceAlgo::automatic)
    algo = AllReduceAlgo::two_shot;
  // The algorithm is compared too: it depends on local pointers, and ranks must agree on it.
  m.check_args("all_reduce", {100, static_cast<long long>(t), static_cast<long long>(op), static_cast<long long>(count),
                static_cast<long long>(algo)},
               runtime::local_problem([&] {
                 check_aligned("all_reduce", in, out, t);
                 if (algo == AllReduceAlgo::ll128) Impl::check_prepared(m.ll128_scratch.has_value(), cap, "LL128 scratch");
                 if (algo == AllReduceAlgo::push) Impl::check_prepared(m.push_scratch.has_value(), cap, "push scratch");
                 if (count == 0) return;
                 WEAVE_CHECK(all_reduce_overlap(addr(in), addr(out), bytes) != Overlap::bad,
                             "all_reduce: input ", in, " and output ", out, " (", bytes,
                             " bytes each) overlap without being the same buffer; in place means in == out");
                 m.check_buffers("all_reduce", algo, in, bytes, out, bytes);
               }),
               // Whether the push scratch exists is the same on every rank.
               s, count == 0 ? Reached{} : reached(algo, m.algo == AllReduceAlgo::push || m.push_scratch.has_value()),
               in, out);
  if (count == 0) return;
  m.order.before(s, cap);
  if (algo == AllReduceAlgo::ll) {
    m.ll_all_reduce(in, out, bytes, t, op, s);
  } else if (algo == AllReduceAlgo::ll128) {
    m.ll128_all_reduce(in, out, bytes, t, op, s);
  } else if (algo == AllReduceAlgo::push && m.push_ready(m.algo == AllReduceAlgo::automatic)) {
    m.push_all_reduce(in, out, bytes, t, op, s);
  } else {
    const bool two = algo != AllReduceAlgo::one_shot;
    const int W = m.comm.world();
    m.launch(two ? Kind::all_reduce_two_shot : Kind::all_reduce_one_shot, plan_all_reduce(two, bytes, W, m.comm.rank()),
             in, bytes, out, bytes, t, op, two ? bytes / W : bytes, s);
  }
  m.order.after(s, cap);
}

void Collectives::all_gather(const void* in, void* out, const Shape& full, int dim, DType t, cudaStream_t s) {
  Impl& m = *impl_;
  const int W = m.comm.world(), r = m.comm.rank(), elt = static_cast<int>(dtype_size(t));
  long long n = 0, mine = 0;
  const ShardAlgo algo = m.check_shard_call(true, in, out, full, dim, t, ReduceOp::sum, n, mine, s, [&] {
    return all_gather_algo(full, dim, t, aligned4(in, out));
  });
  if (n == 0) return;
  const bool cap = runtime::capturing(s);
  m.order.before(s, cap);
  if (algo == ShardAlgo::ll)
    m.ll_shard(true, plan_ll_all_gather(full, dim, elt, W, r), in, out, t, ReduceOp::sum, s);
  else if (algo == ShardAlgo::ll128)
    m.ll128_shard(true, plan_ll_all_gather(full, dim, elt, W, r, kLL128Words), in, out, t, ReduceOp::sum, s);
  else
    m.launch(Kind::all_gather, plan_all_gather(full, dim, elt, W, r), in, std::max<long long>(mine * elt, 1), out,
             n * elt, t, ReduceOp::sum, n * elt, s);
  m.order.after(s, cap);
}

void Collectives::reduce_scatter(const void* in, void* out, const Shape& full, int dim, DType t, ReduceOp op,
                                 cudaStream_t s) {
  Impl& m = *impl_;
  const int W = m.comm.world(), r = m.comm.rank(), elt = static_cast<int>(dtype_size(t));
  long long n = 0, mine = 0;
  const ShardAlgo algo = m.check_shard_call(false, in, out, full, dim, t, op, n, mine, s, [&] {
    return reduce_scatter_algo(full, dim, t, aligned4(in, out));
  });
  if (n == 0) return;
  const bool cap = runtime::capturing(s);
  m.order.before(s, cap);
  if (algo == ShardAlgo::ll)
    m.ll_shard(false, plan_ll_reduce_scatter(full, dim, elt, W, r), in, out, t, op, s);
  else if (algo == ShardAlgo::ll128)
    m.ll128_shard(false, plan_ll_reduce_scatter(full, dim, elt, W, r, kLL128Words), in, out, t, op, s);
  else
    m.launch(Kind::reduce_scatter, plan_reduce_scatter(full, dim, elt, W, r), in, n * elt, out,
             std::max<long long>(mine * elt, 1), t, op, n * elt / W, s);
  m.order.after(s, cap);
}

void Collectives::set_ll_flag_period(unsigned period) {
  WEAVE_CHECK(period >= 3 && period % 2 == 1, "set_ll_flag_period: the period must be odd and at least 3, got ", period);
  impl_->comm.check_same("the LL flag period", {static_cast<long long>(period)});
  impl_->ll_period = period;
}
void Collectives::set_all_gather_algo(ShardAlgo a) { impl_->ag_algo = a; }
void Collectives::set_reduce_scatter_algo(ShardAlgo a) { impl_->rs_algo = a; }
ShardAlgo Collectives::all_gather_algo(const Shape& full, int dim, DType t, bool aligned) const {
  return choose_shard(impl_->ag_algo, true, impl_->algo_env(), full, dim, static_cast<int>(dtype_size(t)), aligned);
}
ShardAlgo Collectives::reduce_scatter_algo(const Shape& full, int dim, DType t, bool aligned) const {
  return choose_shard(impl_->rs_algo, false, impl_->algo_env(), full, dim, static_cast<int>(dtype_size(t)), aligned);
}

void Collectives::all_to_all_seq_to_head(const void* in, void* out, long long B, long long S, long long H, long long D,
                                         DType t, cudaStream_t s) {
  impl_->ulysses(true, in, out, B, S, H, D, t, s);
}
void Collectives::all_to_all_head_to_seq(const void* in, void* out, long long B, long long S, long long H, long long D,
                                         DType t, cudaStream_t s) {
  impl_->ulysses(false, in, out, B, S, H, D, t, s);
}

}  // namespace weave::coll
