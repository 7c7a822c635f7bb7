"""weave's operators as functions taking process groups (torch.ops.weave.* take group names).

Every function runs on torch's current stream and returns ordinary torch tensors (the caching
allocator's). Collective functions are called by every rank of the group with the same shapes;
a rank whose arguments differ makes every rank raise. `group`: None (torch.distributed's default
group, or a world of 1 without torch.distributed), a ProcessGroup, or a weave.Communicator.
Every function calls its torch.ops.weave operator (whose CUDA kernel is C++: weave._C)."""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from . import _comm, _ops  # noqa: F401  (_ops registers torch.ops.weave.*)
from . import autograd as _ag
from ._comm import GroupLike, group_name
from ._ops import run as _run

_ops_ns = torch.ops.weave  # .default: the overload itself (skips the packet's lookup)


def all_reduce(x: torch.Tensor, group: GroupLike = None) -> torch.Tensor:
    """The sum of x over the group's ranks (a new tensor). bf16, fp16 or fp32."""
    return _run(_ops_ns.all_reduce.default, x, group_name(group))


def all_gather(x: torch.Tensor, dim: int = 0, group: GroupLike = None, *, full_size: Optional[int] = None) -> torch.Tensor:
    """The ranks' x concatenated along dim. Rank r's x holds shard(full_size, world, r) entries along
    dim (the first full_size % world ranks one more); full_size defaults to world * x.shape[dim]."""
    return _run(_ops_ns.all_gather.default, x, dim, -1 if full_size is None else full_size, group_name(group))


def reduce_scatter(x: torch.Tensor, dim: int = 0, group: GroupLike = None) -> torch.Tensor:
    """This rank's share along dim of the sum of x over the ranks: shard(x.shape[dim], world, rank)
    entries (the first x.shape[dim] % world ranks hold one more)."""
    return _run(_ops_ns.reduce_scatter.default, x, dim, group_name(group))


def all_to_all(x: torch.Tensor, direction: str = "seq_to_head", group: GroupLike = None, *,
               seq_len: Optional[int] = None) -> torch.Tensor:
    """Ulysses all-to-all: 'seq_to_head' (B, S/W, H, D) -> (B, S, H/W, D), 'head_to_seq' back.
    seq_len: the whole sequence S for seq_to_head when the ranks' shares differ (default W x rows)."""
    return _run(_ops_ns.all_to_all.default, x, direction, -1 if seq_len is None else seq_len, group_name(group))


def all_gather_matmul(A_shard: torch.Tensor, Bs: Sequence[torch.Tensor], gather_dim: int = 0,
                      group: GroupLike = None, *, return_A: bool = True):
    """(all_gather(A_shard, gather_dim), [that @ B for B in Bs]) with the gather overlapped with the
    first GEMM: torch.ops.symm_mem.fused_all_gather_matmul's arguments and results. bf16; every rank
    holds the same number of rows; each B is K x N, contiguous or weight.t() of an nn.Linear weight
    (read in place); Bs after the first run as plain GEMMs on the gathered A."""
    Bs = list(Bs)
    return _run(_ops_ns.all_gather_matmul.default, A_shard, Bs, gather_dim, group_name(group), return_A=return_A)


def matmul_reduce_scatter(A: torch.Tensor, B: torch.Tensor, reduce_op: str = "sum", scatter_dim: int = 0,
                          group: GroupLike = None) -> torch.Tensor:
    """reduce_scatter(A @ B, scatter_dim) with the reduction overlapped with the GEMM:
    torch.ops.symm_mem.fused_matmul_reduce_scatter's arguments. reduce_op 'sum' or 'avg'. bf16."""
    return _run(_ops_ns.matmul_reduce_scatter.default, A, B, reduce_op, scatter_dim, group_name(group))


def matmul_all_reduce(A: torch.Tensor, B: torch.Tensor, group: GroupLike = None) -> torch.Tensor:
    """all_reduce(A @ B) with the reduction overlapped with the GEMM. bf16."""
    return _run(_ops_ns.matmul_all_reduce.default, A, B, group_name(group))


