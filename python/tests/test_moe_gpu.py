"""weave.MoeLayer on one GPU (a world of 1, no torch.distributed: all E experts on this rank),
against moe_refs.moe_reference (check/moe_ref.hpp's float64 reference and per-element bound,
vectorised), outputs poisoned with NaN first. Skipped without a Hopper GPU. Multi-rank:
test_moe_multirank.py (torchrun).

Covers: the layer (fused and not, bit for bit equal to each other) for k = 1, 2, 8, random routing,
every token's first slot on one expert (k = 1: all tokens to one expert) and repeated ids; T not a
multiple of 128, 0, 1 and max_tokens; back-to-back calls with changing T and routing; dispatch's
grouped rows, counts and offsets exactly; dispatch -> weave.grouped_mm -> SwiGLU in torch ->
weave.grouped_mm -> combine; a capacity overflow and out-of-range ids (NaN out, check() raising on
the device's verdict, the layer usable after); argument errors on real tensors; torch.compile;
close() handing the heap back; the layer (fused and not) and the low-latency decode forward captured
in a CUDA graph and replayed with changing routing."""
import re

import pytest
import torch

import weave
from moe_refs import (BF, F32, I32, check_captured_replays, check_fused_and_plain, check_moe, expert_weights,
                      grouped_rows, routing, swiglu_torch, tokens)

pytestmark = pytest.mark.gpu


@pytest.fixture
def make(moe_layers):
    """make(...) -> a MoeLayer (closed at the end of the test); outputs of weave's ops poisoned."""
    return moe_layers


E, H, F = 16, 264, 136  # H and F multiples of 8, not of 64: ragged column tiles


@pytest.mark.parametrize("k, kind", [(1, "random"), (1, "one"), (2, "random"), (2, "repeat"), (8, "random"),
                                     (8, "one"), (8, "repeat")])
def test_layer_forward(make, seed, k, kind):
    up, down = expert_weights(E, H, F, seed)
    fused, plain = make(E, H, F, k, 320), make(E, H, F, k, 320, fused=False)
    assert fused.capacity >= 320 * k  # world 1: every row lands here; the default capacity holds them
    for i, T in enumerate((300, 77, 320)):  # back to back, T changing, not multiples of 128
        x = tokens(T, H, seed, i)
        idx, w = routing(T, k, E, kind, seed, i, hot=5)
        check_fused_and_plain(fused, plain, x, idx, w, up, down, up, down, f"k={k} {kind} T={T} call {i}")
    fused.check()
    plain.check()


def test_graph_capture_and_replay(make, seed):
    """MoeLayer (fused and not) and MoeLowLatency's decode forward in one CUDA graph, replayed with
    fresh tokens and routing (moe_refs.check_captured_replays)."""
    k, T = 4, 203
    up, down = expert_weights(E, H, F, seed)
    layers = [make(E, H, F, k, 256), make(E, H, F, k, 256, fused=False), weave.MoeLowLatency(E, H, k, 256, ffn=F)]
    kinds = ("random", "one", "repeat")
    try:
        check_captured_replays(layers, lambda i: (tokens(T, H, seed, i), *routing(T, k, E, kinds[i % 3], seed, i,
                                                                                 hot=5)),
                               up, down, up, down, 9, "capture")
    finally:
        layers[2].close()


@pytest.mark.parametrize("T", [0, 1, 128])
def test_layer_small_T(make, seed, T):
    k = 2
    up, down = expert_weights(E, H, F, seed)
    m = make(E, H, F, k, 128)
    x = tokens(T, H, seed)
    idx, w = routing(T, k, E, "random", seed)
    out = m(x, idx, w, up, down)
    assert out.shape == (T, H)
    check_moe(out, x, idx, w, up, down, f"T={T}")
    m.check()


