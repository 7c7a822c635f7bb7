#!/usr/bin/env bash
# What a session does when the device tool lends a machine with 2 GPUs (NVLink): the checks and
# measurements that the open issues (18-23) need and that ranks sharing one GPU cannot give, in
# priority order, each STEP sized to fit one 600-s device call. docs/testing.md, "When two GPUs
# are lent", says in which order to call them and what each closes.
#
# Usage (repo root of the device machine's copy): scripts/two-gpu-session.sh STEP...
#   DRY_RUN=1 scripts/two-gpu-session.sh STEP...   prints the commands and their time caps (any machine)
# Several steps may go in one call: the whole call gets BUDGET seconds (default 555); each command
# gets at most its own cap and what is left of the budget, minus the time the final tar needs; a
# command that would get less than 30 s is not started (the summary says so), and a command that
# reaches its limit is stopped with its whole process tree (only processes this script started).
#
# Carry (device tool's `carry`; at most 64 MiB per call, the repository's tracked files (~23 MB)
# included, so carry only what the call's steps need):
#   every step but races, races2, faults2, faults2b: .carry/build.tar.xz (scripts/pack-build.sh,
#     ~24 MB; unpacked when build/bin is missing);
#   py, ops, block: also .carry/wheels (the cp312 wheel, ~4 MB; device-check.sh's header says how it
#     is built);
#   races, races2: build-mutate/stash-2gpu (~27 MB) and .carry/build-ctest.tar.xz (scripts/pack-build.sh
#     --ctest-only), not the build: the stash holds every binary they run, and with the build the call
#     is over the limit. The stash is built on the CPU machine from the same tree as the build (a stash
#     from before store_wait_only_waits_for_smem_reads and wait_polls_relaxed_without_acquire had
#     bench rows lacks their weave-bench: mutate.py then runs their tests alone and says so):
#   python3 scripts/mutate.py --only ag_gemm_signal_before_store_wait,store_wait_only_waits_for_smem_reads,wait_polls_relaxed_without_acquire,ll_scratch_slot_reused_one_call_early --stash build-mutate/stash-2gpu -j "$(nproc)"
#   faults2: build-mutate/stash-2gpu-f2 (~25 MB: weave-bench alone, per fault) and
#     .carry/build-ctest.tar.xz; faults2b: build-mutate/stash-2gpu-f2b (~15 MB) and the same. Not both
#     stashes in one call (with the tracked files, ~63 MB), unless packed: `mutate.py --pack-stash DIR`
#     writes DIR.tar.xz (eleven weave-bench copies: 31 MB -> 3.2 MB); carry that file instead of DIR,
#     and --from-stash DIR unpacks it there. Built on the CPU machine like the races':
#   python3 scripts/mutate.py --checks bench --only gemm_rs_drop_rank_contribution_one_tile,gemm_rs_inter_sm_drop_rank_one_tile,gemm_rs_adaptive_drop_rank_one_tile,lcsc_dynamic_loader_does_not_wait_for_other_task,gemm_ar_drop_rank_contribution_one_tile,gemm_ar_intra_drop_add_one_tile,gemm_ar_reduce_without_waiting_for_partials,ag_gemm_peer_tile_loaded_without_wait,tp_nk_map_drops_last_k_columns --stash build-mutate/stash-2gpu-f2 -j "$(nproc)"
#   python3 scripts/mutate.py --checks bench --only ag_gemm_fp8_last_k_block_dropped,gemm_rs_fp8_scale_b_for_scale_a,ring_attention_peer_v_reads_zero,ulysses_o_heads_swapped,collectives_call_counts_not_advanced --stash build-mutate/stash-2gpu-f2b -j "$(nproc)"
#   Step ab also carries
# .carry/old-4f8b885.tar.xz (weave-bench and weave-run of 4f8b885, stripped, 0.9 MB), built with:
#   git worktree add /tmp/old-4f8b885 4f8b885 && cmake -S /tmp/old-4f8b885 -B /tmp/old-4f8b885/build \
#     -DCMAKE_BUILD_TYPE=Release && cmake --build /tmp/old-4f8b885/build -j 2 --target weave-bench weave-run
#   then strip both into old-4f8b885/ and tar | xz -6 it as .carry/old-4f8b885.tar.xz.
#
# Steps (estimates from the runs cited in docs/testing.md, "When two GPUs are lent"):
#   t1      ctest -L gpu2, the primitives and collectives suites (test_collectives against NCCL,
#           the LL128 stress test at its default scale, two_jobs_at_once)            ~2-5 min
#   t2      ctest -L gpu2, every other gpu2 suite (TP, call agreement, SP, MoE, network, example) ~2-3 min
#   races   issue 23: faults ag_gemm_signal_before_store_wait, store_wait_only_waits_for_smem_reads
#           (scripts/mutate.py --from-stash; the baseline first)                     ~3-5 min
#   races2  issue 23: faults wait_polls_relaxed_without_acquire, ll_scratch_slot_reused_one_call_early ~4-8 min
#   faults2 issue 23: the bench rows of the bf16 TP faults (GEMM+RS, GEMM+AR, AG+GEMM, B as N x K, the
#           dynamic tasks), which time NCCL baselines and so never ran with ranks sharing one GPU
#           (mutate.py --checks bench --from-stash; their tests ran that way); 7 baseline + 9
#           faulted weave-bench tp runs                                             ~4-8 min
#   faults2b the same for fp8 TP, ring / Ulysses and the collectives' device counts: 5 + 5 runs ~3-5 min
#   ll128   issue 23: test_ll128_stress at full scale (~1e10 lines read, 1e6 LL128 calls) in chunks
#           of WEAVE_STRESS_SCALE that fill the call's budget; totals carried over between calls
#           on the same warm machine ($KEEP)                                         the budget
#   ab      issue 18 ("no kernel may get slower"): the suites in $AB_SUITES (default tp collectives
#           sp) with weave-bench and weave-run of 4f8b885 (before "One house") and of this build,
#           old then new per suite, each run at most AB_CAP s (default 170); new / old per weave row ~3x3 min
#   tp      issues 18/20/22: weave-bench tp (bf16) --sweep $TP_SWEEP (default 0,4,8,16,32,64 at the
#           sweep sizes 4096, 16384: the fixed splits and the adaptive-vs-fixed rows; TP_SWEEP=off
#           leaves it out; $TP_ARGS appended) + bench/torch_tp.py                   ~6-10 min
#   tp8     issue 20: weave-bench tp --dtype fp8                                        ~2-4 min
#   ops     issue 19: bench/torch_ops.py at world 2 (--cpp-json: the tp step's rows)      ~3-6 min
#   coll    weave-bench collectives vs NCCL ($COLL_ARGS appended)                         ~1-3 min
#   sp      weave-bench sp + bench/torch_sp.py, the ratio table                          ~2-4 min
#   moe     issue 21: weave-bench moe at world 2 (3 models, T 4096 and 16384, balanced, Dirichlet,
#           one-expert routings) + torchrun bench/torch_moe.py (plain-PyTorch layer) + --report ~4-8 min
#   moe-ll  issue 21: the low-latency mode, DeepSeek-like, 128 tokens per rank            ~1 min
#   py      issue 19: the Python tests (world 1, then the multi-rank modules on 2 GPUs,
#           WEAVE_GRAPH_REPLAYS=1000)                                                 ~2-3 min
#   block   issue 19: examples/torch/tp_block.py --all --check at hidden 8192, ffn 28672, 32 heads,
#           S 8192,16384 (weave vs torch+NCCL vs async-TP), then the same with
#           --weave-attention torch (weave's linears alone) if time is left             ~3-6 min
#   net     issue 22: weave-bench net (with NCCL's network transport) and net_coll, 2 simulated
#           nodes of one GPU each                                                      ~2-4 min
#   net-tp  issue 22: weave-bench net_tp (fused / unfused / NCCL, adaptive split vs fixed splits)
#           and net_ring                                                               ~3-6 min
# Knobs: OUT (default /tmp/out; everything is tarred into $OUT/all.tgz at the end), BUDGET, KEEP
# (default /tmp/weave-2gpu: files later calls on the same warm machine reuse), STASH, STASH_F2,
# STASH_F2B, FAULTS (the faults of the one races / faults step a call names), LL128_LINES /
# LL128_CALLS (targets), TP_SWEEP, TP_ARGS, TP8_ARGS, OPS_ARGS, COLL_ARGS, MOE_ARGS, BLOCK_ARGS,
# NET_TP_ARGS, GRAPH_REPLAYS.
# NVLink multicast stays as the machine has it: this script neither sets nor unsets
# NCCL_NVLS_ENABLE, TORCH_SYMM_MEM_DISABLE_MULTICAST or NVSHMEM_DISABLE_NVLS.
set -u
if [ "$#" -eq 0 ]; then
  sed -n '2,/^set -u/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 2
