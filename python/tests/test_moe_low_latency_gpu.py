"""weave.MoeLowLatency on one GPU (a world of 1, no torch.distributed: all E experts on this rank),
outputs poisoned with NaN first (the receive buffer too). Skipped without a Hopper GPU. Multi-rank:
test_moe_low_latency_multirank.py (torchrun).

Covers: the decode forward against moe_refs.moe_reference (check/moe_ref.hpp's float64 reference and
per-element bound) and bit for bit against weave.MoeLayer's non-fused forward on the same inputs (the
same GEMM, SwiGLU and combine roundings per row), for k = 1, 2, 8, random routing, every token's
first slot on one expert (k = 1: all tokens to one expert), repeated ids, ragged T (not multiples of
the GEMM tile; 0, 1 and max_tokens = 256) back to back with no synchronisation between calls;
dispatch's receive rows and counts exactly, rows past the counts untouched; combine of expert outputs
derived from the rows (test_moe_low_latency_cpu.check_ll_combine); dispatch -> weave.grouped_mm ->
SwiGLU -> weave.grouped_mm -> combine by hand; T above max_tokens, bad dtypes and devices, a
misaligned x, the dispatch / combine alternation (ValueError before anything is enqueued); an
out-of-range id and too many rows of one rank on one expert (NaN out, check() raising the device's
verdict, the object usable after); calls on alternating streams; torch.compile; close()."""
import re

import pytest
import torch

import weave
from moe_refs import BF, F32, I32, check_moe, expert_weights, routing, swiglu_torch, tokens
from test_moe_low_latency_cpu import check_ll_combine, expert_outputs, ll_receive_rows

pytestmark = pytest.mark.gpu

E, H, F = 16, 264, 136  # H and F multiples of 8, not of 64: ragged column tiles


@pytest.fixture
def make(moe_layers):
    """make(...) -> a weave.MoeLowLatency, closed at the end of the test; outputs of weave's ops
    poisoned (moe_layers' setup, which also makes the MoeLayers compared with)."""
    made = []

    def new(*args, **kw):
        made.append(weave.MoeLowLatency(*args, **kw))
        return made[-1]

    yield new
    for m in made:
        m.close()


@pytest.mark.parametrize("k, kind", [(1, "random"), (1, "one"), (2, "random"), (2, "repeat"), (8, "random"),
                                     (8, "one"), (8, "repeat")])
def test_decode_forward(make, moe_layers, seed, k, kind):
    up, down = expert_weights(E, H, F, seed)
    ll = make(E, H, k, 256, ffn=F)
    layer = moe_layers(E, H, F, k, 256, fused=False, capacity=256 * k)
    calls = []
    for i, T in enumerate((200, 37, 1, 0, 256, 129)):  # back to back, nothing synchronises in between
        x = tokens(T, H, seed, i)
        idx, w = routing(T, k, E, kind, seed, i, hot=5)
        calls.append((ll(x, idx, w, up, down), x, idx, w))
    for i, (out, x, idx, w) in enumerate(calls):
        what = f"k={k} {kind} T={x.shape[0]} call {i}"
        check_moe(out, x, idx, w, up, down, "decode forward " + what)
        assert torch.equal(out, layer(x, idx, w, up, down)), f"{what}: decode forward differs from MoeLayer's"
    ll.check()
    layer.check()


@pytest.mark.parametrize("k, T", [(1, 1), (2, 77), (8, 128), (8, 256)])
def test_dispatch_and_combine(make, seed, k, T):
    """dispatch's receive rows and counts exactly (rows past the counts still NaN), then combine of
    expert outputs derived from those rows against float64."""
    ll = make(E, H, k, 256)
    x = tokens(T, H, seed)
    idx, w = routing(T, k, E, "random", seed)
    ll.receive_buffer.fill_(float("nan"))
    rows, counts = ll.dispatch(x, idx)
    want, want_counts = ll_receive_rows(0, E, [x], [idx])
    assert rows.shape == (E, 256, H) and rows.dtype == BF and rows.data_ptr() == ll.receive_buffer.data_ptr()
    assert counts.dtype == I32 and counts.tolist() == want_counts
    for l, n in enumerate(want_counts):
        assert torch.equal(rows[l, :n], want[l]), f"expert {l}: receive rows"
        assert bool(rows[l, n:].isnan().all()), f"expert {l}: rows past the count were written"
    out = ll.combine(expert_outputs(rows, want_counts, 0, E), w)
    check_ll_combine(out, x, idx, w, f"combine k={k} T={T}")
    ll.check()