def test_dispatch_and_combine(make, seed):
    """dispatch's grouped rows, counts and offsets exactly (receiver layout), then the layer done by
    hand: weave.grouped_mm (gate and up), SwiGLU in torch, weave.grouped_mm (down) into the exchange's
    output buffer, combine; against the reference."""
    k, T = 4, 333
    up, down = expert_weights(E, H, F, seed)
    m = make(E, H, F, k, 400, fused=False)
    assert m.expert_output is not None and m.expert_output.shape == (m.capacity, H)
    x = tokens(T, H, seed)
    idx, w = routing(T, k, E, "random", seed)
    m.expert_input.fill_(float("nan"))
    rows, counts, offsets = m.dispatch(x, idx)
    want, want_counts = grouped_rows(0, E, [x], [idx])
    n = want.shape[0]
    assert rows.shape == (m.capacity, H) and rows.dtype == BF
    assert counts.dtype == I32 and counts.tolist() == want_counts
    assert offsets.tolist() == [0] + torch.tensor(want_counts).cumsum(0).tolist()
    assert torch.equal(rows[:n], want), "grouped rows"
    assert bool(rows[n:].isnan().all()), "dispatch wrote rows past the received ones"

    g = weave.grouped_mm(rows, up, counts)
    y = weave.grouped_mm(swiglu_torch(g, F), down, counts)
    m.expert_output.copy_(y)
    out = m.combine(m.expert_output, w)
    check_moe(out, x, idx, w, up, down, "dispatch + grouped_mm + swiglu + combine")

    # A symmetric tensor of the group works as y too; an ordinary one is refused.
    ys = weave.empty((m.capacity, H), BF)
    ys.copy_(y)
    assert torch.equal(m.combine(ys, w), out)
    with pytest.raises(ValueError, match="y is not symmetric"):
        m.combine(y.clone(), w)
    with pytest.raises(ValueError, match=re.escape(f"topk_weights must be (T, k) = ({T}, {k})")):
        m.combine(m.expert_output, w[:-1].contiguous())
    m.check()


def test_output_buffer_option(make, seed):
    """A fused layer has no expert-output buffer unless asked for; with one, dispatch + combine run on it."""
    assert make(8, 64, 64, 2, 16).expert_output is None
    assert make(8, 64, 64, 2, 16, fused=False, output_buffer=False).expert_output is not None  # the layer needs it
    m = make(8, 64, 64, 2, 16, output_buffer=True)
    assert m.fused and m.expert_output.shape == (m.capacity, 64)
    up, down = expert_weights(8, 64, 64, seed)
    x = tokens(16, 64, seed)
    idx, w = routing(16, 2, 8, "random", seed)
    rows, counts, _ = m.dispatch(x, idx)
    m.expert_output.copy_(weave.grouped_mm(swiglu_torch(weave.grouped_mm(rows, up, counts), 64), down, counts))
    check_moe(m.combine(m.expert_output, w), x, idx, w, up, down, "fused layer's dispatch + combine")
    check_moe(m(x, idx, w, up, down), x, idx, w, up, down, "fused layer after dispatch + combine")


@pytest.mark.parametrize("fused", [True, False])
def test_capacity_overflow(make, seed, fused):
    up, down = expert_weights(8, H, F, seed)
    m = make(8, H, F, 1, 128, capacity=64, fused=fused)
    x = tokens(100, H, seed)
    idx = torch.full((100, 1), 3, dtype=I32, device="cuda")  # all 100 tokens to expert 3
    w = torch.ones((100, 1), dtype=F32, device="cuda")
    out = m(x, idx, w, up, down)
    assert bool(out.isnan().all()), "a failed call must leave NaN"
    with pytest.raises(RuntimeError, match=re.escape(
            "receive capacity 64 rows exceeded on rank 0 at expert 3 (100 rows; 100 rows for the rank in all)")):
        m.check()
    m.check()  # the verdict was read
    x, (idx, w) = tokens(50, H, seed, 1), routing(50, 1, 8, "random", seed, 1)
    check_moe(m(x, idx, w, up, down), x, idx, w, up, down, "after an overflow")  # usable again
    m.check()


