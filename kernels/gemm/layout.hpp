// How B is stored.
#pragma once

namespace weave::gemm {

// KN: B is K x N row-major (C = A * B). NK: B is N x K row-major (C = A * B^T, "NT").
enum class BLayout : int { KN = 0, NK = 1 };

}  // namespace weave::gemm
