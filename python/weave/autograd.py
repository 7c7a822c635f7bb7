"""Autograd for weave's operators: torch.autograd.Function classes around torch.ops.weave.*.

Linear layers (Megatron's sequence-parallel layout; the modules are in weave.nn):
- column: forward all_gather_matmul (AG+GEMM); backward dX = matmul_reduce_scatter(dY, W) (the dual
  fused GEMM+RS kernel), dW = dY^T X_gathered (_weight_grad: weave.matmul with dY^T read in place as
  a K x M A; torch.matmul for shapes that are not multiples of 8) and db = sum of dY's rows.
- row: forward matmul_reduce_scatter (GEMM+RS); backward dX = all_gather_matmul(dY_shard, [W]) (the
  dual fused AG+GEMM, which also returns the gathered dY), dW = dY_gathered^T X (_weight_grad),
  db all-reduced over the group (the bias is replicated; its rows' gradients are spread over ranks).

Attention (weave.attention, ring_attention, ulysses_attention): the forward is weave's fused kernel,
the backward is UNFUSED torch math in float32 (`attention_backward`): P = exp(scale q k^T - lse) is
recomputed per kv head and chunk of query rows (at most `chunk_elems` scores at once), then
dV = P^T dO, dP = dO V^T, dS = P (dP - rowsum(P dP) + dlse), dQ = scale dS K, dK = scale dS^T Q.
Cost: five float32 GEMMs of the attention's size (about 2.5x the forward's FLOPs, at float32 rate,
not bf16 tensor-core rate) and, per chunk, about four float32 buffers of `chunk_elems` elements
(WEAVE_ATTN_BWD_CHUNK, default 2^26: about 1 GiB), plus float32 dK, dV of the keys' size. A fused
backward kernel is a later issue."""
from __future__ import annotations

import math
import os
from typing import Optional, Sequence

import torch

from . import _comm, _ops  # noqa: F401  (_ops registers torch.ops.weave.*)
from ._lib import lib
from ._ops import run as _run

_ops_ns = torch.ops.weave


# Scores per block of the unfused attention backward: $WEAVE_ATTN_BWD_CHUNK, its row in weave's
# table of environment variables (include/weave/runtime/env.hpp: an int, unset or empty = 1 << 26).
def _chunk_elems() -> int:
    text = os.environ.get("WEAVE_ATTN_BWD_CHUNK", "")
    if not text:
        return 1 << 26
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"weave: WEAVE_ATTN_BWD_CHUNK='{text}' is not an integer (e.g. 0, 8)") from None


CHUNK_ELEMS = _chunk_elems()


