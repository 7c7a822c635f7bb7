// runtime::device_copy against the bytes it was given: fresh random bytes, the destination and a
// guard of 64 bytes on each side poisoned first, every combination of source and destination
// offset within 16 bytes (common grids of 16 bytes down to 1), lengths 0..40 and ragged large ones, a
// VMM-mapped source (as the symmetric heap's), back-to-back copies on one stream, rows at pitches
// (device_copy_2d, one pitch past 2^31), the copy between two programmatic launches (eager and in a
// graph), and a copy captured in a CUDA graph and replayed with new source bytes. A byte out of place, a short copy or a write past either end fails.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "check/device_buffer.hpp"
#include "check/seed.hpp"
#include "check/vmm_buffer.hpp"
#include "weave/common/error.hpp"
#include "weave/memory_order.cuh"
#include "weave/pdl.cuh"
#include "weave/runtime/device_copy.hpp"

using namespace weave;

namespace {

constexpr size_t kGuard = 64;
constexpr unsigned char kPoison = 0xA5;

std::vector<unsigned char> random_bytes(size_t n, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<unsigned char> v(n);
  for (auto& b : v) b = static_cast<unsigned char>(g() >> 56);
  return v;
}

// Copies `bytes` from src + so to dst + kGuard + dof on `s` and checks the whole destination
// buffer (the copy, and the poisoned guards around it) after a synchronize.
void check_copy(const char* src_dev, const std::vector<unsigned char>& src, size_t so, char* dst_dev,
                size_t dst_size, size_t dof, size_t bytes, cudaStream_t s, const std::string& what) {
  WEAVE_CUDA_CHECK(cudaMemsetAsync(dst_dev, kPoison, dst_size, s));
  runtime::device_copy(dst_dev + kGuard + dof, src_dev + so, bytes, s);
  WEAVE_CUDA_CHECK(cudaStreamSynchronize(s));
  std::vector<unsigned char> out(dst_size);
  WEAVE_CUDA_CHECK(cudaMemcpy(out.data(), dst_dev, dst_size, cudaMemcpyDeviceToHost));
  size_t bad = 0, first = SIZE_MAX;
  for (size_t i = 0; i < dst_size; ++i) {
    const bool inside = i >= kGuard + dof && i < kGuard + dof + bytes;
    const unsigned char want = inside ? src[so + (i - kGuard - dof)] : kPoison;
    if (out[i] != want) {
      ++bad;
      if (first == SIZE_MAX) first = i;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " bytes wrong, the first at destination byte "
                     << (first == SIZE_MAX ? 0 : long(first) - long(kGuard + dof)) << " of the copy";
}

struct Stream {
  cudaStream_t s{};
  Stream() { WEAVE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~Stream() { cudaStreamDestroy(s); }
};

TEST(DeviceCopy, EveryOffsetAndShortLength) {
  const size_t span = 256;
  const auto src = random_bytes(span, check::case_seed(0));
  check::DeviceBuffer<char> s(span), d(span + 2 * kGuard);
  WEAVE_CUDA_CHECK(cudaMemcpy(s.p, src.data(), span, cudaMemcpyHostToDevice));
  Stream st;
  for (size_t so = 0; so < 16; ++so)
    for (size_t dof = 0; dof < 16; ++dof)
      for (size_t bytes : {size_t(0), size_t(1), size_t(2), size_t(15), size_t(16), size_t(17), size_t(31),
                           size_t(33), size_t(40), size_t(200)})
        check_copy(s.p, src, so, d.p, span + 2 * kGuard, dof, bytes, st.s,
                   "src +" + std::to_string(so) + " dst +" + std::to_string(dof) + " " + std::to_string(bytes) + " B");
}

TEST(DeviceCopy, LargeRaggedLengths) {
  const size_t most = (size_t(24) << 20) + 4099;
  const auto src = random_bytes(most + 16, check::case_seed(0));
  check::DeviceBuffer<char> s(most + 16), d(most + 16 + 2 * kGuard);
  WEAVE_CUDA_CHECK(cudaMemcpy(s.p, src.data(), most + 16, cudaMemcpyHostToDevice));
  Stream st;
  for (size_t bytes : {size_t(4097), size_t(1) << 20, (size_t(8) << 20) + 48, most})
    for (auto [so, dof] : {std::pair<size_t, size_t>{0, 0}, {16, 0}, {3, 3}, {5, 11}})
      check_copy(s.p, src, so, d.p, most + 16 + 2 * kGuard, dof, bytes, st.s,
                 std::to_string(bytes) + " B, src +" + std::to_string(so) + " dst +" + std::to_string(dof));
}

// The symmetric heap's memory is a cuMemCreate allocation mapped into a reserved range.
TEST(DeviceCopy, FromAndIntoVmmMemory) {
  const size_t bytes = (size_t(3) << 20) + 77;
  check::VmmBuffer vmm(bytes + 2 * kGuard);
  const auto src = random_bytes(bytes + 16, check::case_seed(0));
  check::DeviceBuffer<char> s(bytes + 16), d(bytes + 16 + 2 * kGuard);
  Stream st;
  WEAVE_CUDA_CHECK(cudaMemcpy(vmm.p(), src.data(), bytes + 16, cudaMemcpyHostToDevice));
  check_copy(vmm.p(), src, 7, d.p, bytes + 16 + 2 * kGuard, 7, bytes, st.s, "VMM -> cudaMalloc");
  WEAVE_CUDA_CHECK(cudaMemcpy(s.p, src.data(), bytes + 16, cudaMemcpyHostToDevice));
  check_copy(s.p, src, 0, vmm.p(), vmm.size, 0, bytes, st.s, "cudaMalloc -> VMM");
}

// Copies queued back to back (a chain through three buffers, nothing synchronised between) land
// in stream order.
TEST(DeviceCopy, BackToBackInStreamOrder) {
  const size_t bytes = (size_t(5) << 20) + 9;
  const auto src = random_bytes(bytes, check::case_seed(0));
  check::DeviceBuffer<char> a(bytes), b(bytes), c(bytes + 2 * kGuard);
  WEAVE_CUDA_CHECK(cudaMemcpy(a.p, src.data(), bytes, cudaMemcpyHostToDevice));
  WEAVE_CUDA_CHECK(cudaMemset(c.p, kPoison, bytes + 2 * kGuard));
  Stream st;
  for (int i = 0; i < 50; ++i) {
    runtime::device_copy(b.p, a.p, bytes, st.s);
    runtime::device_copy(a.p, b.p, bytes, st.s);
  }
  check_copy(a.p, src, 0, c.p, bytes + 2 * kGuard, 0, bytes, st.s, "after 100 chained copies");
}

// device_copy_2d: rows at pitches off the 16-byte grid and wider than a row, more rows than the
// grid has block rows, and a pitch beyond cudaMemcpy2DAsync's limit (2^31 - 1 bytes), each row
// checked with the gaps between rows still poisoned.
void check_2d(size_t width, size_t rows, size_t dpitch, size_t spitch, size_t so, size_t dof, cudaStream_t st) {
  const size_t sbytes = so + (rows - 1) * spitch + width, dbytes = dof + (rows - 1) * dpitch + width + kGuard;
  check::DeviceBuffer<char> s(sbytes), d(dbytes);
  std::vector<unsigned char> src(sbytes);
  std::mt19937_64 g(check::case_seed(0));
  // Only the rows' bytes are random (a multi-GB pitch leaves the gaps as they are).
  for (size_t r = 0; r < rows; ++r) {
    for (size_t i = 0; i < width; ++i) src[so + r * spitch + i] = static_cast<unsigned char>(g() >> 56);
    WEAVE_CUDA_CHECK(cudaMemcpy(s.p + so + r * spitch, src.data() + so + r * spitch, width, cudaMemcpyHostToDevice));
  }
  const bool gaps = dbytes < (size_t(64) << 20);  // small enough to read back whole
  if (gaps) WEAVE_CUDA_CHECK(cudaMemset(d.p, kPoison, dbytes));
  runtime::device_copy_2d(d.p + dof, dpitch, s.p + so, spitch, width, rows, st);
  WEAVE_CUDA_CHECK(cudaStreamSynchronize(st));
  const std::string what = std::to_string(rows) + " rows of " + std::to_string(width) + " B, pitches " +
                           std::to_string(dpitch) + " / " + std::to_string(spitch);
  if (gaps) {
    std::vector<unsigned char> out(dbytes);
    WEAVE_CUDA_CHECK(cudaMemcpy(out.data(), d.p, dbytes, cudaMemcpyDeviceToHost));
    size_t bad = 0;
    for (size_t i = 0; i < dbytes; ++i) {
      const bool in_row = i >= dof && (i - dof) % dpitch < width && (i - dof) / dpitch < rows;
      const size_t r = (i - dof) / dpitch;
      const unsigned char want = in_row ? src[so + r * spitch + (i - dof) % dpitch] : kPoison;
      bad += out[i] != want;
    }
    EXPECT_EQ(bad, 0u) << what;
    return;
  }
  std::vector<unsigned char> row(width);
  for (size_t r = 0; r < rows; ++r) {
    WEAVE_CUDA_CHECK(cudaMemcpy(row.data(), d.p + dof + r * dpitch, width, cudaMemcpyDeviceToHost));
    EXPECT_EQ(std::memcmp(row.data(), src.data() + so + r * spitch, width), 0) << what << ": row " << r;
  }
}

TEST(DeviceCopy, RowsAtPitches) {
  Stream st;
  check_2d(4096, 3, 8192, 4096 + 48, 0, 0, st.s);
  check_2d(1000, 5, 1003, 1017, 3, 1, st.s);                     // pitches off every grid
  check_2d(40, 70000, 48, 40, 0, 16, st.s);                      // more rows than block rows
  check_2d((size_t(1) << 20) + 16, 2, (size_t(3) << 20) + 16, (size_t(1) << 20) + 32, 16, 0, st.s);
  check_2d(4096 + 5, 2, (size_t(1) << 31) + 16, 4096 + 16, 0, 0, st.s);  // a pitch beyond 2^31 - 1
}

// The copy as a programmatic launch between two others: a producer launched with launch_pdl that
// lets its dependents start at once, then spins ~200 µs before writing the source; the copy; a
// consumer (launch_pdl) that waits and then compares. A copy that did not wait for the producer
// copies the old bytes; one the consumer did not wait for leaves bytes unwritten. Eager and
// captured in a CUDA graph (programmatic edges).
__global__ void slow_fill(uint32_t* p, size_t n, uint32_t salt) {
  griddep_launch_dependents();  // dependents may be scheduled now: only their waits order them
  griddep_wait();
  const unsigned long long t0 = globaltimer();
  while (globaltimer() - t0 < 200000ull) {
  }
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = static_cast<uint32_t>(i * 2654435761u) ^ salt;
}
__global__ void count_wrong(const uint32_t* p, size_t n, uint32_t salt, unsigned long long* bad) {
  pdl_enter();
  unsigned long long k = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    k += p[i] != (static_cast<uint32_t>(i * 2654435761u) ^ salt);
  if (k) atomicAdd(bad, k);
}

TEST(DeviceCopy, OrderedBetweenProgrammaticLaunches) {
  if (!pdl_enabled()) GTEST_SKIP() << "WEAVE_PDL=0: no programmatic launches";
  const size_t n = (size_t(4) << 20) + 3, bytes = n * sizeof(uint32_t);
  check::DeviceBuffer<uint32_t> src(n), dst(n);
  check::DeviceBuffer<unsigned long long> bad(1);
  Stream st;
  auto enqueue = [&](uint32_t salt) {
    launch_pdl(slow_fill, dim3(64), dim3(256), st.s, src.p, n, salt);
    runtime::device_copy(dst.p, src.p, bytes, st.s);
    launch_pdl(count_wrong, dim3(64), dim3(256), st.s, static_cast<const uint32_t*>(dst.p), n, salt, bad.p);
  };
  for (uint32_t salt : {1u, 2u, 3u}) {
    WEAVE_CUDA_CHECK(cudaMemsetAsync(bad.p, 0, sizeof(unsigned long long), st.s));
    enqueue(salt);
    unsigned long long b = 0;
    WEAVE_CUDA_CHECK(cudaMemcpyAsync(&b, bad.p, sizeof b, cudaMemcpyDeviceToHost, st.s));
    WEAVE_CUDA_CHECK(cudaStreamSynchronize(st.s));
    EXPECT_EQ(b, 0u) << "eager, salt " << salt;
  }
  cudaGraph_t g{};
  WEAVE_CUDA_CHECK(cudaStreamBeginCapture(st.s, cudaStreamCaptureModeThreadLocal));
  enqueue(7u);
  WEAVE_CUDA_CHECK(cudaStreamEndCapture(st.s, &g));
  cudaGraphExec_t x{};
  WEAVE_CUDA_CHECK(cudaGraphInstantiate(&x, g, 0));
  for (int r = 0; r < 3; ++r) {
    WEAVE_CUDA_CHECK(cudaMemsetAsync(dst.p, 0, bytes, st.s));
    WEAVE_CUDA_CHECK(cudaMemsetAsync(src.p, 0, bytes, st.s));
    WEAVE_CUDA_CHECK(cudaMemsetAsync(bad.p, 0, sizeof(unsigned long long), st.s));
    WEAVE_CUDA_CHECK(cudaGraphLaunch(x, st.s));
    unsigned long long b = 0;
    WEAVE_CUDA_CHECK(cudaMemcpyAsync(&b, bad.p, sizeof b, cudaMemcpyDeviceToHost, st.s));
    WEAVE_CUDA_CHECK(cudaStreamSynchronize(st.s));
    EXPECT_EQ(b, 0u) << "graph replay " << r;
  }
  cudaGraphExecDestroy(x);
  cudaGraphDestroy(g);
}

TEST(DeviceCopy, CapturedAndReplayed) {
  const size_t bytes = (size_t(2) << 20) + 3;
  check::DeviceBuffer<char> s(bytes), d(bytes);
  Stream st;
  cudaGraph_t g{};
  WEAVE_CUDA_CHECK(cudaStreamBeginCapture(st.s, cudaStreamCaptureModeThreadLocal));
  runtime::device_copy(d.p, s.p, bytes, st.s);
  WEAVE_CUDA_CHECK(cudaStreamEndCapture(st.s, &g));
  cudaGraphExec_t x{};
  WEAVE_CUDA_CHECK(cudaGraphInstantiate(&x, g, 0));
  for (int r = 0; r < 3; ++r) {
    const auto src = random_bytes(bytes, check::case_seed(r));
    WEAVE_CUDA_CHECK(cudaMemcpy(s.p, src.data(), bytes, cudaMemcpyHostToDevice));
    WEAVE_CUDA_CHECK(cudaMemset(d.p, kPoison, bytes));
    WEAVE_CUDA_CHECK(cudaGraphLaunch(x, st.s));
    WEAVE_CUDA_CHECK(cudaStreamSynchronize(st.s));
    std::vector<unsigned char> out(bytes);
    WEAVE_CUDA_CHECK(cudaMemcpy(out.data(), d.p, bytes, cudaMemcpyDeviceToHost));
    EXPECT_EQ(std::memcmp(out.data(), src.data(), bytes), 0) << "replay " << r;
  }
  cudaGraphExecDestroy(x);
  cudaGraphDestroy(g);
}

}  // namespace
