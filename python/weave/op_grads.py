"""The gradients of torch.ops.weave.* themselves (torch.library.register_autograd), so that a model
calling weave.all_gather, weave.matmul, weave.matmul_reduce_scatter, ... directly trains.

Collectives follow torch.distributed.nn.functional: the backward is the adjoint over the group, the
gradient of the sum of every rank's loss: all_reduce's is an all_reduce of the gradients,
all_gather's a reduce_scatter (each rank gets the sum of every rank's gradient of its shard),
reduce_scatter's an all_gather, an all_to_all's the inverse all_to_all. (Megatron's layers assume
instead that every rank holds the same loss and count it once; weave.nn's modules do that with
their own torch.autograd.Function, autograd.py, and are not changed by this file.)

GEMMs: for y = A @ B (+ bias), dA = dY @ B^T and dB = A^T @ dY on weave's GEMM (B^T and A^T read in
place: the transposed operands it takes), where its rules hold (bf16 dY; rows, K and N multiples of
8 for dB: autograd._weight_grad), else torch.matmul in float32 of the same values, rounded to the
input's dtype once; dbias is the float32 sum of dY's rows. An fp32 output's dY is float32, so its
gradients take torch.matmul in float32. The TP operators' backwards are their dual fused kernels
(the input gradient of AG+GEMM is a GEMM+RS and vice versa) where the shards are equal, else a
collective and a GEMM. grouped_mm (the MoE grouped GEMM): dx by weave's grouped GEMM on the
transposed weight stack, dw by torch._grouped_mm (no grouped weight-gradient kernel in weave yet).
scaled_mm and the fp8 TP operators (all_gather_scaled_matmul, scaled_matmul_reduce_scatter) and
the attention operators have no gradient here (the public attention functions
are differentiable through autograd.py); asking for one raises torch's "does not have an autograd
kernel" error."""
from __future__ import annotations

from typing import Optional

import torch

from . import _comm, _ops
from ._ops import run as _run
from .autograd import _rows, _weight_grad

_ops_ns = torch.ops.weave
BF = torch.bfloat16


def _register(name: str, backward, setup) -> None:
    torch.library.register_autograd(f"weave::{name}", backward, setup_context=setup, lib=_ops._lib)


# ---- collectives ----------------------------------------------------------------------------


def _group_setup(ctx, inputs, output):
    ctx.group = inputs[-1]


def _all_reduce_bwd(ctx, g):
    return _run(_ops_ns.all_reduce.default, g.contiguous(), ctx.group), None


def _all_gather_setup(ctx, inputs, output):
    _, dim, _, group = inputs
    ctx.dim, ctx.group = dim, group


def _all_gather_bwd(ctx, g):
    # reduce_scatter's shards are all_gather's (the near-equal split of the gathered length).
    return _run(_ops_ns.reduce_scatter.default, g.contiguous(), ctx.dim, ctx.group), None, None, None


def _reduce_scatter_setup(ctx, inputs, output):
    x, dim, group = inputs
    ctx.dim, ctx.group, ctx.full = dim, group, int(x.shape[dim])


def _reduce_scatter_bwd(ctx, g):
    return _run(_ops_ns.all_gather.default, g.contiguous(), ctx.dim, ctx.full, ctx.group), None, None


def _all_to_all_setup(ctx, inputs, output):
    x, direction, _, group = inputs
    ctx.direction, ctx.group, ctx.seq = direction, group, int(x.shape[1])


def _all_to_all_bwd(ctx, g):
    g = g.contiguous()
    if ctx.direction == "seq_to_head":  # back to this rank's rows: the shares the forward took
        dx = _run(_ops_ns.all_to_all.default, g, "head_to_seq", -1, ctx.group)
    else:  # head_to_seq took the whole sequence S on every rank
        dx = _run(_ops_ns.all_to_all.default, g, "seq_to_head", ctx.seq, ctx.group)
    return dx, None, None, None


# ---- GEMMs ----------------------------------------------------------------------------------


