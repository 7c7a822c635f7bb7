"""GPU tests in one process (a world of 1, no torch.distributed): every op against a float32 torch
reference on random data of ragged shapes (not tile multiples), outputs and staging buffers
poisoned (NaN) first. Skipped without a Hopper GPU. Multi-rank: test_multirank.py (torchrun)."""
import gc
import os
import subprocess
import sys

import pytest
import torch

import weave
from refs import (attention_ref, check_attention, check_close, check_fp8_partials, check_gemm, cuda_generator, fp8,
                  graph_replays, poison, qkv, rand, refill)

pytestmark = pytest.mark.gpu
BF, F16, F32 = torch.bfloat16, torch.float16, torch.float32
E4 = torch.float8_e4m3fn


@pytest.fixture
def comm(monkeypatch):
    poison(monkeypatch)
    return weave.init()


def test_init_is_cached(comm):
    assert weave.init() is comm and comm.world == 1 and comm.rank == 0
    assert comm.device == torch.cuda.current_device()


def test_empty_and_release(comm):
    t = weave.empty((1000, 3), F32)
    assert t.shape == (1000, 3) and t.dtype == F32 and t.device.index == comm.device and t.is_contiguous()
    assert weave.is_symmetric(t) and weave.is_symmetric(t[10:20]) and comm.is_symmetric(t.view(-1)[7:])
    assert not weave.is_symmetric(torch.empty(1000, 3, device="cuda"))
    t.fill_(1.5)
    assert float(t.sum()) == 4500.0
    b = weave.empty((17, 5), BF)
    assert b.dtype == BF and weave.is_symmetric(b)
    used = comm.heap_used
    del t, b
    gc.collect()
    assert comm._c.pending_releases >= 2
    keep = weave.empty((1,), torch.uint8)  # the next allocation hands the released buffers back
    assert comm._c.pending_releases == 0 and comm.heap_used < used
    del keep


SIZES = [1, 7, 1000, 4099, 300001, 3000017]


@pytest.mark.parametrize("dtype", [BF, F16, F32])
@pytest.mark.parametrize("n", SIZES)
def test_all_reduce(comm, seed, dtype, n):
    x = rand((n,), dtype, seed, n)
    y = weave.all_reduce(x)
    assert y.dtype == dtype and not weave.is_symmetric(y)
    assert torch.equal(y, x)
    s = weave.empty((n,), dtype)  # symmetric input: no staging copy
    s.copy_(x)
    assert torch.equal(weave.all_reduce(s), x)


@pytest.mark.parametrize("dtype", [BF, F16, F32])
@pytest.mark.parametrize("shape, dim", [((133,), 0), ((5, 77, 3), 1), ((5, 77, 3), -1), ((2, 3, 4, 5, 6), 2)])
def test_shard_collectives(comm, seed, dtype, shape, dim):
    x = rand(shape, dtype, seed, shape)
    assert torch.equal(weave.all_gather(x, dim), x)
    assert torch.equal(weave.all_gather(x, dim, full_size=x.shape[dim]), x)
    assert torch.equal(weave.reduce_scatter(x, dim), x)


@pytest.mark.parametrize("dtype", [BF, F16, F32])
def test_all_to_all(comm, seed, dtype):
    x = rand((2, 77, 6, 64), dtype, seed)
    assert torch.equal(weave.all_to_all(x, "seq_to_head"), x)
    assert torch.equal(weave.all_to_all(x, "head_to_seq"), x)


GEMMS = [(1, 8, 8), (129, 200, 72), (333, 264, 1000)]


@pytest.mark.parametrize("M, N, K", GEMMS)
def test_matmul(comm, seed, M, N, K):
    A = rand((M, K), BF, seed, "A")
    B = rand((K, N), BF, seed, "B")
    W = rand((N, K), BF, seed, "W")  # nn.Linear layout
    check_gemm(weave.matmul(A, B), A, B, "matmul KN")
    check_gemm(weave.matmul(A, W.t()), A, W.t(), "matmul NK")
    A3 = rand((3, M, K), BF, seed, "A3")
    check_gemm(weave.matmul(A3, W.t()).flatten(0, 1), A3.flatten(0, 1), W.t(), "matmul 3-D")


