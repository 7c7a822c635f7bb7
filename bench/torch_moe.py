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

With world >= 2 rows in the file, --report also prints torch / weave for moe_dispatch, moe_combine,
moe_layer and moe_layer_fused (both layers against torch_layer), and each weave layer against the
sum of its grouped GEMMs alone (moe_layer_gemms: moe_up_gemm + moe_down_gemm on the layer's
dispatched rows), as moe_layer_gemms time / layer time (the issue's target: >= 0.9 at T = 16384).

Under torchrun with world W >= 2 it times the plain-PyTorch expert-parallel layer instead, beside
`weave-run -n W -- weave-bench moe` (same shapes, T tokens per rank, same routings, same inputs):
  torch_dispatch  sort the T k (token, slot) rows by expert, count exchange and split sizes (one
                  all_to_all_single and a host sync), the rows (each (token, slot) once: the
                  plain way, not once per rank) through all_to_all_single (NCCL);
  torch_layer     dispatch, regroup by local expert, torch._grouped_mm up (N = 2F), SwiGLU in
                  fp32 rounded once (gate = first F columns), torch._grouped_mm down,
                  all_to_all_single back, and the combine;
  torch_combine   the rows back through all_to_all_single and a float32 index_add_ (scatter-add)
                  weighted by the router weights, rounded to bf16.
Routing per token, x, W_up and W_down are moe.cu's (world::layer_counts, topk_from_counts and the
hash fill, reimplemented here on int64 tensors), rows carry routing_hash of the W x E count matrix.
Checks: dispatch's rows per local expert; combine with identity experts (out = x sum_j w_j) under
2^-8 |r| + 2^-19 sum |w x|; the layer on 2 sampled tokens per rank against float64 under the bound
of tests/moe/test_moe_layer_gpu.cu. gbs uses weave's algorithmic byte count (what the layer must
move), so gbs ratios are time ratios; tflops counts the two grouped GEMMs, 2 T k (3 H F).

    torchrun --nproc_per_node 2 bench/torch_moe.py --json moe.jsonl [--kernels dispatch,combine,layer]
"""
import argparse
import json
import math
import os
import sys

MODELS = {"deepseek": (7168, 2048, 64, 8), "qwen": (4096, 1536, 64, 8), "mixtral": (4096, 14336, 8, 2)}
# Not in weave-bench: a small shape for smoke tests of the world >= 2 path (e.g. gloo on a CPU).
MODELS_EXTRA = {"tiny": (256, 128, 8, 2), "tiny8": (128, 64, 16, 8)}
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



# ---------------------------------------------------------------------------------------------
# World >= 2 (torchrun --nproc_per_node W): the plain-PyTorch expert-parallel layer beside
# `weave-run -n W -- weave-bench moe` (tools/weave-bench/moe.cu, namespace world): the same
# shapes, the same per-token routing and the same hash-filled x, W_up and W_down, so the rows
# compare one for one (routing_hash of the W x E count matrix).


def layer_counts(routing, T, k, E, seed, rank):
    """Rank `rank`'s rows per expert (moe.cu's world::layer_counts)."""
    if routing != "one":
        return make_counts(routing, T, k, E, seed + 7919 * rank)
    c = [0] * E
    c[0] = T
    rest = T * (k - 1)
    for e in range(1, E):
        if rest > 0:
            c[e] = rest // (E - 1) + (1 if e - 1 < rest % (E - 1) else 0)
    return c


def topk_from_counts(torch, c, T, k, device):
    """List position p of the experts' rows (expert order) goes to token p % T, slot p // T."""
    lst = torch.repeat_interleave(torch.arange(len(c), device=device, dtype=torch.int32),
                                  torch.tensor(c, device=device))
    return lst.view(k, T).t().contiguous()  # T x k


def s64(v):
    v &= MASK64
    return v - (1 << 64) if v >= (1 << 63) else v


def _lsr(z, n):  # logical right shift of int64 tensors
    return (z >> n) & ((1 << (64 - n)) - 1)


