"""Inputs and the float64 reference of the MoE layer (weave.MoeLayer), shared by test_moe_gpu.py and
test_moe_multirank.py. Every rank regenerates every rank's inputs and every expert's weights from
(seed, tags) alone.

The reference and its per-element bound are check/moe_ref.hpp's (what the C++ layer tests and
weave-bench moe use), vectorised over tokens: r = sum_j w_j y_e(x), y_e(x) = Wd (silu(g) u), g and u
the gate and up rows of W_up[e] applied to x, in float64 from the bf16 inputs. The bound follows the
kernels' roundings: G = bf16(fp32 x Wup^T) (gate and up), H = bf16(silu(g~) u~) in fp32 (swiglu.hpp:
fast exp and division), Y = bf16(fp32 H~ Wd^T) per (token, slot), out = bf16(fp32 sum_j w_j y~_j):

  |out - r| <= 1.02 (u8 |r| + sum_e W_e (ey_e + 2^-19 (|y_e| + ey_e)) + 8 sqrt(sum_e (W_e s_e)^2)) + 2^-100

with u8 = 2^-8, W_e the summed router weight of the token's slots on expert e, ey the deterministic
part of an expert row's error and s the standard deviation bound of H's roundings propagated
through the down projection (Hoeffding, 8 sigma); the formulas are moe_ref.hpp's."""
import math
import zlib

import torch

BF, F32, I32 = torch.bfloat16, torch.float32, torch.int32
U8 = 2.0 ** -8


def _gen(seed: int, *tags) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(repr((seed,) + tags).encode()))


def expert_weights(E: int, H: int, F: int, seed: int, device="cuda"):
    """(W_up (E, 2F, H), W_down (E, H, F)) bf16 of every expert, uniform in +-a as the C++ tests
    (tests/moe/layer_check.hpp): a_up = 3 sqrt(3 / H) puts g and u at ~1.7 rms for x uniform in
    [-1, 1] (silu well into its curved part), a_down = sqrt(3 / F) keeps y of the order of h."""
    g = _gen(seed, "moe weights", E, H, F)
    a_up, a_down = 3 * math.sqrt(3 / H), math.sqrt(3 / F)
    up = ((torch.rand((E, 2 * F, H), generator=g) * 2 - 1) * a_up).to(BF)
    down = ((torch.rand((E, H, F), generator=g) * 2 - 1) * a_down).to(BF)
    return up.to(device), down.to(device)


def tokens(T: int, H: int, seed: int, *tags, device="cuda") -> torch.Tensor:
    """(T, H) bf16 uniform in [-1, 1]."""
    return (torch.rand((T, H), generator=_gen(seed, "moe x", T, H, *tags)) * 2 - 1).to(BF).to(device)


def routing(T: int, k: int, E: int, kind: str, seed: int, *tags, hot: int = 0, device="cuda"):
    """(topk_idx (T, k) int32, topk_weights (T, k) fp32) of a router:
    - "random": k distinct experts per token, uniformly;
    - "one": every token's first slot on expert `hot` (k = 1: all tokens to one expert), the other
      slots distinct random experts;
    - "repeat": "random" with slot 1 repeating slot 0's expert (two rows of one expert per token).
    Weights: a softmax over the slots (positive, summing to 1)."""
    g = _gen(seed, "moe routing", T, k, E, kind, *tags)
    scores = torch.rand((T, E), generator=g)
    if kind == "one":
        scores[:, hot] = 2.0
    idx = scores.argsort(dim=1, descending=True)[:, :k].contiguous()
    if kind == "repeat":
        assert k >= 2
        idx[:, 1] = idx[:, 0]
    elif kind not in ("random", "one"):
        raise ValueError(kind)
    w = torch.softmax(torch.randn((T, k), generator=g), dim=1)
    return idx.to(I32).to(device), w.to(F32).to(device)


def moe_reference(x, idx, w, up, down):
    """(r, bound), float64 (T, H): the layer's output for tokens x (T, H) routed by idx / w (T, k)
    over experts up (E, 2F, H) and down (E, H, F) (every expert, global ids), and the per-element
    bound of check/moe_ref.hpp (module docstring). Computed on x's device."""
    T, H = x.shape
    E, F = up.shape[0], up.shape[1] // 2
    dev = x.device
    xd, wd = x.double(), w.double()
    r = torch.zeros((T, H), dtype=torch.float64, device=dev)
    det, rnd2 = torch.zeros_like(r), torch.zeros_like(r)
    gamH, gamF = H * 2.0 ** -21, F * 2.0 ** -21
    for e in range(E):
        on = idx.long() == e
        sel = on.any(dim=1).nonzero().flatten()
        if sel.numel() == 0:
            continue
        we = (wd * on).sum(dim=1)[sel, None]  # the token's summed weight on e
        X = xd[sel]
        Wg, Wu, Wdn = up[e, :F].double(), up[e, F:].double(), down[e].double()
        g, ag = X @ Wg.T, X.abs() @ Wg.abs().T
        u, au = X @ Wu.T, X.abs() @ Wu.abs().T
        eg = U8 * g.abs() + (1 + U8) * gamH * ag
        eu = U8 * u.abs() + (1 + U8) * gamH * au
        sg = g * torch.sigmoid(g)
        h = sg * u
        D = (sg.abs() + 1.1 * eg) * eu + 1.1 * u.abs() * eg
        q = 2.0 ** -18 + g.abs() * 2.0 ** -22
        eh = (1 + U8 + q) * D + (U8 + q) * h.abs()
        y = h @ Wdn.T
        a = (h.abs() + eh) @ Wdn.abs().T
        s2 = (eh * eh) @ (Wdn * Wdn).T
        ey = U8 * y.abs() + (1 + U8) * gamF * a
        r[sel] += we * y
        det[sel] += we * (ey + 2.0 ** -19 * (y.abs() + ey))
        rnd2[sel] += we * we * s2
    bound = 1.02 * (U8 * r.abs() + det + 8 * rnd2.sqrt()) + 2.0 ** -100
    return r, bound