def needs_grad(*tensors: Optional[torch.Tensor]) -> bool:
    """Whether autograd records a call on these tensors (else the plain operator runs)."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


# ---------------------------------------------------------------------------------------------
# Attention backward (unfused, any device, float32; float64 inputs stay float64 for tests).


def _segments(pos: list[int], rows: int) -> list[tuple[int, int]]:
    """[r0, r1) chunks of at most `rows` query rows, each inside a run of consecutive positions (so
    that a causal chunk only reads the keys up to its last row)."""
    out, start = [], 0
    for i in range(1, len(pos) + 1):
        if i == len(pos) or pos[i] != pos[i - 1] + 1:
            out += [(r, min(r + rows, i)) for r in range(start, i, rows)]
            start = i
    return out


def attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor,
                       lse: Optional[torch.Tensor], causal: bool, scale: Optional[float], *,
                       q_pos: Optional[Sequence[int]] = None, dlse: Optional[torch.Tensor] = None,
                       chunk_elems: Optional[int] = None):
    """(dq, dk, dv) of o = softmax(scale q k^T + mask) v, in float32 (float64 for float64 inputs).

    q, do (B, L, Hq, D); k, v (B, S, Hkv, D), key j at position j; Hq a multiple of Hkv (query head
    h uses kv head h // (Hq / Hkv)). q_pos: the positions of q's rows (default 0..L-1); causal hides
    keys after a row's position. lse (B, Hq, L): the forward's natural-log LSE of the scaled scores,
    or None (recomputed here). dlse: the gradient of lse, if any. scale None or 0: 1/sqrt(D)."""
    B, L, Hq, D = (int(d) for d in q.shape)
    S, Hkv = int(k.shape[1]), int(k.shape[2])
    G = Hq // Hkv
    scale = float(scale) if scale else 1.0 / math.sqrt(D)
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    dev = q.device
    pos = list(range(L)) if q_pos is None else [int(p) for p in q_pos]
    pos_dev = torch.tensor(pos, dtype=torch.long).to(dev)
    key_pos = torch.arange(S, device=dev)
    rows = max(1, (chunk_elems or CHUNK_ELEMS) // max(1, B * G * S))
    chunks = _segments(pos, rows)
    dq = torch.empty((B, L, Hq, D), dtype=acc, device=dev)
    dk = torch.zeros((B, S, Hkv, D), dtype=acc, device=dev)
    dv = torch.zeros((B, S, Hkv, D), dtype=acc, device=dev)
    for h in range(Hkv):
        heads = slice(h * G, (h + 1) * G)
        kh = k[:, :, h].to(acc).unsqueeze(1)  # (B, 1, S, D)
        vh = v[:, :, h].to(acc).unsqueeze(1)
        qh = q[:, :, heads].to(acc).transpose(1, 2)  # (B, G, L, D)
        doh = do[:, :, heads].to(acc).transpose(1, 2)
        for r0, r1 in chunks:
            n = min(S, pos[r1 - 1] + 1) if causal else S  # keys after the chunk's last row are hidden
            kc, vc, qc, doc = kh[:, :, :n], vh[:, :, :n], qh[:, :, r0:r1], doh[:, :, r0:r1]
            p = torch.matmul(qc, kc.transpose(-1, -2)).mul_(scale)  # (B, G, rows, n) scores
            if causal:
                p.masked_fill_(key_pos[:n].unsqueeze(0) > pos_dev[r0:r1].unsqueeze(1), float("-inf"))
            m = lse[:, heads, r0:r1].to(acc) if lse is not None else torch.logsumexp(p, dim=-1)
            p.sub_(m.unsqueeze(-1)).exp_()  # P (masked entries 0)
            dp = torch.matmul(doc, vc.transpose(-1, -2))
            corr = (p * dp).sum(-1, keepdim=True).neg_()  # -rowsum(P dP) = -dO . O
            if dlse is not None:
                corr.add_(dlse[:, heads, r0:r1].to(acc).unsqueeze(-1))
            ds = dp.add_(corr).mul_(p)  # dS = P (dP - rowsum(P dP) + dlse)
            dq[:, r0:r1, heads] = torch.matmul(ds, kc).mul_(scale).transpose(1, 2)
            dk[:, :n, h] += torch.matmul(ds.transpose(-1, -2), qc).sum(1).mul_(scale)
            dv[:, :n, h] += torch.matmul(p.transpose(-1, -2), doc).sum(1)
    return dq, dk, dv


def ring_positions(S: int, world: int, zigzag: bool) -> list[list[int]]:
    """Per rank, the global positions of its local rows in ring_attention's order (ring_chunks):
    S split into n near-equal chunks (the first S % n one row longer), n = 2W with rank r holding
    chunks r and 2W-1-r (zigzag), else W with rank r holding chunk r. ring_attention/schedule.hpp's
    rule in plain Python, so that torch.compile traces the backward (it cannot trace a call into
    weave._C); test_ring_positions_match_ring_chunks compares the two."""
    n = 2 * world if zigzag else world
    q, rem = divmod(S, n)

    def chunk(j: int) -> range:
        begin = j * q + min(j, rem)
        return range(begin, begin + q + (1 if j < rem else 0))

    return [[p for j in ((r, n - 1 - r) if zigzag else (r,)) for p in chunk(j)] for r in range(world)]


def ring_backward(q, k, v, do, lse, causal, scale, S: int, zigzag: bool, rank: int, world: int, group: str, *,
                  dlse=None, ops=_ops_ns):
    """Ring attention's backward on this rank (float32 dq, dk, dv of its rows): the K and V of every
    rank gathered with ops.all_gather along dim 1 (each rank's rows padded to the longest rank's,
    stacked as (B, Lmax, 2, Hkv, D), bf16), put in global order, this rank's rows' backward against
    the whole sequence at their global positions, then dK, dV (float32, in the gathered layout)
    summed and returned to their owners with ops.reduce_scatter along dim 1. `ops`: torch.ops.weave
    (tests pass a simulated group)."""
    positions = ring_positions(S, world, zigzag)
    B, L, Hkv, D = (int(d) for d in k.shape)
    lmax = max(len(p) for p in positions)
    kv = k.new_zeros((B, lmax, 2, Hkv, D))
    kv[:, :L, 0] = k
    kv[:, :L, 1] = v
    order = torch.empty(S, dtype=torch.long)  # global position -> row of the gathered buffer
    for r, p in enumerate(positions):
        order[torch.tensor(p, dtype=torch.long)] = torch.arange(len(p)) + r * lmax
    order = order.to(q.device)
    kv_all = ops.all_gather(kv, 1, -1, group).index_select(1, order)  # (B, S, 2, Hkv, D), global order
    dq, dk, dv = attention_backward(q, kv_all[:, :, 0], kv_all[:, :, 1], do, lse, causal, scale,
                                    q_pos=positions[rank], dlse=dlse)
    del kv_all
    grads = dk.new_zeros((B, world * lmax, 2, Hkv, D))
    grads[:, order, 0] = dk
    grads[:, order, 1] = dv
    del dk, dv
    mine = ops.reduce_scatter(grads, 1, group)[:, :L]  # (B, L, 2, Hkv, D)
    return dq, mine[:, :, 0], mine[:, :, 1]


def ulysses_backward(q, k, v, do, causal, scale, S: int, rank: int, world: int, group: str, *, ops=_ops_ns):
    """Ulysses attention's backward on this rank (float32 dq, dk, dv of its rows): the forward's
    all-to-alls in reverse around the unfused backward of this rank's query heads over the whole
    sequence (the LSE recomputed: the forward has none). q and dO, stacked along the batch, go
    sequence -> heads; K and V too where the group divides Hkv, else (GQA with kv heads shared by
    ranks) they are all-gathered whole and dK, dV summed back by a reduce-scatter. dQ (and dK, dV)
    go heads -> sequence in float32. `ops`: torch.ops.weave (tests pass a simulated group)."""
    B, Hq, Hkv = int(q.shape[0]), int(q.shape[2]), int(k.shape[2])

    def to_heads(x):
        return ops.all_to_all(x, "seq_to_head", S, group)

    def to_seq(x):
        return ops.all_to_all(x.contiguous(), "head_to_seq", -1, group)

    qd = to_heads(torch.cat((q, do), dim=0))  # (2B, S, Hq/W, D)
    if Hkv % world == 0:
        kv = to_heads(torch.cat((k, v), dim=0))  # (2B, S, Hkv/W, D)
        dq, dk, dv = attention_backward(qd[:B], kv[:B], kv[B:], qd[B:], None, causal, scale)
        dkv = to_seq(torch.cat((dk, dv), dim=0))
    else:
        kv = ops.all_gather(torch.cat((k, v), dim=0), 1, S, group)  # (2B, S, Hkv, D)
        hp, G = Hq // world, Hq // Hkv
        idx = torch.tensor([(rank * hp + i) // G for i in range(hp)], device=q.device)
        kvh = kv.index_select(2, idx)  # the kv head of each local query head
        dq, dk, dv = attention_backward(qd[:B], kvh[:B], kvh[B:], qd[B:], None, causal, scale)
        full = dk.new_zeros((2 * B, S, Hkv, int(q.shape[3])))
        full[:B].index_add_(2, idx, dk)
        full[B:].index_add_(2, idx, dv)
        dkv = ops.reduce_scatter(full, 1, group)
    return to_seq(dq), dkv[:B], dkv[B:]


class Attention(torch.autograd.Function):
    """weave.attention with autograd: saves q, k, v and lse (not o); backward: attention_backward."""

    @staticmethod
    def forward(ctx, q, k, v, causal: bool, scale: Optional[float]):
        o, lse = _run(_ops_ns.attention.default, q, k, v, causal, scale)
        ctx.save_for_backward(q, k, v, lse)
        ctx.args = (causal, scale)
        ctx.set_materialize_grads(False)
        return o, lse

    @staticmethod
    def backward(ctx, do, dlse):
        q, k, v, lse = ctx.saved_tensors
        if do is None and dlse is None:
            return None, None, None, None, None
        do = torch.zeros_like(q) if do is None else do
        dq, dk, dv = attention_backward(q, k, v, do, lse, *ctx.args, dlse=dlse)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None


def _seq_args(q, seq_len: int, group: str):
    """(S, rank, world) of a sequence-parallel call."""
    rank, world = _comm.group_rank_world(group)
    return (world * int(q.shape[1]) if seq_len < 0 else seq_len), rank, world


class RingAttention(torch.autograd.Function):
    """weave.ring_attention with autograd: saves q, k, v and lse; backward: ring_backward."""

    @staticmethod
    def forward(ctx, q, k, v, causal: bool, scale: Optional[float], sharding: str, seq_len: int, group: str):
        o, lse = _run(_ops_ns.ring_attention.default, q, k, v, causal, scale, sharding, seq_len, group)
        ctx.save_for_backward(q, k, v, lse)
        ctx.args = (causal, scale, *_seq_args(q, seq_len, group), sharding == "zigzag", group)
        ctx.set_materialize_grads(False)
        return o, lse

    @staticmethod
    def backward(ctx, do, dlse):
        q, k, v, lse = ctx.saved_tensors
        causal, scale, S, rank, world, zigzag, group = ctx.args
        do = torch.zeros_like(q) if do is None else do  # collective: every rank runs the backward
        dq, dk, dv = ring_backward(q, k, v, do, lse, causal, scale, S, zigzag, rank, world, group, dlse=dlse)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None, None


class UlyssesAttention(torch.autograd.Function):
    """weave.ulysses_attention with autograd: saves q, k, v; backward: ulysses_backward."""

    @staticmethod
    def forward(ctx, q, k, v, causal: bool, scale: Optional[float], seq_len: int, group: str):
        o = _run(_ops_ns.ulysses_attention.default, q, k, v, causal, scale, seq_len, group)
        ctx.save_for_backward(q, k, v)
        ctx.args = (causal, scale, *_seq_args(q, seq_len, group), group)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v = ctx.saved_tensors
        dq, dk, dv = ulysses_backward(q, k, v, do, *ctx.args)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None


# ---------------------------------------------------------------------------------------------
# Tensor-parallel linear layers (bf16). x's dim 0 is the sequence (Megatron's (S, B, H) or (S, H)).


def _rows(t: torch.Tensor) -> torch.Tensor:
    """t as a 2-D (rows, features) matrix."""
    return t.reshape(-1, t.shape[-1])


def _weight_grad(dy: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """dW = dY^T X (out x in, bf16) of dY (rows, ..., out) and X (rows, ..., in), both contiguous.

    weave's GEMM with A = dY^T read in place as a K x M matrix (gemm::ALayout::KM: the stored dY is
    rows x out, i.e. K x M), fp32 accumulation, one bf16 rounding, where its shape rules hold (rows,
    out and in multiples of 8) on CUDA and meta tensors (meta: the operator's fake, so shape checks
    run without a GPU). Elsewhere (ragged shapes, CPU) torch.matmul of the transposed view (cuBLAS
    also reads the transpose in place; the same fp32 accumulation and bf16 output)."""
    a, b = _rows(dy), _rows(x)
    K, M, N = (int(d) for d in (a.shape[0], a.shape[1], b.shape[1]))
    # The GEMM's TMA also needs 16-byte aligned operands: a view into a larger tensor (a user's x[1:])
    # may not be, and would raise in the kernel's checks rather than fall back. Traced tensors (meta,
    # fake, functional; torch.compile) have no address: they take the GEMM, whose checks still run.
    traced = a.device.type == "meta" or torch.compiler.is_compiling() or type(a) is not torch.Tensor
    aligned = traced or (a.data_ptr() % 16 == 0 and b.data_ptr() % 16 == 0)
    if (a.device.type in ("cuda", "meta") and a.dtype == b.dtype == torch.bfloat16 and a.is_contiguous()
            and b.is_contiguous() and K > 0 and K % 8 == 0 and M % 8 == 0 and N % 8 == 0 and aligned):
        return _run(_ops_ns.matmul.default, a.t(), b)
    return torch.matmul(a.t(), b)


def _bias_grad(dy: torch.Tensor) -> torch.Tensor:
    """The sum of dY's rows, float32."""
    return _rows(dy).sum(0, dtype=torch.float32)


