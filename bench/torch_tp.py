#!/usr/bin/env python3
"""torch symm_mem async-TP baselines for `weave-bench tp`, merged into the same JSON-lines file.

Times torch.ops.symm_mem.fused_all_gather_matmul (AG+GEMM, local GEMM S x S/W x S after
gathering A) and torch.ops.symm_mem.fused_matmul_reduce_scatter (GEMM+RS, local GEMM
S x S x S/W) for the sizes weave-bench uses. Run on the GPU machine:

    torchrun --nproc_per_node 2 bench/torch_tp.py --json tp.jsonl [--sizes 2048,4096,8192,16384,32768]

Rank 0 appends one line per (kernel, S) with impl "torch-symm-mem"; the slowest rank's time counts.

Correctness, as weave-bench tp checks its rows: the timed calls rotate over three input sets (no
call sees the inputs of the two calls before it, so an output buffer the caching allocator hands
back from an earlier call cannot hold the right answer), and the last timed call's output is
compared element by element, per 128 x 128 tile, with a float32 reference that every rank
computes itself from regenerated inputs (every rank's inputs derive from the seed, so no
collective is involved): |x - r| <= rel |r| + scale s with s = sqrt(sum_k a^2 b^2), the bounds of
check/gemm_ref.hpp (AG+GEMM: one bf16 rounding; GEMM+RS: W bf16 partials), and the gathered A bit
for bit. A row is correct only when it is on every rank; any incorrect row makes the exit status
1. The seed is WEAVE_TEST_SEED (decimal or 0x-hex) or drawn by rank 0, and printed. The ranks
regenerate each other's inputs with torch's CUDA generator, which gives the same numbers on GPUs
of the same model (a mixed machine would show up as failures, never as passes).
NVLink multicast stays off (TORCH_SYMM_MEM_DISABLE_MULTICAST is set where missing, never unset).
"""
import argparse
import json
import os
import random
import sys
import time

os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed._symmetric_memory as symm_mem  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch_timing import median_us  # noqa: E402

# check/gemm_ref.hpp's bounds: bf16 rounds to 8 significant bits (2^-8 relative per rounding).
BF16_ROUND = 1.0 / 256
GEMM_BOUND = (BF16_ROUND, BF16_ROUND / 4)  # (rel, scale): one final bf16 rounding


def partial_sum_bound(world):
    return (2 * BF16_ROUND, 4.0 * world * BF16_ROUND)  # a sum of `world` bf16-rounded partials


SETS = 3
MASK64 = (1 << 64) - 1


def derive(base, *ids):
    """A seed that differs for every id tuple (splitmix64 over the combination)."""
    x = base & MASK64
    for i, v in enumerate(ids):
        x ^= ((v + 1) * 0x9E3779B97F4A7C15 + i * 0xC2B2AE3D27D4EB4F) & MASK64
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
        x ^= x >> 31
    return x & ((1 << 63) - 1)  # torch seeds are signed 64-bit


def uniform(shape, seed):
    """bf16 uniform in [-1, 1) from `seed` alone: any rank regenerates any rank's tensor."""
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    return torch.rand(*shape, generator=g, device="cuda", dtype=torch.float32).mul_(2).sub_(1).to(torch.bfloat16)


def run_seed(rank):
    v = os.environ.get("WEAVE_TEST_SEED")
    seed = int(v, 0) if v else random.SystemRandom().getrandbits(63)
    t = torch.tensor([seed & ((1 << 63) - 1)], dtype=torch.int64, device="cuda")
    dist.broadcast(t, 0)  # rank 0's seed everywhere
    seed = int(t.item())
    if rank == 0:
        print(f"WEAVE_TEST_SEED={seed}" + (" (from the environment)" if v else " (set it to replay this run)"), flush=True)
    return seed


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


def fp32_ref(a_parts, b_parts):
    """r = sum_q a_q b_q and s = sqrt(sum_q (a_q^2)(b_q^2)) in float32 (no TF32)."""
    r = s2 = None
    for a, b in zip(a_parts, b_parts):
        af, bf = a.float(), b.float()
        pr, ps = af @ bf, af.square() @ bf.square()
        r = pr if r is None else r.add_(pr)
        s2 = ps if s2 is None else s2.add_(ps)
        del af, bf, pr, ps
    return r, s2.sqrt_()


