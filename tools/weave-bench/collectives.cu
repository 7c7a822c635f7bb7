// weave-bench collectives: weave::coll::Collectives against NCCL in the same run, under weave-run.
// For each collective, size (bytes per rank) and layout: both are timed (CUDA events, warm-up, median
// of repeats, the slowest rank's time) on two input sets of small integers that alternate call by
// call. Every output is poisoned before a loop; the output of the loop's last call, then of one
// more call on the other input set into the re-poisoned output (recheck.hpp's rule), and of a
// first, untimed call, is checked element by element, exactly, against the function the inputs
// were made from, weave's and NCCL's alike, on every rank; a wrong row makes the run exit 1.
// Where a rank's piece is not contiguous in the final layout, the NCCL column includes the
// copies a user would need (bench/nccl_ref.cuh). Bus bandwidth follows NCCL's
// PERFORMANCE.md: all_reduce algbw x 2(W-1)/W; all_gather, reduce_scatter and all_to_all
// algbw x (W-1)/W, with algbw from the full (gathered) size, the full reduce_scatter input and
// the per-rank all_to_all input.
// Ranks sharing one GPU (weave-run --share-gpus): NCCL refuses two ranks on one device, so its rows
// are left out (the run says so) and weave's are checked as above; their times mean nothing then
// (the ranks' kernels time-slice) and their JSON lines carry "shared_gpu": true.
//
//   weave-run -n 2 -- weave-bench collectives [--sizes 1M,8M,64M,256M,1G] [--dtypes bf16]
//       [--kernels all_reduce,all_gather,reduce_scatter,all_to_all] [--ops sum] [--cols 4096]
//       [--ulysses B,H,D] [--ar-algo auto|one_shot|two_shot|ll|push|ll128] [--ag-algo auto|direct|ll|ll128]
//       [--rs-algo auto|direct|ll|ll128] [--target-ms 25] [--repeats 5] [--host-us] [--gpu-us]
//       [--host-breakdown] [--json FILE]
//
// --sizes is bytes per rank of each collective's input (K, M, G suffixes: powers of 1024). Without
// it, all_reduce, all_gather and reduce_scatter also run 64K and 256K (latency). 2-D layouts are
// rows x cols (--cols), gathered or scattered along dim 0 (contiguous pieces) and along dim 1
// (strided pieces).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "../../bench/nccl_ref.cuh"
#include "bench.hpp"
#include "collectives/collectives.hpp"
#include "recheck.hpp"
#include "shared_gpu.hpp"
#include "weave/memory_order.cuh"
#include "weave/pdl.cuh"
#include "weave/runtime/communicator.hpp"

namespace {

using namespace weave;
using coll::Shape;

// Keeps the stream busy for `ns` so that the host can enqueue a whole timed loop ahead of it.
__global__ void hold_kernel(unsigned long long ns) {
  const unsigned long long t0 = globaltimer();
  do {
    __nanosleep(1000);
  } while (globaltimer() - t0 < ns);
}

void hold(cudaStream_t st, unsigned long long ns) { hold_kernel<<<1, 1, 0, st>>>(ns); }

// Launch-cost probes for --host-breakdown: the same parameter sizes as a small and a large call.
struct SmallArgs {
  unsigned long long w[8];
};
struct LargeArgs {
  unsigned long long w[256];
};
template <class A>
__global__ void empty_kernel(A) {}
__global__ void pdl_empty_kernel(SmallArgs) { pdl_enter(); }

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) v.push_back(item);
  return v;
}

long long parse_bytes(const std::string& s) {
  size_t pos = 0;
  const double x = std::stod(s, &pos);
  const std::string suf = s.substr(pos);
  double mul = 1;
  if (suf == "K" || suf == "k" || suf == "KiB")
    mul = 1 << 10;
  else if (suf == "M" || suf == "m" || suf == "MiB")
    mul = 1 << 20;
  else if (suf == "G" || suf == "g" || suf == "GiB")
    mul = double(1 << 30);
  else
    WEAVE_CHECK(suf.empty() || suf == "B", "bad size '", s, "' (want e.g. 64K, 8M, 1G)");
  const long long b = static_cast<long long>(x * mul);
  WEAVE_CHECK(b > 0, "size '", s, "' must be positive");
  return b;
}

