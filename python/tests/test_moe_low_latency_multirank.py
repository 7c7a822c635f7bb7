"""weave.MoeLowLatency over several ranks, run by every rank under torchrun (skipped under plain
pytest):

    WEAVE_SHARE_GPUS=1 torchrun --nproc_per_node 2 -m pytest python/tests/test_moe_low_latency_multirank.py \
        -q -p no:cacheprovider

(WEAVE_SHARE_GPUS=1 lets the ranks share one GPU; leave it out with a GPU per rank.) As
test_moe_multirank.py: gloo serves the store and the seed, every rank regenerates every rank's
tokens and routing and every expert's weights, and checks its own outputs. Rank r holds experts
r L .. r L + L - 1 and T0 + 37 r tokens (different per rank, not multiples of the GEMM tile; some
cases with none on the last rank). Covers the decode forward (k = 1 and 8, random routing, every
token's first slot on one expert of rank 0, repeated ids) against moe_refs.moe_reference and bit for
bit against weave.MoeLayer's non-fused forward, back to back with changing T and routing, outputs
poisoned; dispatch's receive rows on every rank exactly (the sources in rotated order, rows past the
counts untouched) and combine of expert outputs derived from them
(test_moe_low_latency_cpu.check_ll_combine); dispatch -> weave.grouped_mm -> combine by hand; an
out-of-range id on one rank and too many rows of one rank on one expert reported by check() on every
rank, then a correct call; a configuration that differs between ranks refused on every rank."""
import os
import re

import pytest
import torch
import torch.distributed as dist

import weave
from moe_refs import check_moe, expert_weights, swiglu_torch
from test_moe_low_latency_cpu import check_ll_combine, expert_outputs, ll_receive_rows

if "WORLD_SIZE" not in os.environ:
    pytest.skip("multi-rank tests run under torchrun (see the module's docstring)", allow_module_level=True)

import test_moe_low_latency_gpu  # noqa: E402  (its fixture)
from test_moe_multirank import every_rank  # noqa: E402  (every rank's inputs, T0 + 37 s tokens on rank s)

pytestmark = pytest.mark.gpu

# make(...) -> a weave.MoeLowLatency on the default group (collective; closed, collectively, after the
# test); every test here asks for `world` (module scope), so torch.distributed is up before weave.init.
make = test_moe_low_latency_gpu.make


@pytest.mark.parametrize("k, kind, zero", [(1, "random", False), (1, "one", True), (8, "random", False),
                                           (8, "one", False), (8, "repeat", True), (2, "repeat", False)])
def test_decode_forward(world, make, moe_layers, k, kind, zero):
    rank, W, seed = world
    L, H, F = 8, 264, 136
    E = L * W
    up, down = expert_weights(E, H, F, seed)
    mine = slice(rank * L, (rank + 1) * L)
    max_tokens = 256
    ll = make(E, H, k, max_tokens, ffn=F)
    layer = moe_layers(E, H, F, k, max_tokens, fused=False, capacity=W * max_tokens * k)
    calls = []
    for i, T0 in enumerate((219 - 37 * (W - 1), 1, 100)):  # back to back, T changing, nothing synchronised
        x, idx, w = every_rank(W, T0, k, E, H, kind, seed, i, zero_rank=W - 1 if zero else -1)[rank]
        calls.append((ll(x, idx, w, up[mine], down[mine]), x, idx, w))
    for i, (out, x, idx, w) in enumerate(calls):
        what = f"rank {rank} k={k} {kind} T={x.shape[0]} call {i}"
        check_moe(out, x, idx, w, up, down, "decode forward " + what)
        assert torch.equal(out, layer(x, idx, w, up[mine], down[mine])), f"{what}: differs from MoeLayer's"
    ll.check()
    layer.check()


@pytest.mark.parametrize("k, zero", [(1, False), (8, True), (3, False)])
def test_dispatch_and_combine(world, make, k, zero):
    rank, W, seed = world
    L, H = 4, 136
    E = L * W
    max_tokens = 150 + 37 * (W - 1)
    ll = make(E, H, k, max_tokens)
    inputs = every_rank(W, 150, k, E, H, "random", seed, zero_rank=W - 1 if zero else -1)
    x, idx, w = inputs[rank]
    ll.receive_buffer.fill_(float("nan"))
    rows, counts = ll.dispatch(x, idx)
    want, want_counts = ll_receive_rows(rank, L, [i[0] for i in inputs], [i[1] for i in inputs])
    assert rows.shape == (L, W * max_tokens, H)
    assert counts.tolist() == want_counts, f"rank {rank}: counts"
    for l, n in enumerate(want_counts):
        assert torch.equal(rows[l, :n], want[l]), f"rank {rank} expert {l}: receive rows"
        assert bool(rows[l, n:].isnan().all()), f"rank {rank} expert {l}: rows past the count were written"
    out = ll.combine(expert_outputs(rows, want_counts, rank, L), w)
    check_ll_combine(out, x, idx, w, f"rank {rank}: combine k={k}")
    ll.check()