def test_dispatch_grouped_mm_combine(make, seed):
    """The decode layer by hand: the received rows packed, weave.grouped_mm (gate and up), SwiGLU in
    torch, weave.grouped_mm (down), scattered back into the receive layout (NaN elsewhere), combine;
    against the layer reference."""
    k, T = 4, 233
    up, down = expert_weights(E, H, F, seed)
    ll = make(E, H, k, 240)
    x = tokens(T, H, seed)
    idx, w = routing(T, k, E, "random", seed)
    rows, counts = ll.dispatch(x, idx)
    n = counts.tolist()
    packed = torch.cat([rows[l, :c] for l, c in enumerate(n)])
    y = weave.grouped_mm(swiglu_torch(weave.grouped_mm(packed, up, counts), F), down, counts)
    ys = torch.full_like(rows, float("nan"))
    for l, part in enumerate(y[:sum(n)].split(n)):
        ys[l, :n[l]] = part
    check_moe(ll.combine(ys, w), x, idx, w, up, down, "dispatch + grouped_mm + combine")
    ll.check()


def test_alternation_and_argument_errors(make, seed):
    """ValueError before anything is enqueued: T above max_tokens, bad dtypes and devices, a
    misaligned x, a second dispatch before the combine, a forward while a dispatch waits, a combine
    without a dispatch; the object is usable after each."""
    k = 2
    up, down = expert_weights(8, 64, 64, seed)
    ll = make(8, 64, k, 32, ffn=64)
    x = tokens(32, 64, seed)
    idx, w = routing(32, k, 8, "random", seed)
    with pytest.raises(ValueError, match="x has T = 33 tokens, more than the layer's max_tokens = 32"):
        ll(tokens(33, 64, seed), *routing(33, k, 8, "random", seed), up, down)
    with pytest.raises(ValueError, match="x has T = 33 tokens"):
        ll.dispatch(tokens(33, 64, seed), routing(33, k, 8, "random", seed)[0])
    odd = torch.empty(32 * 64 + 1, dtype=BF, device="cuda")[1:].view(32, 64)  # 2 bytes off 16-byte alignment
    odd.copy_(x)
    with pytest.raises(ValueError, match="x must start at a 16-byte aligned address"):
        ll(odd, idx, w, up, down)
    with pytest.raises(ValueError, match="x must start at a 16-byte aligned address"):
        ll.dispatch(odd, idx)
    with pytest.raises(ValueError, match="w_up is on cpu"):
        ll(x, idx, w, up.cpu(), down)
    with pytest.raises(ValueError, match="topk_idx has dtype torch.int64"):
        ll(x, idx.long(), w, up, down)
    with pytest.raises(ValueError, match=re.escape("w_down must be (L, H, F) = (8, 64, 64)")):
        ll(x, idx, w, up, down[:4])
    with pytest.raises(ValueError, match="no dispatch to combine"):
        ll.combine(torch.zeros((8, 32, 64), dtype=BF, device="cuda"), w)
    with pytest.raises(RuntimeError, match="no CUDA GPU|on the CPU"):
        torch.ops.weave.moe_low_latency(x.cpu(), idx.cpu(), w.cpu(), up.cpu(), down.cpu(), ll.handle)
    rows, counts = ll.dispatch(x, idx)
    with pytest.raises(ValueError, match="the last dispatch has not been combined yet"):
        ll.dispatch(x, idx)
    with pytest.raises(ValueError, match="the last dispatch has not been combined yet"):
        ll(x, idx, w, up, down)
    with pytest.raises(ValueError, match=re.escape("y must be (L, row_stride, H) = (8, 32, 64)")):
        ll.combine(rows[:4], w)
    with pytest.raises(ValueError, match=re.escape("topk_weights must be (T, k) = (32, 2)")):
        ll.combine(rows, w[:-1].contiguous())
    check_ll_combine(ll.combine(expert_outputs(rows, counts.tolist(), 0, 8), w), x, idx, w, "after refused calls")
    check_moe(ll(x, idx, w, up, down), x, idx, w, up, down, "forward after refused calls")
    ll.check()


