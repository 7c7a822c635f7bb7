#!/usr/bin/env python3
"""Plots `weave-bench collectives --json` output: one PNG per collective (and world size), bus GB/s
against bytes per rank, weave (solid) and NCCL (dashed) per layout, with the NVLink ceiling that
`weave-bench primitives --json` measured (the best TMA store rate to a peer) as a horizontal line.
Rows of `weave-bench tp --sweep` give tp_num_comm_sms.png: time against num_comm_sms for each
(kernel, S), one line per push variant, with the tuner's pick and the GEMM alone as lines.

    python3 bench/plot.py collectives.json [primitives.json ...] --out DIR [--ceiling GBS]

Every file is read as JSON lines; collective rows and primitive rows may share a file. When the
same point appears more than once (the bench appends to its --json file), the last one wins.
Weave points whose result did not match NCCL are marked with a red x.
"""
import argparse
import os
import sys
from collections import defaultdict

from rows import read_rows

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
TITLES = {
    "all_reduce": "all_reduce (busbw = algbw x 2(W-1)/W)",
    "all_gather": "all_gather (busbw = algbw x (W-1)/W, algbw of the gathered size)",
    "reduce_scatter": "reduce_scatter (busbw = algbw x (W-1)/W, algbw of the full input)",
    "all_to_all": "Ulysses all_to_all (busbw = algbw x (W-1)/W)",
}


def ceiling_of(rows):
    """The NVLink ceiling: the best TMA store bandwidth to a peer in the primitives rows."""
    rates = [r["gbs"] for r in rows if r.get("kernel") == "tma_store" and "gbs" in r]
    return max(rates) if rates else None


def series_key(r, vary_dtype, vary_op):
    """Which line a row belongs to: layout, plus dtype and op when the data has several."""
    parts = [r.get("layout", "")]
    if vary_dtype:
        parts.append(r.get("dtype", ""))
    if vary_op and r.get("op"):
        parts.append(r["op"])
    return " ".join(p for p in parts if p)


def size_label(b):
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if b >= scale:
            v = b / scale
            return f"{v:.0f}{unit}" if abs(v - round(v)) < 0.05 else f"{v:.1f}{unit}"
    return f"{b}"


def label_axes(ax, ticks, tick_labels, xlabel, ylabel, title):
    ax.set_xticks(ticks)
    ax.set_xticklabels(tick_labels)
    ax.minorticks_off()
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    ax.set_title(title, fontsize=10)


