#!/bin/bash
# One device call: CPU schedule tests, the 2-rank GPU tests, `weave-bench tp` (with sweep and
# Table 3) and the torch symm_mem rows, logs and JSON under $OUT. Binaries come from .carry/tp.
# Usage: bash tests/tp/device_run.sh [bench args...]
set -u
B=.carry/tp
OUT=${OUT:-/tmp/tp-out}
mkdir -p "$OUT"
export WEAVE_TUNER_CACHE=$OUT/tuner.json
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv,noheader > "$OUT/gpu.txt" 2>&1
$B/test_tp_schedule > "$OUT/cpu.log" 2>&1; echo "cpu tests rc=$?"; tail -3 "$OUT/cpu.log"
timeout ${GPU_TEST_S:-70} $B/weave-run -n 2 -- $B/test_tp_gpu > "$OUT/gpu2.log" 2>&1; echo "gpu2 tests rc=$?"
grep -E "^\[  |OK \]|FAILED|Failure|error|Expected|Which is|rel|timed out" "$OUT/gpu2.log" | head -60
if [ "${SKIP_BENCH:-0}" = 0 ]; then
  timeout ${BENCH_S:-170} $B/weave-run -n 2 -- $B/weave-bench tp --json "$OUT/tp.jsonl" "$@" > "$OUT/bench.log" 2>&1
  echo "bench rc=$?"; cat "$OUT/bench.log" | grep -v "^weave tuner:   \[" | head -80
fi
if [ "${SKIP_TORCH:-0}" = 0 ]; then
  timeout ${TORCH_S:-80} torchrun --nproc_per_node 2 bench/torch_tp.py --json "$OUT/tp.jsonl" > "$OUT/torch.log" 2>&1
  echo "torch rc=$?"; grep -E "^\||Error|error" "$OUT/torch.log" | head -20
fi
