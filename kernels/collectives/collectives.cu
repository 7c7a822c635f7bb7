// Host entry of the collectives: validate, plan, launch one kernel per call.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "collectives/collectives.hpp"
#include "collectives/kernel.cuh"
#include "collectives/plan.hpp"
#include "weave/common/error.hpp"

namespace weave::coll {

namespace {

// Bytes of work per block: one 16-byte unit per thread and step, so that small calls spread
// over many SMs and finish in one round trip of peer accesses.
template <class S>
constexpr long long block_bytes() {
  return S::Threads * 16;
}

int largest_vec(std::initializer_list<long long> v, int elt) {
  int vec = 16;
  for (long long x : v)
    while (vec > elt && x % vec) vec /= 2;
  return vec;
}

// A transfer's geometry with resolved source and destination addresses.
DevXfer to_dev(const Xfer& x, const char* const* src, char* const* dst, int elt) {
  DevXfer d{};
  d.nsrc = x.nsrc;
  d.ndst = x.ndst;
  long long vec_args_src = 0, vec_args_dst = 0;
  for (int i = 0; i < x.nsrc; ++i) {
    d.src[i] = src[i];
    vec_args_src |= reinterpret_cast<long long>(src[i]);
  }
  for (int i = 0; i < x.ndst; ++i) {
    d.dst[i] = dst[i];
    vec_args_dst |= reinterpret_cast<long long>(dst[i]);
  }
  d.vec = largest_vec({vec_args_src, vec_args_dst, x.row_bytes, x.src_pitch, x.dst_pitch, x.src_outer_pitch,
                       x.dst_outer_pitch},
                      elt);
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
  return d;
}

}  // namespace

struct Collectives::Impl {
  runtime::Communicator& comm;
  runtime::SignalSet sig;
  int blocks_max;  // the smallest SM count of all ranks: every rank launches the same grid
  unsigned long long arrived = 0, done = 0;
  AllReduceAlgo algo = AllReduceAlgo::automatic;

  // push all_reduce: scratch[parity][source rank] on every rank, and the running signal totals
  runtime::SymmetricTensor<char> scratch;
  unsigned long long push_calls = 0, ready = 0, consumed_hist[3] = {0, 0, 0};

  explicit Impl(runtime::Communicator& c)
      : comm(c), sig(c.signals("collectives", 4)), scratch(c, 2 * c.world() * kPushMaxBytes) {
    std::vector<int> sms(c.world());
    int mine = c.sm_count();
    c.bootstrap().all_gather(&mine, sms.data(), sizeof mine);
    blocks_max = *std::min_element(sms.begin(), sms.end());
  }

  // Every call: the check is a few host cache-line transfers (Communicator::check_same).
  void check_args(const std::vector<long long>& a) {
    comm.check_same("collective arguments (kind, dtype, op, shape, dim)", a);
  }

  // `work` (bytes) must be the same on every rank: it sizes the grid, and every rank must know
  // every rank's grid to count the "done" signals it waits for.
  void launch(const Plan& plan, const void* in, size_t in_bytes, void* out, size_t out_bytes, DType t, ReduceOp op,
              long long work, cudaStream_t s) {
    const int W = comm.world(), elt = static_cast<int>(dtype_size(t));
    const runtime::PeerPtrs pin = comm.peers(in, in_bytes);
    const runtime::PeerPtrs pout = comm.peers(out, out_bytes);
    Launch L{};
    for (int j = 0; j < plan.n; ++j) {
      const Xfer& x = plan.x[j];
      const char* src[kMaxWorld];
      char* dst[kMaxWorld];
      for (int i = 0; i < x.nsrc; ++i) src[i] = static_cast<const char*>(pin[x.src_rank[i]]) + x.src_off;
      for (int i = 0; i < x.ndst; ++i) dst[i] = static_cast<char*>(pout[x.dst_rank[i]]) + x.dst_off;
      L.x[L.n++] = to_dev(x, src, dst, elt);
    }
    bool copy = true;
    for (int j = 0; j < plan.n; ++j) copy = copy && plan.x[j].nsrc == 1;
    const long long per_block = copy ? block_bytes<CopyShape>() : block_bytes<ReduceShape>();
    const int blocks = static_cast<int>(std::clamp<long long>((work + per_block - 1) / per_block, 1, blocks_max));
    arrived += arrivals_per_call(W);
    done += dones_per_call(W, blocks);
    L.split = L.n;
    L.sig = sig.view();
    L.arrive_expect = arrived;
    L.done_expect = done;
    if (copy) {  // bytes are bytes: one instantiation serves every dtype
      collective_kernel<__nv_bfloat16, ReduceOp::sum, CopyShape><<<blocks, CopyShape::Threads, 0, s>>>(L);
      WEAVE_CUDA_CHECK(cudaGetLastError());
    } else {
      dispatch(L, blocks, t, op, s);
    }
  }