fi
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
root=$PWD; B=/work/main
# CTest files hold the build's absolute paths (device-check.sh does the same).
[ "$root" = "$B" ] || { mkdir -p "$(dirname "$B")"; [ -e "$B" ] || ln -s "$root" "$B"; }
# The whole build, or (races and faults steps: the stash holds every binary they run) its CTest
# files alone.
if [ ! -d build/bin ]; then
  if [ -f .carry/build.tar.xz ]; then tar xJf .carry/build.tar.xz
  elif [ -f .carry/build-ctest.tar.xz ]; then tar xJf .carry/build-ctest.tar.xz; fi
fi
export WEAVE_BUILD_ROOT=$B
unset WEAVE_SHARE_GPUS  # two GPUs: no rank shares one
DRY=${DRY_RUN:-0}
BUDGET=${BUDGET:-555}
RESERVE=15  # seconds kept for the summary and the tar
KEEP=${KEEP:-/tmp/weave-2gpu}; mkdir -p "$KEEP"
T1_RE='^(test_primitives|test_comm|wait_timeout_diagnostic|two_jobs_at_once|test_collectives|test_collectives_mismatch|test_ll128_stress|test_collectives_lifetime|test_collectives_graph)$'
RACES_A=ag_gemm_signal_before_store_wait,store_wait_only_waits_for_smem_reads
RACES_B=wait_polls_relaxed_without_acquire,ll_scratch_slot_reused_one_call_early
STASH=${STASH:-build-mutate/stash-2gpu}
# The TP faults' bench rows: the bf16 ones fill one call, fp8, SP and collectives another.
F2_A=gemm_rs_drop_rank_contribution_one_tile,gemm_rs_inter_sm_drop_rank_one_tile,gemm_rs_adaptive_drop_rank_one_tile,lcsc_dynamic_loader_does_not_wait_for_other_task,gemm_ar_drop_rank_contribution_one_tile,gemm_ar_intra_drop_add_one_tile,gemm_ar_reduce_without_waiting_for_partials,ag_gemm_peer_tile_loaded_without_wait,tp_nk_map_drops_last_k_columns
F2_B=ag_gemm_fp8_last_k_block_dropped,gemm_rs_fp8_scale_b_for_scale_a,ring_attention_peer_v_reads_zero,ulysses_o_heads_swapped,collectives_call_counts_not_advanced
STASH_F2=${STASH_F2:-build-mutate/stash-2gpu-f2}
STASH_F2B=${STASH_F2B:-build-mutate/stash-2gpu-f2b}
summary=()
last_rc=0 last_s=0

