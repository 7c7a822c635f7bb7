// The message of the weave::Error a callable throws, for tests of argument checks.
#pragma once
#include <string>

#include "weave/common/error.hpp"

namespace weave::check {

// e.what() of the weave::Error `f` throws; "" if it throws none (other exceptions propagate).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace weave::check
