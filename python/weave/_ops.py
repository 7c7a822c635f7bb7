"""weave's operators, registered with torch.library in the `weave` namespace (torch.ops.weave.*).

Each operator is `define`d here with a schema and given a CPU kernel (a clear error) and a fake
implementation (register_fake: shapes and dtypes, what torch.compile traces). Its CUDA kernel is
C++ (weave._C, python/src/torch_ops.cpp, registered when the module is imported): the argument
checks, the output allocation and the weave call run without Python, so an eager call costs the
dispatcher and that C++ (docs/perf-notes.md: 17-60 us of host time per call when these were
Python). The argument rules live once, in C++ (python/src/plan.hpp): the CUDA kernels check the
real tensors with them and the fakes here call them through weave._C on the traced shapes, so the
two cannot disagree. Their gradients are registered by op_grads.py (torch.library.register_autograd);
weave.nn's modules and the public attention functions wrap the ops in torch.autograd.Function
(autograd.py). weave's own Python calls go through run() below, which skips the Python autograd
kernel where it would record nothing, and the dispatcher too where it would only route to the CUDA
kernel (weave._C.eager_<op>). The MoE layer's operator (moe.py) is still a Python kernel.

Conventions: tensors must be contiguous (a ValueError says so; no hidden copy), except B operands
given as the transpose of a contiguous N x K matrix (an nn.Linear weight, `weight.t()`), matmul's A
given as the transpose of a contiguous K x M matrix (`dy.t()` of a weight gradient dY^T X), and
grouped_mm's w given as w.transpose(1, 2) of a contiguous E x K x N stack.
all_gather_matmul and matmul_reduce_scatter follow torch.ops.symm_mem.fused_all_gather_matmul /
fused_matmul_reduce_scatter (A.movedim(dim, 0) must be contiguous, outputs moved back)."""
from __future__ import annotations

from typing import Optional

import torch

from . import _comm
from ._lib import lib

_lib = torch.library.Library("weave", "DEF")  # noqa: TOR901

_below_autograd = torch._C._AutoDispatchBelowAutograd
_any_requires_grad = torch._C._any_requires_grad
_is_compiling = torch.compiler.is_compiling
_dispatch_modes = torch._C._len_torch_dispatch_stack
_profiling = torch._C._autograd._profiler_enabled
_PLAIN = (torch.Tensor, torch.nn.Parameter)
# torch.ops.weave.<op>.default -> weave._C.eager_<op> (the same C++ kernel, bound without the
# dispatcher); filled by _bind_eager once the operators are defined.
_EAGER: dict = {}


def _plain(args) -> bool:
    """Whether the dispatcher would only route these arguments to the CUDA kernel: no dispatch mode
    or profiler active, and every tensor (also inside a list) a CUDA tensor of no subclass (an
    nn.Parameter aside)."""
    if _dispatch_modes() or _profiling():
        return False
    for a in args:
        for t in (a if isinstance(a, list) else (a,)):
            if isinstance(t, torch.Tensor) and (type(t) not in _PLAIN or not t.is_cuda):
                return False
    return True


def run(op, *args, **kwargs):
    """op(*args, **kwargs) by the shortest path that keeps its meaning. Where autograd would record
    nothing (grad mode off, or no argument requiring grad: inference, and every call inside an
    autograd.Function or a backward) the op's Python autograd kernel (op_grads.py's
    register_autograd, which runs on every call through the dispatcher, even one it only passes on)
    is skipped: with plain CUDA tensors and nothing else the dispatcher would do (no dispatch mode,
    no profiler), its C++ kernel is called directly (weave._C.eager_<op>); otherwise the op runs
    below autograd. While torch.compile traces, and where autograd records, the op is called as it
    is. Host time per call on the GPU machine: the autograd kernel 3-8 us, the dispatcher's entry
    ~7 us for all_gather_matmul's schema (docs/perf-notes.md, 2026-12-03 seventh session)."""
    if _is_compiling() or (torch.is_grad_enabled() and _any_requires_grad(*args, **kwargs)):
        return op(*args, **kwargs)
    direct = _EAGER.get(op)
    if direct is not None and _plain(args):
        return direct(*args, **kwargs)
    with _below_autograd():
        return op(*args, **kwargs)


# Element types of the collectives (weave::DType numbers); the GEMM, TP and attention kernels take bf16.
_COLL_DTYPES = {torch.bfloat16: 0, torch.float16: 1, torch.float32: 2}


# ---------------------------------------------------------------------------------------------
# What the Python kernel (the MoE layer's) shares; its argument rules are C++ (plan.cpp).


def _fail(op: str, msg: str):
    raise ValueError(f"weave.{op}: {msg}")


