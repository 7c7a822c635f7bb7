#!/usr/bin/env bash
# The benchmark suite on every local GPU, through weave-run. Exit 2 without a GPU.
set -uo pipefail
bin="$(dirname "$0")/../build/bin"
n=$("$bin/weave-run" --count-gpus)
if [ "${n:-0}" -lt 1 ]; then
  echo "weave: no CUDA GPU on this machine; 'make bench' needs at least one (run 'make test' for the tests)." >&2
  exit 2
fi
mkdir -p bench/results
stamp=$(date +%Y%m%d-%H%M%S)
json="bench/results/bench-$stamp.json"
echo "weave: benchmark suite on $n GPU(s), JSON lines in $json"
status=0
for sub in ${WEAVE_BENCH_SUITE:-primitives collectives gemm attention moe tp sp}; do
  if [ "$sub" = gemm ] || [ "$sub" = attention ] || [ "$sub" = moe ]; then
    "$bin/weave-run" -n 1 -- "$bin/weave-bench" "$sub" --json "$json" || status=1
    # gemm: beside the eight tuned shapes, the models' shapes and their batch sizes off the 64-token grid.
    if [ "$sub" = gemm ]; then
      for set in models tokens; do
        "$bin/weave-run" -n 1 -- "$bin/weave-bench" gemm --set "$set" --json "$json" || status=1
      done
    fi
    # moe on every GPU: the expert-parallel rows (dispatch, combine, the layer).
    if [ "$sub" = moe ] && [ "$n" -ge 2 ]; then
      "$bin/weave-run" -n "$n" -- "$bin/weave-bench" moe --json "$json" || status=1
    fi
  elif [ "$n" -ge 2 ]; then
    "$bin/weave-run" -n "$n" -- "$bin/weave-bench" "$sub" --json "$json" || status=1
  else
    echo "weave: '$sub' needs 2 GPUs, skipped"
  fi
done
exit $status
