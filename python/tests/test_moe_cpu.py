"""CPU tests of weave.MoeLayer (no GPU needed): import and clear errors without a GPU (MoeLowLatency's
too; its other CPU tests are test_moe_low_latency_cpu.py's), the capacity
helpers against layout.hpp's formulas, the constructor's and the calls' argument errors (raised
before anything touches the GPU), and torch.ops.weave.moe_layer's fake implementation (opcheck,
make_fx, torch.compile) on meta tensors. The layer's C++ part is replaced by a stub here (its
construction needs the GPU); ranks are simulated as in test_cpu.py."""
import math
import re
import types

import pytest
import torch

import weave
from weave import _comm, moe
from refs import expect_no_gpu_errors

BF, F16, F32, I32 = torch.bfloat16, torch.float16, torch.float32, torch.int32


def meta(*shape, dtype=BF):
    return torch.empty(shape, dtype=dtype, device="meta")


class _StubHandle:
    """Stands for weave._C.MoeLayer (made on the GPU): only what the argument checks look at."""
    closed = False
    expert_input = 0
    expert_output = 0

    def close(self):
        self.closed = True


def stub_layer(monkeypatch, cls, **comm):
    """as_rank(r, W) for the layer class cls: the default group as rank r of W sees it, and cls's C++
    part stubbed (its communicator a namespace of device 0 and `comm`). Starts as rank 0 of 1."""

    def make(self, group):
        self._h = _StubHandle()
        self.comm = types.SimpleNamespace(device=0, **comm)

    monkeypatch.setattr(cls, "_make", make)

    def set_rank(rank, world):
        monkeypatch.setattr(_comm, "group_rank_world", lambda name: (rank, world))

    set_rank(0, 1)
    return set_rank


@pytest.fixture
def as_rank(monkeypatch):
    """as_rank(r, W): the default group as rank r of W sees it, and MoeLayer's C++ part stubbed."""
    return stub_layer(monkeypatch, moe.MoeLayer, is_symmetric=lambda t: False)


def layer(E=8, H=64, F=32, k=2, max_tokens=100, **kw):
    return weave.MoeLayer(E, H, F, k, max_tokens, **kw)


def inputs(T=10, H=64, k=2, L=8, F=32):
    """x, topk_idx, topk_weights, w_up, w_down on the meta device."""
    return meta(T, H), meta(T, k, dtype=I32), meta(T, k, dtype=F32), meta(L, 2 * F, H), meta(L, H, F)


def test_import_and_clear_errors_without_gpu():
    code = """
import torch, weave
assert not torch.cuda.is_available()
assert weave.moe_capacity(100, 2, 8, 1.0) == 200 and weave.moe_worst_case_rows(100, 2, 8) == 200
calls = {
    "MoeLayer": lambda: weave.MoeLayer(8, 64, 32, 2, 100),
    "moe_layer": lambda: torch.ops.weave.moe_layer(torch.ones(4, 64, dtype=torch.bfloat16),
                                                   torch.zeros(4, 2, dtype=torch.int32), torch.ones(4, 2),
                                                   torch.ones(8, 64, 64, dtype=torch.bfloat16),
                                                   torch.ones(8, 64, 32, dtype=torch.bfloat16), 1),
    "MoeLowLatency": lambda: weave.MoeLowLatency(8, 64, 2, 100, ffn=32),
    "moe_low_latency": lambda: torch.ops.weave.moe_low_latency(
        torch.ones(4, 64, dtype=torch.bfloat16), torch.zeros(4, 2, dtype=torch.int32), torch.ones(4, 2),
        torch.ones(8, 64, 64, dtype=torch.bfloat16), torch.ones(8, 64, 32, dtype=torch.bfloat16), 1),
}
"""
    expect_no_gpu_errors(code)


