#!/usr/bin/env python3
"""Summarises `weave-bench gemm` / `gemm_fp8` JSON lines: weave against the baseline in the same
files (cuBLASLt: impl `cublas` for bf16, `cublaslt` for fp8), per row the baseline's time over
weave's (above 1: weave faster), then the geometric mean overall and by kind of row, the rows
below a floor, and the lowest rows with the tile weave ran.

    python3 bench/gemm_report.py FILE... [--floor 0.95] [--lowest 12] [--by FIELD] [--stat min|median]
                                 [--dtype DTYPE]

A row's time is the best (`--stat min`, the default) or the median of the times that file set
holds for it (the bench appends; alternating runs give several). fp8 gradient rows' times hold
their transposes on both sides already (`transpose_us` is their share). Kinds: the pass (fwd, dgrad,
wgrad; the B layout where a row has none), ragged or not (a weight dimension off the 64-element
grid), and for forward rows the token band (1-16, 17-256, 257-2047, 2048 and more).

--by FIELD compares variants that the rows name in FIELD (`planner`, `variant`, or `tile` for
forced tiles): each variant's ratios over the shapes every variant ran, and per shape the ratio of
each variant to the first one seen. Exit status 1 when a row was incorrect (it is listed), 2 for
bad input.
"""
import argparse
import math
import signal
import statistics
import sys
from collections import defaultdict

from rows import read_rows

BASELINES = ("cublas", "cublaslt")


def shape_key(r):
    return (r.get("kernel", "gemm"), r["M"], r["N"], r["K"], r.get("layout", "nk"), r.get("a_layout", "mk"),
            r.get("dtype", "bf16"))


def kind_of(r):
    """(pass, ragged, band) of a weave or baseline row."""
    layout, a_layout = r.get("layout", "nk"), r.get("a_layout", "mk")
    p = r.get("pass") or ("wgrad" if a_layout == "km" else "fwd" if layout == "nk" else "dgrad")
    # The weight's two dimensions: N, K (forward, input gradient) or M, N (weight gradient).
    dims = (r["M"], r["N"]) if p == "wgrad" else (r["N"], r["K"])
    ragged = any(d % 64 for d in dims)
    band = ""
    if p == "fwd":
        m = r["M"]
        band = "1-16" if m <= 16 else "17-256" if m <= 256 else "257-2047" if m < 2048 else ">=2048"
    return p, ragged, band


def geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def collect(rows, by, stat):
    """{variant: {shape: (ratio, weave row)}} and the incorrect rows."""
    pick = min if stat == "min" else statistics.median
    base, weave, wrong = defaultdict(list), defaultdict(lambda: defaultdict(list)), []
    for r in rows:
        if "time_us" not in r or "impl" not in r:
            continue  # --list rows, unsupported rows
        if r.get("correct") is False:
            wrong.append(r)
        k = shape_key(r)
        if r["impl"] in BASELINES:
            base[k].append(r["time_us"])
        elif r["impl"] == "weave":
            weave[str(r.get(by, "")) if by else ""][k].append(r)
    out = {}
    for v, shapes in weave.items():
        out[v] = {}
        for k, rs in shapes.items():
            if base.get(k):
                out[v][k] = (pick(base[k]) / pick([r["time_us"] for r in rs]), rs[-1])
    return out, wrong


def describe(k, r):
    kernel, M, N, K, layout, a_layout, dtype = k
    name = f"{M}x{N}x{K} {'km-' if a_layout == 'km' else ''}{layout}"
    return f"{name:<24} {r.get('tile') or r.get('plan') or '-':<14}"


def report(ratios, floor, lowest, title):
    values = [x for x, _ in ratios.values()]
    print(f"{title}: {len(values)} rows, geomean {geomean(values):.3f}, {sum(x < floor for x in values)} below "
          f"{floor}, lowest {min(values):.3f}" if values else f"{title}: no rows with a baseline")
    if not values:
        return
    kinds = defaultdict(list)
    for x, r in ratios.values():
        kinds[(r.get("dtype", "bf16"),) + kind_of(r)].append(x)
    print(f"  {'dtype':<10} {'pass':<6} {'ragged':<7} {'tokens':<9} {'rows':>4} {'geomean':>8} {'lowest':>7}")
    for (dtype, p, ragged, band), xs in sorted(kinds.items()):
        print(f"  {dtype:<10} {p:<6} {'yes' if ragged else 'no':<7} {band:<9} {len(xs):>4} {geomean(xs):>8.3f} "
              f"{min(xs):>7.3f}")
    for k, (x, r) in sorted(ratios.items(), key=lambda kv: kv[1][0])[:lowest]:
        print(f"  {x:.3f}  {describe(k, r)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", nargs="+", help="JSON-lines files from weave-bench gemm or gemm_fp8")
    ap.add_argument("--floor", type=float, default=0.95, help="count the rows below this ratio (default 0.95)")
    ap.add_argument("--lowest", type=int, default=12, help="list this many of the lowest rows (default 12)")
    ap.add_argument("--by", help="a row field naming variants to compare (planner, variant, tile)")
    ap.add_argument("--stat", choices=("min", "median"), default="min", help="a row's time over repeats")
    ap.add_argument("--dtype", help="only the rows of this dtype (bf16, e4m3xe4m3, e5m2xe4m3, ...)")
    a = ap.parse_args()
    rows = [r for r in read_rows(a.json) if not a.dtype or r.get("dtype", "bf16") == a.dtype]
    variants, wrong = collect(rows, a.by, a.stat)
    if not variants:
        print("gemm_report.py: no weave rows in " + ", ".join(a.json), file=sys.stderr)
        return 2
    if not a.by:
        report(variants[""], a.floor, a.lowest, "weave / baseline")
    else:
        common = set.intersection(*(set(v) for v in variants.values()))
        names = list(variants)
        for v in names:
            report({k: variants[v][k] for k in common}, a.floor, 0, f"{a.by} = {v}")
        print(f"per shape, each {a.by} against '{names[0]}' (time ratio below 1: faster):")
        for k in sorted(common, key=lambda k: variants[names[0]][k][0]):
            first = variants[names[0]][k]
            cells = "  ".join(f"{variants[v][k][1].get('tile') or '-'} {first[0] / variants[v][k][0]:.3f}" for v in names[1:])
            print(f"  {first[0]:.3f}  {describe(k, first[1])} {cells}")
    if wrong:
        print(f"{len(wrong)} incorrect row(s):", file=sys.stderr)
        for r in wrong:
            print(f"  {r.get('impl')} {r['M']}x{r['N']}x{r['K']} {r.get('layout', '')} seed {r.get('seed')}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` ends the report quietly
    sys.exit(main())
