#!/usr/bin/env python3
"""Unfused sequence-parallel baselines for `weave-bench sp`, merged into the same JSON-lines file.

What a PyTorch user writes without weave, timed on the same shapes:
- ring attention ("ring_attention", impl "unfused"): per step, the K/V chunk moves to the next
  rank with NCCL send/recv (torch.distributed.batch_isend_irecv, which runs on NCCL's own stream
  and so overlaps the attention of the current chunk), cuDNN attention (with its log-sum-exp) on
  the current chunk, and an fp32 LSE merge. Zigzag sharding for causal (rank r holds chunks r and
  2W-1-r of 2W, the same split as weave::sp::chunk_range), contiguous otherwise.
- Ulysses ("ulysses", impl "unfused"): one NCCL all_to_all of the stacked Q/K/V (with the
  permute copies it needs), cuDNN SDPA on (B, S, H/W, D), all_to_all back (and its copies).

    torchrun --nproc_per_node 2 bench/torch_sp.py --json sp.jsonl [--seqs 8192,...,131072]
    python3 bench/torch_sp.py --report sp.jsonl     # weave / unfused table (after weave-bench sp)

Correctness, as weave-bench checks weave: two input sets (normal, Q and K scaled for a logit
spread of ~3, so the softmax is peaked) alternate from call to call, and the last timed call's
output is checked on every rank against float64 over the gathered sequence (not cuDNN): sampled
rows of every chunk of the rank (the first and last 64 and two more pieces of 64), every batch and
head, with the per-element bound of check/attention_ref.hpp (|x - r| <= 2^-8 |r| + 3 * 2^-8 *
sqrt(sum_j p_j^2 v_j^2)), and ring's LSE to 1e-3. A configuration is correct only if it is on
every rank; any wrong one makes the script exit 1 (after writing its rows). The seed is rank 0's
WEAVE_TEST_SEED when set, else drawn; printed and recorded. Times are the slowest rank's median. TFLOP/s counts
the useful FLOPs 4*B*S^2*H*D (halved for causal); `tflops` is the total over the W GPUs and
`tflops_per_gpu` = tflops / W. `--device cpu` runs the same algorithms with gloo and a float
reference attention (used to test this script on machines without a GPU).
"""
import argparse
import json
import math
import os

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # never multicast on the shared machines

try:
    import torch
    import torch.distributed as dist

    from torch_attention import check_rows, sample_rows
    from torch_timing import median_us
except ImportError:  # --report needs no torch
    torch = None


# ---- sharding (mirrors kernels/ring_attention/schedule: near-equal chunks, first S % n get +1)

def chunk_rows(S, n, c):
    base, extra = divmod(S, n)
    return base + (1 if c < extra else 0), c * base + min(c, extra)


def ring_chunks(S, W, rank, zigzag):
    """[(global begin, rows)] of the chunks rank holds, in storage order."""
    if zigzag:
        out = []
        for c in (rank, 2 * W - 1 - rank):
            rows, begin = chunk_rows(S, 2 * W, c)
            out.append((begin, rows))
        return out
    rows, begin = chunk_rows(S, W, rank)
    return [(begin, rows)]


# ---- one attention call with its log-sum-exp. q, k, v: (B, S, H, D); returns out (B, Sq, H, D)
# and lse (B, H, Sq) fp32 (natural log, scale included).

def attn_cudnn(q, k, v, causal):
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    res = torch.ops.aten._scaled_dot_product_cudnn_attention(qt, kt, vt, None, True, 0.0, causal, False)
    out, lse = res[0], res[1]
    B, H, Sq = qt.shape[0], qt.shape[1], qt.shape[2]
    return out.transpose(1, 2), lse.reshape(B, H, Sq).float()


def attn_flash(q, k, v, causal):
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    res = torch.ops.aten._scaled_dot_product_flash_attention(qt, kt, vt, 0.0, causal, False)
    B, H, Sq = qt.shape[0], qt.shape[1], qt.shape[2]
    return res[0].transpose(1, 2), res[1].reshape(B, H, Sq).float()


def attn_reference(q, k, v, causal):
    qt, kt, vt = (x.transpose(1, 2).float() for x in (q, k, v))
    s = qt @ kt.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        Sq, Sk = s.shape[-2], s.shape[-1]
        s = s.masked_fill(torch.ones(Sq, Sk, dtype=torch.bool).triu(1 + Sk - Sq), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    out = torch.softmax(s, dim=-1) @ vt
    return out.transpose(1, 2).to(q.dtype), lse


def sdpa(q, k, v, causal, use_cudnn):
    """The plain (no LSE) attention the Ulysses baseline uses: cuDNN SDPA on the GPU."""
    if not use_cudnn:
        return attn_reference(q, k, v, causal)[0]
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal).transpose(1, 2)


