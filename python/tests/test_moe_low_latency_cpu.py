"""CPU tests of weave.MoeLowLatency (the low-latency decode mode; no GPU needed; its errors without a
GPU are in test_moe_cpu.py's import test): the constructor's and the calls' argument errors (raised
before anything touches the GPU), torch.ops.weave.moe_low_latency's fake implementation (opcheck,
make_fx, torch.compile) on meta tensors, and the references the GPU tests use (below), checked on
the CPU. The C++ part is replaced by a stub here (its construction needs the GPU); ranks are
simulated as in test_moe_cpu.py, whose meta inputs and stub this file uses.

References shared with test_moe_low_latency_gpu.py and test_moe_low_latency_multirank.py:
- ll_receive_rows: rank d's receive buffer after a dispatch of every rank's tokens (kernels/moe/
  README.md, "Low-latency mode": local expert l's rows packed at [l, :count], the sources in rotated
  order d, d + 1, ... mod W, each source's rows in (token, slot) order);
- expert_outputs / check_ll_combine: expert outputs that depend on the row and its expert (y =
  bf16(row * c_e), c_e = 1 + e / 16, NaN past the counts), and the float64 reference of the combine
  over them at the tokens' home rank, out[t] = sum_j w[t, j] bf16(x[t] c_e), e = topk_idx[t, j], under
  2^-8 |r| + 2^-19 sum_j |w y| (the fp32 fma chain, then one bf16 rounding: test_moe_low_latency_gpu.cu's
  bound). A row read from the wrong place, of the wrong token or expert, or past a count, breaks it."""
import re

import pytest
import torch

import weave
from weave import moe
from moe_refs import grouped_rows, routing, tokens
from test_moe_cpu import FORWARD_ARGUMENT_ERRORS, _StubHandle, inputs, meta, stub_layer

BF, F16, F32, I32 = torch.bfloat16, torch.float16, torch.float32, torch.int32


# ---- the shared references


def ll_receive_rows(d: int, L: int, xs, idxs):
    """Rank d's receive buffer after a low-latency dispatch of every rank's (x, topk_idx) (xs[s],
    idxs[s]): (rows, counts), rows[l] the (counts[l], H) rows of local expert l (global d L + l):
    moe_refs.grouped_rows over the sources in rotated order (d first)."""
    W = len(xs)
    order = [(d + q) % W for q in range(W)]
    packed, counts = grouped_rows(d, L, [xs[s] for s in order], [idxs[s] for s in order])
    return list(packed.split(counts)), counts


def scale_of(e):
    """c_e = 1 + e / 16 (exact in fp32), for an expert id or a tensor of them."""
    return 1 + e / 16


def expert_outputs(rows: torch.Tensor, counts, rank: int, L: int) -> torch.Tensor:
    """y in the receive layout (L, S, H) of rows (L, S, H): bf16(rows[l, i] * c_e) for i < counts[l],
    e = rank L + l; NaN past the counts (the combine must not read there)."""
    y = torch.full_like(rows, float("nan"))
    for l, n in enumerate(counts):
        y[l, :n] = (rows[l, :n].float() * scale_of(rank * L + l)).to(BF)
    return y


def check_ll_combine(out: torch.Tensor, x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor, what: str) -> None:
    """The combine of expert_outputs' rows at the tokens' home rank against float64, every element
    within 2^-8 |r| + 2^-19 sum_j |w y| (NaN fails)."""
    T, H = x.shape
    assert out.shape == (T, H) and out.dtype == BF, f"{what}: {tuple(out.shape)} {out.dtype}"
    r = torch.zeros((T, H), dtype=torch.float64, device=x.device)
    a = torch.zeros_like(r)
    for j in range(idx.shape[1]):
        y = (x.float() * scale_of(idx[:, j:j + 1].float())).to(BF).double()  # the same fp32 product and rounding
        r += w[:, j:j + 1].double() * y
        a += (w[:, j:j + 1].double() * y).abs()
    bound = 2.0 ** -8 * r.abs() + 2.0 ** -19 * a + 2.0 ** -100
    err = (out.double() - r).abs()
    bad = ~(err <= bound)
    if bad.any():
        i = int(bad.flatten().nonzero()[0])
        t, c = divmod(i, H)
        raise AssertionError(f"{what}: {int(bad.sum())} of {out.numel()} combined outputs past the bound, first at "
                             f"token {t} col {c}: {float(out[t, c])} vs {float(r[t, c])} (bound {float(bound[t, c])})")


