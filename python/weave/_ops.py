"""weave's operators, registered with torch.library in the `weave` namespace (torch.ops.weave.*).

Each operator is `define`d with a schema and given three kernels: CUDA (the weave call), CPU (a
clear error) and a fake implementation (register_fake: shapes and dtypes, what torch.compile
traces). One `_plan_*` function per operator checks the arguments and returns the output shapes;
the fake and the CUDA kernels both call it, so they cannot disagree. Library.define + impl rather
than torch.library.custom_op: the dispatcher calls the Python kernel directly, without
custom_op's per-call wrapper layers (the issue's overhead budget is 10 us per op). The ops have
no autograd formulas of their own: weave.nn's modules and the public attention functions wrap
them in torch.autograd.Function (autograd.py).

Conventions: tensors must be contiguous (a ValueError says so; no hidden copy), except B operands
given as the transpose of a contiguous N x K matrix (an nn.Linear weight, `weight.t()`), matmul's A
given as the transpose of a contiguous K x M matrix (`dy.t()` of a weight gradient dY^T X), and
grouped_mm's w given as w.transpose(1, 2) of a contiguous E x K x N stack.
all_gather_matmul and matmul_reduce_scatter follow torch.ops.symm_mem.fused_all_gather_matmul /
fused_matmul_reduce_scatter (A.movedim(dim, 0) must be contiguous, outputs moved back)."""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from . import _comm
from ._lib import lib, require_gpu

_lib = torch.library.Library("weave", "DEF")  # noqa: TOR901

# Element types of the collectives (weave::DType numbers); the GEMM, TP and attention kernels take bf16.
_COLL_DTYPES = {torch.bfloat16: 0, torch.float16: 1, torch.float32: 2}


def _fail(op: str, msg: str):
    raise ValueError(f"weave.{op}: {msg}")


def _check_dtype(op: str, name: str, t: torch.Tensor, allowed) -> None:
    if t.dtype not in allowed:
        _fail(op, f"{name} has dtype {t.dtype}; weave takes {', '.join(str(d) for d in allowed)} here")


def _check_contiguous(op: str, name: str, t: torch.Tensor) -> None:
    if not t.is_contiguous():
        _fail(op, f"{name} is not contiguous (shape {tuple(t.shape)}, strides {t.stride()}); "
                  f"pass {name}.contiguous() (one copy)")


def _check_ndim(op: str, name: str, t: torch.Tensor, ndim: int) -> None:
    if t.dim() != ndim:
        _fail(op, f"{name} must have {ndim} dimensions, got shape {tuple(t.shape)}")


def _dim(op: str, dim: int, ndim: int) -> int:
    if not -ndim <= dim < ndim:
        _fail(op, f"dim {dim} is out of range for {ndim} dimensions")
    return dim % ndim


def _shard(n: int, world: int, rank: int) -> int:
    """Rows of n that rank holds (coll::shard: the first n % world ranks get one more)."""
    return lib().shard(int(n), world, rank)[1]


def _moved(op: str, name: str, t: torch.Tensor, dim: int) -> torch.Tensor:
    """t.movedim(dim, 0), which must be contiguous (symm_mem's convention: rows along dim)."""
    m = t.movedim(dim, 0) if dim else t
    if not m.is_contiguous():
        _fail(op, f"{name}.movedim({dim}, 0) is not contiguous (shape {tuple(t.shape)}, strides {t.stride()}); "
                  f"lay {name} out with dim {dim} outermost, e.g. {name}.movedim({dim}, 0).contiguous()"
                  f".movedim(0, {dim}) (one copy)")
    return m


def _moved_back(t: torch.Tensor, dim: int) -> torch.Tensor:
    """t.movedim(0, dim) (t itself for dim 0: a view costs ~2 us)."""
    return t.movedim(0, dim) if dim else t


def _b_layout(op: str, name: str, B: torch.Tensor, K: int) -> bool:
    """Whether B (K x N) is the transpose of a contiguous N x K matrix (True), or contiguous (False)."""
    _check_dtype(op, name, B, (torch.bfloat16,))
    _check_ndim(op, name, B, 2)
    if K < 1 or B.shape[1] < 1:
        _fail(op, f"A has K = {K} columns and {name} N = {B.shape[1]}; both must be positive")
    if B.shape[0] != K:
        _fail(op, f"{name} has {B.shape[0]} rows but A has K = {K} columns")
    if B.is_contiguous():
        return False
    if B.t().is_contiguous():
        return True
    _fail(op, f"{name} is neither contiguous (K x N) nor the transpose of a contiguous N x K matrix "
              f"(strides {B.stride()}); pass {name}.contiguous() (one copy)")


def _rows_split(op: str, d0: int, rest: int, world: int) -> None:
    """The flattened rows (d0 * rest) split over ranks as dim 0 does (weave splits rows)."""
    if rest > 1 and d0 % world:
        _fail(op, f"the split dimension has {d0} entries, not a multiple of the {world} ranks, and the rows "
                  f"it holds are {rest} wide; weave splits flattened rows, so this needs a multiple "
                  "(or a 2-D operand)")