@pytest.mark.parametrize("bad, where", [(13, (7, 1)), (-1, (0, 0))])
def test_bad_expert_id(make, seed, bad, where):
    k, T = 2, 50
    up, down = expert_weights(8, H, F, seed)
    ll = make(8, H, k, 64, ffn=F)
    x = tokens(T, H, seed)
    idx, w = routing(T, k, 8, "random", seed)
    idx[where] = bad
    assert bool(ll(x, idx, w, up, down).isnan().all()), "a failed call must leave NaN"
    with pytest.raises(RuntimeError, match=re.escape(
            f"weave.MoeLowLatency: moe low-latency dispatch: expert id {bad} on rank 0 (token {where[0]}, slot "
            f"{where[1]}) is outside 0..E-1; nothing was dispatched")):
        ll.check()
    ll.check()  # the verdict was read
    idx, w = routing(T, k, 8, "random", seed, 1)
    check_moe(ll(x, idx, w, up, down), x, idx, w, up, down, "after a bad id")
    ll.check()


def test_too_many_rows_on_one_expert(make, seed):
    """A token naming an expert twice can put more than max_tokens rows of a rank on one expert:
    the call fails (counts zero, NaN out) and check() says so; the next call is correct."""
    T = 40
    up, down = expert_weights(8, 64, 64, seed)
    ll = make(8, 64, 2, T, ffn=64)
    x = tokens(T, 64, seed)
    idx = torch.full((T, 2), 3, dtype=I32, device="cuda")  # 80 rows on expert 3
    w = torch.full((T, 2), 0.5, dtype=F32, device="cuda")
    rows, counts = ll.dispatch(x, idx)
    out = ll.combine(torch.zeros_like(rows), w)
    assert counts.tolist() == [0] * 8 and bool(out.isnan().all())
    with pytest.raises(RuntimeError, match=re.escape(
            f"rank 0 routes {2 * T} rows to expert 3, more than max_tokens ({T}; a token names that expert more "
            "than once); nothing was dispatched")):
        ll.check()
    idx, w = routing(T, 2, 8, "repeat", seed)  # repeats, within the limit
    check_moe(ll(x, idx, w, up, down), x, idx, w, up, down, "after too many rows")
    ll.check()


def test_side_stream(make, seed):
    """Calls on another stream than the previous one are ordered after it."""
    k, T = 2, 100
    up, down = expert_weights(8, 64, 64, seed)
    ll = make(8, 64, k, 128, ffn=64)
    outs = []
    side = torch.cuda.Stream()
    for i in range(6):
        x = tokens(T - 7 * i, 64, seed, i)
        idx, w = routing(T - 7 * i, k, 8, "random", seed, i)
        s = side if i % 2 else torch.cuda.current_stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            outs.append((ll(x, idx, w, up, down), x, idx, w))
    torch.cuda.synchronize()
    for i, (out, x, idx, w) in enumerate(outs):
        check_moe(out, x, idx, w, up, down, f"call {i}")


def test_compile(make, seed):
    k, T = 2, 100
    up, down = expert_weights(8, 64, 64, seed)
    ll = make(8, 64, k, 128, ffn=64)
    x = tokens(T, 64, seed)
    idx, w = routing(T, k, 8, "random", seed)

    def f(x, idx, w, up, down):
        return ll(x, idx, w, up, down).float() * 2

    eager = f(x, idx, w, up, down)
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)(x, idx, w, up, down)
    assert torch.equal(eager, compiled)


def test_close_hands_the_heap_back(seed):
    comm = weave.init()
    ll = weave.MoeLowLatency(8, 256, 2, 128, ffn=64)
    used = comm.heap_used
    ll.close()
    assert used - comm.heap_used >= 128 * 2 * 256 * 2  # at least the landing rows (max_tokens x k x H)
    with pytest.raises(RuntimeError, match="closed"):
        ll.dispatch(tokens(4, 256, seed), torch.zeros((4, 2), dtype=I32, device="cuda"))
