#!/usr/bin/env bash
# One device call: attention tests, SASS checks, weave bench and the cuDNN SDPA baseline, from
# binaries carried in .carry/attn (built on the CPU machine). Logs and JSON go to $OUT.
#   usage: kernels/attention/device_check.sh [tests] [sass] [bench] [cudnn] [gemm]
set -u
B=.carry/attn
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
steps=${*:-tests sass bench cudnn}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv,noheader > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
tests_ok=1
for s in $steps; do
  case $s in
    tests)
      for t in test_attention_cpu test_attention_gpu; do
        timeout -s KILL 60 "$B/$t" > "$OUT/$t.log" 2>&1
        rc=$?
        [ $rc -ne 0 ] && tests_ok=0
        echo "$t rc=$rc: $(grep -E '^\[  (PASSED|FAILED)' "$OUT/$t.log" | tr '\n' ' ')"
        grep -E "Failure|error|Expected|Which is|case B|pp  |nopp" "$OUT/$t.log" | head -90
      done ;;
    sass)
      cuobjdump --dump-sass "$B/weave-bench" > "$OUT/sass_all.txt" 2>&1
      for k in $(grep -o 'Function : [^ ]*attention_kernel[^ ]*' "$OUT/sass_all.txt" | awk '{print $3}' | sort -u); do
        body=$(awk -v k="$k" '$0 ~ "Function : "k {f=1; next} /Function :/ {f=0} f' "$OUT/sass_all.txt")
        echo "$k: HGMMA=$(grep -c HGMMA <<<"$body") [$(grep -o 'HGMMA\.[0-9x]*\.[A-Z0-9.]*' <<<"$body" | sort | uniq -c | tr -s ' ' | tr '\n' ';')] RS-form(R operand)=$(grep HGMMA <<<"$body" | grep -c ', R[0-9]*, gdesc') tnspB=$(grep HGMMA <<<"$body" | grep -c -i 'tnsp') LDL/STL=$(grep -cE '\b(LDL|STL)\b' <<<"$body") SETMAXREG=$(grep -c USETMAXREG <<<"$body") UTMALDG=$(grep -c UTMALDG <<<"$body") UTMASTG=$(grep -c UTMASTG <<<"$body") MUFU.EX2=$(grep -c 'MUFU.EX2' <<<"$body") F2FP=$(grep -c 'F2FP' <<<"$body") STSM=$(grep -c STSM <<<"$body") HMMA=$(grep -c '\bHMMA' <<<"$body") DEPBAR=$(grep -c 'WARPGROUP.DEPBAR' <<<"$body") BAR.SYNC/ARV=$(grep -cE 'BAR\.(SYNC|ARV)' <<<"$body")"
      done
      # Keep one kernel's SASS (D=128, ping-pong) for reading.
      k=$(grep -o 'Function : [^ ]*attention_kernel[^ ]*ILi128ELi128ELi2ELb1[^ ]*' "$OUT/sass_all.txt" | awk '{print $3}' | head -1)
      awk -v k="$k" '$0 ~ "Function : "k {f=1} /Function :/ && $0 !~ k {f=0} f' "$OUT/sass_all.txt" > "$OUT/sass_d128_pp.txt"
      rm -f "$OUT/sass_all.txt" ;;
    bench)
      if [ $tests_ok -eq 1 ]; then
        timeout -s KILL 90 "$B/weave-bench" attention --variants "${ATTN_VARIANTS:-persistent,pingpong,basic}" --json "$OUT/attention.jsonl" 2>&1 | tee "$OUT/bench.txt"
        echo "bench rc=${PIPESTATUS[0]}"
      else
        echo "bench skipped: tests failed"
      fi ;;
    cudnn)
      PYTHONUNBUFFERED=1 timeout -s KILL 120 python3 bench/torch_attention.py --json "$OUT/attention.jsonl" 2>&1 | tee "$OUT/cudnn.txt" | grep -v Warning
      echo "cudnn rc=${PIPESTATUS[0]}"
      python3 bench/torch_attention.py --report "$OUT/attention.jsonl" | tee "$OUT/report.md" ;;
    gemm)
      [ -x "$B/test_gemm_gpu" ] && { timeout -s KILL 60 "$B/test_gemm_gpu" > "$OUT/test_gemm_gpu.log" 2>&1; echo "test_gemm_gpu rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/test_gemm_gpu.log" | tr '\n' ' ')"; } ;;
  esac
done
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader
