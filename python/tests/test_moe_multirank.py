"""weave.MoeLayer over several ranks, run by every rank under torchrun (skipped under plain pytest):

    WEAVE_SHARE_GPUS=1 torchrun --nproc_per_node 2 -m pytest python/tests/test_moe_multirank.py -q -p no:cacheprovider

(WEAVE_SHARE_GPUS=1 lets the ranks share one GPU; leave it out with a GPU per rank.) As
test_multirank.py: gloo serves the store and the seed, every rank regenerates every rank's tokens
and routing and every expert's weights, and checks its own output against moe_refs.moe_reference.
Rank r holds experts r L .. r L + L - 1 and T0 + 37 r tokens (different per rank, not multiples of
128; one case with none on the last rank). Covers the layer fused and not (bit for bit equal), k = 1
and 8, random routing and every token's first slot on one expert of rank 0; dispatch's grouped rows
(every rank's rows in the receiver layout) exactly; dispatch + grouped_mm + combine; a capacity
overflow and a bad id on one rank reported by check() on every rank, the layer usable after; a
configuration that differs between ranks refused on every rank; the layer (fused and not) and the
low-latency decode forward captured in one CUDA graph and replayed with changing routing."""
import os
import re

import pytest
import torch
import torch.distributed as dist

import weave
from moe_refs import (BF, F32, I32, check_captured_replays, check_fused_and_plain, check_moe, expert_weights,
                      grouped_rows, routing, swiglu_torch, tokens)

if "WORLD_SIZE" not in os.environ:
    pytest.skip("multi-rank tests run under torchrun (see the module's docstring)", allow_module_level=True)

pytestmark = pytest.mark.gpu


@pytest.fixture
def make(world, moe_layers):
    """make(...) -> a MoeLayer on the default group (collective; closed, collectively, after the test)."""
    return moe_layers


def every_rank(W, T0, k, E, H, kind, seed, *tags, zero_rank=-1, hot=0, step=37):
    """Every rank's (x, topk_idx, topk_weights), rank s with T0 + step s tokens (none on zero_rank)."""
    out = []
    for s in range(W):
        T = 0 if s == zero_rank else T0 + step * s
        out.append((tokens(T, H, seed, s, *tags), *routing(T, k, E, kind, seed, s, *tags, hot=hot)))
    return out


@pytest.mark.parametrize("k, kind, zero", [(1, "random", False), (1, "one", False), (8, "random", False),
                                           (8, "one", True), (2, "random", True)])
def test_layer(world, make, k, kind, zero):
    rank, W, seed = world
    L, H, F = 8, 264, 136
    E = L * W
    up, down = expert_weights(E, H, F, seed)
    mine = slice(rank * L, (rank + 1) * L)
    T0 = 200
    max_tokens = T0 + 37 * (W - 1)
    fused = make(E, H, F, k, max_tokens, capacity=weave.moe_worst_case_rows(max_tokens, k, E))
    plain = make(E, H, F, k, max_tokens, capacity=fused.capacity, fused=False)
    for i in range(3):  # back to back, routing changing
        x, idx, w = every_rank(W, T0 - 50 * i, k, E, H, kind, seed, i, zero_rank=W - 1 if zero else -1)[rank]
        check_fused_and_plain(fused, plain, x, idx, w, up[mine], down[mine], up, down,
                              f"rank {rank} k={k} {kind} call {i}")
    fused.check()
    plain.check()


def test_graph_capture_and_replay(world, make):
    """MoeLayer (fused and not) and MoeLowLatency's decode forward in one CUDA graph on every rank,
    replayed with fresh tokens and routing of every rank (moe_refs.check_captured_replays)."""
    rank, W, seed = world
    L, H, F, k, T0 = 4, 200, 136, 4, 150
    E = L * W
    up, down = expert_weights(E, H, F, seed)
    mine = slice(rank * L, (rank + 1) * L)
    max_tokens = T0 + 37 * (W - 1)
    layers = [make(E, H, F, k, max_tokens), make(E, H, F, k, max_tokens, fused=False),
              weave.MoeLowLatency(E, H, k, max_tokens, ffn=F)]
    kinds = ("random", "one", "repeat")
    try:
        check_captured_replays(layers, lambda i: every_rank(W, T0, k, E, H, kinds[i % 3], seed, i, hot=1)[rank],
                               up[mine], down[mine], up, down, 9, f"rank {rank} capture")
    finally:
        layers[2].close()