def hash_values(torch, seed, stream, first, n, shift, device):
    """moe.cu's world::Hash::value for indices first .. first + n - 1, as bf16 (exact)."""
    base = s64(seed ^ ((stream * 0xD1B54A32D192ED03) & MASK64))
    out = torch.empty(n, dtype=torch.bfloat16, device=device)
    chunk = 1 << 26
    for a in range(0, n, chunk):
        b = min(n, a + chunk)
        i = torch.arange(first + a + 1, first + b + 1, dtype=torch.int64, device=device)
        z = i * s64(0x9E3779B97F4A7C15)
        z = z ^ base
        z = (z ^ _lsr(z, 30)) * s64(0xBF58476D1CE4E5B9)
        z = (z ^ _lsr(z, 27)) * s64(0x94D049BB133111EB)
        z = z ^ _lsr(z, 31)
        out[a:b] = ((_lsr(z, 56) - 128).to(torch.float32) * 2.0 ** (-7 - shift)).to(torch.bfloat16)
        del i, z
    return out


def up_shift(H):
    return int(round(math.log2(math.sqrt(H) / 4.5)))


def down_shift(F):
    return int(round(math.log2(math.sqrt(F / 3))))


HASH_X, HASH_UP, HASH_DOWN = 1, 2, 3


def layer_bound_ratio(torch, x, ids, ws, wup_of, wdown_of, got, H, F):
    """float64 reference of one token through the layer and the bound of
    tests/moe/test_moe_layer_gpu.cu; the worst |got - r| / bound."""
    u8, fp32 = 2.0 ** -8, 2.0 ** -18
    gamH, gamF = H * 2.0 ** -21, F * 2.0 ** -21
    xd = x.double()
    r = torch.zeros(H, dtype=torch.float64, device=x.device)
    det = torch.zeros_like(r)
    rnd2 = torch.zeros_like(r)
    for e in sorted(set(ids)):
        we = sum(w for i, w in zip(ids, ws) if i == e)
        wu = wup_of(e).double()  # 2F x H
        wd = wdown_of(e).double()  # H x F
        gu = wu @ xd
        agu = wu.abs() @ xd.abs()
        g, u, ag, au = gu[:F], gu[F:], agu[:F], agu[F:]
        eg = u8 * g.abs() + (1 + u8) * gamH * ag
        eu = u8 * u.abs() + (1 + u8) * gamH * au
        sg = g / (1 + torch.exp(-g))
        h = sg * u
        D = (sg.abs() + 1.1 * eg) * eu + 1.1 * u.abs() * eg
        q = fp32 + g.abs() * 2.0 ** -22
        eh = (1 + u8 + q) * D + (u8 + q) * h.abs()
        y = wd @ h
        a = wd.abs() @ (h.abs() + eh)
        s2 = (wd * wd) @ (eh * eh)
        ey = u8 * y.abs() + (1 + u8) * gamF * a
        r += we * y
        det += we * (ey + 2.0 ** -19 * (y.abs() + ey))
        rnd2 += we * we * s2
    v = got.double()
    if not bool(torch.isfinite(v).all()):
        return math.inf
    bound = 1.02 * (u8 * r.abs() + det + 8 * rnd2.sqrt()) + 2.0 ** -100
    return ((v - r).abs() / bound).max().item()


