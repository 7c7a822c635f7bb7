#!/usr/bin/env python3
"""One training step (forward + backward) of a sequence-parallel tensor-parallel transformer block,
in three implementations, under `torchrun --nproc_per_node N`:

  torch    NCCL collectives + torch.matmul + SDPA (cuDNN, else flash)
  asynctp  torch's async TP: torch.ops.symm_mem.fused_all_gather_matmul / fused_matmul_reduce_scatter
  weave    weave.nn.ColumnParallelLinear / RowParallelLinear and weave's differentiable attention

The block (pre-LayerNorm, bf16, batch 1, no dropout): h = x + out(attention(qkv(LN1(x)))), then
y = h + down(gelu(up(LN2(h)))). x and y are this rank's S/W rows of the sequence (Megatron's
sequence parallelism): LayerNorms run on the shard, `up` is column parallel (all-gather of the rows
fused with the GEMM) and `down` row parallel (GEMM fused with the reduce-scatter of the rows).
The attention half has three layouts (--attn):

  heads    Megatron's: qkv column parallel, attention over this rank's heads on the whole
           sequence (torch SDPA / weave.attention), out row parallel
  ulysses  sequence parallel: qkv and out on this rank's rows with the whole (replicated) weights,
           attention across the ranks (torch: all_to_all + SDPA + all_to_all; weave.ulysses_attention)
  ring     as ulysses, rows in zigzag order (rank r holds chunks r and 2W-1-r of 2W); torch:
           all-gather of K/V + SDPA (torch has no differentiable ring attention), weave.ring_attention

The gradients of replicated weights (LayerNorms; qkv and out in the ulysses and ring layouts) are
summed over the ranks inside the step (the implementation's all-reduce). The step time is the
slowest rank's mean over --steps steps (CUDA events, after --warmup steps; inputs alternate
between two sets); tokens/s counts the whole sequence. --all runs the three implementations in one
process on the same weights and prints weave's speed-ups (issue 19's targets: >= 1.15x torch,
>= 1.05x asynctp at hidden 8192, ffn 28672, 32 heads, sequence 8192 and 16384). --check compares
each implementation's output and gradients (input and every weight, this rank's shards, every
rank) with the torch implementation's, element by element: |x - r| <= tol (2^-5 |r| + 2^-5 rms(r)).

    pip install --no-build-isolation .                      # at the root of the weave repository
    torchrun --nproc_per_node 2 examples/torch/tp_block.py --all --check
    WEAVE_SHARE_GPUS=1 torchrun --nproc_per_node 2 examples/torch/tp_block.py --all --check --hidden 1024 \\
        --ffn 4096 --heads 8 --seq 2048                     # one GPU for two ranks: checks only
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from tp_common import SDPA_BACKENDS, Coll, TorchTP, agree, fail, init_weave, sdpa, slowest, start, symm_mem_tp

PROG = "tp_block.py"
IMPLS = ("torch", "asynctp", "weave")
BF = torch.bfloat16
DEV = "cuda"
REL = ABS = 2.0 ** -5  # --check: |x - r| <= tol (REL |r| + ABS rms(r))


class NotReady(RuntimeError):
    """weave lacks something this script needs (said in the message)."""


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--impl", choices=IMPLS, default="weave", help="the implementation to run (default weave)")
    ap.add_argument("--all", action="store_true", help="run torch, asynctp and weave and print the ratios")
    ap.add_argument("--hidden", type=int, default=8192)
    ap.add_argument("--ffn", type=int, default=28672)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=None, help="key/value heads (GQA; default --heads)")
    ap.add_argument("--head-dim", type=int, default=128, help="64 or 128 (weave's attention)")
    ap.add_argument("--seq", default="8192", help="whole sequence lengths, comma-separated (e.g. 8192,16384)")
    ap.add_argument("--attn", choices=("ulysses", "ring", "heads"), default="ulysses")
    ap.add_argument("--weave-attention", choices=("weave", "torch"), default="weave",
                    help="the weave implementation's attention: weave's ops (their backward is unfused float32 "
                         "for now) or the torch implementation's (to time weave's linears alone)")
    ap.add_argument("--sdpa", default="cudnn,flash", help="SDPA backends of the torch attention, in order")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--check", action="store_true", help="compare output and gradients with the torch implementation")
    ap.add_argument("--tol", type=float, default=1.0, help="scales --check's bound")
    ap.add_argument("--json", default=None, help="append weave-bench-style JSON lines (kernel tp_block) to FILE")
    ap.add_argument("--heap-gib", type=float, default=8.0,
                    help="weave's symmetric heap per rank (WEAVE_HEAP_BYTES wins)")
    args = ap.parse_args(argv)
    if any(b not in SDPA_BACKENDS for b in args.sdpa.split(",")):
        ap.error(f"--sdpa {args.sdpa}: comma-separated names of {', '.join(SDPA_BACKENDS)}")
    args.kv_heads = args.kv_heads or args.heads
    args.seqs = [int(s) for s in args.seq.split(",") if s]
    return args


def validate(cfg, W):
    heads_split = W if cfg.attn in ("heads", "ulysses") else 1
    need = [(cfg.ffn % W == 0, f"--ffn {cfg.ffn} is not a multiple of {W} ranks"),
            (cfg.heads % cfg.kv_heads == 0, f"--heads {cfg.heads} is not a multiple of --kv-heads {cfg.kv_heads}"),
            (cfg.kv_heads % heads_split == 0, f"--kv-heads {cfg.kv_heads} do not divide among {W} ranks"),
            (cfg.head_dim in (64, 128), f"--head-dim {cfg.head_dim}: weave's attention takes 64 or 128")]
    rows = 2 * W if cfg.attn == "ring" else W
    need += [(S % rows == 0, f"--seq {S} is not a multiple of {rows} (--attn {cfg.attn}, {W} ranks)") for S in cfg.seqs]
    for ok, why in need:
        if not ok:
            fail(PROG, why)


# ---- seeded data: every rank makes the same whole tensors and takes its share

MASK63 = (1 << 63) - 1


def rand(shape, seed: int, *ids, scale: float = 1.0) -> torch.Tensor:
    """bf16 uniform in [-scale, scale) from (seed, ids) alone."""
    g = torch.Generator(device=DEV)
    g.manual_seed(int.from_bytes(hashlib.blake2b(repr((seed,) + ids).encode(), digest_size=8).digest(), "little")
                  & MASK63)
    return (torch.rand(*shape, generator=g, device=DEV) * 2 - 1).mul_(scale).to(BF)


# ---- the block

class _Collective(torch.autograd.Function):
    """fwd(x) in the forward, bwd(gradient) in the backward: a differentiable collective."""

    @staticmethod
    def forward(ctx, x, fwd, bwd):
        ctx.bwd = bwd
        return fwd(x)

    @staticmethod
    def backward(ctx, g):
        return ctx.bwd(g.contiguous()), None, None


def gather_rows(x, coll):
    """all_gather along dim 0; backward: reduce_scatter."""
    return _Collective.apply(x, coll.all_gather, coll.reduce_scatter)


def all_to_all(x, coll):
    """all_to_all_single (dim 0 in world equal blocks, block s to rank s); its own adjoint."""
    return _Collective.apply(x, coll.all_to_all, coll.all_to_all)


class _ColumnFn(torch.autograd.Function):
    """y = all_gather(x) @ w.t(); backward: dx = reduce_scatter(dy @ w), dw = dy.t() @ all_gather(x)."""

    @staticmethod
    def forward(ctx, x, w, tp):
        ag, y = tp.ag_mm(x, w.t())
        ctx.save_for_backward(ag, w)
        ctx.tp = tp
        return y

    @staticmethod
    def backward(ctx, dy):
        ag, w = ctx.saved_tensors
        dy = dy.contiguous()
        return ctx.tp.mm_rs(dy, w), dy.t() @ ag, None


class _RowFn(torch.autograd.Function):
    """y = reduce_scatter(x @ w.t()); backward: dx = all_gather(dy) @ w, dw = all_gather(dy).t() @ x."""

    @staticmethod
    def forward(ctx, x, w, tp):
        ctx.save_for_backward(x, w)
        ctx.tp = tp
        return tp.mm_rs(x, w.t())

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        ag, dx = ctx.tp.ag_mm(dy.contiguous(), w)
        return dx, ag.t() @ x, None


class TPLinear(nn.Module):
    """Megatron's column (weight out/W x in) or row (weight out x in/W) parallel linear with sequence
    parallelism, through the TP ops in tp_ref[0] (TorchTP or SymmMemTP: switched between runs)."""

    def __init__(self, kind, in_f, out_f, world, tp_ref):
        super().__init__()
        shape = (out_f // world, in_f) if kind == "column" else (out_f, in_f // world)
        self.weight = nn.Parameter(torch.empty(shape, device=DEV, dtype=BF))
        self.kind, self.tp_ref = kind, tp_ref

    def forward(self, x):
        return (_ColumnFn if self.kind == "column" else _RowFn).apply(x, self.weight, self.tp_ref[0])


def local_linear(in_f, out_f):
    return nn.Linear(in_f, out_f, bias=False, device=DEV, dtype=BF)


def lin(m, x):
    """m(x); the output alone where m returns (output, bias) as Megatron's linears do."""
    y = m(x)
    return y[0] if isinstance(y, tuple) else y


