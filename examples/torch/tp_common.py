"""What tp_block.py and bench/torch_ops.py share: starting torch.distributed the way the machine
allows, torch's collectives as functions (NCCL; gloo through host memory where ranks share a GPU),
torch's two tensor-parallel baselines (NCCL + torch.matmul, torch symm_mem's fused ops), SDPA on
the cuDNN / flash backends, and importing weave with a clear message.

Ranks: one GPU per rank (LOCAL_RANK) with the NCCL backend when the node has a GPU for every
local rank; otherwise WEAVE_SHARE_GPUS=1 must be set, rank r uses GPU r % GPUs and the backend is
gloo (NCCL cannot put two ranks on one GPU): results are checked, times mean nothing. NVLink
multicast is never asked for: TORCH_SYMM_MEM_DISABLE_MULTICAST and NCCL_NVLS_ENABLE are left as
the environment has them, and symm_mem's fused ops are always called with return_A=True (its
multicast all-gather path needs return_A=False)."""
from __future__ import annotations

import os
import socket
import sys
import warnings
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F


def fail(prog: str, msg: str, code: int = 2):
    """Ends the program with `msg` on stderr and no traceback."""
    print(f"{prog}: {msg}", file=sys.stderr, flush=True)
    raise SystemExit(code)


DEV = "cuda"


@dataclass
class Setup:
    rank: int
    world: int
    device: int
    backend: str  # "nccl", or "gloo" where ranks share a GPU
    shared: bool  # several ranks on one GPU: times are not meaningful
    group: "dist.ProcessGroup"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(prog: str) -> Setup:
    """torch.distributed up, this rank's GPU current. Without torchrun: a world of one."""
    if not torch.cuda.is_available():
        fail(prog, "no CUDA GPU is available (torch.cuda.is_available() is False); run it on a machine with "
                   "Hopper GPUs under `torchrun --nproc_per_node N`")
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(_free_port()))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"]))
    gpus = torch.cuda.device_count()
    shared = local_world > gpus
    if shared and os.environ.get("WEAVE_SHARE_GPUS") != "1":
        fail(prog, f"{local_world} ranks on this node but {gpus} GPU(s): set WEAVE_SHARE_GPUS=1 to let ranks share "
                   "a GPU (gloo backend; results are checked, times are not meaningful)")
    device = local_rank % gpus
    torch.cuda.set_device(device)
    if shared:
        dist.init_process_group("gloo")
    else:
        dist.init_process_group("nccl", device_id=torch.device("cuda", device))
    return Setup(dist.get_rank(), dist.get_world_size(), device, "gloo" if shared else "nccl", shared,
                 dist.group.WORLD)


def agree(ok: bool) -> bool:
    """Whether `ok` holds on every rank."""
    t = torch.tensor([0.0 if ok else 1.0], device=DEV)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item() == 0.0


def slowest(value: float) -> float:
    """The largest `value` over the ranks."""
    t = torch.tensor([value], dtype=torch.float64, device=DEV)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


class Coll:
    """torch.distributed's collectives along dim 0, each returning a new tensor. With gloo (ranks
    sharing a GPU) the data goes through host memory in float32."""

    def __init__(self, setup: Setup):
        self.world, self.group = setup.world, setup.group
        self.host = setup.backend == "gloo"

    def _call(self, x: torch.Tensor, out_rows: int, op) -> torch.Tensor:
        src = x.detach().float().cpu() if self.host else x.detach().contiguous()
        out = src.new_empty((out_rows,) + tuple(src.shape[1:]))
        op(out, src)
        return out.to(device=x.device, dtype=x.dtype) if self.host else out

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        def op(out, src):
            out.copy_(src)
            dist.all_reduce(out, group=self.group)
        return self._call(x, x.shape[0], op)

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        return self._call(x, x.shape[0] * self.world,
                          lambda out, src: dist.all_gather_into_tensor(out, src, group=self.group))

    def reduce_scatter(self, x: torch.Tensor) -> torch.Tensor:
        return self._call(x, x.shape[0] // self.world,
                          lambda out, src: dist.reduce_scatter_tensor(out, src, group=self.group))

    def all_to_all(self, x: torch.Tensor) -> torch.Tensor:
        return self._call(x, x.shape[0], lambda out, src: dist.all_to_all_single(out, src, group=self.group))