  void ulysses(bool to_head, const void* in, void* out, long long B, long long S, long long H,
               long long D, DType t, cudaStream_t s) {
    const int W = comm.world(), r = comm.rank(), elt = static_cast<int>(dtype_size(t));
    WEAVE_CHECK(B >= 0 && S >= 0 && H > 0 && D > 0, "all_to_all: bad shape B=", B, " S=", S, " H=", H, " D=", D);
    WEAVE_CHECK(H % W == 0, "all_to_all: ", H, " heads do not divide among ", W, " ranks");
    check_args({3 + (to_head ? 1 : 0), static_cast<long long>(t), B, S, H, D});
    if (B == 0 || S == 0) return;
    const long long seq_part = B * shard(S, W, r).size * H * D * elt, head_part = B * S * (H / W) * D * elt;
    const long long in_bytes = to_head ? seq_part : head_part, out_bytes = to_head ? head_part : seq_part;
    launch(plan_ulysses(to_head, B, S, H, D, elt, W, r), in, std::max<long long>(in_bytes, 1), out,
             std::max<long long>(out_bytes, 1), t, ReduceOp::sum, B * S * H * D * elt / W, s);
  }

  // all_reduce by push: this rank's input goes into slot [parity][rank] of every rank's scratch,
  // then each rank reduces its W local slots into its output.
  void push_all_reduce(const void* in, void* out, long long bytes, DType t, ReduceOp op, cudaStream_t s) {
    const int W = comm.world(), me = comm.rank(), elt = static_cast<int>(dtype_size(t));
    comm.peers(in, bytes);  // same rules as every collective: heap or registered buffers
    comm.peers(out, bytes);
    const int parity = static_cast<int>(push_calls % 2);
    const runtime::PeerPtrs sp = comm.peers(scratch.data(), scratch.bytes());
    auto slot = [&](int rank_of_copy, int src) {
      return static_cast<char*>(sp[rank_of_copy]) + (size_t(parity) * W + src) * Collectives::kPushMaxBytes;
    };
    Xfer x;
    x.row_bytes = bytes;
    Launch L{};
    {  // push: my input -> slot [parity][me] on every rank
      x.nsrc = 1;
      x.ndst = W;
      const char* src[1] = {static_cast<const char*>(in)};
      char* dst[kMaxWorld];
      for (int q = 0; q < W; ++q) dst[q] = slot(staggered(me, q, W), me);
      L.x[L.n++] = to_dev(x, src, dst, elt);
    }
    {  // reduce: my W slots -> my output
      x.nsrc = W;
      x.ndst = 1;
      const char* src[kMaxWorld];
      for (int r = 0; r < W; ++r) src[r] = slot(me, r);
      char* dst[1] = {static_cast<char*>(out)};
      L.x[L.n++] = to_dev(x, src, dst, elt);
    }
    const long long per_block = block_bytes<ReduceShape>();
    const int blocks = static_cast<int>(std::clamp<long long>((bytes + per_block - 1) / per_block, 1, blocks_max));
    // consumed_hist[k]: the consumed total after the push call k calls back (0: this one).
    consumed_hist[2] = consumed_hist[1];
    consumed_hist[1] = consumed_hist[0];
    consumed_hist[0] += dones_per_call(W, blocks);
    ready += dones_per_call(W, blocks);
    ++push_calls;
    L.split = 1;
    L.push = true;
    L.sig = sig.view();
    L.ready_expect = ready;
    L.consumed_expect = consumed_hist[2];
    dispatch(L, blocks, t, op, s);
  }

