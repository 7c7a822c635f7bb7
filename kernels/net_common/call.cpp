#include "net_common/call.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>
#include <utility>

#include "weave/common/extent.hpp"
#include "weave/config.hpp"
#include "weave/runtime/env.hpp"

namespace weave::net {

DeviceCounters::~DeviceCounters() {
  if (p_) cudaFree(p_);  // synchronises with the kernels that may still count
}

unsigned long long* DeviceCounters::zeroed(int n, cudaStream_t stream) {
  if (n > n_) {
    if (p_) WEAVE_CUDA_CHECK(cudaFree(p_));
    p_ = nullptr;
    WEAVE_CUDA_CHECK(cudaMalloc(&p_, sizeof(unsigned long long) * n));
    n_ = n;
  }
  WEAVE_CUDA_CHECK(cudaMemsetAsync(p_, 0, sizeof(unsigned long long) * n, stream));
  return p_;
}

void check_path(const NetPath& path, int send_blocks, int recv_blocks, const char* who, bool any_g) {
  WEAVE_CHECK(path.gpu(), who, ": the network path is in CPU mode (NetPathOptions::gpu = false)");
  const NetTopo t = path.topo();
  WEAVE_CHECK(any_g || t.gpus == 1, who, ": ", t.nodes, " nodes of ", t.gpus,
              " ranks: this constructor takes one rank per node; the hierarchical form takes the node's communicator "
              "too (path, node, opts)");
  WEAVE_CHECK(t.nodes * t.gpus <= kMaxWorld, who, ": ", t.nodes, " x ", t.gpus, " ranks; at most ", kMaxWorld,
              " are supported");
  WEAVE_CHECK(send_blocks >= 1 && send_blocks <= 32 && recv_blocks >= 1 && recv_blocks <= 32, who, ": send_blocks (",
              send_blocks, ") and recv_blocks (", recv_blocks, ") must be 1 to 32");
}

void check_buffers(const char* who, std::initializer_list<Buffer> bufs) {
  for (const Buffer& b : bufs) {
    WEAVE_CHECK(b.p != nullptr, who, ": ", b.name, " is a null pointer");
    WEAVE_CHECK(is_aligned(b.p), who, ": ", b.name, " is not 16-byte aligned (TMA and the 16-byte copies need it)");
    check_extent(who, b.name, b.p, b.bytes);
  }
}

void check_room(const NetPath& path, const char* who, long long send_needed, long long recv_needed,
                long long flags_needed, int comm_blocks, const char* flags_hint) {
  WEAVE_CHECK(static_cast<unsigned long long>(send_needed) <= path.send_bytes(), who, ": the call stages ",
              send_needed, " bytes; the path's send buffer has ", path.send_bytes(), " (NetPathOptions::send_bytes)");
  WEAVE_CHECK(static_cast<unsigned long long>(recv_needed) <= path.slot_recv_bytes(), who, ": the call receives ",
              recv_needed, " bytes per receive slot; the path has ", path.slot_recv_bytes(),
              " (NetPathOptions::recv_bytes holds two slots)");
  WEAVE_CHECK(flags_needed <= path.slot_flags(), who, ": ", flags_needed,
              " arrival flags per call slot needed, the path has ", path.slot_flags(), " (", flags_hint, ")");
  int sms = 0, dev = 0;
  WEAVE_CUDA_CHECK(cudaGetDevice(&dev));
  WEAVE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  WEAVE_CHECK(comm_blocks < sms, who, ": ", comm_blocks, " send and receive blocks leave no compute SM (the device has ",
              sms, ")");
}

const char* op_name(long long op) {
  switch (op) {
    case kOpAgGemm: return "ag_gemm";
    case kOpGemmRs: return "gemm_rs";
    case kOpGemmAr: return "gemm_ar";
    case kOpRingAttention: return "ring_attention";
    case kOpAllGather: return "all_gather";
    case kOpReduceScatter: return "reduce_scatter";
    case kOpAllReduce: return "all_reduce";
  }
  return "another operator";
}

namespace {

// "all_gather(count 4096, dtype 1)": the operator and `what`'s fields ("count, dtype") with the
// key's values after the operator's id.
std::string render_plan(const std::vector<long long>& key, const char* what) {
  std::vector<std::string> names;
  for (std::string rest = what; !rest.empty();) {
    const size_t comma = rest.find(',');
    std::string name = rest.substr(0, comma);
    name.erase(0, name.find_first_not_of(' '));
    names.push_back(name);
    rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
  }
  std::string s = std::string(op_name(key.empty() ? 0 : key[0])) + "(";
  for (size_t i = 1; i < key.size(); ++i)
    s += (i > 1 ? ", " : "") + (i - 1 < names.size() ? names[i - 1] + " " : std::string()) + std::to_string(key[i]);
  return s + ")";
}

// Polls `done` until it holds; throws the path's diagnostic when the path fails meanwhile (a dead
// or silent peer, a peer's abort). After the path's wait timeout (its device waits' limit, which a
// peer may legitimately run behind by; 0 = none) it fails the path, so that the peers, which have
// posted or checked this call and may be waiting for this rank, fail with it too.
template <class Done>
void wait_for(NetPath& path, int peer, const std::string& stage, Done&& done) {
  const auto t0 = std::chrono::steady_clock::now();
  const double limit_s = path.wait_timeout_s();
  for (long spins = 0; !done(); ++spins) {
    if (spins < 2000) continue;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
    path.check();
    if (limit_s > 0 && std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > limit_s) {
      const std::string why =
          weave::detail::concat("weave: rank ", peer, " did not ", stage, " within ", limit_s, " s (the path's wait timeout)");
      path.abort(why);
      throw Error(why);
    }
  }
}

}  // namespace

AgreedCall::AgreedCall(NetPath& path, std::string call)
    : path_(path), call_(std::move(call)), exceptions_(std::uncaught_exceptions()) {}

AgreedCall::~AgreedCall() {
  if (std::uncaught_exceptions() <= exceptions_) return;
  try {
    path_.abort(weave::detail::concat(call_, ": rank ", path_.rank(),
                                      " failed after every rank agreed on the call, before launching it (its own error "
                                      "says why)"));
  } catch (...) {  // unwinding already: this rank's own error is the one to report
  }
}

AgreedCall agree(NetPath& path, AgreedKeys& agreed, const std::vector<long long>& key, const std::string& problem,
                 const char* who, const char* what) {
  using weave::detail::concat;
  static const bool debug = env::get_bool("WEAVE_DEBUG");
  path.check();  // a failed path says why, not a later wait
  WEAVE_CHECK(!key.empty() && key.size() <= static_cast<size_t>(kPostValues), who, ": a call's key has 1 to ",
              kPostValues, " values (", key.size(), ")");
  Proxy& px = path.proxy();
  const int world = path.world(), me = path.rank();
  CallPost mine;
  mine.call = px.calls_posted() + 1;
  mine.nvalues = static_cast<int32_t>(key.size());
  std::copy(key.begin(), key.end(), mine.values);
  const std::string plan = render_plan(key, what);
  std::snprintf(mine.text, sizeof(mine.text), "%s", plan.c_str());
  const uint64_t n = mine.call;
  const std::string call = concat(who, ": call ", n, " on the network path");
  auto differ = [&](int r, const CallPost& p) {
    return concat(call, ": the ranks' calls differ: rank ", me, " called with (operator, ", what, ") = ", plan, ", rank ",
                  r, " with ", p.text);
  };
  // An agreed key: compare with the posts already here, without waiting. A peer's post that waits
  // for a joint verdict (a problem of its own, or the key new there) is joined instead: every rank
  // then rejects or launches together and the path stays usable (a rank that launched alone would
  // have to fail it).
  bool join = !agreed.count(key) || debug || !problem.empty();
  for (int r = 0; r < world && !join; ++r) {
    CallPost p;
    if (r == me || px.read_post(r, n, p) != n) continue;
    if (!mine.same_plan(p)) {
      mine.rejected = 1;
      px.post_call(mine, path.wait_timeout_s());
      const std::string msg = differ(r, p);
      if (p.launched()) path.abort(msg);
      throw Error(msg);
    }
    join = p.together != 0;
  }
  if (!join) {
    px.post_call(mine, path.wait_timeout_s());
    return AgreedCall(path, call);
  }
  // A new key (or debug, a problem of this rank's own, a peer waiting for a verdict): every peer's
  // post of call n, then one verdict everywhere.
  mine.together = 1;
  mine.rejected = problem.empty() ? 0 : 1;
  px.post_call(mine, path.wait_timeout_s());
  std::vector<CallPost> all(static_cast<size_t>(world));
  all[me] = mine;
  for (int r = 0; r < world; ++r) {
    if (r == me) continue;
    wait_for(path, r, concat("post ", call), [&] {
      const uint64_t got = px.read_post(r, n, all[r]);
      if (got > n) {
        // A whole ring of calls past this one without waiting for it: its keys were agreed ones (and
        // it launched them), this rank's is not or it has a problem of its own.
        const std::string msg =
            !problem.empty() ? problem
                             : concat(call, ": rank ", r, " is ", got - n,
                                      "+ calls past this call without checking it (this rank calls ", plan,
                                      "): the ranks' calls differ (or WEAVE_DEBUG differs between the ranks)");
        path.abort(msg);
        throw Error(msg);
      }
      return got == n;
    });
  }
  bool launched = false;
  for (int r = 0; r < world; ++r) launched |= r != me && all[r].launched();
  // This rank's own problem first: it names the argument. Then a peer's own problem (a rejecting
  // post that waits for the verdict; one that does not rejected a differing plan it read), before
  // the plans: such a rank may post a plan that differs because of its arguments (a buffer
  // outside the heap has no place there to agree on), and its own error says why.
  const auto rejects = [&](int r) {
    return concat(call, " (", plan, "): rank ", r, " rejected its arguments (its error says why); every rank rejects the call");
  };
  std::string verdict = problem;
  for (int r = 0; r < world && verdict.empty(); ++r)
    if (all[r].rejected && all[r].together) verdict = rejects(r);
  for (int r = 0; r < world && verdict.empty(); ++r)
    if (!mine.same_plan(all[r])) verdict = differ(r, all[r]);
  for (int r = 0; r < world && verdict.empty(); ++r)
    if (all[r].rejected) verdict = rejects(r);
  if (!verdict.empty() && launched) {
    path.abort(verdict);  // a peer launched regardless: its kernel is released by the path's failure
    throw Error(verdict);
  }
  // Every post of call n is read here; wait until every peer that waited too has read this rank's,
  // so that the agreed calls after it cannot overwrite it first.
  px.post_checked(n);
  for (int r = 0; r < world; ++r)
    if (r != me && all[r].together) wait_for(path, r, concat("check ", call), [&] { return px.peer_checked(r) >= n; });
  if (!verdict.empty()) throw Error(verdict);
  agreed.insert(key);
  return AgreedCall(path, call);
}

}  // namespace weave::net