def _empty(shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An output tensor of a Python kernel (the caching allocator's, torch's current stream); tests
    poison it (the C++ kernels' outputs: weave._C._set_poison)."""
    return torch.empty(shape, dtype=dtype, device=device)


def _define(schema: str, fake, cuda=None, tags=()) -> None:
    """Defines an operator with its CPU error and fake implementation; `cuda` is its CUDA kernel
    when written in Python (else weave._C registered one)."""
    name = schema.split("(")[0]
    _lib.define(schema, tags=tags)
    if cuda is not None:
        _lib.impl(name, cuda, "CUDA")

    def cpu(*args, **kwargs):
        why = ("no CUDA GPU is available (torch.cuda.is_available() is False)" if not torch.cuda.is_available()
               else "its tensors are on the CPU")
        raise RuntimeError(f"weave.{name}: {why}; weave's operators run on CUDA tensors of Hopper GPUs")

    _lib.impl(name, cpu, "CPU")
    torch.library.register_fake(f"weave::{name}", fake, lib=_lib)


_FIXED_STRIDES = (torch._C.Tag.needs_fixed_stride_order,)

# ---------------------------------------------------------------------------------------------
# Fake implementations: the C++ rules (plan.hpp) on the traced tensors' shapes.


def _spec(t: torch.Tensor):
    """What the C++ rules read of a tensor (sizes as ints: a symbolic size is specialised)."""
    return lib().Spec([int(d) for d in t.shape], [int(s) for s in t.stride()], str(t.dtype), str(t.device))


def _opt_spec(t: Optional[torch.Tensor]):
    return None if t is None else _spec(t)


def _opt_dtype(d: Optional[torch.dtype]) -> Optional[str]:
    return None if d is None else str(d)


def _all_reduce_fake(x, group_name):
    lib().plan_all_reduce(_spec(x))
    return x.new_empty(x.shape)


def _all_gather_fake(x, dim, full_size, group_name):
    out = lib().plan_all_gather(_spec(x), dim, full_size, *_comm.group_rank_world(group_name))[0]
    return x.new_empty(out)


def _reduce_scatter_fake(x, dim, group_name):
    out = lib().plan_reduce_scatter(_spec(x), dim, *_comm.group_rank_world(group_name))[0]
    return x.new_empty(out)


def _all_to_all_fake(x, direction, seq_len, group_name):
    return x.new_empty(lib().plan_all_to_all(_spec(x), direction, seq_len, *_comm.group_rank_world(group_name)))


def _all_gather_matmul_fake(A_shard, Bs, gather_dim, group_name, *, return_A=True):
    _, world = _comm.group_rank_world(group_name)
    gathered, dim = lib().plan_all_gather_matmul(_spec(A_shard), [_spec(B) for B in Bs], gather_dim, world)
    outs = [A_shard.new_empty(gathered[:-1] + [int(B.shape[1])]).movedim(0, dim) for B in Bs]
    return (A_shard.new_empty(gathered).movedim(0, dim) if return_A else None), outs


def _matmul_reduce_scatter_fake(A, B, reduce_op, scatter_dim, group_name):
    out, dim = lib().plan_matmul_reduce_scatter(_spec(A), _spec(B), reduce_op, scatter_dim,
                                                *_comm.group_rank_world(group_name))
    return A.new_empty(out).movedim(0, dim)


def _all_gather_scaled_matmul_fake(A_shard, Bs, A_scale, B_scales, gather_dim, group_name, *, out_dtype=None,
                                   return_A=True):
    _, world = _comm.group_rank_world(group_name)
    gathered, dim = lib().plan_all_gather_scaled_matmul(_spec(A_shard), [_spec(B) for B in Bs], _spec(A_scale),
                                                        [_spec(s) for s in B_scales], gather_dim, world,
                                                        _opt_dtype(out_dtype))
    outs = [A_shard.new_empty(gathered[:-1] + [int(B.shape[1])], dtype=torch.bfloat16).movedim(0, dim) for B in Bs]
    return (A_shard.new_empty(gathered).movedim(0, dim) if return_A else None), outs


def _scaled_matmul_reduce_scatter_fake(A, B, A_scale, B_scale, reduce_op, scatter_dim, group_name, *,
                                       out_dtype=None):
    out, dim = lib().plan_scaled_matmul_reduce_scatter(_spec(A), _spec(B), _spec(A_scale), _spec(B_scale), reduce_op,
                                                       scatter_dim, *_comm.group_rank_world(group_name),
                                                       _opt_dtype(out_dtype))
    return A.new_empty(out, dtype=torch.bfloat16).movedim(0, dim)


def _matmul_all_reduce_fake(A, B, group_name):
    return A.new_empty(lib().plan_matmul_all_reduce(_spec(A), _spec(B)))


def _matmul_fake(A, B, bias=None, out_dtype=None):
    shape, f32 = lib().plan_matmul(_spec(A), _spec(B), _opt_spec(bias), _opt_dtype(out_dtype))
    return A.new_empty(shape, dtype=torch.float32 if f32 else torch.bfloat16)


def _matmul_out_fake(A, B, bias, accumulate, out):
    lib().plan_matmul_out(_spec(A), _spec(B), _opt_spec(bias), _spec(out))


def _scaled_mm_fake(A, B, scale_a, scale_b, out_dtype=None):
    M, N = lib().plan_scaled_mm(_spec(A), _spec(B), _spec(scale_a), _spec(scale_b), _opt_dtype(out_dtype))
    return A.new_empty((M, N), dtype=torch.bfloat16)


def _grouped_mm_fake(x, w, counts, capacity_rows=-1):
    cap, N = lib().plan_grouped_mm(_spec(x), _spec(w), _spec(counts), capacity_rows)
    return x.new_empty((cap, N))


def _attention_fake(q, k, v, causal=False, scale=None):
    B, S, Hq = lib().plan_attention("attention", _spec(q), _spec(k), _spec(v))
    return q.new_empty(q.shape), q.new_empty((B, Hq, S), dtype=torch.float32)


def _ring_attention_fake(q, k, v, causal, scale, sharding, seq_len, group_name):
    B, L, Hq = lib().plan_attention("ring_attention", _spec(q), _spec(k), _spec(v))
    lib().plan_ring_seq(_spec(q), sharding, seq_len, *_comm.group_rank_world(group_name))
    return q.new_empty(q.shape), q.new_empty((B, Hq, L), dtype=torch.float32)


def _ulysses_attention_fake(q, k, v, causal, scale, seq_len, group_name):
    lib().plan_attention("ulysses_attention", _spec(q), _spec(k), _spec(v))
    lib().plan_ulysses_seq(_spec(q), seq_len, *_comm.group_rank_world(group_name))
    return q.new_empty(q.shape)


# ---------------------------------------------------------------------------------------------
# Registration (the CUDA kernels: weave._C).

_define("all_reduce(Tensor x, str group_name) -> Tensor", _all_reduce_fake)
_define("all_gather(Tensor x, int dim, int full_size, str group_name) -> Tensor", _all_gather_fake)
_define("reduce_scatter(Tensor x, int dim, str group_name) -> Tensor", _reduce_scatter_fake)
_define("all_to_all(Tensor x, str direction, int seq_len, str group_name) -> Tensor", _all_to_all_fake)
_define("all_gather_matmul(Tensor A_shard, Tensor[] Bs, int gather_dim, str group_name, *, bool return_A=True)"
        " -> (Tensor?, Tensor[])", _all_gather_matmul_fake, tags=_FIXED_STRIDES)
_define("matmul_reduce_scatter(Tensor A, Tensor B, str reduce_op, int scatter_dim, str group_name) -> Tensor",
        _matmul_reduce_scatter_fake, tags=_FIXED_STRIDES)
_define("matmul_all_reduce(Tensor A, Tensor B, str group_name) -> Tensor", _matmul_all_reduce_fake)
_define("all_gather_scaled_matmul(Tensor A_shard, Tensor[] Bs, Tensor A_scale, Tensor[] B_scales, int gather_dim, "
        "str group_name, *, ScalarType? out_dtype=None, bool return_A=True) -> (Tensor?, Tensor[])",
        _all_gather_scaled_matmul_fake, tags=_FIXED_STRIDES)
_define("scaled_matmul_reduce_scatter(Tensor A, Tensor B, Tensor A_scale, Tensor B_scale, str reduce_op, "
        "int scatter_dim, str group_name, *, ScalarType? out_dtype=None) -> Tensor",
        _scaled_matmul_reduce_scatter_fake, tags=_FIXED_STRIDES)
_define("matmul(Tensor A, Tensor B, Tensor? bias=None, ScalarType? out_dtype=None) -> Tensor", _matmul_fake)
_define("matmul_out(Tensor A, Tensor B, Tensor? bias, bool accumulate, *, Tensor(a!) out) -> ()", _matmul_out_fake)
_define("scaled_mm(Tensor A, Tensor B, Tensor scale_a, Tensor scale_b, ScalarType? out_dtype=None) -> Tensor",
        _scaled_mm_fake)
_define("grouped_mm(Tensor x, Tensor w, Tensor counts, int capacity_rows=-1) -> Tensor", _grouped_mm_fake)
_define("attention(Tensor q, Tensor k, Tensor v, bool causal=False, float? scale=None) -> (Tensor, Tensor)",
        _attention_fake)
_define("ring_attention(Tensor q, Tensor k, Tensor v, bool causal, float? scale, str sharding, int seq_len, "
        "str group_name) -> (Tensor, Tensor)", _ring_attention_fake)
_define("ulysses_attention(Tensor q, Tensor k, Tensor v, bool causal, float? scale, int seq_len, str group_name)"
        " -> Tensor", _ulysses_attention_fake)


def _bind_eager() -> None:
    """Fills _EAGER (run's direct calls) with the C++ kernels weave._C binds (none without it)."""
    from ._lib import lib_available

    if not lib_available():
        return
    for name in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "all_gather_matmul",
                 "matmul_reduce_scatter", "matmul_all_reduce", "all_gather_scaled_matmul",
                 "scaled_matmul_reduce_scatter", "matmul", "scaled_mm", "grouped_mm", "attention",
                 "ring_attention", "ulysses_attention"):
        _EAGER[getattr(torch.ops.weave, name).default] = getattr(lib(), "eager_" + name)


_bind_eager()