class Block(nn.Module):
    """The block on this rank's rows (S/W, hidden). linear(kind, in, out) makes the column and row
    parallel linears; attention(q, k, v) maps this rank's (L, H, D) to (L, H, D); all_reduce sums a
    tensor over the ranks (the replicated weights' gradients)."""

    def __init__(self, cfg, world, linear, attention, all_reduce):
        super().__init__()
        h, D = cfg.hidden, cfg.head_dim
        self.tp_heads = cfg.attn == "heads"
        split = world if self.tp_heads else 1
        self.hq, self.hkv, self.D = cfg.heads // split, cfg.kv_heads // split, D
        self.ln1 = nn.LayerNorm(h, device=DEV, dtype=BF)
        self.ln2 = nn.LayerNorm(h, device=DEV, dtype=BF)
        qkv = (cfg.heads + 2 * cfg.kv_heads) * D
        self.qkv = linear("column", h, qkv) if self.tp_heads else local_linear(h, qkv)
        self.out = linear("row", cfg.heads * D, h) if self.tp_heads else local_linear(cfg.heads * D, h)
        self.up = linear("column", h, cfg.ffn)
        self.down = linear("row", cfg.ffn, h)
        self.attention, self.all_reduce = attention, all_reduce
        self.replicated = [self.ln1.weight, self.ln1.bias, self.ln2.weight, self.ln2.bias]
        if not self.tp_heads:
            self.replicated += [self.qkv.weight, self.out.weight]

    def forward(self, x):
        qkv = lin(self.qkv, self.ln1(x))
        L, D = qkv.shape[0], self.D
        q, k, v = qkv.split([self.hq * D, self.hkv * D, self.hkv * D], dim=-1)
        o = self.attention(q.view(L, self.hq, D), k.view(L, self.hkv, D), v.view(L, self.hkv, D))
        h = x + lin(self.out, o.reshape(L, self.hq * D))
        return h + lin(self.down, F.gelu(lin(self.up, self.ln2(h)), approximate="tanh"))

    def sync_grads(self):
        grads = [p.grad for p in self.replicated]
        flat = self.all_reduce(torch.cat([g.reshape(-1) for g in grads]))
        off = 0
        for g in grads:
            g.copy_(flat[off:off + g.numel()].view_as(g))
            off += g.numel()


