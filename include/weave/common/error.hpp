// Errors are exceptions with context; no library code calls exit().
#pragma once
#include <cuda_runtime.h>
#include <cuda.h>
#include <sstream>
#include <stdexcept>
#include <string>

namespace weave {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
template <class... A>
std::string concat(const A&... a) {
  std::ostringstream s;
  (s << ... << a);
  return s.str();
}
[[noreturn]] inline void fail(const char* file, int line, const std::string& what) {
  throw Error(concat("weave: ", what, " (", file, ":", line, ")"));
}
}  // namespace detail

const char* driver_error_string(CUresult r);  // in driver.hpp

}  // namespace weave

#define WEAVE_CHECK(cond, ...)                                                     \
  do {                                                                             \
    if (!(cond)) ::weave::detail::fail(__FILE__, __LINE__, ::weave::detail::concat(__VA_ARGS__)); \
  } while (0)

#define WEAVE_CUDA_CHECK(expr)                                                             \
  do {                                                                                     \
    cudaError_t e_ = (expr);                                                               \
    if (e_ != cudaSuccess)                                                                 \
      ::weave::detail::fail(__FILE__, __LINE__,                                            \
                            ::weave::detail::concat(#expr, " failed: ", cudaGetErrorName(e_), \
                                                    " (", cudaGetErrorString(e_), ")"));   \
  } while (0)

#define WEAVE_CU_CHECK(expr)                                                                   \
  do {                                                                                         \
    CUresult r_ = (expr);                                                                      \
    if (r_ != CUDA_SUCCESS)                                                                    \
      ::weave::detail::fail(__FILE__, __LINE__,                                                \
                            ::weave::detail::concat(#expr, " failed: ", ::weave::driver_error_string(r_))); \
  } while (0)
