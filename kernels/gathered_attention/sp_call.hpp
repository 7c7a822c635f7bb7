// The argument checks ring and Ulysses attention share; the host rules of their calls
// (agree_call, CallOrder, ...) are the runtime's (communicator.hpp, call.hpp).
#pragma once
#include <cmath>
#include <cstdint>

#include "weave/common/error.hpp"
#include "weave/common/extent.hpp"

namespace weave::attention {

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
  WEAVE_CHECK(is_aligned(q) && is_aligned(k) && is_aligned(v) && is_aligned(o), who,
              ": q, k, v and o must be 16-byte aligned (TMA)");
}

}  // namespace weave::attention
