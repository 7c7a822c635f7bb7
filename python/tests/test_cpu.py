"""CPU tests (no GPU needed): import and errors without a GPU, the fake implementations (every op's
shapes and dtypes on meta tensors, opcheck, tracing), and argument checks raising clear errors (the
single-GPU GEMM options, the fp8 and grouped GEMMs included)."""
import gc
import re

import pytest
import torch

import weave
from weave import _comm
from refs import expect_no_gpu_errors

BF, F16, F32, I32 = torch.bfloat16, torch.float16, torch.float32, torch.int32
E4, E5 = torch.float8_e4m3fn, torch.float8_e5m2
ops = torch.ops.weave


def meta(*shape, dtype=BF):
    return torch.empty(shape, dtype=dtype, device="meta")


@pytest.fixture
def as_rank(monkeypatch):
    """as_rank(r, W): shapes as rank r of a world of W sees them (fakes need no communicator)."""

    def set_rank(rank, world):
        monkeypatch.setattr(_comm, "group_rank_world", lambda name: (rank, world))

    return set_rank


def test_import_and_clear_errors_without_gpu():
    code = """
import torch, weave
assert not torch.cuda.is_available()
calls = {
    "init": lambda: weave.init(),
    "empty": lambda: weave.empty((4,), torch.float32),
    "all_reduce": lambda: weave.all_reduce(torch.ones(4)),
    "matmul": lambda: weave.matmul(torch.ones(8, 8, dtype=torch.bfloat16), torch.ones(8, 8, dtype=torch.bfloat16)),
    "tune": lambda: weave.tune([{"op": "matmul_reduce_scatter", "M": 64, "N": 64, "K": 64}]),
    "all_gather_scaled_matmul": lambda: weave.all_gather_scaled_matmul(
        torch.ones(8, 16).to(torch.float8_e4m3fn), [torch.ones(8, 16).to(torch.float8_e4m3fn).t()], torch.ones(()),
        [torch.ones(())]),
    "scaled_mm": lambda: weave.scaled_mm(torch.ones(8, 16).to(torch.float8_e4m3fn),
                                         torch.ones(8, 16).to(torch.float8_e4m3fn).t(), torch.ones(()),
                                         torch.ones(())),
    "grouped_mm": lambda: weave.grouped_mm(torch.ones(8, 8, dtype=torch.bfloat16),
                                           torch.ones(2, 8, 8, dtype=torch.bfloat16),
                                           torch.ones(2, dtype=torch.int32)),
    "grouped_mm_status": lambda: weave.grouped_mm_status(),
    "attention": lambda: weave.attention(*[torch.ones(1, 8, 1, 64, dtype=torch.bfloat16)] * 3),
}
"""
    expect_no_gpu_errors(code)


@pytest.mark.parametrize("dtype", list(_comm._DLPACK))
def test_dlpack_tensors(dtype):
    """weave.empty's path (DLPack capsule -> torch.from_dlpack -> deleter when the storage dies), on host memory."""
    C = weave._lib.lib()
    code, bits = _comm._DLPACK[dtype]
    n0 = C._host_capsules_deleted()
    t = torch.utils.dlpack.from_dlpack(C._host_capsule([3, 5], code, bits))
    assert t.shape == (3, 5) and t.dtype == dtype and t.is_contiguous() and not t.any()
    t.fill_(1)
    view = t[1:]
    del t
    gc.collect()
    assert C._host_capsules_deleted() == n0 and bool(view.all())  # a view keeps the memory
    del view
    gc.collect()
    assert C._host_capsules_deleted() == n0 + 1
    cap = C._host_capsule([4], code, bits)  # never consumed: the capsule frees it
    del cap
    gc.collect()
    assert C._host_capsules_deleted() == n0 + 2


def test_group_names_without_torch_distributed():
    assert weave.functional.group_name(None) == _comm.SINGLE
    assert _comm.group_rank_world(_comm.SINGLE) == (0, 1)
    assert weave.shard(10) == (0, 10)
    assert weave.ring_chunks(10) == [(0, 5), (5, 5)]
    with pytest.raises(RuntimeError, match="unknown process group"):
        _comm.group_rank_world("no-such-group")
    # What torch.distributed.new_group gives a rank outside the group.
    with pytest.raises(ValueError, match="not a member of the group"):
        weave.functional.group_name(torch.distributed.GroupMember.NON_GROUP_MEMBER)


def test_shard_rule(as_rank):
    sizes = []
    for r in range(3):
        as_rank(r, 3)
        sizes.append(weave.shard(10))
    assert sizes == [(0, 4), (4, 3), (7, 3)]


