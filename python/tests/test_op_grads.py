"""The operators' own gradients (weave/op_grads.py) against float32 torch autograd of a
single-process reference that simulates every rank. Runs at a world of 1 under plain pytest and at
the torchrun world size (each rank regenerates every rank's inputs from the shared seed):

    python3 -m pytest python/tests/test_op_grads.py -q
    WEAVE_SHARE_GPUS=1 torchrun --nproc_per_node 2 -m pytest python/tests/test_op_grads.py -q -p no:cacheprovider

The collectives' gradients are their adjoints over the group (the gradient of the sum of every
rank's loss <y_r, g_r>, with a different g_r per rank): data movement is checked bit for bit, sums
within the bf16 bounds of test_autograd_gpu.check_bf16. Outputs of weave's operators are poisoned
with NaN; shapes are not tile multiples."""
import os

import pytest
import torch

import weave
from refs import check_close, poison, rand
from test_autograd_gpu import check_bf16, gemm_size

pytestmark = pytest.mark.gpu
BF, F32 = torch.bfloat16, torch.float32


@pytest.fixture
def env(request, monkeypatch, seed):
    """(rank, world, seed) at the torchrun world size, or (0, 1, seed) in one process."""
    info = request.getfixturevalue("world") if "WORLD_SIZE" in os.environ else (0, 1, seed)
    poison(monkeypatch)
    weave.init()
    return info


