"""weave's operators as functions taking process groups (torch.ops.weave.* take group names).

Every function runs on torch's current stream and returns ordinary torch tensors (the caching
allocator's). Collective functions are called by every rank of the group with the same shapes;
a rank whose arguments differ makes every rank raise. `group`: None (torch.distributed's default
group, or a world of 1 without torch.distributed), a ProcessGroup, or a weave.Communicator."""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from . import _comm, _ops  # noqa: F401  (_ops registers torch.ops.weave.*)
from . import autograd as _ag
from ._comm import GroupLike, group_name

_ops_ns = torch.ops.weave


def all_reduce(x: torch.Tensor, group: GroupLike = None) -> torch.Tensor:
    """The sum of x over the group's ranks (a new tensor). bf16, fp16 or fp32."""
    return _ops_ns.all_reduce(x, group_name(group))


def all_gather(x: torch.Tensor, dim: int = 0, group: GroupLike = None, *, full_size: Optional[int] = None) -> torch.Tensor:
    """The ranks' x concatenated along dim. Rank r's x holds shard(full_size, world, r) entries along
    dim (the first full_size % world ranks one more); full_size defaults to world * x.shape[dim]."""
    return _ops_ns.all_gather(x, dim, -1 if full_size is None else full_size, group_name(group))


def reduce_scatter(x: torch.Tensor, dim: int = 0, group: GroupLike = None) -> torch.Tensor:
    """This rank's share along dim of the sum of x over the ranks: shard(x.shape[dim], world, rank)
    entries (the first x.shape[dim] % world ranks hold one more)."""
    return _ops_ns.reduce_scatter(x, dim, group_name(group))


def all_to_all(x: torch.Tensor, direction: str = "seq_to_head", group: GroupLike = None, *,
               seq_len: Optional[int] = None) -> torch.Tensor:
    """Ulysses all-to-all: 'seq_to_head' (B, S/W, H, D) -> (B, S, H/W, D), 'head_to_seq' back.
    seq_len: the whole sequence S for seq_to_head when the ranks' shares differ (default W x rows)."""
    return _ops_ns.all_to_all(x, direction, -1 if seq_len is None else seq_len, group_name(group))


def all_gather_matmul(A_shard: torch.Tensor, Bs: Sequence[torch.Tensor], gather_dim: int = 0,
                      group: GroupLike = None, *, return_A: bool = True):
    """(all_gather(A_shard, gather_dim), [that @ B for B in Bs]) with the gather overlapped with the
    first GEMM: torch.ops.symm_mem.fused_all_gather_matmul's arguments and results. bf16; every rank
    holds the same number of rows; B is K x N (weight.t() of an nn.Linear weight is copied into
    K x N at each call for the first B; the others run as plain GEMMs in either layout)."""
    return _ops_ns.all_gather_matmul(A_shard, list(Bs), gather_dim, group_name(group), return_A=return_A)


def matmul_reduce_scatter(A: torch.Tensor, B: torch.Tensor, reduce_op: str = "sum", scatter_dim: int = 0,
                          group: GroupLike = None) -> torch.Tensor:
    """reduce_scatter(A @ B, scatter_dim) with the reduction overlapped with the GEMM:
    torch.ops.symm_mem.fused_matmul_reduce_scatter's arguments. reduce_op 'sum' or 'avg'. bf16."""
    return _ops_ns.matmul_reduce_scatter(A, B, reduce_op, scatter_dim, group_name(group))


def matmul_all_reduce(A: torch.Tensor, B: torch.Tensor, group: GroupLike = None) -> torch.Tensor:
    """all_reduce(A @ B) with the reduction overlapped with the GEMM. bf16."""
    return _ops_ns.matmul_all_reduce(A, B, group_name(group))


def matmul(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """A @ B on one GPU, bf16; B K x N, or weight.t() of an nn.Linear weight (N x K, read in place)."""
    return _ops_ns.matmul(A, B)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
              scale: Optional[float] = None):
    """(o, lse) of softmax(scale q k^T) v on one GPU; q (B, S, Hq, D), k and v (B, S, Hkv, D) (GQA:
    Hq a multiple of Hkv), bf16, D 64 or 128; lse (B, Hq, S) fp32 (natural log); scale default
    1/sqrt(D). Layout (B, S, H, D): SDPA's (B, H, S, D) is q.transpose(1, 2).
    Differentiable (o and lse): an unfused float32 backward (weave.autograd.Attention)."""
    if _ag.needs_grad(q, k, v):
        return _ag.Attention.apply(q, k, v, causal, scale)
    return _ops_ns.attention(q, k, v, causal, scale)


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                   scale: Optional[float] = None, *, sharding: str = "zigzag", seq_len: Optional[int] = None,
                   group: GroupLike = None):
    """(o, lse) of attention over the whole sequence, each rank holding its rows of q, k, v (B, L, H, D)
    in `sharding` order (ring_chunks says which rows). lse (B, Hq, L) fp32.
    Differentiable: all-gathered K, V and an unfused float32 backward (weave.autograd.RingAttention)."""
    args = (q, k, v, causal, scale, sharding, -1 if seq_len is None else seq_len, group_name(group))
    if _ag.needs_grad(q, k, v):
        return _ag.RingAttention.apply(*args)
    return _ops_ns.ring_attention(*args)


def ulysses_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                      scale: Optional[float] = None, *, seq_len: Optional[int] = None,
                      group: GroupLike = None) -> torch.Tensor:
    """o of attention over the whole sequence, each rank holding rows shard(S, world, rank) of q, k, v
    (B, L, H, D); the all-to-alls run inside the kernel. Hq a multiple of the world size.
    Differentiable: all-to-alls and an unfused float32 backward (weave.autograd.UlyssesAttention)."""
    args = (q, k, v, causal, scale, -1 if seq_len is None else seq_len, group_name(group))
    if _ag.needs_grad(q, k, v):
        return _ag.UlyssesAttention.apply(*args)
    return _ops_ns.ulysses_attention(*args)


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