def check_moe(out: torch.Tensor, x, idx, w, up, down, what: str) -> None:
    """Every element of the layer output `out` (T, H) within moe_reference's bound (NaN fails)."""
    assert out.shape == x.shape and out.dtype == BF, f"{what}: {tuple(out.shape)} {out.dtype}"
    if out.numel() == 0:
        return
    r, bound = moe_reference(x, idx, w, up, down)
    err = (out.double() - r).abs()
    bad = ~(err <= bound)
    if bad.any():
        i = int(bad.flatten().nonzero()[0])
        t, c = divmod(i, out.shape[1])
        ratio = float((err / bound).nan_to_num(float("inf")).max())
        raise AssertionError(f"{what}: {int(bad.sum())} of {out.numel()} outputs past the bound (worst ratio "
                             f"{ratio:.3g}), first at token {t} col {c}: {float(out[t, c])} vs {float(r[t, c])} "
                             f"(bound {float(bound[t, c])})")


def check_fused_and_plain(fused, plain, x, idx, w, up, down, up_all, down_all, what: str) -> None:
    """The fused and the non-fused layer on the same call (`up`, `down`: this rank's experts;
    `up_all`, `down_all`: every expert's, for the reference): each against the reference, and
    the two bit for bit equal."""
    out = fused(x, idx, w, up, down)
    ref = plain(x, idx, w, up, down)
    check_moe(out, x, idx, w, up_all, down_all, "fused " + what)
    check_moe(ref, x, idx, w, up_all, down_all, "non-fused " + what)
    assert torch.equal(out, ref), f"{what}: fused and non-fused outputs differ"


def swiglu_torch(g: torch.Tensor, F: int) -> torch.Tensor:
    """silu(gate) * up of the up projection's (R, 2F) bf16 output (gate first), in fp32, bf16 out."""
    gf = g.float()
    return (torch.nn.functional.silu(gf[:, :F]) * gf[:, F:]).to(BF)


def grouped_rows(d: int, L: int, xs, idxs):
    """Rank d's grouped buffer after a dispatch of every rank's (x, topk_idx) (xs[s], idxs[s]):
    for local expert l, for source rank s, the rows of s routed to expert d L + l in ascending
    (token, slot) order (kernels/moe/README.md's receiver layout). Returns (rows, counts)."""
    rows, counts = [], []
    for l in range(L):
        n = 0
        for x, idx in zip(xs, idxs):
            t, _ = (idx.long() == d * L + l).nonzero(as_tuple=True)  # row-major: (token, slot) order
            rows.append(x[t])
            n += t.numel()
        counts.append(n)
    H = xs[0].shape[1]
    return (torch.cat(rows) if rows else xs[0].new_empty((0, H))), counts


def check_captured_replays(layers, make_call, up, down, up_all, down_all, replays: int, what: str) -> None:
    """`layers` (MoeLayer / MoeLowLatency objects taking the same call) captured in one CUDA graph
    after an eager call of each, then replayed with make_call(i) -> (x, idx, w) copied into the
    captured inputs (T is the graph's), the captured outputs poisoned (NaN) before each replay:
    every replay's outputs against the reference (`up_all`, `down_all`: every expert's weights) and
    bit for bit equal to each other. Every fourth step is an eager call on the captured tensors
    instead (their signal rounds then advance on the device), and one eager call follows the last
    replay."""
    x, idx, w = (t.clone() for t in make_call(0))

    def check(outs, i, how):
        for j, out in enumerate(outs):
            check_moe(out, x, idx, w, up_all, down_all, f"{what} {how} {i}, layer {j}")
            assert torch.equal(out, outs[0]), f"{what} {how} {i}: layer {j} differs from layer 0"

    check([m(x, idx, w, up, down) for m in layers], 0, "eager call")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [m(x, idx, w, up, down) for m in layers]
    for i in range(1, replays + 2):
        for dst, src in zip((x, idx, w), make_call(i)):
            dst.copy_(src)
        if i % 4 == 0 or i == replays + 1:
            check([m(x, idx, w, up, down) for m in layers], i, "eager call")
            continue
        for out in outs:
            out.fill_(float("nan"))
        graph.replay()
        check(outs, i, "replay")
    for m in layers:
        m.check()