def _capacity(T, k, E, W, slack):
    """kernels/moe/layout.hpp's receive_capacity, written out."""
    L = E // W
    even = -(-T * k // E)
    per = math.ceil(slack * even)
    return min(W * L * per, W * T * min(k, L))


@pytest.mark.parametrize("T, k, E, W, slack", [
    (4096, 8, 64, 8, 1.0), (4096, 8, 64, 8, 1.25), (100, 2, 8, 2, 1.5), (10, 8, 16, 1, 2.0), (1, 1, 1, 1, 1.0),
    (333, 6, 160, 8, 1.1), (16384, 8, 256, 8, 2.0), (0, 4, 8, 2, 1.0), (7, 8, 4, 4, 3.0),
])
def test_capacity_helpers(T, k, E, W, slack):
    assert weave.moe_capacity(T, k, E, slack, world=W) == _capacity(T, k, E, W, slack)
    assert weave.moe_worst_case_rows(T, k, E, world=W) == W * T * min(k, E // W)


def test_capacity_hand_values(as_rank):
    # Balanced DeepSeek-like: 64 experts on 8 ranks, 4096 tokens, k = 8: 512 rows per (source, expert).
    assert weave.moe_capacity(4096, 8, 64, 1.0, world=8) == 8 * 8 * 512
    assert weave.moe_capacity(100, 2, 8, 1.5, world=2) == 304  # ceil(1.5 * 25) = 38 per pair, 8 pairs
    assert weave.moe_capacity(10, 8, 16, 2.0) == 80  # clamped to the worst case, 10 x 8 (world 1)
    assert weave.moe_worst_case_rows(10, 8, 16, world=8) == 160  # 8 ranks x 10 tokens x min(8, 2)
    as_rank(1, 4)  # the world comes from the default group
    assert weave.moe_capacity(100, 2, 8) == _capacity(100, 2, 8, 4, moe.DEFAULT_SLACK)
    assert weave.moe_worst_case_rows(100, 2, 8) == 4 * 100 * 2
    m = layer(E=8, k=2, max_tokens=100)
    assert m.world == 4 and m.rank == 1 and m.local_experts == 2
    assert m.capacity == m.capacity_for() == _capacity(100, 2, 8, 4, moe.DEFAULT_SLACK)
    assert m.capacity_for(50, slack=1.0) == _capacity(50, 2, 8, 4, 1.0)
    assert m.worst_case_rows() == 4 * 100 * 2 and m.worst_case_rows(10, 1) == 40
    assert layer(capacity=17).capacity == 17
    assert layer(slack=1.0).capacity == _capacity(100, 2, 8, 4, 1.0)


@pytest.mark.parametrize("call, message", [
    (lambda: weave.moe_capacity(10, 2, 7, world=2), "7 experts do not divide among 2 ranks"),
    (lambda: weave.moe_capacity(10, 0, 8), "topk must be an int >= 1"),
    (lambda: weave.moe_capacity(-1, 2, 8), "tokens must be an int >= 0"),
    (lambda: weave.moe_capacity(10, 2, 8, 0.0), "slack must be a positive number"),
    (lambda: weave.moe_capacity(2 ** 30, 16, 1024, world=8), "does not fit in int32"),
    (lambda: weave.moe_worst_case_rows(10, 2, 8, world=3), "do not divide among 3 ranks"),
])
def test_capacity_errors(call, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        call()


@pytest.mark.parametrize("kw, message", [
    (dict(E=7), "7 experts do not divide among the group's 2 ranks"),
    (dict(E=2048), "at most 1024 experts"),
    (dict(H=60), "hidden (60) and ffn (32) must be multiples of 8"),
    (dict(F=12), "hidden (64) and ffn (12) must be multiples of 8"),
    (dict(k=17), "topk = 17"),
    (dict(k=0), "topk must be an int >= 1"),
    (dict(max_tokens=0), "max_tokens must be an int >= 1"),
    (dict(max_tokens=2.5), "max_tokens must be an int >= 1"),
    (dict(H=True), "hidden must be an int >= 1"),
    (dict(capacity=0), "capacity must be an int in 1..2^31-1"),
    (dict(capacity=2 ** 31), "capacity must be an int in 1..2^31-1"),
    (dict(slack=-1.0), "slack must be a positive number"),
    (dict(max_tokens=2 ** 28, k=16), "max_tokens x topk"),
])
def test_constructor_errors(as_rank, kw, message):
    as_rank(0, 2)
    with pytest.raises(ValueError, match=re.escape(message)):
        layer(**kw)


def test_forward_shapes_and_fake(as_rank):
    as_rank(1, 2)
    m = layer(E=8, H=64, F=32, k=2, max_tokens=100)  # L = 4 experts on this rank
    assert m.local_experts == 4 and not m.closed and m.handle > 0
    x, idx, w, up, down = inputs(T=37, L=4)
    out = m(x, idx, w, up, down)
    assert out.shape == (37, 64) and out.dtype == BF and out.device.type == "meta"
    out = m.forward(*inputs(T=0, L=4))  # a rank may have no tokens
    assert out.shape == (0, 64)
    assert m(*inputs(T=100, L=4)).shape == (100, 64)
    torch.library.opcheck(torch.ops.weave.moe_layer.default, (x, idx, w, up, down, m.handle),
                          test_utils=("test_schema", "test_faketensor"))
    assert "weave.MoeLayer" in repr(m)


# The forward's argument errors on (T, H, k, L, F) = (10, 64, 2, 8, 32), max_tokens 100 (MoeLayer's and
# MoeLowLatency's: test_moe_low_latency_cpu.py runs them too).
FORWARD_ARGUMENT_ERRORS = [
    (dict(x=meta(10, 64, dtype=F16)), "x has dtype torch.float16"),
    (dict(x=meta(64, 10).t()), "x is not contiguous"),
    (dict(x=meta(10, 72)), "x has 72 columns but the layer's hidden size is 64"),
    (dict(x=meta(10, 64, 1)), "x must have 2 dimensions"),
    (dict(x=meta(101, 64)), "T = 101 tokens, more than the layer's max_tokens = 100"),
    (dict(idx=meta(10, 2, dtype=torch.int64)), "topk_idx has dtype torch.int64"),
    (dict(idx=meta(10, 3, dtype=I32)), "topk_idx must be (T, k) = (10, 2), got (10, 3)"),
    (dict(idx=meta(2, 10, dtype=I32).t()), "topk_idx is not contiguous"),
    (dict(w=meta(10, 2, dtype=BF)), "topk_weights has dtype torch.bfloat16"),
    (dict(w=meta(10, 1, dtype=F32)), "topk_weights must be (T, k) = (10, 2), got (10, 1)"),
    (dict(w=meta(2, 10, dtype=F32).t()), "topk_weights is not contiguous"),
    (dict(up=meta(8, 64, 64, dtype=F32)), "w_up has dtype torch.float32"),
    (dict(up=meta(8, 32, 64)), "w_up must be (L, 2F, H): gate rows then up rows = (8, 64, 64)"),
    (dict(up=meta(8, 64, 64).transpose(1, 2).contiguous().transpose(1, 2)), "w_up is not contiguous"),
    (dict(down=meta(8, 32, 64)), "w_down must be (L, H, F) = (8, 64, 32)"),
    (dict(down=meta(8, 64, 32, dtype=F16)), "w_down has dtype torch.float16"),
    (dict(idx=torch.zeros(10, 2, dtype=I32)), "topk_idx is on cpu"),
    (dict(down=torch.zeros(8, 64, 32, dtype=BF)), "w_down is on cpu"),
]


@pytest.mark.parametrize("mutate, message", FORWARD_ARGUMENT_ERRORS)
def test_forward_argument_errors(as_rank, mutate, message):
    m = layer(E=8, H=64, F=32, k=2, max_tokens=100)
    x, idx, w, up, down = inputs(T=10, L=8)
    args = dict(x=x, idx=idx, w=w, up=up, down=down, **{})
    args.update(mutate)
    with pytest.raises(ValueError, match=re.escape(message)):
        m(args["x"], args["idx"], args["w"], args["up"], args["down"])


def test_dispatch_combine_argument_errors(as_rank):
    m = layer(E=8, H=64, F=32, k=2, max_tokens=100, capacity=300)
    with pytest.raises(ValueError, match=re.escape("T = 101 tokens, more than the layer's max_tokens")):
        m.dispatch(meta(101, 64), meta(101, 2, dtype=I32))
    with pytest.raises(ValueError, match=re.escape("topk_idx has dtype torch.int64")):
        m.dispatch(meta(10, 64), meta(10, 2, dtype=torch.int64))
    with pytest.raises(ValueError, match=re.escape("a tensor is on meta")):  # only CUDA tensors run
        m.dispatch(meta(10, 64), meta(10, 2, dtype=I32))
    with pytest.raises(ValueError, match=re.escape("no dispatch on this layer yet")):
        m.combine(meta(300, 64), meta(10, 2, dtype=F32))
    with pytest.raises(ValueError, match=re.escape("y must be capacity x H = (300, 64), got (200, 64)")):
        m.combine(meta(200, 64), meta(10, 2, dtype=F32))
    with pytest.raises(ValueError, match=re.escape("y has dtype torch.float32")):
        m.combine(meta(300, 64, dtype=F32), meta(10, 2, dtype=F32))
    m._last_T = 10  # as after a dispatch of 10 tokens
    with pytest.raises(ValueError, match=re.escape("topk_weights must be (T, k) = (10, 2), got (11, 2)")):
        m.combine(meta(300, 64), meta(11, 2, dtype=F32))


def test_closed_layer(as_rank):
    m = layer()
    h = m.handle
    m.close()
    assert m.closed
    with pytest.raises(RuntimeError, match="closed"):
        m.dispatch(meta(10, 64), meta(10, 2, dtype=I32))
    with pytest.raises(RuntimeError, match="closed"):
        m.check()
    with pytest.raises(ValueError, match=re.escape(f"no live weave.MoeLayer has handle {h}")):
        m(*inputs())
    m.close()  # twice: nothing


def test_traces_and_compiles_on_fake_tensors(as_rank):
    from torch.fx.experimental.proxy_tensor import make_fx

    m = layer(E=8, H=64, F=32, k=2, max_tokens=100)

    def block(x, idx, w, up, down):
        y = m(x, idx, w, up, down)
        return y.float().sum(dim=1)

    args = (torch.randn(10, 64).to(BF), torch.zeros(10, 2, dtype=I32), torch.ones(10, 2),
            torch.randn(8, 64, 64).to(BF), torch.randn(8, 64, 32).to(BF))
    gm = make_fx(block, tracing_mode="fake")(*args)
    called = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    assert "weave.moe_layer.default" in called

    def unused(x, idx, w, up, down):  # a collective whose output is dropped stays in the graph
        m(x, idx, w, up, down)
        return x + 1

    gm = make_fx(unused, tracing_mode="fake")(*args)
    gm.graph.eliminate_dead_code()
    assert "weave.moe_layer.default" in [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]

    y = torch.compile(block, backend="eager", fullgraph=True)(*inputs(T=20))
    assert y.shape == (20,) and y.dtype == F32


def _emulate_layer(x, idx, w, up, down):
    """The layer's roundings on the CPU (float32 matmuls for the tensor cores' fp32 accumulation):
    G = bf16(x Wup^T), H = bf16(silu(g) u), Y = bf16(H Wd^T) per (token, slot), out = bf16(sum_j w_j y_j)."""
    T, H = x.shape
    k, F = idx.shape[1], up.shape[1] // 2
    ys = torch.zeros((T, k, H), dtype=F32)
    for e in range(up.shape[0]):
        t, j = (idx.long() == e).nonzero(as_tuple=True)
        if t.numel():
            G = (x[t].float() @ up[e].float().T).to(BF).float()
            h = (torch.nn.functional.silu(G[:, :F]) * G[:, F:]).to(BF).float()
            ys[t, j] = (h @ down[e].float().T).to(BF).float()
    acc = torch.zeros((T, H), dtype=F32)
    for j in range(k):
        acc = acc + w[:, j:j + 1] * ys[:, j]
    return acc.to(BF)


@pytest.mark.parametrize("k, kind", [(1, "one"), (2, "repeat"), (4, "random")])
def test_reference_bound_on_cpu(k, kind):
    """moe_refs' float64 reference and bound (used by the GPU tests) accept an emulation of the
    kernels' roundings and reject an output missing one slot's expert or with two slots' weights
    swapped."""
    from moe_refs import check_moe, expert_weights, grouped_rows, routing, tokens

    E, H, F, T, seed = 8, 64, 48, 60, 1234
    up, down = expert_weights(E, H, F, seed, device="cpu")
    x = tokens(T, H, seed, device="cpu")
    idx, w = routing(T, k, E, kind, seed, hot=3, device="cpu")
    if kind == "one":
        assert bool((idx[:, 0] == 3).all())
    if kind == "random":
        assert all(len(set(r)) == k for r in idx.tolist())  # distinct experts per token
    assert torch.allclose(w.sum(dim=1), torch.ones(T))
    out = _emulate_layer(x, idx, w, up, down)
    check_moe(out, x, idx, w, up, down, "emulated layer")
    wrong = w.clone()
    wrong[5, 0] = 0.0  # token 5 without its first slot's expert
    with pytest.raises(AssertionError, match="outputs past the bound"):
        check_moe(_emulate_layer(x, idx, wrong, up, down), x, idx, w, up, down, "a slot dropped")
    if k >= 2 and kind != "repeat":
        swapped = w.clone()
        swapped[9] = w[9].flip(0)
        with pytest.raises(AssertionError, match="outputs past the bound"):
            check_moe(_emulate_layer(x, idx, swapped, up, down), x, idx, w, up, down, "weights swapped")
    # The receiver layout of two ranks' rows (grouped_rows): rank d's experts in order, then sources.
    x2 = tokens(T, H, seed, 1, device="cpu")
    idx2, _ = routing(T, k, E, "random", seed, 1, device="cpu")
    rows, counts = grouped_rows(1, 4, [x, x2], [idx, idx2])
    assert counts == [int((i.long() == e).sum()) + int((i2.long() == e).sum())
                      for e in range(4, 8) for i, i2 in [(idx, idx2)]]
    first = [(t, j) for t in range(T) for j in range(k) if int(idx[t, j]) == 4]
    assert torch.equal(rows[:len(first)], x[[t for t, _ in first]])
