// Host rules of one collective sequence-parallel call (ring and Ulysses attention): every rank
// rejects a call together, and one object's calls run one after the other.
#pragma once
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "weave/common/error.hpp"
#include "weave/runtime/communicator.hpp"

namespace weave::attention {

// Bytes [a, a + na) and [b, b + nb) share an address.
inline bool overlap(const void* a, size_t na, const void* b, size_t nb) {
  const auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return na && nb && x < y + nb && y < x + na;
}

// The checks ring and Ulysses attention share (throws weave::Error naming `who`): shape, scale,
// communicator count (launch_gathered's bound), q, k, v, o present and 16-byte aligned (TMA).
inline void check_common(const char* who, int B, int Hq, int Hkv, int D, float scale, int num_comm_sms, int sm_count,
                         const void* q, const void* k, const void* v, const void* o) {
  WEAVE_CHECK(B >= 1 && Hq >= 1 && Hkv >= 1, who, ": B, Hq, Hkv must be positive, got B=", B, " Hq=", Hq, " Hkv=", Hkv);
  WEAVE_CHECK(D == 64 || D == 128, who, ": head dim D must be 64 or 128, got ", D);
  WEAVE_CHECK(Hq % Hkv == 0, who, ": Hq = ", Hq, " is not a multiple of Hkv = ", Hkv);
  WEAVE_CHECK(scale >= 0.f && std::isfinite(scale), who,
              ": softmax_scale must be finite and >= 0 (0 = 1/sqrt(D)), got ", scale);
  WEAVE_CHECK(num_comm_sms < 0 || (num_comm_sms >= 1 && num_comm_sms <= sm_count / 2), who, ": num_comm_sms = ",
              num_comm_sms, " must be < 0 (tuner) or in [1, ", sm_count / 2, "] (half the SMs)");
  WEAVE_CHECK(q && k && v && o, who, ": null q, k, v or o");
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  WEAVE_CHECK(aligned(q) && aligned(k) && aligned(v) && aligned(o), who,
              ": q, k, v and o must be 16-byte aligned (TMA)");
}

// The cross-rank check of a call: `values` (shape, options) must agree, and `problem` is what
// this rank found wrong with its own arguments (empty: nothing). A rank that threw alone would
// leave its peers' kernels waiting for it until the wait timeout, so whether any rank found a
// problem is part of what must agree: every rank throws, the one with the problem its message.
inline void check_call(runtime::Communicator& c, const std::string& what, std::vector<long long> values,
                       const std::string& problem) {
  values.push_back(problem.empty() ? 0 : 1);
  try {
    c.check_same(what + " and whether the arguments are valid", values);
  } catch (const Error&) {
    if (!problem.empty()) throw Error(problem);
    throw;
  }
  if (!problem.empty()) throw Error(problem);
}

// Stream capture is rejected: a call takes its signal rounds on the host when it is enqueued, so
// a replayed graph would wait for rounds already met (reading whatever is in the buffers) or
// never sent. Part of a call's local checks, so every rank rejects it together.
inline void check_not_capturing(const char* who, cudaStream_t s) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  WEAVE_CUDA_CHECK(cudaStreamIsCapturing(s, &st));
  WEAVE_CHECK(st == cudaStreamCaptureStatusNone, who,
              ": the stream is capturing a CUDA graph; weave calls cannot be captured (each call's signal rounds "
              "are fixed when it is enqueued, so a replay would reuse them): call it outside the capture");
}

// What is wrong with this rank's own arguments ("" when nothing): `checks` runs the checks that
// can fail on one rank alone (weave::Error), for check_call's `problem`.
template <class F>
std::string local_problem(F&& checks) {
  try {
    checks();
  } catch (const Error& e) {
    return e.what();
  }
  return {};
}

// One call in flight per object (its gathered buffers and counters serve one call at a time):
// a call on another stream than the previous call's first waits for that call's kernel.
class CallOrder {
 public:
  CallOrder() = default;
  CallOrder(const CallOrder&) = delete;
  CallOrder& operator=(const CallOrder&) = delete;
  ~CallOrder() {
    if (done_) cudaEventDestroy(done_);
  }
  void before(cudaStream_t s) {
    if (done_ && s != last_) WEAVE_CUDA_CHECK(cudaStreamWaitEvent(s, done_, 0));
  }
  void after(cudaStream_t s) {
    if (!done_) WEAVE_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
    WEAVE_CUDA_CHECK(cudaEventRecord(done_, s));
    last_ = s;
  }

 private:
  cudaEvent_t done_ = nullptr;
  cudaStream_t last_ = nullptr;
};

}  // namespace weave::attention
