"""GPU tests (one process) of the single-GPU GEMM family: weave.matmul's options (A read as the
transpose of a contiguous K x M matrix, bias, fp32 output, out= and accumulate), weave.scaled_mm
(fp8, per-tensor and block scales) and weave.grouped_mm (MoE grouped GEMM, its capacity status),
each against a float32 torch reference on fresh random data of ragged shapes, outputs poisoned
with NaN first (so an element the kernel never writes fails). Skipped without a Hopper GPU.

Bounds, per element:
- bf16 GEMM, bf16 output: refs.check_gemm, 2^-7 |A| @ |B| (a bf16 rounding of the dot product's
  scale; a bias adds its |value| to the scale).
- bf16 GEMM, fp32 output: 2^-12 |A| @ |B|: fp32 accumulation only (about sqrt(K) 2^-24 of the
  scale for random signs), far below one bf16 rounding, so a bf16-rounded output fails it.
- fp8 GEMMs: check/gemm_fp8_ref.hpp's bound (kernels/gemm_fp8/README.md, "Numerics"):
  |x - r| <= rel |r| + scale s, s = sqrt(sum_k (a'_mk b'_kn)^2) of the dequantized operands;
  per tensor rel = 2^-8 + 2^-14 K/32, scale = 2^-10 + 2^-12 K/32 (the tensor core's truncating
  fp8 accumulation over all of K); block scaled rel = 2^-8, scale = 3 2^-10 (promoted every 128).
"""
import pytest
import torch

import weave
from refs import check_close, check_gemm, fp8, poison, rand

pytestmark = pytest.mark.gpu
BF, F32, I32 = torch.bfloat16, torch.float32, torch.int32
E4, E5 = torch.float8_e4m3fn, torch.float8_e5m2


@pytest.fixture
def gpu(monkeypatch):
    poison(monkeypatch)  # outputs of weave's operators start as NaN
    weave._lib.require_gpu("tests")


def gemm_ref(A, B, bias=None):
    """(A @ B + bias, |A| @ |B| + |bias|) in float32."""
    ref = A.float() @ B.float()
    scale = A.float().abs() @ B.float().abs()
    if bias is not None:
        ref = ref + bias.float()
        scale = scale + bias.float().abs()
    return ref, scale


# M multiples of 8 (the K x M layout's row pitch), none a tile multiple; M = 40 takes the decode tile.
KM_SHAPES = [(8, 8, 8), (40, 264, 1000), (136, 200, 72), (328, 264, 1000)]


@pytest.mark.parametrize("M, N, K", KM_SHAPES)
def test_matmul_a_transposed(gpu, seed, M, N, K):
    """A = X.t() of a contiguous K x M X (dY^T of a weight gradient), read in place, B either layout."""
    X = rand((K, M), BF, seed, "X")
    B = rand((K, N), BF, seed, "B")
    W = rand((N, K), BF, seed, "W")
    A = X.t()
    assert not A.is_contiguous()
    check_gemm(weave.matmul(A, B), A, B, "matmul A KM, B KN")
    check_gemm(weave.matmul(A, W.t()), A, W.t(), "matmul A KM, B NK")


@pytest.mark.parametrize("M, N, K", [(1, 8, 8), (129, 200, 72), (333, 264, 1000), (40, 264, 1000)])
@pytest.mark.parametrize("a_km", [False, True])
@pytest.mark.parametrize("bias_dtype", [None, BF, F32])
@pytest.mark.parametrize("out_dtype", [BF, F32])
def test_matmul_bias_and_fp32_output(gpu, seed, M, N, K, a_km, bias_dtype, out_dtype):
    if a_km and M % 8:
        M += 8 - M % 8  # the K x M layout needs M % 8 == 0
    A = rand((K, M), BF, seed, "X").t() if a_km else rand((M, K), BF, seed, "A")
    W = rand((N, K), BF, seed, "W")
    bias = None if bias_dtype is None else rand((N,), bias_dtype, seed, "bias")
    y = weave.matmul(A, W.t(), bias, out_dtype=out_dtype)
    assert y.dtype == out_dtype and y.shape == (M, N)
    ref, scale = gemm_ref(A, W.t(), bias)
    rel = 2.0 ** -7 if out_dtype == BF else 2.0 ** -12
    check_close(y, ref, rel * scale + 1e-6, f"matmul km={a_km} bias={bias_dtype} out={out_dtype}")