def test_collective_shape_keeps_empty_dimensions():
    """The shape all_gather / reduce_scatter hand the C++ collective (sizes of 1 dropped, at most
    three dims): a size of 0 before or after the dimension stays, so an empty tensor is an empty
    collective, not one of the other dimensions' size."""
    from weave._ops import _spec
    lib = weave._lib.lib()
    out, dim, full, cdim = lib.plan_all_gather(_spec(meta(0, 4, 5)), 1, -1, 1, 3)
    assert tuple(out) == (0, 12, 5) and (list(full), cdim) == ([0, 12, 5], 1)
    out, dim, full, cdim = lib.plan_all_gather(_spec(meta(4, 6, 0)), 1, -1, 1, 3)
    assert tuple(out) == (4, 18, 0) and (list(full), cdim) == ([4, 18, 0], 1)
    _, _, full, cdim = lib.plan_all_gather(_spec(meta(1, 6, 1)), 1, -1, 1, 3)
    assert (list(full), cdim) == ([18], 0)
    _, _, full, cdim = lib.plan_reduce_scatter(_spec(meta(0, 10, 4)), 1, 0, 3)
    assert (list(full), cdim) == ([0, 10, 4], 1)
    _, _, full, cdim = lib.plan_reduce_scatter(_spec(meta(2, 10, 4)), 1, 0, 3)
    assert (list(full), cdim) == ([2, 10, 4], 1)


@pytest.mark.parametrize("dtype", [BF, F16, F32])
def test_collective_shapes(as_rank, dtype):
    as_rank(1, 3)
    x = meta(4, 6, 5, dtype=dtype)
    y = weave.all_reduce(x)
    assert y.shape == x.shape and y.dtype == dtype
    assert weave.all_gather(x, 1).shape == (4, 18, 5)
    assert weave.all_gather(x, 1, full_size=17).shape == (4, 17, 5)  # rank 1 of 17 over 3 holds 6
    assert weave.all_gather(meta(6, 2, dtype=dtype), -1, full_size=7).shape == (6, 7)  # rank 1 holds 2 of 7
    assert weave.all_gather(meta(3, dtype=dtype)).dtype == dtype
    sizes = []
    for r in range(3):
        as_rank(r, 3)
        sizes.append(weave.reduce_scatter(meta(2, 10, 4, dtype=dtype), 1).shape)
    assert sizes == [(2, 4, 4), (2, 3, 4), (2, 3, 4)]


def test_all_to_all_shapes(as_rank):
    as_rank(0, 3)
    assert weave.all_to_all(meta(2, 5, 6, 64)).shape == (2, 15, 2, 64)
    assert weave.all_to_all(meta(2, 5, 6, 64), seq_len=14).shape == (2, 14, 2, 64)
    as_rank(2, 3)
    assert weave.all_to_all(meta(2, 4, 6, 64, dtype=F32), seq_len=14).shape == (2, 14, 2, 64)
    y = weave.all_to_all(meta(2, 14, 2, 64, dtype=F16), "head_to_seq")
    assert y.shape == (2, 4, 6, 64) and y.dtype == F16


def test_tp_shapes(as_rank):
    as_rank(1, 2)
    w = meta(40, 64)  # an nn.Linear weight, out x in
    A, outs = weave.all_gather_matmul(meta(5, 3, 64), [meta(64, 24), w.t()])
    assert A.shape == (10, 3, 64) and [o.shape for o in outs] == [(10, 3, 24), (10, 3, 40)]
    A, outs = weave.all_gather_matmul(meta(5, 3, 64), [w.t()], return_A=False)
    assert A is None and outs[0].shape == (10, 3, 40)
    # gather_dim 1: A_shard.movedim(1, 0) contiguous (torch symm_mem's convention); outputs moved back.
    a = meta(3, 5, 64).movedim(0, 1)
    A, outs = weave.all_gather_matmul(a, [meta(64, 8)], gather_dim=1)
    assert A.shape == (5, 6, 64) and outs[0].shape == (5, 6, 8)
    assert A.movedim(1, 0).is_contiguous() and outs[0].movedim(1, 0).is_contiguous()

    as_rank(0, 3)
    assert weave.matmul_reduce_scatter(meta(10, 64), meta(64, 24)).shape == (4, 24)
    assert weave.matmul_reduce_scatter(meta(6, 5, 64), w.t(), "avg").shape == (2, 5, 40)
    assert weave.matmul_reduce_scatter(meta(6, 5, 64).movedim(0, 1), meta(64, 8), scatter_dim=1).shape == (5, 2, 8)
    assert weave.matmul_all_reduce(meta(7, 3, 64), w.t()).shape == (7, 3, 40)