DType parse_dtype(const std::string& s) {
  if (s == "bf16") return DType::bf16;
  if (s == "fp16") return DType::fp16;
  WEAVE_CHECK(s == "fp32", "bad dtype '", s, "' (bf16, fp16, fp32)");
  return DType::fp32;
}
ReduceOp parse_op(const std::string& s) {
  if (s == "sum") return ReduceOp::sum;
  if (s == "max") return ReduceOp::max;
  WEAVE_CHECK(s == "min", "bad op '", s, "' (sum, max, min)");
  return ReduceOp::min;
}

std::string shape_str(const Shape& s) {
  std::string o;
  for (int i = 0; i < s.ndim; ++i) o += (i ? "x" : "") + std::to_string(s.d[i]);
  return o;
}
std::string size_str(double bytes) {
  char b[32];
  if (bytes >= (1 << 30))
    std::snprintf(b, sizeof b, "%gG", bytes / (1 << 30));
  else if (bytes >= (1 << 20))
    std::snprintf(b, sizeof b, "%gM", bytes / (1 << 20));
  else
    std::snprintf(b, sizeof b, "%gK", bytes / (1 << 10));
  return b;
}

// One benchmark row: a collective on one shape, with everything needed to call weave and NCCL,
// check weave's output, and turn a time into bandwidth.
struct Case {
  std::string kernel, layout;
  DType t = DType::bf16;
  ReduceOp op = ReduceOp::sum;
  Shape shape;                            // all_reduce: 1-D; gathers: the full tensor; all_to_all: (B, S, H, D)
  int dim = -1;                           // gathered/scattered dimension (all_to_all: the one gathered in the output)
  long long in_elems = 0, out_elems = 0;  // on this rank
  long long in_max = 0, out_max = 0;      // over ranks (buffers are symmetric)
  double per_rank_bytes = 0;              // nominal input bytes per rank (JSON `bytes`)
  double alg_bytes = 0;                   // NCCL's size for algbw
  double bus_factor = 1;
  bool nccl_copies = false;  // the NCCL column includes layout copies
};

long long max_over_ranks(int W, const std::function<long long(int)>& f) {
  long long m = 0;
  for (int r = 0; r < W; ++r) m = std::max(m, f(r));
  return m;
}

Case all_reduce_case(long long bytes, DType t, ReduceOp op, int W) {
  Case c;
  c.kernel = "all_reduce", c.layout = "flat", c.t = t, c.op = op;
  const long long n = std::max<long long>(1, bytes / dtype_size(t));
  c.shape.ndim = 1, c.shape.d[0] = n;
  c.in_elems = c.out_elems = c.in_max = c.out_max = n;
  c.per_rank_bytes = c.alg_bytes = double(n) * dtype_size(t);
  c.bus_factor = 2.0 * (W - 1) / W;
  return c;
}

// all_gather: `bytes` is the per-rank shard; reduce_scatter: `bytes` is the full (per-rank) input.
Case gather_case(bool gather, long long bytes, int dim, long long cols, DType t, ReduceOp op, int W, int me) {
  Case c;
  c.kernel = gather ? "all_gather" : "reduce_scatter";
  c.layout = "dim" + std::to_string(dim);
  c.t = t, c.op = op, c.dim = dim;
  const long long e = dtype_size(t), full_elems = std::max<long long>(cols, (gather ? W * bytes : bytes) / e);
  c.shape.ndim = 2;
  c.shape.d[0] = std::max<long long>(1, full_elems / cols), c.shape.d[1] = cols;
  if (dim == 0 && c.shape.d[0] % W) c.shape.d[0] += W - c.shape.d[0] % W;  // whole rows per rank
  const long long n = c.shape.numel();
  auto shard = [&](int r) { return ref::shard_numel(c.shape, dim, W, r); };
  c.in_elems = gather ? shard(me) : n;
  c.out_elems = gather ? n : shard(me);
  c.in_max = gather ? max_over_ranks(W, shard) : n;
  c.out_max = gather ? n : max_over_ranks(W, shard);
  c.per_rank_bytes = double(gather ? n / W : n) * e;
  c.alg_bytes = double(n) * e;
  c.bus_factor = double(W - 1) / W;
  c.nccl_copies = dim != 0;
  return c;
}