class ColumnParallelLinearFn(torch.autograd.Function):
    """y = all_gather(x, 0) @ weight^T + bias, x this rank's sequence rows, weight this rank's output
    features (out/W x in). keep_gathered: save the gathered x for dW (W times x's memory until the
    backward) instead of gathering it again there (one more all-gather)."""

    @staticmethod
    def forward(ctx, x, weight, bias, group: str, keep_gathered: bool):
        xg, (y,) = _run(_ops_ns.all_gather_matmul.default, x, [weight.t()], 0, group, return_A=keep_gathered)
        if bias is not None:  # out of place: compiled, y.add_(bias) gave other gradients (test_autograd_cpu.py)
            y = y + bias
        ctx.save_for_backward(xg if keep_gathered else x, weight)
        ctx.args = (group, keep_gathered, bias is not None)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        group, gathered, has_bias = ctx.args
        dy = dy.contiguous()
        dx = dw = db = None
        if ctx.needs_input_grad[0]:  # the dual fused kernel: GEMM + reduce-scatter of the rows
            dx = _run(_ops_ns.matmul_reduce_scatter.default, dy, weight, "sum", 0, group)
        if ctx.needs_input_grad[1]:
            xg = x if gathered else _run(_ops_ns.all_gather.default, x, 0, -1, group)
            dw = _weight_grad(dy, xg)
        if has_bias and ctx.needs_input_grad[2]:
            db = _bias_grad(dy).to(weight.dtype)
        return dx, dw, db, None, None


