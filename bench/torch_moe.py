#!/usr/bin/env python3
"""torch._grouped_mm baseline for `weave-bench moe` (the grouped GEMM alone), merged into the same
JSON-lines file.

Times torch._grouped_mm(x, w.transpose(-2, -1), offs=cumsum(counts) as int32) on one GPU for the
rows weave-bench moe runs: DeepSeek-like (H 7168, F 2048, 64 experts, top-8), Qwen-like (4096,
1536, 64, top-8), Mixtral-like (4096, 14336, 8, top-2); T in --tokens, rows = T * k; up (N = 2F,
K = H) and down (N = H, K = F) projections; W[e] stored N x K (nn.Linear), passed transposed as
a view (no copy). Appends one line per row with impl "torch_grouped_mm" (and "torch_dense", x of
all rows times one expert's weight: a dense GEMM of equal flops, unless --no-dense).

Routings are the counts weave-bench moe times, from the same generator (tools/weave-bench/moe.cu):
  balanced   rows / E per expert, the remainder on the first experts;
  dirichlet  shares from a symmetric Dirichlet(1): g_e = -log(u_e), u_e = ((splitmix64() >> 11) +
             0.5) / 2^53 with splitmix64 seeded by (routing_seed * 0x100000001B3) ^ (E << 40) ^
             (k << 32) ^ T; counts by largest remainder (ties to the lower expert), capped at T
             with the excess given to the experts in order;
  one        every row on expert 0.
Each row records routing_hash (FNV-1a 64 of the int32 counts) and max_count: equal hashes in the
weave and torch rows mean the same counts were timed.

Correctness, as weave-bench checks weave: three input sets (x and w) rotate between timed calls
(an output buffer the caching allocator hands back from an earlier call never held the answer to
the same inputs), and the last timed call's output is compared element by element with a float32
reference per expert (TF32 off) under |y - r| <= 2^-8 |r| + 2^-10 s, s = sqrt(sum_k x^2 w^2) (the
bound of check/gemm_ref.hpp). Any incorrect row makes the exit status 1 (after writing its rows);
a shape torch refuses is written "supported": false with the error. The seed is WEAVE_TEST_SEED
(decimal or 0x-hex) when set, else drawn; it is printed and recorded.

    python3 bench/torch_moe.py --json moe.jsonl [--models deepseek,qwen,mixtral] [--tokens 4096,16384]
                               [--proj up,down] [--routing balanced,dirichlet,one] [--routing-seed 1]
    python3 bench/torch_moe.py --report moe.jsonl      # weave / torch and weave / dense table
"""
import argparse
import json
import math
import os
import sys

MODELS = {"deepseek": (7168, 2048, 64, 8), "qwen": (4096, 1536, 64, 8), "mixtral": (4096, 14336, 8, 2)}
MASK64 = (1 << 64) - 1
BF16_ROUND = 1.0 / 256
GEMM_BOUND = (BF16_ROUND, BF16_ROUND / 4)  # (times |r|, times s): check::gemm_bound()
SETS = 3


class SplitMix:
    """splitmix64, bit for bit the generator of tools/weave-bench/moe.cu."""

    def __init__(self, state):
        self.s = state & MASK64

    def next(self):
        self.s = (self.s + 0x9E3779B97F4A7C15) & MASK64
        z = self.s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)

    def uniform(self):
        return (float(self.next() >> 11) + 0.5) * (1.0 / 9007199254740992.0)


def routing_state(seed, E, k, T):
    return ((seed * 0x100000001B3) & MASK64) ^ (E << 40) ^ (k << 32) ^ T


