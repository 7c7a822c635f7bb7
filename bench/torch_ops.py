#!/usr/bin/env python3
"""Per-op times of weave's PyTorch ops against their torch equivalents, as `weave-bench` JSON lines.

    torchrun --nproc_per_node 2 bench/torch_ops.py --json ops.jsonl [--quick] [--cpp-json cpp.jsonl]
    WEAVE_SHARE_GPUS=1 torchrun --nproc_per_node 2 bench/torch_ops.py --quick   # 2 ranks on 1 GPU: checks only

Every rank needs its own GPU for the NCCL backend; with more ranks than GPUs set WEAVE_SHARE_GPUS=1
(gloo, torch's collectives through host memory, --quick's sizes): the rows are checked, their times
mean nothing and they carry "shared": true. Sections (--only picks some):

- all_reduce, all_gather (dim 0), reduce_scatter (dim 0): bf16, 8 KiB to 256 MiB per rank, fields as
  `weave-bench collectives` (dtype, layout, shape, dim, bytes, algbw_gbs, busbw_gbs). impl "weave"
  (ordinary tensors: weave stages the input into its symmetric heap and copies the output out),
  "weave-symm-in" (inputs from weave.empty: no input copy), "torch-nccl" (dist.all_reduce of a clone,
  i.e. a new tensor as weave returns; all_gather_into_tensor; reduce_scatter_tensor).
- ag_gemm, gemm_rs: fields as `weave-bench tp` (S, M, N, K of the local GEMM): bench/torch_tp.py's
  square shapes (shape "square") and the TP block's at hidden 8192, ffn 28672, 32 x 128 heads
  (shapes "qkv", "up", "out", "down"; S = tokens T). weave.all_gather_matmul /
  weave.matmul_reduce_scatter against "torch-nccl" (NCCL collective, then or after torch.matmul)
  and "torch-symm-mem" (torch.ops.symm_mem's fused ops; rows skipped, with the reason, where torch's
  symmetric memory does not work). B is K x N (--b-layout nk: an nn.Linear weight's .t()).
- gemm: weave.matmul vs torch.matmul ("torch-matmul"), B as weight.t() (layout "nk") and K x N ("kn").
- attention: weave.attention vs SDPA restricted to cuDNN ("torch-sdpa-cudnn") and to flash
  ("torch-sdpa-flash"); causal, B 1, the TP block's heads per rank (32 / W), head dim 128.
- overhead (kernel "python_overhead"): host time per eager call of an 8 KiB all_reduce, of
  all_gather_matmul at S = 2048 and of a 512^3 matmul (B as weight.t()): host_us, the time to
  issue a call, the median over --calls calls in batches of 50 with a synchronize before each (so
  that a call the GPU runs longer than the host issues it never waits for room in the launch
  queue), the implementations of a case taking turns batch by batch (the host's speed drifts);
  wall_us, the same calls back to back until the GPU finished; then (every implementation's eager
  loop done first) the same calls captured in a torch.cuda.graph and replayed; then weave's rows
  eager again (host_after_capture_us: a TP or collective call whose signal set was captured once
  launches one more one-thread kernel per eager call from then on). impl "weave-cpp" is the same
  call through weave's C++ entry point (its pybind binding, buffers and pointers made beforehand):
  the C++ path, whose host_us the "weave" row subtracts as over_cpp_us, the Python overhead (issue
  19: <= 10 us; over_cpp_after_capture_us the same after the captures). all_gather_matmul
  also as "weave-no-A" (return_A=False: no copy of the gathered A). With --cpp-json, weave-bench's
  C++ figures of the same shapes are added (cpp_host_us, cpp_time_us).
- first_call: the first call of a TP shape this process has not seen (tokens drawn from the seed),
  which includes weave's tuner choice (the cost model's pick by default; a search under
  WEAVE_TUNER=search) and staging growth if it is the largest shape so far, and the call after it;
  the same for the torch baselines. Then the first calls of a smaller and of a larger new shape
  (`first_of` in the rows): the smaller one's is what any new shape costs once the process has run
  the kernel (its tuner choice, plan and signal sets), the larger one's adds the staging growth, and
  the first shape's excess over the smaller one's is the process's (module loads, first buffers).

Timing, as bench/torch_tp.py (whose helpers this imports): 3 untimed calls, then the slowest rank's
median over 6 samples of back-to-back calls timed with CUDA events (~100 ms warm-up, ~50 ms timed,
from the first call's time). The calls rotate over three input sets, and the last timed call's
output is checked on every rank against a float32 reference each rank computes from regenerated
inputs, element by element (collectives: integer-valued inputs, exact sums expected, bound 2 W 2^-8
sum|x|; GEMMs: check/gemm_ref.hpp's bounds per 128 x 128 tile and the gathered A bit for bit;
attention: bench/torch_attention.py's float64 check on sampled rows). A row is correct only if it
is on every rank (check_worst: the worst ratio to the bound over ranks). The seed is WEAVE_TEST_SEED
or drawn by rank 0, printed and recorded. Exit status 1 if any row is incorrect (skipped rows do not
count), 2 for a setup error. --cpp-json adds cpp_time_us and vs_cpp (time_us / cpp_time_us - 1) to
weave rows whose shape a weave-bench row has (issue 19: within 3 %)."""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(1, os.path.join(os.path.dirname(HERE), "examples", "torch"))  # tp_common

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