def test_fp8_tp_shapes(as_rank):
    """all_gather_scaled_matmul / scaled_matmul_reduce_scatter: the bf16 operators' shapes, bf16
    outputs, the gathered A in fp8."""
    one = meta(dtype=F32)
    w1, w2 = meta(40, 64, dtype=E4), meta(24, 64, dtype=E4)  # fp8 nn.Linear weights, out x in
    as_rank(1, 2)
    A, outs = weave.all_gather_scaled_matmul(meta(5, 3, 64, dtype=E4), [w1.t(), w2.t()], one, [one, meta(1, dtype=F32)])
    assert A.shape == (10, 3, 64) and A.dtype == E4
    assert [o.shape for o in outs] == [(10, 3, 40), (10, 3, 24)] and all(o.dtype == BF for o in outs)
    A, outs = weave.all_gather_scaled_matmul(meta(3, 5, 64, dtype=E4).movedim(0, 1), [w1.t()], one, [one],
                                             gather_dim=1, return_A=False, out_dtype=BF)
    assert A is None and outs[0].shape == (5, 6, 40) and outs[0].movedim(1, 0).is_contiguous()
    as_rank(0, 3)
    y = weave.scaled_matmul_reduce_scatter(meta(10, 64, dtype=E4), w1.t(), one, one)
    assert y.shape == (4, 40) and y.dtype == BF
    assert weave.scaled_matmul_reduce_scatter(meta(6, 5, 64, dtype=E4), w2.t(), one, one, "avg").shape == (2, 5, 24)
    y = weave.scaled_matmul_reduce_scatter(meta(6, 5, 64, dtype=E4).movedim(0, 1), w2.t(), one, one, scatter_dim=1)
    assert y.shape == (5, 2, 24)


def test_single_gpu_shapes():
    w = meta(40, 64)
    assert weave.matmul(meta(7, 64), w.t()).shape == (7, 40)
    assert weave.matmul(meta(2, 7, 64), meta(64, 16)).shape == (2, 7, 16)
    o, lse = weave.attention(meta(2, 100, 8, 64), meta(2, 100, 2, 64), meta(2, 100, 2, 64), causal=True)
    assert o.shape == (2, 100, 8, 64) and o.dtype == BF
    assert lse.shape == (2, 8, 100) and lse.dtype == F32


def test_matmul_options_shapes():
    """A as the transpose of a contiguous K x M matrix, bias, fp32 output, out= (fakes on meta)."""
    dy, x = meta(64, 24), meta(64, 40)  # rows x out, rows x in: dW = dy^T x is 24 x 40
    y = weave.matmul(dy.t(), x)
    assert y.shape == (24, 40) and y.dtype == BF
    w = meta(40, 64)
    for bias in (meta(40), meta(40, dtype=F32)):
        y = weave.matmul(meta(3, 7, 64), w.t(), bias)
        assert y.shape == (3, 7, 40) and y.dtype == BF
    y = weave.matmul(dy.t(), w.t(), meta(40, dtype=F32), out_dtype=F32)
    assert y.shape == (24, 40) and y.dtype == F32
    for dtype in (BF, F32):
        out = meta(24, 40, dtype=dtype)
        assert weave.matmul(dy.t(), x, out=out, accumulate=True) is out
        assert weave.matmul(dy.t(), x, meta(40), out=out) is out


def test_scaled_mm_shapes():
    e4, e5 = torch.float8_e4m3fn, torch.float8_e5m2
    one = meta(dtype=F32)
    w = meta(48, 256, dtype=e4)  # N x K
    for a_type, b in ((e4, w), (e5, w), (e4, meta(48, 256, dtype=e5))):
        y = weave.scaled_mm(meta(5, 256, dtype=a_type), b.t(), one, meta(1, dtype=F32))
        assert y.shape == (5, 48) and y.dtype == BF
    # Block scales: K = 304 has 3 blocks of 128 (the last partial); N = 136 has 2.
    y = weave.scaled_mm(meta(5, 304, dtype=e4), meta(136, 304, dtype=e4).t(), meta(3, 5, dtype=F32),
                        meta(2, 3, dtype=F32), out_dtype=BF)
    assert y.shape == (5, 136) and y.dtype == BF
    assert weave._lib.lib().fp8_block_scale_a_count(5, 304) == 3 * 5
    assert weave._lib.lib().fp8_block_scale_b_count(136, 304) == 2 * 3


def test_grouped_mm_shapes():
    x, w, counts = meta(100, 64), meta(4, 24, 64), meta(4, dtype=torch.int32)
    y = weave.grouped_mm(x, w, counts)
    assert y.shape == (100, 24) and y.dtype == BF
    assert weave.grouped_mm(x, w, counts, capacity_rows=60).shape == (60, 24)
    kn = meta(4, 64, 24).transpose(1, 2)  # an E x K x N stack read in place
    assert weave.grouped_mm(x, kn, counts).shape == (100, 24)


