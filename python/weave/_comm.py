"""Communicators over torch.distributed process groups, symmetric tensors, staging buffers."""
from __future__ import annotations

import socket
import threading
import uuid
from typing import Optional, Sequence, Union

import torch
import torch.distributed as dist

from ._lib import lib, lib_available, require_gpu

# The group name of a process without torch.distributed (a world of 1).
SINGLE = "weave.single"

# DLPack (type code, bits) of the dtypes a symmetric tensor may have.
_DLPACK = {
    torch.bfloat16: (4, 16),
    torch.float16: (2, 16),
    torch.float32: (2, 32),
    torch.float64: (2, 64),
    torch.int8: (0, 8),
    torch.int16: (0, 16),
    torch.int32: (0, 32),
    torch.int64: (0, 64),
    torch.uint8: (1, 8),
    torch.bool: (6, 8),
}

GroupLike = Union[None, str, "dist.ProcessGroup", "Communicator"]


class Communicator:
    """weave's communicator over one process group: the symmetric heap every rank of the group maps,
    the kernels' state, and two staging buffers (inputs, outputs) through which ordinary tensors
    reach the kernels that need symmetric memory (kept by the C++ side: python/src/comm.hpp).

    Made by `weave.init`; one per group, cached, and registered under the group's name for the C++
    operator kernels."""

    def __init__(self, group: Optional["dist.ProcessGroup"], name: str, rank: int, world: int, instance: str,
                 device: int, heap_bytes: int, debug: int):
        self.group = group
        self.group_name = name
        self.rank = rank
        self.world = world
        self.device = device
        self._c = lib().Communicator(rank=rank, world=world, job_id="torch", instance=instance, device=device,
                                     heap_bytes=heap_bytes, debug=debug)
        lib()._register_group(name, self._c)

    def __repr__(self) -> str:
        return (f"weave.Communicator(group={self.group_name!r}, rank={self.rank}, world={self.world}, "
                f"device={self.device}, heap={self.heap_used}/{self.heap_bytes} bytes)")

    @property
    def heap_bytes(self) -> int:
        return self._c.heap_bytes

    @property
    def heap_used(self) -> int:
        return self._c.heap_used

    def empty(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        """A new tensor in the symmetric heap (collective: every rank calls it in the same order with
        the same shape and dtype). Its memory goes back to the heap after the tensor dies (at a later
        allocation, once every rank has dropped it)."""
        if torch.cuda.is_current_stream_capturing():
            # A graph's replays would go on writing the memory after the tensor died and the heap
            # gave it to another tensor (torch keeps its own captured allocations in a private
            # pool; the heap has none), and the allocation's host collective cannot be captured.
            raise RuntimeError("weave.empty: called during a CUDA graph capture; make symmetric tensors before "
                               "capturing and keep them alive while the graph is replayed")
        if isinstance(shape, int):
            shape = (shape,)
        shape = tuple(int(d) for d in shape)
        if dtype not in _DLPACK:
            raise ValueError(f"weave.empty: dtype {dtype} is not supported (one of {sorted(map(str, _DLPACK))})")
        code, bits = _DLPACK[dtype]
        return torch.utils.dlpack.from_dlpack(self._c.empty(list(shape), code, bits))

    def is_symmetric(self, t: torch.Tensor) -> bool:
        """Whether every byte `t` spans lies in one live tensor of this communicator's heap."""
        if t.device.type != "cuda" or t.numel() == 0:
            return False
        return self._c.owns(t.data_ptr(), _span_bytes(t))

    def sync(self) -> None:
        """Waits for torch's current stream; device-side errors (a peer's wait timing out, ...) raise here."""
        self._c.sync(torch.cuda.current_stream(self.device).cuda_stream)

    def barrier(self) -> None:
        """Host barrier of the group's ranks (device work not included)."""
        self._c.barrier()


def _span_bytes(t: torch.Tensor) -> int:
    """Bytes from t.data_ptr() to one past its last element."""
    last = sum((d - 1) * s for d, s in zip(t.shape, t.stride()))
    return (last + 1) * t.element_size()


_lock = threading.Lock()
_comms: dict[str, Communicator] = {}
_inits: dict[tuple, int] = {}  # init calls per tuple of global ranks (names the store keys)


def _dist_on() -> bool:
    return dist.is_available() and dist.is_initialized()


def group_name(group: GroupLike = None) -> str:
    """The name operators take for `group`: None is the default group (or, without
    torch.distributed, a world of 1); a ProcessGroup its c10d name; a Communicator its group's."""
    if isinstance(group, Communicator):
        return group.group_name
    if isinstance(group, str):
        return group
    if group is None:
        return dist.group.WORLD.group_name if _dist_on() else SINGLE
    if isinstance(group, int) and group == dist.GroupMember.NON_GROUP_MEMBER:
        raise ValueError("weave: this rank is not a member of the group (torch.distributed.new_group gave it "
                         "GroupMember.NON_GROUP_MEMBER): only the group's ranks call weave on it")
    return group.group_name


def group_rank_world(name: str) -> tuple[int, int]:
    """(rank, world) of a group by name, for shapes (fake implementations need no communicator)."""
    c = _comms.get(name)
    if c is not None:
        return c.rank, c.world
    if name == SINGLE:
        return 0, 1
    if _dist_on():
        import torch.distributed.distributed_c10d as c10d

        g = c10d._resolve_process_group(name)
        return g.rank(), g.size()
    raise RuntimeError(f"weave: unknown process group {name!r} (torch.distributed is not initialised)")


def communicator(group: GroupLike = None) -> Communicator:
    """The group's communicator, made (collectively) at its first use."""
    if isinstance(group, Communicator):
        return group
    name = group_name(group)
    c = _comms.get(name)
    if c is not None:
        return c
    if isinstance(group, str):
        if name == SINGLE:
            return init(None)
        import torch.distributed.distributed_c10d as c10d

        return init(c10d._resolve_process_group(name))
    return init(group)


def init(group: Optional["dist.ProcessGroup"] = None, *, heap_bytes: Optional[int] = None,
         debug: Optional[bool] = None) -> Communicator:
    """weave's communicator over `group` (default: torch.distributed's default group, or a world of 1
    where torch.distributed is not initialised). Collective over the group. Calling it again for the
    same group returns the same communicator.

    heap_bytes: the symmetric heap per rank (default: $WEAVE_HEAP_BYTES, else 1 GiB); it holds
    weave.empty tensors, the staging buffers and the kernels' scratch. debug: check every call's
    arguments with every rank (default: $WEAVE_DEBUG)."""
    require_gpu("weave.init")
    name = group_name(group)
    with _lock:
        c = _comms.get(name)
        if c is not None:
            return c
        device = torch.cuda.current_device()
        if not _dist_on():
            if group is not None:
                raise ValueError("weave.init: a group was given but torch.distributed is not initialised")
            c = Communicator(None, name, 0, 1, uuid.uuid4().hex, device, heap_bytes or 0,
                             -1 if debug is None else int(debug))
        else:
            g = group if group is not None else dist.group.WORLD
            rank, world = dist.get_rank(g), g.size()
            if rank < 0:
                raise ValueError(f"weave.init: this process (global rank {dist.get_rank()}) is not in group {name!r}")
            instance = _agree_instance(g, name, rank, world)
            c = Communicator(g, name, rank, world, instance, device, heap_bytes or 0,
                             -1 if debug is None else int(debug))
        _comms[name] = c
        return c


def _agree_instance(g: "dist.ProcessGroup", name: str, rank: int, world: int) -> str:
    """A bootstrap name unique to this communicator, made by the group's rank 0 and read by the
    others through the group's store; refuses groups spanning several hosts."""
    import torch.distributed.distributed_c10d as c10d

    ranks = tuple(dist.get_process_group_ranks(g))
    n = _inits.get(ranks, 0)
    _inits[ranks] = n + 1
    prefix = f"weave/{'_'.join(map(str, ranks))}/{n}/"
    store = c10d.PrefixStore(prefix, c10d._get_process_group_store(g))
    store.set(f"host{rank}", socket.gethostname())
    hosts = [store.get(f"host{r}").decode() for r in range(world)]
    if len(set(hosts)) > 1:
        raise RuntimeError(
            f"weave.init: group {name!r} spans several hosts ({', '.join(sorted(set(hosts)))}); weave has no "
            "network path yet, every rank of a group must be on one node"
        )
    if rank == 0:
        store.set("instance", uuid.uuid4().hex)
    return store.get("instance").decode()


def refuse_call(name: str, op: str, why: str) -> None:
    """Joins this rank's argument error `why` to the next call's cross-rank agreement on group
    `name`'s communicator (if it has one), so that peers whose arguments passed fail with it
    instead of waiting for this rank; the caller raises its error after."""
    c = _comms.get(name)
    if c is not None:
        c._c.refuse_call(f"weave.{op}", why, torch.cuda.current_stream(c.device).cuda_stream)


def _resolve(name: str) -> None:
    """The C++ operator kernels' call for a group without a registered communicator: makes it, as a
    first operator call on a group always has (collective)."""
    communicator(name)


if lib_available():
    lib()._set_group_resolver(_resolve)


def empty(shape: Sequence[int], dtype: torch.dtype = torch.bfloat16, group: GroupLike = None) -> torch.Tensor:
    """A torch.Tensor in the symmetric heap of `group`'s communicator (collective: every rank calls
    it in the same order with the same shape and dtype). Operators take such tensors without the
    staging copy; the memory is handed back after the tensor dies."""
    return communicator(group).empty(shape, dtype)


def is_symmetric(t: torch.Tensor, group: GroupLike = None) -> bool:
    """Whether `t` lies in the symmetric heap of `group`'s communicator (False if none was made)."""
    c = _comms.get(group_name(group)) if not isinstance(group, Communicator) else group
    return c is not None and c.is_symmetric(t)