@pytest.mark.parametrize("M, N, K", GEMMS[1:])
def test_all_gather_matmul(comm, seed, M, N, K):
    A = rand((M, K), BF, seed, "A")
    B = rand((K, N), BF, seed, "B")
    W = rand((40, K), BF, seed, "W")
    Ag, (C1, C2) = weave.all_gather_matmul(A, [B, W.t()])
    assert torch.equal(Ag, A)
    check_gemm(C1, A, B, "ag_gemm B")
    check_gemm(C2, A, W.t(), "ag_gemm second B (plain GEMM)")
    Ag, (C,) = weave.all_gather_matmul(A, [W.t()], return_A=False)  # the fused kernel reads the weight as N x K
    assert Ag is None
    check_gemm(C, A, W.t(), "ag_gemm NK weight")
    A3 = rand((M, 3, K), BF, seed, "A3").movedim(0, 1)  # (3, M, K), rows along dim 1
    Ag, (C,) = weave.all_gather_matmul(A3, [B], gather_dim=1)
    assert torch.equal(Ag, A3) and C.shape == (3, M, N)
    check_gemm(C.movedim(1, 0).flatten(0, 1), A3.movedim(1, 0).flatten(0, 1), B, "ag_gemm gather_dim 1")


@pytest.mark.parametrize("M, N, K", GEMMS[1:])
def test_matmul_reduce_scatter_and_all_reduce(comm, seed, M, N, K):
    A = rand((M, K), BF, seed, "A")
    W = rand((N, K), BF, seed, "W")
    check_gemm(weave.matmul_reduce_scatter(A, W.t()), A, W.t(), "gemm_rs")
    check_gemm(weave.matmul_reduce_scatter(A, W.t(), "avg"), A, W.t(), "gemm_rs avg")
    check_gemm(weave.matmul_all_reduce(A, W.t()), A, W.t(), "gemm_ar")
    A3 = rand((2, M, K), BF, seed, "A3")
    out = weave.matmul_reduce_scatter(A3, W.t())
    check_gemm(out.flatten(0, 1), A3.flatten(0, 1), W.t(), "gemm_rs 3-D")


@pytest.mark.parametrize("M, N, K", [(129, 200, 272), (333, 264, 1008)])
def test_fp8_tp(comm, seed, M, N, K):
    """all_gather_scaled_matmul and scaled_matmul_reduce_scatter at a world of 1: fp8 (e4m3) operands,
    per-tensor scales of different magnitudes, fp8 nn.Linear weights (w.t()), ragged M."""
    A = fp8((M, K), E4, seed, "A")
    w1, w2 = fp8((N, K), E4, seed, "w1"), fp8((40, K), E4, seed, "w2")
    sa, sb1, sb2 = (torch.tensor(v, device="cuda") for v in (0.75, [0.3125], 4.0))
    Ag, (C1, C2) = weave.all_gather_scaled_matmul(A, [w1.t(), w2.t()], sa, [sb1, sb2])
    assert Ag.dtype == E4 and torch.equal(Ag.view(torch.uint8), A.view(torch.uint8)), "gathered A"
    check_fp8_partials(C1, [(A.float() * sa, w1.float().t() * sb1)], K, "ag fp8")
    check_fp8_partials(C2, [(A.float() * sa, w2.float().t() * sb2)], K, "ag fp8 second B (the fp8 GEMM)")
    A3 = fp8((M, 3, K), E4, seed, "A3").movedim(0, 1)  # (3, M, K), rows along dim 1
    Ag, (C,) = weave.all_gather_scaled_matmul(A3, [w1.t()], sa, [sb1], gather_dim=1, return_A=False)
    assert Ag is None and C.shape == (3, M, N)
    check_fp8_partials(C.movedim(1, 0).flatten(0, 1), [(A3.movedim(1, 0).flatten(0, 1).float() * sa,
                                                         w1.float().t() * sb1)], K, "ag fp8 gather_dim 1")
    parts = [(A.float() * sa, w2.float().t() * sb2)]
    check_fp8_partials(weave.scaled_matmul_reduce_scatter(A, w2.t(), sa, sb2), parts, K, "rs fp8")
    check_fp8_partials(weave.scaled_matmul_reduce_scatter(A, w2.t(), sa, sb2, "avg"), parts, K, "rs fp8 avg", 1)


