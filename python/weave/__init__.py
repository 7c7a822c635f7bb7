"""weave: multi-GPU kernels that overlap communication and computation (Hopper), as PyTorch ops.

    import weave
    comm = weave.init()                    # over torch.distributed's default group (or a world of 1)
    y = weave.all_reduce(x)                # torch.ops.weave.all_reduce(x, group_name)
    A, [C] = weave.all_gather_matmul(a_shard, [w.t()])
    fc1 = weave.nn.ColumnParallelLinear(4096, 14336)   # sequence-parallel TP layers, with autograd
    moe = weave.MoeLayer(64, 4096, 1536, 8, 4096)      # expert-parallel MoE: moe(x, idx, w, w_up, w_down)

Details: python/README.md. Importing needs no GPU; operators raise RuntimeError without one."""
try:
    import torch  # noqa: F401
except ImportError as e:  # weave._C links torch's libraries: import torch first, which loads them
    raise ImportError("weave needs PyTorch: install torch (weave works with the one installed)") from e

from ._comm import Communicator, empty, init, is_symmetric
from .functional import (
    all_gather,
    all_gather_matmul,
    all_gather_scaled_matmul,
    all_reduce,
    all_to_all,
    attention,
    check_grouped_mm,
    grouped_mm,
    grouped_mm_status,
    matmul,
    matmul_all_reduce,
    matmul_reduce_scatter,
    reduce_scatter,
    ring_attention,
    ring_chunks,
    scaled_matmul_reduce_scatter,
    scaled_mm,
    shard,
    ulysses_attention,
)
from .tuning import tune  # noqa: E402
from . import autograd, nn  # noqa: E402  (weave.nn.ColumnParallelLinear / RowParallelLinear)
from . import op_grads  # noqa: E402,F401  (the torch.ops.weave.* operators' own gradients)
from .moe import MoeLayer, MoeLowLatency, moe_capacity, moe_worst_case_rows  # noqa: E402  (torch.ops.weave.moe_*)

__version__ = "0.1.0"

__all__ = [
    "Communicator", "init", "empty", "is_symmetric",
    "all_reduce", "all_gather", "reduce_scatter", "all_to_all",
    "all_gather_matmul", "matmul_reduce_scatter", "matmul_all_reduce",
    "all_gather_scaled_matmul", "scaled_matmul_reduce_scatter",
    "matmul", "scaled_mm", "grouped_mm", "grouped_mm_status", "check_grouped_mm",
    "attention", "ring_attention", "ulysses_attention", "ring_chunks", "shard",
    "MoeLayer", "MoeLowLatency", "moe_capacity", "moe_worst_case_rows", "tune",
    "nn", "autograd",
]