def test_sequence_parallel_shapes(as_rank):
    as_rank(1, 2)
    q, kv = meta(1, 50, 4, 128), meta(1, 50, 2, 128)
    o, lse = weave.ring_attention(q, kv, kv, causal=True)
    assert o.shape == q.shape and lse.shape == (1, 4, 50) and lse.dtype == F32
    # S = 101 zigzag over 2 ranks: chunks of 26, 25, 25, 25; rank 1 holds chunks 1 and 2.
    assert weave.ring_chunks(101) == [(26, 25), (51, 25)]
    o, lse = weave.ring_attention(q, kv, kv, seq_len=101)
    assert lse.shape == (1, 4, 50)
    o, _ = weave.ring_attention(q, kv, kv, sharding="contiguous", seq_len=100)
    assert o.shape == q.shape
    assert weave.ulysses_attention(q, kv, kv, seq_len=100).shape == q.shape


def test_opcheck_on_meta(as_rank):
    as_rank(0, 1)
    g = _comm.SINGLE
    x = meta(6, 8)
    w = meta(16, 8)
    q, kv = meta(1, 32, 4, 64), meta(1, 32, 2, 64)
    cases = [
        (ops.all_reduce.default, (x, g), {}),
        (ops.all_gather.default, (x, 1, -1, g), {}),
        (ops.reduce_scatter.default, (x, 0, g), {}),
        (ops.all_to_all.default, (meta(1, 4, 2, 64), "seq_to_head", -1, g), {}),
        (ops.all_gather_matmul.default, (x, [w.t()], 0, g), {"return_A": True}),
        (ops.matmul_reduce_scatter.default, (x, w.t(), "sum", 0, g), {}),
        (ops.matmul_all_reduce.default, (x, w.t(), g), {}),
        (ops.all_gather_scaled_matmul.default, (meta(6, 32, dtype=E4), [meta(16, 32, dtype=E4).t()], meta(dtype=F32),
                                                [meta(dtype=F32)], 0, g), {"return_A": True}),
        (ops.scaled_matmul_reduce_scatter.default, (meta(6, 32, dtype=E4), meta(16, 32, dtype=E4).t(),
                                                    meta(dtype=F32), meta(dtype=F32), "sum", 0, g), {"out_dtype": BF}),
        (ops.matmul.default, (x, w.t()), {}),
        (ops.matmul.default, (meta(8, 6).t(), w.t(), meta(16, dtype=F32), F32), {}),
        (ops.matmul_out.default, (meta(8, 6).t(), w.t(), None, True), {"out": meta(6, 16, dtype=F32)}),
        (ops.scaled_mm.default, (meta(6, 32, dtype=torch.float8_e4m3fn), meta(16, 32, dtype=torch.float8_e4m3fn).t(),
                                 meta(dtype=F32), meta(dtype=F32)), {}),
        (ops.scaled_mm.default, (meta(6, 32, dtype=torch.float8_e5m2), meta(16, 32, dtype=torch.float8_e4m3fn).t(),
                                 meta(1, 6, dtype=F32), meta(1, 1, dtype=F32), BF), {}),
        (ops.grouped_mm.default, (meta(20, 8), meta(3, 16, 8), meta(3, dtype=torch.int32), 12), {}),
        (ops.attention.default, (q, kv, kv, True, None), {}),
        (ops.ring_attention.default, (q, kv, kv, False, 0.125, "zigzag", -1, g), {}),
        (ops.ulysses_attention.default, (q, kv, kv, True, None, -1, g), {}),
    ]
    for op, args, kwargs in cases:
        torch.library.opcheck(op, args, kwargs, test_utils=("test_schema", "test_faketensor"))


def test_traces_with_fake_tensors():
    from torch.fx.experimental.proxy_tensor import make_fx

    def block(x, w1, w2, q, k, v, counts):
        h = weave.matmul(x, w1.t())
        h = weave.all_reduce(h)
        o, _ = weave.attention(q, k, v, causal=True)
        g = weave.grouped_mm(h, w2.t().contiguous().view(2, 8, 32), counts)
        return weave.matmul(h, w2, out_dtype=F32), o, g

    args = (torch.randn(8, 64).to(BF), torch.randn(32, 64).to(BF), torch.randn(32, 16).to(BF),
            *[torch.randn(1, 16, 2, 64).to(BF)] * 3, torch.tensor([3, 5], dtype=torch.int32))
    gm = make_fx(block, tracing_mode="fake")(*args)
    called = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
    assert {"weave.matmul.default", "weave.all_reduce.default", "weave.attention.default",
            "weave.grouped_mm.default"} <= called


