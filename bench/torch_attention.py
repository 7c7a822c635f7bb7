#!/usr/bin/env python3
"""cuDNN attention baseline for `weave-bench attention`, merged into the same JSON-lines file.

Times torch SDPA restricted to the cuDNN backend (torch.nn.attention.sdpa_kernel(
SDPBackend.CUDNN_ATTENTION)) on one GPU for the shapes weave-bench uses: B*S = --tokens,
H heads, D in --d, causal and not, bf16 Q/K/V in (B, S, H, D) passed as (B, H, S, D) views
(the layout weave takes; no copies). Appends one line per shape with impl "cudnn"; TFLOP/s
counts 4*B*S^2*H*D, halved for causal.

Correctness, as weave-bench checks weave: two input sets (normal, Q and K scaled for a logit
spread of ~3, so the softmax is peaked) alternate from call to call, and the output of the last
timed call is checked against float64 (not SDPA) on sampled rows of every batch and head (the
first and last 64 and six more pieces of 64) with the per-element bound of
check/attention_ref.hpp: |x - r| <= 2^-8 |r| + 3 * 2^-8 * sqrt(sum_j p_j^2 v_j^2). Any wrong row
makes the script exit 1 (after writing its rows). The seed is WEAVE_TEST_SEED when set, else
drawn; it is printed and recorded.

    python3 bench/torch_attention.py --json attention.jsonl [--seqs 4096,8192,16384,32768]
    python3 bench/torch_attention.py --report attention.jsonl   # weave / cuDNN table
"""
import argparse
import json
import math
import os

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from torch_timing import median_us


# The checks the PyTorch baselines share (torch_sp.py and torch_ops.py import them).
BF16_ROUND = 1.0 / 256
O_BOUND = (BF16_ROUND, 3 * BF16_ROUND)  # (times |r|, times s): check::attention_o_bound()
LSE_BOUND = 1e-3  # absolute: check::attention_lse_bound()


def base_seed():
    """WEAVE_TEST_SEED (decimal or 0x-hex) when set, else a fresh one."""
    v = os.environ.get("WEAVE_TEST_SEED")
    return int(v, 0) if v else int.from_bytes(os.urandom(8), "little")


def sample_rows(L, seed, piece=64, extra=6):
    """Row indices to check: the first and last `piece` rows and `extra` more pieces at seeded
    places (every row when L is not longer than that)."""
    if L <= piece * (2 + extra):
        return list(range(L))
    g = torch.Generator().manual_seed(seed)
    rows = set(range(piece)) | set(range(L - piece, L))
    for _ in range(extra):
        a = piece + int(torch.randint(L - 2 * piece, (1,), generator=g))
        rows |= set(range(a, min(L, a + piece)))
    return sorted(rows)


def check_rows(q, kf, vf, out, lse, rows, row_pos, causal):
    """Worst |x - r| / bound of O (and of LSE when given) over local `rows` of every batch and head
    against float64 (1 = at the bound; inf for a non-finite output). q, out: local (B, L, H, D);
    kf, vf: the whole sequence (B, S, H, D); lse: (B, H, L) or None; row_pos[i] = global position
    of row i."""
    B, L, H, D = q.shape
    S = kf.shape[1]
    scale = 1.0 / math.sqrt(D)
    idx = torch.tensor(rows, device=q.device)
    pos = torch.tensor([row_pos[i] for i in rows], device=q.device)
    keys = torch.arange(S, device=q.device)
    o_worst = l_worst = 0.0
    inf = float("inf")
    for b in range(B):
        for h in range(H):
            s = (q[b, idx, h].double() @ kf[b, :, h].double().T) * scale
            if causal:
                s = s.masked_fill(keys[None, :] > pos[:, None], -inf)
            ref_l = torch.logsumexp(s, dim=1)
            p = torch.exp(s - ref_l[:, None])
            vv = vf[b, :, h].double()
            ref = p @ vv
            sc = torch.sqrt((p * p) @ (vv * vv))
            x = out[b, idx, h].double()
            diff = (x - ref).abs()
            ratio = torch.where(diff == 0, torch.zeros_like(diff), diff / (O_BOUND[0] * ref.abs() + O_BOUND[1] * sc))
            ratio = torch.where(torch.isfinite(x), ratio, torch.full_like(ratio, inf))
            o_worst = max(o_worst, ratio.max().item())
            if lse is not None:
                lx = lse[b, h, idx].double()
                lr = torch.where(torch.isfinite(lx), (lx - ref_l).abs() / LSE_BOUND, torch.full_like(lx, inf))
                l_worst = max(l_worst, lr.max().item())
    return o_worst, l_worst