@pytest.mark.parametrize("M, N, K", [(129, 200, 72), (136, 264, 1000)])
@pytest.mark.parametrize("out_dtype", [BF, F32])
def test_matmul_out_and_accumulate(gpu, seed, M, N, K, out_dtype):
    """out= overwrites (a NaN out fails wherever it is not written); accumulate adds to it."""
    A = rand((M, K), BF, seed, "A")
    W = rand((N, K), BF, seed, "W")
    bias = rand((N,), F32, seed, "bias")
    ref, scale = gemm_ref(A, W.t(), bias)
    rel = 2.0 ** -7 if out_dtype == BF else 2.0 ** -12
    out = torch.full((M, N), float("nan"), dtype=out_dtype, device="cuda")
    assert weave.matmul(A, W.t(), bias, out=out) is out
    check_close(out, ref, rel * scale + 1e-6, f"matmul out= {out_dtype}")
    C0 = rand((M, N), out_dtype, seed, "C0")
    out = C0.clone()
    weave.matmul(A, W.t(), bias, out=out, accumulate=True)
    # One more rounding of the sum in the output's type: |C0| joins the scale.
    check_close(out, ref + C0.float(), rel * (scale + C0.float().abs()) + 1e-6, f"matmul accumulate {out_dtype}")
    if M % 8 == 0:  # weight-gradient accumulation: out += dY^T X with dY read in place
        dy, x = rand((K, M), BF, seed, "dy"), rand((K, N), BF, seed, "x")
        acc = C0.clone()
        weave.matmul(dy.t(), x, out=acc, accumulate=True)
        r, s = gemm_ref(dy.t(), x)
        check_close(acc, r + C0.float(), rel * (s + C0.float().abs()) + 1e-6, f"accumulate dY^T X {out_dtype}")


def test_matmul_graphs_replayed_on_two_streams_at_once(gpu, seed):
    """Two graphs captured on one stream, each a matmul whose K the planner splits where the device has
    about 132 SMs (64 x 4096 x 14336: 64x128 split 4; 128 x 4096 x 4096: split 2), replayed at once on
    two other streams beside an eager call on the capture stream, 20 rounds of new inputs and NaN
    outputs. Each graph owns its splits' workspace (kernels/gemm/split_k_workspace.hpp); one shared
    workspace mixes the calls' partial sums. The eager calls on the capture stream come first, so its
    cached workspace is large enough for a capture that would take it. Per element within 2^-8 |r| +
    2^-10 s, s = sqrt(sum_k (a b)^2): check/gemm_ref.hpp's bound, which a lost or doubled K split fails."""
    shapes = [(64, 4096, 14336), (128, 4096, 4096)]
    xs = [rand((M, K), BF, seed, "x", i) for i, (M, N, K) in enumerate(shapes)]
    ws = [rand((N, K), BF, seed, "w", i) for i, (M, N, K) in enumerate(shapes)]
    x_eager = torch.empty_like(xs[0])
    cap, s1, s2 = torch.cuda.Stream(), torch.cuda.Stream(), torch.cuda.Stream()
    cap.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(cap):
        for x, w in zip(xs, ws):
            weave.matmul(x, w.t())
    graphs, outs = [], []
    for x, w in zip(xs, ws):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=cap):
            outs.append(weave.matmul(x, w.t()))
        graphs.append(g)
    for r in range(20):
        for i, (M, N, K) in enumerate(shapes):
            xs[i].copy_(rand((M, K), BF, seed, "x", i, r))
        x_eager.copy_(rand(tuple(x_eager.shape), BF, seed, "eager", r))
        torch.cuda.synchronize()
        for g, st, y in zip(graphs, (s1, s2), outs):
            with torch.cuda.stream(st):
                y.fill_(float("nan"))
                g.replay()
        with torch.cuda.stream(cap):
            y_eager = weave.matmul(x_eager, ws[0].t())
        torch.cuda.synchronize()
        for what, y, x, w in [("graph 1", outs[0], xs[0], ws[0]), ("graph 2", outs[1], xs[1], ws[1]),
                              ("eager on the capture stream", y_eager, x_eager, ws[0])]:
            A, B = x.float(), w.t().float()
            s = ((A * A) @ (B * B)).sqrt()
            ref = A @ B
            check_close(y, ref, 2.0 ** -8 * ref.abs() + 2.0 ** -10 * s, f"{what}, round {r}")


