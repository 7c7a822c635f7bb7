// How A and B are stored.
#pragma once

namespace weave::gemm {

// KN: B is K x N row-major (C = A * B). NK: B is N x K row-major (C = A * B^T, "NT").
enum class BLayout : int { KN = 0, NK = 1 };

// MK: A is M x K row-major. KM: A is K x M row-major (C = A^T * B as stored, e.g. the weight
// gradient dW = dY^T X with dY stored tokens x out); M must then be a multiple of 8, A's row pitch.
enum class ALayout : int { MK = 0, KM = 1 };

}  // namespace weave::gemm