def all_gather_scaled_matmul(A_shard: torch.Tensor, Bs: Sequence[torch.Tensor], A_scale: torch.Tensor,
                             B_scales: Sequence[torch.Tensor], gather_dim: int = 0, group: GroupLike = None, *,
                             out_dtype: Optional[torch.dtype] = None, return_A: bool = True):
    """all_gather_matmul with fp8 operands: (all_gather(A_shard, gather_dim), [A_scale B_scales[i]
    (that @ Bs[i])]) in bf16, the gather overlapped with the first GEMM and travelling as fp8 (half
    of bf16's bytes). The arguments of torch.ops.symm_mem.fused_all_gather_scaled_matmul where weave
    has them: A_shard and every B torch.float8_e4m3fn, each B (K x N) the transpose of a contiguous
    N x K matrix (w.t() of an fp8 nn.Linear weight; torch._scaled_mm's mat2), K a multiple of 16, N
    of 8; per-tensor scales only, fp32 on A's device, one value each, read by the kernel (no host
    synchronisation): A_scale is the scale of the whole gathered A, so every rank passes the same
    value. out_dtype None or torch.bfloat16. torch's biases, result_scales and use_fast_accum are
    not taken: the per-tensor fp8 GEMM accumulates the whole of K in the tensor core's truncating
    accumulator, as torch's use_fast_accum=True does (kernels/gemm_fp8/README.md, "Numerics").
    Not differentiable."""
    Bs, B_scales = list(Bs), list(B_scales)
    return _run(_ops_ns.all_gather_scaled_matmul.default, A_shard, Bs, A_scale, B_scales, gather_dim,
                group_name(group), out_dtype=out_dtype, return_A=return_A)