def run_world(a, torch):
    import torch.distributed as dist
    import torch.nn.functional as Fn
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from torch_timing import median_us

    cuda = torch.cuda.is_available()  # without a GPU: gloo on the CPU, a smoke test of the logic
    dist.init_process_group("nccl" if cuda else "gloo")
    W, me = dist.get_world_size(), dist.get_rank()
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", me))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)

    def sync():
        if cuda:
            torch.cuda.synchronize()
    torch.backends.cuda.matmul.allow_tf32 = False
    v = os.environ.get("WEAVE_TEST_SEED")
    seed = int(v, 0) if v else int.from_bytes(os.urandom(8), "little") & ((1 << 63) - 1)
    st = torch.tensor([seed], dtype=torch.int64, device=dev)
    dist.broadcast(st, 0)
    seed = int(st.item())
    if me == 0:
        print(f"WEAVE_TEST_SEED={seed}" + (" (from the environment)" if v else " (set it to replay this run)"),
              flush=True)
    out_file = open(a.json, "a") if (a.json and me == 0) else None
    kernels = a.kernels.split(",")
    wrong = []

    def slowest(t):
        x = torch.tensor([t], dtype=torch.float64, device=dev)
        dist.all_reduce(x, op=dist.ReduceOp.MAX)
        return x.item()

    def all_ok(ok):
        x = torch.tensor([0 if ok else 1], dtype=torch.int32, device=dev)
        dist.all_reduce(x, op=dist.ReduceOp.MAX)
        return x.item() == 0

    def timed(fn, est_us):
        iters = max(3, min(200, int(a.target_ms * 1e3 / max(est_us, 1.0))))
        dist.barrier()
        sync()
        return slowest(median_us(fn, iters, repeats=3, warmup=2, before_repeat=dist.barrier))

    if me == 0:
        print(f"torch expert parallel, world {W}: all_to_all_single (NCCL) + torch._grouped_mm + scatter-add")
        print(f"{'model':9} {'T':>6} {'routing':10} {'impl':15} {'time_us':>10} {'GB/s':>8} {'TFLOP/s':>8} {'worst':>9}")
    for mname in a.models.split(","):
        H, F, E, k = MODELS[mname] if mname in MODELS else MODELS_EXTRA[mname]
        L = E // W
        for T in (int(t) for t in a.tokens.split(",")):
            for routing in a.routing.split(","):
                counts = [layer_counts(routing, T, k, E, a.routing_seed, r) for r in range(W)]
                matrix = [c for row in counts for c in row]
                idx_all = [topk_from_counts(torch, counts[r], T, k, dev) for r in range(W)]
                idx = idx_all[me]
                wts = ((torch.arange(T * k, device=dev) % 7 + 1).float() / 8).view(T, k)
                x = hash_values(torch, seed, HASH_X + 16 * me, 0, T * H, 0, dev).view(T, H)
                wup = hash_values(torch, seed, HASH_UP, me * L * 2 * F * H, L * 2 * F * H, up_shift(H),
                                  dev).view(L, 2 * F, H)
                wdown = hash_values(torch, seed, HASH_DOWN, me * L * H * F, L * H * F, down_shift(F),
                                    dev).view(L, H, F)
                # Algorithmic NVLink bytes per rank (moe.cu's definition), averaged over ranks.
                bd = bc = 0.0
                for r in range(W):
                    ranks = (idx_all[r].long() // L)
                    remote = ranks != r
                    bc += 2.0 * H * remote.sum().item()
                    bd += 16.0 * remote.sum().item()
                    distinct = torch.zeros(T, W, dtype=torch.bool, device=dev)
                    distinct.scatter_(1, ranks, True)
                    distinct[:, r] = False
                    bd += 2.0 * H * distinct.sum().item()
                bd /= W
                bc /= W
                flop = 2.0 * T * k * (2.0 * F * H + H * F)
                rhash = counts_hash(matrix)

                flat = idx.reshape(-1).long()
                state = {}

                def dispatch():
                    order = torch.argsort(flat, stable=True)
                    rows = x.index_select(0, order // k)
                    cnt = torch.bincount(flat, minlength=E).to(torch.int64)
                    rcnt = torch.empty_like(cnt)
                    dist.all_to_all_single(rcnt, cnt)  # rcnt[s L + l]: rows of source s for local expert l
                    send = cnt.view(W, L).sum(1).tolist()
                    recv_c = rcnt.view(W, L)
                    recvs = recv_c.sum(1).tolist()  # host sync: plain PyTorch needs the split sizes
                    recv = torch.empty(sum(recvs), H, dtype=x.dtype, device=dev)
                    dist.all_to_all_single(recv, rows, recvs, send)
                    state.update(order=order, send=send, recvs=recvs, recv=recv, recv_c=recv_c)
                    return recv

                def experts():
                    recv, recv_c = state["recv"], state["recv_c"]
                    lid = torch.repeat_interleave(torch.arange(L, device=dev).repeat(W), recv_c.reshape(-1))
                    perm = torch.argsort(lid, stable=True)
                    offs = torch.cumsum(torch.bincount(lid, minlength=L), 0).to(torch.int32)
                    xg = recv.index_select(0, perm)
                    g = torch._grouped_mm(xg, wup.transpose(-2, -1), offs=offs)
                    # silu(gate) * up in fp32, one rounding (weave's swiglu contract)
                    h = (Fn.silu(g[:, :F].float()) * g[:, F:].float()).to(torch.bfloat16)
                    y = torch._grouped_mm(h, wdown.transpose(-2, -1), offs=offs)
                    yr = torch.empty_like(y)
                    yr[perm] = y
                    state["y"] = yr

                def combine(y_rows):
                    back = torch.empty(T * k, H, dtype=y_rows.dtype, device=dev)
                    dist.all_to_all_single(back, y_rows, state["send"], state["recvs"])
                    order = state["order"]
                    wsorted = wts.reshape(-1)[order]
                    acc = torch.zeros(T, H, dtype=torch.float32, device=dev)
                    acc.index_add_(0, order // k, back.float() * wsorted[:, None])
                    return acc.to(torch.bfloat16)

                def layer():
                    dispatch()
                    experts()
                    return combine(state["y"])

                def base(kernel, impl):
                    return {"kernel": kernel, "impl": impl, "model": mname, "T": T, "H": H, "F": F, "E": E, "k": k,
                            "world": W, "routing": routing, "routing_hash": rhash, "seed": str(seed),
                            "torch": torch.__version__}

                def emit(row, label, t, gbs, tf, worst, ok):
                    if me == 0:
                        print(f"{mname:9} {T:6d} {routing:10} {row['impl']:15} {t:10.1f} "
                              f"{gbs if gbs else float('nan'):8.1f} {tf if tf else float('nan'):8.1f} {worst:9.3g}"
                              + ("" if ok else "  WRONG"), flush=True)
                        if out_file:
                            out_file.write(json.dumps(row) + "\n")
                            out_file.flush()
                    if not ok:
                        wrong.append(f"{label} {mname} T {T} {routing}")

                est_comm = max(bd, bc) / 100e3 + 50
                try:
                    if "dispatch" in kernels or "combine" in kernels:
                        t = timed(dispatch, est_comm)
                        got = state["recv_c"].sum(0).tolist()  # rows per local expert
                        want = [sum(counts[s][me * L + l] for s in range(W)) for l in range(L)]
                        ok = all_ok(got == want)
                        if "dispatch" in kernels:
                            row = base("moe_dispatch", "torch_dispatch")
                            row.update(time_us=t, gbs=bd / t * 1e-3, bytes=bd, correct=ok)
                            emit(row, "torch_dispatch", t, bd / t * 1e-3, None, 0.0, ok)
                    if "combine" in kernels:
                        # Identity experts (y = the received row): out[t] = x[t] * sum_j w[t, j].
                        yid = state["recv"]
                        res = {}

                        def comb():
                            res["o"] = combine(yid)
                        t = timed(comb, est_comm)
                        sync()
                        r = x.double() * wts.double().sum(1, keepdim=True)
                        s = x.double().abs() * wts.double().sum(1, keepdim=True)
                        o = res["o"].double()
                        worst = math.inf if not bool(torch.isfinite(o).all()) else \
                            ((o - r).abs() / (2.0 ** -8 * r.abs() + 2.0 ** -19 * s + 1e-30)).max().item()
                        worst = slowest(worst)
                        ok = worst <= 1.0
                        row = base("moe_combine", "torch_combine")
                        row.update(time_us=t, gbs=bc / t * 1e-3, bytes=bc, correct=ok, check_worst=worst)
                        emit(row, "torch_combine", t, bc / t * 1e-3, None, worst, ok)
                    if "layer" in kernels:
                        res = {}

                        def lay():
                            res["o"] = layer()
                        t = timed(lay, flop / 300e6 + 2 * est_comm)
                        sync()
                        worst = 0.0
                        for tt in (T // 3, T - 1):
                            ids = [int(v) for v in idx[tt].tolist()]
                            ws = [float(v) for v in wts[tt].tolist()]

                            def wup_of(e):
                                return hash_values(torch, seed, HASH_UP, e * 2 * F * H, 2 * F * H, up_shift(H),
                                                   dev).view(2 * F, H)

                            def wdown_of(e):
                                return hash_values(torch, seed, HASH_DOWN, e * H * F, H * F, down_shift(F),
                                                   dev).view(H, F)
                            worst = max(worst, layer_bound_ratio(torch, x[tt], ids, ws, wup_of, wdown_of,
                                                                 res["o"][tt], H, F))
                        worst = slowest(worst)
                        ok = worst <= 1.0
                        row = base("moe_layer", "torch_layer")
                        row.update(time_us=t, tflops=flop / t * 1e-6, correct=ok, check_worst=worst)
                        emit(row, "torch_layer", t, None, flop / t * 1e-6, worst, ok)
                except RuntimeError as e:  # e.g. torch._grouped_mm refusing a routing: listed, not failed
                    if me == 0:
                        print(f"{mname:9} {T:6d} {routing:10} unsupported: {str(e)[:160]}", flush=True)
                        if out_file:
                            row = base("moe_layer", "torch_layer")
                            row.update(supported=False, reason=str(e)[:300])
                            out_file.write(json.dumps(row) + "\n")
                state.clear()
                del x, wup, wdown
                if cuda:
                    torch.cuda.empty_cache()
    dist.barrier()
    dist.destroy_process_group()
    if wrong:
        if me == 0:
            print(f"torch_moe.py: {len(wrong)} incorrect row(s) (replay with WEAVE_TEST_SEED={seed}):",
                  file=sys.stderr)
            for w in wrong:
                print("  " + w, file=sys.stderr)
        return 1
    return 0


def report_layer(path):
    """The world >= 2 rows: torch / weave for moe_dispatch, moe_combine, moe_layer and moe_layer_fused
    (both weave layers against the one plain-PyTorch layer, torch_layer), then each weave layer
    against the sum of its two grouped GEMMs alone (moe_layer_gemms, weave-bench moe --kernels
    layer_gemms)."""
    rows = [json.loads(l) for l in open(path) if l.strip()]
    rows = [r for r in rows if r.get("kernel") in LAYER_KERNELS + ("moe_layer_gemms",) and "time_us" in r]
    if not rows:
        return
    by = {}
    for r in rows:
        by.setdefault((r["kernel"], r.get("model"), r.get("T"), r.get("routing"), r.get("world")), {})[r["impl"]] = r
    print(f"\n{'kernel':15} {'model':9} {'T':>6} {'routing':10} {'W':>2} {'weave us':>10} {'torch us':>10} "
          f"{'weave':>8} {'torch':>8} {'torch/weave':>11} {'hash ok':>7}")
    ratios = {}
    for key in sorted(by, key=lambda t: tuple(str(x) for x in t)):
        if key[0] not in LAYER_KERNELS:
            continue
        w = by[key].get("weave")
        kt, it = TORCH_ROW[key[0]]
        t = by.get((kt,) + key[1:], {}).get(it)
        if not w:
            continue
        unit = "gbs" if key[0] in ("moe_dispatch", "moe_combine") else "tflops"
        r_t = t["time_us"] / w["time_us"] if t else float("nan")
        same = "-" if not t else ("yes" if t.get("routing_hash") == w.get("routing_hash") else "NO")
        if t:
            ratios.setdefault(key[0], []).append(r_t)
        print(f"{key[0]:15} {key[1]:9} {key[2]:>6} {key[3]:10} {key[4]:>2} {w['time_us']:10.1f} "
              f"{(t or {}).get('time_us', float('nan')):10.1f} {w.get(unit, float('nan')):8.1f} "
              f"{(t or {}).get(unit, float('nan')):8.1f} {r_t:11.3f} {same:>7}")
    for kname in LAYER_KERNELS:
        v = ratios.get(kname)
        if v:
            print(f"geomean torch / weave, {kname}, over {len(v)} rows: "
                  f"{math.exp(sum(math.log(x) for x in v) / len(v)):.3f}; min {min(v):.3f}")
    # The issue's "layer >= 0.9x the sum of its grouped GEMMs alone": as speeds, (up + down alone) /
    # layer time; both rows come from one weave-bench run (same routing_hash, same ranks).
    gemms = {key[1:]: d["weave"] for key, d in by.items() if key[0] == "moe_layer_gemms" and "weave" in d}
    if not gemms:
        return
    print(f"\n{'model':9} {'T':>6} {'routing':10} {'W':>2} {'gemms us':>10} {'layer us':>10} {'fused us':>10} "
          f"{'layer/gemms':>11} {'fused/gemms':>11} {'hash ok':>7}")
    lg = {}
    for key in sorted(gemms, key=lambda t: tuple(str(x) for x in t)):
        g = gemms[key]
        cells, same = [], True
        for kname in ("moe_layer", "moe_layer_fused"):
            lay = by.get((kname,) + key, {}).get("weave")
            cells.append(lay)
            if lay:
                same = same and lay.get("routing_hash") == g.get("routing_hash")
                lg.setdefault(kname, []).append((key, g["time_us"] / lay["time_us"]))
        us = [c["time_us"] if c else float("nan") for c in cells]
        rs = [g["time_us"] / u for u in us]
        print(f"{key[0]:9} {key[1]:>6} {key[2]:10} {key[3]:>2} {g['time_us']:10.1f} {us[0]:10.1f} {us[1]:10.1f} "
              f"{rs[0]:11.3f} {rs[1]:11.3f} {'yes' if same else 'NO':>7}")
    for kname in ("moe_layer", "moe_layer_fused"):
        v = [r for _, r in lg.get(kname, [])]
        if not v:
            continue
        big = [r for key, r in lg[kname] if key[1] == 16384]
        tail = f"; at T = 16384: min {min(big):.3f} over {len(big)} rows (target >= 0.9)" if big else ""
        print(f"geomean {kname} / its grouped GEMMs alone (gemms us / layer us) over {len(v)} rows: "
              f"{math.exp(sum(math.log(x) for x in v) / len(v)):.3f}; min {min(v):.3f}{tail}")


# The world >= 2 rows report_layer compares, and the torch row (kernel, impl) each weave row is set
# against: both weave layers against the one plain-PyTorch layer.
LAYER_KERNELS = ("moe_dispatch", "moe_combine", "moe_layer", "moe_layer_fused")
TORCH_ROW = {"moe_dispatch": ("moe_dispatch", "torch_dispatch"), "moe_combine": ("moe_combine", "torch_combine"),
             "moe_layer": ("moe_layer", "torch_layer"), "moe_layer_fused": ("moe_layer", "torch_layer")}


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
    ap.add_argument("--kernels", default="dispatch,combine,layer", help="world >= 2: which rows")
    ap.add_argument("--world", type=int, default=0, help="with --list: the world rows' routing hashes")
    a = ap.parse_args()
    if a.report:
        report(a.report)
        report_layer(a.report)
        return 0
    if a.list and a.world:  # the world rows' routing fingerprints (weave-bench moe --list --world W)
        for m in a.models.split(","):
            H, F, E, k = MODELS[m]
            for T in (int(t) for t in a.tokens.split(",")):
                for r in a.routing.split(","):
                    mat = [c for s in range(a.world) for c in layer_counts(r, T, k, E, a.routing_seed, s)]
                    print(json.dumps({"kernel": "moe_layer", "model": m, "T": T, "world": a.world, "routing": r,
                                      "routing_hash": counts_hash(mat)}))
        return 0
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not a.list:
        import torch
        return run_world(a, torch)
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
    from torch_tp import derive  # the seeds every baseline script derives alike

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
