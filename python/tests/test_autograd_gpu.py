"""GPU autograd tests in one process (a world of 1; multi-rank: test_autograd_multirank.py):
weave.nn.ColumnParallelLinear / RowParallelLinear at W = 1 against nn.Linear (same seed, same
weights) and their outputs and gradients against float32 torch autograd; weave.attention,
ring_attention and ulysses_attention gradients against float32 autograd of the math reference
(ragged S, causal, GQA). Operator outputs and staging buffers are poisoned with NaN.

Tolerance of every element (check_bf16): |x - r| <= 2^-7 |r| + 4 * P * 2^-8 * t, i.e. two bf16
roundings of the value itself plus four bf16 roundings, per partial result summed in bf16 (P: W for
reduce-scattered outputs, else 1), of the output's typical size t: t = sqrt(K) * rms(A) * rms(B)
for a GEMM output over a reduction of K (the size of a sum of K random products), rms(r) for the
attention gradients. NaN fails."""
import types

import pytest
import torch
from torch import nn

import weave
from refs import attention_ref, check_close, poison, qkv, rand

pytestmark = pytest.mark.gpu
BF = torch.bfloat16


def rms(t: torch.Tensor) -> float:
    return float(t.detach().float().pow(2).mean().sqrt())


def check_bf16(out: torch.Tensor, ref: torch.Tensor, typical: float, what: str, partials: int = 1) -> None:
    """out (bf16) vs a float32 reference within the bf16 bound of the module's docstring."""
    assert out.dtype == BF, f"{what}: dtype {out.dtype}"
    check_close(out, ref, 2.0 ** -7 * ref.float().abs() + 4 * partials * 2.0 ** -8 * typical + 1e-30, what)


def gemm_size(K: int, a: torch.Tensor, b: torch.Tensor) -> float:
    """The typical size of an element of a K-long product of a's and b's entries."""
    return K ** 0.5 * rms(a) * rms(b)


def linear_ref(x, w, b, dy):
    """y = x w^T + b and dx, dw, db of <y, dy> in float32 autograd (x (rows, ..., in), w (out, in))."""
    xf, wf = (t.detach().float().requires_grad_() for t in (x, w))
    bf = None if b is None else b.detach().float().requires_grad_()
    y = xf @ wf.t() + (0 if bf is None else bf)
    y.backward(dy.float())
    return y.detach(), xf.grad, wf.grad, None if bf is None else bf.grad


def full_linear(seed, fin, fout, bias):
    """nn.Linear(fin, fout) as drawn after torch.manual_seed(seed) (CPU, float32), its weight and
    bias cast to bf16 on the GPU: the single-GPU reference of modules built after the same seed."""
    torch.manual_seed(seed)
    lin = nn.Linear(fin, fout, bias=bias)
    return lin.weight.detach().to(BF).cuda(), None if lin.bias is None else lin.bias.detach().to(BF).cuda()


def check_linear_grads(what, x_grad, w_grad, b_grad, ref, x_full, w_full, dy_full, parts, partials_dx=1):
    """The gradients of one rank against the full reference `ref` (linear_ref's result): parts =
    (index of x's shard in the full x, of the weight's, of the bias's)."""
    _, dx, dw, db = ref
    rows = dy_full.reshape(-1, dy_full.shape[-1]).shape[0]
    px, pw, pb = parts
    if x_grad is not None:
        check_bf16(x_grad, dx[px], gemm_size(dy_full.shape[-1], dy_full, w_full), what + " dx", partials_dx)
    check_bf16(w_grad, dw[pw], gemm_size(rows, dy_full, x_full), what + " dw")
    if b_grad is not None:
        check_bf16(b_grad, db[pb], gemm_size(rows, dy_full, torch.ones(1)), what + " db")