def load_weights(block, cfg, rank, W, seed):
    """The same whole weights (from seed) in every implementation; this rank's shard of each."""
    h, D, Hq, Hkv = cfg.hidden, cfg.head_dim, cfg.heads, cfg.kv_heads

    def full(name, out_f, in_f):
        return rand((out_f, in_f), seed, "weight", name, scale=1.0 / math.sqrt(in_f))

    def rows(w):
        return w.chunk(W, 0)[rank]

    def cols(w):
        return w.chunk(W, 1)[rank].contiguous()

    wq, wk, wv = full("q", Hq * D, h), full("k", Hkv * D, h), full("v", Hkv * D, h)
    heads = block.tp_heads
    want = {
        "qkv": torch.cat([rows(wq), rows(wk), rows(wv)]) if heads else torch.cat([wq, wk, wv]),
        "out": (cols if heads else (lambda w: w))(full("out", h, Hq * D)),
        "up": rows(full("up", cfg.ffn, h)),
        "down": cols(full("down", h, cfg.ffn)),
    }
    with torch.no_grad():
        for name, w in want.items():
            p = getattr(block, name).weight
            if tuple(p.shape) != tuple(w.shape):
                raise NotReady(f"{name}.weight has shape {tuple(p.shape)}, this script expects {tuple(w.shape)} "
                               "(Megatron's layout: column parallel out/W x in, row parallel out x in/W)")
            p.copy_(w)
        for name in ("ln1", "ln2"):
            ln = getattr(block, name)
            ln.weight.copy_(1 + rand((h,), seed, name, "w", scale=0.1))
            ln.bias.copy_(rand((h,), seed, name, "b", scale=0.1))


