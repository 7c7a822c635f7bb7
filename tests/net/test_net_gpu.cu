// Kernels on the network path between 2 simulated nodes of one rank each (weave-run -n 2
// --nodes 2; on one GPU with WEAVE_SHARE_GPUS=1): a kernel that pushes commands and polls flags,
// the inter-node all_gather / reduce_scatter / all_reduce against CPU references (ragged sizes,
// several chunk sizes, poisoned outputs, bf16 and fp32), 200 back-to-back calls each checked,
// mismatched calls rejected on every rank, and failures: a rank's abort releases a peer's kernel waiting on a flag, and a device-side
// wait timeout ends in a diagnostic on both ranks.
#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "net_coll_check.hpp"
#include "weave/common/error.hpp"
#include "weave/net/device.cuh"

namespace net = weave::net;

namespace {

using namespace net_coll_test;

// ---- a kernel on the raw device API -------------------------------------------------------------

// Block 0 sends `bytes` of src to the peer through the send gate; block 1 waits for the peer's
// chunk and copies it to dst.
__global__ void ping(net::NetHandle h, uint64_t call, uint64_t before, uint64_t recv_base, uint32_t flag, const char* src,
                     char* dst, uint64_t bytes) {
  if (blockIdx.x == 0) {
    if (!net::open_send_gate(h, call, before, true)) return;
    net::block_copy_out(h.send, src, bytes);
    __syncthreads();
    if (threadIdx.x == 0) {
      net::Producer p{h.queue};
      net::push(h, p, net::Command{0, recv_base, bytes, 1, flag, static_cast<uint16_t>(1 - h.rank), net::kNotify, 0});
    }
  } else {
    __shared__ int ok;
    if (threadIdx.x == 0) ok = net::wait_arrival(h, flag);
    __syncthreads();
    if (!ok) return;
    net::block_copy_in(dst, h.recv + recv_base, bytes);
    __syncthreads();
    if (threadIdx.x == 0) net::consume(h, flag);
  }
}

// One call on fresh inputs, waited for and checked: "" or what is wrong.
std::string run_checked(net::NetCollectives& coll, net::NetPath& path, Call& c, uint64_t seed, int r, int w, int k) {
  fill(c, seed, r, w, k);
  WEAVE_CUDA_CHECK(cudaMalloc(&c.dev, c.host.size()));
  WEAVE_CUDA_CHECK(cudaMemcpy(c.dev, c.host.data(), c.host.size(), cudaMemcpyHostToDevice));
  run(coll, c);
  path.finish(nullptr);
  WEAVE_CUDA_CHECK(cudaMemcpy(c.host.data(), c.dev, c.host.size(), cudaMemcpyDeviceToHost));
  cudaFree(c.dev);
  return check_call(c, seed, r, w, k);
}

uint8_t byte_of(uint64_t seed, int rank, int round, size_t i) {
  return static_cast<uint8_t>(weave::check::derive(seed, uint64_t(rank) * 1000 + round, i) >> 24);
}

// 200 rounds back to back (one sync at the end), ragged sizes, each round's bytes checked.
TEST(NetGpu, KernelPushesCommandsAndPollsFlags) {
  net::NetPath path(options());
  ASSERT_EQ(path.world(), 2) << "run under weave-run -n 2 --nodes 2";
  ASSERT_EQ(path.topo().nodes, 2);
  const uint64_t seed = job_seed(path);
  const int rounds = 200, r = path.rank();
  std::vector<size_t> size(rounds), off(rounds + 1, 0);
  for (int k = 0; k < rounds; ++k) {
    size[k] = 1 + (weave::check::derive(seed, 7, k) % 20000);
    off[k + 1] = off[k] + (size[k] + 15) / 16 * 16;
  }
  std::vector<uint8_t> src(off[rounds]), got(off[rounds]);
  for (int k = 0; k < rounds; ++k)
    for (size_t i = 0; i < size[k]; ++i) src[off[k] + i] = byte_of(seed, r, k, i);
  char *d_src, *d_dst;
  CUDA_OK(cudaMalloc(&d_src, src.size()));
  CUDA_OK(cudaMalloc(&d_dst, src.size()));
  CUDA_OK(cudaMemcpy(d_src, src.data(), src.size(), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(d_dst, 0xee, src.size()));
  const net::NetHandle h = path.handle();
  for (int k = 0; k < rounds; ++k) {
    const net::NetPath::Call c = path.begin_call(1);
    ping<<<2, 128>>>(h, c.index, c.commands_before, c.recv_offset, c.flag_offset, d_src + off[k], d_dst + off[k], size[k]);
  }
  path.finish(nullptr);
  CUDA_OK(cudaMemcpy(got.data(), d_dst, got.size(), cudaMemcpyDeviceToHost));
  for (int k = 0; k < rounds; ++k)
    for (size_t i = 0; i < size[k]; ++i)
      ASSERT_EQ(got[off[k] + i], byte_of(seed, 1 - r, k, i)) << "round " << k << " byte " << i << " of " << size[k];
  path.shutdown();
  cudaFree(d_src);
  cudaFree(d_dst);
}

// ---- the collectives ------------------------------------------------------------------------------

TEST(NetGpu, CollectivesMatchTheReference) {
  net::NetPath path(options());
  const uint64_t seed = job_seed(path);
  const int r = path.rank(), w = path.world();
  int k = 0;
  for (long long chunk : {4096LL, 65536LL, 256LL << 10}) {
    net::NetCollOptions co;
    co.chunk_bytes = chunk;
    net::NetCollectives coll(path, co);
    for (net::NetDtype d : {net::NetDtype::bf16, net::NetDtype::fp32})
      for (Op op : {Op::all_gather, Op::reduce_scatter, Op::all_reduce})
        for (long long count : {1LL, 7LL, 8LL, 1000LL, 4099LL, 65536LL + 3, (1LL << 20) + 5}) {
          Call c{op, d, count};
          ASSERT_EQ(run_checked(coll, path, c, seed, r, w, k), "") << "chunk " << chunk;
          ++k;
        }
  }
  path.shutdown();
}

// 200 calls launched back to back (one finish), operators, dtypes and sizes changing from call
// to call, so receive slots, flags and the send gate are reused under load; every call checked.
TEST(NetGpu, TwoHundredBackToBackCallsEachChecked) {
  net::NetPath path(options());
  const uint64_t seed = job_seed(path) ^ 0x5a5a;
  const int r = path.rank(), w = path.world();
  net::NetCollOptions co;
  co.chunk_bytes = 4096;
  net::NetCollectives coll(path, co);
  std::vector<Call> calls;
  for (int k = 0; k < 200; ++k) {
    calls.push_back(Call{static_cast<Op>(k % 3), k % 2 ? net::NetDtype::fp32 : net::NetDtype::bf16,
                         1 + static_cast<long long>(weave::check::derive(seed, 3, k) % 30000)});
    Call& c = calls.back();
    fill(c, seed, r, w, k);
    CUDA_OK(cudaMalloc(&c.dev, c.host.size()));
    CUDA_OK(cudaMemcpy(c.dev, c.host.data(), c.host.size(), cudaMemcpyHostToDevice));
  }
  for (Call& c : calls) run(coll, c);
  path.finish(nullptr);
  for (int k = 0; k < 200; ++k) {
    Call& c = calls[k];
    CUDA_OK(cudaMemcpy(c.host.data(), c.dev, c.host.size(), cudaMemcpyDeviceToHost));
    cudaFree(c.dev);
    ASSERT_EQ(check_call(c, seed, r, w, k), "");
  }
  path.shutdown();
}

TEST(NetGpu, RejectsCallsThatDoNotFit) {
  net::NetPathOptions o = options();
  o.send_bytes = 1 << 16;
  o.recv_bytes = 1 << 17;
  o.proxy.flags = 64;
  net::NetPath path(o);
  net::NetCollectives coll(path);  // 256 KiB pieces
  void* buf;
  CUDA_OK(cudaMalloc(&buf, 1 << 20));
  try {
    coll.all_gather(buf, 1 << 18, net::NetDtype::fp32, nullptr);  // 1 MiB: 512 KiB shards
    FAIL() << "an all_gather larger than the send buffer was launched";
  } catch (const weave::Error& e) {
    EXPECT_TRUE(has(e.what(), "send buffer") && has(e.what(), "NetPathOptions::send_bytes")) << e.what();
  }
  EXPECT_THROW(coll.all_gather(static_cast<char*>(buf) + 2, 8, net::NetDtype::bf16, nullptr), weave::Error);
  net::NetCollOptions bad;
  bad.chunk_bytes = 100;
  EXPECT_THROW(net::NetCollectives(path, bad), weave::Error);
  cudaFree(buf);
  path.shutdown();
}

// A bad argument on one rank, or ranks calling different collectives with equal counts, throws on
// every rank before anything is launched (the call's agreement); the path stays usable, and a
// correct call afterwards is checked.
TEST(NetGpu, MismatchedCallsRejectedOnEveryRank) {
  net::NetPath path(options());
  const uint64_t seed = job_seed(path) ^ 0x77;
  const int r = path.rank(), w = path.world();
  net::NetCollectives coll(path);
  const long long count = 4096 + 8;
  void* buf;
  CUDA_OK(cudaMalloc(&buf, count * 4 + 16));
  std::string msg;
  try {  // rank 0 an all_gather, the others an all_reduce of the same count and dtype
    if (r == 0) coll.all_gather(buf, count, net::NetDtype::fp32, nullptr);
    else coll.all_reduce(buf, count, net::NetDtype::fp32, nullptr);
  } catch (const weave::Error& e) {
    msg = e.what();
  }
  EXPECT_TRUE(has(msg, "called with (operator, count") && has(msg, "all_gather") && has(msg, "all_reduce"))
      << "rank " << r << ": " << msg;
  msg.clear();
  try {  // the last rank's buffer misaligned: its own error there, the verdict everywhere else
    char* b = static_cast<char*>(buf) + (r == w - 1 ? 4 : 0);
    coll.reduce_scatter(b, count, net::NetDtype::fp32, nullptr);
  } catch (const weave::Error& e) {
    msg = e.what();
  }
  EXPECT_TRUE(r == w - 1 ? has(msg, "16-byte aligned") : has(msg, "rejected its arguments")) << "rank " << r << ": " << msg;
  cudaFree(buf);
  Call c{Op::all_reduce, net::NetDtype::bf16, count};
  EXPECT_EQ(run_checked(coll, path, c, seed, r, w, 0), "");
  path.shutdown();
}

// ---- failures -------------------------------------------------------------------------------------

// Both ranks run one call of a plan (the key is then agreed: a later call of it launches without
// waiting for the peers' posts), so that the call after it reaches the device on rank 0 alone.
void agree_on_all_gather(net::NetPath& path, net::NetCollectives& coll, void* buf, int count, net::NetDtype dt) {
  coll.all_gather(buf, count, dt, nullptr);
  path.finish(nullptr);
}

// Rank 0's kernel waits for rank 1's shard, which never comes: rank 1 aborts its path instead.
// The abort word releases rank 0's kernel, and finish() throws rank 1's reason on rank 0.
TEST(NetGpu, AbortReleasesAKernelWaitingOnAFlag) {
  net::NetPath path(options());
  net::NetCollectives coll(path);
  void* buf;
  CUDA_OK(cudaMalloc(&buf, 1 << 16));
  agree_on_all_gather(path, coll, buf, 1 << 14, net::NetDtype::bf16);
  const auto t0 = std::chrono::steady_clock::now();
  std::string error;
  if (path.rank() == 0) {
    coll.all_gather(buf, 1 << 14, net::NetDtype::bf16, nullptr);
    try {
      path.finish(nullptr);
    } catch (const weave::Error& e) {
      error = e.what();
    }
  } else {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    path.abort("the test's rank 1 gives up");
    try {
      path.check();
    } catch (const weave::Error& e) {
      error = e.what();
    }
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(has(error, "the test's rank 1 gives up")) << "'" << error << "'";
  if (path.rank() == 0) EXPECT_TRUE(has(error, "rank 1 failed") && has(error, "a kernel stopped")) << error;
  EXPECT_LT(s, 15) << error;
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // the context is still usable
  EXPECT_THROW(coll.all_gather(buf, 16, net::NetDtype::bf16, nullptr), weave::Error);  // the path is not
  cudaFree(buf);
}

// Rank 0's kernel waits with a 1 s device timeout while rank 1 stays healthy but does not call:
// the kernel gives up, rank 0 throws the timeout naming the chunk, and rank 1 learns it.
TEST(NetGpu, DeviceWaitTimeoutIsADiagnosticOnBothRanks) {
  net::NetPathOptions o = options();
  o.wait_timeout_s = 1;
  net::NetPath path(o);
  net::NetCollectives coll(path);
  void* buf;
  CUDA_OK(cudaMalloc(&buf, 1 << 16));
  agree_on_all_gather(path, coll, buf, 1 << 14, net::NetDtype::fp32);
  std::string error;
  if (path.rank() == 0) {
    coll.all_gather(buf, 1 << 14, net::NetDtype::fp32, nullptr);
    try {
      path.finish(nullptr);
    } catch (const weave::Error& e) {
      error = e.what();
    }
    EXPECT_TRUE(has(error, "gave up after") && has(error, "chunk")) << error;
  } else {
    error = failure_learnt(path);
    EXPECT_TRUE(has(error, "rank 0 failed") && has(error, "gave up after")) << error;
  }
  cudaFree(buf);
}

}  // namespace