def scaled_matmul_reduce_scatter(A: torch.Tensor, B: torch.Tensor, A_scale: torch.Tensor, B_scale: torch.Tensor,
                                 reduce_op: str = "sum", scatter_dim: int = 0, group: GroupLike = None, *,
                                 out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """matmul_reduce_scatter with fp8 operands: reduce_scatter(A_scale B_scale (A @ B), scatter_dim)
    in bf16, each rank's partial scaled by its own scales before the bf16 reduction overlapped with
    the GEMM (torch.ops.symm_mem.fused_scaled_matmul_reduce_scatter's operands, with weave's
    scatter_dim in place of its reshape arguments). A and B torch.float8_e4m3fn, B (K x N) the
    transpose of a contiguous N x K matrix, K a multiple of 16, N of 8; per-tensor fp32 scales on A's
    device. reduce_op 'sum' or 'avg'; out_dtype None or torch.bfloat16. Not differentiable."""
    return _run(_ops_ns.scaled_matmul_reduce_scatter.default, A, B, A_scale, B_scale, reduce_op, scatter_dim,
                group_name(group), out_dtype=out_dtype)


def matmul(A: torch.Tensor, B: torch.Tensor, bias: Optional[torch.Tensor] = None, *,
           out_dtype: Optional[torch.dtype] = None, out: Optional[torch.Tensor] = None,
           accumulate: bool = False) -> torch.Tensor:
    """A @ B (+ bias) on one GPU: bf16 inputs, fp32 accumulation.

    A: M x K contiguous (any leading dims), or a 2-D A.t() of a contiguous K x M matrix (read in
    place; M a multiple of 8), e.g. dy.t() for a weight gradient dy^T x. B: K x N contiguous, or
    weight.t() of an nn.Linear weight (N x K, read in place). K and N multiples of 8 (the kernel
    raises RuntimeError otherwise). bias: N values, bf16 or fp32, added to every row in fp32 before
    the output is rounded. out_dtype: torch.bfloat16 (default) or torch.float32.
    out: write into this contiguous bf16 / fp32 tensor of the output's shape instead (its dtype is
    the output's; out_dtype is then ignored) and return it; accumulate=True adds to it (out +=
    A @ B + bias; an fp32 out accumulates in fp32, e.g. a main gradient)."""
    if out is None:
        if accumulate:
            raise ValueError("weave.matmul: accumulate=True needs out= (the tensor to add to)")
        return _run(_ops_ns.matmul.default, A, B, bias, out_dtype)
    _run(_ops_ns.matmul_out.default, A, B, bias, accumulate, out=out)
    return out


def scaled_mm(A: torch.Tensor, B: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, *,
              out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """scale * (A @ B) in bf16 from fp8 operands on one GPU (fp32 accumulation), like
    torch._scaled_mm: A (M x K) contiguous, B (K x N) the transpose of a contiguous N x K matrix
    (torch._scaled_mm's column-major mat2: w.t() of an fp8 weight w, N x K). dtypes
    torch.float8_e4m3fn / torch.float8_e5m2 (not both e5m2). K a multiple of 16, N of 8.
    Scales: fp32 on A's device, read by the kernel (no host synchronisation).
    - per tensor: scale_a and scale_b one value each (shape () or (1,)): out = scale_a scale_b A B.
    - block scaled (DeepSeek-V3; either scale 2-D): scale_a (ceil(K/128), M), one per row and
      128-column block of A, K-block-major; scale_b (ceil(N/128), ceil(K/128)), one per 128 x 128
      block of B's N x K storage; out[m, n] = sum_kb scale_a[kb, m] scale_b[n // 128, kb]
      sum_{k in kb} A[m, k] B[k, n]. torch's 1x128 scale of shape (M, K/128) with strides (1, M) is
      this scale_a's transpose: pass it as scale.t().
    out_dtype: None or torch.bfloat16 (the only output type)."""
    return _run(_ops_ns.scaled_mm.default, A, B, scale_a, scale_b, out_dtype)


def grouped_mm(x: torch.Tensor, w: torch.Tensor, counts: torch.Tensor,
               capacity_rows: Optional[int] = None) -> torch.Tensor:
    """The MoE grouped GEMM on one GPU, one launch for all experts, no host synchronisation:
    y[rows of e] = x[rows of e] @ w[e].T, expert e's rows being [off_e, off_e + counts[e]) with
    off_e = counts[0] + ... + counts[e-1] (grouped rows, no padding between experts).

    x: (R, K) bf16 contiguous; w: (E, N, K) bf16 (nn.Linear weights stacked) contiguous, or
    w.transpose(1, 2) of a contiguous (E, K, N) stack (read in place); counts: (E,) int32 on x's
    device, read by the kernel only. capacity_rows: the rows the grouped buffer holds (default R;
    at most R). Returns y of shape (capacity_rows, N) bf16. Rows of y past sum(counts) are NOT
    written (unspecified values: mask or slice them). N and K multiples of 8, 1 <= E <= 1024.
    If the counts sum past capacity_rows (or one is negative) the launch writes nothing (y is then
    unspecified everywhere) and records the first such expert in the device's status words:
    grouped_mm_status() returns it, check_grouped_mm() raises it (both synchronise the stream).
    Differentiable in x and w (op_grads.py): dx by this grouped GEMM on w's transpose, dw by
    torch._grouped_mm; rows past sum(counts) get no gradient."""
    return _run(_ops_ns.grouped_mm.default, x, w, counts, -1 if capacity_rows is None else int(capacity_rows))


def _device_index(device) -> int:
    if device is None:
        return torch.cuda.current_device()
    d = torch.device(device)
    if d.type != "cuda":
        raise ValueError(f"weave: {d} is not a CUDA device")
    return torch.cuda.current_device() if d.index is None else d.index


def grouped_mm_status(device=None) -> Optional[dict]:
    """The first grouped_mm launch on `device` (default: the current CUDA device) that refused its
    counts since the last read, as a dict (error: 'capacity' or 'negative count', expert, count,
    rows: where that expert's rows end, capacity, message), or None. Synchronises torch's current
    stream of the device, then reads and clears the status words (shared by every grouped GEMM
    launch on the device, weave's C++ callers included)."""
    from ._lib import lib, require_gpu

    require_gpu("weave.grouped_mm_status")
    idx = _device_index(device)
    err, expert, count, rows, cap, msg = lib().grouped_gemm_status(idx, torch.cuda.current_stream(idx).cuda_stream)
    if err == 0:
        return None
    kind = {1: "capacity", 2: "negative count"}.get(err, f"error {err}")
    return {"error": kind, "expert": expert, "count": count, "rows": rows, "capacity": cap, "message": msg}


def check_grouped_mm(device=None) -> None:
    """grouped_mm_status, raising RuntimeError with its message if a launch refused its counts (off
    the hot path: it synchronises, e.g. once per step)."""
    s = grouped_mm_status(device)
    if s is not None:
        raise RuntimeError(f"weave.grouped_mm: {s['message']}")


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
              scale: Optional[float] = None):
    """(o, lse) of softmax(scale q k^T) v on one GPU; q (B, S, Hq, D), k and v (B, S, Hkv, D) (GQA:
    Hq a multiple of Hkv), bf16, D 64 or 128; lse (B, Hq, S) fp32 (natural log); scale default
    1/sqrt(D). Layout (B, S, H, D): SDPA's (B, H, S, D) is q.transpose(1, 2).
    Differentiable (o and lse): an unfused float32 backward (weave.autograd.Attention)."""
    if _ag.needs_grad(q, k, v):
        return _ag.Attention.apply(q, k, v, causal, scale)
    return _run(_ops_ns.attention.default, q, k, v, causal, scale)


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                   scale: Optional[float] = None, *, sharding: str = "zigzag", seq_len: Optional[int] = None,
                   group: GroupLike = None):
    """(o, lse) of attention over the whole sequence, each rank holding its rows of q, k, v (B, L, H, D)
    in `sharding` order (ring_chunks says which rows). lse (B, Hq, L) fp32.
    Differentiable: all-gathered K, V and an unfused float32 backward (weave.autograd.RingAttention)."""
    args = (q, k, v, causal, scale, sharding, -1 if seq_len is None else seq_len, group_name(group))
    if _ag.needs_grad(q, k, v):
        return _ag.RingAttention.apply(*args)
    return _run(_ops_ns.ring_attention.default, *args)


