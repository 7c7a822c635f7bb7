// Throws weave::Error naming the cuBLAS / cuBLASLt call that failed and its status (references
// and baselines are built on cuBLAS; the library itself does not use it).
#pragma once
#include <cublas_api.h>

#include "weave/common/error.hpp"

#define WEAVE_CUBLAS_CHECK(expr)                                                                      \
  do {                                                                                                \
    const cublasStatus_t s_ = (expr);                                                                 \
    WEAVE_CHECK(s_ == CUBLAS_STATUS_SUCCESS, #expr, " failed: cublas status ", static_cast<int>(s_)); \
  } while (0)
