#!/usr/bin/env python3
"""torch symm_mem async-TP baselines for `weave-bench tp`, merged into the same JSON-lines file.

Times torch.ops.symm_mem.fused_all_gather_matmul (AG+GEMM, local GEMM S x S/W x S after
gathering A) and torch.ops.symm_mem.fused_matmul_reduce_scatter (GEMM+RS, local GEMM
S x S x S/W) for the sizes weave-bench uses. Run on the GPU machine:

    torchrun --nproc_per_node 2 bench/torch_tp.py --json tp.jsonl [--sizes 2048,4096,8192,16384,32768]

Rank 0 appends one line per (kernel, S) with impl "torch-symm-mem"; the slowest rank's time counts.
Correctness is checked against all_gather + matmul (and matmul + reduce_scatter) in torch.
NVLink multicast stays off (TORCH_SYMM_MEM_DISABLE_MULTICAST is set where missing, never unset).
"""
import argparse
import json
import os
import time

os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed._symmetric_memory as symm_mem  # noqa: E402
from torch_timing import median_us  # noqa: E402


def slowest_us(fn):
    """The slowest rank's median time (us), sampled as weave-bench tp's timed_turns does: from the
    slowest rank's first call, ~100 ms of warm-up calls then ~50 ms of timed calls per sample (the
    power cap's steady state), 6 samples."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    first = torch.tensor([1e6 * (time.perf_counter() - t0)], device="cuda")
    dist.all_reduce(first, op=dist.ReduceOp.MAX)
    first = max(first.item(), 1.0)
    iters = int(min(max(50e3 / first, 1), 1000))
    warm = int(min(max(100e3 / first, 1), 2000))
    t = torch.tensor([median_us(fn, iters, repeats=6, warmup=0, before_repeat=dist.barrier, warm_each=warm)],
                     device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def rel_err(x, ref):
    x, ref = x.float(), ref.float()
    if not torch.isfinite(x).all():
        return float("nan")
    return ((x - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--sizes", default="2048,4096,8192,16384,32768")
    args = ap.parse_args()
    dist.init_process_group("nccl")
    rank, W = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    group = dist.group.WORLD
    gname = group.group_name
    symm_mem.enable_symm_mem_for_group(gname)
    rows = []
    torch.manual_seed(1234 + rank)
    for S in [int(s) for s in args.sizes.split(",") if s]:
        # AG+GEMM: A shard (S/W x S), B (S x S/W).
        M, N, K = S, S // W, S
        a_sh = torch.rand(M // W, K, device="cuda", dtype=torch.bfloat16) * 2 - 1
        b = torch.rand(K, N, device="cuda", dtype=torch.bfloat16) * 2 - 1
        row = {"kernel": "ag_gemm", "impl": "torch-symm-mem", "S": S, "M": M, "N": N, "K": K, "world": W,
               "num_comm_sms": -1}
        try:
            f = lambda: torch.ops.symm_mem.fused_all_gather_matmul(a_sh, [b], gather_dim=0, group_name=gname)
            ag, outs = f()
            full = torch.empty(M, K, device="cuda", dtype=torch.bfloat16)
            dist.all_gather_into_tensor(full, a_sh)
            e = max(rel_err(ag, full), rel_err(outs[0], full @ b))
            row.update(time_us=slowest_us(f), correct=bool(e < 1e-2), rel_err=e)
        except Exception as ex:  # report, keep going
            row.update(time_us=float("nan"), correct=False, error=f"{type(ex).__name__}: {str(ex)[:200]}")
        rows.append(row)
        # GEMM+RS: A (S x S/W), B (S/W x S).
        M, N, K = S, S, S // W
        a = torch.rand(M, K, device="cuda", dtype=torch.bfloat16) * 2 - 1
        b2 = torch.rand(K, N, device="cuda", dtype=torch.bfloat16) * 2 - 1
        row = {"kernel": "gemm_rs", "impl": "torch-symm-mem", "S": S, "M": M, "N": N, "K": K, "world": W,
               "num_comm_sms": -1}
        try:
            f = lambda: torch.ops.symm_mem.fused_matmul_reduce_scatter(a, b2, "sum", scatter_dim=0, group_name=gname)
            out = f()
            ref = torch.empty(M // W, N, device="cuda", dtype=torch.bfloat16)
            dist.reduce_scatter_tensor(ref, a @ b2)
            e = rel_err(out, ref)
            row.update(time_us=slowest_us(f), correct=bool(e < 1e-2), rel_err=e)
        except Exception as ex:
            row.update(time_us=float("nan"), correct=False, error=f"{type(ex).__name__}: {str(ex)[:200]}")
        rows.append(row)
        torch.cuda.empty_cache()
    if rank == 0:
        for r in rows:
            r["tflops"] = 2.0 * r["M"] * r["N"] * r["K"] / (r["time_us"] * 1e-6) / 1e12 if r["time_us"] == r["time_us"] else 0.0
            print(f"| {r['kernel']} | torch-symm-mem | {r['S']} | {r['M']}x{r['N']}x{r['K']} | "
                  f"{r['time_us']:.1f} us | {r['tflops']:.0f} TFLOP/s | {'ok' if r['correct'] else 'WRONG ' + r.get('error', '')} |",
                  flush=True)
        if args.json:
            with open(args.json, "a") as fh:
                for r in rows:
                    fh.write(json.dumps(r) + "\n")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