# ---- the unfused ring

def merge(out, lse, rows, out_p, lse_p):
    """out[:, rows] and lse[..., rows] <- the LSE-weighted combination with a partial result."""
    o, l = out[:, rows], lse[:, :, rows]
    new = torch.logaddexp(l, lse_p)
    wa = torch.exp(l - new).transpose(1, 2).unsqueeze(-1)
    wb = torch.exp(lse_p - new).transpose(1, 2).unsqueeze(-1)
    out[:, rows] = o * wa + out_p.float() * wb
    lse[:, :, rows] = new


def ring_forward(q, k, v, S, causal, zigzag, attn):
    rank, W = dist.get_rank(), dist.get_world_size()
    B, L, H, D = q.shape
    mine = ring_chunks(S, W, rank, zigzag)
    out = torch.empty(B, L, H, D, dtype=torch.float32, device=q.device)
    lse = torch.empty(B, H, L, dtype=torch.float32, device=q.device)
    k_cur, v_cur = k, v
    for step in range(W):
        src = (rank - step) % W
        reqs = []
        if step < W - 1:
            nxt = (rank - step - 1) % W  # whose chunk arrives for the next step
            n_rows = sum(r for _, r in ring_chunks(S, W, nxt, zigzag))
            k_next = torch.empty(B, n_rows, H, D, dtype=k.dtype, device=k.device)
            v_next = torch.empty_like(k_next)
            ops = [dist.P2POp(dist.isend, k_cur, (rank + 1) % W), dist.P2POp(dist.isend, v_cur, (rank + 1) % W),
                   dist.P2POp(dist.irecv, k_next, (rank - 1) % W), dist.P2POp(dist.irecv, v_next, (rank - 1) % W)]
            reqs = dist.batch_isend_irecv(ops)
        if step == 0:
            # The local chunks in storage order are in global order, so plain causal is exact.
            o_p, l_p = attn(q, k_cur, v_cur, causal)
            out.copy_(o_p.float())
            lse.copy_(l_p)
        elif not causal:
            o_p, l_p = attn(q, k_cur, v_cur, False)
            merge(out, lse, slice(0, L), o_p, l_p)
        elif zigzag:
            first = mine[0][1]
            if src < rank:  # both my chunks see src's first chunk fully, none of its second
                rows0 = ring_chunks(S, W, src, True)[0][1]
                o_p, l_p = attn(q, k_cur[:, :rows0], v_cur[:, :rows0], False)
                merge(out, lse, slice(0, L), o_p, l_p)
            else:  # only my second chunk sees src's chunks, both fully
                o_p, l_p = attn(q[:, first:], k_cur, v_cur, False)
                merge(out, lse, slice(first, L), o_p, l_p)
        elif src < rank:  # contiguous causal: earlier ranks fully visible, later ones not at all
            o_p, l_p = attn(q, k_cur, v_cur, False)
            merge(out, lse, slice(0, L), o_p, l_p)
        for r in reqs:
            r.wait()
        if step < W - 1:
            k_cur, v_cur = k_next, v_next
    return out.to(q.dtype), lse


# ---- the unfused Ulysses (S % W == 0, H % W == 0)

def ulysses_forward(q, k, v, causal, use_cudnn):
    W = dist.get_world_size()
    B, L, H, D = q.shape
    Hg = H // W
    # (B, L, H, D) x3 -> (W, 3, B, L, Hg, D): destination rank first, as all_to_all_single splits.
    qkv = torch.stack([x.view(B, L, W, Hg, D) for x in (q, k, v)]).permute(3, 0, 1, 2, 4, 5).contiguous()
    recv = torch.empty_like(qkv)
    dist.all_to_all_single(recv, qkv)
    # recv[s] = rank s's rows for my heads -> (3, B, S, Hg, D)
    full = recv.permute(1, 2, 0, 3, 4, 5).reshape(3, B, W * L, Hg, D)
    o = sdpa(full[0], full[1], full[2], causal, use_cudnn)  # (B, S, Hg, D)
    send = o.reshape(B, W, L, Hg, D).permute(1, 0, 2, 3, 4).contiguous()
    back = torch.empty_like(send)
    dist.all_to_all_single(back, send)
    # back[g] = head group g of my rows -> (B, L, H, D)
    return back.permute(1, 2, 0, 3, 4).reshape(B, L, H, D)


# ---- checks against float64 on the gathered sequence (check_rows, sample_rows: torch_attention.py)

def base_seed():
    """Rank 0's WEAVE_TEST_SEED (decimal or 0x-hex) when set, else drawn there; the same on every rank."""
    v = os.environ.get("WEAVE_TEST_SEED")
    mine = int(v, 0) if v else int.from_bytes(os.urandom(8), "little")
    t = torch.tensor([mine % 2**63], dtype=torch.int64, device=DEVICE)
    dist.broadcast(t, 0)
    return int(t.item())