PROG = "torch_ops.py"
DEV = "cuda"
KiB, MiB = 1 << 10, 1 << 20
SIZES = [8 * KiB, 64 * KiB, 256 * KiB, MiB, 4 * MiB, 16 * MiB, 64 * MiB, 256 * MiB]
QUICK_SIZES = [8 * KiB, 64 * KiB, MiB, 64 * MiB]
COLS = 4096  # row width of the all_gather / reduce_scatter tensors (weave-bench collectives --cols)
SQUARE, QUICK_SQUARE = [2048, 4096, 8192, 16384, 32768], [2048, 8192]  # bench/torch_tp.py's sizes
TOKENS, QUICK_TOKENS = [256, 8192, 16384, 32768], [256, 8192]
HIDDEN, FFN, HEADS, HEAD_DIM = 8192, 28672, 32, 128  # the TP block of examples/torch/tp_block.py
GEMM_SQUARE, QUICK_GEMM_SQUARE = [4096, 8192], [4096]
ATTN_SEQS, QUICK_ATTN_SEQS = [8192, 16384, 32768], [4096]
SECTIONS = ("all_reduce", "all_gather", "reduce_scatter", "ag_gemm", "gemm_rs", "gemm", "attention", "overhead",
            "first_call")
WARM_CALLS = 3
BASELINE = {"all_reduce": "torch-nccl", "all_gather": "torch-nccl", "reduce_scatter": "torch-nccl",
            "ag_gemm": "torch-nccl", "gemm_rs": "torch-nccl", "gemm": "torch-matmul", "attention": "torch-sdpa-cudnn"}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", default=None, help="append the rows (JSON lines) to FILE (rank 0)")
    ap.add_argument("--quick", action="store_true", help="a short set of sizes")
    ap.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated sections of {', '.join(SECTIONS)}")
    ap.add_argument("--cpp-json", default=None, help="weave-bench JSON lines to compare weave's rows with")
    ap.add_argument("--calls", type=int, default=1000, help="eager calls of the overhead measurement")
    ap.add_argument("--gc-off", action="store_true",
                    help="overhead: Python's cyclic garbage collector paused while timing (collected first)")
    ap.add_argument("--b-layout", choices=("kn", "nk"), default="kn", help="B of the TP rows: K x N, or weight.t()")
    ap.add_argument("--heap-gib", type=float, default=16.0,
                    help="weave's symmetric heap per rank (WEAVE_HEAP_BYTES wins)")
    args = ap.parse_args(argv)
    args.sections = [s for s in args.only.split(",") if s]
    bad = [s for s in args.sections if s not in SECTIONS]
    if bad:
        ap.error(f"unknown section(s) {', '.join(bad)}; sections: {', '.join(SECTIONS)}")
    return args


def size_str(n):
    return f"{n // MiB} MiB" if n >= MiB else f"{n // KiB} KiB"


def finite_or_str(v):
    return v if not isinstance(v, float) or math.isfinite(v) else str(v)  # JSON has no inf / nan


class Case:
    """One shape: its row fields, input sets per implementation, the ops, and the check of an output."""

    def __init__(self, fields, label, check, impls, work=None):
        self.fields, self.label, self.check, self.impls = fields, label, check, impls  # impls: {name: (op, sets)}
        self.work = work  # (kind, amount): ("flops", F) or ("bytes", alg bytes, bus factor)