# ---- attention of each implementation: (L, H, D) views of this rank's q, k, v -> (L, Hq, D)

def torch_attention(cfg, setup, coll):
    W, rank = setup.world, setup.rank

    def heads(q, k, v):
        return sdpa(q[None], k[None], v[None], causal=True, backend=cfg.sdpa)[0]

    def ulysses(q, k, v):
        L, Hq, D = q.shape
        hq, hkv = Hq // W, k.shape[1] // W
        # (L, H, D) -> (W, L, H/W, D) by destination rank, q, k and v heads side by side.
        x = torch.cat([t.reshape(L, W, t.shape[1] // W, D) for t in (q, k, v)], dim=2).transpose(0, 1)
        y = all_to_all(x.reshape(W * L, hq + 2 * hkv, D), coll)  # (S, my heads, D), rows in order
        qs, ks, vs = y.split([hq, hkv, hkv], dim=1)
        o = sdpa(qs[None], ks[None], vs[None], causal=True, backend=cfg.sdpa)[0]
        back = all_to_all(o.contiguous(), coll)  # block g: my rows of head group g
        return back.view(W, L, hq, D).transpose(0, 1).reshape(L, Hq, D)

    def ring(q, k, v):  # all-gather K and V, then SDPA on this rank's two zigzag chunks
        L, _, D = q.shape
        Lc, Hkv = L // 2, k.shape[1]
        kv = gather_rows(torch.cat([k, v], dim=1).contiguous(), coll)  # rank-major: chunks r, 2W-1-r
        where = [2 * c if c < W else 2 * (2 * W - 1 - c) + 1 for c in range(2 * W)]  # chunk c's block
        kv = kv.view(2 * W, Lc, 2 * Hkv, D).index_select(0, torch.tensor(where, device=q.device))
        kf, vf = kv.view(2 * W * Lc, 2 * Hkv, D).split([Hkv, Hkv], dim=1)
        outs = []
        for i, c in enumerate((rank, 2 * W - 1 - rank)):
            end = (c + 1) * Lc
            outs.append(sdpa(q[i * Lc:(i + 1) * Lc][None], kf[:end][None], vf[:end][None], causal=True,
                             backend=cfg.sdpa, lower_right=True)[0])
        return torch.cat(outs)

    return {"heads": heads, "ulysses": ulysses, "ring": ring}[cfg.attn]


def weave_attention(cfg, weave):
    def run(name, fn, q, k, v):
        q, k, v = (t.contiguous()[None] for t in (q, k, v))
        o = fn(q, k, v)
        o = o[0] if isinstance(o, tuple) else o
        if torch.is_grad_enabled() and q.requires_grad and not o.requires_grad:
            raise NotReady(f"weave.{name} has no autograd yet (its backward is not registered in this build)")
        return o[0]

    fns = {
        "heads": ("attention", lambda q, k, v: weave.attention(q, k, v, causal=True)),
        "ulysses": ("ulysses_attention", lambda q, k, v: weave.ulysses_attention(q, k, v, causal=True)),
        "ring": ("ring_attention", lambda q, k, v: weave.ring_attention(q, k, v, causal=True, sharding="zigzag")),
    }
    name, fn = fns[cfg.attn]
    return lambda q, k, v: run(name, fn, q, k, v)


def weave_linear(setup):
    try:
        import weave.nn as wnn
        cls = {"column": wnn.ColumnParallelLinear, "row": wnn.RowParallelLinear}
    except (ImportError, AttributeError) as e:
        raise NotReady(f"weave.nn.ColumnParallelLinear / RowParallelLinear are not importable ({e}); the weave "
                       "implementation needs them (python/weave/nn.py). Run --impl torch or --impl asynctp meanwhile")
    return lambda kind, in_f, out_f: cls[kind](in_f, out_f, bias=False, group=setup.group, dtype=BF).to(DEV)


# ---- steps, timing, checks

def make_step(block, xs, dy):
    params = list(block.parameters())

    def step(i):
        x = xs[i % len(xs)]
        x.grad = None
        for p in params:
            p.grad = None
        y = block(x)
        y.backward(dy)
        block.sync_grads()
        return x, y

    return step


def time_steps(step, steps, warmup):
    """The slowest rank's mean step time (ms) over `steps` back-to-back steps after `warmup`."""
    for i in range(warmup):
        step(i)
    torch.cuda.synchronize()
    dist.barrier()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for i in range(steps):
        step(i)
    b.record()
    b.synchronize()
    return slowest(a.elapsed_time(b) / steps)


def snapshot(block, x, y):
    out = {"y": y.detach().clone(), "x.grad": x.grad.clone()}
    out.update({f"{n}.grad": p.grad.clone() for n, p in block.named_parameters() if p.grad is not None})
    return out


def compare(ref, got, tol):
    """{name: worst |x - r| / bound over every rank} (inf: missing, wrong shape or non-finite)."""
    worst = {}
    for name, r in ref.items():
        x = got.get(name)
        if x is None or x.shape != r.shape:
            worst[name] = math.inf
            continue
        r32, x32 = r.float(), x.float()
        bound = (r32.abs() * REL).add_(ABS * r32.square().mean().sqrt()).mul_(tol)
        ratio = (x32 - r32).abs_().div_(bound)
        ratio = torch.where(x32 == r32, torch.zeros_like(ratio), ratio)
        worst[name] = ratio.nan_to_num(nan=math.inf).max().item() if torch.isfinite(x32).all() else math.inf
    names = sorted(worst)
    t = torch.tensor([worst[n] for n in names], dtype=torch.float64, device=DEV)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return dict(zip(names, t.tolist()))


def model_flops(cfg, S):
    """Forward FLOPs of the whole block: the GEMMs and causal attention."""
    h, D = cfg.hidden, cfg.head_dim
    gemm = 2.0 * S * h * ((cfg.heads + 2 * cfg.kv_heads) * D + cfg.heads * D + 2 * cfg.ffn)
    return gemm + 2.0 * S * S * cfg.heads * D  # causal: half of 4 S^2 H D


def build(impl, cfg, setup, coll, tp_ref, weave):
    if impl == "weave":
        attention = weave_attention(cfg, weave) if cfg.weave_attention == "weave" else torch_attention(cfg, setup, coll)
        return Block(cfg, setup.world, weave_linear(setup), attention, weave.all_reduce)
    linear = lambda kind, in_f, out_f: TPLinear(kind, in_f, out_f, setup.world, tp_ref)  # noqa: E731
    return Block(cfg, setup.world, linear, torch_attention(cfg, setup, coll), coll.all_reduce)


def run(cfg, setup):
    impls = list(IMPLS) if cfg.all else [cfg.impl]
    if cfg.check and "torch" not in impls:
        impls.insert(0, "torch")  # the reference
    rank, W = setup.rank, setup.world
    lead = rank == 0
    v = os.environ.get("WEAVE_TEST_SEED")
    seed = int(v, 0) if v else random.SystemRandom().getrandbits(62)
    t = torch.tensor([seed], dtype=torch.int64, device=DEV)
    dist.broadcast(t, 0)
    seed = int(t.item())
    weave = init_weave(PROG, cfg.heap_gib) if "weave" in impls else None
    coll = Coll(setup)
    torch_tp = TorchTP(coll)
    symm, why = symm_mem_tp(setup) if "asynctp" in impls else (None, "")
    if symm is None and "asynctp" in impls:
        if not cfg.all:
            fail(PROG, f"--impl asynctp: {why}")
        impls.remove("asynctp")
        if lead:
            print(f"asynctp: skipped, {why}", flush=True)
    tp_ref = [torch_tp]
    blocks = {}
    for impl in impls:
        key = "weave" if impl == "weave" else "torch"
        if key not in blocks:
            blocks[key] = build(impl, cfg, setup, coll, tp_ref, weave)
            load_weights(blocks[key], cfg, rank, W, seed)
    if lead:
        print(f"{PROG}: {W} rank(s), {setup.backend}, {torch.cuda.get_device_name()}, hidden {cfg.hidden}, ffn "
              f"{cfg.ffn}, heads {cfg.heads}/{cfg.kv_heads} x {cfg.head_dim}, attention {cfg.attn}, bf16, "
              f"WEAVE_TEST_SEED={seed}", flush=True)
        if setup.shared:
            print("ranks share a GPU (WEAVE_SHARE_GPUS=1, gloo): the checks hold, the times mean nothing", flush=True)
    all_ok, rows = True, []
    for S in cfg.seqs:
        L = S // W
        xs = [rand((L, cfg.hidden), seed, "x", S, i, rank).requires_grad_() for i in range(2)]
        dy = rand((L, cfg.hidden), seed, "dy", S, rank)
        ref, times = None, {}
        for impl in impls:
            block = blocks["weave" if impl == "weave" else "torch"]
            tp_ref[0] = symm if impl == "asynctp" else torch_tp
            step = make_step(block, xs, dy)
            row = dict(kernel="tp_block", impl=impl, S=S, hidden=cfg.hidden, ffn=cfg.ffn, heads=cfg.heads,
                       kv_heads=cfg.kv_heads, head_dim=cfg.head_dim, attn=cfg.attn, world=W, steps=cfg.steps,
                       attention_ops=cfg.weave_attention if impl == "weave" else "torch",
                       seed=str(seed), shared=setup.shared)
            if cfg.check:
                got = snapshot(block, *step(0))
                if impl == "torch":
                    ref = got
                else:
                    worst = compare(ref, got, cfg.tol)
                    ok = all(w <= 1.0 for w in worst.values())
                    all_ok = all_ok and ok
                    row.update(correct=ok, check_worst=max(worst.values()), checked_against="torch")
                    if lead:
                        bad = [f"{n} {w:.3g}" for n, w in worst.items() if w > 1.0]
                        print(f"check S={S} {impl} vs torch: worst {max(worst.values()):.3g} of the bound "
                              f"({len(worst)} tensors)" + ("; OVER: " + ", ".join(bad) if bad else ""), flush=True)
                del got
            ms = time_steps(step, cfg.steps, cfg.warmup)
            times[impl] = ms
            tflops = 3 * model_flops(cfg, S) / (ms * 1e-3) / W / 1e12
            row.update(time_us=ms * 1e3, tokens_per_s=S / (ms * 1e-3), tflops_per_gpu=tflops)
            rows.append(row)
            if lead:
                print(f"S={S:<6} {impl:8} step {ms:9.2f} ms  {S / (ms * 1e-3):12,.0f} tokens/s  "
                      f"{tflops:6.0f} TFLOP/s per GPU (3x forward FLOPs)", flush=True)
        if lead and "weave" in times:
            for base, target in (("torch", 1.15), ("asynctp", 1.05)):
                if base in times:
                    r = times[base] / times["weave"]
                    print(f"S={S:<6} weave vs {base}: {r:.3f}x (target >= {target}){'' if r >= target else '  BELOW'}",
                          flush=True)
        del xs, dy, ref
        torch.cuda.empty_cache()
    if lead and cfg.json:
        with open(cfg.json, "a") as fh:
            for row in rows:
                fh.write(json.dumps(row) + "\n")
    if lead and cfg.check:
        print("every checked output and gradient within the bound on every rank" if all_ok
              else f"SOME CHECKS FAILED (replay with WEAVE_TEST_SEED={seed})", flush=True)
    return all_ok


def main(argv=None):
    cfg = parse_args(argv)
    setup = start(PROG)
    validate(cfg, setup.world)
    try:
        ok = run(cfg, setup)
    except NotReady as e:
        fail(PROG, str(e))
    ok = agree(ok)
    dist.barrier()
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