class RowParallelLinearFn(torch.autograd.Function):
    """y = reduce_scatter(x @ weight^T, 0) + bias, x this rank's input features (S x in/W), weight
    (out x in/W), y this rank's sequence rows shard(S). The bias is replicated: its gradient (the
    sum of this rank's rows of dY) is all-reduced over the group inside the backward."""

    @staticmethod
    def forward(ctx, x, weight, bias, group: str):
        y = _run(_ops_ns.matmul_reduce_scatter.default, x, weight.t(), "sum", 0, group)
        if bias is not None:
            y = y + bias
        ctx.save_for_backward(x, weight)
        ctx.args = (group, bias is not None)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        group, has_bias = ctx.args
        dy = dy.contiguous()
        need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        _, world = _comm.group_rank_world(group)
        S = int(x.shape[0])
        dx = dw = db = None
        dyg = None
        if need_x and S % world == 0:  # the dual fused kernel: all-gather of dY's rows + GEMM
            dyg, (dx,) = _run(_ops_ns.all_gather_matmul.default, dy, [weight], 0, group, return_A=need_w)
        elif need_x or need_w:  # ragged rows (all_gather_matmul wants equal shards): gather, then GEMM
            dyg = _run(_ops_ns.all_gather.default, dy, 0, S, group)
            if need_x:
                dx = _run(_ops_ns.matmul.default, dyg, weight)
        if need_w:
            dw = _weight_grad(dyg, x)
        if has_bias and ctx.needs_input_grad[2]:
            db = _run(_ops_ns.all_reduce.default, _bias_grad(dy), group).to(weight.dtype)
        return dx, dw, db, None


class GatherLastDim(torch.autograd.Function):
    """all_gather along the last dimension (ColumnParallelLinear's gather_output); the backward keeps
    this rank's columns of the (replicated) gradient."""

    @staticmethod
    def forward(ctx, y, full: int, group: str):
        rank, world = _comm.group_rank_world(group)
        ctx.cols = lib().shard(full, world, rank)
        return _run(_ops_ns.all_gather.default, y.contiguous(), -1, full, group)

    @staticmethod
    def backward(ctx, dy):
        first, count = ctx.cols
        return dy.narrow(-1, first, count), None, None