Case ulysses_case(bool to_head, long long bytes, long long B, long long H, long long D, DType t, int W, int me) {
  Case c;
  c.kernel = "all_to_all", c.layout = to_head ? "seq_to_head" : "head_to_seq";
  c.t = t, c.dim = to_head ? 1 : 2;
  const long long e = dtype_size(t);
  if (H % W) H += W - H % W;  // the API needs whole heads per rank
  const long long s_per = std::max<long long>(1, bytes / (e * B * H * D));
  const long long S = s_per * W;
  c.shape.ndim = 4, c.shape.d[0] = B, c.shape.d[1] = S, c.shape.d[2] = H, c.shape.d[3] = D;
  const long long seq = B * coll::shard(S, W, me).size * H * D, head = B * S * (H / W) * D;
  c.in_elems = to_head ? seq : head;
  c.out_elems = to_head ? head : seq;
  c.in_max = c.out_max = std::max(B * coll::shard(S, W, 0).size * H * D, head);
  c.per_rank_bytes = c.alg_bytes = double(B * S * H * D / W) * e;
  c.bus_factor = double(W - 1) / W;
  c.nccl_copies = true;
  return c;
}

ref::OutMap out_map(const Case& c, int W, int me) {
  if (c.kernel == "all_reduce") return ref::map_all_reduce(c.out_elems, W, me);
  if (c.kernel == "all_gather") return ref::map_all_gather(c.shape, c.dim, W, me);
  if (c.kernel == "reduce_scatter") return ref::map_reduce_scatter(c.shape, c.dim, W, me);
  return ref::map_ulysses(c.layout == "seq_to_head", c.shape.d[0], c.shape.d[1], c.shape.d[2], c.shape.d[3], W, me);
}

// Calls the collective of `c` with weave (nccl == nullptr) or with the NCCL reference.
void call(const Case& c, coll::Collectives* w, ref::NcclCollectives* nccl, const void* in, void* out, cudaStream_t s) {
  const auto& d = c.shape.d;
  if (c.kernel == "all_reduce") {
    if (w)
      w->all_reduce(in, out, c.out_elems, c.t, c.op, s);
    else
      nccl->all_reduce(in, out, c.out_elems, c.t, c.op, s);
  } else if (c.kernel == "all_gather") {
    if (w)
      w->all_gather(in, out, c.shape, c.dim, c.t, s);
    else
      nccl->all_gather(in, out, c.shape, c.dim, c.t, s);
  } else if (c.kernel == "reduce_scatter") {
    if (w)
      w->reduce_scatter(in, out, c.shape, c.dim, c.t, c.op, s);
    else
      nccl->reduce_scatter(in, out, c.shape, c.dim, c.t, c.op, s);
  } else if (c.layout == "seq_to_head") {
    if (w)
      w->all_to_all_seq_to_head(in, out, d[0], d[1], d[2], d[3], c.t, s);
    else
      nccl->all_to_all_seq_to_head(in, out, d[0], d[1], d[2], d[3], c.t, s);
  } else {
    if (w)
      w->all_to_all_head_to_seq(in, out, d[0], d[1], d[2], d[3], c.t, s);
    else
      nccl->all_to_all_head_to_seq(in, out, d[0], d[1], d[2], d[3], c.t, s);
  }
}

// The path weave takes for this case (JSON `algo`; empty for all_to_all, which has one).
std::string algo_name(const Case& c, const coll::Collectives& w) {
  if (c.kernel == "all_reduce") {
    static const char* names[] = {"auto", "one_shot", "two_shot", "ll", "push", "ll128"};
    return names[static_cast<int>(w.all_reduce_algo(c.out_elems * dtype_size(c.t), false))];
  }
  if (c.kernel != "all_gather" && c.kernel != "reduce_scatter") return "";
  const coll::ShardAlgo a =
      c.kernel == "all_gather" ? w.all_gather_algo(c.shape, c.dim, c.t) : w.reduce_scatter_algo(c.shape, c.dim, c.t);
  return a == coll::ShardAlgo::ll ? "ll" : a == coll::ShardAlgo::ll128 ? "ll128" : "direct";
}

template <class T>
std::vector<T> gather_all(runtime::Communicator& comm, T mine) {
  std::vector<T> all(comm.world());
  comm.bootstrap().all_gather(&mine, all.data(), sizeof(T));
  return all;
}

