// Element types and reduction operators as run-time values (host and device).
#pragma once
#include <cstddef>

namespace weave {

enum class DType : int { bf16 = 0, fp16 = 1, fp32 = 2 };
enum class ReduceOp : int { sum = 0, max = 1, min = 2 };

inline constexpr size_t dtype_size(DType t) { return t == DType::fp32 ? 4 : 2; }
inline constexpr const char* dtype_name(DType t) {
  return t == DType::bf16 ? "bf16" : t == DType::fp16 ? "fp16" : "fp32";
}
inline constexpr const char* op_name(ReduceOp o) {
  return o == ReduceOp::sum ? "sum" : o == ReduceOp::max ? "max" : "min";
}

}  // namespace weave
