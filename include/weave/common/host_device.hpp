// WEAVE_HD: __host__ __device__ under nvcc, nothing under a host compiler, for the pure
// functions (schedules, layouts, splits) that kernels run and CPU tests check.
#pragma once

#ifdef __CUDACC__
#define WEAVE_HD __host__ __device__
#else
#define WEAVE_HD
#endif