def test_tune(comm):
    """weave.tune searches a shape (in a fresh process with the tuner's file off, so the first call
    must search), the operator's call of that shape then runs no search, a second tune finds it
    cached, and the budget is restored."""
    code = """
import torch, weave
from refs import check_gemm, rand
C = weave._lib.lib()
budget = C.tuner_budget_s()
spec = {"op": "matmul_reduce_scatter", "M": 1096, "N": 520, "K": 264}
(r,) = weave.tune([spec], budget_s=0.05, verbose=False)
assert r["searched"] and r["op"] == "matmul_reduce_scatter" and r["spec"]["weight"] == "nk" and r["seconds"] > 0, r
assert C.tuner_budget_s() == budget, "tune left its budget behind"
searches = C.tuner_searches()
A, W = rand((1096, 264), torch.bfloat16, 7, "A"), rand((520, 264), torch.bfloat16, 7, "W")
check_gemm(weave.matmul_reduce_scatter(A, W.t()), A, W.t(), "gemm_rs after tune")
assert C.tuner_searches() == searches, "the operator searched a shape weave.tune had tuned"
assert not weave.tune([spec], verbose=False)[0]["searched"]
print("ok")
"""
    env = dict(os.environ, WEAVE_TUNER_CACHE="off", PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
                       cwd=os.path.dirname(os.path.abspath(__file__)))
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_attention(comm, seed, D, causal):
    q, k, v = qkv(2, 300, 8, 2, D, seed)
    o, lse = weave.attention(q, k, v, causal=causal)
    check_attention(o, lse, *attention_ref(q, k, v, causal), f"attention D={D} causal={causal}")
    o, lse = weave.attention(q, k, v, causal=causal, scale=0.05)
    check_attention(o, lse, *attention_ref(q, k, v, causal, 0.05), "attention scale 0.05")


@pytest.mark.parametrize("sharding", ["zigzag", "contiguous"])
@pytest.mark.parametrize("causal", [False, True])
def test_sequence_parallel_world1(comm, seed, sharding, causal):
    q, k, v = qkv(1, 333, 4, 2, 128, seed)
    ref_o, ref_lse = attention_ref(q, k, v, causal)
    o, lse = weave.ring_attention(q, k, v, causal, sharding=sharding)
    check_attention(o, lse, ref_o, ref_lse, f"ring {sharding} causal={causal}")
    o = weave.ulysses_attention(q, k, v, causal)
    check_attention(o, None, ref_o, None, f"ulysses causal={causal}")


def test_streams(comm, seed):
    """Calls on another stream order after the previous call's use of the staging buffers."""
    x = rand((1 << 20,), F32, seed)
    side = torch.cuda.Stream()
    y1 = weave.all_reduce(x)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        y2 = weave.all_reduce(x * 2)
    torch.cuda.current_stream().wait_stream(side)
    y3 = weave.all_reduce(x * 3)
    torch.cuda.synchronize()
    assert torch.equal(y1, x) and torch.equal(y2, x * 2) and torch.equal(y3, x * 3)


def test_empty_refused_during_capture(comm):
    """A symmetric tensor made inside a capture is refused (the graph would outlive its memory);
    the heap is unchanged and the next eager one works."""
    used = comm.heap_used
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="during a CUDA graph capture"):
        with torch.cuda.graph(g, stream=side):
            weave.empty((64,), BF)
    assert comm.heap_used == used
    t = weave.empty((64,), BF)
    assert weave.is_symmetric(t)