  void dispatch(const Launch& L, int blocks, DType t, ReduceOp op, cudaStream_t s) {
#define WEAVE_COLL_LAUNCH(T, OP) collective_kernel<T, OP, ReduceShape><<<blocks, ReduceShape::Threads, 0, s>>>(L)
    auto by_op = [&](auto tag) {
      using T = decltype(tag);
      if (op == ReduceOp::sum) WEAVE_COLL_LAUNCH(T, ReduceOp::sum);
      else if (op == ReduceOp::max) WEAVE_COLL_LAUNCH(T, ReduceOp::max);
      else WEAVE_COLL_LAUNCH(T, ReduceOp::min);
    };
#undef WEAVE_COLL_LAUNCH
    if (t == DType::bf16) by_op(__nv_bfloat16{});
    else if (t == DType::fp16) by_op(__half{});
    else by_op(float{});
    WEAVE_CUDA_CHECK(cudaGetLastError());
  }
};

Collectives::Collectives(runtime::Communicator& comm) : impl_(std::make_unique<Impl>(comm)) {}
Collectives::~Collectives() = default;

void Collectives::set_all_reduce_algo(AllReduceAlgo a) { impl_->algo = a; }

AllReduceAlgo Collectives::all_reduce_algo(size_t bytes, bool in_place) const {
  AllReduceAlgo a = impl_->algo;
  if (a == AllReduceAlgo::automatic) a = bytes <= kPushMaxBytes ? AllReduceAlgo::push : AllReduceAlgo::two_shot;
  if (a == AllReduceAlgo::push && bytes > kPushMaxBytes) a = AllReduceAlgo::two_shot;  // scratch is that large
  if (a == AllReduceAlgo::one_shot && in_place) a = AllReduceAlgo::two_shot;  // would overwrite what peers read
  return a;
}

namespace {
std::vector<long long> shape_args(int kind, DType t, ReduceOp op, const Shape& s, int dim) {
  return {kind, static_cast<long long>(t), static_cast<long long>(op), s.ndim, s.d[0], s.d[1], s.d[2], s.d[3], dim};
}
void check_shape(const Shape& s, int dim) {
  WEAVE_CHECK(s.ndim >= 1 && s.ndim <= 4, "collective: tensors have 1 to 4 dimensions, got ", s.ndim);
  for (int i = 0; i < s.ndim; ++i) WEAVE_CHECK(s.d[i] >= 0, "collective: negative dimension ", s.d[i]);
  WEAVE_CHECK(dim >= 0 && dim < s.ndim, "collective: dim ", dim, " outside 0..", s.ndim - 1);
}
}  // namespace

void Collectives::all_reduce(const void* in, void* out, size_t count, DType t, ReduceOp op, cudaStream_t s) {
  Impl& m = *impl_;
  m.check_args({100, static_cast<long long>(t), static_cast<long long>(op), static_cast<long long>(count)});
  if (count == 0) return;
  const long long bytes = static_cast<long long>(count * dtype_size(t));
  const AllReduceAlgo algo = all_reduce_algo(bytes, in == out);
  if (algo == AllReduceAlgo::push) return m.push_all_reduce(in, out, bytes, t, op, s);
  const bool two = algo == AllReduceAlgo::two_shot;
  const int W = m.comm.world();
  m.launch(plan_all_reduce(two, bytes, W, m.comm.rank()), in, bytes, out, bytes, t, op, two ? bytes / W : bytes, s);
}

void Collectives::all_gather(const void* in, void* out, const Shape& full, int dim, DType t, cudaStream_t s) {
  Impl& m = *impl_;
  check_shape(full, dim);
  m.check_args(shape_args(1, t, ReduceOp::sum, full, dim));
  const int W = m.comm.world(), r = m.comm.rank(), elt = static_cast<int>(dtype_size(t));
  const long long n = full.numel();
  if (n == 0) return;
  const long long mine = n / full.d[dim] * shard(full.d[dim], W, r).size;
  m.launch(plan_all_gather(full, dim, elt, W, r), in, std::max<long long>(mine * elt, 1), out, n * elt, t,
           ReduceOp::sum, n * elt, s);
}

void Collectives::reduce_scatter(const void* in, void* out, const Shape& full, int dim, DType t, ReduceOp op,
                                 cudaStream_t s) {
  Impl& m = *impl_;
  check_shape(full, dim);
  m.check_args(shape_args(2, t, op, full, dim));
  const int W = m.comm.world(), r = m.comm.rank(), elt = static_cast<int>(dtype_size(t));
  const long long n = full.numel();
  if (n == 0) return;
  const long long mine = n / full.d[dim] * shard(full.d[dim], W, r).size;
  m.launch(plan_reduce_scatter(full, dim, elt, W, r), in, n * elt, out, std::max<long long>(mine * elt, 1), t, op,
           n * elt / W, s);
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