def check(q, k, v, out, causal, rows):
    """Worst |x - r| / bound of O over `rows` of every batch and head (q, k, v, out: (B, S, H, D))."""
    return check_rows(q, k, v, out, None, rows, range(q.shape[1]), causal)[0]


def bench(args):
    dev = torch.device("cuda")
    name = torch.cuda.get_device_name(dev)
    seed = base_seed()
    print(f"cuDNN SDPA (torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}) on {name}, "
          f"WEAVE_TEST_SEED={seed}")
    print(f"{'D':>4} {'S':>6} {'B':>3} {'causal':>7} {'time_us':>10} {'TFLOP/s':>9} {'o_ratio':>8} {'rows':>6}")
    rows, all_ok = [], True
    for D in [int(x) for x in args.d.split(",")]:
        for S in [int(x) for x in args.seqs.split(",")]:
            B = max(1, args.tokens // S)
            H = args.heads
            g = torch.Generator(device=dev).manual_seed((seed + 1000003 * D + S) % 2**63)
            qk_std = math.sqrt(3.0)  # scale * q.k then has a standard deviation of 3 (default scale)
            sets = []
            for _ in range(2):
                q, k = (torch.randn(B, S, H, D, device=dev, generator=g).mul_(qk_std).bfloat16() for _ in range(2))
                v = torch.randn(B, S, H, D, device=dev, generator=g).bfloat16()
                sets.append((q, k, v))
            check_rows = sample_rows(S, (seed + S + D) % 2**63)
            for causal in [int(x) for x in args.causal.split(",")]:
                state = {"calls": 0, "last": None}

                def fn():
                    s = state["calls"] % 2
                    state["calls"] += 1
                    qt, kt, vt = (x.transpose(1, 2) for x in sets[s])  # (B, H, S, D) views
                    state["last"] = (s, torch.nn.functional.scaled_dot_product_attention(qt, kt, vt,
                                                                                         is_causal=bool(causal)))

                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    flop = 4.0 * B * S * S * H * D / (2 if causal else 1)
                    iters = max(2, min(100, int(args.target_ms * 1e-3 / (flop / 550e12))))
                    t = median_us(fn, iters)
                torch.cuda.synchronize()
                s, out = state["last"]
                ratio = check(*sets[s], out.transpose(1, 2), causal, check_rows)
                state["last"] = None
                tf = flop / t * 1e-6
                ok = ratio <= 1.0
                all_ok = all_ok and ok
                print(f"{D:>4} {S:>6} {B:>3} {causal:>7} {t:>10.1f} {tf:>9.1f} {ratio:>8.3f} {len(check_rows):>6}"
                      f"{'' if ok else '  WRONG'}", flush=True)
                rows.append(dict(kernel="attention", impl="cudnn", B=B, S=S, H=H, H_kv=H, D=D, causal=bool(causal),
                                 world=1, time_us=t, tflops=tf,
                                 check="last timed call, sampled rows (all batches, heads) vs float64",
                                 checked_rows=len(check_rows), o_err_ratio=ratio, seed=str(seed), correct=ok,
                                 torch=torch.__version__, cudnn=torch.backends.cudnn.version()))
            del sets
            torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    print("all results correct" if all_ok else "SOME RESULTS WRONG")
    return 0 if all_ok else 1


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
        return 0
    return bench(args)


if __name__ == "__main__":
    raise SystemExit(main())
