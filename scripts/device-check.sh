#!/usr/bin/env bash
# On a GPU machine, from the repo root with a carried build/ configured elsewhere at
# $WEAVE_BUILD_ROOT (default /work/main):
# the GPU tests through CTest, the launchers' compatibility, and the benchmarks. Logs in $OUT.
# Usage: scripts/device-check.sh [tests] [tests-shared] [launchers] [bench:SUB,...]
#   tests         ctest -L gpu (one GPU) and -L gpu2 (needs two GPUs, else reported skipped)
#   tests-shared  ctest -L gpu2 with WEAVE_SHARE_GPUS=1: the multi-rank suites with ranks taking
#                 turns on the GPUs there are (correctness only, for one-GPU machines)
# A packed build (scripts/pack-build.sh) is unpacked first when .carry/build.tar.xz exists.
set -u
OUT=${OUT:-/tmp/weave-out}; mkdir -p "$OUT"
root=$PWD
B=${WEAVE_BUILD_ROOT:-/work/main}
# CTest files hold the build's absolute paths: make them resolve here.
[ "$root" = "$B" ] || { mkdir -p "$(dirname "$B")"; [ -e "$B" ] || ln -s "$root" "$B"; }
[ -f .carry/build.tar.xz ] && [ ! -d build/bin ] && tar xJf .carry/build.tar.xz
bin=$B/build/bin
for step in "$@"; do
  case $step in
    tests)
      (cd "$B/build" && timeout 500 ctest -L 'gpu' --output-on-failure 2>&1 | tee "$OUT/ctest.log" | tail -40) ;;
    tests-shared)
      (cd "$B/build" && WEAVE_SHARE_GPUS=1 timeout 550 ctest -L 'gpu2' --output-on-failure 2>&1 |
        tee "$OUT/ctest-shared.log" | tail -40) ;;
    launchers)
      { echo "== torchrun"; timeout 60 torchrun --nproc_per_node=2 --no-python "$bin/example_pass_tile" 2>&1 | grep -v -i warn
        echo "torchrun rc=${PIPESTATUS[0]}"
        echo "== mpirun"; timeout 60 mpirun --allow-run-as-root -np 2 "$bin/example_pass_tile" 2>&1 | tail -5
        echo "mpirun rc=${PIPESTATUS[0]}"; } | tee "$OUT/launchers.log" ;;
    bench:*)
      for sub in $(echo "${step#bench:}" | tr , ' '); do
        n=2; [ "$sub" = gemm ] && n=1
        timeout 400 "$bin/weave-run" -n $n -- "$bin/weave-bench" "$sub" --json "$OUT/$sub.json" 2>&1 | tee "$OUT/$sub.log"
      done ;;
  esac
done