class TorchTP:
    """The unfused baseline: NCCL all-gather then torch.matmul; torch.matmul then NCCL reduce-scatter."""

    name = "torch"

    def __init__(self, coll: Coll):
        self.coll = coll

    def ag_mm(self, a: torch.Tensor, b: torch.Tensor):
        """(all_gather(a) along dim 0, that @ b)."""
        full = self.coll.all_gather(a)
        return full, full @ b

    def mm_rs(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """reduce_scatter(a @ b) along dim 0."""
        return self.coll.reduce_scatter(a @ b)


class SymmMemTP:
    """torch's async TP: torch.ops.symm_mem.fused_all_gather_matmul / fused_matmul_reduce_scatter."""

    name = "asynctp"

    def __init__(self, group: "dist.ProcessGroup"):
        import torch.distributed._symmetric_memory as symm_mem

        self.gname = group.group_name
        with warnings.catch_warnings():  # deprecated (and unneeded) from torch 2.9, still accepted
            warnings.simplefilter("ignore")
            symm_mem.enable_symm_mem_for_group(self.gname)

    def ag_mm(self, a: torch.Tensor, b: torch.Tensor):
        ag, outs = torch.ops.symm_mem.fused_all_gather_matmul(a, [b], 0, self.gname, return_A=True)
        return ag, outs[0]

    def mm_rs(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.ops.symm_mem.fused_matmul_reduce_scatter(a, b, "sum", 0, self.gname)


def symm_mem_tp(setup: Setup):
    """(SymmMemTP, "") when torch's symmetric memory works here (a small probe call on every rank),
    else (None, why not)."""
    why = ""
    try:
        tp = SymmMemTP(setup.group)
        a = torch.ones(64, 256, dtype=torch.bfloat16, device="cuda")
        b = torch.ones(256, 128, dtype=torch.bfloat16, device="cuda")
        ag, y = tp.ag_mm(a, b)
        z = tp.mm_rs(ag, b)
        torch.cuda.synchronize()
        if not (bool((y == 256).all()) and bool((z == 256 * setup.world).all())):
            why = "torch symm_mem's probe call gave a wrong result"
    except Exception as e:  # noqa: BLE001 (any failure means: not usable here)
        why = f"torch symm_mem is not usable here: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    if not agree(not why):
        return None, why or "torch symm_mem failed on another rank"
    return tp, ""


SDPA_BACKENDS = {"cudnn": "CUDNN_ATTENTION", "flash": "FLASH_ATTENTION"}


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, backend: str = "cudnn,flash",
         lower_right: bool = False) -> torch.Tensor:
    """SDPA on (B, S, H, D) tensors (passed to torch as (B, H, S, D) views), returns (B, S, H, D).
    backend: comma-separated names of SDPA_BACKENDS, tried in that order. lower_right: causal with
    the mask aligned to the last key (q holds the last rows of the keys' sequence); that goes through
    torch's CausalBias, which picks flash when it can (backend not applied)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    if k.shape[2] != q.shape[2]:  # GQA: SDPA's enable_gqa is not on every backend
        kt, vt = (x.repeat_interleave(q.shape[2] // k.shape[2], dim=1) for x in (kt, vt))
    if lower_right and causal and q.shape[1] != k.shape[1]:
        from torch.nn.attention.bias import causal_lower_right

        return F.scaled_dot_product_attention(qt, kt, vt, attn_mask=causal_lower_right(q.shape[1], k.shape[1])
                                              ).transpose(1, 2)
    order = [getattr(SDPBackend, SDPA_BACKENDS[b]) for b in backend.split(",")]
    with sdpa_kernel(order, set_priority=True):
        return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal).transpose(1, 2)


def import_weave(prog: str):
    """weave, or the end of the program saying how to install it."""
    try:
        import weave
    except ImportError as e:
        fail(prog, f"weave is not importable ({e}); install it at the root of the weave repository: "
                   "pip install --no-build-isolation .")
    return weave


def init_weave(prog: str, heap_gib: float):
    """weave with its communicator over the default group (heap: WEAVE_HEAP_BYTES when set, else
    heap_gib GiB), or the end of the program saying why not."""
    weave = import_weave(prog)
    heap = None if os.environ.get("WEAVE_HEAP_BYTES") else int(heap_gib * (1 << 30))
    try:
        weave.init(None, heap_bytes=heap)
    except RuntimeError as e:
        fail(prog, f"weave.init failed: {e}")
    return weave
