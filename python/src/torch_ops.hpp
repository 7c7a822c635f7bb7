// The torch operators' CUDA kernels (torch_ops.cpp) as direct entry points of weave._C:
// weave._C.eager_<op>, with the operator's arguments (a group name for a group), for eager calls
// that need nothing of torch's dispatcher (weave/_ops.py, run).
#pragma once
#include <pybind11/pybind11.h>

namespace weave::py {

void bind_eager_ops(pybind11::module_& m);

}  // namespace weave::py
