"""Tensor-parallel linear layers with sequence parallelism (Megatron's layout), on weave's fused
kernels. Autograd: weave.autograd (ColumnParallelLinearFn, RowParallelLinearFn).

A transformer MLP over a TP group of W ranks, activations (S, B, H) or (S, H) with the sequence
first and split over the ranks:

    fc1 = weave.nn.ColumnParallelLinear(H, F, group=tp)   # x (S/W, B, H) -> (S, B, F/W): AG+GEMM
    fc2 = weave.nn.RowParallelLinear(F, H, group=tp)      # (S, B, F/W) -> (S/W, B, H): GEMM+RS
    y = fc2(torch.nn.functional.gelu(fc1(x)))

Weights are bf16, in nn.Linear's layout (out x in), each rank holding its shard: rows
`weave.shard(out)` of the full matrix (column) or columns `weave.shard(in)` (row)."""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch import nn

from . import _comm, autograd as _ag
from ._comm import GroupLike, group_name
from ._lib import lib


def _default_device(device) -> torch.device:
    """device, or the current CUDA device (the CPU where there is no GPU: the module then only
    describes shapes; its forward raises)."""
    if device is not None:
        return torch.device(device)
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


class _ParallelLinear(nn.Module):
    """Shared by both layers: the group, the shard of the full (out x in) matrix this rank holds
    along `split` (0: output features, 1: input features), and nn.Linear's initialisation."""

    _split = 0

    def __init__(self, in_features: int, out_features: int, bias: bool, group: GroupLike,
                 dtype: torch.dtype, device):
        super().__init__()
        name = type(self).__name__
        if in_features < 1 or out_features < 1:
            raise ValueError(f"weave.nn.{name}: in_features ({in_features}) and out_features ({out_features}) "
                             "must be positive")
        if dtype != torch.bfloat16:
            raise ValueError(f"weave.nn.{name}: dtype {dtype}: weave's tensor-parallel kernels take torch.bfloat16")
        self.in_features, self.out_features = int(in_features), int(out_features)
        self.group_name = group_name(group)
        self.rank, self.world = _comm.group_rank_world(self.group_name)
        full = (self.out_features, self.in_features)
        self.first, count = lib().shard(full[self._split], self.world, self.rank)
        if count < 1:
            raise ValueError(f"weave.nn.{name}: {full[self._split]} features do not give every one of the "
                             f"{self.world} ranks at least one")
        shape = list(full)
        shape[self._split] = count
        device = _default_device(device)
        self.weight = nn.Parameter(torch.empty(shape, dtype=dtype, device=device))
        # Column: this rank's output features; row: the whole output (added after the reduce-scatter).
        nb = count if self._split == 0 else self.out_features
        self.bias = nn.Parameter(torch.empty(nb, dtype=dtype, device=device)) if bias else None
        self.reset_parameters()

    def _shard_of(self, full_weight: torch.Tensor) -> torch.Tensor:
        return full_weight.narrow(self._split, self.first, self.weight.shape[self._split])

    def _bias_of(self, full_bias: torch.Tensor) -> torch.Tensor:
        return full_bias.narrow(0, self.first, self.bias.shape[0]) if self._split == 0 else full_bias

    def reset_parameters(self, generator: Optional[torch.Generator] = None) -> None:
        """nn.Linear's initialisation of the whole (out x in) matrix, sharded: the full weight and bias
        are drawn on the CPU in float32 exactly as nn.Linear(in_features, out_features) draws them
        (kaiming_uniform_(a=sqrt(5)), then the bias uniform in +-1/sqrt(in_features)) from `generator`
        (default: torch's global CPU generator), and this rank keeps its shard, cast to bf16. With the
        same torch.manual_seed on every rank the shards are those of one matrix, and
        torch.manual_seed(s); nn.Linear(in, out) is the single-GPU reference. Costs a float32 copy of
        the whole matrix on the host while it runs. Does nothing on the meta device."""
        if self.weight.device.type == "meta":
            return
        w = torch.empty(self.out_features, self.in_features)
        nn.init.kaiming_uniform_(w, a=math.sqrt(5), generator=generator)
        with torch.no_grad():
            self.weight.copy_(self._shard_of(w))
            if self.bias is not None:
                bound = 1.0 / math.sqrt(self.in_features)
                b = torch.empty(self.out_features)
                nn.init.uniform_(b, -bound, bound, generator=generator)
                self.bias.copy_(self._bias_of(b))

    @classmethod
    def _sharded(cls, linear: nn.Linear, group: GroupLike, dtype, device, **kwargs):
        """A layer holding this rank's shard of `linear` (an nn.Linear, any dtype and device; every rank
        passes the same weights): the weight (and bias) cast to dtype on `device` (default: linear's)."""
        if not isinstance(linear, nn.Linear):
            raise ValueError(f"weave.nn.{cls.__name__}.from_linear: expected an nn.Linear, got {type(linear).__name__}")
        device = linear.weight.device if device is None else device
        m = cls(linear.in_features, linear.out_features, bias=linear.bias is not None, group=group, dtype=dtype,
                device="meta", **kwargs)
        with torch.no_grad():
            m.weight = nn.Parameter(m._shard_of(linear.weight.detach()).to(device=device, dtype=dtype).contiguous())
            if linear.bias is not None:
                m.bias = nn.Parameter(m._bias_of(linear.bias.detach()).to(device=device, dtype=dtype).contiguous())
        return m

    def _check_input(self, x: torch.Tensor, features: int) -> torch.Tensor:
        if x.dim() < 2 or x.shape[-1] != features:
            why = (f"weave.nn.{type(self).__name__}: input of shape {tuple(x.shape)}; expected (rows, ..., "
                   f"{features}) with this rank's rows along dim 0")
            if x.is_cuda:  # the forward's collective: peers fail with this rank instead of waiting
                _comm.refuse_call(self.group_name, f"nn.{type(self).__name__}", why)
            raise ValueError(why)
        return x.contiguous()

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"rank={self.rank}, world={self.world}, local_weight={tuple(self.weight.shape)}")