def _capture_after_warm_up(calls):
    """calls() run eagerly once on a side stream (what a capture needs first: the shapes' signal sets,
    scratch, tuner choices and staging sizes), then captured: (graph, the warm-up's outputs, the
    captured outputs)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        eager = calls()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        outs = calls()
    return g, eager, outs


def _poison_all(outs):
    for o in outs:
        if isinstance(o, (tuple, list)):
            _poison_all(o)
        elif o is not None:
            o.fill_(float("nan"))


def test_collectives_and_sp_graph_capture_and_replay(comm, seed):
    """The collectives and ring / Ulysses attention captured after an eager warm-up, replayed
    graph_replays() times with new inputs and poisoned outputs: every replay checked; an eager call
    after the replays too."""
    x = torch.empty((4099,), dtype=BF, device="cuda")
    y = torch.empty((300001,), dtype=F32, device="cuda")
    q, k, v = (torch.empty((1, 333, 4, 128), dtype=BF, device="cuda") for _ in range(3))
    gen = cuda_generator(seed, "collectives-sp")

    def calls():
        return (weave.all_reduce(x), weave.all_gather(y, 0), weave.reduce_scatter(y, 0),
                weave.ring_attention(q, k, v, True), weave.ulysses_attention(q, k, v, True))

    def check(outs, what):
        ar, ag, rs, (o, lse), uo = outs
        assert torch.equal(ar, x) and torch.equal(ag, y) and torch.equal(rs, y), f"{what}: collectives"
        ref_o, ref_lse = attention_ref(q, k, v, True)
        check_attention(o, lse, ref_o, ref_lse, f"{what}: ring")
        check_attention(uo, None, ref_o, None, f"{what}: ulysses")

    refill(gen, x, y, q, k, v)
    g, eager, outs = _capture_after_warm_up(calls)
    check(eager, "eager warm-up")
    for i in range(1, graph_replays() + 1):
        refill(gen, x, y, q, k, v)
        _poison_all(outs)
        g.replay()
        check(outs, f"replay {i}")
    refill(gen, x, y, q, k, v)
    check(calls(), "eager after the replays")


def test_tp_graph_capture_and_replay(comm, seed):
    """TP operators captured after an eager warm-up, replayed graph_replays() times with new inputs
    and poisoned outputs: every replay correct."""
    A = torch.empty((333, 136), dtype=BF, device="cuda")
    B = torch.empty((136, 264), dtype=BF, device="cuda")
    gen = cuda_generator(seed, "tp")

    def calls():
        _, (C,) = weave.all_gather_matmul(A, [B], return_A=False)
        return C, weave.matmul_reduce_scatter(A, B), weave.matmul_all_reduce(A, B)

    def check(outs, what):
        for o, op in zip(outs, ("ag_gemm", "gemm_rs", "gemm_ar")):
            check_gemm(o, A, B, f"{op} {what}")

    refill(gen, A, B)
    g, eager, outs = _capture_after_warm_up(calls)
    check(eager, "eager warm-up")
    for i in range(1, graph_replays() + 1):
        refill(gen, A, B)
        _poison_all(outs)
        g.replay()
        check(outs, f"replay {i}")


def test_all_gather_matmul_return_A_graph_capture_and_replay(comm, seed):
    """all_gather_matmul returning the gathered A (its copy out of the staging buffer is captured
    too), with a second B as an nn.Linear weight's .t() (the plain GEMM on the gathered rows), and
    along gather_dim 1: replayed graph_replays() times with new inputs and poisoned outputs, the
    gathered A equal to A and every product checked at every replay."""
    M, K, N = 333, 136, 264
    A = torch.empty((M, K), dtype=BF, device="cuda")
    B = torch.empty((K, N), dtype=BF, device="cuda")
    W = torch.empty((40, K), dtype=BF, device="cuda")  # nn.Linear layout: passed as W.t()
    A3_rows = torch.empty((M, 3, K), dtype=BF, device="cuda")
    A3 = A3_rows.movedim(0, 1)  # (3, M, K), gathered along dim 1
    gen = cuda_generator(seed, "ag-return-A")

    def calls():
        Ag, (C1, C2) = weave.all_gather_matmul(A, [B, W.t()])
        Ag3, (C3,) = weave.all_gather_matmul(A3, [W.t()], gather_dim=1)
        return Ag, C1, C2, Ag3, C3

    def check(outs, what):
        Ag, C1, C2, Ag3, C3 = outs
        assert torch.equal(Ag, A), f"{what}: gathered A"
        assert Ag3.shape == (3, M, K) and torch.equal(Ag3, A3), f"{what}: gathered A along dim 1"
        check_gemm(C1, A, B, f"{what}: first B")
        check_gemm(C2, A, W.t(), f"{what}: second B (nn.Linear weight)")
        assert C3.shape == (3, M, 40), f"{what}: {tuple(C3.shape)}"
        check_gemm(C3.movedim(1, 0).flatten(0, 1), A3_rows.flatten(0, 1), W.t(), f"{what}: gather_dim 1")

    refill(gen, A, B, W, A3_rows)
    g, eager, outs = _capture_after_warm_up(calls)
    check(eager, "eager warm-up")
    for i in range(1, graph_replays() + 1):
        refill(gen, A, B, W, A3_rows)
        _poison_all(outs)
        g.replay()
        check(outs, f"replay {i}")


@pytest.mark.parametrize("D, causal, scale", [(64, True, None), (128, False, 0.05)])
def test_attention_graph_capture_and_replay(comm, seed, D, causal, scale):
    """weave.attention (GQA: 8 query heads on 2 KV heads, S = 300, not a tile multiple) captured
    after an eager warm-up, replayed graph_replays() times with new q, k, v and poisoned outputs:
    o and lse of every replay against the float32 reference."""
    q = torch.empty((2, 300, 8, D), dtype=BF, device="cuda")
    k, v = (torch.empty((2, 300, 2, D), dtype=BF, device="cuda") for _ in range(2))
    gen = cuda_generator(seed, "attention", D)

    def calls():
        return weave.attention(q, k, v, causal=causal, scale=scale)

    def check(outs, what):
        check_attention(*outs, *attention_ref(q, k, v, causal, scale), f"attention D={D} causal={causal} {what}")

    refill(gen, q, k, v)
    g, eager, outs = _capture_after_warm_up(calls)
    check(eager, "eager warm-up")
    for i in range(1, graph_replays() + 1):
        refill(gen, q, k, v)
        _poison_all(outs)
        g.replay()
        check(outs, f"replay {i}")


def test_compile_fullgraph(comm, seed):
    A = rand((129, 72), BF, seed, "A")
    W = rand((200, 72), BF, seed, "W")

    def f(a, w):
        return weave.all_reduce(weave.matmul(a, w.t())) * 2

    out = torch.compile(f, backend="aot_eager", fullgraph=True)(A, W)
    check_close(out, f(A, W), 0, "compiled vs eager")


def test_compile_reduce_overhead(comm, seed):
    """torch.compile(mode="reduce-overhead"): inductor's CUDA graph trees record weave's ops after
    their warm-up runs and replay them; every call's result is checked with new inputs."""
    x = torch.empty((4099,), dtype=BF, device="cuda")
    A = torch.empty((129, 72), dtype=BF, device="cuda")
    W = rand((200, 72), BF, seed, "W")

    def f(x, a, w):
        return weave.all_reduce(x) * 2, weave.matmul(a, w.t())

    g = torch.compile(f, mode="reduce-overhead", fullgraph=True)
    for i in range(8):
        x.copy_(rand(x.shape, BF, seed, "x", i))
        A.copy_(rand(A.shape, BF, seed, "A", i))
        y, c = g(x, A, W)
        torch.cuda.synchronize()
        assert torch.equal(y, x * 2), f"all_reduce, call {i}"
        check_gemm(c, A, W.t(), f"matmul, call {i}")