say() { echo "$*"; summary+=("$*"); }
left() { echo $((BUDGET - SECONDS)); }

# ---- stopping a command with every process it started ------------------------------------------
# "pid ppid starttime" of every process (from /proc: no procps needed).
proc_table() {
  local f line pid w
  for f in /proc/[0-9]*/stat; do
    read -r line 2>/dev/null < "$f" || continue
    pid=${f#/proc/}; pid=${pid%/stat}
    read -ra w <<< "${line##*) }"
    echo "$pid ${w[1]} ${w[19]}"
  done
}
# "pid:starttime" of $1 and of all its descendants.
tree_pids() {
  proc_table | awk -v root="$1" '{ pp[$1] = $2; st[$1] = $3 } END {
    if (!(root in pp)) exit
    keep[root] = 1; grew = 1
    while (grew) { grew = 0; for (p in pp) if (!(p in keep) && (pp[p] in keep)) { keep[p] = 1; grew = 1 } }
    for (p in keep) print p ":" st[p] }'
}
# Sends $1 to each "pid:starttime" that is still that process (a pid reused since is left alone).
signal_list() {
  local sig=$1 item pid line w; shift
  for item in "$@"; do
    pid=${item%%:*}
    read -r line 2>/dev/null < "/proc/$pid/stat" || continue
    read -ra w <<< "${line##*) }"
    [ "${w[19]}" = "${item#*:}" ] && kill "-$sig" "$pid" 2>/dev/null
  done
  return 0
}
stop_tree() {
  local -a t
  read -ra t <<< "$(tree_pids "$1" | tr '\n' ' ')"
  [ "${#t[@]}" -gt 0 ] || return 0
  signal_list TERM "${t[@]}"; sleep 5; signal_list KILL "${t[@]}"
}

# bounded NAME CAP LOG CMD...: CMD with stdout and stderr into LOG, for at most CAP seconds and
# what is left of the call's budget; sets last_rc (124: stopped at its limit, 125: not started)
# and last_s (seconds it ran).
bounded() {
  local name=$1 cap=$2 log=$3; shift 3
  local avail t t0 pid wd rc
  avail=$(( $(left) - RESERVE ))
  if [ "$avail" -lt 30 ]; then
    say "$name: not started, ${avail} s of the call's budget left (run it in the next call)"; last_rc=125 last_s=0
    return 125
  fi
  t=$(( cap < avail ? cap : avail ))
  if [ "$DRY" = 1 ]; then echo "[dry] $name (at most ${t} s, log ${log#"$OUT"/}): $*"; last_rc=0 last_s=0; return 0; fi
  mkdir -p "$(dirname "$log")"
  t0=$SECONDS
  "$@" > "$log" 2>&1 < /dev/null &
  pid=$!
  ( sleep "$t"; touch "$log.stopped"; stop_tree "$pid" ) > /dev/null 2>&1 < /dev/null &
  wd=$!
  wait "$pid"; rc=$?
  if [ -e "$log.stopped" ]; then
    wait "$wd"; rc=124; rm -f "$log.stopped"
    say "$name: STOPPED at its limit of ${t} s (log ${log#"$OUT"/})"
  else
    local -a w; read -ra w <<< "$(tree_pids "$wd" | tr '\n' ' ')"
    [ "${#w[@]}" -gt 0 ] && signal_list TERM "${w[@]}"
    wait "$wd" 2>/dev/null
    say "$name: rc=$rc, $((SECONDS - t0)) s"
  fi
  last_rc=$rc last_s=$((SECONDS - t0))
  return "$rc"
}