def test_dispatch_grouped_mm_combine(world, make):
    rank, W, seed = world
    L, H, F, k = 4, 136, 72, 3
    E = L * W
    up, down = expert_weights(E, H, F, seed)
    mine = slice(rank * L, (rank + 1) * L)
    ll = make(E, H, k, 211 + 37 * (W - 1))
    x, idx, w = every_rank(W, 211, k, E, H, "random", seed)[rank]
    rows, counts = ll.dispatch(x, idx)
    n = counts.tolist()
    packed = torch.cat([rows[l, :c] for l, c in enumerate(n)])
    y = weave.grouped_mm(swiglu_torch(weave.grouped_mm(packed, up[mine], counts), F), down[mine], counts)
    ys = torch.full_like(rows, float("nan"))
    for l, part in enumerate(y[:sum(n)].split(n)):
        ys[l, :n[l]] = part
    check_moe(ll.combine(ys, w), x, idx, w, up, down, f"rank {rank}: dispatch + grouped_mm + combine")
    ll.check()


def fails_on_every_rank(ll, rank, up, down, inputs, message, after):
    """A call on `inputs` (this rank's x, topk_idx, topk_weights) fails on every rank: NaN out and
    check() raising `message`; then a correct call on `after` (every rank's inputs, by rank)."""
    L = ll.local_experts
    mine = slice(rank * L, (rank + 1) * L)
    x, idx, w = inputs
    assert bool(ll(x, idx, w, up[mine], down[mine]).isnan().all()), f"rank {rank}: a failed call must leave NaN"
    with pytest.raises(RuntimeError, match=re.escape(message)):
        ll.check()
    x, idx, w = after[rank]
    check_moe(ll(x, idx, w, up[mine], down[mine]), x, idx, w, up, down, f"rank {rank}: after a failed call")
    ll.check()


def test_bad_id_on_one_rank(world, make):
    rank, W, seed = world
    L, H, F, k = 2, 64, 64, 2
    E = L * W
    up, down = expert_weights(E, H, F, seed)
    ll = make(E, H, k, 20 + 37 * (W - 1), ffn=F)
    x, idx, w = every_rank(W, 20, k, E, H, "random", seed)[rank]
    if rank == W - 1:
        idx[7, 1] = E + 3
    fails_on_every_rank(ll, rank, up, down, (x, idx, w),
                        f"expert id {E + 3} on rank {W - 1} (token 7, slot 1) is outside 0..E-1; nothing was "
                        "dispatched",
                        every_rank(W, 20, k, E, H, "random", seed, "after"))


def test_too_many_rows_on_one_rank(world, make):
    """Rank 0's tokens all name expert E - 1 (on the last rank) twice: more than max_tokens rows of
    one rank on one expert fail the call on every rank."""
    rank, W, seed = world
    L, H, F, T = 2, 64, 64, 30
    E = L * W
    up, down = expert_weights(E, H, F, seed)
    ll = make(E, H, 2, T, ffn=F)
    x, idx, w = every_rank(W, T, 2, E, H, "random", seed, step=0)[rank]
    if rank == 0:
        idx.fill_(E - 1)
    fails_on_every_rank(ll, rank, up, down, (x, idx, w),
                        f"rank 0 routes {2 * T} rows to expert {E - 1}, more than max_tokens ({T}; a token names that "
                        "expert more than once)", every_rank(W, T, 2, E, H, "random", seed, "after", step=0))


def test_mismatched_config_raises_on_every_rank(world):
    rank, W, _ = world
    if W == 1:
        pytest.skip("needs two ranks")
    g = dist.new_group(list(range(W)))  # a communicator of its own
    weave.init(g)
    with pytest.raises(RuntimeError):
        weave.MoeLowLatency(2 * W, 64, 2, 32 + rank, ffn=64, group=g)
    with pytest.raises(RuntimeError):
        weave.MoeLowLatency(2 * W, 64, 2, 32, ffn=64 + 8 * rank, group=g)
    dist.barrier()

