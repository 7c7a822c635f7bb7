// Host side of the inter-node ring attention: checks, the once-per-shape agreement, the gathered
// buffers, the compute side shared with the single-node ring (ring_globals.hpp), the call on the
// path.
#include "net_ring_attention/net_ring_attention.hpp"

#include <cmath>
#include <cstring>
#include <string>

#include "gathered_attention/gathered_launch.cuh"
#include "net_common/node.hpp"
#include "net_ring_attention/net_ring_kernel.cuh"
#include "ring_attention/ring_globals.hpp"
#include "weave/common/error.hpp"
#include "weave/common/extent.hpp"
#include "weave/runtime/call.hpp"

namespace weave::net {

using sp::bf16;
namespace rn = ring_net;

NetRingAttention::NetRingAttention(NetPath& path, NetRingOptions opts) : path_(path), opt_(opts) {
  check_path(path_, opt_.send_blocks, opt_.recv_blocks, "net ring_attention");
}
NetRingAttention::NetRingAttention(NetPath& path, runtime::Communicator& node, NetRingOptions opts)
    : path_(path), opt_(opts) {
  const char* who = "net ring_attention";
  check_path(path_, opt_.send_blocks, opt_.recv_blocks, who, true);
  WEAVE_CHECK(opt_.push_blocks >= 1 && opt_.push_blocks <= 32, who, ": push_blocks (", opt_.push_blocks,
              ") must be 1 to 32");
  node_ = node_of(path_, node, who);
}
NetRingAttention::~NetRingAttention() {
  if (kv_) cudaFree(kv_);
}

void NetRingAttention::finish(cudaStream_t stream) { finish_on(path_, node_, stream); }

void NetRingAttention::forward(const bf16* q, const bf16* k, const bf16* v, bf16* o, float* lse,
                               const sp::RingShape& s, const sp::RingOptions& opt, cudaStream_t stream) {
  call(q, k, v, o, lse, nullptr, nullptr, s, opt, stream);
}
void NetRingAttention::forward(const bf16* q, const bf16* k, const bf16* v, bf16* o, float* lse, bf16* k_gathered,
                               bf16* v_gathered, const sp::RingShape& s, const sp::RingOptions& opt,
                               cudaStream_t stream) {
  call(q, k, v, o, lse, k_gathered, v_gathered, s, opt, stream);
}

// G = 1: the kernel as before (readiness in this object's device counters, the gathered buffers
// the caller's or the object's). G > 1: the hierarchical kernel on the node communicator's signal
// sets, the gathered buffers the caller's, in the node's heap.
void NetRingAttention::call(const bf16* q, const bf16* k, const bf16* v, bf16* o, float* lse, bf16* gk, bf16* gv,
                            const sp::RingShape& s, const sp::RingOptions& opt, cudaStream_t stream) {
  const char* who = "net ring_attention";
  path_.check();
  const int W = path_.world(), r = path_.rank(), zz = opt.sharding == sp::Sharding::Zigzag ? 1 : 0;
  const int G = node_ ? node_->world() : 1;
  const int extra = G > 1 ? opt_.push_blocks : 0;
  const int ncomm = opt_.send_blocks + opt_.recv_blocks + extra;
  sp::RingOptions o2 = opt;
  o2.num_comm_sms = ncomm;  // the communicator count the shared checks see
  int dev = 0, sms = 0;
  WEAVE_CUDA_CHECK(cudaGetDevice(&dev));
  WEAVE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const long long row_bytes = static_cast<long long>(s.Hkv) * s.D * 2;
  const rn::RingPlan R = rn::make_plan(W, zz, s.B, s.S, row_bytes, G);
  const std::string problem = runtime::local_problem([&] {
    const std::string p = sp::detail::ring_input_problem(
        s, o2, W, r, sms, q, k, v, o, lse, [&](const char* name, const void* ptr, size_t bytes) {
          check_extent(who, name, ptr, bytes);
        });
    if (!p.empty()) throw Error(p);
    WEAVE_CHECK(is_aligned(k) && is_aligned(v), who, ": k and v must be 16-byte aligned (16-byte copies)");
    WEAVE_CHECK(G == 1 || gk != nullptr, who, ": with ", G,
                " ranks per node the gathered K and V are the caller's (forward with k_gathered and v_gathered in the "
                "node communicator's heap)");
    if (gk != nullptr || gv != nullptr) {
      const size_t bytes = size_t(s.B) * s.S * row_bytes;
      check_buffers(who, {{"k_gathered", gk, bytes}, {"v_gathered", gv, bytes}});
      WEAVE_CHECK(!runtime::overlap(gk, bytes, gv, bytes), who, ": k_gathered and v_gathered overlap");
      const size_t L = static_cast<size_t>(sp::ring::local_rows(s.S, W, zz, r));
      const Buffer others[] = {{"q", q, size_t(s.B) * L * s.Hq * s.D * 2},
                               {"k", k, size_t(s.B) * L * row_bytes},
                               {"v", v, size_t(s.B) * L * row_bytes},
                               {"o", o, size_t(s.B) * L * s.Hq * s.D * 2},
                               {"lse", lse, lse ? size_t(s.B) * s.Hq * L * 4 : 0}};
      for (const Buffer& b : others)
        WEAVE_CHECK(!runtime::overlap(gk, bytes, b.p, b.bytes) && !runtime::overlap(gv, bytes, b.p, b.bytes), who,
                    ": ", b.name, " overlaps k_gathered or v_gathered");
      if (G > 1) {
        check_in_node_heap(*node_, gk, bytes, who, "k_gathered", "the node peers write into it");
        check_in_node_heap(*node_, gv, bytes, who, "v_gathered", "the node peers write into it");
      }
    }
    check_room(path_, who, rn::send_needed(R), rn::recv_needed(R), rn::flags_needed(R), ncomm,
               "raise NetPathOptions::proxy.flags");
  });
  int scale_bits = 0;
  std::memcpy(&scale_bits, &opt.softmax_scale, sizeof scale_bits);
  const AgreedCall agreed_call = agree(path_, agreed_,
        {kOpRingAttention, s.B, s.S, s.Hq, s.Hkv, s.D, opt.causal ? 1 : 0, zz, scale_bits, opt_.send_blocks,
         opt_.recv_blocks, extra, G},
        problem, who,
        "B, S, Hq, Hkv, D, causal, zigzag, softmax scale bits, send blocks, receive blocks, push blocks, ranks per node");

  const size_t kv_elems = size_t(s.B) * s.S * s.Hkv * s.D;
  if (gk == nullptr) {
    if (kv_elems > kv_elems_) {
      if (kv_) WEAVE_CUDA_CHECK(cudaFree(kv_));  // waits for the kernels that read it
      kv_ = nullptr;
      WEAVE_CUDA_CHECK(cudaMalloc(&kv_, 2 * kv_elems * sizeof(bf16)));
      kv_elems_ = kv_elems;
    }
    gk = kv_;
    gv = kv_ + kv_elems;
  }
  rn::NetRingHierGlobals g{};  // its NetRingGlobals part is the G = 1 kernel's parameters
  sp::ring::fill_globals(g, q, k, v, o, lse, s, opt, W, r, gk, gv);
  if (g.n_own == 0) sp::ring::copy_own_rows(k, v, gk, gv, s, W, r, zz, stream);
  g.num_comm = ncomm;
  g.n_push = 0;   // no single-node pushes: the network and NVLink roles move the peers' rows
  g.count_o = 0;  // O stays local
  if (G == 1) {
    g.slice_ready = ready_.zeroed(s.B * R.slices, stream);
    // The producers' readiness view: this rank's counters only, no timeout of its own (a receive
    // block that gives up releases every counter instead), no trap record.
    g.ready = signals{};
    g.ready.ptr[r] = g.slice_ready;
    g.ready.world = W, g.ready.rank = r, g.ready.count = s.B * R.slices;
    g.ready_round = Round{1, nullptr};
  } else {
    // One set pair per (B, S, sharding): every launch of a set counts the same units per slice,
    // so round x the single-node expectation holds.
    runtime::Communicator& node = *node_;
    const std::vector<long long> key = {s.B, s.S, zz};
    const std::vector<int> counts = {s.B * R.slices, 1};
    runtime::SignalSet& rd = sig_.get(node, key, counts, 0);
    runtime::SignalSet& ar = sig_.get(node, key, counts, 1);
    const size_t bytes = kv_elems * sizeof(bf16);
    const runtime::PeerPtrs pk = node.peers(gk, bytes), pv = node.peers(gv, bytes);
    for (int d = 0; d < G; ++d) g.node_gk[d] = static_cast<char*>(pk[d]), g.node_gv[d] = static_cast<char*>(pv[d]);
    g.ready = rd.view();
    g.arrive = ar.view();
    g.ready_round = rd.next_round(stream, false);
    g.arrive_round = ar.next_round(stream, false);
    g.recv_blocks = opt_.recv_blocks;
  }
  attention::plan_gathered(g, s.D, stream);
  g.R = R;
  g.gk = reinterpret_cast<char*>(gk), g.gv = reinterpret_cast<char*>(gv);
  g.k = reinterpret_cast<const char*>(k), g.v = reinterpret_cast<const char*>(v);
  g.send_blocks = opt_.send_blocks;
  rn::NetRingGlobals& g1 = g;
  launch_numbered(path_, g, rn::commands(R, r), who, [&] {
    if (G == 1) {
      if (s.D == 64)
        attention::launch_gathered_kernel<rn::NetRingKernel<64>>(g1, stream);
      else
        attention::launch_gathered_kernel<rn::NetRingKernel<128>>(g1, stream);
    } else if (s.D == 64) {
      attention::launch_gathered_kernel<rn::NetRingHierKernel<64>>(g, stream);
    } else {
      attention::launch_gathered_kernel<rn::NetRingHierKernel<128>>(g, stream);
    }
  });
}

}  // namespace weave::net