def test_compile_fullgraph_on_meta():
    def f(x, w):
        return weave.all_reduce(weave.matmul(x, w.t())) * 2

    y = torch.compile(f, backend="eager", fullgraph=True)(meta(8, 64), meta(32, 64))
    assert y.shape == (8, 32) and y.dtype == BF

    def g(a, w, sa, sb, dy, x, b):
        return weave.scaled_mm(a, w.t(), sa, sb), weave.matmul(dy.t(), x, b, out_dtype=torch.float32)

    e4 = torch.float8_e4m3fn
    y, dw = torch.compile(g, backend="eager", fullgraph=True)(
        meta(8, 64, dtype=e4), meta(32, 64, dtype=e4), meta(dtype=F32), meta(dtype=F32), meta(16, 24), meta(16, 40),
        meta(40))
    assert y.shape == (8, 32) and y.dtype == BF and dw.shape == (24, 40) and dw.dtype == F32


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: weave.all_reduce(meta(4, dtype=torch.float64)), "dtype torch.float64"),
        (lambda: weave.all_reduce(meta(4, 6).t()), "not contiguous"),
        (lambda: weave.all_gather(meta(4, 6), 2), "out of range"),
        (lambda: weave.all_gather(meta(4, 6), 0, full_size=9), "share of 9"),
        (lambda: weave.reduce_scatter(meta(4, 6)[:, :3], 1), "not contiguous"),
        (lambda: weave.all_to_all(meta(2, 4, 6, 64), "sideways"), "direction"),
        (lambda: weave.all_to_all(meta(2, 4, 5, 64)), "5 heads do not divide"),
        (lambda: weave.all_to_all(meta(4, 6, 64)), "4 dimensions"),
        (lambda: weave.matmul(meta(8, 64, dtype=F16), meta(64, 8, dtype=F16)), "dtype torch.float16"),
        (lambda: weave.matmul(meta(8, 64), meta(32, 8)), "32 rows but A has K = 64"),
        (lambda: weave.matmul(meta(8, 64), meta(64, 16, 2)[:, :, 0]), "neither contiguous"),
        (lambda: weave.matmul(meta(8, 64, 2)[:, :, 0], meta(64, 8)), "A is neither contiguous"),
        (lambda: weave.matmul(meta(64, 12).t(), meta(64, 8)), "needs M % 8 == 0, got M = 12"),
        (lambda: weave.matmul(meta(8, 64), meta(64, 8), meta(9)), "bias must hold N = 8 values"),
        (lambda: weave.matmul(meta(8, 64), meta(64, 8), meta(8, dtype=F16)), "bias has dtype torch.float16"),
        (lambda: weave.matmul(meta(8, 64), meta(64, 8), meta(16)[::2]), "bias is not contiguous"),
        (lambda: weave.matmul(meta(8, 64), meta(64, 8), out_dtype=F16), "out_dtype torch.float16"),
        (lambda: weave.matmul(meta(8, 64), meta(64, 8), torch.zeros(8, dtype=BF)), "bias is on cpu"),
        (lambda: weave.matmul(meta(8, 64), meta(64, 8), accumulate=True), "needs out="),
        (lambda: weave.matmul(meta(8, 64), meta(64, 8), out=meta(8, 9)), "out has shape (8, 9)"),
        (lambda: weave.matmul(meta(8, 64), meta(64, 8), out=meta(8, 8, dtype=F16)), "out has dtype torch.float16"),
        (lambda: weave.matmul(meta(8, 64), meta(64, 8), out=meta(8, 8).t()), "out is not contiguous"),
        (lambda: weave.scaled_mm(meta(8, 64), meta(8, 64, dtype=E4).t(), meta(dtype=F32), meta(dtype=F32)),
         "A has dtype torch.bfloat16"),
        (lambda: weave.scaled_mm(meta(8, 64, dtype=E5), meta(8, 64, dtype=E5).t(), meta(dtype=F32), meta(dtype=F32)),
         "both float8_e5m2"),
        (lambda: weave.scaled_mm(meta(8, 64, dtype=E4), meta(64, 8, dtype=E4), meta(dtype=F32), meta(dtype=F32)),
         "transpose of a contiguous N x K"),
        (lambda: weave.scaled_mm(meta(8, 64, dtype=E4), meta(8, 32, dtype=E4).t(), meta(dtype=F32), meta(dtype=F32)),
         "B has 32 rows but A has K = 64"),
        (lambda: weave.scaled_mm(meta(8, 40, dtype=E4), meta(8, 40, dtype=E4).t(), meta(dtype=F32), meta(dtype=F32)),
         "K = 40 must be a positive multiple of 16"),
        (lambda: weave.scaled_mm(meta(8, 64, dtype=E4), meta(12, 64, dtype=E4).t(), meta(dtype=F32), meta(dtype=F32)),
         "N = 12 must be a positive multiple of 8"),
        (lambda: weave.scaled_mm(meta(8, 64, dtype=E4), meta(8, 64, dtype=E4).t(), meta(2, dtype=F32),
                                 meta(dtype=F32)), "scale_a must be one fp32 value"),
        (lambda: weave.scaled_mm(meta(8, 64, dtype=E4), meta(8, 64, dtype=E4).t(), meta(dtype=F32), meta(dtype=BF)),
         "scale_b has dtype torch.bfloat16"),
        (lambda: weave.scaled_mm(meta(8, 64, dtype=E4), meta(8, 64, dtype=E4).t(), torch.ones(()), meta(dtype=F32)),
         "scale_a is on cpu"),
        (lambda: weave.scaled_mm(meta(8, 256, dtype=E4), meta(8, 256, dtype=E4).t(), meta(8, 2, dtype=F32),
                                 meta(1, 2, dtype=F32)), "scale_a has shape (8, 2); block scaling needs (2, 8)"),
        (lambda: weave.scaled_mm(meta(8, 256, dtype=E4), meta(8, 256, dtype=E4).t(), meta(2, 8, dtype=F32),
                                 meta(dtype=F32)), "scale_b has shape (); block scaling needs (1, 2)"),
        (lambda: weave.scaled_mm(meta(8, 64, dtype=E4), meta(8, 64, dtype=E4).t(), meta(dtype=F32), meta(dtype=F32),
                                 out_dtype=F32), "writes torch.bfloat16 only"),
        (lambda: weave.grouped_mm(meta(10, 64), meta(2, 8, 32), meta(2, dtype=I32)), "x has K = 64 columns"),
        (lambda: weave.grouped_mm(meta(10, 64), meta(2, 8, 64), meta(2, dtype=torch.int64)), "torch.int32"),
        (lambda: weave.grouped_mm(meta(10, 64), meta(2, 8, 64), meta(3, dtype=I32)), "E = 2 values"),
        (lambda: weave.grouped_mm(meta(10, 64), meta(2, 12, 64), meta(2, dtype=I32)), "N = 12 must be"),
        (lambda: weave.grouped_mm(meta(10, 60), meta(2, 8, 60), meta(2, dtype=I32)), "K = 60 must be"),
        (lambda: weave.grouped_mm(meta(10, 64), meta(1025, 8, 64), meta(1025, dtype=I32)), "E = 1025 experts"),
        (lambda: weave.grouped_mm(meta(10, 64), meta(2, 8, 64), meta(2, dtype=I32), 11), "capacity_rows = 11"),
        (lambda: weave.grouped_mm(meta(10, 64), meta(2, 8, 64), meta(2, dtype=I32), 0), "capacity_rows = 0"),
        (lambda: weave.grouped_mm(meta(10, 64), meta(8, 2, 64).transpose(0, 1), meta(2, dtype=I32)),
         "neither contiguous"),
        (lambda: weave.grouped_mm(meta(10, 64), meta(2, 8, 64), torch.ones(2, dtype=I32)), "counts is on cpu"),
        (lambda: weave.grouped_mm(meta(10, 64).t(), meta(2, 8, 10), meta(2, dtype=I32)), "x is not contiguous"),
        (lambda: weave.all_gather_matmul(meta(4, 64), [meta(64, 8)], gather_dim=1), "last (K) dimension"),
        (lambda: weave.all_gather_matmul(meta(3, 4, 64), [meta(64, 8)], gather_dim=1), "movedim(1, 0)"),
        (lambda: weave.all_gather_matmul(meta(4, 64), []), "Bs is empty"),
        (lambda: weave.matmul_reduce_scatter(meta(4, 64), meta(64, 8), "max"), "reduce_op"),
        (lambda: weave.matmul_reduce_scatter(meta(5, 3, 64), meta(64, 8)), "not a multiple of the 2 ranks"),
        (lambda: weave.all_gather_scaled_matmul(meta(4, 64), [meta(8, 64, dtype=E4).t()], meta(dtype=F32),
                                                [meta(dtype=F32)]), "A_shard has dtype torch.bfloat16"),
        (lambda: weave.all_gather_scaled_matmul(meta(4, 64, dtype=E5), [meta(8, 64, dtype=E4).t()], meta(dtype=F32),
                                                [meta(dtype=F32)]), "A_shard has dtype torch.float8_e5m2"),
        (lambda: weave.all_gather_scaled_matmul(meta(4, 64, dtype=E4), [meta(64, 8, dtype=E4)], meta(dtype=F32),
                                                [meta(dtype=F32)]), "transpose of a contiguous N x K"),
        (lambda: weave.all_gather_scaled_matmul(meta(4, 64, dtype=E4), [meta(8, 64, dtype=BF).t()], meta(dtype=F32),
                                                [meta(dtype=F32)]), "Bs[0] has dtype torch.bfloat16"),
        (lambda: weave.all_gather_scaled_matmul(meta(4, 40, dtype=E4), [meta(8, 40, dtype=E4).t()], meta(dtype=F32),
                                                [meta(dtype=F32)]), "K = 40 must be a positive multiple of 16"),
        (lambda: weave.all_gather_scaled_matmul(meta(4, 64, dtype=E4), [meta(12, 64, dtype=E4).t()],
                                                meta(dtype=F32), [meta(dtype=F32)]), "N = 12"),
        (lambda: weave.all_gather_scaled_matmul(meta(4, 64, dtype=E4), [meta(8, 64, dtype=E4).t()] * 2,
                                                meta(dtype=F32), [meta(dtype=F32)]), "B_scales has 1 scales for 2 Bs"),
        (lambda: weave.all_gather_scaled_matmul(meta(4, 64, dtype=E4), [meta(8, 64, dtype=E4).t()], meta(4, dtype=F32),
                                                [meta(dtype=F32)]), "A_scale must be one fp32 value"),
        (lambda: weave.all_gather_scaled_matmul(meta(4, 64, dtype=E4), [meta(8, 64, dtype=E4).t()], meta(dtype=F32),
                                                [torch.ones(())]), "B_scales[0] is on cpu"),
        (lambda: weave.all_gather_scaled_matmul(meta(4, 64, dtype=E4), [meta(8, 64, dtype=E4).t()], meta(dtype=F32),
                                                [meta(dtype=F32)], out_dtype=F32), "writes torch.bfloat16 only"),
        (lambda: weave.all_gather_scaled_matmul(meta(4, 64, dtype=E4), [meta(8, 64, dtype=E4).t()], meta(dtype=F32),
                                                [meta(dtype=F32)], gather_dim=1), "last (K) dimension"),
        (lambda: weave.scaled_matmul_reduce_scatter(meta(4, 64, dtype=E4), meta(8, 64, dtype=E4).t(), meta(dtype=F32),
                                                    meta(dtype=F32), "max"), "reduce_op"),
        (lambda: weave.scaled_matmul_reduce_scatter(meta(4, 64, dtype=E4), meta(8, 64, dtype=E4).t(), meta(dtype=BF),
                                                    meta(dtype=F32)), "A_scale has dtype torch.bfloat16"),
        (lambda: weave.scaled_matmul_reduce_scatter(meta(4, 64, dtype=E4), meta(8, 64, dtype=E4), meta(dtype=F32),
                                                    meta(dtype=F32)), "B has 8 rows but A has K = 64"),
        (lambda: weave.scaled_matmul_reduce_scatter(meta(5, 3, 64, dtype=E4), meta(8, 64, dtype=E4).t(),
                                                    meta(dtype=F32), meta(dtype=F32)), "not a multiple of the 2 ranks"),
        (lambda: weave.attention(meta(1, 8, 2, 96), meta(1, 8, 2, 96), meta(1, 8, 2, 96)), "head dim 96"),
        (lambda: weave.attention(meta(1, 8, 3, 64), meta(1, 8, 2, 64), meta(1, 8, 2, 64)), "not a multiple"),
        (lambda: weave.attention(meta(1, 8, 2, 64), meta(1, 9, 2, 64), meta(1, 9, 2, 64)), "differ"),
        (lambda: weave.attention(meta(1, 8, 2, 64), meta(1, 8, 2, 64), meta(1, 8, 1, 64)), "differ"),
        (lambda: weave.ring_attention(*[meta(1, 8, 2, 64)] * 3, seq_len=20), "pass seq_len"),
        (lambda: weave.ring_attention(*[meta(1, 8, 2, 64)] * 3, sharding="striped"), "sharding"),
        (lambda: weave.ulysses_attention(*[meta(1, 8, 3, 64)] * 3), "3 query heads do not divide"),
    ],
)
def test_argument_errors(as_rank, call, message):
    as_rank(0, 2)
    with pytest.raises(ValueError, match=re.escape(message)):
        call()