@pytest.mark.parametrize("bad, where", [(13, (7, 1)), (-1, (0, 0))])
def test_bad_expert_id(make, seed, bad, where):
    k, T = 2, 50
    up, down = expert_weights(8, H, F, seed)
    m = make(8, H, F, k, 64)
    x = tokens(T, H, seed)
    idx, w = routing(T, k, 8, "random", seed)
    idx[where] = bad
    assert bool(m(x, idx, w, up, down).isnan().all())
    with pytest.raises(RuntimeError, match=re.escape(
            f"expert id {bad} on rank 0 (token {where[0]}, slot {where[1]}) is outside 0..E-1")):
        m.check()
    idx, w = routing(T, k, 8, "random", seed, 1)
    check_moe(m(x, idx, w, up, down), x, idx, w, up, down, "after a bad id")
    m.check()


def test_argument_errors_on_gpu(make, seed):
    up, down = expert_weights(8, 64, 64, seed)
    m = make(8, 64, 64, 2, 32)
    x = tokens(32, 64, seed)
    idx, w = routing(32, 2, 8, "random", seed)
    with pytest.raises(ValueError, match="more than the layer's max_tokens = 32"):
        m(tokens(33, 64, seed), *routing(33, 2, 8, "random", seed), up, down)
    odd = torch.empty(32 * 64 + 1, dtype=BF, device="cuda")[1:].view(32, 64)  # 2 bytes off 16-byte alignment
    odd.copy_(x)
    with pytest.raises(ValueError, match="x must start at a 16-byte aligned address"):
        m(odd, idx, w, up, down)
    with pytest.raises(ValueError, match="w_up is on cpu"):
        m(x, idx, w, up.cpu(), down)
    with pytest.raises(ValueError, match=re.escape("w_down must be (L, H, F) = (8, 64, 64)")):
        m(x, idx, w, up, down[:4])
    with pytest.raises(ValueError, match="topk_idx has dtype torch.int64"):
        m(x, idx.long(), w, up, down)
    with pytest.raises(RuntimeError, match="no CUDA GPU|on the CPU"):
        torch.ops.weave.moe_layer(x.cpu(), idx.cpu(), w.cpu(), up.cpu(), down.cpu(), m.handle)
    check_moe(m(x, idx, w, up, down), x, idx, w, up, down, "after refused calls")


def test_compile(make, seed):
    k, T = 2, 100
    up, down = expert_weights(8, 64, 64, seed)
    m = make(8, 64, 64, k, 128)
    x = tokens(T, 64, seed)
    idx, w = routing(T, k, 8, "random", seed)

    def f(x, idx, w, up, down):
        return m(x, idx, w, up, down).float() * 2

    eager = f(x, idx, w, up, down)
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)(x, idx, w, up, down)
    assert torch.equal(eager, compiled)


def test_side_stream(make, seed):
    """Calls on another stream than the previous one are ordered after it."""
    k, T = 2, 100
    up, down = expert_weights(8, 64, 64, seed)
    m = make(8, 64, 64, k, 128)
    outs = []
    side = torch.cuda.Stream()
    for i in range(4):
        x = tokens(T, 64, seed, i)
        idx, w = routing(T, k, 8, "random", seed, i)
        s = side if i % 2 else torch.cuda.current_stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            outs.append((m(x, idx, w, up, down), x, idx, w))
    torch.cuda.synchronize()
    for i, (out, x, idx, w) in enumerate(outs):
        check_moe(out, x, idx, w, up, down, f"call {i}")


def test_close_hands_the_heap_back(seed):
    comm = weave.init()
    m = weave.MoeLayer(8, 256, 64, 2, 512)  # fused: grouped buffer and landing buffer in the heap
    used = comm.heap_used  # (the layer's allocation may also have returned buffers released earlier)
    m.close()
    assert used - comm.heap_used >= m.capacity * 256 * 2 + 512 * 2 * 256 * 2
    with pytest.raises(RuntimeError, match="closed"):
        m.dispatch(tokens(4, 256, seed), torch.zeros((4, 2), dtype=I32, device="cuda"))