def plot(rows, out_dir, ceiling):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # The last row per point wins: re-runs appended to one file replace earlier ones.
    latest = {}
    for r in rows:
        if r.get("kernel") not in COLLECTIVES or "busbw_gbs" not in r:
            continue
        key = (r["kernel"], r.get("world"), r.get("impl"), r.get("layout"), r.get("dtype"), r.get("op"), r["bytes"])
        latest[key] = r
    if not latest:
        return []

    by_plot = defaultdict(list)
    for (kernel, world, *_), r in latest.items():
        by_plot[(kernel, world)].append(r)
    worlds = {w for _, w in by_plot}
    os.makedirs(out_dir, exist_ok=True)
    written = []
    for (kernel, world), rs in sorted(by_plot.items(), key=lambda kv: (COLLECTIVES.index(kv[0][0]), kv[0][1] or 0)):
        vary_dtype = len({r.get("dtype") for r in rs}) > 1
        vary_op = len({r.get("op") for r in rs if r.get("op")}) > 1
        lines = defaultdict(lambda: defaultdict(list))  # series -> impl -> rows
        for r in rs:
            lines[series_key(r, vary_dtype, vary_op)][r.get("impl", "?")].append(r)
        fig, ax = plt.subplots(figsize=(8, 5))
        colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
        all_bytes = set()
        for i, (name, impls) in enumerate(sorted(lines.items())):
            color = colors[i % len(colors)]
            for impl, pts in sorted(impls.items(), key=lambda kv: kv[0] != "weave"):
                pts.sort(key=lambda r: r["bytes"])
                all_bytes.update(r["bytes"] for r in pts)
                ran = [r for r in pts if r.get("time_us", 0) > 0]  # a call that failed has no time
                weave = impl == "weave"
                ax.plot([r["bytes"] for r in ran], [r["busbw_gbs"] for r in ran], color=color,
                        linestyle="-" if weave else "--", marker="o" if weave else "s", markersize=4,
                        label=f"{impl} {name}".strip())
                bad = [(r["bytes"], r["busbw_gbs"]) for r in pts if r.get("correct") is False]
                if bad:
                    ax.scatter(*zip(*bad), color="red", marker="x", s=80, zorder=5,
                               label=f"{impl} {name}: differs from NCCL")
        if ceiling:
            ax.axhline(ceiling, color="black", linestyle=":", linewidth=1.2,
                       label=f"NVLink ceiling {ceiling:.0f} GB/s (TMA store to a peer)")
        ax.set_xscale("log", base=2)
        ticks = sorted(all_bytes)
        dtypes = sorted({r.get("dtype", "?") for r in rs})
        label_axes(ax, ticks, [size_label(b) for b in ticks], "bytes per rank (input)", "bus bandwidth, GB/s",
                   f"{TITLES[kernel]}\n{world} ranks, {', '.join(dtypes)}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="best")
        fig.tight_layout()
        name = kernel if len(worlds) == 1 else f"{kernel}_w{world}"
        path = os.path.join(out_dir, name + ".png")
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    return written


def plot_tp_sweep(rows, out_dir):
    """tp_num_comm_sms.png from the sweep rows of `weave-bench tp --sweep` (none: no file)."""
    sweep = {}
    ref = {}  # (kernel, S, impl) -> tuned "weave" row or "weave-gemm-alone"
    for r in rows:
        if r.get("kernel") not in ("ag_gemm", "gemm_ar") or r.get("time_us", 0) <= 0:
            continue
        if r.get("sweep"):
            sweep[(r["kernel"], r["S"], r.get("variant", 0), r["num_comm_sms"])] = r
        elif r.get("impl") in ("weave", "weave-gemm-alone"):
            ref[(r["kernel"], r["S"], r["impl"])] = r
    if not sweep:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(k, s) for k, s, _, _ in sweep}, key=lambda p: (p[0] != "ag_gemm", p[1]))
    ncol = min(2, len(panels))
    nrow = (len(panels) + ncol - 1) // ncol
    fig, axes = plt.subplots(nrow, ncol, figsize=(6 * ncol, 4 * nrow), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    names = {
        "ag_gemm": {0: "v0 TMA push (comm SMs)", 1: "v1 register push (comm SMs)",
                    2: "v2 TMA push, idle producer warps", 3: "v3 register push, producer warps of every block",
                    4: "v4 ... of every 2nd block", 5: "v5 ... of every 4th block", 6: "v6 ... of every 8th block",
                    7: "v7 copy-engine push, fused GEMM", 8: "v8 copy-engine push, GEMM per shard",
                    9: "v9 all_gather, then GEMM", 10: "v10 adaptive split (pushes)"},
        "gemm_ar": {0: "v0 inter-SM reduce (comm SMs)", 1: "v1 intra-SM reduce-add by the storers",
                    2: "v2 adaptive split (reductions)"},
        "gemm_rs": {0: "v0 owner first", 1: "v1 zero first", 2: "v2 inter-SM (comm SMs)", 3: "v3 one GEMM per owner",
                    4: "v4 copy engine", 5: "v5 chained owners, one kernel", 6: "v6 adaptive split (reductions)"},
    }
    for ax, (kernel, S) in zip(axes.flat, panels):
        for v in sorted({v for k, s, v, _ in sweep if (k, s) == (kernel, S)}):
            pts = sorted((n, r["time_us"]) for (k, s, vv, n), r in sweep.items() if (k, s, vv) == (kernel, S, v))
            label = names.get(kernel, {}).get(v, f"v{v}")
            ax.plot(*zip(*pts), marker="o" if len(pts) > 1 else "D", markersize=5, label=label)
        tuned = ref.get((kernel, S, "weave"))
        if tuned:
            ax.axhline(tuned["time_us"], color="green", linestyle="--", linewidth=1,
                       label=f"tuner: v{tuned.get('variant', 0)}, {tuned['num_comm_sms']} SMs")
        alone = ref.get((kernel, S, "weave-gemm-alone"))
        if alone:
            ax.axhline(alone["time_us"], color="black", linestyle=":", linewidth=1, label="GEMM alone")
        ax.set_xscale("symlog", linthresh=4)
        ticks = sorted({n for k, s, _, n in sweep if (k, s) == (kernel, S)})
        label_axes(ax, ticks, [str(t) for t in ticks], "num_comm_sms", "time, us (slowest rank)", f"{kernel}, S = {S}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "tp_num_comm_sms.png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return [path]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", nargs="+", help="JSON-lines files from weave-bench collectives (and primitives)")
    ap.add_argument("--out", default="bench/plots", help="output directory (default bench/plots)")
    ap.add_argument("--ceiling", type=float, help="NVLink ceiling in GB/s, instead of the primitives rows")
    args = ap.parse_args()
    rows = read_rows(args.json)
    ceiling = args.ceiling if args.ceiling else ceiling_of(rows)
    if ceiling is None and any(r.get("kernel") in COLLECTIVES for r in rows):
        print("plot.py: no tma_store rows (weave-bench primitives --json) and no --ceiling: plotting without "
              "the NVLink line", file=sys.stderr)
    written = plot(rows, args.out, ceiling) + plot_tp_sweep(rows, args.out)
    if not written:
        sys.exit("plot.py: no collective rows (all_reduce/all_gather/reduce_scatter/all_to_all) and no "
                 "`weave-bench tp --sweep` rows in the input")
    for path in written:
        print(path)


if __name__ == "__main__":
    main()