def test_dispatch_and_combine(world, make):
    rank, W, seed = world
    L, H, F, k = 4, 136, 72, 3
    E = L * W
    up, down = expert_weights(E, H, F, seed)
    mine = slice(rank * L, (rank + 1) * L)
    m = make(E, H, F, k, 211 + 37 * (W - 1), fused=False)
    inputs = every_rank(W, 211, k, E, H, "random", seed)
    x, idx, w = inputs[rank]
    m.expert_input.fill_(float("nan"))
    rows, counts, offsets = m.dispatch(x, idx)
    want, want_counts = grouped_rows(rank, L, [i[0] for i in inputs], [i[1] for i in inputs])
    n = want.shape[0]
    assert counts.tolist() == want_counts and offsets.tolist() == [0] + torch.tensor(want_counts).cumsum(0).tolist()
    assert torch.equal(rows[:n], want), f"rank {rank}: grouped rows"
    assert bool(rows[n:].isnan().all()), f"rank {rank}: rows past the received ones were written"
    y = weave.grouped_mm(swiglu_torch(weave.grouped_mm(rows, up[mine], counts), F), down[mine], counts)
    m.expert_output.copy_(y)
    out = m.combine(m.expert_output, w)
    check_moe(out, x, idx, w, up, down, f"rank {rank}: dispatch + grouped_mm + combine")
    m.check()


@pytest.mark.parametrize("fused", [True, False])
def test_capacity_overflow_on_every_rank(world, make, fused):
    rank, W, seed = world
    L, H, F = 2, 64, 64
    E = L * W
    up, down = expert_weights(E, H, F, seed)
    mine = slice(rank * L, (rank + 1) * L)
    T = 40
    m = make(E, H, F, 1, T, capacity=T * W - 1, fused=fused)  # one row short of all tokens on expert 1
    x = tokens(T, H, seed, rank)
    out = m(x, torch.ones((T, 1), dtype=I32, device="cuda"), torch.ones((T, 1), dtype=F32, device="cuda"),
            up[mine], down[mine])
    assert bool(out.isnan().all()), f"rank {rank}: a failed call must leave NaN"
    msg = (f"receive capacity {T * W - 1} rows exceeded on rank 0 at expert 1 ({T * W} rows; {T * W} rows for the "
           "rank in all)")
    with pytest.raises(RuntimeError, match=re.escape(msg)):
        m.check()
    x, idx, w = every_rank(W, 30, 1, E, H, "random", seed, "after", step=1)[rank]
    check_moe(m(x, idx, w, up[mine], down[mine]), x, idx, w, up, down, f"rank {rank}: after an overflow")
    m.check()


def test_bad_id_on_one_rank(world, make):
    rank, W, seed = world
    L, H, F, k = 2, 64, 64, 2
    E = L * W
    up, down = expert_weights(E, H, F, seed)
    mine = slice(rank * L, (rank + 1) * L)
    m = make(E, H, F, k, 20 + 37 * (W - 1))
    x, idx, w = every_rank(W, 20, k, E, H, "random", seed)[rank]
    if rank == W - 1:
        idx[7, 1] = E + 3
    assert bool(m(x, idx, w, up[mine], down[mine]).isnan().all())
    with pytest.raises(RuntimeError, match=re.escape(
            f"expert id {E + 3} on rank {W - 1} (token 7, slot 1) is outside 0..E-1")):
        m.check()
    x, idx, w = every_rank(W, 20, k, E, H, "random", seed, "after")[rank]
    check_moe(m(x, idx, w, up[mine], down[mine]), x, idx, w, up, down, f"rank {rank}: after a bad id")
    m.check()


def test_mismatched_config_raises_on_every_rank(world):
    rank, W, _ = world
    g = dist.new_group(list(range(W)))  # a communicator of its own
    weave.init(g)
    with pytest.raises(RuntimeError):
        weave.MoeLayer(2 * W, 64, 64, 2, 32, capacity=100 + rank, group=g)
    dist.barrier()


def test_argument_error_on_one_rank_raises_on_every_rank(world):
    """The last rank passes more tokens than max_tokens (its own check: ValueError there); its peers,
    whose calls pass, fail in the dispatch's agreement with it instead of waiting. A fresh group and
    layer: the dispatch's plan is new, so no peer has launched."""
    rank, W, seed = world
    g = dist.new_group(list(range(W)))
    weave.init(g)
    L, H, k, maxT = 2, 64, 2, 40
    E = L * W
    m = weave.MoeLayer(E, H, 64, k, maxT, group=g)
    try:
        T = maxT + 1 if rank == W - 1 else maxT
        x = tokens(T, H, seed, rank, "refuse")
        idx, _ = routing(T, k, E, "random", seed, rank, "refuse")
        with pytest.raises(ValueError if rank == W - 1 else RuntimeError) as e:
            m.dispatch(x, idx)
        assert ("max_tokens" if rank == W - 1 else "different operators") in str(e.value), str(e.value)
    finally:
        m.close()  # collective; the refused call left the layer usable
        dist.barrier()