def attention_grads_ref(q, k, v, do, dlse, causal, scale=None):
    """o, lse, dq, dk, dv of <o, do> + <lse, dlse> in float32 autograd of refs.attention_ref."""
    leaves = [t.detach().float().requires_grad_() for t in (q, k, v)]
    o, lse = attention_ref(*leaves, causal, scale)
    outs, grads = ([o, lse], [do.float(), dlse]) if dlse is not None else ([o], [do.float()])
    torch.autograd.backward(outs, grads)
    return (o.detach(), lse.detach(), *[t.grad for t in leaves])


def check_attention_grads(got, ref, what):
    for g, r, name in zip(got, ref, ("dq", "dk", "dv")):
        check_bf16(g, r, rms(r), f"{what} {name}")


@pytest.fixture
def comm(monkeypatch):
    poison(monkeypatch)
    return weave.init()


# (rows, batch or None, in, out): not tile multiples. The first two have rows that are not multiples
# of 8 (dW through torch.matmul), the last two multiples of 8 everywhere (dW through weave.matmul
# reading dY^T in place as a K x M operand: autograd._weight_grad).
SHAPES = [(133, None, 136, 104), (45, 3, 72, 200), (136, None, 72, 200), (24, 3, 136, 104)]


def _x_dy(seed, rows, b, fin, fout, tag=""):
    mid = () if b is None else (b,)
    return rand((rows, *mid, fin), BF, seed, "x", tag), rand((rows, *mid, fout), BF, seed, "dy", tag)


LAYERS = {  # name: a layer built after torch.manual_seed, (in, out, bias) -> module
    "column": lambda fin, fout, bias: weave.nn.ColumnParallelLinear(fin, fout, bias=bias),
    "column regather": lambda fin, fout, bias: weave.nn.ColumnParallelLinear(fin, fout, bias=bias,
                                                                             save_gathered_input=False),
    "row": lambda fin, fout, bias: weave.nn.RowParallelLinear(fin, fout, bias=bias),
}


@pytest.mark.parametrize("rows, b, fin, fout", SHAPES)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("layer", list(LAYERS))
def test_parallel_linear_is_linear(comm, seed, rows, b, fin, fout, bias, layer):
    w, bb = full_linear(seed, fin, fout, bias)
    torch.manual_seed(seed)
    m = LAYERS[layer](fin, fout, bias)
    assert torch.equal(m.weight, w) and (not bias or torch.equal(m.bias, bb)) and m.weight.is_cuda
    x, dy = _x_dy(seed, rows, b, fin, fout)
    x.requires_grad_()
    y = m(x)
    ref = linear_ref(x, w, bb, dy)
    check_bf16(y, ref[0], gemm_size(fin, x, w), f"{layer} y")
    y.backward(dy)
    check_linear_grads(layer, x.grad, m.weight.grad, m.bias.grad if bias else None, ref, x, w, dy,
                       (slice(None),) * 3)
    with torch.no_grad():  # inference: the operator alone, no gathered input kept
        y = m(x)
    assert not y.requires_grad
    check_bf16(y, ref[0], gemm_size(fin, x, w), f"{layer} y without grad")


@pytest.mark.parametrize("layer", list(LAYERS))
def test_weight_grad_uses_transposed_a_gemm(comm, seed, monkeypatch, layer):
    """Where rows, in and out are multiples of 8, dW = dY^T X is one weave.matmul call with A = dY^T
    (the transpose of the contiguous dY, read in place), and the gradient is right."""
    from weave import autograd as wag

    calls = []

    def matmul(A, B, *args):
        calls.append((tuple(A.shape), not A.is_contiguous() and A.t().is_contiguous()))
        return torch.ops.weave.matmul.default(A, B, *args)

    class Spy:  # torch.ops.weave with matmul's A layouts recorded (weave calls the .default overload)
        def __getattr__(self, name):
            return types.SimpleNamespace(default=matmul) if name == "matmul" else getattr(torch.ops.weave, name)

    monkeypatch.setattr(wag, "_ops_ns", Spy())
    rows, fin, fout = 136, 72, 200
    w, bb = full_linear(seed, fin, fout, True)
    torch.manual_seed(seed)
    m = LAYERS[layer](fin, fout, True)
    x, dy = _x_dy(seed, rows, None, fin, fout, "km")
    x.requires_grad_()
    ref = linear_ref(x, w, bb, dy)
    m(x).backward(dy)
    assert ((fout, rows), True) in calls, calls
    check_linear_grads(layer, x.grad, m.weight.grad, m.bias.grad, ref, x, w, dy, (slice(None),) * 3)
    # An operand that is not 16-byte aligned (a view 2 bytes into a buffer): torch.matmul instead.
    calls.clear()
    buf = torch.empty(rows * fin + 1, dtype=BF, device="cuda")
    xm = buf[1:].view(rows, fin)
    xm.copy_(x.detach())
    dw = wag._weight_grad(dy, xm)
    assert calls == [], calls
    check_linear_grads(layer + " misaligned", None, dw, None, ref, x, w, dy, (slice(None),) * 3)


