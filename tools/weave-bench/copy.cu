// weave-bench copy: what a device-to-device copy costs the host that issues it, and what the launch
// after it costs: cudaMemcpyAsync against runtime::device_copy (the kernel weave's staging copies
// use), out of a VMM range (cuMemCreate with a POSIX-fd handle, as the symmetric heap's) or out of
// cudaMalloc memory into cudaMalloc memory, each copy alone and each followed by a one-warp kernel
// launched plainly or with programmatic stream serialization (PDL: every weave call's first kernel
// is such a launch, so a copy at the end of one call is followed by one); and a cudaMemsetAsync of
// the same bytes (some calls zero a counter before their kernel) alone and followed alike.
//   weave-bench copy [--sizes 4,8K,8M,32M] [--json FILE]
// host_us: the median over 30 batches of 50 issues, a synchronize before each batch (the time the
// host is held, not the GPU's); device_us: per copy (and launch) over 100 back to back, CUDA events.
// Every row is checked: the destination is poisoned before the row's loops and compared byte for
// byte with the source (a memset's value) after them.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "bench.hpp"
#include "check/vmm_buffer.hpp"
#include "weave/pdl.cuh"
#include "weave/runtime/device_copy.hpp"

namespace {

using namespace weave;
using namespace weave::bench;

constexpr const char* kWho = "weave-bench copy";
constexpr unsigned char kPoison = 0xA5, kFill = 0x5A;

__global__ void touch(int* p) {
  pdl_enter();
  if (threadIdx.x == 0) atomicAdd(p, 1);
}

struct Buf {
  char* p = nullptr;
  explicit Buf(size_t bytes) { WEAVE_CUDA_CHECK(cudaMalloc(&p, bytes)); }
  ~Buf() { cudaFree(p); }
};

double host_us(const std::function<void()>& f, cudaStream_t st) {
  std::vector<double> v;
  for (int b = 0; b < 30; ++b) {
    WEAVE_CUDA_CHECK(cudaStreamSynchronize(st));
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 50; ++i) f();
    v.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / 50);
  }
  WEAVE_CUDA_CHECK(cudaStreamSynchronize(st));
  return median(v);
}

int run(const Args& a) {
  std::vector<size_t> sizes;
  for (const std::string& s : a.names("sizes", "4,8K,8M,32M")) sizes.push_back(parse_bytes(kWho, "sizes", s));
  JsonSink sink(a);
  WEAVE_CUDA_CHECK(cudaFree(nullptr));
  const size_t most = *std::max_element(sizes.begin(), sizes.end());
  check::VmmBuffer vmm(most);
  Buf src(most), dst(most);
  int* counter = nullptr;
  WEAVE_CUDA_CHECK(cudaMalloc(&counter, sizeof(int)));
  cudaStream_t st;
  WEAVE_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  int dev = 0;
  WEAVE_CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  WEAVE_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  std::vector<unsigned char> pattern(most), back(most);
  for (size_t i = 0; i < most; ++i) pattern[i] = static_cast<unsigned char>((i * 131 + 7) >> 3);
  WEAVE_CUDA_CHECK(cudaMemcpy(src.p, pattern.data(), most, cudaMemcpyHostToDevice));
  WEAVE_CUDA_CHECK(cudaMemcpy(vmm.p(), pattern.data(), most, cudaMemcpyHostToDevice));
  std::printf("%s: %s; host us to issue (held), device us per copy; PDL %s\n", kWho, prop.name,
              pdl_enabled() ? "on" : "off ($WEAVE_PDL=0)");
  std::printf("%10s %-12s %-7s %-11s %9s %9s %s\n", "bytes", "copy", "from", "then", "host_us", "device_us", "check");
  bool all_ok = true;
  for (size_t bytes : sizes)
    for (const char* how : {"memcpy", "device_copy", "memset"})
      for (const char* from : {"malloc", "vmm"})
        for (const char* then : {"none", "plain", "pdl"}) {
          const bool memset = std::strcmp(how, "memset") == 0;
          if (memset && std::strcmp(from, "vmm") == 0) continue;  // no source
          const char* s = std::strcmp(from, "vmm") == 0 ? vmm.p() : src.p;
          const bool kernel = std::strcmp(how, "device_copy") == 0;
          const std::function<void()> issue = [&, s, kernel, memset, then] {
            if (memset) WEAVE_CUDA_CHECK(cudaMemsetAsync(dst.p, kFill, bytes, st));
            else if (kernel) runtime::device_copy(dst.p, s, bytes, st);
            else WEAVE_CUDA_CHECK(cudaMemcpyAsync(dst.p, s, bytes, cudaMemcpyDeviceToDevice, st));
            if (std::strcmp(then, "plain") == 0) {
              touch<<<1, 32, 0, st>>>(counter);
              WEAVE_CUDA_CHECK(cudaGetLastError());
            } else if (std::strcmp(then, "pdl") == 0) {
              launch_pdl(touch, dim3(1), dim3(32), st, counter);
            }
          };
          WEAVE_CUDA_CHECK(cudaMemsetAsync(dst.p, kPoison, bytes, st));
          const double h = host_us(issue, st), d = weave::events_us(st, [] {}, issue, 100);
          WEAVE_CUDA_CHECK(cudaMemcpy(back.data(), dst.p, bytes, cudaMemcpyDeviceToHost));
          const bool ok = memset ? std::all_of(back.begin(), back.begin() + static_cast<long>(bytes),
                                               [](unsigned char c) { return c == kFill; })
                                 : std::memcmp(back.data(), pattern.data(), bytes) == 0;
          all_ok = all_ok && ok;
          std::printf("%10zu %-12s %-7s %-11s %9.2f %9.2f %s\n", bytes, how, memset ? "-" : from, then, h, d,
                      ok ? "ok" : "WRONG");
          sink.write(JsonLine()
                         .add("kernel", "copy_host")
                         .add("impl", how)
                         .add("from", memset ? "-" : from)
                         .add("then", then)
                         .add("bytes", bytes)
                         .add("host_us", h)
                         .add("device_us", d)
                         .add("time_us", d)
                         .add("pdl", pdl_enabled())
                         .add("gpu", prop.name)
                         .add("correct", ok));
        }
  cudaFree(counter);
  cudaStreamDestroy(st);
  return all_ok ? 0 : 1;
}

}  // namespace

WEAVE_BENCH(copy, "a device-to-device copy's host cost, and the launch's after it: cudaMemcpyAsync vs "
                  "weave's device_copy (and a memset), from VMM or cudaMalloc memory (--sizes 4,8K,8M,32M)",
            run);