def ulysses_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                      scale: Optional[float] = None, *, seq_len: Optional[int] = None,
                      group: GroupLike = None) -> torch.Tensor:
    """o of attention over the whole sequence, each rank holding rows shard(S, world, rank) of q, k, v
    (B, L, H, D); the all-to-alls run inside the kernel. Hq a multiple of the world size.
    Differentiable: all-to-alls and an unfused float32 backward (weave.autograd.UlyssesAttention)."""
    args = (q, k, v, causal, scale, -1 if seq_len is None else seq_len, group_name(group))
    if _ag.needs_grad(q, k, v):
        return _ag.UlyssesAttention.apply(*args)
    return _run(_ops_ns.ulysses_attention.default, *args)


def ring_chunks(seq_len: int, sharding: str = "zigzag", group: GroupLike = None) -> list[tuple[int, int]]:
    """The (first row, rows) of the sequence chunks this rank holds for ring_attention, in the order
    its q, k, v hold them ('zigzag': chunks r and 2W-1-r of 2W; 'contiguous': chunk r of W)."""
    from ._lib import lib

    rank, world = _comm.group_rank_world(group_name(group))
    zz = sharding == "zigzag"
    return [lib().ring_chunk(seq_len, world, zz, rank, i) for i in range(lib().ring_chunks_per_rank(zz))]


def shard(n: int, group: GroupLike = None) -> tuple[int, int]:
    """(first, count) of this rank's share of n entries (reduce_scatter's, all_gather's, Ulysses')."""
    from ._lib import lib

    rank, world = _comm.group_rank_world(group_name(group))
    return lib().shard(n, world, rank)