def _input_grad(g2: torch.Tensor, B: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """dA = dY @ B^T (rows x K) of dY (rows x N) and B (K x N, contiguous or a weight's .t())."""
    if g2.dtype == BF and B.dtype == BF and g2.device.type in ("cuda", "meta"):
        return _run(_ops_ns.matmul.default, g2, B.t())  # B^T: the other of the two B forms weave's GEMM reads
    return torch.matmul(g2.float(), B.float().t()).to(dtype)


def _b_grad(a2: torch.Tensor, g2: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """dB = A^T @ dY (K x N) of A (rows x K) and dY (rows x N)."""
    if g2.dtype == BF and a2.dtype == BF:
        return _weight_grad(a2.contiguous(), g2)
    return torch.matmul(a2.float().t(), g2.float()).to(dtype)


def _gemm_grads(ctx, A: torch.Tensor, B: torch.Tensor, g: torch.Tensor):
    """(dA shaped as A, dB) of y = A @ B for the inputs ctx asks for."""
    g2 = _rows(g).contiguous()
    dA = dB = None
    if ctx.needs_input_grad[0]:
        dA = _input_grad(g2, B, A.dtype).reshape(A.shape)
    if ctx.needs_input_grad[1]:
        dB = _b_grad(_rows(A), g2, B.dtype)
    return dA, dB


def _matmul_setup(ctx, inputs, output):
    A, B, bias, _ = inputs
    ctx.save_for_backward(A, B)
    ctx.bias_dtype = None if bias is None else bias.dtype


def _matmul_bwd(ctx, g):
    A, B = ctx.saved_tensors
    dA, dB = _gemm_grads(ctx, A, B, g)
    db = None
    if ctx.bias_dtype is not None and ctx.needs_input_grad[2]:
        db = _rows(g).sum(0, dtype=torch.float32).to(ctx.bias_dtype)
    return dA, dB, db, None


def _matmul_all_reduce_setup(ctx, inputs, output):
    A, B, group = inputs
    ctx.save_for_backward(A, B)
    ctx.group = group


def _matmul_all_reduce_bwd(ctx, g):
    A, B = ctx.saved_tensors
    gsum = _run(_ops_ns.all_reduce.default, g.contiguous(), ctx.group)  # every rank's loss sees the reduced y
    dA, dB = _gemm_grads(ctx, A, B, gsum)
    return dA, dB, None


def _matmul_reduce_scatter_setup(ctx, inputs, output):
    A, B, reduce_op, dim, group = inputs
    ctx.save_for_backward(A, B)
    ctx.args = (reduce_op, dim, group)


def _matmul_reduce_scatter_bwd(ctx, g):
    A, B = ctx.saved_tensors
    reduce_op, dim, group = ctx.args
    _, world = _comm.group_rank_world(group)
    g = g.contiguous()
    full = int(A.shape[dim])
    need_a, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    dA = dB = None
    if need_a and full % world == 0 and g.dtype == BF:
        # The dual fused kernel: the gathered dY's GEMM with B^T, overlapped with the gather.
        gg, (dA,) = _run(_ops_ns.all_gather_matmul.default, g, [B.t()], dim, group, return_A=need_b)
    else:
        gg = _run(_ops_ns.all_gather.default, g, dim, full, group)
        if need_a:
            dA = _input_grad(_rows(gg.movedim(dim, 0)).contiguous(), B, A.dtype)
            dA = dA.reshape(gg.movedim(dim, 0).shape[:-1] + (A.shape[-1],)).movedim(0, dim)
    if need_b:
        dB = _b_grad(_rows(A.movedim(dim, 0)), _rows(gg.movedim(dim, 0)).contiguous(), B.dtype)
    if reduce_op == "avg":
        dA = None if dA is None else dA / world
        dB = None if dB is None else dB / world
    return dA, dB, None, None, None


def _all_gather_matmul_setup(ctx, inputs, keyword_only_inputs, output):  # return_A is keyword-only
    A_shard, Bs, dim, group = inputs
    gathered = output[0]
    ctx.save_for_backward(A_shard, gathered if gathered is not None else A_shard, *Bs)
    ctx.args = (dim, group, gathered is not None)


def _all_gather_matmul_bwd(ctx, g_a: Optional[torch.Tensor], g_outs):
    A_shard, gathered, *Bs = ctx.saved_tensors
    dim, group, have_gathered = ctx.args
    need_a, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    if not have_gathered and need_b:
        gathered = _run(_ops_ns.all_gather.default, A_shard, dim, -1, group)
    live = [(B, g) for B, g in zip(Bs, g_outs) if g is not None]
    dA = None
    if need_a:
        if len(live) == 1 and g_a is None and live[0][1].dtype == BF:
            # The dual fused kernel: dY B^T reduce-scattered, overlapped with the GEMM.
            B, g = live[0]
            dA = _run(_ops_ns.matmul_reduce_scatter.default, g.contiguous(), B.t(), "sum", dim, group)
        else:
            full = None
            for B, g in live:
                gm = g.movedim(dim, 0)
                part = _input_grad(_rows(gm).contiguous(), B, A_shard.dtype).reshape(gm.shape[:-1] + (B.shape[0],))
                full = part if full is None else full + part
            if g_a is not None:
                ga = g_a.movedim(dim, 0)
                full = ga if full is None else full + ga
            if full is None:
                dA = torch.zeros_like(A_shard)
            else:
                dA = _run(_ops_ns.reduce_scatter.default, full.movedim(0, dim).contiguous(), dim, group)
    dBs = None
    if need_b:
        a2 = _rows(gathered.movedim(dim, 0))
        dBs = [None if g is None else _b_grad(a2, _rows(g.movedim(dim, 0)).contiguous(), B.dtype)
               for B, g in zip(Bs, g_outs)]
    return dA, dBs, None, None


# ---- the MoE grouped GEMM ------------------------------------------------------------------


def _grouped_mm_setup(ctx, inputs, output):
    x, w, counts, _ = inputs
    ctx.save_for_backward(x, w, counts)
    ctx.rows = int(output.shape[0])  # the capacity rows y has


def _grouped_mm_bwd(ctx, g):
    """y[rows of e] = x[rows of e] @ w[e]^T. dx[rows of e] = g[rows of e] @ w[e]: weave's grouped GEMM
    again, with the stack w^T (read in place in either of its layouts). dw[e] = g[rows of e]^T
    x[rows of e]: torch._grouped_mm's K-grouped product (weave has no grouped weight-gradient kernel
    yet). Rows past sum(counts) have no output, so they pass no gradient; the counts stay on the
    device (no host synchronisation)."""
    x, w, counts = ctx.saved_tensors
    cap = ctx.rows
    live = (torch.arange(cap, device=g.device) < counts.sum()).unsqueeze(1)
    g = torch.where(live, g, 0).to(BF).contiguous()
    dx = dw = None
    if ctx.needs_input_grad[0]:
        d = _run(_ops_ns.grouped_mm.default, g, w.transpose(1, 2), counts, cap)
        dx = torch.zeros_like(x)
        dx[:cap] = torch.where(live, d, 0)  # rows past sum(counts) are not written by the kernel
    if ctx.needs_input_grad[1]:
        offs = torch.cumsum(counts, 0, dtype=torch.int32).clamp_(max=cap)
        dw = torch._grouped_mm(g.t(), x[:cap], offs=offs).to(w.dtype)
    return dx, dw, None, None


_register("all_reduce", _all_reduce_bwd, _group_setup)
_register("all_gather", _all_gather_bwd, _all_gather_setup)
_register("reduce_scatter", _reduce_scatter_bwd, _reduce_scatter_setup)
_register("all_to_all", _all_to_all_bwd, _all_to_all_setup)
_register("matmul", _matmul_bwd, _matmul_setup)
_register("matmul_all_reduce", _matmul_all_reduce_bwd, _matmul_all_reduce_setup)
_register("matmul_reduce_scatter", _matmul_reduce_scatter_bwd, _matmul_reduce_scatter_setup)
_register("all_gather_matmul", _all_gather_matmul_bwd, _all_gather_matmul_setup)
_register("grouped_mm", _grouped_mm_bwd, _grouped_mm_setup)