def test_frozen_parts_and_from_linear(comm, seed):
    """Only the gradients asked for (a frozen input, a frozen weight); from_linear of a CUDA nn.Linear;
    gather_output at W = 1."""
    lin = nn.Linear(72, 104).cuda().to(BF)
    col = weave.nn.ColumnParallelLinear.from_linear(lin, gather_output=True)
    row = weave.nn.RowParallelLinear.from_linear(lin)
    assert torch.equal(col.weight, lin.weight) and torch.equal(row.bias, lin.bias)
    x, dy = _x_dy(seed, 77, None, 72, 104)
    ref = linear_ref(x, lin.weight, lin.bias, dy)
    for m in (col, row):
        y = m(x)  # x needs no gradient: only dW and db
        check_bf16(y, ref[0], gemm_size(72, x, lin.weight), f"{type(m).__name__} y")
        y.backward(dy)
        check_linear_grads(type(m).__name__, None, m.weight.grad, m.bias.grad, ref, x, lin.weight, dy,
                           (slice(None),) * 3)
        m.weight.requires_grad_(False)
        m.bias.requires_grad_(False)
        xg = x.clone().requires_grad_()
        m(xg).backward(dy)  # a frozen layer: dX only
        check_bf16(xg.grad, ref[1], gemm_size(104, dy, lin.weight), f"{type(m).__name__} frozen dx")


@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("S, Hq, Hkv", [(300, 8, 2), (129, 4, 4)])
def test_attention_grads(comm, seed, D, causal, S, Hq, Hkv):
    q, k, v = (t.requires_grad_() for t in qkv(2, S, Hq, Hkv, D, seed))
    do = rand(q.shape, BF, seed, "do")
    dlse = rand((2, Hq, S), torch.float32, seed, "dlse")
    scale = None if D == 128 else 0.1
    o, lse = weave.attention(q, k, v, causal=causal, scale=scale)
    torch.autograd.backward([o, lse], [do, dlse])
    ref = attention_grads_ref(q, k, v, do, dlse, causal, scale)
    check_attention_grads([q.grad, k.grad, v.grad], ref[2:], f"attention D={D} causal={causal} S={S}")


@pytest.mark.parametrize("causal", [False, True])
def test_attention_grad_of_o_only_and_small_chunks(comm, seed, causal, monkeypatch):
    """lse unused (its gradient None), and the backward's chunks of one query row at a time."""
    monkeypatch.setattr(weave.autograd, "CHUNK_ELEMS", 1)
    q, k, v = (t.requires_grad_() for t in qkv(1, 77, 4, 1, 64, seed))
    do = rand(q.shape, BF, seed, "do")
    weave.attention(q, k, v, causal=causal)[0].backward(do)
    ref = attention_grads_ref(q, k, v, do, None, causal)
    check_attention_grads([q.grad, k.grad, v.grad], ref[2:], f"attention o only causal={causal}")