def gather_seq(x, S, chunks_of):
    """The full (B, S, H, D) sequence from every rank's shard (chunks_of(rank) = [(begin, rows)])."""
    W = dist.get_world_size()
    sizes = [sum(r for _, r in chunks_of(s)) for s in range(W)]
    pad = torch.zeros(x.shape[0], max(sizes), *x.shape[2:], dtype=x.dtype, device=x.device)
    pad[:, :x.shape[1]] = x  # ragged shards: all_gather needs equal sizes
    parts = [torch.empty_like(pad) for _ in range(W)]
    dist.all_gather(parts, pad)
    full = torch.empty(x.shape[0], S, *x.shape[2:], dtype=x.dtype, device=x.device)
    for s in range(W):
        off = 0
        for begin, rows in chunks_of(s):
            full[:, begin:begin + rows] = parts[s][:, off:off + rows]
            off += rows
    return full


def slowest_us(fn, iters, warmup):
    t = torch.tensor([median_us(fn, iters, warmup=warmup, before_repeat=dist.barrier)], device=DEVICE)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


DEVICE = "cuda"


def report(path):
    """The ratio table of a JSON file holding weave-bench sp rows and this script's rows."""
    rows = [json.loads(line) for line in open(path) if line.strip()]
    rows = [r for r in rows if r.get("kernel") in ("ring_attention", "ulysses")]
    by = {}
    for r in rows:
        by[(r["kernel"], r["S"], bool(r["causal"]), r["impl"])] = r
    keys = sorted({(r["kernel"], r["S"], bool(r["causal"])) for r in rows})
    print("| kernel | S | causal | weave TF/s/GPU | unfused TF/s/GPU | weave/unfused | 1-GPU weave TF/s | "
          "weave per GPU / 1-GPU | comm SMs | correct |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for k in keys:
        w, u, g = (by.get(k + (i,)) for i in ("weave", "unfused", "weave-1gpu"))
        f = lambda r, key: f"{r[key]:.1f}" if r else "-"  # noqa: E731
        ratio = f"{u['time_us'] / w['time_us']:.3f}" if (w and u) else "-"
        per = f"{w['tflops_per_gpu'] / g['tflops_per_gpu']:.3f}" if (w and g) else "-"
        ok = all(r["correct"] for r in (w, u, g) if r)
        print(f"| {k[0]} | {k[1]} | {int(k[2])} | {f(w, 'tflops_per_gpu')} | {f(u, 'tflops_per_gpu')} | {ratio} | "
              f"{f(g, 'tflops_per_gpu')} | {per} | {w.get('num_comm_sms', '-') if w else '-'} | {ok} |")


def main():
    global DEVICE
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--seqs", default="8192,16384,32768,65536,131072", help="total sequence lengths")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--heads-ring", type=int, default=16)
    ap.add_argument("--heads-ulysses", type=int, default=32)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--causal", default="0,1")
    ap.add_argument("--kernels", default="ring_attention,ulysses")
    ap.add_argument("--target-ms", type=float, default=200.0, help="timed work per repeat")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--ring-attn", default="cudnn", choices=["cudnn", "flash"],
                    help="attention-with-LSE op of the unfused ring (cuDNN, or FlashAttention-2)")
    ap.add_argument("--report", default=None, help="print the weave / unfused table of a merged JSON file and exit")
    args = ap.parse_args()
    if args.report:
        report(args.report)
        return 0
    DEVICE = args.device
    dist.init_process_group("nccl" if DEVICE == "cuda" else "gloo")
    rank, W = dist.get_rank(), dist.get_world_size()
    use_cudnn = DEVICE == "cuda"
    if use_cudnn:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
        attn = attn_cudnn if args.ring_attn == "cudnn" else attn_flash
        who = (f"ring attention op {args.ring_attn}, cuDNN {torch.backends.cudnn.version()}, torch {torch.__version__}, "
               f"{torch.cuda.get_device_name()}")
    else:
        attn = attn_reference
        who = f"float reference attention on the CPU, torch {torch.__version__}"
    seed = base_seed()
    if rank == 0:
        print(f"unfused sequence parallel baselines, {W} ranks, {who}, WEAVE_TEST_SEED={seed}", flush=True)
        print(f"{'kernel':<15} {'S':>7} {'B':>2} {'H':>3} {'causal':>6} {'time_us':>11} {'TF/s/GPU':>9} "
              f"{'o_ratio':>8} {'lse_rat':>8} {'rows':>6}", flush=True)
    rows, all_ok = [], True
    B, D = args.batch, args.head_dim
    for kernel in args.kernels.split(","):
        H = args.heads_ring if kernel == "ring_attention" else args.heads_ulysses
        for S in [int(s) for s in args.seqs.split(",") if s]:
            for causal in [bool(int(c)) for c in args.causal.split(",")]:
                zigzag = causal
                if kernel == "ring_attention":
                    chunks_of = lambda r: ring_chunks(S, W, r, zigzag)  # noqa: E731
                else:
                    if S % W or H % W:
                        raise SystemExit(f"ulysses baseline needs S and H divisible by W (S={S}, H={H}, W={W})")
                    chunks_of = lambda r: [(r * S // W, S // W)]  # noqa: E731
                mine = chunks_of(rank)
                L = sum(r for _, r in mine)
                row_pos = [p for begin, rows_ in mine for p in range(begin, begin + rows_)]
                g = torch.Generator(device=DEVICE).manual_seed((seed + 1000003 * rank + 7919 * S + causal) % 2**63)
                sets = []
                for _ in range(2):  # alternating from call to call
                    q, k = (torch.randn(B, L, H, D, device=DEVICE, generator=g).mul_(math.sqrt(3.0)).bfloat16()
                            for _ in range(2))  # scale * q.k: standard deviation 3 (default scale)
                    v = torch.randn(B, L, H, D, device=DEVICE, generator=g).bfloat16()
                    sets.append((q, k, v))
                state = {"calls": 0, "last": None}
                if kernel == "ring_attention":
                    def fn():
                        s = state["calls"] % 2
                        state["calls"] += 1
                        state["last"] = (s, ring_forward(*sets[s], S, causal, zigzag, attn))
                else:
                    def fn():
                        s = state["calls"] % 2
                        state["calls"] += 1
                        state["last"] = (s, (ulysses_forward(*sets[s], causal, use_cudnn), None))
                flop = 4.0 * B * S * S * H * D / (2 if causal else 1)
                est_us = flop / W / 400e12 * 1e6
                iters = max(1, min(50, int(args.target_ms * 1e3 / est_us)))
                t = slowest_us(fn, iters, warmup=1 if est_us > 1e5 else 2)
                tf = flop / t * 1e-6
                s, (out, lse) = state["last"]
                state["last"] = None
                q, k, v = sets[s]
                kf, vf = gather_seq(k, S, chunks_of), gather_seq(v, S, chunks_of)
                check, off = [], 0
                for i, (_, rows_) in enumerate(mine):
                    check += [off + x for x in sample_rows(rows_, (seed + 31 * rank + i) % 2**63, extra=2)]
                    off += rows_
                o_err, l_err = check_rows(q, kf, vf, out, lse, check, row_pos, causal)
                del kf, vf
                ok = o_err <= 1.0 and l_err <= 1.0
                res = torch.tensor([0.0 if ok else 1.0, o_err, l_err, float(len(check))], dtype=torch.float64,
                                   device=DEVICE)
                nrows = res[3:].clone()
                dist.all_reduce(res, op=dist.ReduceOp.MAX)  # wrong anywhere, worst ratios
                dist.all_reduce(nrows, op=dist.ReduceOp.SUM)
                ok, o_err, l_err, nrows = res[0].item() == 0.0, res[1].item(), res[2].item(), int(nrows.item())
                all_ok = all_ok and ok
                if rank == 0:
                    lse_txt = f"{l_err:>8.3f}" if kernel == "ring_attention" else f"{'-':>8}"
                    print(f"{kernel:<15} {S:>7} {B:>2} {H:>3} {int(causal):>6} {t:>11.1f} {tf / W:>9.1f} "
                          f"{o_err:>8.3f} {lse_txt} {nrows:>6}{'' if ok else '  WRONG'}", flush=True)
                row = dict(kernel=kernel, impl="unfused", B=B, S=S, H=H, H_kv=H, D=D, causal=causal, world=W,
                           sharding="zigzag" if (kernel == "ring_attention" and zigzag) else "contiguous",
                           time_us=t, tflops=tf, tflops_per_gpu=tf / W,
                           check="last timed call, sampled rows of every chunk (all batches, heads) vs float64",
                           checked_rows=nrows, o_err_ratio=o_err)
                if kernel == "ring_attention":
                    row["lse_err_ratio"] = l_err
                rows.append(dict(row, seed=str(seed), correct=ok, torch=torch.__version__,
                                 attention_op=(args.ring_attn if kernel == "ring_attention" else "cudnn-sdpa")
                                 if use_cudnn else "reference",
                                 cudnn=torch.backends.cudnn.version() if use_cudnn else None))
                del q, k, v, out, lse, sets
                if use_cudnn:
                    torch.cuda.empty_cache()
    if rank == 0 and args.json:
        with open(args.json, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    dist.barrier()
    dist.destroy_process_group()
    return 0 if all_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
