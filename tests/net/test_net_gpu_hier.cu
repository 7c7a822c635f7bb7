// The hierarchical network collectives (more than one rank per node) under weave-run -n 4
// --nodes 2: 2 simulated nodes of 2 ranks (on one GPU with --share-gpus), the network phase
// between rail peers and the NVLink phases through each node's communicator
// (runtime::node_launch_info). all_gather / reduce_scatter / all_reduce in bf16 and fp32 at
// ragged sizes and two chunk sizes against the CPU reference, inputs fresh from the job-wide seed,
// outputs poisoned; 200 back-to-back mixed calls each checked; the refusals (a buffer outside the
// node's heap, a call larger than the node scratch, the G = 1 constructor, a job-wide
// communicator) before anything is launched. Every test runs twice: through the host-composed
// phases and through the fused kernel (NetCollOptions::fused), the parameter.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "net_coll_check.hpp"
#include "weave/common/error.hpp"
#include "weave/runtime/communicator.hpp"
#include "weave/runtime/launch.hpp"

namespace net = weave::net;
namespace rt = weave::runtime;

namespace {

using namespace net_coll_test;

// This node's communicator: its ranks only, named after the node so that the simulated nodes'
// bootstraps never meet.
rt::Communicator node_comm(net::NetPath& path) {
  rt::CommOptions o;
  o.heap_bytes = size_t(512) << 20;
  return rt::Communicator(rt::node_launch_info(rt::detect_launch(), path.bootstrap().hostnames()[path.rank()]), o);
}

// The parameter of every test: the fused kernel (true) or the host-composed phases.
using NetGpuHier = ::testing::TestWithParam<bool>;

net::NetCollOptions coll_options(long long chunk, bool fused) {
  net::NetCollOptions o;
  o.fused = fused;
  o.chunk_bytes = chunk;
  o.node_scratch_bytes = 16u << 20;
  return o;
}

void expect_hierarchy(const net::NetPath& path) {
  ASSERT_EQ(path.world(), 4) << "run under weave-run -n 4 --nodes 2";
  ASSERT_EQ(path.topo().nodes, 2);
  ASSERT_EQ(path.topo().gpus, 2);
}

// A call's buffer in the node's heap (the same sizes in the same order on every rank of a node).
void upload(rt::Communicator& node, Call& c) {
  c.dev = static_cast<char*>(node.alloc(c.host.size()));
  CUDA_OK(cudaMemcpy(c.dev, c.host.data(), c.host.size(), cudaMemcpyHostToDevice));
}

TEST_P(NetGpuHier, CollectivesMatchTheReference) {
  net::NetPath path(options());
  expect_hierarchy(path);
  rt::Communicator node = node_comm(path);
  const uint64_t seed = job_seed(path);
  const int r = path.rank(), w = path.world();
  int k = 0;
  for (long long chunk : {4096LL, 256LL << 10}) {
    net::NetCollectives coll(path, node, coll_options(chunk, GetParam()));
    for (net::NetDtype d : {net::NetDtype::bf16, net::NetDtype::fp32})
      for (Op op : {Op::all_gather, Op::reduce_scatter, Op::all_reduce})
        for (long long count : {1LL, 7LL, 8LL, 9LL, 1000LL, 4099LL, 65536LL + 3, (1LL << 20) + 5}) {
          Call c{op, d, count};
          fill(c, seed, r, w, k);
          upload(node, c);
          run(coll, c);
          coll.finish(nullptr);
          CUDA_OK(cudaMemcpy(c.host.data(), c.dev, c.host.size(), cudaMemcpyDeviceToHost));
          // No rank of the node still reads this buffer (their device work ended before they
          // reached the barrier) when it goes back to the heap.
          node.barrier();
          node.free(c.dev);
          ASSERT_EQ(check_call(c, seed, r, w, k), "") << "chunk " << chunk;
          ++k;
        }
  }
  path.shutdown();
}

// 200 calls launched back to back (one finish), operators, dtypes and sizes changing from call to
// call, so the receive slots, flags, send gate, node scratch and the single-node collectives'
// signals are reused under load; every call's buffer its own, poisoned outside its inputs, and
// checked.
TEST_P(NetGpuHier, TwoHundredBackToBackCallsEachChecked) {
  net::NetPath path(options());
  expect_hierarchy(path);
  rt::Communicator node = node_comm(path);
  const uint64_t seed = job_seed(path) ^ 0x5a5a;
  const int r = path.rank(), w = path.world();
  net::NetCollectives coll(path, node, coll_options(4096, GetParam()));
  constexpr int kCalls = 200;
  std::vector<Call> calls;
  for (int k = 0; k < kCalls; ++k) {
    calls.push_back(Call{static_cast<Op>(k % 3), k % 2 ? net::NetDtype::fp32 : net::NetDtype::bf16,
                         1 + static_cast<long long>(weave::check::derive(seed, 3, k) % 30000)});
    fill(calls.back(), seed, r, w, k);
    upload(node, calls.back());
  }
  for (Call& c : calls) run(coll, c);
  coll.finish(nullptr);
  for (int k = 0; k < kCalls; ++k) {
    Call& c = calls[k];
    CUDA_OK(cudaMemcpy(c.host.data(), c.dev, c.host.size(), cudaMemcpyDeviceToHost));
    ASSERT_EQ(check_call(c, seed, r, w, k), "") << "call " << k;
  }
  node.barrier();
  for (int k = kCalls - 1; k >= 0; --k) node.free(calls[k].dev);
  path.shutdown();
}

// Every refusal is an error on every rank alike, before anything is launched: the path stays
// usable (the last call runs).
TEST_P(NetGpuHier, RefusesBadInputsBeforeLaunching) {
  net::NetPath path(options());
  expect_hierarchy(path);
  try {
    net::NetCollectives one(path);
    FAIL() << "the one-rank-per-node constructor accepted 2 ranks per node";
  } catch (const weave::Error& e) {
    EXPECT_TRUE(has(e.what(), "node_launch_info")) << e.what();
  }
  try {
    rt::Communicator job(rt::detect_launch(), rt::CommOptions{});
    FAIL() << "a communicator over a 2-node job was made";
  } catch (const weave::Error& e) {
    EXPECT_TRUE(has(e.what(), "node_launch_info") && has(e.what(), "NetPath")) << e.what();
  }
  rt::Communicator node = node_comm(path);
  net::NetCollOptions o = coll_options(4096, GetParam());
  o.node_scratch_bytes = 4096;
  net::NetCollectives coll(path, node, o);
  void* outside;
  CUDA_OK(cudaMalloc(&outside, 1 << 16));
  try {
    coll.all_reduce(outside, 1000, net::NetDtype::fp32, nullptr);
    FAIL() << "a buffer outside the node's heap was accepted";
  } catch (const weave::Error& e) {
    EXPECT_TRUE(has(e.what(), "heap")) << e.what();
  }
  char* buf = static_cast<char*>(node.alloc(1 << 16));
  try {
    coll.reduce_scatter(buf, 8192, net::NetDtype::fp32, nullptr);  // 2 x 8 KiB partials > 4 KiB
    FAIL() << "a reduce_scatter larger than the node scratch was launched";
  } catch (const weave::Error& e) {
    EXPECT_TRUE(has(e.what(), "NetCollOptions::node_scratch_bytes")) << e.what();
  }
  EXPECT_THROW(coll.all_gather(buf + 2, 8, net::NetDtype::bf16, nullptr), weave::Error);  // misaligned
  EXPECT_THROW(coll.all_gather(buf, -1, net::NetDtype::bf16, nullptr), weave::Error);
  coll.all_reduce(buf, 1000, net::NetDtype::fp32, nullptr);  // fits: nothing was half-launched before
  coll.finish(nullptr);
  node.barrier();
  node.free(buf);
  cudaFree(outside);
  path.shutdown();
}

INSTANTIATE_TEST_SUITE_P(Paths, NetGpuHier, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& p) { return p.param ? "fused" : "composed"; });

}  // namespace