# dc NAME CAP SUBDIR [VAR=VALUE...] -- DEVICE-CHECK-STEP...: scripts/device-check.sh with
# OUT=$OUT/SUBDIR (its logs and JSON there), its own output in SUBDIR/NAME.out.
dc() {
  local name=$1 cap=$2 sub=$3; shift 3
  local -a envs=()
  while [ "$#" -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  mkdir -p "$OUT/$sub"
  bounded "$name" "$cap" "$OUT/$sub/$name.out" env OUT="$OUT/$sub" "${envs[@]}" scripts/device-check.sh "$@"
  [ "$DRY" = 1 ] || grep -hsE "^(bench|torch) [a-z_0-9]+ rc=" "$OUT/$sub/$name.out" | sed 's/^/  /'
}

wheel() {  # the package from .carry/wheels into /tmp/site (as device-check.sh's python step)
  [ "$DRY" = 1 ] && return 0
  [ -d /tmp/site/weave ] || python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/wheels/weave-*.whl ||
    { say "no weave wheel in .carry/wheels (carry it)"; return 1; }
}
pyenv() { echo "PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}"; }

# ---- summaries that fit the device tool's 12,000-character output tail --------------------------
sum_ctest() {  # ctest.log
  [ "$DRY" = 1 ] && return 0
  [ -f "$1" ] || { echo "  no $1"; return 0; }
  grep -hE "tests passed|tests failed out of|Total Test time" "$1" | sed 's/^/  /'
  grep -hE "\*\*\*|Not Run" "$1" | sed -E 's/ *\.{3,} */ /; s/^ */  /' | head -20
}
# sum_json FILE MAXLINES [FIELD]: rows, incorrect rows, and per shape each implementation's time
# against weave's (Nx = its time / weave's: above 1, weave is faster); with FIELD (e.g. bytes), one
# line per other shape and implementation with those ratios along FIELD.
sum_json() {
  [ "$DRY" = 1 ] && return 0
  [ -s "$1" ] || { echo "  no rows in $1"; return 0; }
  python3 - "$1" "$2" "${3:-}" << 'EOF'
import json, sys
path, maxl, along = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rows = []
for line in open(path, errors="replace"):
    try:
        rows.append(json.loads(line))
    except ValueError:
        pass
SHAPE = ("kernel", "op", "dtype", "model", "T", "proj", "routing", "S", "M", "N", "K", "B", "H", "causal",
         "bytes", "shape", "dim", "layout", "part", "notify", "batch", "chunk")
bad = [r for r in rows if r.get("correct") is False]
print(f"  {len(rows)} rows, {len(bad)} with correct false; impls: {', '.join(sorted({str(r.get('impl')) for r in rows}))}")
for r in bad[:6]:
    print("  INCORRECT: " + " ".join(f"{k}={r[k]}" for k in SHAPE + ("impl",) if k in r))
for r in rows:
    if r.get("impl") == "adaptive-vs-fixed":
        print(f"  {r.get('kernel')} S={r.get('S')} adaptive / best fixed split: {r.get('ratio')}")
timed = [r for r in rows if "time_us" in r and "sweep" not in r and r.get("impl") not in ("table3", "adaptive-vs-fixed")]
# Per kernel, the shape fields every one of its rows has (a baseline may lack one the others have).
fields = {}
for r in timed:
    have = {k for k in SHAPE if k in r}
    fields[r.get("kernel")] = have & fields.get(r.get("kernel"), have)
def size(v):
    if along == "bytes" and isinstance(v, (int, float)):
        for u, d in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
            if v >= d and v % d == 0:
                return f"{int(v // d)}{u}"
    return str(v)
groups = {}
skip = {along, "shape", "M", "N", "K"} if along else set()
for r in timed:
    key = tuple((k, r[k]) for k in SHAPE if k in fields[r.get("kernel")] and k not in skip)
    groups.setdefault(key, {}).setdefault(r.get(along) if along else None, {})[str(r.get("impl"))] = float(r["time_us"])
lines = []
for key, by in groups.items():
    head = " ".join(f"{v}" if k == "kernel" else f"{k}={v}" for k, v in key)
    if along:
        for i in sorted({i for t in by.values() for i in t if i != "weave"}):
            pts = [f"{size(a)} {t[i] / t['weave']:.2f}" if t.get("weave") else f"{size(a)} {t[i]:.0f}us"
                   for a, t in by.items() if i in t]
            what = f"{i} / weave" if any(t.get("weave") for t in by.values()) else f"{i} time"
            lines.append(f"  {head} [{what} by {along}]: " + ", ".join(pts))
        if set().union(*by.values()) == {"weave"}:
            lines.append(f"  {head} [weave by {along}]: " + ", ".join(f"{size(a)} {t['weave']:.0f}us" for a, t in by.items()))
        continue
    t = by[None]
    if t.get("weave"):
        w = t["weave"]
        parts = [f"weave {w:.1f} us"] + [f"{i} {x / w:.2f}x" for i, x in t.items() if i != "weave"]
    else:
        parts = [f"{i} {x:.1f} us" for i, x in t.items()]
    lines.append(f"  {head}: " + ", ".join(parts))
for l in lines[:maxl]:
    print(l)
if maxl and len(lines) > maxl:
    print(f"  ... {len(lines) - maxl} more lines: {path}")
extra = len(rows) - len(timed)
if extra:
    print(f"  ({extra} sweep / table / untimed rows in the JSON)")
EOF
}

# ---- steps ------------------------------------------------------------------------------------
step_tests() {  # NAME CTEST-SELECTION: the gpu2 suites through device-check.sh's tests step
  dc "$1" 540 "$1" CTEST_ARGS="-L gpu2 $2" -- tests
  sum_ctest "$OUT/$1/ctest.log"
}

restore_bins() {  # STASH-DIR: the carried build's binaries back in place of a stash's (also after a stop)
  local -a names
  read -ra names <<< "$(python3 -c 'import json, sys; print(" ".join("build/bin/" + b for b in json.load(open(sys.argv[1]))["baseline"]))' "$1/manifest.json")"
  if [ ! -f .carry/build.tar.xz ]; then
    # Without the build carried, remove the stash's binaries so that a later call on this warm
    # machine unpacks .carry/build.tar.xz again instead of running them.
    rm -rf build/bin
    say "build/bin removed after the stash's run (no .carry/build.tar.xz here to restore it from)"
  elif [ "${#names[@]}" -gt 0 ]; then
    tar xJf .carry/build.tar.xz "${names[@]}" || say "WARNING: could not restore ${names[*]} from .carry/build.tar.xz"
  fi
}

step_faults() {  # NAME FAULTS STASH-DIR [MUTATE-ARG...]: scripts/mutate.py --from-stash on those faults
  local name=$1 faults=${FAULTS:-$2} stash=$3 d=$OUT/$1
  shift 3
  if [ "$DRY" != 1 ] && [ ! -f "$stash/manifest.json" ] && [ ! -f "$stash.tar.xz" ]; then
    say "$name: no stash at $stash or $stash.tar.xz (build it on the CPU machine, header of this script, and carry it)"; return
  fi
  bounded "$name" 540 "$d/mutate.log" python3 scripts/mutate.py --only "$faults" --from-stash "$stash" \
    --build-dir "$B/build" --json "$d/faults.jsonl" "$@"
  [ "$DRY" = 1 ] && return
  if [ "$last_rc" -ne 125 ]; then
    restore_bins "$stash"
    mkdir -p "$d/logs"
    for f in _baseline mutate ${faults//,/ }; do cp build-mutate/logs/"$f".log "$d/logs/" 2>/dev/null; done
    grep -hE "^mutate:   [^ -]|^checks failing WITHOUT|^summary:|: not run: " "$d/mutate.log" | sed 's/^/  /'
  fi
  python3 - "$d/faults.jsonl" "$faults" "$name" << 'EOF'
import json, os, sys
path, want, step = sys.argv[1], sys.argv[2].split(","), sys.argv[3]
rows = [json.loads(l) for l in open(path)] if os.path.exists(path) else []
for r in rows:
    checks = ", ".join(f"{k.split(':')[0] if not k.startswith('bench') else k[:40]}: {v}" for k, v in r.get("checks", {}).items())
    print(f"  {r['fault']}: {r['verdict']} ({r.get('run_s', '-')} s; {checks})")
done = {r["fault"] for r in rows}
rest = [f for f in want if f not in done]
if rest:
    print(f"  not reached: {','.join(rest)} (next call: FAULTS={','.join(rest)} scripts/two-gpu-session.sh {step})")
EOF
}

# ll128: chunks of test_ll128_stress's two tests at growing WEAVE_STRESS_SCALE until the targets
# (lines read, summed over both ranks; calls, PDL on and off together) are met or the budget ends.
step_ll128() {
  local d=$OUT/ll128 tl=${LL128_LINES:-10000000000} tc=${LL128_CALLS:-1000000}
  local lines=0 bad1=0 badr=0 calls=0 wrong=0 runs=0 n=0 failed=0
  [ -f "$KEEP/ll128.totals" ] && read -r lines bad1 badr calls wrong runs < "$KEEP/ll128.totals"
  # per unit of WEAVE_STRESS_SCALE: lines (200 launches x 64 rounds x 33792 lines per rank on 132
  # SMs, both ranks) and calls (4000 per PDL setting), then seconds, measured by the first chunk
  local lu=865000000 cu=8000 ls=0 cs=0
  while :; do
    local did=0 kind need unit secs k share log got g el b1 br wr
    local -a todo=()
    [ "$lines" -lt "$tl" ] && todo+=(lines)
    [ "$calls" -lt "$tc" ] && todo+=(calls)
    [ "${#todo[@]}" -eq 0 ] && break
    for kind in "${todo[@]}"; do
      if [ "$kind" = lines ]; then need=$((tl - lines)); unit=$lu; secs=$ls; g=LL128Stress.LinesAreReadWhole
      else need=$((tc - calls)); unit=$cu; secs=$cs; g=LL128Stress.CallsWithOneRankLate; fi
      k=$(( (need + unit - 1) / unit ))
      share=$(( ($(left) - RESERVE - 20) / ${#todo[@]} ))
      if [ "$secs" -eq 0 ]; then  # not measured yet: a small first chunk
        if [ "$kind" = lines ]; then k=$(( k < 2 ? k : 2 )); else k=$(( k < 10 ? k : 10 )); fi
      else
        local fit=$(( share * 8 / 10 / secs )); [ "$fit" -lt "$k" ] && k=$fit
      fi
      [ "$k" -ge 1 ] || continue
      n=$((n + 1)); log=$d/$kind-$n.log
      bounded "ll128 $kind x$k" 540 "$log" env GTEST_FILTER="$g" WEAVE_STRESS_SCALE="$k" \
        ctest --test-dir "$B/build" -R '^test_ll128_stress$' -V
      [ "$DRY" = 1 ] && continue  # one chunk of each kind printed
      [ "$last_rc" -eq 125 ] && break 2
      did=1; runs=$((runs + 1)); el=$last_s
      if [ "$kind" = lines ]; then
        read -r got b1 br <<< "$(sed -nE 's/.*LL128 lines from rank [0-9]+: ([0-9]+) read with the load that saw the flag, ([0-9]+) of them .*; ([0-9]+) read through receive\(\), ([0-9]+) with older data.*/\1 \2 \3 \4/p' "$log" |
          awk '{ n += $1 + $3; b += $2; r += $4 } END { printf "%.0f %.0f %.0f\n", n, b, r }')"
        lines=$((lines + got)); bad1=$((bad1 + b1)); badr=$((badr + br))
        [ "$got" -gt 0 ] && { lu=$(( got / k )); ls=$(( (el + k - 1) / k )); }
      else
        read -r got wr <<< "$(sed -nE 's/.*rank 0: ([0-9]+) LL128 calls, PDL (on|off), one rank 0-20 us late: (all exact|WRONG).*/\1 \3/p' "$log" |
          awk '{ n += $1; if ($2 == "WRONG") w++ } END { printf "%.0f %.0f\n", n, w }')"
        calls=$((calls + got)); wrong=$((wrong + wr))
        [ "$got" -gt 0 ] && { cu=$(( got / k )); cs=$(( (el + k - 1) / k )); }
      fi
      grep -hsE "tests passed|tests failed|Skipped|WEAVE_TEST_SEED" "$log" | head -3 | sed 's/^/  /'
      if [ "$last_rc" -ne 0 ] || [ "$got" -eq 0 ]; then failed=1; break 2; fi
    done
    [ "$did" = 1 ] || break
  done
  [ "$DRY" = 1 ] && return
  echo "$lines $bad1 $badr $calls $wrong $runs" > "$KEEP/ll128.totals"
  say "ll128 totals (this machine, $runs runs): lines read $lines of $tl, $bad1 of those read with the flag's own load held older data (the race receive() closes), $badr through receive() (must be 0); LL128 calls $calls of $tc, $wrong runs with a WRONG output$([ "$failed" = 1 ] && echo '; stopped after a failing or empty run')"
}

# ab: each suite with 4f8b885's binaries, then this build's, default options (the old ones' flags
# may differ), JSON apart; per weave row (same kernel and shape fields) new time / old time.
step_ab() {
  local d=$OUT/ab suite ver wr wb
  if [ "$DRY" != 1 ] && [ ! -x "$KEEP/old-4f8b885/weave-bench" ]; then
    [ -f .carry/old-4f8b885.tar.xz ] || { say "ab: no .carry/old-4f8b885.tar.xz (the header says how to build it)"; return; }
    tar -C "$KEEP" -xJf .carry/old-4f8b885.tar.xz
  fi
  mkdir -p "$d"
  for suite in ${AB_SUITES:-tp collectives sp}; do
    for ver in old new; do
      if [ "$ver" = old ]; then wr=$KEEP/old-4f8b885/weave-run wb=$KEEP/old-4f8b885/weave-bench
      else wr=$B/build/bin/weave-run wb=$B/build/bin/weave-bench; fi
      bounded "ab $suite $ver" "${AB_CAP:-170}" "$d/$suite-$ver.log" "$wr" -n 2 -- "$wb" "$suite" --json "$d/$suite-$ver.json"
    done
    [ "$DRY" = 1 ] && continue
    python3 - "$d/$suite-old.json" "$d/$suite-new.json" << 'EOF'
import json, math, os, sys
def rows(p):
    out = {}
    if not os.path.exists(p):
        return out
    for line in open(p, errors="replace"):
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if r.get("impl") != "weave" or "time_us" not in r:
            continue
        key = tuple(sorted((k, str(v)) for k, v in r.items() if k not in ("time_us", "tflops", "gbs", "busbw_gbs",
                    "algbw_gbs", "correct", "seed", "check_worst", "machine_call", "round", "tuned", "num_comm_sms",
                    "lse_rel_err", "o_err", "speedup", "ratio", "host_us", "gpu_us") and not isinstance(v, float)))
        out.setdefault(key, []).append(float(r["time_us"]))
    return out
old, new = rows(sys.argv[1]), rows(sys.argv[2])
both = [k for k in new if k in old]
name = os.path.basename(sys.argv[2]).rsplit("-", 1)[0]
if not both:
    print(f"  {name}: no weave rows in both runs (old {len(old)}, new {len(new)})"); sys.exit(0)
ratios = sorted((min(new[k]) / min(old[k]), k) for k in both)
g = math.exp(sum(math.log(r) for r, _ in ratios) / len(ratios))
print(f"  {name}: new / old time over {len(both)} weave rows: geomean {g:.3f}, best {ratios[0][0]:.3f}, worst {ratios[-1][0]:.3f}")
for r, k in ratios[-3:]:
    print(f"    {r:.3f} " + " ".join(f"{a}={b}" for a, b in k if a not in ("impl",)))
EOF
  done
}

step_tp() {
  # The sweep's rows come after the default rows, each written as it ends: if the bench reaches
  # its cap, what was measured stays.
  local sweep="--sweep ${TP_SWEEP:-0,4,8,16,32,64}"
  [ "${TP_SWEEP:-}" = off ] && sweep=""
  dc tp-bench 400 tp BENCH_ARGS="$sweep ${TP_ARGS:-}" -- bench:tp
  dc tp-torch 300 tp -- torch:tp
  sum_json "$OUT/tp/tp.json" 24
  [ -s "$OUT/tp/tp.json" ] && cp "$OUT/tp/tp.json" "$KEEP/tp.json"
}
step_tp8() {
  dc tp8 400 tp8 BENCH_ARGS="--dtype fp8 ${TP8_ARGS:-}" -- bench:tp
  sum_json "$OUT/tp8/tp.json" 16
}
step_ops() {
  wheel || return
  local cpp="" f
  for f in "$OUT/tp/tp.json" "$KEEP/tp.json"; do [ -s "$f" ] && { cpp=$f; break; }; done
  local -a extra=()
  [ -n "$cpp" ] && extra=(--cpp-json "$cpp")
  # shellcheck disable=SC2086  # OPS_ARGS is a list of arguments
  bounded ops 540 "$OUT/ops/torch_ops.log" env "$(pyenv)" PYTHONUNBUFFERED=1 torchrun --nproc_per_node 2 \
    bench/torch_ops.py --json "$OUT/ops/ops.jsonl" "${extra[@]}" ${OPS_ARGS:-}
  [ "$DRY" = 1 ] && return
  grep -hsE "incorrect row|every row checked|Error" "$OUT/ops/torch_ops.log" | head -5 | sed 's/^/  /'
  sum_json "$OUT/ops/ops.jsonl" 30
}
step_coll() {
  dc coll 400 coll BENCH_ARGS="${COLL_ARGS:-}" -- bench:collectives
  sum_json "$OUT/coll/collectives.json" 20 bytes
}
step_sp() {
  dc sp-bench 400 sp -- bench:sp
  dc sp-torch 300 sp -- torch:sp
  [ "$DRY" = 1 ] || { [ -s "$OUT/sp/sp-report.md" ] && sed 's/^/  /' "$OUT/sp/sp-report.md"; sum_json "$OUT/sp/sp.json" 0; }
}
step_moe() {
  dc moe-bench 400 moe BENCH_ARGS="${MOE_ARGS:-}" -- bench:moe
  bounded moe-torch 300 "$OUT/moe/torch-moe.log" env PYTHONUNBUFFERED=1 torchrun --nproc_per_node 2 \
    bench/torch_moe.py --json "$OUT/moe/moe.json"
  [ "$DRY" = 1 ] && return
  python3 bench/torch_moe.py --report "$OUT/moe/moe.json" > "$OUT/moe/moe-report.md" 2>&1
  sum_json "$OUT/moe/moe.json" 0
  grep -hsE "geomean| 16384 " "$OUT/moe/moe-report.md" | sed 's/^/  /'
}
step_moe_ll() {
  dc moe-ll 200 moe-ll BENCH_ARGS="--kernels ll --models deepseek --tokens 128 --routing balanced,dirichlet" -- bench:moe
  sum_json "$OUT/moe-ll/moe.json" 10
}
step_py() {
  dc py 560 py WEAVE_GRAPH_REPLAYS="${GRAPH_REPLAYS:-1000}" -- python
  [ "$DRY" = 1 ] || tail -qn 2 "$OUT/py/pytest.log" "$OUT/py/pytest-multirank.log" 2>/dev/null | grep -E "passed|failed|error" | sed 's/^/  /'
}
step_block() {
  wheel || return
  local log run
  local -a check
  for run in weave torch; do
    log=$OUT/block/tp_block-$run-attention.log
    check=(); [ "$run" = weave ] && check=(--check)
    # shellcheck disable=SC2086  # BLOCK_ARGS is a list of arguments
    bounded "block ($run attention)" 360 "$log" env "$(pyenv)" PYTHONUNBUFFERED=1 torchrun --nproc_per_node 2 \
      examples/torch/tp_block.py --all --hidden 8192 --ffn 28672 --heads 32 --seq 8192,16384 \
      --weave-attention "$run" --json "$OUT/block/tp_block.jsonl" "${check[@]}" ${BLOCK_ARGS:-}
    [ "$DRY" = 1 ] || grep -hsE "^S=|weave vs|skipped|within the bound|worst|Error" "$log" | head -16 | sed 's/^/  /'
  done
}
step_net() {
  dc net 300 net -- bench:net
  dc net-coll 300 net -- bench:net_coll
  [ "$DRY" = 1 ] || grep -hsE "^targets:|^floor|nccl rows skipped" "$OUT/net/net.log" | cut -c1-200 | sed 's/^/  /'
  sum_json "$OUT/net/net.json" 12 bytes
  sum_json "$OUT/net/net_coll.json" 12 bytes
}
step_net_tp() {
  dc net-tp 400 net-tp BENCH_ARGS="${NET_TP_ARGS:---impls weave,weave-unfused,nccl,weave-adaptive --sweep 1+1,2+6,4+12,8+24}" -- bench:net_tp
  dc net-ring 300 net-tp -- bench:net_ring
  sum_json "$OUT/net-tp/net_tp.json" 20
  sum_json "$OUT/net-tp/net_ring.json" 12
}

# ---- main -------------------------------------------------------------------------------------
if [ "$DRY" != 1 ]; then
  ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
  if [ "$ngpu" -lt 2 ]; then
    echo "two-gpu-session: $ngpu GPU(s) here, every step needs 2 (one GPU: scripts/device-check.sh tests-shared)"
    exit 3
  fi
  nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm,power.limit --format=csv,noheader
  nvidia-smi topo -m 2>/dev/null | sed -n '1,3p' | cut -c1-60
fi
for step in "$@"; do
  echo "== $step ($(left) s of the call's budget left)"
  case $step in
    t1) step_tests t1 "-R $T1_RE" ;;
    t2) step_tests t2 "-E $T1_RE" ;;
    races) step_faults races "$RACES_A" "$STASH" --bench-timeout 200 --test-timeout "${TEST_TIMEOUT:-240}" ;;
    races2) step_faults races2 "$RACES_B" "$STASH" --bench-timeout 200 --test-timeout "${TEST_TIMEOUT:-240}" ;;
    faults2) step_faults faults2 "$F2_A" "$STASH_F2" --checks bench --bench-timeout 120 ;;
    faults2b) step_faults faults2b "$F2_B" "$STASH_F2B" --checks bench --bench-timeout 120 ;;
    ll128) step_ll128 ;;
    ab) step_ab ;;
    tp) step_tp ;;
    tp8) step_tp8 ;;
    ops) step_ops ;;
    coll) step_coll ;;
    sp) step_sp ;;
    moe) step_moe ;;
    moe-ll) step_moe_ll ;;
    py) step_py ;;
    block) step_block ;;
    net) step_net ;;
    net-tp) step_net_tp ;;
    *) say "unknown step '$step' (the header of $0 lists them)" ;;
  esac
done
echo "== summary (${SECONDS} s)"
printf '%s\n' "${summary[@]}" | tee "$OUT/summary.txt"
[ "$DRY" = 1 ] && exit 0
# The device tool returns only a few files per call: everything under $OUT as one all.tgz.
case $(cd "$OUT" && pwd -P) in /|"$(cd "$root" && pwd -P)"|"$(cd "$B" && pwd -P)") echo "OUT=$OUT: not tarred and emptied"; exit 0 ;; esac
tar czf "/tmp/two-gpu-all.$$.tgz" -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv "/tmp/two-gpu-all.$$.tgz" "$OUT/all.tgz"