@pytest.mark.parametrize(
    "calls, message",
    [
        ([{"M": 8}], "must be a dict with 'op'"),
        ([("matmul_reduce_scatter", 8, 8, 8)], "must be a dict with 'op'"),
        ([{"op": "matmul"}], "op 'matmul' is not tuned"),
        ([{"op": "matmul_reduce_scatter", "M": 64, "N": 64}], "K is missing"),
        ([{"op": "matmul_reduce_scatter", "M": 64, "N": 64, "K": 0}], "K must be a positive int"),
        ([{"op": "matmul_reduce_scatter", "M": 64.0, "N": 64, "K": 64}], "M must be a positive int"),
        ([{"op": "matmul_reduce_scatter", "M": 64, "N": 64, "K": 64, "bias": True}], "unknown key 'bias'"),
        ([{"op": "all_gather_matmul", "M": 64, "N": 64, "K": 64, "weight": "mk"}], "weight must be 'nk'"),
        ([{"op": "all_gather_matmul", "M": 64, "N": 64, "K": 64, "dtype": "fp16"}], "dtype must be 'bf16' or 'fp8'"),
        ([{"op": "ring_attention", "B": 1, "S": 64, "Hq": 4, "Hkv": 4, "D": 64, "sharding": "striped"}],
         "sharding must be"),
        ([{"op": "matmul_all_reduce", "M": 64, "N": 64, "K": 64, "dtype": "fp8"}], "unknown key 'dtype'"),
    ],
)
def test_tune_argument_errors(calls, message):
    """weave.tune checks its whole list before anything runs (no GPU needed to reach these)."""
    with pytest.raises(ValueError, match=re.escape(message)):
        weave.tune(calls)


