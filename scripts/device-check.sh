#!/usr/bin/env bash
# The one script for running the GPU suites on a GPU machine, from the repo root, with a build
# configured elsewhere at $WEAVE_BUILD_ROOT (default /work/main) and carried here (a packed build
# from scripts/pack-build.sh is unpacked first when .carry/build.tar.xz exists).
# Logs and JSON lines go to $OUT (default /tmp/weave-out); gpu.txt has the GPUs' clocks and power
# before and after.
# Usage: scripts/device-check.sh STEP...
#   tests         ctest -L gpu (one GPU) and -L gpu2 (needs two GPUs, else reported skipped)
#   tests-shared  ctest -L gpu2 with WEAVE_SHARE_GPUS=1: the multi-rank suites with ranks taking
#                 turns on the GPUs there are (correctness only, for one-GPU machines)
#                 (tests and tests-shared append $CTEST_ARGS, e.g. CTEST_ARGS="-E
#                 test_collectives|test_primitives" and then "-R ...": a device call's 600 s
#                 limit is shorter than every gpu2 suite with ranks sharing one H100, 516 s plus
#                 the start)
#   launchers     example_pass_tile under torchrun and mpirun (2 ranks)
#   python        the Python package's tests: the wheel in .carry/wheels (built here with
#                 `WEAVE_TORCH_PYTHON=$(command -v python3) python3.12 -m pip wheel
#                 --no-build-isolation --no-deps -w .carry/wheels .`, read on build-py/<tag>'s
#                 first configure: torch's headers and
#                 libraries from the python3 that has the GPU machine's torch version, for
#                 the GPU machine's Python) installed into /tmp/site, pytest at world 1, then the
#                 multi-rank modules (test_*multirank.py, test_op_grads.py) under torchrun on 2 ranks (sharing the GPU where there is one)
#   bench:SUB,... weave-bench SUB (gemm, gemm_fp8 and attention on one GPU, net* between 2 simulated
#                 nodes, the others on two ranks) into
#                 $OUT/SUB.json; $BENCH_ARGS is appended (e.g. BENCH_ARGS="--sweep 0,4,8,16,32,64
#                 --table3" for tp)
#   torch:SUB,... the PyTorch baseline of SUB (attention: cuDNN SDPA; tp: symm_mem async TP; sp:
#                 unfused ring and Ulysses) appended to the same $OUT/SUB.json, then the ratio
#                 table where the script prints one (attention, sp) into $OUT/SUB-report.md
#   sass          per-kernel SASS counts of weave-bench (wgmma, spills, TMA, setmaxnreg) for the
#                 kernels whose names match $SASS_MATCH (default: attention, gathered and GEMM
#                 kernels) into $OUT/sass.txt
# Example: scripts/device-check.sh tests bench:attention torch:attention
set -u
OUT=${OUT:-/tmp/weave-out}; mkdir -p "$OUT"
root=$PWD
B=${WEAVE_BUILD_ROOT:-/work/main}
# CTest files hold the build's absolute paths: make them resolve here.
[ "$root" = "$B" ] || { mkdir -p "$(dirname "$B")"; [ -e "$B" ] || ln -s "$root" "$B"; }
[ -f .carry/build.tar.xz ] && [ ! -d build/bin ] && tar xJf .carry/build.tar.xz
bin=$B/build/bin
gpu_info() {
  nvidia-smi --query-gpu=index,name,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu \
    --format=csv,noheader >> "$OUT/gpu.txt" 2>&1
}
gpu_info
for step in "$@"; do
  case $step in
    tests)
      # shellcheck disable=SC2086  # CTEST_ARGS is a list of arguments
      (cd "$B/build" && timeout 500 ctest -L 'gpu' --output-on-failure ${CTEST_ARGS:-} 2>&1 | tee "$OUT/ctest.log" |
        tail -40) ;;
    tests-shared)
      # shellcheck disable=SC2086
      (cd "$B/build" && WEAVE_SHARE_GPUS=1 timeout 550 ctest -L 'gpu2' --output-on-failure ${CTEST_ARGS:-} 2>&1 |
        tee "$OUT/ctest-shared.log" | tail -40) ;;
    python)
      python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/wheels/weave-*.whl &&
        export PYTHONPATH=/tmp/site
      timeout 300 python3 -m pytest python/tests -q -rs -p no:cacheprovider 2>&1 | tee "$OUT/pytest.log" | tail -15
      share=0; [ "$(nvidia-smi -L | wc -l)" -lt 2 ] && share=1
      WEAVE_SHARE_GPUS=$share timeout 300 torchrun --nproc_per_node 2 -m pytest python/tests/test_*multirank.py \
        python/tests/test_op_grads.py -q -p no:cacheprovider 2>&1 | tee "$OUT/pytest-multirank.log" | tail -15 ;;
    launchers)
      { echo "== torchrun"; timeout 60 torchrun --nproc_per_node=2 --no-python "$bin/example_pass_tile" 2>&1 | grep -v -i warn
        echo "torchrun rc=${PIPESTATUS[0]}"
        echo "== mpirun"; timeout 60 mpirun --allow-run-as-root -np 2 "$bin/example_pass_tile" 2>&1 | tail -5
        echo "mpirun rc=${PIPESTATUS[0]}"; } | tee "$OUT/launchers.log" ;;
    bench:*)
      for sub in $(echo "${step#bench:}" | tr , ' '); do
        # The network suites between 2 simulated nodes, sharing the GPU where there is one.
        run=(-n 2); case $sub in gemm|gemm_fp8|attention) run=(-n 1) ;; net*) run=(-n 2 --nodes 2)
          [ "$(nvidia-smi -L | wc -l)" -lt 2 ] && run+=(--share-gpus) ;; esac
        # shellcheck disable=SC2086  # BENCH_ARGS is a list of arguments
        timeout 400 "$bin/weave-run" "${run[@]}" -- "$bin/weave-bench" "$sub" --json "$OUT/$sub.json" ${BENCH_ARGS:-} 2>&1 |
          tee "$OUT/$sub.log"
        echo "bench $sub rc=${PIPESTATUS[0]}"
      done ;;
    torch:*)
      for sub in $(echo "${step#torch:}" | tr , ' '); do
        case $sub in
          attention) run=(python3 bench/torch_attention.py) ;;
          tp|sp) run=(torchrun --nproc_per_node 2 "bench/torch_$sub.py") ;;
          *) echo "torch:$sub: no PyTorch baseline"; continue ;;
        esac
        PYTHONUNBUFFERED=1 timeout 300 "${run[@]}" --json "$OUT/$sub.json" 2>&1 | grep -v Warning | tee "$OUT/torch-$sub.log"
        echo "torch $sub rc=${PIPESTATUS[0]}"
        case $sub in attention|sp) python3 "bench/torch_$sub.py" --report "$OUT/$sub.json" | tee "$OUT/$sub-report.md" ;; esac
      done ;;
    sass)
      cuobjdump --dump-sass "$bin/weave-bench" > "$OUT/sass-all.txt" 2>&1
      for k in $(grep -oE "Function : [^ ]*(${SASS_MATCH:-attention_kernel|gathered|GemmKernel})[^ ]*" "$OUT/sass-all.txt" |
                 awk '{print $3}' | sort -u); do
        body=$(awk -v k="$k" '$0 ~ "Function : "k {f=1; next} /Function :/ {f=0} f' "$OUT/sass-all.txt")
        echo "$k: HGMMA=$(grep -c HGMMA <<<"$body") LDL/STL=$(grep -cE '\b(LDL|STL)\b' <<<"$body")" \
             "SETMAXREG=$(grep -c USETMAXREG <<<"$body") UTMALDG=$(grep -c UTMALDG <<<"$body")" \
             "UTMASTG/REDG=$(grep -cE 'UTMASTG|UTMAREDG' <<<"$body") STSM=$(grep -c STSM <<<"$body")" \
             "HMMA=$(grep -c '\bHMMA' <<<"$body")"
      done | tee "$OUT/sass.txt"
      rm -f "$OUT/sass-all.txt" ;;
    *) echo "device-check: unknown step '$step'" >&2 ;;
  esac
done
gpu_info