def _compiled_cases():
    """Every operator test_gpu.py runs at a world of 1, as name -> (function to compile, inputs of
    call i from (seed, i), check of its outputs against a torch reference). The functions hold
    weave's operators and views only, so inductor compiles no kernel of its own around them."""
    def collective_inputs(dtype, shape):
        return lambda seed, i: (rand(shape, dtype, seed, "x", i),)

    def equal_to_input(outs, x, what):
        for o in (outs if isinstance(outs, tuple) else (outs,)):
            assert torch.equal(o, x), what

    def gemm_inputs(seed, i, M=129, N=200, K=72):
        return rand((M, K), BF, seed, "A", i), rand((K, N), BF, seed, "B", i), rand((N, K), BF, seed, "W", i)

    def check_matmul(outs, A, B, W, what):
        check_gemm(outs[0], A, B, what + " K x N")
        check_gemm(outs[1], A, W.t(), what + " weight.t()")

    def check_ag(outs, A, B, W, what):
        Ag, C1, C2, C = outs
        assert torch.equal(Ag, A), what + " gathered A"
        check_gemm(C1, A, B, what + " first B")
        check_gemm(C2, A, W.t(), what + " second B")
        check_gemm(C, A, W.t(), what + " return_A=False")

    def check_rs(outs, A, B, W, what):
        for o in outs:
            check_gemm(o, A, W.t(), what)

    def fp8_inputs(seed, i, M=129, N=200, K=272):
        return (fp8((M, K), E4, seed, "A", i), fp8((N, K), E4, seed, "w", i),
                torch.tensor(0.75, device="cuda"), torch.tensor([2.0 ** (i % 3 - 1)], device="cuda"))

    def check_fp8(C, A, w, sa, sb, what, roundings=0):
        check_fp8_partials(C, [(A.float() * sa, w.float().t() * sb)], A.shape[1], what, roundings)

    def check_ag_fp8(outs, A, w, sa, sb, what):
        Ag, (C,) = outs
        assert Ag.dtype == E4 and torch.equal(Ag.view(torch.uint8), A.view(torch.uint8)), what + " gathered A"
        check_fp8(C, A, w, sa, sb, what)

    def check_rs_fp8(outs, A, w, sa, sb, what):
        check_fp8(outs[0], A, w, sa, sb, what + " sum")
        check_fp8(outs[1], A, w, sa, sb, what + " avg", 1)

    def attn_inputs(seed, i):
        return qkv(1, 333, 4, 2, 128, seed, i)

    def check_attn(outs, q, k, v, what):
        ref_o, ref_lse = attention_ref(q, k, v, True)
        if isinstance(outs, tuple):
            check_attention(*outs, ref_o, ref_lse, what)
        else:
            check_attention(outs, None, ref_o, None, what)

    def ag_calls(a, b, w):
        Ag, (C1, C2) = weave.all_gather_matmul(a, [b, w.t()])
        _, (C,) = weave.all_gather_matmul(a, [w.t()], return_A=False)
        return Ag, C1, C2, C

    return {
        "all_reduce": (lambda x: weave.all_reduce(x), collective_inputs(F16, (4099,)), equal_to_input),
        "all_gather": (lambda x: weave.all_gather(x, 1), collective_inputs(F32, (5, 77, 3)), equal_to_input),
        "reduce_scatter": (lambda x: weave.reduce_scatter(x, -1), collective_inputs(BF, (5, 77, 3)), equal_to_input),
        "all_to_all": (lambda x: (weave.all_to_all(x, "seq_to_head"), weave.all_to_all(x, "head_to_seq")),
                       collective_inputs(BF, (2, 77, 6, 64)), equal_to_input),
        "matmul": (lambda a, b, w: (weave.matmul(a, b), weave.matmul(a, w.t())), gemm_inputs, check_matmul),
        "all_gather_matmul": (ag_calls, gemm_inputs, check_ag),
        "matmul_reduce_scatter": (lambda a, b, w: (weave.matmul_reduce_scatter(a, w.t()),
                                                   weave.matmul_reduce_scatter(a, w.t(), "avg")), gemm_inputs, check_rs),
        "matmul_all_reduce": (lambda a, b, w: (weave.matmul_all_reduce(a, w.t()),), gemm_inputs, check_rs),
        "all_gather_scaled_matmul": (lambda a, w, sa, sb: weave.all_gather_scaled_matmul(a, [w.t()], sa, [sb]),
                                     fp8_inputs, check_ag_fp8),
        "scaled_matmul_reduce_scatter": (lambda a, w, sa, sb: (weave.scaled_matmul_reduce_scatter(a, w.t(), sa, sb),
                                                               weave.scaled_matmul_reduce_scatter(a, w.t(), sa, sb, "avg")),
                                         fp8_inputs, check_rs_fp8),
        "attention": (lambda q, k, v: weave.attention(q, k, v, causal=True), attn_inputs, check_attn),
        "ring_attention": (lambda q, k, v: weave.ring_attention(q, k, v, True), attn_inputs, check_attn),
        "ulysses_attention": (lambda q, k, v: weave.ulysses_attention(q, k, v, True), attn_inputs, check_attn),
    }


