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
from refs import attention_ref, check_attention, check_close, check_fp8_partials, check_gemm, fp8, poison, qkv, rand

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


@pytest.mark.parametrize("dtype", [BF, F32])
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


def test_collectives_and_sp_graph_capture_and_replay(comm, seed):
    """The collectives and ring / Ulysses attention captured after an eager warm-up, replayed with
    new inputs and poisoned outputs: each replay correct; an eager call after the replays too."""
    x = torch.empty((4099,), dtype=BF, device="cuda")
    y = torch.empty((300001,), dtype=F32, device="cuda")
    q, k, v = (torch.empty((1, 333, 4, 128), dtype=BF, device="cuda") for _ in range(3))

    def fill(i):
        x.copy_(rand(x.shape, BF, seed, "x", i))
        y.copy_(rand(y.shape, F32, seed, "y", i))
        for t, name in ((q, "q"), (k, "k"), (v, "v")):
            t.copy_(rand(t.shape, BF, seed, name, i))

    def calls():
        return (weave.all_reduce(x), weave.all_gather(y, 0), weave.reduce_scatter(y, 0),
                weave.ring_attention(q, k, v, True), weave.ulysses_attention(q, k, v, True))

    def check(outs, what):
        ar, ag, rs, (o, lse), uo = outs
        assert torch.equal(ar, x) and torch.equal(ag, y) and torch.equal(rs, y), f"{what}: collectives"
        ref_o, ref_lse = attention_ref(q, k, v, True)
        check_attention(o, lse, ref_o, ref_lse, f"{what}: ring")
        check_attention(uo, None, ref_o, None, f"{what}: ulysses")

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fill(0)
        calls()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        outs = calls()
    for i in range(1, 101):
        fill(i)
        for o in outs:
            for t in (o if isinstance(o, tuple) else (o,)):
                t.fill_(float("nan"))
        g.replay()
        if i % 25 == 0:
            torch.cuda.synchronize()
            check(outs, f"replay {i}")
    fill(101)
    check(calls(), "eager after the replays")


def test_tp_graph_capture_and_replay(comm, seed):
    """TP operators captured after an eager warm-up, replayed with new inputs: each replay correct."""
    A = torch.empty((333, 136), dtype=BF, device="cuda")
    B = torch.empty((136, 264), dtype=BF, device="cuda")

    def calls():
        _, (C,) = weave.all_gather_matmul(A, [B], return_A=False)
        return C, weave.matmul_reduce_scatter(A, B), weave.matmul_all_reduce(A, B)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        A.copy_(rand(A.shape, BF, seed, "A", 0))
        B.copy_(rand(B.shape, BF, seed, "B", 0))
        calls()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        outs = calls()
    for i in range(1, 101):
        A.copy_(rand(A.shape, BF, seed, "A", i))
        B.copy_(rand(B.shape, BF, seed, "B", i))
        for o in outs:
            o.fill_(float("nan"))
        g.replay()
        if i % 25 == 0:
            torch.cuda.synchronize()
            for o, what in zip(outs, ("ag_gemm", "gemm_rs", "gemm_ar")):
                check_gemm(o, A, B, f"{what} replay {i}")


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


def test_errors_on_gpu(comm):
    with pytest.raises(ValueError, match="not contiguous"):
        weave.all_reduce(torch.ones(8, 4, device="cuda").t())
    with pytest.raises(RuntimeError):  # the C++ check: K not a multiple of 8
        weave.matmul(torch.ones(8, 12, dtype=BF, device="cuda"), torch.ones(12, 8, dtype=BF, device="cuda"))