class Bench:
    def __init__(self, args, setup, seed, weave):
        from tp_common import Coll, TorchTP

        self.args, self.setup, self.seed, self.weave = args, setup, seed, weave
        self.rank, self.W, self.lead = setup.rank, setup.world, setup.rank == 0
        self.coll = Coll(setup)
        self.torch_tp = TorchTP(self.coll)
        self.quick = args.quick or setup.shared
        self.rows, self.wrong = [], []
        self._symm = None
        self.cpp = self._load_cpp(args.cpp_json)

    # ---- output

    def _load_cpp(self, path):
        if not path:
            return {}
        out = {}
        with open(path) as fh:
            for line in fh:
                line = line.strip()
                if not line.startswith("{"):
                    continue
                r = json.loads(line)
                if r.get("impl") == "weave" and (r.get("kernel") != "attention" or r.get("variant") == "auto"):
                    key = cpp_key(r)
                    if key is not None:
                        out.setdefault(key, r)
        return out

    def print(self, *a):
        if self.lead:
            print(*a, flush=True)

    def emit(self, case, rows):
        """Ratios against the baselines and the C++ rows, the table lines, the JSON lines."""
        times = {r["impl"]: r.get("time_us", 0) for r in rows}
        base = BASELINE.get(case.fields["kernel"])
        for r in rows:
            if r["impl"].startswith("weave") and r.get("time_us", 0) > 0:
                if times.get(base, 0) > 0:
                    r["ratio_vs_torch"] = times[base] / r["time_us"]
                if times.get("torch-symm-mem", 0) > 0:
                    r["ratio_vs_symm_mem"] = times["torch-symm-mem"] / r["time_us"]
                c = self.cpp.get(cpp_key(r))
                if c and c.get("time_us", 0) > 0:
                    r["cpp_time_us"] = c["time_us"]
                    r["vs_cpp"] = r["time_us"] / c["time_us"] - 1
            if not self.lead:
                continue
            if "skipped" in r:
                print(f"| {r['kernel']} | {r['impl']} | {case.label} | skipped: {r['skipped']} |", flush=True)
                continue
            t = r.get("time_us", 0)
            rate = (f"{r['tflops']:.0f} TFLOP/s" if "tflops" in r else
                    f"{r['busbw_gbs']:.1f} GB/s" if "busbw_gbs" in r else "-")
            vs = f"{r['ratio_vs_torch']:.3f}" if "ratio_vs_torch" in r else "-"
            cpp = f"{100 * r['vs_cpp']:+.1f} %" if "vs_cpp" in r else "-"
            check = "ok" if r["correct"] else " ".join(["WRONG"] + ([r["error"]] if "error" in r else []))
            print(f"| {r['kernel']} | {r['impl']} | {case.label} | {t:.1f} | {rate} | {vs} | {cpp} | {check} "
                  f"{r['check_worst']:.3g} |", flush=True)
        self.record(rows, case.label)

    def record(self, rows, label):
        """Keeps the rows (naming the incorrect ones for the exit status) and appends them to --json."""
        for r in rows:
            if "correct" in r and not r["correct"]:
                self.wrong.append(" ".join(str(x) for x in (r["kernel"], r.get("op", ""), r["impl"], label) if x))
        self.rows += rows
        if self.lead and self.args.json:
            with open(self.args.json, "a") as fh:
                for r in rows:
                    fh.write(json.dumps({k: finite_or_str(v) for k, v in r.items()}) + "\n")

    def base_row(self, case, impl):
        return dict({"kernel": case.fields["kernel"], "impl": impl}, **case.fields, world=self.W, seed=str(self.seed),
                    shared=self.setup.shared)

    # ---- measuring

    def measure(self, case, impl, op, sets):
        """Times op (the slowest rank's median) and checks the last timed call's output on every rank."""
        from torch_tp import Rotating, all_ranks, slowest_us

        row = self.base_row(case, impl)
        ok, worst, detail = False, math.inf, ""
        try:
            f = Rotating(op, sets)
            for _ in range(WARM_CALLS):
                f()
            torch.cuda.synchronize()
            row["time_us"] = slowest_us(f)
            torch.cuda.synchronize()
            i, out = f.last
            f.last = None
            ok, worst, detail = case.check(i, out)
            del out
        except Exception as e:  # noqa: BLE001 (reported in the row)
            row.update(time_us=0.0, error=f"{type(e).__name__}: {str(e)[:300]}")
            detail = row["error"]
        if not ok:
            print(f"rank {self.rank}: {case.fields['kernel']} {impl} {case.label}: {detail}", flush=True)
        row["correct"], row["check_worst"] = all_ranks(ok, worst)
        t = row["time_us"]
        if case.work and t > 0:
            if case.work[0] == "flops":
                row["tflops"] = case.work[1] / (t * 1e-6) / 1e12
            else:
                row["algbw_gbs"] = case.work[1] / t / 1e3
                row["busbw_gbs"] = row["algbw_gbs"] * case.work[2]
        return row

    def run_case(self, case):
        rows = []
        for impl, spec in case.impls.items():
            if isinstance(spec, str):  # skipped, with the reason
                rows.append(dict(self.base_row(case, impl), skipped=spec))
            else:
                rows.append(self.measure(case, impl, *spec))
        self.emit(case, rows)
        torch.cuda.empty_cache()

    def symm(self):
        """(SymmMemTP or None, why not), probed once."""
        if self._symm is None:
            from tp_common import symm_mem_tp

            self._symm = symm_mem_tp(self.setup)
            if self._symm[0] is None:
                self.print(f"torch-symm-mem rows skipped: {self._symm[1]}")
        return self._symm

    # ---- inputs

    def ints(self, shape, *ids):
        """Integer-valued bf16 in [-8, 8] from (seed, ids): sums over ranks are exact in bf16 and fp32."""
        from torch_tp import derive

        g = torch.Generator(device=DEV)
        g.manual_seed(derive(self.seed, *ids))
        return torch.randint(-8, 9, shape, generator=g, device=DEV, dtype=torch.float32).to(torch.bfloat16)

    def uni(self, shape, *ids):
        from torch_tp import derive, uniform

        return uniform(shape, derive(self.seed, *ids))

    # ---- cases

    def coll_case(self, kernel, nbytes):
        from torch_tp import SETS, tile_check

        W, rank, weave = self.W, self.rank, self.weave
        kid = SECTIONS.index(kernel) + 1
        if kernel == "all_reduce":
            n = max(1, nbytes // 2)
            shape, in_shape = (n,), (n,)
            fields = dict(layout="flat", shape=str(n), dim=-1, bytes=2 * n)
            alg, bus = 2 * n, 2.0 * (W - 1) / W
        else:
            gather = kernel == "all_gather"
            full = max(COLS, (W * nbytes if gather else nbytes) // 2)
            rows = max(1, full // COLS)
            rows += (W - rows % W) % W  # whole rows per rank
            shape = (rows, COLS)
            in_shape = (rows // W, COLS) if gather else shape
            fields = dict(layout="dim0", shape=f"{rows}x{COLS}", dim=0,
                          bytes=2 * COLS * (rows // W if gather else rows))
            alg, bus = 2 * rows * COLS, (W - 1) / W
        fields = dict(kernel=kernel, dtype="bf16", **fields)

        def inp(i, q):
            return self.ints(in_shape, kid, nbytes, i, q)

        def check(i, out):
            if kernel == "all_gather":
                ok = torch.equal(out, torch.cat([inp(i, q) for q in range(W)]))
                return ok, 0.0 if ok else math.inf, "" if ok else "the gathered tensor differs"
            xs = [inp(i, q).float() for q in range(W)]
            r, s = sum(xs), sum(x.abs() for x in xs)
            if kernel == "reduce_scatter":
                lo = rank * (shape[0] // W)
                r, s = r[lo:lo + shape[0] // W], s[lo:lo + shape[0] // W]
            if out.shape != r.shape:
                return False, math.inf, f"output shape {tuple(out.shape)}, expected {tuple(r.shape)}"
            m = out.numel()
            as2d = (lambda t: t.reshape(m // COLS, COLS)) if m % COLS == 0 else (lambda t: t.reshape(1, m))
            return tile_check(as2d(out), as2d(r), as2d(s), (0.0, 2 * W * 2.0 ** -8))

        fn = {"all_reduce": lambda x: weave.all_reduce(x), "all_gather": lambda x: weave.all_gather(x, 0),
              "reduce_scatter": lambda x: weave.reduce_scatter(x, 0)}[kernel]
        torch_fn = {"all_reduce": self.coll.all_reduce, "all_gather": self.coll.all_gather,
                    "reduce_scatter": self.coll.reduce_scatter}[kernel]
        plain = [(inp(i, rank),) for i in range(SETS)]
        symmetric = []
        for (x,) in plain:
            y = weave.empty(x.shape, x.dtype)
            y.copy_(x)
            symmetric.append((y,))
        impls = {"weave": (fn, plain), "weave-symm-in": (fn, symmetric), "torch-nccl": (torch_fn, plain)}
        return Case(fields, f"{fields['shape']} ({size_str(fields['bytes'])})", check, impls, ("bytes", alg, bus))

    def tp_case(self, kernel, name, S, M, N, K):
        """ag_gemm: A shard (M/W x K) gathered, times B (K x N, this rank's); gemm_rs: A (M x K) times
        B (K x N), reduce-scattered along the rows. As bench/torch_tp.py."""
        from torch_tp import SETS, GEMM_BOUND, fp32_ref, partial_sum_bound, tile_check

        W, rank, weave = self.W, self.rank, self.weave
        kid = SECTIONS.index(kernel) + 1
        nk = self.args.b_layout == "nk"

        def b_of(i, q):
            return (self.uni((N, K), kid, M, N, K, i, q, 1).t() if nk else self.uni((K, N), kid, M, N, K, i, q, 1))

        fields = dict(kernel=kernel, shape=name, S=S, M=M, N=N, K=K, b_layout=self.args.b_layout)
        label = f"{name} S={S} {M}x{N}x{K}"
        ag = kernel == "ag_gemm"
        if ag:
            def a_of(i, q):
                return self.uni((M // W, K), kid, M, N, K, i, q, 0)

            def check(i, res):
                gathered, out = res
                full = torch.cat([a_of(i, q) for q in range(W)])
                r, s = fp32_ref([full], [b_of(i, rank)])
                ok, worst, detail = tile_check(out, r, s, GEMM_BOUND)
                if gathered is not None and not torch.equal(gathered, full):
                    ok, worst, detail = False, math.inf, detail + "; the gathered A differs"
                return ok, worst, detail

            fn = lambda a, b: (lambda A, Cs: (A, Cs[0]))(*weave.all_gather_matmul(a, [b]))  # noqa: E731
            torch_fn = self.torch_tp.ag_mm
        else:
            def a_of(i, q):
                return self.uni((M, K), kid, M, N, K, i, q, 0)

            def check(i, out):
                lo, hi = rank * (M // W), (rank + 1) * (M // W)
                r, s = fp32_ref([a_of(i, q)[lo:hi] for q in range(W)], [b_of(i, q) for q in range(W)])
                return tile_check(out, r, s, partial_sum_bound(W))

            fn = lambda a, b: weave.matmul_reduce_scatter(a, b)  # noqa: E731
            torch_fn = self.torch_tp.mm_rs
        sets = [(a_of(i, rank), b_of(i, rank)) for i in range(SETS)]
        symm, why = self.symm()
        impls = {"weave": (fn, sets), "torch-nccl": (torch_fn, sets),
                 "torch-symm-mem": ((symm.ag_mm if ag else symm.mm_rs), sets) if symm else why}
        return Case(fields, label, check, impls, ("flops", 2.0 * M * N * K))

    def tp_shapes(self, kernel):
        W, attn = self.W, HEADS * HEAD_DIM
        out = []
        for S in (QUICK_SQUARE if self.quick else SQUARE):
            out.append(("square", S, S, S // W, S) if kernel == "ag_gemm" else ("square", S, S, S, S // W))
        for T in (QUICK_TOKENS if self.quick else TOKENS):
            if kernel == "ag_gemm":
                out += [] if self.quick else [("qkv", T, T, 3 * attn // W, HIDDEN)]
                out.append(("up", T, T, FFN // W, HIDDEN))
            else:
                out += [] if self.quick else [("out", T, T, HIDDEN, attn // W)]
                out.append(("down", T, T, HIDDEN, FFN // W))
        return out

    def gemm_case(self, name, M, N, K, layout):
        from torch_tp import SETS, GEMM_BOUND, fp32_ref, tile_check

        kid = SECTIONS.index("gemm") + 1
        code = 0 if layout == "kn" else 1

        def set_of(i):
            a = self.uni((M, K), kid, M, N, K, code, i, self.rank, 0)
            b = self.uni((K, N), kid, M, N, K, code, i, self.rank, 1)
            return a, (b if layout == "kn" else b.t().contiguous().t())

        sets = [set_of(i) for i in range(SETS)]

        def check(i, out):
            r, s = fp32_ref([sets[i][0]], [sets[i][1]])
            return tile_check(out, r, s, GEMM_BOUND)

        fields = dict(kernel="gemm", shape=name, M=M, N=N, K=K, dtype="bf16", layout=layout)
        impls = {"weave": (lambda a, b: self.weave.matmul(a, b), sets), "torch-matmul": (torch.matmul, sets)}
        return Case(fields, f"{name} {M}x{N}x{K} {layout}", check, impls, ("flops", 2.0 * M * N * K))

    def attention_case(self, S, H, D=HEAD_DIM, B=1):
        from tp_common import sdpa
        from torch_attention import check as attention_check, sample_rows
        from torch_tp import SETS, derive

        g = torch.Generator(device=DEV)
        g.manual_seed(derive(self.seed, SECTIONS.index("attention") + 1, S, H, D, self.rank))
        sets = []
        for _ in range(SETS):  # q.k / sqrt(D) with a standard deviation of 3: a peaked softmax
            q, k = (torch.randn(B, S, H, D, device=DEV, generator=g).mul_(math.sqrt(3.0)).bfloat16() for _ in range(2))
            sets.append((q, k, torch.randn(B, S, H, D, device=DEV, generator=g).bfloat16()))
        rows = sample_rows(S, derive(self.seed, S, H, self.rank))

        def check(i, out):
            worst = attention_check(*sets[i], out, True, rows)
            return worst <= 1.0, worst, f"worst {worst:.4g} of the bound on {len(rows)} sampled rows"

        fields = dict(kernel="attention", B=B, S=S, H=H, H_kv=H, D=D, causal=True)
        impls = {"weave": (lambda q, k, v: self.weave.attention(q, k, v, causal=True)[0], sets)}
        for backend in ("cudnn", "flash"):
            impls[f"torch-sdpa-{backend}"] = ((lambda q, k, v, b=backend: sdpa(q, k, v, True, b)), sets)
        return Case(fields, f"B{B} S{S} H{H} D{D} causal", check, impls, ("flops", 2.0 * B * S * S * H * D))

    # ---- sections

    def run_sections(self):
        s = self.args.sections
        for kernel in ("all_reduce", "all_gather", "reduce_scatter"):
            if kernel in s:
                for n in (QUICK_SIZES if self.quick else SIZES):
                    self.run_case(self.coll_case(kernel, n))
        for kernel in ("ag_gemm", "gemm_rs"):
            if kernel in s:
                for shape in self.tp_shapes(kernel):
                    self.run_case(self.tp_case(kernel, *shape))
        if "gemm" in s:
            shapes = [("square", n, n, n) for n in (QUICK_GEMM_SQUARE if self.quick else GEMM_SQUARE)]
            shapes += [("up", 8192, FFN // self.W, HIDDEN), ("down", 8192, HIDDEN, FFN // self.W)]
            for shape in shapes:
                for layout in ("nk", "kn"):
                    self.run_case(self.gemm_case(*shape, layout))
        if "attention" in s:
            for S in (QUICK_ATTN_SEQS if self.quick else ATTN_SEQS):
                self.run_case(self.attention_case(S, HEADS // self.W))
        if "overhead" in s:
            self.overhead()
        if "first_call" in s:
            self.first_call()

    def host_turns(self, runs, calls, batch=50):
        """{impl: (host us per call, (set, output) of its last call)} for runs {impl: (op, sets)}: the
        implementations take turns, one batch of `batch` calls each with a synchronize before it,
        and each one's host time is the median of its batches (the slowest rank's), so that all of
        them see the same host (its speed drifts by up to 1.5x over a run on the GPU machine)."""
        from tp_common import slowest

        torch.cuda.synchronize()
        dist.barrier()
        paused = self.args.gc_off and gc.isenabled()
        if paused:
            gc.collect()
            gc.disable()
        times = {impl: [] for impl in runs}
        last = {}
        for start in range(0, calls, batch):
            n = min(calls, start + batch) - start
            for impl, (op, sets) in runs.items():
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for i in range(start, start + n):
                    out = op(*sets[i % len(sets)])
                times[impl].append((time.perf_counter() - t0) / n)
                last[impl] = ((start + n - 1) % len(sets), out)
                del out
        torch.cuda.synchronize()
        if paused:
            gc.enable()
        return {impl: (slowest(1e6 * statistics.median(t)), last[impl]) for impl, t in times.items()}

    def wall_loop(self, op, sets, calls):
        """Wall us per call of `calls` back-to-back calls, one synchronize at the end (slowest rank)."""
        from tp_common import slowest

        torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        for i in range(calls):
            op(*sets[i % len(sets)])
        torch.cuda.synchronize()
        return slowest(1e6 * (time.perf_counter() - t0) / calls)

    def graph_loop(self, op, sets, impl, per_graph=20, replays=50):
        """(host us per call, wall us per call, ok, worst) of `per_graph` calls captured in a CUDA graph
        and replayed, or a string saying why there is none."""
        from tp_common import agree, slowest

        if self.setup.backend == "gloo" and impl.startswith("torch"):
            return "not tried: gloo collectives cannot be captured"
        if impl == "torch-symm-mem":
            return "not tried (a failed capture of symm_mem's fused ops could leave a rank waiting)"
        why = ""
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for i in range(3):
                    op(*sets[i % len(sets)])
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, capture_error_mode="thread_local"):
                outs = [op(*sets[i % len(sets)]) for i in range(per_graph)]
        except Exception as e:  # noqa: BLE001
            msg = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
            why = ("not capturable yet: " if "capture" in msg.lower() else "capture failed: ") + msg
        torch.cuda.synchronize()
        if not agree(not why):
            return why or "capture failed on another rank"
        for _ in range(3):
            g.replay()
        torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(replays):
            g.replay()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        n = replays * per_graph
        return slowest(1e6 * (t1 - t0) / n), slowest(1e6 * (t2 - t0) / n), ((per_graph - 1) % len(sets), outs[-1])

    def overhead(self):
        """Host cost per call of each case's implementations: every eager loop first, then the CUDA
        graph captures, then the weave rows' eager loops again. A TP call's signal rounds move to the
        device at its set's first captured launch (one more one-thread kernel per eager call from then
        on: runtime::SignalSet::next_round), so eager calls before and after a capture of the same
        shape cost differently; each row is compared with weave's C++ call in the same state
        (over_cpp_us before any capture, over_cpp_after_capture_us after)."""
        from torch_tp import all_ranks

        calls = max(10, self.args.calls // (10 if self.setup.shared else 1))
        cases = [("all_reduce", self.coll_case("all_reduce", 8 * KiB), ("weave-cpp", "weave", "torch-nccl")),
                 ("all_gather_matmul", self.tp_case("ag_gemm", "square", 2048, 2048, 2048 // self.W, 2048),
                  ("weave-cpp", "weave", "weave-no-A", "torch-nccl", "torch-symm-mem")),
                 ("matmul", self.gemm_case("overhead", 512, 512, 512, "nk"), ("weave-cpp", "weave", "torch-matmul"))]
        self.print(f"\nPython-side cost per call ({calls} eager calls in batches of 50; graph: 20 calls captured, "
                   "replayed 50 times; eager again after the captures)")
        for op_name, case, impls in cases:
            case.impls.update(self.cpp_calls(op_name, case))
            rows, runs, eager = {}, {}, {}
            for impl in impls:
                spec = case.impls[impl]
                if isinstance(spec, str):
                    self.print(f"  {op_name} {case.label} {impl}: skipped, {spec}")
                    continue
                op, sets = spec
                for _ in range(WARM_CALLS):
                    op(*sets[0])
                eager[impl] = (op, sets)
            for impl, (host, (i, out)) in self.host_turns(eager, calls).items():  # eager, before any capture
                op, sets = eager[impl]
                ok, worst, _ = case.check(i, out)
                del out
                wall = self.wall_loop(op, sets, calls)
                rows[impl] = dict(self.base_row(case, impl), kernel="python_overhead", op=op_name, calls=calls,
                                  gc="off" if self.args.gc_off else "on", host_us=host, wall_us=wall, time_us=host)
                runs[impl] = (op, sets, ok, worst)
            for impl, row in rows.items():  # captured and replayed
                op, sets, ok, worst = runs[impl]
                graph = self.graph_loop(op, sets, impl)
                if isinstance(graph, str):
                    row["graph"] = graph
                else:
                    row["graph_host_us"], row["graph_wall_us"], (i, out) = graph
                    g_ok, g_worst, _ = case.check(i, out)
                    ok, worst = ok and g_ok, max(worst, g_worst)
                    del out
                runs[impl] = (op, sets, ok, worst)
            again = {impl: runs[impl][:2] for impl, row in rows.items()  # weave's rows eager again, after the captures
                     if impl.startswith("weave") and "graph" not in row}
            for impl, (host, (i, out)) in (self.host_turns(again, calls).items() if again else ()):
                op, sets, ok, worst = runs[impl]
                rows[impl]["host_after_capture_us"] = host
                a_ok, a_worst, _ = case.check(i, out)
                del out
                runs[impl] = (op, sets, ok and a_ok, max(worst, a_worst))
            for impl, row in rows.items():
                _, _, ok, worst = runs[impl]
                row["correct"], row["check_worst"] = all_ranks(ok, worst)
            cpp = rows.get("weave-cpp", {})
            for impl, row in rows.items():
                if impl.startswith("weave") and impl != "weave-cpp" and cpp:
                    row["over_cpp_us"] = row["host_us"] - cpp["host_us"]
                    if "host_after_capture_us" in row and "host_after_capture_us" in cpp:
                        row["over_cpp_after_capture_us"] = row["host_after_capture_us"] - cpp["host_after_capture_us"]
                c = self.cpp.get(cpp_key(dict(case.fields, world=self.W))) if impl == "weave" else None
                if c:
                    row["cpp_time_us"] = c.get("time_us")
                    if "host_us" in c:
                        row["cpp_host_us"] = c["host_us"]
                        row["over_cpp_host_us"] = row["host_us"] - c["host_us"]
                g_txt = (row["graph"] if "graph" in row else
                         f"graph {row['graph_host_us']:.2f} us host, {row['graph_wall_us']:.2f} us wall")
                cpp_txt = ""
                if "over_cpp_us" in row:
                    cpp_txt += f"; Python adds {row['over_cpp_us']:.1f} us over weave's C++ call (target <= 10)"
                if "over_cpp_after_capture_us" in row:
                    cpp_txt += (f"; after the captures {row['host_after_capture_us']:.1f} us host, "
                                f"{row['over_cpp_after_capture_us']:.1f} us over the C++ call")
                elif "host_after_capture_us" in row:
                    cpp_txt += f"; after the captures {row['host_after_capture_us']:.1f} us host"
                if "cpp_host_us" in row:
                    cpp_txt += (f"; C++ weave-bench host {row['cpp_host_us']:.1f} us: Python adds "
                                f"{row['over_cpp_host_us']:.1f} us (target <= 10)")
                elif "cpp_time_us" in row:
                    cpp_txt += f"; C++ weave-bench device time {row['cpp_time_us']:.1f} us (no host_us in the file)"
                self.print(f"  {op_name} {case.label} {impl}: eager {row['host_us']:.1f} us host, {row['wall_us']:.1f} us "
                           f"wall per call; {g_txt}{cpp_txt}; {'ok' if row['correct'] else 'WRONG'}")
            self.record(list(rows.values()), case.label)
            del case, runs
            torch.cuda.empty_cache()

    def cpp_calls(self, op_name, case):
        """The case's call through weave's C++ entry point (the pybind binding of the communicator,
        as weave's Python op makes it), with the output, the symmetric buffer and the pointers made
        beforehand: "weave-cpp", the C++ path the Python overhead is measured against. For
        all_gather_matmul also "weave-no-A" (return_A=False)."""
        from weave import _comm, _ops
        from weave._lib import lib

        plain = case.impls["weave"][1]
        c = _comm.communicator(None)
        raw_stream = torch._C._cuda_getCurrentRawStream  # per call: a graph capture switches streams
        if op_name == "matmul":
            a0, b0 = plain[0]
            M, K, N = int(a0.shape[0]), int(a0.shape[1]), int(b0.shape[1])
            out = torch.empty((M, N), dtype=a0.dtype, device=a0.device)
            nk = not b0.is_contiguous()

            def gemm(a, b):
                lib().gemm(c.device, a.data_ptr(), b.data_ptr(), out.data_ptr(), M, N, K, nk, raw_stream(c.device))
                return out

            return {"weave-cpp": (gemm, plain)}
        if op_name == "all_reduce":
            x0 = plain[0][0]
            n = x0.numel()
            if not c._c.all_reduce_local(n, _ops._COLL_DTYPES[x0.dtype], True):
                return {"weave-cpp": "this size's algorithm needs symmetric buffers (the op stages them)"}
            out = torch.empty_like(x0)

            def cpp(x):
                c._c.all_reduce(x.data_ptr(), out.data_ptr(), n, _ops._COLL_DTYPES[x.dtype], raw_stream(c.device))
                return out

            return {"weave-cpp": (cpp, plain)}
        a0, b0 = plain[0]
        K, N = int(a0.shape[1]), int(b0.shape[1])
        M = int(a0.shape[0]) * self.W
        gathered = self.weave.empty((M, K), a0.dtype)  # collective: every rank, same order
        C = torch.empty((M, N), dtype=a0.dtype, device=a0.device)
        kn = [(a, b.contiguous()) for a, b in plain]  # the C++ takes K x N (the op copies a .t() weight)

        def cpp(a, b):
            c._c.ag_gemm(a.data_ptr(), gathered.data_ptr(), b.data_ptr(), C.data_ptr(), M, N, K, raw_stream(c.device))
            return gathered, C

        def no_a(a, b):
            _, (out,) = self.weave.all_gather_matmul(a, [b], return_A=False)
            return None, out  # the check then has no gathered A to compare

        return {"weave-cpp": (cpp, kn), "weave-no-A": (no_a, plain)}

    def first_call(self):
        """The first call of a TP shape no earlier call had (tokens from the seed), then the next call;
        then the first calls of two more new shapes, a smaller one (the kernels loaded, the staging
        buffers large enough: what every new shape costs) and a larger one (the staging buffers grow
        too), so that the first call's excess over the next one is taken apart:
        process (module loads, first staging) = first - smaller's first; growth = larger's - smaller's."""
        from torch_tp import all_ranks
        from tp_common import slowest

        W = self.W
        odd = (9 + 2 * (self.seed % 8)) if self.quick else (41 + 2 * (self.seed % 25))
        T = W * 128 * odd  # odd: never a TOKENS
        cache = os.environ.get("WEAVE_TUNER_CACHE") or "default (~/.cache/weave/tuner.json)"
        mode = os.environ.get("WEAVE_TUNER") or "model"
        self.print(f"\nfirst call of a new shape (T = {T} tokens, then {T - 256 * W} and {T + 256 * W}; WEAVE_TUNER_CACHE "
                   f"{cache}, WEAVE_TUNER {mode}); includes weave's tuner choice (the cost model's pick, or a search "
                   "under WEAVE_TUNER=search), and staging growth if the shape is the largest so far")
        for kernel in ("ag_gemm", "gemm_rs"):
            for first_of, t in (("process", T), ("smaller shape", T - 256 * W), ("larger shape", T + 256 * W)):
                shape = ("up", t, t, FFN // W, HIDDEN) if kernel == "ag_gemm" else ("down", t, t, HIDDEN, FFN // W)
                case = self.tp_case(kernel, *shape)
                rows = []
                for impl, spec in case.impls.items():
                    if isinstance(spec, str):
                        self.print(f"  {kernel} {case.label} {impl}: skipped, {spec}")
                        continue
                    op, sets = spec
                    times, out, ok, worst = [], None, False, math.inf
                    try:
                        for _ in range(2):
                            torch.cuda.synchronize()
                            dist.barrier()
                            t0 = time.perf_counter()
                            out = op(*sets[0])
                            torch.cuda.synchronize()
                            times.append(slowest(1e6 * (time.perf_counter() - t0)))
                        ok, worst, _ = case.check(0, out)
                    except Exception as e:  # noqa: BLE001
                        times = [0.0, 0.0]
                        self.print(f"  {kernel} {impl}: {type(e).__name__}: {e}")
                    del out
                    row = dict(self.base_row(case, impl), kernel="first_call", op=kernel, first_of=first_of,
                               first_call_us=times[0], next_call_us=times[1], time_us=times[0], tuner_cache=cache)
                    row["correct"], row["check_worst"] = all_ranks(ok, worst)
                    rows.append(row)
                    self.print(f"  {kernel} {case.label} {impl}, first of the {first_of}: first call "
                               f"{times[0] / 1e3:.1f} ms, next call {times[1] / 1e3:.2f} ms; "
                               f"{'ok' if row['correct'] else 'WRONG'}")
                self.record(rows, case.label)
                del case
                torch.cuda.empty_cache()


def cpp_key(r):
    """What makes a weave-bench row and one of ours the same shape (None: not comparable)."""
    k = r.get("kernel")
    try:
        if k in ("all_reduce", "all_gather", "reduce_scatter"):
            return (k, r["dtype"], r["layout"], int(r["bytes"]), int(r["world"]))
        if k in ("ag_gemm", "gemm_rs"):
            return (k, int(r["M"]), int(r["N"]), int(r["K"]), int(r["world"]))
        if k == "gemm":
            return (k, int(r["M"]), int(r["N"]), int(r["K"]), r.get("layout"))
        if k == "attention":
            return (k, int(r["B"]), int(r["S"]), int(r["H"]), int(r.get("H_kv", r["H"])), int(r["D"]),
                    bool(r["causal"]))
    except (KeyError, TypeError, ValueError):
        return None
    return None


def main(argv=None):
    args = parse_args(argv)
    from tp_common import init_weave, start

    setup = start(PROG)
    from torch_tp import run_seed

    weave = init_weave(PROG, args.heap_gib)
    torch.backends.cuda.matmul.allow_tf32 = False  # the references are float32 throughout
    seed = run_seed(setup.rank)
    b = Bench(args, setup, seed, weave)
    b.print(f"{PROG}: {setup.world} rank(s), {setup.backend}, {torch.cuda.get_device_name()}, torch {torch.__version__}"
            f", sections {', '.join(args.sections)}{' (quick sizes)' if b.quick else ''}")
    if setup.shared:
        b.print("ranks share a GPU (WEAVE_SHARE_GPUS=1, gloo): every row is checked, the times mean nothing")
    b.print("| kernel | impl | shape | time_us | rate | torch / weave | vs C++ | check (worst / bound) |\n"
            "|---|---|---|---|---|---|---|---|")
    b.run_sections()
    if b.lead:
        if b.wrong:
            print(f"{PROG}: {len(b.wrong)} incorrect row(s) (replay with WEAVE_TEST_SEED={seed}): "
                  + "; ".join(b.wrong),
                  file=sys.stderr, flush=True)
        else:
            print("every row checked is correct on every rank", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 1 if b.wrong else 0


if __name__ == "__main__":
    sys.exit(main())
