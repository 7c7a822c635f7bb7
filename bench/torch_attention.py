#!/usr/bin/env python3
"""cuDNN attention baseline for `weave-bench attention`, merged into the same JSON-lines file.

Times torch SDPA restricted to the cuDNN backend (torch.nn.attention.sdpa_kernel(
SDPBackend.CUDNN_ATTENTION)) on one GPU for the shapes weave-bench uses: B*S = --tokens,
H heads, D in --d, causal and not, bf16 Q/K/V in (B, S, H, D) passed as (B, H, S, D) views
(the layout weave takes; no copies). Appends one line per shape with impl "cudnn"; TFLOP/s
counts 4*B*S^2*H*D, halved for causal. Correctness: sampled query rows against float64.

    python3 bench/torch_attention.py --json attention.jsonl [--seqs 4096,8192,16384,32768]
    python3 bench/torch_attention.py --report attention.jsonl   # weave / cuDNN table
"""
import argparse
import json
import math

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from torch_timing import median_us


def check(q, k, v, out, causal, samples=4):
    """Max abs error of a few (b, h, row) outputs against float64. q, k, v, out: (B, S, H, D)."""
    B, S, H, D = q.shape
    g = torch.Generator().manual_seed(S + D)
    err = 0.0
    for t in range(samples):
        b = int(torch.randint(B, (1,), generator=g))
        h = int(torch.randint(H, (1,), generator=g))
        i = S - 1 if t == 0 else int(torch.randint(S, (1,), generator=g))
        n = i + 1 if causal else S
        qi = q[b, i, h].double()
        kk, vv = k[b, :n, h].double(), v[b, :n, h].double()
        p = torch.softmax((kk @ qi) / math.sqrt(D), dim=0)
        ref = p @ vv
        err = max(err, (out[b, i, h].double() - ref).abs().max().item())
    return err


def bench(args):
    dev = torch.device("cuda")
    name = torch.cuda.get_device_name(dev)
    print(f"cuDNN SDPA (torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}) on {name}")
    print(f"{'D':>4} {'S':>6} {'B':>3} {'causal':>7} {'time_us':>10} {'TFLOP/s':>9} {'err':>9}")
    rows = []
    for D in [int(x) for x in args.d.split(",")]:
        for S in [int(x) for x in args.seqs.split(",")]:
            B = max(1, args.tokens // S)
            H = args.heads
            q, k, v = (torch.empty(B, S, H, D, device=dev, dtype=torch.bfloat16).uniform_(-1, 1) for _ in range(3))
            qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))  # (B, H, S, D) views
            for causal in [int(x) for x in args.causal.split(",")]:
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    fn = lambda: torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=bool(causal))
                    out = fn().transpose(1, 2)
                    torch.cuda.synchronize()
                    err = check(q, k, v, out, causal)
                    flop = 4.0 * B * S * S * H * D / (2 if causal else 1)
                    iters = max(2, min(100, int(args.target_ms * 1e-3 / (flop / 550e12))))
                    t = median_us(fn, iters)
                tf = flop / t * 1e-6
                ok = math.isfinite(err) and err < 2e-2
                print(f"{D:>4} {S:>6} {B:>3} {causal:>7} {t:>10.1f} {tf:>9.1f} {err:>9.2e}{'' if ok else '  WRONG'}",
                      flush=True)
                rows.append(dict(kernel="attention", impl="cudnn", B=B, S=S, H=H, H_kv=H, D=D, causal=bool(causal),
                                 world=1, time_us=t, tflops=tf, o_max_err=err, correct=ok,
                                 torch=torch.__version__, cudnn=torch.backends.cudnn.version()))
            del q, k, v, qt, kt, vt
            torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")


def report(path):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    rows = [r for r in rows if r.get("kernel") == "attention"]
    cud = {(r["D"], r["S"], r["causal"]): r for r in rows if r["impl"] == "cudnn"}
    print(f"| D | S | B | causal | variant | weave TFLOP/s | cuDNN TFLOP/s | weave/cuDNN | correct |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if r["impl"] != "weave":
            continue
        c = cud.get((r["D"], r["S"], r["causal"]))
        ct = f"{c['tflops']:.1f}" if c else "-"
        ratio = f"{r['tflops'] / c['tflops']:.3f}" if c else "-"
        print(f"| {r['D']} | {r['S']} | {r['B']} | {int(r['causal'])} | {r.get('variant', '-')} | {r['tflops']:.1f} | "
              f"{ct} | {ratio} | {r['correct'] and (c['correct'] if c else True)} |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--report", default=None, help="print the weave/cuDNN table of a merged JSON file and exit")
    ap.add_argument("--seqs", default="4096,8192,16384,32768")
    ap.add_argument("--tokens", type=int, default=65536)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--d", default="128,64")
    ap.add_argument("--causal", default="0,1")
    ap.add_argument("--target-ms", type=float, default=40.0)
    args = ap.parse_args()
    if args.report:
        report(args.report)
    else:
        bench(args)


if __name__ == "__main__":
    main()
