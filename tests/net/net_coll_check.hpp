// What the network collectives' GPU tests share (test_net_gpu.cu at one rank per node,
// test_net_gpu_hier.cu at two): the path's options on loopback, the job-wide seed, and calls of
// the collectives with inputs drawn from it, poisoned outputs and a per-element CPU reference.
// Included by .cu test files only (bf16 conversions on the host).
#pragma once
#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "check/seed.hpp"
#include "net_collectives/net_collectives.hpp"
#include "weave/common/error.hpp"
#include "weave/net/net_path.hpp"
#include "weave/runtime/env.hpp"

#define CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << #x

namespace net_coll_test {

namespace net = weave::net;

inline bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// A rank that made no call of its own learns a peer's failure: waits up to `seconds` for its proxy
// to fail, then returns what path.check() throws ("" if nothing).
inline std::string failure_learnt(net::NetPath& path, double seconds = 20) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!path.proxy().failed() && std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  try {
    path.check();
  } catch (const weave::Error& e) {
    return e.what();
  }
  return "";
}

// tcp on loopback unless WEAVE_NET_PROVIDER names another provider.
inline net::NetPathOptions options() {
  net::NetPathOptions o;
  const auto p = weave::env::raw("WEAVE_NET_PROVIDER");
  if (!p || p->empty() || *p == "tcp") o.transport.provider = "tcp", o.transport.domain = "lo";
  o.send_bytes = 16u << 20;
  o.recv_bytes = 64u << 20;
  o.proxy.flags = 8192;
  return o;
}

// One seed for the job: rank 0's (each process draws its own unless WEAVE_TEST_SEED is set), since
// every rank generates its peers' data to check what arrived.
inline uint64_t job_seed(net::NetPath& path) {
  static uint64_t calls = 0;
  const uint64_t mine = weave::check::derive(weave::check::test_seed(), 0x5EED, calls++);
  std::vector<uint64_t> all(path.world());
  path.bootstrap().all_gather(&mine, all.data(), sizeof mine);
  return all[0];
}

enum class Op { all_gather, reduce_scatter, all_reduce };
inline const char* op_name(Op o) {
  return o == Op::all_gather ? "all_gather" : o == Op::reduce_scatter ? "reduce_scatter" : "all_reduce";
}

// Rank q's input element i of call k: a small integer, so that every sum is exact in bf16 and fp32
// and any misplaced, missing or doubled piece shows.
inline int value(uint64_t seed, int q, int k, long long i) {
  return static_cast<int>(weave::check::derive(seed, uint64_t(q) * 100000 + k, uint64_t(i)) % 33) - 16;
}

// Element bits of `v` in the dtype; the poison is all ones (a NaN in both).
inline uint32_t bits(net::NetDtype d, float v) {
  if (d == net::NetDtype::fp32) {
    uint32_t u;
    std::memcpy(&u, &v, 4);
    return u;
  }
  const __nv_bfloat16 b = __float2bfloat16_rn(v);
  uint16_t u;
  std::memcpy(&u, &b, 2);
  return u;
}

struct Call {
  Op op;
  net::NetDtype dtype;
  long long count;
  char* dev = nullptr;
  std::vector<uint8_t> host;  // input before, output after
};

inline void fill(Call& c, uint64_t seed, int rank, int world, int k) {
  const size_t es = net::dtype_bytes(c.dtype);
  c.host.assign(c.count * es, 0xff);  // poison
  long long first, n;
  net::NetCollectives::shard(world, c.count, c.dtype, rank, &first, &n);
  for (long long i = 0; i < c.count; ++i) {
    if (c.op == Op::all_gather && (i < first || i >= first + n)) continue;
    const uint32_t b = bits(c.dtype, static_cast<float>(value(seed, rank, k, i)));
    std::memcpy(c.host.data() + i * es, &b, es);
  }
}

// Every element against the reference: all_gather the owner's input, reduce_scatter the sum on
// the own shard and the untouched input elsewhere, all_reduce the sum everywhere.
inline std::string check_call(const Call& c, uint64_t seed, int rank, int world, int k) {
  const size_t es = net::dtype_bytes(c.dtype);
  long long first, n;
  net::NetCollectives::shard(world, c.count, c.dtype, rank, &first, &n);
  for (long long i = 0; i < c.count; ++i) {
    float want;
    if (c.op == Op::all_gather) {
      int owner = 0;
      for (int q = 0; q < world; ++q) {
        long long f, m;
        net::NetCollectives::shard(world, c.count, c.dtype, q, &f, &m);
        if (i >= f && i < f + m) owner = q;
      }
      want = static_cast<float>(value(seed, owner, k, i));
    } else if (c.op == Op::reduce_scatter && (i < first || i >= first + n)) {
      want = static_cast<float>(value(seed, rank, k, i));
    } else {
      int s = 0;
      for (int q = 0; q < world; ++q) s += value(seed, q, k, i);
      want = static_cast<float>(s);
    }
    uint32_t got = 0;
    std::memcpy(&got, c.host.data() + i * es, es);
    if (got != bits(c.dtype, want))
      return std::string(op_name(c.op)) + " " + (c.dtype == net::NetDtype::bf16 ? "bf16" : "fp32") + " count " +
             std::to_string(c.count) + " call " + std::to_string(k) + ": element " + std::to_string(i) + " is 0x" +
             std::to_string(got) + ", want " + std::to_string(want) + " (own shard [" + std::to_string(first) + ", +" +
             std::to_string(n) + "))";
  }
  return "";
}

inline void run(net::NetCollectives& coll, Call& c) {
  void* p = c.dev;
  if (c.op == Op::all_gather) coll.all_gather(p, c.count, c.dtype, nullptr);
  if (c.op == Op::reduce_scatter) coll.reduce_scatter(p, c.count, c.dtype, nullptr);
  if (c.op == Op::all_reduce) coll.all_reduce(p, c.count, c.dtype, nullptr);
}

}  // namespace net_coll_test