def leaf(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone().requires_grad_()


def ref_grads(fn, *inputs):
    """fn(*float32 leaves) -> a scalar loss; the float32 gradients of every input."""
    leaves = [t.detach().float().requires_grad_() for t in inputs]
    fn(*leaves).backward()
    return [t.grad for t in leaves]


def shard(n, W, r):
    base, extra = divmod(n, W)
    return r * base + min(r, extra), base + (r < extra)


# ---- matmul ---------------------------------------------------------------------------------

@pytest.mark.parametrize("rows, batch", [(133, None), (24, 3)])  # rows % 8 != 0: dB by torch.matmul
@pytest.mark.parametrize("b_form", ["kn", "weight_t"])
@pytest.mark.parametrize("bias", [None, BF, F32])
@pytest.mark.parametrize("out_dtype", [None, F32])
def test_matmul_grads(env, rows, batch, b_form, bias, out_dtype):
    rank, W, seed = env
    K, N = 136, 104
    lead = (rows,) if batch is None else (rows, batch)
    A = leaf(rand(lead + (K,), BF, seed, "A"))
    Bs = rand((K, N) if b_form == "kn" else (N, K), BF, seed, "B")
    Bl = leaf(Bs)
    b = None if bias is None else leaf(rand((N,), bias, seed, "bias"))
    y = weave.matmul(A, Bl if b_form == "kn" else Bl.t(), b, out_dtype=out_dtype)
    g = rand(y.shape, y.dtype, seed, "g")
    y.backward(g)

    def loss(a, bm, bb=None):
        bmat = bm if b_form == "kn" else bm.t()
        return ((a @ bmat + (0 if bb is None else bb)) * g.float()).sum()

    refs = ref_grads(loss, A, Bs, *(() if b is None else (b,)))
    R = A.numel() // K
    check_bf16(A.grad, refs[0], gemm_size(N, g, Bs), "matmul dA")
    check_bf16(Bl.grad, refs[1], gemm_size(R, A, g), "matmul dB")
    if b is not None:
        assert b.grad.dtype == bias
        check_close(b.grad, refs[2], 2.0 ** -7 * refs[2].abs() + 4 * 2.0 ** -8 * gemm_size(R, g, torch.ones(1)),
                    "matmul dbias")


def test_matmul_grad_of_transposed_a(env):
    """A given as dY.t() of a contiguous K x M matrix (weave.matmul reads it in place)."""
    rank, W, seed = env
    At = leaf(rand((72, 40), BF, seed, "At"))  # K x M storage
    B = leaf(rand((72, 104), BF, seed, "B"))
    y = weave.matmul(At.t(), B)
    g = rand(y.shape, BF, seed, "g")
    y.backward(g)
    refs = ref_grads(lambda a, b: ((a.t() @ b) * g.float()).sum(), At, B)
    check_bf16(At.grad, refs[0], gemm_size(104, g, B), "dA^T")
    check_bf16(B.grad, refs[1], gemm_size(40, At, g), "dB")


# ---- collectives ----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [BF, F32])
def test_all_reduce_grad(env, dtype):
    rank, W, seed = env
    n = 4099
    x = leaf(rand((n,), dtype, seed, "x", rank))
    gs = [rand((n,), dtype, seed, "g", r) for r in range(W)]
    weave.all_reduce(x).backward(gs[rank])
    ref = sum(g.float() for g in gs)
    eps = 2.0 ** -8 if dtype == BF else 2.0 ** -24
    check_close(x.grad, ref, 2 * W * eps * sum(g.float().abs() for g in gs) + 1e-30, "all_reduce dx")


@pytest.mark.parametrize("dim, full_extra", [(0, 0), (0, 1), (1, 0)])
def test_all_gather_grad(env, dim, full_extra):
    rank, W, seed = env
    full = 5 * W + full_extra
    other = 72
    def shape(r):  # dim 1 of a 3-D tensor: a middle dimension (the last one is not gathered)
        n = shard(full, W, r)[1]
        return (n, other) if dim == 0 else (3, n, other)
    x = leaf(rand(shape(rank), BF, seed, "x", rank))
    y = weave.all_gather(x, dim, full_size=full)
    gs = [rand(y.shape, BF, seed, "g", r) for r in range(W)]
    y.backward(gs[rank])
    first, n = shard(full, W, rank)
    ref = sum(g.float() for g in gs).narrow(dim, first, n)
    check_close(x.grad, ref, 2 * W * 2.0 ** -8 * sum(g.float().abs() for g in gs).narrow(dim, first, n) + 1e-30,
                "all_gather dx")


@pytest.mark.parametrize("dim, extra", [(0, 0), (0, 1), (1, 0)])
def test_reduce_scatter_grad(env, dim, extra):
    rank, W, seed = env
    full = 5 * W + extra
    shape = (full, 72) if dim == 0 else (3, full, 72)
    x = leaf(rand(shape, BF, seed, "x", rank))
    y = weave.reduce_scatter(x, dim)
    gs = [rand(tuple(shard(full, W, r)[1] if d == dim else s for d, s in enumerate(shape)), BF, seed, "g", r)
          for r in range(W)]
    y.backward(gs[rank])
    assert torch.equal(x.grad, torch.cat(gs, dim)), "reduce_scatter dx is the gathered gradient"


@pytest.mark.parametrize("direction", ["seq_to_head", "head_to_seq"])
def test_all_to_all_grad(env, direction):
    rank, W, seed = env
    B, H, D, s = 2, 4 * W, 64, 7
    S = s * W
    if direction == "seq_to_head":
        x = leaf(rand((B, s, H, D), BF, seed, "x", rank))
    else:
        x = leaf(rand((B, S, H // W, D), BF, seed, "x", rank))
    y = weave.all_to_all(x, direction)
    gs = [rand(y.shape, BF, seed, "g", r) for r in range(W)]
    y.backward(gs[rank])
    hs = H // W
    if direction == "seq_to_head":  # y_q[:, rows of r] = x_r[:, :, heads of q]
        ref = torch.cat([gs[q][:, rank * s:(rank + 1) * s] for q in range(W)], dim=2)
    else:  # y_q[:, :, heads of r] = x_r[:, rows of q]
        ref = torch.cat([gs[q][:, :, rank * hs:(rank + 1) * hs] for q in range(W)], dim=1)
    assert torch.equal(x.grad, ref), f"all_to_all {direction} dx is the inverse all_to_all"


# ---- the TP operators -----------------------------------------------------------------------

@pytest.mark.parametrize("reduce_op", ["sum", "avg"])
@pytest.mark.parametrize("extra", [0, 1])  # 1: ragged rows (all_gather + GEMM instead of the fused AG+GEMM)
def test_matmul_reduce_scatter_grads(env, reduce_op, extra):
    rank, W, seed = env
    S, K, N = 40 * W + extra, 72 * W, 104
    Af, Bf = rand((S, K), BF, seed, "A"), rand((N, K), BF, seed, "B")  # B: an nn.Linear weight
    kc = slice(rank * K // W, (rank + 1) * K // W)
    A, Bw = leaf(Af[:, kc].contiguous()), leaf(Bf[:, kc].contiguous())
    y = weave.matmul_reduce_scatter(A, Bw.t(), reduce_op)
    gs = [rand((shard(S, W, r)[1], N), BF, seed, "g", r) for r in range(W)]
    y.backward(gs[rank])
    G = torch.cat(gs).float() / (W if reduce_op == "avg" else 1)
    refs = ref_grads(lambda a, b: ((a @ b.t()) * G).sum(), A, Bw)
    check_bf16(A.grad, refs[0], gemm_size(N, G, Bw), "mrs dA")
    check_bf16(Bw.grad, refs[1], gemm_size(S, A, G), "mrs dB")


@pytest.mark.parametrize("return_A, grad_A", [(True, False), (True, True), (False, False)])
@pytest.mark.parametrize("nb", [1, 2])
def test_all_gather_matmul_grads(env, return_A, grad_A, nb):
    rank, W, seed = env
    s, K = 40, 72
    Ns = [104, 200][:nb]
    Afull = rand((s * W, K), BF, seed, "A")
    A = leaf(Afull[rank * s:(rank + 1) * s])
    Ws = [leaf(rand((n, K), BF, seed, "W", i, rank)) for i, n in enumerate(Ns)]  # this rank's weights
    ag, outs = weave.all_gather_matmul(A, [w.t() for w in Ws], return_A=return_A)
    gouts = [[rand((s * W, n), BF, seed, "g", i, r) for i, n in enumerate(Ns)] for r in range(W)]
    gA = [rand((s * W, K), BF, seed, "gA", r) for r in range(W)]
    tensors, grads = list(outs), list(gouts[rank])
    if grad_A:
        tensors.append(ag)
        grads.append(gA[rank])
    torch.autograd.backward(tensors, grads)
    # Every rank's weights, so that the reference sums every rank's loss.
    Wall = [[rand((n, K), BF, seed, "W", i, r) for i, n in enumerate(Ns)] for r in range(W)]

    def loss(a, *ws):
        total = 0
        for r in range(W):
            for i in range(nb):
                w = ws[i] if r == rank else Wall[r][i].float()
                total = total + ((a @ w.t()) * gouts[r][i].float()).sum()
            if grad_A:
                total = total + (a * gA[r].float()).sum()
        return total

    refs = ref_grads(loss, Afull, *Ws)
    dA = refs[0][rank * s:(rank + 1) * s]
    typical = sum(gemm_size(n, gouts[0][i], Wall[0][i]) for i, n in enumerate(Ns)) + (float(gA[0].float().std()) if grad_A else 0)
    check_bf16(A.grad, dA, typical, "agm dA", partials=W)
    for i, w in enumerate(Ws):
        check_bf16(w.grad, refs[1 + i], gemm_size(s * W, Afull, gouts[rank][i]), f"agm dW{i}")


def test_matmul_all_reduce_grads(env):
    rank, W, seed = env
    S, K, N = 45, 72 * W, 104
    Af, Bf = rand((S, K), BF, seed, "A"), rand((K, N), BF, seed, "B")
    kc = slice(rank * K // W, (rank + 1) * K // W)
    A, B = leaf(Af[:, kc].contiguous()), leaf(Bf[kc].contiguous())
    y = weave.matmul_all_reduce(A, B)
    gs = [rand((S, N), BF, seed, "g", r) for r in range(W)]
    y.backward(gs[rank])
    G = sum(g.float() for g in gs)
    refs = ref_grads(lambda a, b: ((a @ b) * G).sum(), A, B)
    check_bf16(A.grad, refs[0], gemm_size(N, G, B), "mar dA", partials=W)
    check_bf16(B.grad, refs[1], gemm_size(S, A, G), "mar dB", partials=W)


# ---- the MoE grouped GEMM ---------------------------------------------------------------------

@pytest.mark.parametrize("w_layout", ["NK", "KN"])
@pytest.mark.parametrize("capacity", [None, "tight"])
def test_grouped_mm_grads(env, w_layout, capacity):
    """dx (weave's grouped GEMM on w^T) and dw (torch._grouped_mm) against float32 autograd of the
    per-expert products: empty experts, ragged counts, rows past sum(counts) (no gradient) and a
    capacity below x's rows (dx zero past it), both w layouts."""
    rank, W, seed = env
    E, N, K = 6, 104, 136
    gen = torch.Generator().manual_seed(seed)
    counts = torch.randint(0, 120, (E,), generator=gen, dtype=torch.int32)
    counts[1] = 0
    counts[0] += 1
    total = int(counts.sum())
    R = total + 29
    cap = None if capacity is None else total + 11
    x = leaf(rand((R, K), BF, seed, "x"))
    ws = rand((E, N, K) if w_layout == "NK" else (E, K, N), BF, seed, "w")
    wl = leaf(ws)
    y = weave.grouped_mm(x, wl if w_layout == "NK" else wl.transpose(1, 2), counts.cuda(), capacity_rows=cap)
    g = rand(y.shape, BF, seed, "g")
    y.backward(g)
    assert weave.grouped_mm_status() is None

    def loss(xf, wf):
        wm = wf if w_layout == "NK" else wf.transpose(1, 2)
        off, out = 0, 0
        for e, c in enumerate(counts.tolist()):
            out = out + ((xf[off:off + c] @ wm[e].t()) * g[off:off + c].float()).sum()
            off += c
        return out

    rx, rw = ref_grads(loss, x, ws)
    assert bool((x.grad[total:] == 0).all()), "rows past sum(counts) got a gradient"
    check_bf16(x.grad, rx, gemm_size(N, g, ws), f"grouped_mm dx {w_layout} capacity {capacity}")
    check_bf16(wl.grad, rw, gemm_size(int(counts.max()), x, g), f"grouped_mm dw {w_layout} capacity {capacity}")