class ColumnParallelLinear(_ParallelLinear):
    """y = x W^T + b with the output features split over the group and the input's sequence rows too.

    forward: x (S/W, ..., in_features), this rank's rows (dim 0) -> (S, ..., out_features/W), this
    rank's output features over the whole sequence: weave's all_gather_matmul (AG+GEMM) plus the
    bias. gather_output=True: the output all-gathered along the features, (S, ..., out_features)
    (the backward keeps this rank's columns of the gradient, which must be the same on every rank).
    Every rank holds the same number of rows (all_gather_matmul's rule).

    backward: dX = matmul_reduce_scatter(dY, W) (the fused GEMM+RS), dW = dY^T X_gathered (weave's
    GEMM reading dY^T in place as a K x M operand; torch.matmul where rows, in or out/W is not a
    multiple of 8) and db = sum of dY's rows (torch.sum). save_gathered_input=True (the
    default) keeps the gathered X from the forward until the backward (W times the input's memory,
    S x in_features bf16 per layer, no collective in dW); False keeps only the shard and all-gathers
    it again in the backward (one weave.all_gather; Megatron's choice, the lower activation memory).

    The forward passes weight.t(), which the AG+GEMM kernel reads in place as an N x K B (no copy).
    dtype: bf16 only."""

    _split = 0

    def __init__(self, in_features: int, out_features: int, bias: bool = True, group: GroupLike = None,
                 dtype: torch.dtype = torch.bfloat16, device=None, gather_output: bool = False, *,
                 save_gathered_input: bool = True):
        super().__init__(in_features, out_features, bias, group, dtype, device)
        self.gather_output = gather_output
        self.save_gathered_input = save_gathered_input

    @classmethod
    def from_linear(cls, linear: nn.Linear, group: GroupLike = None, *, gather_output: bool = False,
                    dtype: torch.dtype = torch.bfloat16, device=None, save_gathered_input: bool = True):
        """This rank's shard (rows weave.shard(out_features)) of an existing nn.Linear."""
        return cls._sharded(linear, group, dtype, device, gather_output=gather_output,
                            save_gathered_input=save_gathered_input)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self._check_input(x, self.in_features)
        keep = self.save_gathered_input and _ag.needs_grad(self.weight)
        y = _ag.ColumnParallelLinearFn.apply(x, self.weight, self.bias, self.group_name, keep)
        if self.gather_output:
            y = _ag.GatherLastDim.apply(y, self.out_features, self.group_name)
        return y


class RowParallelLinear(_ParallelLinear):
    """y = x W^T + b with the input features split over the group, the output reduce-scattered along
    the sequence rows.

    forward: x (S, ..., in_features/W), this rank's input features over the whole sequence ->
    (shard(S), ..., out_features), this rank's rows of the sum over ranks: weave's
    matmul_reduce_scatter (GEMM+RS), then the (replicated, whole) bias.

    backward: dX = all_gather_matmul(dY_shard, [W]) (the fused AG+GEMM, also returning the gathered
    dY; where S is not a multiple of W, weave.all_gather then weave.matmul), dW = dY_gathered^T X
    (weave's GEMM reading dY^T in place; torch.matmul where a dimension is not a multiple of 8),
    db = the sum of this rank's rows of dY all-reduced over the group inside the
    backward (weave.all_reduce, float32), so every rank holds the bias's whole gradient (Megatron
    instead all-reduces sequence-parallel parameters' gradients after the backward: do not do both).

    The forward passes weight.t(), which the GEMM+RS kernel reads in place as an N x K B (no copy).
    dtype: bf16 only."""

    _split = 1

    def __init__(self, in_features: int, out_features: int, bias: bool = True, group: GroupLike = None,
                 dtype: torch.dtype = torch.bfloat16, device=None):
        super().__init__(in_features, out_features, bias, group, dtype, device)

    @classmethod
    def from_linear(cls, linear: nn.Linear, group: GroupLike = None, *, dtype: torch.dtype = torch.bfloat16,
                    device=None):
        """This rank's shard (columns weave.shard(in_features)) of an existing nn.Linear."""
        return cls._sharded(linear, group, dtype, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self._check_input(x, int(self.weight.shape[1]))
        return _ag.RowParallelLinearFn.apply(x, self.weight, self.bias, self.group_name)


__all__ = ["ColumnParallelLinear", "RowParallelLinear"]