@pytest.mark.parametrize("op", list(_compiled_cases()))
def test_compile_reduce_overhead_every_op(comm, seed, op):
    """Each operator under torch.compile(mode="reduce-overhead", fullgraph=True): inductor's CUDA
    graph trees run the first call eagerly, record the second and replay the rest; every call has
    fresh inputs and its outputs are checked before the next call (a replay overwrites them). No
    call may be left out of the CUDA graphs (inductor counts the functions it skips)."""
    from torch._dynamo.utils import counters

    f, inputs, check = _compiled_cases()[op]
    skips = counters["inductor"]["cudagraph_skips"]
    g = torch.compile(f, mode="reduce-overhead", fullgraph=True)
    for i in range(6):
        args = inputs(seed, i)
        torch.compiler.cudagraph_mark_step_begin()
        outs = g(*args)
        torch.cuda.synchronize()
        check(outs, *args, f"{op}, call {i}")
    assert counters["inductor"]["cudagraph_skips"] == skips, f"{op}: inductor did not capture it in a CUDA graph"


def test_errors_on_gpu(comm):
    with pytest.raises(ValueError, match="not contiguous"):
        weave.all_reduce(torch.ones(8, 4, device="cuda").t())
    with pytest.raises(RuntimeError):  # the C++ check: K not a multiple of 8
        weave.matmul(torch.ones(8, 12, dtype=BF, device="cuda"), torch.ones(12, 8, dtype=BF, device="cuda"))
