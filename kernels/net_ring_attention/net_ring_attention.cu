// Host side of the inter-node ring attention: checks, the once-per-shape agreement, the gathered
// buffers, the compute side shared with the single-node ring (ring_globals.hpp), the call on the
// path.
#include "net_ring_attention/net_ring_attention.hpp"

#include <cmath>
#include <cstring>
#include <string>

#include "gathered_attention/gathered_launch.cuh"
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
NetRingAttention::~NetRingAttention() {
  if (kv_) cudaFree(kv_);
}

void NetRingAttention::finish(cudaStream_t stream) { path_.finish(stream); }

void NetRingAttention::forward(const bf16* q, const bf16* k, const bf16* v, bf16* o, float* lse,
                               const sp::RingShape& s, const sp::RingOptions& opt, cudaStream_t stream) {
  const char* who = "net ring_attention";
  path_.check();
  const int W = path_.world(), r = path_.rank(), zz = opt.sharding == sp::Sharding::Zigzag ? 1 : 0;
  const int ncomm = opt_.send_blocks + opt_.recv_blocks;
  sp::RingOptions o2 = opt;
  o2.num_comm_sms = ncomm;  // the communicator count the shared checks see
  int dev = 0, sms = 0;
  WEAVE_CUDA_CHECK(cudaGetDevice(&dev));
  WEAVE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const long long row_bytes = static_cast<long long>(s.Hkv) * s.D * 2;
  const std::string problem = runtime::local_problem([&] {
    const std::string p = sp::detail::ring_input_problem(
        s, o2, W, r, sms, q, k, v, o, lse, [&](const char* name, const void* ptr, size_t bytes) {
          check_extent(who, name, ptr, bytes);
        });
    if (!p.empty()) throw Error(p);
    WEAVE_CHECK(is_aligned(k) && is_aligned(v), who, ": k and v must be 16-byte aligned (16-byte copies)");
    const rn::RingPlan R = rn::make_plan(W, zz, s.B, s.S, row_bytes);
    check_room(path_, who, rn::send_needed(R), rn::recv_needed(R), rn::flags_needed(R), ncomm,
               "raise NetPathOptions::proxy.flags");
  });
  int scale_bits = 0;
  std::memcpy(&scale_bits, &opt.softmax_scale, sizeof scale_bits);
  agree(path_, agreed_,
        {kOpRingAttention, s.B, s.S, s.Hq, s.Hkv, s.D, opt.causal ? 1 : 0, zz, scale_bits, opt_.send_blocks,
         opt_.recv_blocks},
        problem, who);

  const size_t kv_elems = size_t(s.B) * s.S * s.Hkv * s.D;
  if (kv_elems > kv_elems_) {
    if (kv_) WEAVE_CUDA_CHECK(cudaFree(kv_));  // waits for the kernels that read it
    kv_ = nullptr;
    WEAVE_CUDA_CHECK(cudaMalloc(&kv_, 2 * kv_elems * sizeof(bf16)));
    kv_elems_ = kv_elems;
  }
  bf16* gk = kv_;
  bf16* gv = kv_ + kv_elems;
  rn::NetRingGlobals g{};
  sp::ring::fill_globals(g, q, k, v, o, lse, s, opt, W, r, gk, gv);
  if (g.n_own == 0) {
    cudaDeviceProp props{};
    WEAVE_CUDA_CHECK(cudaGetDeviceProperties(&props, dev));
    sp::ring::copy_own_rows(k, v, gk, gv, s, W, r, zz, props.memPitch, stream);
  }
  const rn::RingPlan R = rn::make_plan(W, zz, s.B, s.S, row_bytes);
  g.num_comm = ncomm;
  g.n_push = 0;   // no NVLink pushes: the network roles move the peers' rows
  g.count_o = 0;  // O stays local
  g.slice_ready = ready_.zeroed(s.B * R.slices, stream);
  // The producers' readiness view: this rank's counters only, no timeout of its own (a receive
  // block that gives up releases every counter instead), no trap record.
  g.ready = signals{};
  g.ready.ptr[r] = g.slice_ready;
  g.ready.world = W, g.ready.rank = r, g.ready.count = s.B * R.slices;
  g.ready_round = Round{1, nullptr};
  attention::plan_gathered(g, s.D, stream);
  g.R = R;
  g.gk = reinterpret_cast<char*>(gk), g.gv = reinterpret_cast<char*>(gv);
  g.k = reinterpret_cast<const char*>(k), g.v = reinterpret_cast<const char*>(v);
  g.send_blocks = opt_.send_blocks;
  launch_numbered(path_, g, rn::commands(R, r), who, [&] {
    if (s.D == 64)
      attention::launch_gathered_kernel<rn::NetRingKernel<64>>(g, stream);
    else
      attention::launch_gathered_kernel<rn::NetRingKernel<128>>(g, stream);
  });
}

}  // namespace weave::net