def tile_check(x, r, s, bound, tile=128):
    """Worst |x - r| / (rel |r| + scale s) and a one-line report naming the worst tile."""
    rel, scale = bound
    x = x.float()
    err = (x - r).abs_()
    ratio = err.div_(r.abs().mul_(rel).add_(s, alpha=scale))
    ratio = torch.where((x == r) & torch.isfinite(x), torch.zeros_like(ratio), ratio)  # exact: no bound needed
    ratio = torch.where(torch.isfinite(x), ratio, torch.full_like(ratio, float("inf")))  # unwritten / non-finite
    ratio = torch.nan_to_num(ratio, nan=float("inf"))
    m, n = ratio.shape
    worst = ratio.max().item()
    flat = int(ratio.argmax().item())
    i, j = divmod(flat, n)
    mt, nt = -(-m // tile), -(-n // tile)
    tiles = F.pad(ratio, (0, nt * tile - n, 0, mt * tile - m)).view(mt, tile, nt, tile).amax(dim=(1, 3))
    bad = int((tiles > 1).sum().item())
    detail = (f"worst {worst:.4g} in tile ({i // tile}, {j // tile}) at ({i}, {j}): got {x[i, j].item():.6g}, "
              f"want {r[i, j].item():.6g}; {bad} of {mt * nt} tiles over the bound")
    return bad == 0, worst, detail


def all_ranks(ok, worst):
    """(every rank ok, worst over ranks)."""
    t = torch.tensor([0.0 if ok else 1.0, worst], dtype=torch.float64, device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t[0].item() == 0.0, t[1].item()


class Rotating:
    """Calls op on input set n mod SETS for the n-th call, keeping the last call's set and result."""

    def __init__(self, op, sets):
        self.op, self.sets, self.n, self.last = op, sets, 0, None

    def __call__(self):
        i = self.n % len(self.sets)
        self.n += 1
        self.last = (i, self.op(*self.sets[i]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--sizes", default="2048,4096,8192,16384,32768")
    args = ap.parse_args()
    dist.init_process_group("nccl")
    rank, W = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    torch.backends.cuda.matmul.allow_tf32 = False  # the reference is float32 throughout
    group = dist.group.WORLD
    gname = group.group_name
    symm_mem.enable_symm_mem_for_group(gname)
    seed = run_seed(rank)
    rows = []
    for S in [int(s) for s in args.sizes.split(",") if s]:
        # AG+GEMM: A shard (S/W x S), B (S x S/W, this rank's own).
        M, N, K = S, S // W, S
        row = {"kernel": "ag_gemm", "impl": "torch-symm-mem", "S": S, "M": M, "N": N, "K": K, "world": W,
               "num_comm_sms": -1, "seed": str(seed)}
        ok, worst = False, float("inf")
        try:
            ash = lambda i, q: uniform((M // W, K), derive(seed, S, 1, i, q, 0))  # noqa: E731
            sets = [(ash(i, rank), uniform((K, N), derive(seed, S, 1, i, rank, 1))) for i in range(SETS)]
            f = Rotating(lambda a, b: torch.ops.symm_mem.fused_all_gather_matmul(a, [b], gather_dim=0, group_name=gname),
                         sets)
            row["time_us"] = slowest_us(f)
            torch.cuda.synchronize()
            i, (ag, outs) = f.last
            full = torch.cat([ash(i, q) for q in range(W)])
            r, s = fp32_ref([full], [sets[i][1]])
            ok, worst, detail = tile_check(outs[0], r, s, GEMM_BOUND)
            if not torch.equal(ag, full):
                ok, worst, detail = False, float("inf"), detail + "; the gathered A differs"
            if not ok:
                print(f"rank {rank}: ag_gemm S={S}: {detail}", flush=True)
            del full, r, s, ag, outs, f, sets
        except Exception as ex:  # report, keep going
            row.update(time_us=float("nan"), error=f"{type(ex).__name__}: {str(ex)[:200]}")
        row["correct"], row["check_worst"] = all_ranks(ok, worst)
        rows.append(row)
        torch.cuda.empty_cache()
        # GEMM+RS: A (S x S/W), B (S/W x S); rank r's output is rows [r M/W, (r+1) M/W) of the sum.
        M, N, K = S, S, S // W
        row = {"kernel": "gemm_rs", "impl": "torch-symm-mem", "S": S, "M": M, "N": N, "K": K, "world": W,
               "num_comm_sms": -1, "seed": str(seed)}
        ok, worst = False, float("inf")
        try:
            a_of = lambda i, q: uniform((M, K), derive(seed, S, 2, i, q, 0))  # noqa: E731
            b_of = lambda i, q: uniform((K, N), derive(seed, S, 2, i, q, 1))  # noqa: E731
            sets = [(a_of(i, rank), b_of(i, rank)) for i in range(SETS)]
            f = Rotating(lambda a, b: torch.ops.symm_mem.fused_matmul_reduce_scatter(a, b, "sum", scatter_dim=0,
                                                                                    group_name=gname), sets)
            row["time_us"] = slowest_us(f)
            torch.cuda.synchronize()
            i, out = f.last
            lo, hi = rank * (M // W), (rank + 1) * (M // W)
            r, s = fp32_ref([a_of(i, q)[lo:hi] for q in range(W)], [b_of(i, q) for q in range(W)])
            ok, worst, detail = tile_check(out, r, s, partial_sum_bound(W))
            if not ok:
                print(f"rank {rank}: gemm_rs S={S}: {detail}", flush=True)
            del r, s, out, f, sets
        except Exception as ex:
            row.update(time_us=float("nan"), error=f"{type(ex).__name__}: {str(ex)[:200]}")
        row["correct"], row["check_worst"] = all_ranks(ok, worst)
        rows.append(row)
        torch.cuda.empty_cache()
    wrong = [r for r in rows if not r["correct"]]
    if rank == 0:
        for r in rows:
            r["tflops"] = 2.0 * r["M"] * r["N"] * r["K"] / (r["time_us"] * 1e-6) / 1e12 if r["time_us"] == r["time_us"] else 0.0
            print(f"| {r['kernel']} | torch-symm-mem | {r['S']} | {r['M']}x{r['N']}x{r['K']} | "
                  f"{r['time_us']:.1f} us | {r['tflops']:.0f} TFLOP/s | "
                  f"{'ok' if r['correct'] else 'WRONG ' + r.get('error', '')} {r['check_worst']:.3g} |", flush=True)
        if args.json:
            with open(args.json, "a") as fh:
                for r in rows:
                    out = dict(r)
                    if out["check_worst"] != out["check_worst"] or out["check_worst"] == float("inf"):
                        out["check_worst"] = str(out["check_worst"])  # JSON has no non-finite numbers
                    fh.write(json.dumps(out) + "\n")
        if wrong:
            print(f"torch_tp.py: {len(wrong)} incorrect row(s) (replay with WEAVE_TEST_SEED={seed}): " +
                  ", ".join(f"{r['kernel']} S={r['S']}" for r in wrong), file=sys.stderr, flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
