#!/usr/bin/env python3
"""Plots `weave-bench collectives --json` output: one PNG per collective (and world size), bus GB/s
against bytes per rank, weave (solid) and NCCL (dashed) per layout, with the NVLink ceiling that
`weave-bench primitives --json` measured (the best TMA store rate to a peer) as a horizontal line.

    python3 bench/plot.py collectives.json [primitives.json ...] --out DIR [--ceiling GBS]

Every file is read as JSON lines; collective rows and primitive rows may share a file. When the
same point appears more than once (the bench appends to its --json file), the last one wins.
Weave points whose result did not match NCCL are marked with a red x.
"""
import argparse
import json
import os
import sys
from collections import defaultdict

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
TITLES = {
    "all_reduce": "all_reduce (busbw = algbw x 2(W-1)/W)",
    "all_gather": "all_gather (busbw = algbw x (W-1)/W, algbw of the gathered size)",
    "reduce_scatter": "reduce_scatter (busbw = algbw x (W-1)/W, algbw of the full input)",
    "all_to_all": "Ulysses all_to_all (busbw = algbw x (W-1)/W)",
}


def read_rows(paths):
    rows = []
    for path in paths:
        with open(path) as f:
            for n, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    sys.exit(f"plot.py: {path}:{n}: not JSON ({e})")
    return rows


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
        sys.exit("plot.py: no collective rows (kernel all_reduce/all_gather/reduce_scatter/all_to_all) in the input")

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
        ax.set_xticks(ticks)
        ax.set_xticklabels([size_label(b) for b in ticks])
        ax.minorticks_off()
        ax.set_xlabel("bytes per rank (input)")
        ax.set_ylabel("bus bandwidth, GB/s")
        ax.set_ylim(bottom=0)
        dtypes = sorted({r.get("dtype", "?") for r in rs})
        ax.set_title(f"{TITLES[kernel]}\n{world} ranks, {', '.join(dtypes)}", fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="best")
        fig.tight_layout()
        name = kernel if len(worlds) == 1 else f"{kernel}_w{world}"
        path = os.path.join(out_dir, name + ".png")
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    return written


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", nargs="+", help="JSON-lines files from weave-bench collectives (and primitives)")
    ap.add_argument("--out", default="bench/plots", help="output directory (default bench/plots)")
    ap.add_argument("--ceiling", type=float, help="NVLink ceiling in GB/s, instead of the primitives rows")
    args = ap.parse_args()
    rows = read_rows(args.json)
    ceiling = args.ceiling if args.ceiling else ceiling_of(rows)
    if ceiling is None:
        print("plot.py: no tma_store rows (weave-bench primitives --json) and no --ceiling: plotting without "
              "the NVLink line", file=sys.stderr)
    for path in plot(rows, args.out, ceiling):
        print(path)


if __name__ == "__main__":
    main()