def _empty(shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An output tensor (the caching allocator's, torch's current stream); tests poison it."""
    return torch.empty(shape, dtype=dtype, device=device)


def _kn(B: torch.Tensor, nk: bool) -> torch.Tensor:
    """A K x N row-major B for the TP kernels, which take no other layout: an N x K weight is copied
    (transposed) at every call."""
    return B.contiguous() if nk else B


def _enter(op: str, group_name: str, *tensors: torch.Tensor):
    """The communicator and torch's current stream for a collective call on CUDA tensors. Every
    operator here may be captured in a CUDA graph once an eager call of the same shapes has run (it
    creates the shape's signal sets and scratch, tunes, and sizes the staging buffers)."""
    c = _comm.communicator(group_name)
    for t in tensors:
        if t.get_device() != c.device:
            _fail(op, f"a tensor is on {t.device} but the communicator of group {group_name!r} uses cuda:{c.device}")
    return c, _current_stream(c.device)


_streams: dict = {}


def _current_stream(device: int) -> torch.cuda.Stream:
    """torch.cuda.current_stream(device), one Python object per stream (making one per call costs
    ~2 us)."""
    key = torch._C._cuda_getCurrentStream(device)
    s = _streams.get(key)
    if s is None:
        s = _streams[key] = torch.cuda.Stream(stream_id=key[0], device_index=key[1], device_type=key[2])
    return s


def direct(*tensors: torch.Tensor) -> bool:
    """Whether a call may run its kernel directly rather than through torch.ops.weave, whose
    dispatch cost 1.5-6 us per call (docs/perf-notes.md, sixth session): plain eager mode (nothing
    compiling, tracing, or in a torch function or dispatch mode) on plain CUDA tensors that need no
    gradient. The public functions (weave.functional) take it; the results are the same."""
    if (torch.compiler.is_compiling() or torch._C._get_tracing_state() is not None
            or torch._C._is_torch_function_mode_enabled() or torch._C._len_torch_dispatch_stack()):
        return False
    grad = torch.is_grad_enabled()
    for t in tensors:
        if type(t) is not torch.Tensor or not t.is_cuda or (grad and t.requires_grad) or _functorch_wrapped(t):
            return False
    return True


_functorch_wrapped = getattr(torch._C._functorch, "is_functorch_wrapped_tensor", lambda t: False)


def _define(schema: str, cuda, fake, tags=()) -> None:
    name = schema.split("(")[0]
    _lib.define(schema, tags=tags)
    _lib.impl(name, cuda, "CUDA")

    def cpu(*args, **kwargs):
        why = ("no CUDA GPU is available (torch.cuda.is_available() is False)" if not torch.cuda.is_available()
               else "its tensors are on the CPU")
        raise RuntimeError(f"weave.{name}: {why}; weave's operators run on CUDA tensors of Hopper GPUs")

    _lib.impl(name, cpu, "CPU")
    torch.library.register_fake(f"weave::{name}", fake, lib=_lib)


_FIXED_STRIDES = (torch._C.Tag.needs_fixed_stride_order,)

# ---------------------------------------------------------------------------------------------
# Collectives: bf16, fp16, fp32; inputs and outputs contiguous; sum.


def _check_collective(op: str, x: torch.Tensor, dim: Optional[int] = None) -> Optional[int]:
    """x's dtype and layout; `dim` normalized (None: no dimension)."""
    _check_dtype(op, "x", x, _COLL_DTYPES)
    _check_contiguous(op, "x", x)
    if dim is None:
        return None
    if x.dim() == 0:
        _fail(op, "x is a scalar")
    return _dim(op, dim, x.dim())


def _collective(op: str, x: torch.Tensor, group_name: str, out_shape, launch, local) -> torch.Tensor:
    """A collective's call. launch(c._c, in_ptr, out_ptr, dtype, stream) makes the C++ call.
    local = (key, query): whether the call's algorithm reaches its buffers from this rank only
    (LL, LL128: query(c._c, aligned4) asks the C++, once per key): then x and a new output go to
    the kernel as they are. Else x (itself if symmetric, else staged) in, the output staged, then
    copied out."""
    c, s = _enter(op, group_name, x)
    aligned = x.data_ptr() % 4 == 0
    key = local[0] + (x.dtype, aligned)
    ok = c.local_calls.get(key)
    if ok is None:
        ok = c.local_calls[key] = local[1](c._c, aligned)
    if ok:
        out = _empty(out_shape, x.dtype, x.device)
        launch(c._c, x.data_ptr(), out.data_ptr(), _COLL_DTYPES[x.dtype], s.cuda_stream)
        return out
    src = c.symmetric_input(x, s)
    out = c.staged("out", out_shape, x.dtype, s)
    launch(c._c, src.data_ptr(), out.data_ptr(), _COLL_DTYPES[x.dtype], s.cuda_stream)
    return out.clone()


def _plan_all_reduce(x: torch.Tensor, group_name: str):
    _check_collective("all_reduce", x)
    return tuple(x.shape)


def _all_reduce(x: torch.Tensor, group_name: str) -> torch.Tensor:
    shape = _plan_all_reduce(x, group_name)
    n, t = x.numel(), _COLL_DTYPES[x.dtype]
    return _collective("all_reduce", x, group_name, shape, lambda cc, i, o, t, s: cc.all_reduce(i, o, n, t, s),
                       (("all_reduce", n), lambda cc, aligned: cc.all_reduce_local(n, t, aligned)))


def _collapse(shape: Sequence[int], dim: int) -> tuple[list[int], int]:
    """The C++ shape (at most 3 dims: before, along, after `dim`, sizes of 1 dropped) and its dim."""
    before, after = 1, 1
    for d in shape[:dim]:
        before *= int(d)
    for d in shape[dim + 1:]:
        after *= int(d)
    full = ([before] if before > 1 else []) + [int(shape[dim])] + ([after] if after > 1 else [])
    return full, 1 if before > 1 else 0


def _plan_all_gather(x: torch.Tensor, dim: int, full_size: int, group_name: str):
    op = "all_gather"
    dim = _check_collective(op, x, dim)
    rank, world = _comm.group_rank_world(group_name)
    full = world * x.shape[dim] if full_size < 0 else full_size
    mine = _shard(full, world, rank)
    if mine != x.shape[dim]:
        _fail(op, f"x has {x.shape[dim]} entries along dim {dim}, but rank {rank}'s share of {full} over {world} "
                  f"ranks is {mine}")
    shape = list(x.shape)
    shape[dim] = full
    return tuple(shape), dim


def _all_gather(x: torch.Tensor, dim: int, full_size: int, group_name: str) -> torch.Tensor:
    shape, dim = _plan_all_gather(x, dim, full_size, group_name)
    full, cdim = _collapse(shape, dim)
    t = _COLL_DTYPES[x.dtype]
    return _collective("all_gather", x, group_name, shape, lambda cc, i, o, t, s: cc.all_gather(i, o, full, cdim, t, s),
                       (("all_gather", tuple(full), cdim),
                        lambda cc, aligned: cc.shard_local(True, full, cdim, t, aligned)))


def _plan_reduce_scatter(x: torch.Tensor, dim: int, group_name: str):
    dim = _check_collective("reduce_scatter", x, dim)
    rank, world = _comm.group_rank_world(group_name)
    shape = list(x.shape)
    shape[dim] = _shard(x.shape[dim], world, rank)
    return tuple(shape), dim


def _reduce_scatter(x: torch.Tensor, dim: int, group_name: str) -> torch.Tensor:
    shape, dim = _plan_reduce_scatter(x, dim, group_name)
    full, cdim = _collapse(x.shape, dim)
    t = _COLL_DTYPES[x.dtype]
    return _collective("reduce_scatter", x, group_name, shape,
                       lambda cc, i, o, t, s: cc.reduce_scatter(i, o, full, cdim, t, s),
                       (("reduce_scatter", tuple(full), cdim),
                        lambda cc, aligned: cc.shard_local(False, full, cdim, t, aligned)))


def _plan_all_to_all(x: torch.Tensor, direction: str, seq_len: int, group_name: str):
    op = "all_to_all"
    _check_collective(op, x)
    _check_ndim(op, "x", x, 4)
    if direction not in ("seq_to_head", "head_to_seq"):
        _fail(op, f"direction must be 'seq_to_head' or 'head_to_seq', got {direction!r}")
    rank, world = _comm.group_rank_world(group_name)
    B, L, H, D = (int(d) for d in x.shape)
    if direction == "seq_to_head":  # (B, S/W, H, D) -> (B, S, H/W, D)
        S = world * L if seq_len < 0 else seq_len
        if _shard(S, world, rank) != L:
            _fail(op, f"x holds {L} sequence rows, but rank {rank}'s share of {S} over {world} ranks is "
                      f"{_shard(S, world, rank)} (pass seq_len)")
        if H % world:
            _fail(op, f"{H} heads do not divide among {world} ranks")
        return (B, S, H // world, D), S, H
    if seq_len >= 0 and seq_len != L:
        _fail(op, f"head_to_seq: x holds the whole sequence ({L} rows) but seq_len = {seq_len}")
    return (B, _shard(L, world, rank), H * world, D), L, H * world


def _all_to_all(x: torch.Tensor, direction: str, seq_len: int, group_name: str) -> torch.Tensor:
    shape, S, H = _plan_all_to_all(x, direction, seq_len, group_name)
    B, D = int(x.shape[0]), int(x.shape[3])
    return _collective("all_to_all", x, group_name, shape,
                       lambda cc, i, o, t, s: cc.all_to_all(i, o, B, S, H, D, t, direction == "seq_to_head", s),
                       (("all_to_all",), lambda cc, aligned: False))


# ---------------------------------------------------------------------------------------------
# Tensor parallel (bf16).


def _plan_all_gather_matmul(A_shard: torch.Tensor, Bs: Sequence[torch.Tensor], gather_dim: int, group_name: str):
    op = "all_gather_matmul"
    _check_dtype(op, "A_shard", A_shard, (torch.bfloat16,))
    if A_shard.dim() < 2:
        _fail(op, f"A_shard must have at least 2 dimensions, got shape {tuple(A_shard.shape)}")
    if not Bs:
        _fail(op, "Bs is empty")
    gather_dim = _dim(op, gather_dim, A_shard.dim())
    if gather_dim == A_shard.dim() - 1:
        _fail(op, "gathering along the last (K) dimension is not supported; weave gathers rows")
    moved = _moved(op, "A_shard", A_shard, gather_dim)
    K = int(A_shard.shape[-1])
    nks = [_b_layout(op, f"Bs[{i}]", B, K) for i, B in enumerate(Bs)]
    _, world = _comm.group_rank_world(group_name)
    gathered = [world * int(moved.shape[0])] + [int(d) for d in moved.shape[1:]]  # moved layout
    return gathered, gather_dim, nks


def _all_gather_matmul_fake(A_shard, Bs, gather_dim, group_name, *, return_A=True):
    gathered, dim, _ = _plan_all_gather_matmul(A_shard, Bs, gather_dim, group_name)
    outs = [A_shard.new_empty(gathered[:-1] + [int(B.shape[1])]).movedim(0, dim) for B in Bs]
    return (A_shard.new_empty(gathered).movedim(0, dim) if return_A else None), outs


def _all_gather_matmul(A_shard, Bs, gather_dim, group_name, *, return_A=True):
    gathered, dim, nks = _plan_all_gather_matmul(A_shard, Bs, gather_dim, group_name)
    c, s = _enter("all_gather_matmul", group_name, A_shard, *Bs)
    K = gathered[-1]
    M = A_shard.numel() // K * c.world
    a_gathered = c.staged("out", gathered, A_shard.dtype, s)
    outs = [_empty(gathered[:-1] + [int(B.shape[1])], A_shard.dtype, A_shard.device) for B in Bs]
    B0 = _kn(Bs[0], nks[0])
    c._c.ag_gemm(A_shard.data_ptr(), a_gathered.data_ptr(), B0.data_ptr(), outs[0].data_ptr(), M,
                 int(B0.shape[1]), K, s.cuda_stream)
    for B, nk, out in zip(Bs[1:], nks[1:], outs[1:]):  # the gathered A is there: plain GEMMs
        lib().gemm(c.device, a_gathered.data_ptr(), B.data_ptr(), out.data_ptr(), M, int(B.shape[1]), K, nk,
                   s.cuda_stream)
    A = _moved_back(a_gathered.clone(), dim) if return_A else None
    return A, [_moved_back(o, dim) for o in outs]


def _plan_matmul_reduce_scatter(A, B, reduce_op, scatter_dim, group_name):
    op = "matmul_reduce_scatter"
    _check_dtype(op, "A", A, (torch.bfloat16,))
    if A.dim() < 2:
        _fail(op, f"A must have at least 2 dimensions, got shape {tuple(A.shape)}")
    if reduce_op not in ("sum", "avg"):
        _fail(op, f"reduce_op must be 'sum' or 'avg', got {reduce_op!r}")
    scatter_dim = _dim(op, scatter_dim, A.dim())
    if scatter_dim == A.dim() - 1:
        _fail(op, "scattering along the last dimension is not supported; weave scatters rows")
    moved = _moved(op, "A", A, scatter_dim)
    K = int(A.shape[-1])
    nk = _b_layout(op, "B", B, K)
    rank, world = _comm.group_rank_world(group_name)
    d0 = int(moved.shape[0])
    rest = moved.numel() // max(d0 * K, 1)
    _rows_split(op, d0, rest, world)
    out = [_shard(d0, world, rank)] + [int(d) for d in moved.shape[1:-1]] + [int(B.shape[1])]  # moved layout
    return out, scatter_dim, nk, world


def _matmul_reduce_scatter_fake(A, B, reduce_op, scatter_dim, group_name):
    out, dim, _, _ = _plan_matmul_reduce_scatter(A, B, reduce_op, scatter_dim, group_name)
    return A.new_empty(out).movedim(0, dim)


def _matmul_reduce_scatter(A, B, reduce_op, scatter_dim, group_name):
    out_shape, dim, nk, world = _plan_matmul_reduce_scatter(A, B, reduce_op, scatter_dim, group_name)
    c, s = _enter("matmul_reduce_scatter", group_name, A, B)
    K, N = int(A.shape[-1]), int(B.shape[1])
    M = A.numel() // K
    stage = c.staged("out", [lib().gemm_rs_out_elems(M, N, world)], A.dtype, s)
    Bkn = _kn(B, nk)
    c._c.gemm_rs(A.data_ptr(), Bkn.data_ptr(), stage.data_ptr(), M, N, K, s.cuda_stream)
    rows = 1
    for d in out_shape[:-1]:
        rows *= d
    out = stage[: rows * N].view(out_shape).clone()
    if reduce_op == "avg":
        out.div_(world)
    return _moved_back(out, dim)


def _plan_matmul_all_reduce(A, B, group_name):
    op = "matmul_all_reduce"
    _check_dtype(op, "A", A, (torch.bfloat16,))
    _check_contiguous(op, "A", A)
    if A.dim() < 1:
        _fail(op, "A is a scalar")
    nk = _b_layout(op, "B", B, int(A.shape[-1]))
    return list(A.shape[:-1]) + [int(B.shape[1])], nk


def _matmul_all_reduce_fake(A, B, group_name):
    shape, _ = _plan_matmul_all_reduce(A, B, group_name)
    return A.new_empty(shape)


def _matmul_all_reduce(A, B, group_name):
    shape, nk = _plan_matmul_all_reduce(A, B, group_name)
    c, s = _enter("matmul_all_reduce", group_name, A, B)
    K, N = int(A.shape[-1]), int(B.shape[1])
    out = c.staged("out", shape, A.dtype, s)
    Bkn = _kn(B, nk)
    c._c.gemm_ar(A.data_ptr(), Bkn.data_ptr(), out.data_ptr(), A.numel() // K, N, K, s.cuda_stream)
    return out.clone()


# ---------------------------------------------------------------------------------------------
# Single GPU: the bf16 GEMM (gemm::gemm), the fp8 GEMMs (gemm_fp8), the MoE grouped GEMM (moe).

_FP8 = {torch.float8_e4m3fn: 0, torch.float8_e5m2: 1}  # gemm_fp8::Fp8
_BIAS_TYPES = {torch.bfloat16: 1, torch.float32: 2}  # gemm::BiasType


def _check_device(op: str, ref: torch.Tensor, **tensors: Optional[torch.Tensor]) -> None:
    """Every given tensor on ref's device (the kernels read them all there; a host scale or count would
    be read through a host pointer on the device)."""
    for name, t in tensors.items():
        if t is not None and t.device != ref.device:
            _fail(op, f"{name} is on {t.device} but the other operands are on {ref.device}")


def _a_layout(op: str, A: torch.Tensor) -> bool:
    """Whether A (M x K) is the transpose of a contiguous K x M matrix (True), or contiguous (False).
    Contiguous wins where both hold (a single row or column): the layouts then read the same bytes."""
    if A.is_contiguous():
        return False
    if A.dim() == 2 and A.t().is_contiguous():
        return True
    _fail(op, f"A is neither contiguous (M x K) nor the transpose of a contiguous K x M matrix (shape "
              f"{tuple(A.shape)}, strides {A.stride()}); pass A.contiguous() (one copy)")


def _plan_matmul(A, B, bias=None, out_dtype=None, op="matmul"):
    """(output shape, A is K x M, B is N x K, bias type, fp32 output)."""
    _check_dtype(op, "A", A, (torch.bfloat16,))
    if A.dim() < 1:
        _fail(op, "A is a scalar")
    km = _a_layout(op, A)
    nk = _b_layout(op, "B", B, int(A.shape[-1]))
    N = int(B.shape[1])
    if km and int(A.shape[0]) % 8:
        # gemm::ALayout::KM: A's rows in memory are M long and TMA needs 16-byte row pitches.
        _fail(op, f"A given as the transpose of a contiguous K x M matrix needs M % 8 == 0, got M = {A.shape[0]}; "
                  "pass A.contiguous() (one copy)")
    if bias is not None:
        _check_dtype(op, "bias", bias, tuple(_BIAS_TYPES))
        if bias.dim() != 1 or int(bias.shape[0]) != N:
            _fail(op, f"bias must hold N = {N} values (shape ({N},)), got shape {tuple(bias.shape)}")
        _check_contiguous(op, "bias", bias)
    if out_dtype not in (None, torch.bfloat16, torch.float32):
        _fail(op, f"out_dtype {out_dtype}: weave's GEMM writes torch.bfloat16 or torch.float32")
    _check_device(op, A, B=B, bias=bias)
    shape = list(A.shape[:-1]) + [N]
    return shape, km, nk, (0 if bias is None else _BIAS_TYPES[bias.dtype]), out_dtype == torch.float32


def _gemm_call(A, B, bias, C, km, nk, bias_type, f32, accumulate):
    K, N = int(A.shape[-1]), int(B.shape[1])
    lib().gemm(A.device.index, A.data_ptr(), B.data_ptr(), C.data_ptr(), A.numel() // K, N, K, nk,
               torch.cuda.current_stream(A.device).cuda_stream, a_km=km,
               bias=0 if bias is None else bias.data_ptr(), bias_type=bias_type, out_f32=f32, accumulate=accumulate)


def _matmul_fake(A, B, bias=None, out_dtype=None):
    shape, _, _, _, f32 = _plan_matmul(A, B, bias, out_dtype)
    return A.new_empty(shape, dtype=torch.float32 if f32 else torch.bfloat16)


def _matmul(A, B, bias=None, out_dtype=None):
    shape, km, nk, bt, f32 = _plan_matmul(A, B, bias, out_dtype)
    require_gpu("weave.matmul")
    out = _empty(shape, torch.float32 if f32 else torch.bfloat16, A.device)
    if out.numel() == 0:
        return out
    _gemm_call(A, B, bias, out, km, nk, bt, f32, False)
    return out


def _plan_matmul_out(A, B, bias, accumulate, out):
    op = "matmul_out"
    _check_dtype(op, "out", out, (torch.bfloat16, torch.float32))
    shape, km, nk, bt, _ = _plan_matmul(A, B, bias, out.dtype, op)
    if list(out.shape) != shape:
        _fail(op, f"out has shape {tuple(out.shape)}, A @ B has {tuple(shape)}")
    _check_contiguous(op, "out", out)
    _check_device(op, A, out=out)
    return km, nk, bt, out.dtype == torch.float32


def _matmul_out_fake(A, B, bias, accumulate, out):
    _plan_matmul_out(A, B, bias, accumulate, out)


def _matmul_out(A, B, bias, accumulate, out):
    km, nk, bt, f32 = _plan_matmul_out(A, B, bias, accumulate, out)
    require_gpu("weave.matmul")
    if out.numel() == 0:
        return
    _gemm_call(A, B, bias, out, km, nk, bt, f32, accumulate)


def _check_scale(op: str, name: str, s: torch.Tensor, shape: Optional[tuple]) -> None:
    """An fp32 scale tensor: one value (shape None) or exactly `shape`, contiguous."""
    _check_dtype(op, name, s, (torch.float32,))
    if shape is None:
        if s.numel() != 1 or s.dim() > 1:
            _fail(op, f"{name} must be one fp32 value (shape () or (1,)) for per-tensor scaling, got shape "
                      f"{tuple(s.shape)}")
    elif tuple(s.shape) != shape:
        _fail(op, f"{name} has shape {tuple(s.shape)}; block scaling needs {shape} (gemm_fp8.hpp's layout)")
    _check_contiguous(op, name, s)


def _plan_scaled_mm(A, B, scale_a, scale_b, out_dtype=None):
    """(M, N, K, block scaled) of the fp8 GEMM; every rule gemm_fp8 checks, as ValueErrors."""
    op = "scaled_mm"
    for name, t in (("A", A), ("B", B)):
        if t.dtype not in _FP8:
            _fail(op, f"{name} has dtype {t.dtype}; weave's fp8 GEMM takes torch.float8_e4m3fn or "
                      "torch.float8_e5m2")
        _check_ndim(op, name, t, 2)
    if A.dtype == torch.float8_e5m2 and B.dtype == torch.float8_e5m2:
        _fail(op, "A and B are both float8_e5m2; the supported pairs are e4m3 x e4m3, e5m2 x e4m3 and e4m3 x e5m2")
    _check_contiguous(op, "A", A)
    M, K = int(A.shape[0]), int(A.shape[1])
    if int(B.shape[0]) != K:
        _fail(op, f"B has {B.shape[0]} rows but A has K = {K} columns")
    N = int(B.shape[1])
    if not B.t().is_contiguous():
        _fail(op, f"B (K x N) must be the transpose of a contiguous N x K matrix (column-major, like "
                  f"torch._scaled_mm's mat2: pass w.t() of an N x K w), got strides {B.stride()}")
    if K < 16 or K % 16:
        _fail(op, f"K = {K} must be a positive multiple of 16 (16-byte rows of fp8)")
    if N < 8 or N % 8:
        _fail(op, f"N = {N} must be a positive multiple of 8 (16-byte rows of the bf16 output)")
    if out_dtype not in (None, torch.bfloat16):
        _fail(op, f"out_dtype {out_dtype}: weave's fp8 GEMM writes torch.bfloat16 only")
    block = scale_a.dim() == 2 or scale_b.dim() == 2
    if block:
        kb = (K + 127) // 128
        _check_scale(op, "scale_a", scale_a, (kb, M))
        _check_scale(op, "scale_b", scale_b, ((N + 127) // 128, kb))
    else:
        _check_scale(op, "scale_a", scale_a, None)
        _check_scale(op, "scale_b", scale_b, None)
    _check_device(op, A, B=B, scale_a=scale_a, scale_b=scale_b)
    return M, N, K, block


def _scaled_mm_fake(A, B, scale_a, scale_b, out_dtype=None):
    M, N, _, _ = _plan_scaled_mm(A, B, scale_a, scale_b, out_dtype)
    return A.new_empty((M, N), dtype=torch.bfloat16)


def _scaled_mm(A, B, scale_a, scale_b, out_dtype=None):
    M, N, K, block = _plan_scaled_mm(A, B, scale_a, scale_b, out_dtype)
    require_gpu("weave.scaled_mm")
    out = _empty((M, N), torch.bfloat16, A.device)
    if M == 0:
        return out
    lib().gemm_fp8(A.device.index, A.data_ptr(), _FP8[A.dtype], B.data_ptr(), _FP8[B.dtype], out.data_ptr(), M, N,
                   K, scale_a.data_ptr(), scale_b.data_ptr(), block, torch.cuda.current_stream(A.device).cuda_stream)
    return out


def _plan_grouped_mm(x, w, counts, capacity_rows=-1):
    """(R_cap, E, N, K, w stored E x K x N) of the grouped GEMM; grouped_gemm's argument rules as
    ValueErrors (the counts themselves are only read on the device)."""
    op = "grouped_mm"
    _check_dtype(op, "x", x, (torch.bfloat16,))
    _check_dtype(op, "w", w, (torch.bfloat16,))
    _check_ndim(op, "x", x, 2)
    _check_ndim(op, "w", w, 3)
    _check_contiguous(op, "x", x)
    E, N, K = (int(d) for d in w.shape)
    if int(x.shape[1]) != K:
        _fail(op, f"x has K = {x.shape[1]} columns but w is E x N x K = {tuple(w.shape)}")
    if w.is_contiguous():
        kn = False
    elif w.transpose(1, 2).is_contiguous():
        kn = True
    else:
        _fail(op, f"w (E x N x K) is neither contiguous nor w.transpose(1, 2) of a contiguous E x K x N stack "
                  f"(strides {w.stride()}); pass w.contiguous() (one copy)")
    if not 1 <= E <= 1024:
        _fail(op, f"E = {E} experts; the grouped GEMM takes 1 to 1024")
    for name, v in (("N", N), ("K", K)):
        if v < 8 or v % 8:
            _fail(op, f"{name} = {v} must be a positive multiple of 8 (16-byte rows)")
    if counts.dtype != torch.int32:
        _fail(op, f"counts has dtype {counts.dtype}; the grouped GEMM takes torch.int32")
    if counts.dim() != 1 or int(counts.shape[0]) != E:
        _fail(op, f"counts must hold E = {E} values (shape ({E},)), got shape {tuple(counts.shape)}")
    _check_contiguous(op, "counts", counts)
    rows = int(x.shape[0])
    cap = rows if capacity_rows < 0 else int(capacity_rows)
    if not 1 <= cap <= rows:
        _fail(op, f"capacity_rows = {cap} must be in 1..{rows} (x's rows)")
    _check_device(op, x, w=w, counts=counts)
    return cap, E, N, K, kn


def _grouped_mm_fake(x, w, counts, capacity_rows=-1):
    cap, _, N, _, _ = _plan_grouped_mm(x, w, counts, capacity_rows)
    return x.new_empty((cap, N))


def _grouped_mm(x, w, counts, capacity_rows=-1):
    cap, E, N, K, kn = _plan_grouped_mm(x, w, counts, capacity_rows)
    require_gpu("weave.grouped_mm")
    out = _empty((cap, N), torch.bfloat16, x.device)
    lib().grouped_gemm(x.device.index, x.data_ptr(), w.data_ptr(), out.data_ptr(), counts.data_ptr(), E, N, K, cap,
                       kn, torch.cuda.current_stream(x.device).cuda_stream)
    return out


def _plan_attention(op: str, q, k, v):
    """(B, L, Hq, Hkv, D) of q (B, L, Hq, D), k and v (B, L, Hkv, D): bf16, contiguous."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_dtype(op, name, t, (torch.bfloat16,))
        _check_contiguous(op, name, t)
        _check_ndim(op, name, t, 4)
    B, L, Hq, D = (int(d) for d in q.shape)
    if k.shape != v.shape:
        _fail(op, f"k {tuple(k.shape)} and v {tuple(v.shape)} differ")
    if k.shape[0] != B or k.shape[1] != L or k.shape[3] != D:
        _fail(op, f"q {tuple(q.shape)} and k {tuple(k.shape)} differ in batch, sequence or head dim "
                  "(layout (B, S, H, D))")
    Hkv = int(k.shape[2])
    if D not in (64, 128):
        _fail(op, f"head dim {D} is not 64 or 128")
    if Hq % Hkv:
        _fail(op, f"{Hq} query heads are not a multiple of {Hkv} key/value heads")
    return B, L, Hq, Hkv, D


def _scale(scale: Optional[float]) -> float:
    return 0.0 if scale is None else float(scale)  # 0: 1/sqrt(D)


def _attention_fake(q, k, v, causal=False, scale=None):
    B, S, Hq, _, _ = _plan_attention("attention", q, k, v)
    return q.new_empty(q.shape), q.new_empty((B, Hq, S), dtype=torch.float32)


def _attention(q, k, v, causal=False, scale=None):
    B, S, Hq, Hkv, D = _plan_attention("attention", q, k, v)
    require_gpu("weave.attention")
    o = _empty(q.shape, q.dtype, q.device)
    lse = _empty((B, Hq, S), torch.float32, q.device)
    lib().attention(q.device.index, q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr(), B, S,
                    Hq, Hkv, D, causal, _scale(scale), torch.cuda.current_stream(q.device).cuda_stream)
    return o, lse


# ---------------------------------------------------------------------------------------------
# Sequence parallel (bf16): each rank holds its rows of q, k, v.


def _ring_seq(q, sharding: str, seq_len: int, group_name: str) -> int:
    op = "ring_attention"
    if sharding not in ("zigzag", "contiguous"):
        _fail(op, f"sharding must be 'zigzag' or 'contiguous', got {sharding!r}")
    rank, world = _comm.group_rank_world(group_name)
    L = int(q.shape[1])
    S = world * L if seq_len < 0 else seq_len
    mine = lib().ring_local_rows(S, world, sharding == "zigzag", rank)
    if mine != L:
        _fail(op, f"q holds {L} sequence rows, but rank {rank} holds {mine} of {S} with {sharding} sharding over "
                  f"{world} ranks (pass seq_len)")
    return S


def _ring_attention_fake(q, k, v, causal, scale, sharding, seq_len, group_name):
    B, L, Hq, _, _ = _plan_attention("ring_attention", q, k, v)
    _ring_seq(q, sharding, seq_len, group_name)
    return q.new_empty(q.shape), q.new_empty((B, Hq, L), dtype=torch.float32)


def _ring_attention(q, k, v, causal, scale, sharding, seq_len, group_name):
    B, L, Hq, Hkv, D = _plan_attention("ring_attention", q, k, v)
    S = _ring_seq(q, sharding, seq_len, group_name)
    c, s = _enter("ring_attention", group_name, q, k, v)
    o = _empty(q.shape, q.dtype, q.device)
    lse = _empty((B, Hq, L), torch.float32, q.device)
    c._c.ring_attention(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr(), B, S, Hq, Hkv, D,
                        causal, _scale(scale), sharding == "zigzag", s.cuda_stream)
    return o, lse


def _ulysses_seq(q, seq_len: int, group_name: str) -> int:
    rank, world = _comm.group_rank_world(group_name)
    L = int(q.shape[1])
    S = world * L if seq_len < 0 else seq_len
    mine = lib().ulysses_rows(S, world, rank)[1]
    if mine != L:
        _fail("ulysses_attention", f"q holds {L} sequence rows, but rank {rank}'s share of {S} over {world} ranks "
                                   f"is {mine} (pass seq_len)")
    if int(q.shape[2]) % world:
        _fail("ulysses_attention", f"{q.shape[2]} query heads do not divide among {world} ranks")
    return S


def _ulysses_attention_fake(q, k, v, causal, scale, seq_len, group_name):
    _plan_attention("ulysses_attention", q, k, v)
    _ulysses_seq(q, seq_len, group_name)
    return q.new_empty(q.shape)


def _ulysses_attention(q, k, v, causal, scale, seq_len, group_name):
    B, L, Hq, Hkv, D = _plan_attention("ulysses_attention", q, k, v)
    S = _ulysses_seq(q, seq_len, group_name)
    c, s = _enter("ulysses_attention", group_name, q, k, v)
    stage = c.staged("out", [lib().ulysses_out_elems(B, S, Hq, D, c.world)], q.dtype, s)
    c._c.ulysses_attention(q.data_ptr(), k.data_ptr(), v.data_ptr(), stage.data_ptr(), B, S, Hq, Hkv, D, causal,
                           _scale(scale), s.cuda_stream)
    return stage[: q.numel()].view(q.shape).clone()


# ---------------------------------------------------------------------------------------------
# Registration.


def _fake_of(plan, index=None):
    """A fake implementation returning one tensor shaped like plan(...)'s result (or its [index])."""

    def fake(x, *args):
        r = plan(x, *args)
        return x.new_empty(r if index is None else r[index])

    return fake


_define("all_reduce(Tensor x, str group_name) -> Tensor", _all_reduce, _fake_of(_plan_all_reduce))
_define("all_gather(Tensor x, int dim, int full_size, str group_name) -> Tensor", _all_gather,
        _fake_of(_plan_all_gather, 0))
_define("reduce_scatter(Tensor x, int dim, str group_name) -> Tensor", _reduce_scatter,
        _fake_of(_plan_reduce_scatter, 0))
_define("all_to_all(Tensor x, str direction, int seq_len, str group_name) -> Tensor", _all_to_all,
        _fake_of(_plan_all_to_all, 0))
_define("all_gather_matmul(Tensor A_shard, Tensor[] Bs, int gather_dim, str group_name, *, bool return_A=True)"
        " -> (Tensor?, Tensor[])", _all_gather_matmul, _all_gather_matmul_fake, _FIXED_STRIDES)
_define("matmul_reduce_scatter(Tensor A, Tensor B, str reduce_op, int scatter_dim, str group_name) -> Tensor",
        _matmul_reduce_scatter, _matmul_reduce_scatter_fake, _FIXED_STRIDES)
_define("matmul_all_reduce(Tensor A, Tensor B, str group_name) -> Tensor", _matmul_all_reduce,
        _matmul_all_reduce_fake)
_define("matmul(Tensor A, Tensor B, Tensor? bias=None, ScalarType? out_dtype=None) -> Tensor", _matmul, _matmul_fake)
_define("matmul_out(Tensor A, Tensor B, Tensor? bias, bool accumulate, *, Tensor(a!) out) -> ()", _matmul_out,
        _matmul_out_fake)
_define("scaled_mm(Tensor A, Tensor B, Tensor scale_a, Tensor scale_b, ScalarType? out_dtype=None) -> Tensor",
        _scaled_mm, _scaled_mm_fake)
_define("grouped_mm(Tensor x, Tensor w, Tensor counts, int capacity_rows=-1) -> Tensor", _grouped_mm,
        _grouped_mm_fake)
_define("attention(Tensor q, Tensor k, Tensor v, bool causal=False, float? scale=None) -> (Tensor, Tensor)",
        _attention, _attention_fake)
_define("ring_attention(Tensor q, Tensor k, Tensor v, bool causal, float? scale, str sharding, int seq_len, "
        "str group_name) -> (Tensor, Tensor)", _ring_attention, _ring_attention_fake)
_define("ulysses_attention(Tensor q, Tensor k, Tensor v, bool causal, float? scale, int seq_len, str group_name)"
        " -> Tensor", _ulysses_attention, _ulysses_attention_fake)