def make_counts(routing, T, k, E, seed):
    R = T * k
    if routing == "balanced":
        return [R // E + (1 if e < R % E else 0) for e in range(E)]
    if routing == "one":
        return [R] + [0] * (E - 1)
    if routing != "dirichlet":
        raise SystemExit(f"unknown routing {routing!r} (want balanced, dirichlet or one)")
    g = SplitMix(routing_state(seed, E, k, T))
    p = []
    total = 0.0
    for _ in range(E):
        v = -math.log(g.uniform())
        p.append(v)
        total += v
    c, frac = [], []
    for e in range(E):
        x = float(R) * (p[e] / total)
        f = math.floor(x)
        c.append(int(f))
        frac.append(x - f)
    order = sorted(range(E), key=lambda e: (-frac[e], e))
    for i in range(R - sum(c)):
        c[order[i % E]] += 1
    extra = 0
    for e in range(E):
        if c[e] > T:
            extra += c[e] - T
            c[e] = T
    for e in range(E):
        if extra <= 0:
            break
        add = min(extra, T - c[e])
        c[e] += add
        extra -= add
    return c


def counts_hash(c):
    h = 1469598103934665603
    for v in c:
        h ^= v & 0xFFFFFFFF
        h = (h * 1099511628211) & MASK64
    return f"{h:016x}"


def derive(base, *ids):
    """A seed that differs for every id tuple (splitmix64 over the combination)."""
    x = base & MASK64
    for i, v in enumerate(ids):
        x ^= ((v + 1) * 0x9E3779B97F4A7C15 + i * 0xC2B2AE3D27D4EB4F) & MASK64
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
        x ^= x >> 31
    return x & ((1 << 63) - 1)


def uniform(torch, shape, seed):
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    return torch.rand(*shape, generator=g, device="cuda", dtype=torch.float32).mul_(2).sub_(1).to(torch.bfloat16)


def worst_ratio(torch, x, w, counts, y, one_weight=False):
    """max |y - r| / bound over every element (inf for a non-finite mismatch); r, s in float32 per
    expert (or every row against w[0] when one_weight)."""
    worst = 0.0
    rel, scale = GEMM_BOUND
    groups = [(0, x.shape[0], 0)] if one_weight else []
    if not one_weight:
        off = 0
        for e, c in enumerate(counts):
            if c > 0:
                groups.append((off, c, e))
            off += c
    chunk = 8192
    for off, c, e in groups:
        we = w[e].float()
        we2 = we * we
        for a in range(off, off + c, chunk):
            b = min(off + c, a + chunk)
            xe = x[a:b].float()
            r = xe @ we.T
            s = torch.sqrt((xe * xe) @ we2.T)
            yv = y[a:b].float()
            bound = rel * r.abs() + scale * s
            fin = torch.isfinite(yv)
            if not bool(fin.all()):
                return math.inf
            q = ((yv - r).abs() / bound.clamp_min(1e-30)).max().item()
            worst = max(worst, q)
    return worst


def report(path):
    rows = [json.loads(l) for l in open(path) if l.strip()]
    rows = [r for r in rows if r.get("kernel") == "grouped_gemm"]
    key = lambda r: (r.get("model"), r.get("T"), r.get("proj"), r.get("routing"))
    by = {}
    for r in rows:
        by.setdefault(key(r), {})[r["impl"]] = r
    dense = {}
    for r in rows:
        if r["impl"] in ("weave_dense", "torch_dense"):
            dense[(r.get("model"), r.get("T"), r.get("proj"), r["impl"])] = r
    print(f"{'model':9} {'T':>6} {'proj':4} {'routing':10} {'weave us':>10} {'torch us':>10} {'weave TF':>9} "
          f"{'torch TF':>9} {'w/torch':>8} {'w/dense':>8} {'hash ok':>7}")
    ratios = []
    for k in sorted(by, key=lambda t: tuple(str(x) for x in t)):
        d = by[k]
        w, t = d.get("weave"), d.get("torch_grouped_mm")
        if not w:
            continue
        wd = dense.get((k[0], k[1], k[2], "weave_dense"))
        r_t = t["time_us"] / w["time_us"] if t and "time_us" in t else float("nan")
        r_d = wd["time_us"] / w["time_us"] if wd else float("nan")
        same = "-" if not t else ("yes" if t.get("routing_hash") == w.get("routing_hash") else "NO")
        if t and "time_us" in t:
            ratios.append(r_t)
        print(f"{k[0]:9} {k[1]:>6} {k[2]:4} {k[3]:10} {w['time_us']:10.1f} "
              f"{(t or {}).get('time_us', float('nan')):10.1f} {w['tflops']:9.1f} "
              f"{(t or {}).get('tflops', float('nan')):9.1f} {r_t:8.3f} {r_d:8.3f} {same:>7}")
    if ratios:
        print(f"geomean weave / torch._grouped_mm over {len(ratios)} rows: "
              f"{math.exp(sum(math.log(r) for r in ratios) / len(ratios)):.3f}; min {min(ratios):.3f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="append JSON lines here")
    ap.add_argument("--models", default="deepseek,qwen,mixtral")
    ap.add_argument("--tokens", default="4096,16384")
    ap.add_argument("--proj", default="up,down")
    ap.add_argument("--routing", default="balanced,dirichlet,one")
    ap.add_argument("--routing-seed", type=int, default=1)
    ap.add_argument("--target-ms", type=float, default=60.0)
    ap.add_argument("--no-dense", action="store_true")
    ap.add_argument("--list", action="store_true", help="print the rows and routing hashes (no GPU)")
    ap.add_argument("--report", metavar="FILE", help="print the weave / torch table of FILE and exit")
    a = ap.parse_args()
    if a.report:
        report(a.report)
        return 0
    cases = []
    for m in a.models.split(","):
        if m not in MODELS:
            raise SystemExit(f"unknown model {m!r}")
        for T in (int(t) for t in a.tokens.split(",")):
            for pj in a.proj.split(","):
                if pj not in ("up", "down"):
                    raise SystemExit(f"unknown --proj {pj!r}")
                cases.append((m, T, pj))
    routings = a.routing.split(",")

    def base_row(m, T, pj, impl, routing):
        H, F, E, k = MODELS[m]
        N, K = (2 * F, H) if pj == "up" else (H, F)
        return {"kernel": "grouped_gemm", "impl": impl, "model": m, "T": T, "H": H, "F": F, "E": E, "k": k,
                "world": 1, "routing": routing, "proj": pj, "N": N, "K": K, "rows": T * k, "layout": "nk"}

    if a.list:
        for m, T, pj in cases:
            H, F, E, k = MODELS[m]
            for r in routings:
                c = make_counts(r, T, k, E, a.routing_seed)
                row = base_row(m, T, pj, "torch_grouped_mm", r)
                row.update(routing_hash=counts_hash(c), max_count=max(c))
                print(json.dumps(row))
        return 0

    import torch
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from torch_timing import median_us

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    v = os.environ.get("WEAVE_TEST_SEED")
    seed = int(v, 0) if v else int.from_bytes(os.urandom(8), "little") & ((1 << 63) - 1)
    print(f"WEAVE_TEST_SEED={seed}" + (" (from the environment)" if v else " (set it to replay this run)"), flush=True)
    out = open(a.json, "a") if a.json else None
    wrong = []

    def emit(row):
        if out:
            out.write(json.dumps(row) + "\n")
            out.flush()

    print(f"{'model':9} {'T':>6} {'proj':4} {'routing':10} {'impl':16} {'time_us':>10} {'TFLOP/s':>9} {'worst':>9}")
    for ci, (m, T, pj) in enumerate(cases):
        H, F, E, k = MODELS[m]
        N, K = (2 * F, H) if pj == "up" else (H, F)
        R = T * k
        xs = [uniform(torch, (R, K), derive(seed, ci, 2 * i)) for i in range(SETS)]
        ws = [uniform(torch, (E, N, K), derive(seed, ci, 2 * i + 1)) for i in range(SETS)]
        flop = 2.0 * R * N * K
        iters = max(3, min(200, int(a.target_ms * 1e-3 / (flop / 600e12))))

        def timed(fn):
            state = {"i": 0, "y": None, "set": 0}

            def call():
                s = state["i"] % SETS
                state["i"] += 1
                state["set"] = s
                state["y"] = fn(s)

            t = median_us(call, iters, repeats=5, warmup=3)
            torch.cuda.synchronize()
            return t, state["y"], state["set"]

        if not a.no_dense:
            t, y, s = timed(lambda s: xs[s] @ ws[s][0].T)
            worst = worst_ratio(torch, xs[s], ws[s], None, y, one_weight=True)
            ok = worst <= 1.0
            print(f"{m:9} {T:6d} {pj:4} {'-':10} {'torch_dense':16} {t:10.1f} {flop / t * 1e-6:9.1f} {worst:9.3g}"
                  + ("" if ok else "  WRONG"), flush=True)
            row = base_row(m, T, pj, "torch_dense", "none")
            row.update(time_us=t, tflops=flop / t * 1e-6, correct=ok, seed=str(seed), torch=torch.__version__,
                       check_worst=worst if math.isfinite(worst) else "inf")
            emit(row)
            if not ok:
                wrong.append(f"torch_dense {m} T {T} {pj}")
            del y
        for routing in routings:
            counts = make_counts(routing, T, k, E, a.routing_seed)
            offs = torch.tensor(counts, dtype=torch.int64, device="cuda").cumsum(0).to(torch.int32)
            row = base_row(m, T, pj, "torch_grouped_mm", routing)
            row.update(routing_hash=counts_hash(counts), max_count=max(counts), seed=str(seed),
                       torch=torch.__version__)
            try:
                t, y, s = timed(lambda s: torch._grouped_mm(xs[s], ws[s].transpose(-2, -1), offs=offs))
            except RuntimeError as e:  # a routing torch refuses (e.g. empty groups) is listed, not failed
                print(f"{m:9} {T:6d} {pj:4} {routing:10} {'torch_grouped_mm':16} unsupported: {str(e)[:160]}")
                row.update(supported=False, reason=str(e)[:300])
                emit(row)
                continue
            worst = worst_ratio(torch, xs[s], ws[s], counts, y)
            ok = worst <= 1.0
            print(f"{m:9} {T:6d} {pj:4} {routing:10} {'torch_grouped_mm':16} {t:10.1f} {flop / t * 1e-6:9.1f} "
                  f"{worst:9.3g}" + ("" if ok else "  WRONG"), flush=True)
            row.update(time_us=t, tflops=flop / t * 1e-6, correct=ok,
                       check_worst=worst if math.isfinite(worst) else "inf")
            emit(row)
            if not ok:
                wrong.append(f"torch_grouped_mm {m} T {T} {pj} {routing}")
            del y
        del xs, ws
        torch.cuda.empty_cache()
    if wrong:
        print(f"torch_moe.py: {len(wrong)} incorrect row(s) (replay with WEAVE_TEST_SEED={seed}):", file=sys.stderr)
        for w in wrong:
            print("  " + w, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