# ---- the shared references, on the CPU


def test_receive_rows_rotate_the_sources():
    """Rank 1 of 3: each expert's rows are rank 1's, then rank 2's, then rank 0's, in (token, slot)
    order within each; a token naming an expert twice has two rows."""
    H, L = 8, 2
    xs = [torch.arange(4 * H, dtype=F32).view(4, H).to(BF) + 100 * s for s in range(3)]
    idxs = [torch.tensor([[2, 3], [0, 2], [2, 2], [5, 1]], dtype=I32) for _ in range(3)]
    rows, counts = ll_receive_rows(1, L, xs, idxs)
    assert counts == [4 * 3, 1 * 3]  # expert 2: tokens 0, 1, 2, 2 of each rank; expert 3: token 0
    want = [xs[s][t] for s in (1, 2, 0) for t in (0, 1, 2, 2)]
    assert torch.equal(rows[0], torch.stack(want))
    assert torch.equal(rows[1], torch.stack([xs[s][0] for s in (1, 2, 0)]))


@pytest.mark.parametrize("W, k, kind", [(1, 1, "random"), (2, 8, "random"), (2, 2, "repeat"), (3, 4, "one")])
def test_combine_reference_on_cpu(W, k, kind):
    """check_ll_combine accepts the combine of expert_outputs' rows done by hand in fp32 (every
    (token, slot) read where ll_receive_rows put it on the expert's rank) and rejects a slot read
    from another token's row, a dropped slot and a row past the counts."""
    E, H, L, seed = 4 * W, 24, 4, 99
    T = [37 + 5 * s for s in range(W)]
    S = W * max(T)
    xs = [tokens(T[s], H, seed, s, device="cpu") for s in range(W)]
    routes = [routing(T[s], k, E, kind, seed, s, device="cpu") for s in range(W)]
    idxs, ws = [r[0] for r in routes], [r[1] for r in routes]
    ys, counts, where = [], [], {}  # where[(s, t, j)] = (d, l, row): the receive row of a (token, slot)
    for d in range(W):
        rows, n = ll_receive_rows(d, L, xs, idxs)
        buf = torch.full((L, S, H), float("nan"), dtype=BF)
        for l in range(L):
            buf[l, :n[l]] = rows[l]
            i = 0
            for q in range(W):
                src = (d + q) % W
                for t, j in (idxs[src].long() == d * L + l).nonzero().tolist():
                    where[(src, t, j)] = (d, l, i)
                    i += 1
        ys.append(expert_outputs(buf, n, d, L))
        counts.append(n)

    def combine(s, moved=None, row=None):
        """Rank s's combine; the slot `moved` read from `row` of its expert instead (None: dropped)."""
        out = torch.zeros((T[s], H), dtype=F32)
        for t in range(T[s]):
            for j in range(k):
                d, l, i = where[(s, t, j)]
                if (t, j) == moved:
                    if row is None:
                        continue
                    i = row
                out[t] += ws[s][t, j] * ys[d][l, i].float()
        return out.to(BF)

    for s in range(W):
        check_ll_combine(combine(s), xs[s], idxs[s], ws[s], f"rank {s}")
    s, slot = W - 1, (3, 0)
    d, l, i = where[(s, *slot)]
    other = [r for r in range(counts[d][l]) if not torch.equal(ys[d][l, r], ys[d][l, i])]
    bad = [("another token's row", other[0])] if other else []
    bad += [("a slot dropped", None), ("a row past the counts", S - 1)]
    for what, row in bad:
        with pytest.raises(AssertionError, match="past the bound"):
            check_ll_combine(combine(s, slot, row), xs[s], idxs[s], ws[s], what)


# ---- the Python API without a GPU (meta tensors and the C++ stub: test_moe_cpu.py's)


