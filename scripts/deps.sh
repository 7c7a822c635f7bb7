#!/usr/bin/env bash
# Installs what the build and `make test` need, only what is missing: Debian packages, then the
# Python packages of python/ (WEAVE_SKIP_TORCH=1: all but torch).
set -euo pipefail
need=()
command -v cmake >/dev/null || need+=(cmake)
command -v g++ >/dev/null || need+=(g++)
command -v make >/dev/null || need+=(make)
[ -f /usr/include/gtest/gtest.h ] || need+=(libgtest-dev)
# libfabric: the network path (src/net, tests/net), found through pkg-config.
command -v pkg-config >/dev/null || need+=(pkg-config)
[ -f /usr/include/rdma/fabric.h ] || need+=(libfabric-dev)
# OpenMPI's mpirun: tests/net's launcher test starts ranks under it (skipped where it is missing).
command -v ompi_info >/dev/null || need+=(openmpi-bin)
if [ ${#need[@]} -gt 0 ]; then
  echo "weave: installing ${need[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}"
fi
if ! command -v nvcc >/dev/null && [ ! -x /usr/local/cuda/bin/nvcc ]; then
  echo "weave: the CUDA toolkit (nvcc) is required at /usr/local/cuda" >&2
  exit 1
fi

# The Python package (python/, the `python` CTest entry): pybind11 and scikit-build-core build it,
# pytest and torch test it; pip installs those missing into python3 (the interpreter the build and
# the test use). torch==2.11.0 is large (about 2 minutes): WEAVE_SKIP_TORCH=1 leaves it out, and
# the Python tests then report skipped. A failed pip install is a warning, not an error: the C++
# build and tests do not need it.
if command -v python3 >/dev/null; then
  read -r -a py_need <<<"$(python3 -c '
import importlib.util, os
want = {"pybind11": "pybind11", "scikit_build_core": "scikit-build-core", "pytest": "pytest"}
if os.environ.get("WEAVE_SKIP_TORCH", "0") != "1":
    want["torch"] = "torch==2.11.0"
print(" ".join(p for m, p in want.items() if importlib.util.find_spec(m) is None))')"
  if [ ${#py_need[@]} -gt 0 ]; then
    echo "weave: pip installing ${py_need[*]} into $(command -v python3)"
    python3 -m pip install -q "${py_need[@]}" ||
      echo "weave: warning: pip could not install ${py_need[*]}; the Python tests will report skipped" >&2
  fi
else
  echo "weave: no python3, the Python package is neither built nor tested" >&2
fi