def test_tune_calls_every_kind_on_its_shapes(as_rank, monkeypatch):
    """weave.tune's calls on meta tensors (the operators' fakes check them): every kind, both weight
    layouts and fp8, a world of 2, and the budget set for the search and restored after."""
    import types

    from weave import tuning

    as_rank(1, 2)
    C = weave._lib.lib()
    budget, mode = C.tuner_budget_s(), C.tuner_mode()
    seen = []
    monkeypatch.setattr(tuning._comm, "communicator", lambda group=None: types.SimpleNamespace(device=0))
    monkeypatch.setattr(tuning, "_rand", lambda shape, dtype, device: seen.append(tuple(shape)) or meta(*shape, dtype=dtype))
    monkeypatch.setattr(tuning, "_scale", lambda device: meta(dtype=F32))
    monkeypatch.setattr(tuning, "_sync", lambda device: seen.append(("budget", C.tuner_budget_s())) or
                        seen.append(("mode", C.tuner_mode())))
    out = weave.tune([
        {"op": "all_gather_matmul", "M": 64, "N": 48, "K": 32},
        {"op": "all_gather_matmul", "M": 64, "N": 48, "K": 32, "weight": "kn"},
        {"op": "all_gather_matmul", "M": 64, "N": 48, "K": 32, "dtype": "fp8"},
        {"op": "matmul_reduce_scatter", "M": 30, "N": 48, "K": 32, "dtype": "fp8"},
        {"op": "matmul_all_reduce", "M": 30, "N": 48, "K": 32},
        {"op": "ring_attention", "B": 1, "S": 100, "Hq": 4, "Hkv": 2, "D": 64},
        {"op": "ulysses_attention", "B": 1, "S": 101, "Hq": 4, "Hkv": 2, "D": 64, "causal": False},
    ], budget_s=0.25, verbose=False)
    assert [r["op"] for r in out] == ["all_gather_matmul"] * 3 + ["matmul_reduce_scatter", "matmul_all_reduce",
                                                                 "ring_attention", "ulysses_attention"]
    assert not any(r["searched"] for r in out)  # fakes run no search
    assert C.tuner_budget_s() == budget and C.tuner_mode() == mode
    # tune() searches whatever WEAVE_TUNER says (the default, the cost model, would time nothing).
    assert {x for x in seen if x[0] == "mode"} == {("mode", "search")}
    seen = [x for x in seen if x[0] != "mode"]
    # B as w.t() (N x K drawn) or K x N; A's shard 32 of 64 rows; rank 1's zigzag chunks of 100 rows
    # (2 of 4 chunks of 25) and its Ulysses shard of 101 (50; rank 0 holds 51).
    assert seen[:6] == [(48, 32), (32, 32), ("budget", 0.25), (32, 48), (32, 32), ("budget", 0.25)]
    assert seen[-8:] == [(1, 50, 4, 64), (1, 50, 2, 64), (1, 50, 2, 64), ("budget", 0.25),
                         (1, 50, 4, 64), (1, 50, 2, 64), (1, 50, 2, 64), ("budget", 0.25)]
    # The whole list is checked before any call runs (a bad last call costs no search).
    seen.clear()
    good = {"op": "matmul_all_reduce", "M": 30, "N": 48, "K": 32}
    for bad, message in [
        ({"op": "matmul_reduce_scatter", "M": 30, "N": 48, "K": 32, "dtype": "fp8", "weight": "kn"}, "fp8 takes"),
        ({"op": "all_gather_matmul", "M": 30, "N": 48, "K": 40, "dtype": "fp8"}, "K a multiple of 16"),
        ({"op": "all_gather_matmul", "M": 63, "N": 48, "K": 32}, "not a multiple of the 2 ranks"),
    ]:
        with pytest.raises(ValueError, match=re.escape(message)):
            weave.tune([good, bad], verbose=False)
    assert seen == [], "a call ran before the list was checked"