@pytest.fixture
def as_rank(monkeypatch):
    """as_rank(r, W): the default group as rank r of W sees it, and MoeLowLatency's C++ part stubbed."""
    return stub_layer(monkeypatch, moe.MoeLowLatency)


def ll(E=8, H=64, k=2, max_tokens=100, ffn=32, **kw):
    return weave.MoeLowLatency(E, H, k, max_tokens, ffn=ffn, **kw)


@pytest.mark.parametrize("kw, message", [
    (dict(E=7), "7 experts do not divide among the group's 2 ranks"),
    (dict(E=2048), "at most 1024 experts"),
    (dict(H=60), "hidden (60) and ffn (32) must be multiples of 8"),
    (dict(ffn=12), "hidden (64) and ffn (12) must be multiples of 8"),
    (dict(ffn=0), "ffn must be an int >= 1"),
    (dict(k=17), "topk = 17; the low-latency mode takes 1..16"),
    (dict(k=0), "topk must be an int >= 1"),
    (dict(max_tokens=257), "max_tokens = 257; the low-latency mode takes at most 256 tokens"),
    (dict(max_tokens=0), "max_tokens must be an int >= 1"),
    (dict(max_tokens=2.5), "max_tokens must be an int >= 1"),
    (dict(H=True), "hidden must be an int >= 1"),
])
def test_constructor_errors(as_rank, kw, message):
    as_rank(0, 2)
    with pytest.raises(ValueError, match=re.escape(message)):
        ll(**kw)


def test_layout_and_fake(as_rank):
    as_rank(1, 2)
    m = ll(E=8, H=64, k=2, max_tokens=100)
    assert m.local_experts == 4 and m.row_stride == 200 and not m.closed and m.handle > 0
    assert ll(E=8, ffn=None).ffn is None  # dispatch and combine only
    x, idx, w, up, down = inputs(T=37, L=4)
    out = m(x, idx, w, up, down)
    assert out.shape == (37, 64) and out.dtype == BF and out.device.type == "meta"
    assert m.forward(*inputs(T=0, L=4)).shape == (0, 64)  # a rank may have no tokens
    assert m(*inputs(T=100, L=4)).shape == (100, 64)
    torch.library.opcheck(torch.ops.weave.moe_low_latency.default, (x, idx, w, up, down, m.handle),
                          test_utils=("test_schema", "test_faketensor"))
    assert "weave.MoeLowLatency" in repr(m) and "ffn=32" in repr(m)


@pytest.mark.parametrize("mutate, message", FORWARD_ARGUMENT_ERRORS)
def test_forward_argument_errors(as_rank, mutate, message):
    m = ll(E=8, H=64, k=2, max_tokens=100)
    x, idx, w, up, down = inputs(T=10, L=8)
    args = dict(x=x, idx=idx, w=w, up=up, down=down)
    args.update(mutate)
    with pytest.raises(ValueError, match=re.escape(message)) as e:
        m(args["x"], args["idx"], args["w"], args["up"], args["down"])
    assert str(e.value).startswith("weave.MoeLowLatency.forward: "), str(e.value)  # named after this operator


def test_forward_without_ffn(as_rank):
    m = ll(ffn=None)
    with pytest.raises(ValueError, match=re.escape("made without ffn: pass ffn= to MoeLowLatency")):
        m(*inputs())