def test_matmul_options_errors_on_gpu(gpu):
    A = torch.ones(16, 64, dtype=BF, device="cuda")
    with pytest.raises(ValueError, match="bias is on cpu"):
        weave.matmul(A, A.t(), torch.ones(16))
    with pytest.raises(ValueError, match="M % 8 == 0"):
        weave.matmul(torch.ones(64, 12, dtype=BF, device="cuda").t(), A.t())
    with pytest.raises(RuntimeError):  # the C++ check: N = 12 not a multiple of 8
        weave.matmul(torch.ones(64, 16, dtype=BF, device="cuda").t(), torch.ones(64, 12, dtype=BF, device="cuda"))


# ---------------------------------------------------------------------------------------------
# fp8


def fp8_check(y, a_deq, b_deq, rel, scale, what):
    """y vs a_deq @ b_deq (the dequantized, scaled operands) within rel |r| + scale s."""
    ref = a_deq @ b_deq
    s = ((a_deq * a_deq) @ (b_deq * b_deq)).sqrt()
    assert y.dtype == BF and y.shape == ref.shape
    check_close(y, ref, rel * ref.abs() + scale * s + 1e-30, what)


FP8_SHAPES = [(1, 8, 16), (129, 200, 272), (333, 264, 1008), (64, 136, 4096)]
FP8_TYPES = [(E4, E4), (E5, E4), (E4, E5)]


@pytest.mark.parametrize("M, N, K", FP8_SHAPES)
@pytest.mark.parametrize("a_type, b_type", FP8_TYPES)
def test_scaled_mm_per_tensor(gpu, seed, M, N, K, a_type, b_type):
    A = fp8((M, K), a_type, seed, "A")
    w = fp8((N, K), b_type, seed, "w")  # N x K: B = w.t(), torch._scaled_mm's column-major mat2
    sa = torch.tensor(0.75, device="cuda")
    sb = torch.tensor([0.3125], device="cuda")
    y = weave.scaled_mm(A, w.t(), sa, sb)
    T = K / 32
    fp8_check(y, A.float() * sa, w.float().t() * sb, 2.0 ** -8 + 2.0 ** -14 * T, 2.0 ** -10 + 2.0 ** -12 * T,
              f"scaled_mm {a_type}x{b_type} {M}x{N}x{K}")


@pytest.mark.parametrize("M, N, K", FP8_SHAPES)
@pytest.mark.parametrize("a_type, b_type", FP8_TYPES)
def test_scaled_mm_block_scaled(gpu, seed, M, N, K, a_type, b_type):
    A = fp8((M, K), a_type, seed, "A")
    w = fp8((N, K), b_type, seed, "w")
    kb, nb = (K + 127) // 128, (N + 127) // 128
    g = torch.Generator().manual_seed(seed)
    # Log-uniform scales over 2^-6 .. 2^6: a scale applied to the wrong block breaks the bound.
    scale_a = torch.exp2(torch.rand(kb, M, generator=g) * 12 - 6).cuda()
    scale_b = torch.exp2(torch.rand(nb, kb, generator=g) * 12 - 6).cuda()
    y = weave.scaled_mm(A, w.t(), scale_a, scale_b)
    # Dequantized: A'[m, k] = scale_a[k // 128, m] A[m, k], B'[n, k] = scale_b[n // 128, k // 128] w[n, k].
    sa_full = scale_a.t().repeat_interleave(128, dim=1)[:, :K]
    sb_full = scale_b.repeat_interleave(128, dim=0)[:N].repeat_interleave(128, dim=1)[:, :K]
    fp8_check(y, A.float() * sa_full, (w.float() * sb_full).t(), 2.0 ** -8, 3 * 2.0 ** -10,
              f"scaled_mm block {a_type}x{b_type} {M}x{N}x{K}")


def test_scaled_mm_errors_on_gpu(gpu):
    A = torch.zeros(8, 64, device="cuda").to(E4)
    one = torch.ones((), device="cuda")
    with pytest.raises(ValueError, match="scale_b is on cpu"):
        weave.scaled_mm(A, A.t(), one, torch.ones(()))
    with pytest.raises(ValueError, match="both float8_e5m2"):
        weave.scaled_mm(A.to(E5), A.to(E5).t(), one, one)
    with pytest.raises(ValueError, match="transpose of a contiguous N x K"):
        weave.scaled_mm(A, A.t().contiguous(), one, one)


# ---------------------------------------------------------------------------------------------
# MoE grouped GEMM


