#!/usr/bin/env bash
# One device call: tests, SASS checks and the benchmark from binaries carried in .carry/gemm
# (built on the CPU machine). Logs go to $OUT; a summary is printed last.
#   usage: kernels/gemm/device_check.sh [tests] [sass] [bench] [bench-kn] [comm]
set -u
B=.carry/gemm
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
steps=${*:-tests sass bench}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv > "$OUT/gpu.txt" 2>&1
summary=""
for s in $steps; do
  case $s in
    tests)
      for t in test_gemm_cpu test_lcsc_gpu test_gemm_gpu; do
        timeout -s KILL 150 "$B/$t" > "$OUT/$t.log" 2>&1
        rc=$?
        summary+="$t rc=$rc: $(grep -E '^\[  (PASSED|FAILED)' "$OUT/$t.log" | tr '\n' ' ')\n"
      done ;;
    sass)
      cuobjdump --dump-sass "$B/weave-bench" > "$OUT/sass.txt" 2>&1
      for k in $(grep -o 'Function : [^ ]*GemmKernel[^ ]*' "$OUT/sass.txt" | awk '{print $3}' | sort -u); do
        body=$(awk -v k="$k" '$0 ~ "Function : "k {f=1; next} /Function :/ {f=0} f' "$OUT/sass.txt")
        summary+="$k: HGMMA=$(grep -c HGMMA <<<"$body") $(grep -o 'HGMMA\.[0-9x]*\.[A-Z0-9.]*' <<<"$body" | sort | uniq -c | tr -s ' ' | tr '\n' ';') LDL/STL=$(grep -cE '\b(LDL|STL)\b' <<<"$body") SETMAXREG=$(grep -c USETMAXREG <<<"$body") UTMALDG=$(grep -c UTMALDG <<<"$body") UTMASTG/REDG=$(grep -cE 'UTMASTG|UTMAREDG' <<<"$body") STSM=$(grep -c STSM <<<"$body") FENCE.VIEW.ASYNC.S=$(grep -c 'FENCE.VIEW.ASYNC.S' <<<"$body") HMMA=$(grep -c HMMA <<<"$body")\n"
      done ;;
    bench)
      timeout -s KILL 200 "$B/weave-bench" gemm --json "$OUT/gemm.jsonl" > "$OUT/bench.txt" 2>&1
      summary+="bench rc=$?\n$(cat "$OUT/bench.txt")\n" ;;
    bench-kn)
      timeout -s KILL 120 "$B/weave-bench" gemm --layout kn --shapes 8192x8192x8192,4096x2048x4096,16384x16384x1024 --json "$OUT/gemm.jsonl" > "$OUT/bench_kn.txt" 2>&1
      summary+="bench-kn rc=$?\n$(cat "$OUT/bench_kn.txt")\n" ;;
    comm)
      timeout -s KILL 120 "$B/weave-bench" gemm --shapes 8192x8192x8192,16384x16384x4096 --comm 0,8,16,32 --json "$OUT/gemm_comm.jsonl" > "$OUT/bench_comm.txt" 2>&1
      summary+="comm rc=$?\n$(cat "$OUT/bench_comm.txt")\n" ;;
  esac
done
cat "$OUT/gpu.txt"
printf "%b" "$summary"
