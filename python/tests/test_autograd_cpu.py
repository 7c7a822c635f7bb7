"""CPU tests of the autograd pieces (no GPU): the unfused attention backward (weave.autograd's
helpers called directly on float64 CPU tensors) against torch autograd of a reference attention;
ring and Ulysses backward with their collectives simulated by W threads of one process; the linear
modules and the differentiable attention functions on the meta device (shapes of outputs and
gradients, ranks simulated); initialisation and sharding against nn.Linear; argument errors."""
import math
import re
import threading
import types

import pytest
import torch
from torch import nn

import weave
from weave import _comm
from weave import autograd as wag

F64, BF = torch.float64, torch.bfloat16


@pytest.fixture
def as_rank(monkeypatch):
    """as_rank(r, W): shapes as rank r of a world of W sees them (fakes need no communicator)."""

    def set_rank(rank, world):
        monkeypatch.setattr(_comm, "group_rank_world", lambda name: (rank, world))

    return set_rank


def reference(q, k, v, causal, scale=None, q_pos=None):
    """(o, lse) of attention in plain torch ops (autograd's reference): q (B, L, Hq, D) with rows at
    positions q_pos (default 0..L-1), k, v (B, S, Hkv, D)."""
    B, L, Hq, D = q.shape
    G = Hq // k.shape[2]
    kf, vf = (t.transpose(1, 2).repeat_interleave(G, dim=1) for t in (k, v))
    s = q.transpose(1, 2) @ kf.transpose(-1, -2) * (scale or 1 / math.sqrt(D))
    if causal:
        pos = torch.arange(L) if q_pos is None else torch.as_tensor(q_pos)
        s = s.masked_fill(torch.arange(k.shape[1])[None, :] > pos[:, None], float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    return (torch.softmax(s, dim=-1) @ vf).transpose(1, 2), lse


def inputs(B, L, S, Hq, Hkv, D, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, do = (torch.randn(B, L, Hq, D, generator=g, dtype=F64) for _ in range(2))
    k, v = (torch.randn(B, S, Hkv, D, generator=g, dtype=F64) for _ in range(2))
    return q, k, v, do, torch.randn(B, Hq, L, generator=g, dtype=F64)


def reference_grads(q, k, v, do, dlse, causal, scale=None, q_pos=None):
    """(o, lse, dq, dk, dv) from torch autograd of `reference` for the loss sum(o do) + sum(lse dlse)."""
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    o, lse = reference(q, k, v, causal, scale, q_pos)
    loss = (o * do).sum() + (0 if dlse is None else (lse * dlse).sum())
    loss.backward()
    return o.detach(), lse.detach(), q.grad, k.grad, v.grad


def assert_close(out, ref, what):
    assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-9, msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("Hq, Hkv", [(3, 3), (4, 2), (6, 1)])
@pytest.mark.parametrize("with_lse, with_dlse, chunk", [(True, False, None), (False, False, 300), (True, True, 100)])
def test_attention_backward(causal, Hq, Hkv, with_lse, with_dlse, chunk):
    q, k, v, do, dlse = inputs(2, 37, 37, Hq, Hkv, 8)
    dlse = dlse if with_dlse else None
    _, lse, *ref = reference_grads(q, k, v, do, dlse, causal, 0.3)
    got = wag.attention_backward(q, k, v, do, lse if with_lse else None, causal, 0.3, dlse=dlse, chunk_elems=chunk)
    for g, r, name in zip(got, ref, "qkv"):
        assert g.dtype == F64
        assert_close(g, r, f"d{name}")


def test_attention_backward_positions():
    """Query rows at arbitrary global positions (a ring rank's rows) against the whole sequence."""
    S = 41
    pos = list(range(5, 15)) + list(range(30, 41)) + [0, 2]
    q, k, v, do, dlse = inputs(1, len(pos), S, 4, 2, 8, seed=3)
    for causal in (False, True):
        _, lse, *ref = reference_grads(q, k, v, do, dlse, causal, q_pos=pos)
        got = wag.attention_backward(q, k, v, do, lse, causal, None, q_pos=pos, dlse=dlse, chunk_elems=40)
        for g, r, name in zip(got, ref, "qkv"):
            assert_close(g, r, f"d{name} causal={causal}")


def test_segments():
    assert wag._segments([0, 1, 2, 3, 4], 2) == [(0, 2), (2, 4), (4, 5)]
    assert wag._segments([5, 6, 0, 1, 2], 10) == [(0, 2), (2, 5)]
    assert wag._segments([3], 1) == [(0, 1)]


# ---------------------------------------------------------------------------------------------
# A group of W ranks simulated by W threads: each op exchanges every rank's input, then computes
# this rank's output as the documented collective would.


class SimGroup:
    def __init__(self, world):
        self.world = world
        self.barrier = threading.Barrier(world, timeout=120)
        self.slots = [None] * world

    def exchange(self, rank, x):
        self.slots[rank] = x
        self.barrier.wait()
        xs = list(self.slots)
        self.barrier.wait()
        return xs

    def run(self, fn):
        """[fn(SimOps of rank r) for every rank], run concurrently."""
        out, errors = [None] * self.world, []

        def body(r):
            try:
                out[r] = fn(SimOps(self, r))
            except BaseException as e:  # noqa: BLE001 (re-raised below)
                errors.append(e)
                self.barrier.abort()

        threads = [threading.Thread(target=body, args=(r,)) for r in range(self.world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return out


class SimOps:
    """all_gather, reduce_scatter and all_to_all with torch.ops.weave's signatures, for one rank."""

    def __init__(self, group: SimGroup, rank: int):
        self.g, self.rank, self.world = group, rank, group.world

    def _shard(self, n):
        return weave._lib.lib().shard(n, self.world, self.rank)

    def all_gather(self, x, dim, full_size, group):
        out = torch.cat(self.g.exchange(self.rank, x), dim=dim)
        assert full_size < 0 or out.shape[dim] == full_size
        return out

    def reduce_scatter(self, x, dim, group):
        total = sum(self.g.exchange(self.rank, x))
        return total.narrow(dim, *self._shard(x.shape[dim]))

    def all_to_all(self, x, direction, seq_len, group):
        assert x.is_contiguous()
        xs = self.g.exchange(self.rank, x)
        if direction == "seq_to_head":
            hp = x.shape[2] // self.world
            return torch.cat([y[:, :, self.rank * hp:(self.rank + 1) * hp] for y in xs], dim=1)
        first, rows = self._shard(x.shape[1])
        return torch.cat([y[:, first:first + rows] for y in xs], dim=2)


@pytest.mark.parametrize("world, S", [(2, 37), (3, 40), (2, 8)])
@pytest.mark.parametrize("sharding", ["zigzag", "contiguous"])
@pytest.mark.parametrize("causal", [False, True])
def test_ring_backward_simulated(world, S, sharding, causal):
    zigzag = sharding == "zigzag"
    q, k, v, do, dlse = inputs(2, S, S, 4, 2, 8, seed=S)
    _, lse, dq, dk, dv = reference_grads(q, k, v, do, dlse, causal)
    positions = wag.ring_positions(S, world, zigzag)
    assert sorted(p for ps in positions for p in ps) == list(range(S))

    def rank_fn(ops):
        p = positions[ops.rank]
        mine = [t[:, p].contiguous() for t in (q, k, v, do)]
        return wag.ring_backward(*mine[:3], mine[3], lse[:, :, p], causal, None, S, zigzag, ops.rank, world, "sim",
                                 dlse=dlse[:, :, p], ops=ops)

    for r, got in enumerate(SimGroup(world).run(rank_fn)):
        p = positions[r]
        for g, ref, name in zip(got, (dq, dk, dv), "qkv"):
            assert_close(g, ref[:, p], f"rank {r} d{name}")


def test_ring_positions_match_ring_chunks(as_rank):
    for world in (1, 2, 3, 4, 8):
        for S in (2 * world, 2 * world + 1, 101, 1000, 4099):
            for zigzag, sharding in ((True, "zigzag"), (False, "contiguous")):
                positions = wag.ring_positions(S, world, zigzag)
                for r in range(world):
                    as_rank(r, world)
                    want = [i for b, n in weave.ring_chunks(S, sharding) for i in range(b, b + n)]
                    assert positions[r] == want, f"S={S} W={world} {sharding} rank {r}"


@pytest.mark.parametrize("world, S, Hq, Hkv", [(2, 37, 4, 2), (2, 37, 4, 1), (3, 40, 6, 3), (3, 40, 6, 2),
                                               (3, 41, 3, 1)])
@pytest.mark.parametrize("causal", [False, True])
def test_ulysses_backward_simulated(world, S, Hq, Hkv, causal):
    q, k, v, do, _ = inputs(2, S, S, Hq, Hkv, 8, seed=S + Hkv)
    _, _, dq, dk, dv = reference_grads(q, k, v, do, None, causal, 0.25)
    lib = weave._lib.lib()

    def rank_fn(ops):
        first, rows = lib.shard(S, world, ops.rank)
        mine = [t[:, first:first + rows].contiguous() for t in (q, k, v, do)]
        return wag.ulysses_backward(*mine, causal, 0.25, S, ops.rank, world, "sim", ops=ops)

    for r, got in enumerate(SimGroup(world).run(rank_fn)):
        first, rows = lib.shard(S, world, r)
        for g, ref, name in zip(got, (dq, dk, dv), "qkv"):
            assert_close(g, ref[:, first:first + rows], f"rank {r} d{name}")


# ---------------------------------------------------------------------------------------------
# Modules and functions on the meta device (the operators' fake implementations), ranks simulated.


def meta(*shape, grad=True):
    return torch.empty(shape, dtype=BF, device="meta", requires_grad=grad)


def grads_of(y, *leaves):
    y.float().sum().backward()
    return [t.grad for t in leaves]


def test_column_parallel_on_meta(as_rank):
    as_rank(1, 2)
    m = weave.nn.ColumnParallelLinear(264, 208, device="meta")
    assert m.weight.shape == (104, 264) and m.bias.shape == (104,) and m.weight.dtype == BF
    x = meta(67, 264)
    y = m(x)
    assert y.shape == (134, 104) and y.dtype == BF
    dx, dw, db = grads_of(y, x, m.weight, m.bias)
    assert dx.shape == x.shape and dw.shape == m.weight.shape and db.shape == m.bias.shape and dw.dtype == BF
    m = weave.nn.ColumnParallelLinear(264, 208, bias=False, device="meta", gather_output=True,
                                      save_gathered_input=False)
    assert m.bias is None
    x = meta(5, 3, 264)  # (s, b, h): Megatron's layout
    y = m(x)
    assert y.shape == (10, 3, 208)
    dx, dw = grads_of(y, x, m.weight)
    assert dx.shape == x.shape and dw.shape == (104, 264)
    as_rank(2, 3)  # ragged features: 20 over 3 ranks is 7, 7, 6
    assert weave.nn.ColumnParallelLinear(64, 20, device="meta").weight.shape == (6, 64)


def test_operator_grads_on_meta(as_rank):
    """Every differentiable torch.ops.weave operator (weave/op_grads.py) on meta tensors as rank 1 of
    2: each input's gradient has the input's shape and dtype, through every backward branch."""
    as_rank(1, 2)
    g = _comm.SINGLE
    ops = torch.ops.weave
    x = meta(6, 8)
    (dx,) = grads_of(ops.all_reduce(x, g), x)
    assert dx.shape == x.shape
    x = meta(5, 8)  # rank 1's shard of 11 rows
    (dx,) = grads_of(ops.all_gather(x, 0, 11, g), x)
    assert dx.shape == x.shape
    x = meta(11, 3, 8)
    (dx,) = grads_of(ops.reduce_scatter(x, 0, g), x)
    assert dx.shape == x.shape
    q = meta(1, 4, 2, 64)
    (dq,) = grads_of(ops.all_to_all(q, "seq_to_head", -1, g), q)
    assert dq.shape == q.shape
    q = meta(1, 8, 1, 64)
    (dq,) = grads_of(ops.all_to_all(q, "head_to_seq", -1, g), q)
    assert dq.shape == q.shape
    a, w = meta(3, 6, 16), meta(8, 16)
    bias = torch.empty(8, dtype=torch.float32, device="meta", requires_grad=True)
    da, dw, db = grads_of(ops.matmul(a, w.t(), bias, torch.float32), a, w, bias)
    assert (da.shape, dw.shape, db.shape, da.dtype, db.dtype) == (a.shape, w.shape, bias.shape, BF, torch.float32)
    at = meta(16, 8)  # A given as the transpose of a K x M matrix
    b = meta(16, 24)
    da, db = grads_of(ops.matmul(at.t(), b), at, b)
    assert da.shape == at.shape and db.shape == b.shape
    for rows in (12, 13):  # equal shards: the fused AG+GEMM; ragged: all_gather + GEMM
        a, w = meta(rows, 16), meta(8, 16)
        for op in ("sum", "avg"):
            a.grad = w.grad = None
            da, dw = grads_of(ops.matmul_reduce_scatter(a, w.t(), op, 0, g), a, w)
            assert da.shape == a.shape and dw.shape == w.shape
    a, w = meta(6, 16), meta(8, 16)
    da, dw = grads_of(ops.matmul_all_reduce(a, w.t(), g), a, w)
    assert da.shape == a.shape and dw.shape == w.shape
    for return_a in (True, False):
        a, w1, w2 = meta(6, 16), meta(8, 16), meta(24, 16)
        ag, (o1, o2) = ops.all_gather_matmul(a, [w1.t(), w2.t()], 0, g, return_A=return_a)
        total = o1.float().sum() + o2.float().sum() + (ag.float().sum() if return_a else 0)
        total.backward()
        assert a.grad.shape == a.shape and w1.grad.shape == w1.shape and w2.grad.shape == w2.shape
    a, w = meta(6, 16), meta(8, 16)
    _, (o,) = ops.all_gather_matmul(a, [w.t()], 0, g, return_A=False)
    da, dw = grads_of(o, a, w)  # one B, no gradient of the gathered A: the fused GEMM+RS
    assert da.shape == a.shape and dw.shape == w.shape


@pytest.mark.parametrize("S", [134, 135])  # 135: ragged rows, the backward's all_gather + matmul
def test_row_parallel_on_meta(as_rank, S):
    as_rank(0, 2)
    m = weave.nn.RowParallelLinear(208, 264, device="meta")
    assert m.weight.shape == (264, 104) and m.bias.shape == (264,)
    x = meta(S, 104)
    y = m(x)
    assert y.shape == ((S + 1) // 2, 264)
    dx, dw, db = grads_of(y, x, m.weight, m.bias)
    assert dx.shape == x.shape and dw.shape == m.weight.shape and db.shape == (264,)
    x = meta(6, 5, 104)
    assert m(x).shape == (3, 5, 264)
    with torch.no_grad():
        assert m(x).requires_grad is False


def test_attention_functions_on_meta(as_rank):
    as_rank(1, 2)
    q, k, v = meta(2, 50, 4, 64), meta(2, 50, 2, 64), meta(2, 50, 2, 64)
    o, lse = weave.attention(q, k, v, causal=True)
    assert o.requires_grad and lse.requires_grad
    assert [g.shape for g in grads_of(o + lse.mean(), q, k, v)] == [q.shape, k.shape, v.shape]
    for f in (lambda: weave.ring_attention(q, k, v, True, seq_len=101)[0],
              lambda: weave.ring_attention(q, k, v, False, sharding="contiguous")[0],
              lambda: weave.ulysses_attention(q, k, v, True, seq_len=100),
              lambda: weave.ulysses_attention(q, meta(2, 50, 1, 64), meta(2, 50, 1, 64), False)):
        for t in (q, k, v):
            t.grad = None
        out = f()
        dq, dk, dv = grads_of(out, q, k, v)
        assert dq.shape == q.shape and dq.dtype == BF
        assert dk is None or dk.shape == k.shape
    with torch.no_grad():
        assert not weave.attention(q, k, v)[0].requires_grad


class MatmulSpy:
    """torch.ops.weave with its matmul calls recorded (A's shape and whether A is the transpose of a
    contiguous matrix, i.e. read in place as K x M)."""

    def __init__(self):
        self.calls = []
        self.matmul = types.SimpleNamespace(default=self._matmul)  # weave calls the .default overload

    def __getattr__(self, name):
        return getattr(torch.ops.weave, name)

    def _matmul(self, A, B, *args):
        self.calls.append((tuple(A.shape), not A.is_contiguous() and A.t().is_contiguous()))
        return torch.ops.weave.matmul.default(A, B, *args)


@pytest.mark.parametrize("layer", ["column", "row"])
def test_weight_grad_reads_dy_transposed_in_place(as_rank, monkeypatch, layer):
    """dW = dY^T X goes through weave.matmul with A = dY^T in the K x M layout (no transposed copy)
    where rows, in and out are multiples of 8, and through torch.matmul otherwise (ragged rows)."""
    spy = MatmulSpy()
    monkeypatch.setattr(wag, "_ops_ns", spy)
    as_rank(1, 2)
    if layer == "column":  # weight (out/W, in) = (104, 264); dW = dY^T X_gathered over 2 x rows
        m, shape_in, dw_shape = weave.nn.ColumnParallelLinear(264, 208, device="meta"), 264, (104, 264)
    else:  # weight (out, in/W) = (264, 104)
        m, shape_in, dw_shape = weave.nn.RowParallelLinear(208, 264, device="meta"), 104, (264, 104)
    x = meta(68 if layer == "column" else 136, shape_in)  # 136 rows in dW's product either way
    grads_of(m(x), x, m.weight)
    assert m.weight.grad.shape == dw_shape and m.weight.grad.dtype == BF
    assert spy.calls == [(dw_shape[:1] + (136,), True)], spy.calls  # A = dY^T: out x rows
    spy.calls.clear()
    m.weight.grad = None
    x = meta(67 if layer == "column" else 135, shape_in)  # 134 / 135 rows: not a multiple of 8
    grads_of(m(x), x, m.weight)
    assert m.weight.grad.shape == dw_shape
    assert all(not km for _, km in spy.calls), spy.calls  # (the row layer's ragged dX is a plain matmul)


def test_weight_grad_on_cpu_is_torch_matmul():
    """On CPU tensors (no weave kernel) the weight gradient is torch.matmul of the transposed view."""
    g = torch.Generator().manual_seed(5)
    dy, x = torch.randn(16, 3, 8, generator=g, dtype=F64), torch.randn(16, 3, 24, generator=g, dtype=F64)
    assert torch.equal(wag._weight_grad(dy, x), dy.reshape(48, 8).t() @ x.reshape(48, 24))


# ---------------------------------------------------------------------------------------------
# Initialisation, sharding, errors.


@pytest.mark.parametrize("world", [1, 3])
def test_init_is_nn_linears_sharded(as_rank, world):
    for r in range(world):
        as_rank(r, world)
        torch.manual_seed(7)
        ref = nn.Linear(48, 20)
        torch.manual_seed(7)
        col = weave.nn.ColumnParallelLinear(48, 20, device="cpu")
        torch.manual_seed(7)
        row = weave.nn.RowParallelLinear(20, 48, device="cpu")
        torch.manual_seed(7)
        ref_row = nn.Linear(20, 48)
        first, n = weave._lib.lib().shard(20, world, r)
        assert torch.equal(col.weight, ref.weight[first:first + n].to(BF))
        assert torch.equal(col.bias, ref.bias[first:first + n].to(BF))
        assert torch.equal(row.weight, ref_row.weight[:, first:first + n].to(BF))
        assert torch.equal(row.bias, ref_row.bias.to(BF))
        g = torch.Generator().manual_seed(3)
        col.reset_parameters(g)
        g2 = torch.Generator().manual_seed(3)
        full = torch.empty(20, 48)
        nn.init.kaiming_uniform_(full, a=math.sqrt(5), generator=g2)
        assert torch.equal(col.weight, full[first:first + n].to(BF))


def test_from_linear(as_rank):
    lin = nn.Linear(48, 20, dtype=torch.float32)
    as_rank(1, 3)  # 20 over 3: rank 1 holds 7 from 7
    col = weave.nn.ColumnParallelLinear.from_linear(lin, gather_output=True)
    assert col.gather_output and col.weight.device.type == "cpu" and col.weight.dtype == BF
    assert torch.equal(col.weight, lin.weight[7:14].to(BF)) and torch.equal(col.bias, lin.bias[7:14].to(BF))
    lin2 = nn.Linear(20, 48, bias=False)
    row = weave.nn.RowParallelLinear.from_linear(lin2, device="meta")
    assert row.bias is None and row.weight.shape == (48, 7) and row.weight.device.type == "meta"
    assert isinstance(row.weight, nn.Parameter) and row.weight.requires_grad
    assert "world=3" in repr(row)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: weave.nn.ColumnParallelLinear(64, 32, dtype=torch.float32, device="meta"), "bfloat16"),
        (lambda: weave.nn.RowParallelLinear(0, 32, device="meta"), "must be positive"),
        (lambda: weave.nn.ColumnParallelLinear(64, 2, device="meta"), "at least one"),
        (lambda: weave.nn.ColumnParallelLinear(64, 32, device="meta")(meta(8, 48)), "expected (rows, ..., 64)"),
        (lambda: weave.nn.RowParallelLinear(64, 32, device="meta")(meta(8, 64)), "expected (rows, ..., 21)"),
        (lambda: weave.nn.ColumnParallelLinear(64, 32, device="meta")(meta(64)), "input of shape (64,)"),
        (lambda: weave.nn.ColumnParallelLinear.from_linear(nn.Conv1d(3, 3, 1)), "expected an nn.Linear"),
    ],
)
def test_module_errors(as_rank, call, message):
    as_rank(2, 3)
    with pytest.raises(ValueError, match=re.escape(message)):
        call()


def test_attention_backward_errors_surface_from_forward(as_rank):
    """The differentiable path checks arguments like the operator (the forward runs it first)."""
    as_rank(0, 2)
    with pytest.raises(ValueError, match="head dim 96"):
        weave.attention(meta(1, 8, 2, 96), meta(1, 8, 2, 96), meta(1, 8, 2, 96))
    with pytest.raises(ValueError, match="pass seq_len"):
        weave.ring_attention(meta(1, 8, 2, 64), meta(1, 8, 2, 64), meta(1, 8, 2, 64), seq_len=20)


@pytest.fixture
def cpu_stand_ins():
    """CPU kernels for the operators the linear modules call, computing what the CUDA kernels
    compute at world 1 (float32 accumulation, one rounding): the autograd functions then run, eager
    and compiled, on CPU tensors. Removed after the test (the CPU error kernels come back)."""
    def mm(A, B):
        return (A.float() @ B.float()).to(A.dtype)

    frag = torch.library.Library("weave", "IMPL")  # noqa: TOR901
    kernels = {
        "all_gather_matmul": lambda A, Bs, dim, group, *, return_A=True: ((A.clone() if return_A else None),
                                                                          [mm(A, B) for B in Bs]),
        "matmul_reduce_scatter": lambda A, B, op, dim, group: mm(A, B),
        "matmul": lambda A, B, bias, out_dtype: mm(A, B),
        "all_gather": lambda x, dim, full, group: x.clone(),
        "all_reduce": lambda x, group: x.clone(),
    }
    for name, fn in kernels.items():
        frag.impl(name, fn, "CPU", allow_override=True)
    yield
    frag._destroy()


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("layer", ["column", "row"])
def test_compiled_linear_grads_match_eager(cpu_stand_ins, bias, layer):
    """torch.compile(fullgraph=True, aot_eager) of the linear autograd functions gives the eager
    output and gradients bit for bit (world 1, CPU stand-ins). An in-place bias add on the
    operator's output once made the compiled gradients differ (dx by 6, dW by 61) with the forward
    still exact."""
    group = _comm.SINGLE
    g = torch.Generator().manual_seed(7)
    x = torch.randn(40, 64, generator=g).to(BF)
    w = (torch.randn(48, 64, generator=g) / 8).to(BF)
    b = torch.randn(48, generator=g).to(BF) if bias else None
    dy = torch.randn(40, 48, generator=g).to(BF)
    if layer == "column":
        def f(x, w, b):
            return wag.ColumnParallelLinearFn.apply(x, w, b, group, True)
    else:
        def f(x, w, b):
            return wag.RowParallelLinearFn.apply(x, w, b, group)
    leaves = [t.clone().requires_grad_() if t is not None else None for t in (x, w, b)]
    y = f(*leaves)
    grads = torch.autograd.grad(y, [t for t in leaves if t is not None], dy)
    leaves2 = [t.clone().requires_grad_() if t is not None else None for t in (x, w, b)]
    y2 = torch.compile(f, backend="aot_eager", fullgraph=True)(*leaves2)
    grads2 = torch.autograd.grad(y2, [t for t in leaves2 if t is not None], dy)
    assert torch.equal(y2, y), f"{layer}: compiled forward differs"
    for name, a, c in zip(("dx", "dW", "db"), grads, grads2):
        assert torch.equal(c, a), f"{layer} bias={bias}: compiled {name} differs by {float((c.float() - a.float()).abs().max())}"


def test_run_records_exactly_where_autograd_would():
    """weave._ops.run calls an op past its (Python) autograd kernel only where that kernel would
    record nothing: the same outputs, a grad_fn exactly when grad mode is on and an input requires
    grad, and gradients that flow through it then."""
    from weave import _ops

    mm = torch.ops.weave.matmul.default
    a, b = meta(16, 32, grad=False), meta(32, 24, grad=False)
    y = _ops.run(mm, a, b, None, None)
    assert y.shape == (16, 24) and y.dtype == BF and y.grad_fn is None and not y.requires_grad
    a.requires_grad_()
    y = _ops.run(mm, a, b, None, None)
    assert y.grad_fn is not None and y.requires_grad
    (ga,) = torch.autograd.grad(y.sum(), [a])
    assert ga.shape == a.shape
    with torch.no_grad():
        y = _ops.run(mm, a, b, None, None)
    assert y.grad_fn is None and not y.requires_grad
    ys = _ops.run(torch.ops.weave.all_gather_matmul.default, meta(8, 32, grad=False), [b], 0, _comm.SINGLE,
                  return_A=False)
    assert ys[0] is None and ys[1][0].shape == (8, 24) and ys[1][0].grad_fn is None


class GroupedMmOnCpu:
    """torch.ops.weave with grouped_mm replaced by a float64 CPU emulation of the kernel (expert e's
    rows of x times w[e]^T, rows past sum(counts) left as NaN, as the kernel leaves them unwritten),
    for testing op_grads' grouped_mm backward off the GPU."""

    def __getattr__(self, name):
        return getattr(torch.ops.weave, name)

    @property
    def grouped_mm(self):
        def run(x, w, counts, capacity):
            cap = x.shape[0] if capacity < 0 else capacity
            y = torch.full((cap, w.shape[1]), float("nan"), dtype=torch.float64)
            off = 0
            for e, c in enumerate(counts.tolist()):
                y[off:off + c] = x[off:off + c].double() @ w[e].double().t()
                off += c
            return y.to(x.dtype)

        return types.SimpleNamespace(default=run)


@pytest.mark.parametrize("w_layout", ["NK", "KN"])
@pytest.mark.parametrize("capacity", [None, "tight"])
def test_grouped_mm_backward_math(monkeypatch, w_layout, capacity):
    """op_grads' grouped_mm backward (dx through the grouped GEMM on w^T, dw through
    torch._grouped_mm) against float64 autograd of the per-expert products: empty experts, rows past
    sum(counts) (no gradient), a capacity below x's rows (dx zero there), both w layouts."""
    from weave import op_grads

    monkeypatch.setattr(op_grads, "_ops_ns", GroupedMmOnCpu())
    gen = torch.Generator().manual_seed(7)
    E, N, K = 4, 24, 40
    counts = torch.tensor([5, 0, 9, 3], dtype=torch.int32)
    total = int(counts.sum())
    R = total + 6
    cap = R if capacity is None else total + 2
    x = torch.randn(R, K, generator=gen, dtype=torch.float64)
    ws = torch.randn((E, N, K) if w_layout == "NK" else (E, K, N), generator=gen, dtype=torch.float64)
    w = ws if w_layout == "NK" else ws.transpose(1, 2)
    g = torch.randn(cap, N, generator=gen, dtype=torch.float64)

    class Ctx:
        needs_input_grad = (True, True, False, False)

        def save_for_backward(self, *tensors):
            self.saved_tensors = tensors

    ctx = Ctx()
    y = torch.empty(cap, N)
    op_grads._grouped_mm_setup(ctx, (x.bfloat16(), w.bfloat16(), counts, cap), y)
    dx, dw, dc, dcap = op_grads._grouped_mm_bwd(ctx, g.bfloat16())
    assert dc is None and dcap is None and dx.shape == x.shape and dw.shape == w.shape

    xb, wb = x.bfloat16().double().requires_grad_(), w.bfloat16().double().requires_grad_()
    off, loss = 0, 0
    for e, c in enumerate(counts.tolist()):
        loss = loss + (xb[off:off + c] @ wb[e].t() * g.bfloat16().double()[off:off + c]).sum()
        off += c
    rx, rw = torch.autograd.grad(loss, [xb, wb])
    assert torch.equal(dx[total:], torch.zeros_like(dx[total:]))  # no output there: no gradient
    scale = float(g.abs().max() * max(x.abs().max(), w.abs().max())) * 16
    assert float((dx.double() - rx).abs().max()) <= 2 ** -7 * scale
    assert float((dw.double() - rw).abs().max()) <= 2 ** -7 * scale


def test_grouped_mm_grads_on_meta():
    """grouped_mm's gradients on meta tensors have the inputs' shapes and dtypes (both w layouts)."""
    counts = torch.empty(3, dtype=torch.int32, device="meta")
    for stack, nk in ((meta(3, 24, 40), True), (meta(3, 40, 24), False)):
        x = meta(50, 40)
        y = torch.ops.weave.grouped_mm(x, stack if nk else stack.transpose(1, 2), counts, 45)
        assert y.shape == (45, 24)
        dx, dw = grads_of(y, x, stack)
        assert dx.shape == x.shape and dw.shape == stack.shape and dx.dtype == BF and dw.dtype == BF


def test_run_takes_the_direct_path_only_for_plain_cuda_calls():
    """run's direct calls (weave._C.eager_<op>) cover every operator with a C++ kernel but
    matmul_out, and are refused for CPU and meta tensors (also inside a list), tensor subclasses and
    an active dispatch mode; those calls go through the dispatcher (whose CPU kernel raises clearly)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from weave import _ops
    from weave._lib import lib

    names = {op.name().split("::")[1] for op in _ops._EAGER}
    assert names == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "all_gather_matmul",
                     "matmul_reduce_scatter", "matmul_all_reduce", "all_gather_scaled_matmul",
                     "scaled_matmul_reduce_scatter", "matmul", "scaled_mm", "grouped_mm",
                     "attention", "ring_attention", "ulysses_attention"}
    assert all(fn is getattr(lib(), "eager_" + op.name().split("::")[1]) for op, fn in _ops._EAGER.items())
    cpu = torch.zeros(8, 8, dtype=BF)
    assert not _ops._plain((cpu, 3, "g"))
    assert not _ops._plain((meta(8, 8, grad=False), [cpu]))
    with FakeTensorMode():
        assert not _ops._plain((3, "g"))  # a dispatch mode is active
    assert _ops._plain((3, "g", None))  # nothing to refuse
    with pytest.raises(RuntimeError, match="no CUDA GPU|on the CPU"):
        _ops.run(torch.ops.weave.matmul.default, cpu, cpu)