def test_dispatch_combine_argument_errors(as_rank):
    m = ll(E=8, H=64, k=2, max_tokens=100)  # world 1: y is (8, 100, 64)
    with pytest.raises(ValueError, match=re.escape("MoeLowLatency.dispatch: x has T = 101 tokens, more than the "
                                                   "layer's max_tokens = 100")):
        m.dispatch(meta(101, 64), meta(101, 2, dtype=I32))
    with pytest.raises(ValueError, match=re.escape("topk_idx has dtype torch.int64")):
        m.dispatch(meta(10, 64), meta(10, 2, dtype=torch.int64))
    with pytest.raises(ValueError, match=re.escape("x is not contiguous")):
        m.dispatch(meta(64, 10).t(), meta(10, 2, dtype=I32))
    with pytest.raises(ValueError, match=re.escape("a tensor is on meta")):  # only CUDA tensors run
        m.dispatch(meta(10, 64), meta(10, 2, dtype=I32))
    with pytest.raises(ValueError, match=re.escape("no dispatch to combine")):
        m.combine(meta(8, 100, 64), meta(10, 2, dtype=F32))
    m._pending = 10  # as after a dispatch of 10 tokens
    with pytest.raises(ValueError, match=re.escape("the last dispatch has not been combined yet")):
        m.dispatch(meta(10, 64), meta(10, 2, dtype=I32))
    with pytest.raises(ValueError, match=re.escape("y must be (L, row_stride, H) = (8, 100, 64), got (800, 64)")):
        m.combine(meta(800, 64), meta(10, 2, dtype=F32))
    with pytest.raises(ValueError, match=re.escape("y has dtype torch.float32")):
        m.combine(meta(8, 100, 64, dtype=F32), meta(10, 2, dtype=F32))
    with pytest.raises(ValueError, match=re.escape("y is not contiguous")):
        m.combine(meta(100, 8, 64).transpose(0, 1), meta(10, 2, dtype=F32))
    with pytest.raises(ValueError, match=re.escape("topk_weights must be (T, k) = (10, 2), got (11, 2)")):
        m.combine(meta(8, 100, 64), meta(11, 2, dtype=F32))
    with pytest.raises(ValueError, match=re.escape("a tensor is on meta")):
        m.combine(meta(8, 100, 64), meta(10, 2, dtype=F32))
    assert m._pending == 10  # nothing ran: the dispatch still waits for its combine


def test_closed_object(as_rank):
    m = ll()
    h = m.handle
    m.close()
    assert m.closed
    with pytest.raises(RuntimeError, match="closed"):
        m.dispatch(meta(10, 64), meta(10, 2, dtype=I32))
    with pytest.raises(RuntimeError, match="closed"):
        m.combine(meta(8, 100, 64), meta(10, 2, dtype=F32))
    with pytest.raises(RuntimeError, match="closed"):
        m.check()
    with pytest.raises(ValueError, match=re.escape(f"no live weave.MoeLowLatency has handle {h}")):
        m(*inputs())
    m.close()  # twice: nothing


def test_handles_are_per_kind(as_rank, monkeypatch):
    """A MoeLayer's handle is not a MoeLowLatency's (each operator takes its own kind)."""
    monkeypatch.setattr(moe.MoeLayer, "_make", lambda self, group: setattr(self, "_h", _StubHandle()))
    layer = weave.MoeLayer(8, 64, 32, 2, 100)
    with pytest.raises(ValueError, match=re.escape(f"no live weave.MoeLowLatency has handle {layer.handle}")):
        torch.ops.weave.moe_low_latency(*inputs(), layer.handle)
    m = ll()
    with pytest.raises(ValueError, match=re.escape(f"no live weave.MoeLayer has handle {m.handle}")):
        torch.ops.weave.moe_layer(*inputs(), m.handle)


def test_traces_and_compiles_on_fake_tensors(as_rank):
    from torch.fx.experimental.proxy_tensor import make_fx

    m = ll(E=8, H=64, k=2, max_tokens=100)

    def block(x, idx, w, up, down):
        return m(x, idx, w, up, down).float().sum(dim=1)

    args = (torch.randn(10, 64).to(BF), torch.zeros(10, 2, dtype=I32), torch.ones(10, 2),
            torch.randn(8, 64, 64).to(BF), torch.randn(8, 64, 32).to(BF))
    gm = make_fx(block, tracing_mode="fake")(*args)
    assert "weave.moe_low_latency.default" in [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]

    def unused(x, idx, w, up, down):  # a collective whose output is dropped stays in the graph
        m(x, idx, w, up, down)
        return x + 1

    gm = make_fx(unused, tracing_mode="fake")(*args)
    gm.graph.eliminate_dead_code()
    assert "weave.moe_low_latency.default" in [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]

    y = torch.compile(block, backend="eager", fullgraph=True)(*inputs(T=20))
    assert y.shape == (20,) and y.dtype == F32