@pytest.mark.parametrize("causal", [False, True])
def test_sequence_parallel_grads_world1(comm, seed, causal):
    q, k, v = (t.requires_grad_() for t in qkv(1, 333, 4, 2, 128, seed))
    do = rand(q.shape, BF, seed, "do")
    dlse = rand((1, 4, 333), torch.float32, seed, "dlse")
    ref = attention_grads_ref(q, k, v, do, dlse, causal)
    for sharding in ("zigzag", "contiguous"):
        o, lse = weave.ring_attention(q, k, v, causal, sharding=sharding)
        grads = torch.autograd.grad([o, lse], [q, k, v], [do, dlse])
        check_attention_grads(grads, ref[2:], f"ring {sharding} causal={causal}")
    ref = attention_grads_ref(q, k, v, do, None, causal)
    grads = torch.autograd.grad(weave.ulysses_attention(q, k, v, causal), [q, k, v], do)
    check_attention_grads(grads, ref[2:], f"ulysses causal={causal}")


class _Block(nn.Module):
    """A small sequence-parallel TP block (examples/torch/tp_block.py's layout at W = 1): LayerNorm,
    qkv, Ulysses attention, out, residual; LayerNorm, column-parallel up, GELU, row-parallel down,
    residual. x (S, hidden)."""

    def __init__(self, hidden: int, ffn: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(hidden).to("cuda", BF), nn.LayerNorm(hidden).to("cuda", BF)
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=False).to("cuda", BF)
        self.out = nn.Linear(hidden, hidden, bias=False).to("cuda", BF)
        self.up = weave.nn.ColumnParallelLinear(hidden, ffn, device="cuda")
        self.down = weave.nn.RowParallelLinear(ffn, hidden, device="cuda")

    def forward(self, x):
        S, H = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(1, S, 3, self.heads, H // self.heads).unbind(2)
        h = x + self.out(weave.ulysses_attention(q.contiguous(), k.contiguous(), v.contiguous(), True).view(S, H))
        return h + self.down(torch.nn.functional.gelu(self.up(self.ln2(h))))


def test_compile_fullgraph_block(comm, seed):
    """The block compiled whole (torch.compile(fullgraph=True), aot_eager) gives the eager block's
    output and gradients: every weave operator traced through its fake implementation, the
    modules' autograd functions included."""
    torch.manual_seed(seed)
    block = _Block(256, 512, 2)
    x = rand((200, 256), BF, seed, "x").requires_grad_()
    dy = rand((200, 256), BF, seed, "dy")
    y = block(x)
    grads = torch.autograd.grad(y, [x, *block.parameters()], dy)
    compiled = torch.compile(block, backend="aot_eager", fullgraph=True)
    y2 = compiled(x)
    grads2 = torch.autograd.grad(y2, [x, *block.parameters()], dy)
    check_close(y2, y, 2.0 ** -7 * y.float().abs() + 1e-3, "compiled block y")
    for (name, _), g, g2 in zip([("x", None), *block.named_parameters()], grads, grads2):
        check_close(g2, g, 2.0 ** -6 * g.float().abs() + 1e-2 * rms(g), f"compiled block d{name}")


@pytest.mark.parametrize("fn", ["ring", "ulysses"])
def test_compile_fullgraph_sp_attention_grads(comm, seed, fn):
    """ring_attention and ulysses_attention compiled (fullgraph, aot_eager): output and q, k, v
    gradients equal the eager ones."""
    q, k, v = qkv(1, 333, 4, 2, 128, seed)
    do = rand(q.shape, BF, seed, "do")

    def f(q, k, v):
        return weave.ring_attention(q, k, v, True)[0] if fn == "ring" else weave.ulysses_attention(q, k, v, True)

    xs = [t.clone().requires_grad_() for t in (q, k, v)]
    y = f(*xs)
    grads = torch.autograd.grad(y, xs, do)
    xs2 = [t.clone().requires_grad_() for t in (q, k, v)]
    y2 = torch.compile(f, backend="aot_eager", fullgraph=True)(*xs2)
    grads2 = torch.autograd.grad(y2, xs2, do)
    check_close(y2, y, 0, f"compiled {fn} o")
    for name, g, g2 in zip("qkv", grads, grads2):
        check_close(g2, g, 2.0 ** -7 * g.float().abs() + 1e-3 * rms(g), f"compiled {fn} d{name}")
