"""Multi-rank autograd tests, run by every rank under torchrun (skipped under plain pytest):

    WEAVE_SHARE_GPUS=1 torchrun --nproc_per_node 2 -m pytest python/tests/test_autograd_multirank.py -q -p no:cacheprovider

As in test_multirank.py (whose fixtures these tests use): gloo serves the store and the seed only
(no NCCL); every rank regenerates the full inputs and the full nn.Linear from the shared seed,
computes the single-process float32 reference with torch autograd, and compares its shard of the
outputs and gradients, every element within test_autograd_gpu.check_bf16's bf16 bound. Shapes are
not tile multiples; ragged sequence shards where the operators allow them."""
import os

import pytest
import torch

if "WORLD_SIZE" not in os.environ:
    pytest.skip("multi-rank tests run under torchrun (see the module's docstring)", allow_module_level=True)

import weave  # noqa: E402
from refs import qkv, rand  # noqa: E402
from test_autograd_gpu import (  # noqa: E402
    attention_grads_ref, check_attention_grads, check_bf16, check_linear_grads, full_linear, gemm_size, linear_ref)
from test_multirank import env, rows_of  # noqa: E402,F401  (env: a fixture; world comes from conftest.py)

pytestmark = pytest.mark.gpu
BF = torch.bfloat16


def _full(seed, S, b, features, tag):
    return rand((S,) + (() if b is None else (b,)) + (features,), BF, seed, tag)


@pytest.mark.parametrize("s, b, fin", [(67, None, 136), (21, 3, 72)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("keep", [True, False])
@pytest.mark.parametrize("gather_output", [False, True])
def test_column_parallel(env, s, b, fin, bias, keep, gather_output):
    rank, W, seed = env
    fout = 104 * W
    w, bb = full_linear(seed, fin, fout, bias)
    torch.manual_seed(seed)
    m = weave.nn.ColumnParallelLinear(fin, fout, bias=bias, gather_output=gather_output, save_gathered_input=keep)
    first, n = weave.shard(fout)
    cols = slice(first, first + n)
    assert torch.equal(m.weight, w[cols])
    x_full, dy_full = _full(seed, W * s, b, fin, "x"), _full(seed, W * s, b, fout, "dy")
    x = x_full[rank * s:(rank + 1) * s].clone().requires_grad_()
    y = m(x)
    ref = linear_ref(x_full, w, bb, dy_full)
    if gather_output:  # the whole output on every rank, the same gradient everywhere
        check_bf16(y, ref[0], gemm_size(fin, x_full, w), "column y gathered")
        y.backward(dy_full)
    else:
        check_bf16(y, ref[0][..., cols], gemm_size(fin, x_full, w), "column y")
        y.backward(dy_full[..., cols].contiguous())
    check_linear_grads("column", x.grad, m.weight.grad, m.bias.grad if bias else None, ref, x_full, w, dy_full,
                       (slice(rank * s, (rank + 1) * s), cols, cols), partials_dx=W)


@pytest.mark.parametrize("extra, b, fout", [(0, None, 136), (0, 3, 200), (1, None, 136)])
@pytest.mark.parametrize("bias", [True, False])
def test_row_parallel(env, extra, b, fout, bias):
    rank, W, seed = env
    S = W * (67 if b is None else 21) + extra  # extra 1: ragged rows, the backward's all_gather + matmul
    fin = 72 * W
    w, bb = full_linear(seed, fin, fout, bias)
    torch.manual_seed(seed)
    m = weave.nn.RowParallelLinear(fin, fout, bias=bias)
    first, n = weave.shard(fin)
    cols = slice(first, first + n)
    assert torch.equal(m.weight, w[:, cols])
    x_full, dy_full = _full(seed, S, b, fin, "x"), _full(seed, S, b, fout, "dy")
    x = x_full[..., cols].contiguous().requires_grad_()
    y = m(x)
    r0, nr = weave.shard(S)
    rows = slice(r0, r0 + nr)
    ref = linear_ref(x_full, w, bb, dy_full)
    check_bf16(y, ref[0][rows], gemm_size(fin, x_full, w), "row y", partials=W)
    y.backward(dy_full[rows].contiguous())
    check_linear_grads("row", x.grad, m.weight.grad, m.bias.grad if bias else None, ref, x_full, w, dy_full,
                       ((..., cols), (slice(None), cols), slice(None)))


def _attention_inputs(seed, S, Hq, Hkv):
    q, k, v = qkv(2, S, Hq, Hkv, 128, seed, S)
    return q, k, v, rand(q.shape, BF, seed, "do", S), rand((2, Hq, S), torch.float32, seed, "dlse", S)


def _leaves(ts):
    return [t.contiguous().requires_grad_() for t in ts]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("S", [333, 1024])
def test_ring_attention_grads(env, causal, S):
    rank, W, seed = env
    q, k, v, do, dlse = _attention_inputs(seed, S, 2 * W, 2)
    ref = attention_grads_ref(q, k, v, do, dlse, causal)
    for sharding in ("zigzag", "contiguous"):
        ch = weave.ring_chunks(S, sharding)
        lq, lk, lv = _leaves(rows_of(ch, t) for t in (q, k, v))
        o, lse = weave.ring_attention(lq, lk, lv, causal, sharding=sharding, seq_len=S)
        torch.autograd.backward([o, lse], [rows_of(ch, do).contiguous(), rows_of(ch, dlse, dim=2).contiguous()])
        check_attention_grads([lq.grad, lk.grad, lv.grad], [rows_of(ch, r) for r in ref[2:]],
                              f"ring {sharding} causal={causal} S={S}")


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("S, Hkv", [(333, 2), (1024, 2), (333, 1)])  # Hkv 1 < W: K, V gathered whole
def test_ulysses_attention_grads(env, causal, S, Hkv):
    rank, W, seed = env
    q, k, v, do, _ = _attention_inputs(seed, S, 2 * W, Hkv)
    ref = attention_grads_ref(q, k, v, do, None, causal)
    first, n = weave.shard(S)
    lq, lk, lv = _leaves(t[:, first:first + n] for t in (q, k, v))
    weave.ulysses_attention(lq, lk, lv, causal, seq_len=S).backward(do[:, first:first + n].contiguous())
    check_attention_grads([lq.grad, lk.grad, lv.grad], [r[:, first:first + n] for r in ref[2:]],
                          f"ulysses causal={causal} S={S} Hkv={Hkv}")


def test_input_error_on_one_rank_raises_on_every_rank(env):
    """The last rank's input has the wrong feature count (the module's own check: ValueError there);
    its peers fail in the forward's cross-rank agreement with it instead of waiting. A fresh group:
    the forward's plan is new there, so no peer has launched."""
    import torch.distributed as dist

    rank, W, seed = env
    g = dist.new_group(list(range(W)))
    weave.init(g)
    m = weave.nn.ColumnParallelLinear(64, 16 * W, bias=False, group=g)
    x = rand((8, 64 - (8 if rank == W - 1 else 0)), BF, seed, "refuse", rank)
    with pytest.raises(ValueError if rank == W - 1 else RuntimeError) as e:
        m(x)
    assert ("expected" if rank == W - 1 else "different operators") in str(e.value), str(e.value)
    dist.barrier()