def grouped_ref_check(y, x, w, counts, what):
    """Each expert's rows of y against x[rows] @ w[e].T (float32, check_gemm's bound); rows past
    sum(counts) are not written by the kernel (grouped_gemm.hpp): they must still hold the NaN
    poison."""
    off = 0
    for e, c in enumerate(counts):
        if c:
            check_gemm(y[off:off + c], x[off:off + c], w[e].t(), f"{what} expert {e}")
        off += c
    assert bool(y[off:].isnan().all()), f"{what}: rows past sum(counts) = {off} were written"


@pytest.mark.parametrize("E, N, K", [(1, 8, 8), (4, 200, 72), (8, 264, 1000), (33, 64, 128)])
@pytest.mark.parametrize("w_layout", ["NK", "KN"])
def test_grouped_mm(gpu, seed, E, N, K, w_layout):
    g = torch.Generator().manual_seed(seed)
    counts = torch.randint(0, 150, (E,), generator=g, dtype=I32)
    if E > 1:
        counts[torch.randint(0, E, (max(1, E // 4),), generator=g)] = 0  # empty experts
    counts[0] += 1  # at least one row (capacity_rows = total below must be positive)
    total = int(counts.sum())
    R = total + 37  # spare capacity: ragged, not a tile multiple
    x = rand((R, K), BF, seed, "x")
    if w_layout == "NK":
        w = rand((E, N, K), BF, seed, "w")
    else:  # an E x K x N stack read in place as w.transpose(1, 2)
        w = rand((E, K, N), BF, seed, "w").transpose(1, 2)
    weave.grouped_mm_status()  # start from clear status words
    y = weave.grouped_mm(x, w, counts.cuda())
    assert y.shape == (R, N) and y.dtype == BF
    grouped_ref_check(y, x, w, counts.tolist(), f"grouped_mm {w_layout} E={E}")
    assert weave.grouped_mm_status() is None
    weave.check_grouped_mm()  # raises nothing
    y = weave.grouped_mm(x, w, counts.cuda(), capacity_rows=total)  # exactly full
    assert y.shape == (total, N)
    grouped_ref_check(y, x[:total], w, counts.tolist(), f"grouped_mm full capacity {w_layout} E={E}")


def test_grouped_mm_capacity_status(gpu, seed):
    """Counts past the capacity (or negative) make the launch write nothing and set the status that
    grouped_mm_status / check_grouped_mm read and clear."""
    E, N, K, R = 4, 64, 128, 300
    x = rand((R, K), BF, seed, "x")
    w = rand((E, N, K), BF, seed, "w")
    weave.grouped_mm_status()
    y = weave.grouped_mm(x, w, torch.tensor([100, 100, 150, 10], dtype=I32, device="cuda"))
    s = weave.grouped_mm_status()
    assert s is not None and s["error"] == "capacity" and s["expert"] == 2 and s["count"] == 150
    assert s["rows"] == 350 and s["capacity"] == R and "capacity" in s["message"]
    assert bool(y.isnan().all()), "a refused launch wrote rows"
    assert weave.grouped_mm_status() is None  # read and cleared
    weave.grouped_mm(x, w, torch.tensor([10, -1, 5, 0], dtype=I32, device="cuda"))
    with pytest.raises(RuntimeError, match="weave.grouped_mm: "):
        weave.check_grouped_mm()
    weave.check_grouped_mm()  # cleared by the read
    y = weave.grouped_mm(x, w, torch.tensor([100, 100, 99, 1], dtype=I32, device="cuda"))  # fits exactly
    grouped_ref_check(y, x, w, [100, 100, 99, 1], "grouped_mm after refusals")
    assert weave.grouped_mm_status() is None


def test_compile_fullgraph_new_ops(gpu, seed):
    """torch.compile of the new operators (their fakes) runs and matches eager."""
    A = fp8((64, 128), E4, seed, "A")
    w8 = fp8((32, 128), E4, seed, "w8")
    one = torch.ones((), device="cuda")
    x = rand((40, 64), BF, seed, "x")
    w = rand((2, 16, 64), BF, seed, "w")
    counts = torch.tensor([15, 20], dtype=I32, device="cuda")
    dy = rand((40, 24), BF, seed, "dy")

    def f(A, w8, x, w, counts, dy):
        return (weave.scaled_mm(A, w8.t(), one, one), weave.grouped_mm(x, w, counts)[:35],
                weave.matmul(dy.t(), x, out_dtype=torch.float32))

    eager = f(A, w8, x, w, counts, dy)
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)(A, w8, x, w, counts, dy)
    for e, c, what in zip(eager, compiled, ("scaled_mm", "grouped_mm", "matmul KM fp32")):
        check_close(c, e, 0, f"compiled vs eager {what}")
