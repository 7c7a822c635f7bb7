// Element types of the tile substrate and their traits. Tiles and TMA maps are described by
// these traits so that one code path serves bf16, fp16, fp8 and fp32.
#pragma once
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cstdint>

namespace weave::tile {

using bf16 = __nv_bfloat16;
using fp16 = __half;
using fp8e4m3 = __nv_fp8_e4m3;
using fp8e5m2 = __nv_fp8_e5m2;
using fp32 = float;

template <class T>
struct dtype;

template <>
struct dtype<bf16> {
  static constexpr int bytes = 2;
  static constexpr CUtensorMapDataType tma = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  static constexpr const char* name = "bf16";
};
template <>
struct dtype<fp16> {
  static constexpr int bytes = 2;
  static constexpr CUtensorMapDataType tma = CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  static constexpr const char* name = "fp16";
};
// TMA has no fp8 type: fp8 tensors move as bytes, which is exact.
template <>
struct dtype<fp8e4m3> {
  static constexpr int bytes = 1;
  static constexpr CUtensorMapDataType tma = CU_TENSOR_MAP_DATA_TYPE_UINT8;
  static constexpr const char* name = "fp8e4m3";
};
template <>
struct dtype<fp8e5m2> {
  static constexpr int bytes = 1;
  static constexpr CUtensorMapDataType tma = CU_TENSOR_MAP_DATA_TYPE_UINT8;
  static constexpr const char* name = "fp8e5m2";
};
template <>
struct dtype<fp32> {
  static constexpr int bytes = 4;
  static constexpr CUtensorMapDataType tma = CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
  static constexpr const char* name = "fp32";
};

// Two fp32 values rounded to one packed 32-bit register, low half first: the operand format of
// stmatrix and of register-A wgmma.
template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<bf16>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
template <>
__device__ __forceinline__ uint32_t pack2<fp16>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

}  // namespace weave::tile