// --host-breakdown: the host's time (µs, slowest rank) of each piece a small call is made of,
// each in its own loop, so that cuts to the host path are aimed at what costs.
void host_breakdown(runtime::Communicator& comm, cudaStream_t st, void* in, bool lead) {
  constexpr int n = 1000;
  cudaEvent_t ev;
  WEAVE_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  auto per_call = [&](const char* what, auto&& fn) {
    comm.sync(st);
    comm.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) fn();
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / n;
    comm.sync(st);
    const auto all = gather_all<double>(comm, us);
    if (lead) std::printf("  host %-44s %6.2f us\n", what, *std::max_element(all.begin(), all.end()));
  };
  if (lead) std::printf("host cost per call of each piece (%d calls each):\n", n);
  per_call("cudaStreamIsCapturing", [&] {
    cudaStreamCaptureStatus cs;
    WEAVE_CUDA_CHECK(cudaStreamIsCapturing(st, &cs));
  });
  per_call("cudaGetLastError", [&] { WEAVE_CUDA_CHECK(cudaGetLastError()); });
  per_call("Communicator::check_same (11 values)", [&] {
    comm.check_same("breakdown", {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
  });
  per_call("Communicator::peers (heap buffer)", [&] { (void)comm.peers(in, 1 << 20); });
  per_call("cudaEventRecord", [&] { WEAVE_CUDA_CHECK(cudaEventRecord(ev, st)); });
  per_call("cudaStreamWaitEvent", [&] { WEAVE_CUDA_CHECK(cudaStreamWaitEvent(st, ev, 0)); });
  per_call("launch, 64-byte parameters", [&] { empty_kernel<<<1, 32, 0, st>>>(SmallArgs{}); });
  per_call("launch, 2048-byte parameters", [&] { empty_kernel<<<1, 32, 0, st>>>(LargeArgs{}); });
  per_call("launch, 2048-byte parameters, 132 x 512 grid", [&] { empty_kernel<<<132, 512, 0, st>>>(LargeArgs{}); });
  per_call("launch_pdl, 64-byte parameters", [&] { launch_pdl(pdl_empty_kernel, 1, 32, st, SmallArgs{}); });
  // The device's time per kernel of a chain of short kernels enqueued ahead (a hold kernel first):
  // the gap that programmatic dependent launch removes, and whether an event between kernels
  // (CallOrder records one after every call) keeps it.
  auto chain = [&](const char* what, const std::function<void()>& fn) {
    comm.sync(st);
    const double us = weave::events_us(st, [&] { hold(st, 2000000ull); }, fn, 200);
    const auto all = gather_all<double>(comm, us);
    if (lead) std::printf("  gpu  %-44s %6.2f us\n", what, *std::max_element(all.begin(), all.end()));
  };
  chain("chain of 132 x 512 kernels", [&] { empty_kernel<<<132, 512, 0, st>>>(SmallArgs{}); });
  chain("chain of 132 x 512 PDL kernels", [&] { launch_pdl(pdl_empty_kernel, 132, 512, st, SmallArgs{}); });
  chain("chain of 132 x 512 PDL kernels, event between", [&] {
    launch_pdl(pdl_empty_kernel, 132, 512, st, SmallArgs{});
    WEAVE_CUDA_CHECK(cudaEventRecord(ev, st));
  });
  WEAVE_CUDA_CHECK(cudaEventDestroy(ev));
}

int run(const bench::Args& a) {
  // Which cases, from the options; every rank builds the same list.
  const bool custom_sizes = a.has("sizes");
  std::vector<long long> sizes;
  for (const auto& s : split_list(a.get("sizes", "1M,8M,64M,256M,1G"))) sizes.push_back(parse_bytes(s));
  std::vector<long long> small_sizes = sizes;  // all_reduce, all_gather, reduce_scatter
  if (!custom_sizes) small_sizes.insert(small_sizes.begin(), {64 << 10, 256 << 10});
  std::vector<DType> dtypes;
  for (const auto& s : split_list(a.get("dtypes", "bf16"))) dtypes.push_back(parse_dtype(s));
  std::vector<ReduceOp> ops;
  for (const auto& s : split_list(a.get("ops", "sum"))) ops.push_back(parse_op(s));
  const auto kernels = split_list(a.get("kernels", "all_reduce,all_gather,reduce_scatter,all_to_all"));
  for (const auto& k : kernels)
    WEAVE_CHECK(k == "all_reduce" || k == "all_gather" || k == "reduce_scatter" || k == "all_to_all",
                "bad --kernels entry '", k, "'");
  const long long cols = a.get_int("cols", 4096);
  const auto uly = split_list(a.get("ulysses", "2,32,128"));
  WEAVE_CHECK(uly.size() == 3, "--ulysses takes B,H,D");
  const long long uB = std::stoll(uly[0]), uH = std::stoll(uly[1]), uD = std::stoll(uly[2]);
  const double target_ms = std::stod(a.get("target-ms", "25"));
  const int repeats = static_cast<int>(a.get_int("repeats", 5));
  const std::string ar_algo = a.get("ar-algo", "auto");
  WEAVE_CHECK(ar_algo == "auto" || ar_algo == "one_shot" || ar_algo == "two_shot" || ar_algo == "ll" ||
                  ar_algo == "push" || ar_algo == "ll128",
              "bad --ar-algo '", ar_algo, "'");
  auto shard_algo = [&](const char* opt) {
    const std::string v = a.get(opt, "auto");
    WEAVE_CHECK(v == "auto" || v == "direct" || v == "ll" || v == "ll128", "bad --", opt, " '", v,
                "' (auto, direct, ll, ll128)");
    return v == "direct" ? coll::ShardAlgo::direct
           : v == "ll"   ? coll::ShardAlgo::ll
           : v == "ll128" ? coll::ShardAlgo::ll128
                          : coll::ShardAlgo::automatic;
  };
  const coll::ShardAlgo ag_algo = shard_algo("ag-algo"), rs_algo = shard_algo("rs-algo");

  const runtime::LaunchInfo li = runtime::detect_launch();
  WEAVE_CHECK(li.world >= 2,
              "weave-bench collectives needs at least 2 ranks (weave-run -n 2 -- weave-bench collectives)");
  const int W = li.world, me = li.rank;
  auto want = [&](const char* k) { return std::find(kernels.begin(), kernels.end(), k) != kernels.end(); };
  std::vector<Case> cases;
  for (DType t : dtypes) {
    if (want("all_reduce"))
      for (ReduceOp op : ops)
        for (long long b : small_sizes) cases.push_back(all_reduce_case(b, t, op, W));
    for (int g = 0; g < 2; ++g) {
      if (!want(g ? "reduce_scatter" : "all_gather")) continue;
      for (ReduceOp op : g ? ops : std::vector<ReduceOp>{ReduceOp::sum})
        for (int dim : {0, 1})
          for (long long b : small_sizes) cases.push_back(gather_case(g == 0, b, dim, cols, t, op, W, me));
    }
    if (want("all_to_all"))
      for (bool to_head : {true, false})
        for (long long b : sizes) cases.push_back(ulysses_case(to_head, b, uB, uH, uD, t, W, me));
  }
  WEAVE_CHECK(!cases.empty(), "nothing to run");

  // One pair of heap buffers for the largest case (reused by every case), plus room for the
  // collectives' own heap needs.
  size_t in_bytes = 0, out_bytes = 0;
  for (const Case& c : cases) {
    in_bytes = std::max(in_bytes, size_t(c.in_max) * dtype_size(c.t));
    out_bytes = std::max(out_bytes, size_t(c.out_max) * dtype_size(c.t));
  }
  runtime::CommOptions o;
  o.heap_bytes = 2 * in_bytes + out_bytes + (size_t(a.get_int("heap-slack-mib", 256)) << 20);
  runtime::Communicator comm(li, o);
  const bool lead = me == 0;
  std::optional<bench::JsonSink> json;
  if (lead) json.emplace(a);
  cudaStream_t st;
  WEAVE_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  coll::Collectives weave_coll(comm);
  if (ar_algo != "auto")
    weave_coll.set_all_reduce_algo(ar_algo == "one_shot" ? coll::AllReduceAlgo::one_shot
                                   : ar_algo == "ll"     ? coll::AllReduceAlgo::ll
                                   : ar_algo == "push"   ? coll::AllReduceAlgo::push
                                   : ar_algo == "ll128"  ? coll::AllReduceAlgo::ll128
                                                         : coll::AllReduceAlgo::two_shot);
  weave_coll.set_all_gather_algo(ag_algo);
  weave_coll.set_reduce_scatter_algo(rs_algo);
  const std::string shared = bench::shared_gpu(comm);
  std::optional<ref::NcclCollectives> nccl;
  if (shared.empty()) nccl.emplace(comm);
  const bool with_nccl = nccl.has_value();
  ref::Checker checker;
  void* in = comm.alloc(in_bytes);
  void* in_b = comm.alloc(in_bytes);  // the second input set: timed calls alternate the two
  void* out = comm.alloc(out_bytes);
  void* ref_out = nullptr;
  WEAVE_CUDA_CHECK(cudaMalloc(&ref_out, out_bytes));
  const uint64_t seed = ref::mix64(gather_all<uint64_t>(comm, std::random_device{}() * 0x9E3779B97F4A7C15ull)[0]);

  if (lead) {
    std::printf(
        "collectives: weave vs NCCL, %d ranks, %s, %zu cases; bus GB/s per NCCL's definitions, ratio = "
        "weave / NCCL\n",
        W, comm.props().name, cases.size());
    if (!with_nccl)
      std::printf("NOTE: %s: the nccl rows are left out (NCCL needs one GPU per rank); weave's rows are checked, "
                  "their times mean nothing (the ranks time-slice)\n",
                  shared.c_str());
    std::printf("%-14s %-11s %-5s %-4s %-18s %8s %10s %9s %10s %9s %7s %-5s %s\n", "kernel", "layout", "dtype", "op",
                "shape", "per-rank", "weave_us", "weave_bw", "nccl_us", "nccl_bw", "ratio", "check", "algo");
    std::fflush(stdout);
  }
  if (a.has("host-breakdown")) host_breakdown(comm, st, in, lead);
  bool all_ok = true;
  std::map<std::string, std::pair<double, int>> log_ratio;  // kernel/layout -> (sum of log ratio, count)
  for (size_t k = 0; k < cases.size(); ++k) {
    const Case& c = cases[k];
    const bool reduction = c.kernel == "all_reduce" || c.kernel == "reduce_scatter";
    if (lead) {
      std::printf("%-14s %-11s %-5s %-4s %-18s %8s ", c.kernel.c_str(), c.layout.c_str(), dtype_name(c.t),
                  reduction ? op_name(c.op) : "-", shape_str(c.shape).c_str(), size_str(c.per_rank_bytes).c_str());
      std::fflush(stdout);
    }
    // Two input sets of small integers (sums exact in every dtype and any order), alternated call
    // by call so that no call repeats the previous one's inputs. After each loop the output of its
    // last call is checked, element by element and exactly, against the function the inputs were
    // made from (not against the other implementation), on every rank, then that of one more call
    // on the other set into the re-poisoned output (verify_fresh); NCCL's rows the same way.
    const uint64_t seed_of[2] = {ref::mix64(seed + 2 * k), ref::mix64(seed + 2 * k + 1)};
    void* const in_of[2] = {in, in_b};
    for (int i = 0; i < 2; ++i) ref::fill(in_of[i], c.in_elems, c.t, seed_of[i], me, ref::Values::integers, st);
    int next = 0;  // the input set of the next call
    auto run = [&](coll::Collectives* w, void* o) {
      call(c, w, w ? nullptr : &*nccl, in_of[next], o, st);
      next ^= 1;
    };
    auto poison = [&](void* o) { WEAVE_CUDA_CHECK(cudaMemsetAsync(o, 0xff, c.out_max * dtype_size(c.t), st)); };
    std::string err;
    // The last call's output against its inputs; true when right on every rank.
    auto verify = [&](void* o, const char* what) {
      unsigned long long bad = 0;
      std::string msg;
      try {
        comm.sync(st);
        checker.reset(st);
        checker.check(o, nullptr, out_map(c, W, me), c.t, seed_of[next ^ 1], ref::Values::integers, c.op, 0.f, st);
        const auto r = checker.result(st);
        bad = r.bad;
        if (!r.ok()) msg = r.str();
      } catch (const weave::Error& e) {
        bad = 1;
        msg = e.what();
      }
      if (!msg.empty()) err += std::string(err.empty() ? "" : "; ") + what + ", rank " + std::to_string(me) + ": " + msg;
      const auto bads = gather_all<unsigned long long>(comm, bad);
      return std::all_of(bads.begin(), bads.end(), [](unsigned long long b) { return b == 0; });
    };
    // After a loop of w's calls (nullptr: NCCL's) into dst: its last call's output, then one more call
    // on the other set into the re-poisoned output (recheck.hpp). The verdicts are over every rank,
    // so every rank makes the fresh call, or skips it after a failure, alike.
    auto verify_fresh = [&](coll::Collectives* w, void* dst, const std::string& what) {
      struct Verdict {
        bool ok;
        double worst;
      };
      const int last = next ^ 1;
      return bench::check_last_and_fresh(
                 last, 2,
                 [&](int set) {
                   const bool ok = verify(dst, (set == last ? what : what + ", fresh call after it").c_str());
                   return Verdict{ok, ok ? 0.0 : 1.0};
                 },
                 [&] {
                   poison(dst);
                   comm.sync(st);
                   comm.barrier();  // every rank's output poisoned before any peer's fresh call writes into it
                 },
                 [&](int set) {
                   WEAVE_CHECK(set == next, "collectives: fresh call on set ", set, ", next is ", next);
                   run(w, dst);
                 })
          .ok;
    };
    poison(out);
    poison(ref_out);
    comm.sync(st);
    comm.barrier();
    bool threw = false;  // weave refused or failed: nothing to time
    try {
      run(&weave_coll, out);
    } catch (const weave::Error& e) {
      err = std::string("weave: ") + e.what();
      threw = true;
    }
    const auto threw_any = gather_all<int>(comm, threw ? 1 : 0);
    const bool time_weave = std::none_of(threw_any.begin(), threw_any.end(), [](int x) { return x; });
    bool ok_weave = time_weave && verify(out, "weave, first call");
    bool ok_nccl = true;  // no nccl rows: nothing of NCCL's to be wrong
    if (with_nccl) {
      run(nullptr, ref_out);
      ok_nccl = verify(ref_out, "nccl, first call");
    }

    // Timing: the same number of calls on every rank (derived from the size alone), slowest rank.
    const double guess_us = 15 + c.alg_bytes / 100e3;  // ~100 GB/s: only sizes the loop
    const int iters = static_cast<int>(std::clamp(target_ms * 1e3 / guess_us, 1.0, 1000.0));
    auto timed = [&](coll::Collectives* w, void* o) {
      poison(o);
      comm.sync(st);
      comm.barrier();
      const double us = bench::time_us(st, [&] { run(w, o); }, 3, iters, repeats);
      comm.sync(st);
      const auto all = gather_all<double>(comm, us);
      return *std::max_element(all.begin(), all.end());
    };
    const double t_weave = time_weave ? timed(&weave_coll, out) : NAN;
    if (time_weave) ok_weave = verify_fresh(&weave_coll, out, "weave, last timed call") && ok_weave;
    const double t_nccl = with_nccl ? timed(nullptr, ref_out) : NAN;
    if (with_nccl) ok_nccl = verify_fresh(nullptr, ref_out, "nccl, last timed call") && ok_nccl;
    // --host-us: the host's time to issue one call (the same loop, host clock, no event). When it
    // is as long as the device time per call, the host, not the GPU, sets the pace.
    auto host_us = [&](coll::Collectives* w, void* o) {
      poison(o);
      comm.sync(st);
      comm.barrier();
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) run(w, o);
      const auto dt = std::chrono::steady_clock::now() - t0;
      const double us = std::chrono::duration<double, std::micro>(dt).count() / iters;
      comm.sync(st);
      const auto all = gather_all<double>(comm, us);
      return *std::max_element(all.begin(), all.end());
    };
    const bool want_host = a.has("host-us") && time_weave;
    const double h_weave = want_host ? host_us(&weave_coll, out) : NAN;
    if (want_host) ok_weave = verify_fresh(&weave_coll, out, "weave, --host-us loop") && ok_weave;
    const double h_nccl = want_host && with_nccl ? host_us(nullptr, ref_out) : NAN;
    if (want_host && with_nccl) ok_nccl = verify_fresh(nullptr, ref_out, "nccl, --host-us loop") && ok_nccl;
    // --gpu-us: the device's time per call with the host out of the way: a hold kernel keeps the
    // stream busy while the host enqueues every timed call, so the events see back-to-back kernels.
    auto gpu_us = [&](coll::Collectives* w, void* o) {
      const int n = std::min(iters, 200);  // stays inside the launch queue
      for (int i = 0; i < 3; ++i) run(w, o);
      poison(o);
      comm.sync(st);
      comm.barrier();
      std::vector<double> t;
      const unsigned long long hold_ns = static_cast<unsigned long long>(n) * 40000ull + 200000ull;
      for (int r = 0; r < repeats; ++r)
        t.push_back(weave::events_us(st, [&] { hold(st, hold_ns); }, [&] { run(w, o); }, n));
      const auto all = gather_all<double>(comm, bench::median(t));
      return *std::max_element(all.begin(), all.end());
    };
    const bool want_gpu = a.has("gpu-us") && time_weave;
    const double g_weave = want_gpu ? gpu_us(&weave_coll, out) : NAN;
    if (want_gpu) ok_weave = verify_fresh(&weave_coll, out, "weave, --gpu-us loop") && ok_weave;
    const double g_nccl = want_gpu && with_nccl ? gpu_us(nullptr, ref_out) : NAN;
    if (want_gpu && with_nccl) ok_nccl = verify_fresh(nullptr, ref_out, "nccl, --gpu-us loop") && ok_nccl;
    all_ok = all_ok && ok_weave && ok_nccl;

    auto bw = [&](double us) { return c.alg_bytes / us / 1e3; };  // GB/s
    const std::string algo = algo_name(c, weave_coll);
    const double ratio = t_nccl / t_weave;
    if (lead) {
      const char* check = !ok_weave ? "WRONG" : !ok_nccl ? "NCCL!" : "ok";
      if (with_nccl)
        std::printf("%10.1f %9.1f %10.1f %9.1f %7.3f %-5s %s\n", t_weave, bw(t_weave) * c.bus_factor, t_nccl,
                    bw(t_nccl) * c.bus_factor, ratio, check, algo.c_str());
      else
        std::printf("%10.1f %9.1f %10s %9s %7s %-5s %s\n", t_weave, bw(t_weave) * c.bus_factor, "-", "-", "-", check,
                    algo.c_str());
      if (want_host) std::printf("    host us per call: weave %.1f, nccl %.1f\n", h_weave, h_nccl);
      if (want_gpu) std::printf("    gpu us per call (host ahead): weave %.1f, nccl %.1f\n", g_weave, g_nccl);
      if (!err.empty()) std::printf("    %s\n", err.c_str());
      std::fflush(stdout);
      if (std::isfinite(ratio)) {
        auto& lr = log_ratio[c.kernel + " " + c.layout];
        lr.first += std::log(ratio), lr.second += 1;
      }
      for (int impl = 0; impl < (with_nccl ? 2 : 1); ++impl) {
        // A weave call that threw gets a row with zero time and bandwidth, correct false, and the error.
        const double t = impl == 0 && !time_weave ? 0 : impl == 0 ? t_weave : t_nccl;
        bench::JsonLine j;
        j.add("kernel", c.kernel)
            .add("impl", impl == 0 ? "weave" : "nccl")
            .add("dtype", dtype_name(c.t))
            .add("layout", c.layout)
            .add("shape", shape_str(c.shape))
            .add("dim", c.dim)
            .add("world", W)
            .add("bytes", static_cast<long long>(c.per_rank_bytes))
            .add("time_us", t)
            .add("algbw_gbs", t > 0 ? bw(t) : 0.0)
            .add("busbw_gbs", t > 0 ? bw(t) * c.bus_factor : 0.0)
            .add("correct", impl == 0 ? ok_weave : ok_nccl)
            .add("iters", iters);
        if (reduction) j.add("op", op_name(c.op));
        if (impl == 0 && time_weave && with_nccl) j.add("ratio_vs_nccl", ratio);
        if (!with_nccl) j.add("shared_gpu", true);
        if (impl == 0 && !algo.empty()) j.add("algo", algo);
        if (!err.empty() && !(impl == 0 ? ok_weave : ok_nccl)) j.add("error", err);
        if (impl == 1) j.add("includes_copies", c.nccl_copies);
        if (want_host) j.add("host_us", impl == 0 ? h_weave : h_nccl);
        if (want_gpu) j.add("gpu_us", impl == 0 ? g_weave : g_nccl);
        json->write(j);
      }
    }
    if (!err.empty() && !lead) std::fprintf(stderr, "weave-bench collectives: %s\n", err.c_str());
  }
  if (lead) {
    std::printf("geomean ratio weave/NCCL:");
    for (const auto& [name, lr] : log_ratio) std::printf("  %s %.3f", name.c_str(), std::exp(lr.first / lr.second));
    std::printf("\n%s\n", all_ok ? (with_nccl ? "every checked output exact, weave's and NCCL's, on every rank"
                                             : "every checked output of weave's exact, on every rank (no nccl rows)")
                                   : "SOME OUTPUTS ARE WRONG (WRONG: weave's, NCCL!: NCCL's; see the rows)");
  }
  comm.sync(st);
  comm.barrier();
  WEAVE_CUDA_CHECK(cudaFree(ref_out));
  comm.free(out);
  comm.free(in_b);
  comm.free(in);
  WEAVE_CUDA_CHECK(cudaStreamDestroy(st));
  return all_ok ? 0 : 1;
}

}  // namespace

WEAVE_BENCH(collectives,
            "all_reduce / all_gather / reduce_scatter / Ulysses all_to_all: weave vs NCCL (--sizes 1M,1G --dtypes "
            "bf16,fp16,fp32 --kernels ... --ops sum,max,min --cols N --ulysses B,H,D --ar-algo auto|one_shot|two_shot|ll|push|ll128 "
            "--ag-algo auto|direct|ll|ll128 --rs-algo auto|direct|ll|ll128 --host-us --gpu-us --host-breakdown "
            "--target-ms T --repeats R)",
            run);
