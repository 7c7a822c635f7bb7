"""Expert-parallel MoE (kernels/moe): `weave.MoeLayer`, the receive-capacity helpers, and
`weave.MoeLowLatency` (the low-latency decode mode, at the end of this file).

A MoeLayer owns one layer shape's C++ state on a group's communicator: the exchange
(moe::MoeExchange: the symmetric grouped buffer its dispatch fills, the count matrix, signals),
the layer's scratch (moe::MoeLayerScratch) and, fused, the gemm_combine (moe::MoeGemmCombine: the
landing buffer). Made collectively; every call is collective over the group; everything runs on
torch's current stream with no host synchronisation, except check().

    layer = weave.MoeLayer(num_experts=64, hidden=4096, ffn=1536, topk=8, max_tokens=4096, group=ep)
    out = layer(x, topk_idx, topk_weights, w_up, w_down)   # torch.ops.weave.moe_layer
    layer.check()                                          # off the hot path: device-side verdicts

Registration: the layer forward is the operator `torch.ops.weave.moe_layer(x, topk_idx,
topk_weights, w_up, w_down, layer)`, `layer` being the MoeLayer's integer handle (with a fake
implementation: the output's shape needs only the inputs' and the layer's configuration).
dispatch / combine / check stay plain methods: dispatch returns a view of the exchange's
persistent buffer that the next call overwrites, and combine reads the routing the previous
dispatch left on the device; neither fits a functional operator's contract (outputs fresh or
aliasing inputs, no hidden order between calls), so torch.compile would be free to reorder or drop
them. MoeLowLatency follows the same pattern (its decode forward is torch.ops.weave.moe_low_latency).
python/README.md, "Expert-parallel MoE", has the details."""
from __future__ import annotations

import contextlib
import itertools
import weakref
from typing import Optional

import torch

from . import _comm, _ops
from ._comm import GroupLike
from ._lib import lib, require_gpu

# Limits of the C++ exchange (kernels/moe/exchange_plan.hpp): kMaxExchangeExperts, kMaxTopk; the
# low-latency mode's (kernels/moe/low_latency_schedule.hpp) are the same but for its tokens per call.
MAX_EXPERTS = 1024
MAX_TOPK = 16
MAX_LOW_LATENCY_TOKENS = 256  # kLlMaxTokens
DEFAULT_SLACK = 2.0  # MoeLayer's default capacity: moe_capacity(max_tokens, topk, E, 2.0)
_INT_MAX = 2 ** 31 - 1

_BF, _I32 = torch.bfloat16, torch.int32


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _geometry(who: str, tokens, topk, num_experts, world) -> None:
    for name, v, lo in (("tokens", tokens, 0), ("topk", topk, 1), ("num_experts", num_experts, 1), ("world", world, 1)):
        if not _is_int(v) or v < lo:
            raise ValueError(f"weave.{who}: {name} must be an int >= {lo}, got {v!r}")
    if num_experts % world:
        raise ValueError(f"weave.{who}: {num_experts} experts do not divide among {world} ranks")


def _world_of(world: Optional[int], group: GroupLike) -> int:
    return world if world is not None else _comm.group_rank_world(_comm.group_name(group))[1]


def moe_worst_case_rows(tokens: int, topk: int, num_experts: int, *, world: Optional[int] = None,
                        group: GroupLike = None) -> int:
    """The most rows one rank's grouped buffer can receive when every rank passes `tokens` tokens
    and each token's k experts are distinct (a top-k router): W T min(k, E / W)
    (kernels/moe/layout.hpp's worst_case_rows; repeated ids in a token's row can make it W T k).
    `world` defaults to the group's size."""
    W = _world_of(world, group)
    _geometry("moe_worst_case_rows", tokens, topk, num_experts, W)
    return int(lib().moe_worst_case_rows(tokens, topk, W, num_experts))


def moe_capacity(tokens: int, topk: int, num_experts: int, slack: float = DEFAULT_SLACK, *,
                 world: Optional[int] = None, group: GroupLike = None) -> int:
    """A receive capacity (rows per rank) for `tokens` tokens per rank: every (source rank, expert)
    pair gets ceil(slack * ceil(T k / E)) rows, W L of them per rank (>= slack T k), clamped to
    moe_worst_case_rows (kernels/moe/layout.hpp's receive_capacity). Safe for perfectly balanced
    routing at slack 1; skewed routing needs more (a capacity overflow fails the call, see
    MoeLayer.check), all tokens to one expert the worst case. `world` defaults to the group's size."""
    W = _world_of(world, group)
    _geometry("moe_capacity", tokens, topk, num_experts, W)
    if not isinstance(slack, (int, float)) or isinstance(slack, bool) or not slack > 0:
        raise ValueError(f"weave.moe_capacity: slack must be a positive number, got {slack!r}")
    worst = int(lib().moe_worst_case_rows(tokens, topk, W, num_experts))
    if worst > _INT_MAX:
        raise ValueError(f"weave.moe_capacity: the worst case ({worst} rows) does not fit in int32; pick a capacity")
    return int(lib().moe_receive_capacity(tokens, topk, W, num_experts, float(slack)))


_ids = itertools.count(1)
_layers: "dict[int, weakref.ref[_MoeObject]]" = {}


def _layer_of(handle: int, cls=None) -> "_MoeObject":
    """The live MoeLayer (or `cls`) with this operator handle."""
    cls = MoeLayer if cls is None else cls
    ref = _layers.get(int(handle))
    layer = ref() if ref is not None else None
    if not isinstance(layer, cls):
        raise ValueError(f"weave.{cls._op}: no live weave.{cls.__name__} has handle {handle} (closed or never made)")
    return layer


def _check_ints(who: str, **values) -> None:
    """Each value an int >= 1 (bools refused)."""
    for n, v in values.items():
        if not _is_int(v) or v < 1:
            raise ValueError(f"weave.{who}: {n} must be an int >= 1, got {v!r}")


def _check_config(who: str, taker: str, world: int, num_experts: int, hidden: int, ffn: Optional[int],
                  topk: int) -> None:
    """The C++ objects' shared limits (ints already checked; ffn None: none)."""
    if num_experts % world:
        raise ValueError(f"weave.{who}: {num_experts} experts do not divide among the group's {world} ranks")
    if num_experts > MAX_EXPERTS:
        raise ValueError(f"weave.{who}: at most {MAX_EXPERTS} experts, got {num_experts}")
    if hidden % 8 or (ffn or 0) % 8:
        raise ValueError(f"weave.{who}: hidden ({hidden}) and ffn ({ffn}) must be multiples of 8 (rows move as 16-byte "
                         "vectors)")
    if topk > MAX_TOPK:
        raise ValueError(f"weave.{who}: topk = {topk}; {taker} takes 1..{MAX_TOPK}")


class _MoeObject:
    """What MoeLayer and MoeLowLatency share: the C++ object (weave._C.MoeLayer, made collectively on
    the group's communicator), the integer handle their operator takes, views of its device memory,
    the stream order between calls, check() and close()."""
    _op = "moe_layer"  # the operator's name, for _layer_of's message
    _shown = ()  # the attributes repr shows before the group's
    _h = None
    _id = 0
    comm: Optional[_comm.Communicator] = None
    _stream: Optional[torch.cuda.Stream] = None

    def _register(self) -> None:
        self._id = next(_ids)
        _layers[self._id] = weakref.ref(self, lambda _, i=self._id: _layers.pop(i, None))

    def __repr__(self) -> str:
        args = "".join(f"{n}={getattr(self, n)!r}, " for n in self._shown)
        return (f"weave.{type(self).__name__}({args}group={self.group_name!r}, rank={self.rank}, world={self.world}"
                f"{', closed' if self.closed else ''})")

    def _view(self, ptr: int, shape, dtype) -> torch.Tensor:
        code, bits = _comm._DLPACK[dtype]
        return torch.utils.dlpack.from_dlpack(self._h.view(ptr, list(shape), code, bits))

    @property
    def handle(self) -> int:
        """The integer this object's operator (torch.ops.weave.moe_layer / moe_low_latency) takes."""
        return self._id

    @property
    def closed(self) -> bool:
        return self._h is None or self._h.closed

    def _live(self, op: str) -> None:
        if self.closed:
            raise RuntimeError(f"weave.{op}: the layer was closed")

    @contextlib.contextmanager
    def _rules(self, op: str):
        """A call's argument checks (CUDA paths): an error they raise (a ValueError for an argument,
        and any other: this rank will not launch either way) joins the cross-rank agreement as this
        rank's problem before it propagates, so that the peers, whose arguments passed, fail in
        their call's agreement instead of waiting for this rank (a new plan's peers in the verdict;
        an agreed plan's launched peers through their abort words). A layer closed on this rank
        alone does not refuse: its peers end at the wait timeout."""
        try:
            yield
        except Exception as e:
            if not self.closed:
                _comm.refuse_call(self.group_name, op, str(e))
            raise

    def _enter(self, op: str, *tensors: torch.Tensor) -> torch.cuda.Stream:
        """Torch's current stream of the object's device, ordered after the previous call's stream
        (the C++ buffers are reused across calls)."""
        self._live(op)
        dev = self.comm.device
        for t in tensors:
            if t.device.type != "cuda" or t.device.index != dev:
                _ops._fail(op, f"a tensor is on {t.device} but the layer's communicator uses cuda:{dev}")
        s = torch.cuda.current_stream(dev)
        if torch.cuda.is_current_stream_capturing():
            # A graph cannot wait for work outside it: its replays are ordered by the stream they run
            # on, after the eager calls before them (as the other operators' captures).
            return s
        last = self._stream
        if last is not None and last != s:
            s.wait_stream(last)
        self._stream = s
        return s

    def check(self) -> None:
        """Synchronises torch's current stream, then raises RuntimeError with the first failed
        dispatch's reason since the last check (the same on every rank). The object stays usable.
        Off the hot path (it waits for the GPU). Not collective, but every rank reaches the same
        verdict."""
        who = type(self).__name__
        s = self._enter(f"{who}.check")
        try:
            self._h.check(s.cuda_stream)
        except RuntimeError as e:
            raise RuntimeError(f"weave.{who}: {e}") from None

    def _drop_views(self) -> None:
        """Forgets the tensors viewing the C++ object's memory (close)."""

    def _ready_to_dispatch(self, op: str) -> None:
        """Raises ValueError where the object cannot start a dispatch now (MoeLowLatency)."""

    def close(self) -> None:
        """Frees the object's buffers (collective: every rank, in the same order as its other weave
        allocations). Tensors viewing them must not be used afterwards. Calls on a closed object
        raise RuntimeError."""
        if self._h is not None and not self._h.closed:
            self._h.close()
        self._drop_views()
        _layers.pop(self._id, None)


class MoeLayer(_MoeObject):
    """An expert-parallel MoE layer forward (SwiGLU experts) over a process group, on weave's
    kernels: dispatch (tokens to their experts' ranks), grouped GEMM (gate and up), SwiGLU, grouped
    GEMM (down) and combine (the weighted sum at each token's home rank); `fused` runs the C++
    moe_layer_forward_fused instead (fused dispatch / up projection and down projection / combine
    kernels, kernels/moe/layer.hpp; the same output bit for bit).

    Collective: every rank of the group makes it with the same arguments, in the same order as its
    other weave allocations. E experts over W ranks, L = E / W per rank: expert e lives on rank
    e // L as local expert e % L; each rank passes its own L experts' weights to forward.

    num_experts (E, a multiple of W, at most 1024), hidden (H, a multiple of 8), ffn (F, the expert's
    intermediate size, a multiple of 8), topk (k, 1..16), max_tokens: the most tokens any rank
    passes to one call (T may differ across ranks and calls). capacity: rows of each rank's grouped
    buffer (default moe_capacity(max_tokens, topk, E, slack)); a call whose routing needs more rows
    on some rank fails on every rank (output NaN, check() raises). fused: moe_layer_forward_fused
    (True) or moe_layer_forward (False). output_buffer: also allocate the exchange's symmetric
    expert-output buffer (`expert_output`, capacity x H; default: only when not fused, where the
    layer needs it) for combine().

    Symmetric memory per rank (weave.init's heap_bytes): capacity x H x 2 bytes (grouped buffer) +
    capacity x 16 (row metadata) + capacity x H x 2 with the output buffer + max_tokens x k x H x 2
    fused (landing buffer), plus small parts. Local device memory (cudaMalloc, outside torch's
    allocator): capacity x 3F x 2 bytes of scratch.

    close() (collective) frees it; a layer dropped without close() keeps its buffers until its
    communicator goes (destroying them is collective, and Python's collector does not drop objects
    in the same order on every rank)."""

    _shown = ("num_experts", "hidden", "ffn", "topk", "max_tokens", "capacity", "fused")

    def __init__(self, num_experts: int, hidden: int, ffn: int, topk: int, max_tokens: int, *,
                 capacity: Optional[int] = None, slack: float = DEFAULT_SLACK, fused: bool = True,
                 output_buffer: Optional[bool] = None, group: GroupLike = None):
        name = _comm.group_name(group)
        rank, world = _comm.group_rank_world(name)
        _check_ints("MoeLayer", num_experts=num_experts, hidden=hidden, ffn=ffn, topk=topk, max_tokens=max_tokens)
        _check_config("MoeLayer", "the exchange", world, num_experts, hidden, ffn, topk)
        if max_tokens * topk > _INT_MAX:
            raise ValueError(f"weave.MoeLayer: max_tokens x topk = {max_tokens * topk} must fit in int32")
        if capacity is None:
            capacity = moe_capacity(max_tokens, topk, num_experts, slack, world=world)
        elif not _is_int(capacity) or not 1 <= capacity <= _INT_MAX:
            raise ValueError(f"weave.MoeLayer: capacity must be an int in 1..2^31-1 (rows per rank), got {capacity!r}")
        self.num_experts, self.hidden, self.ffn, self.topk = num_experts, hidden, ffn, topk
        self.max_tokens, self.capacity, self.fused = max_tokens, int(capacity), bool(fused)
        self.output_buffer = (not fused) if output_buffer is None else bool(output_buffer) or not fused
        self.rank, self.world, self.group_name = rank, world, name
        self.local_experts = num_experts // world
        # The argument rules' view of the layer (python/src/plan.hpp, MoeSizes).
        self._sizes = lib().MoeSizes(hidden, ffn, topk, self.local_experts, max_tokens, self.capacity)
        self._last_T: Optional[int] = None
        self._rows: Optional[torch.Tensor] = None
        self._out: Optional[torch.Tensor] = None
        self._counts: Optional[torch.Tensor] = None
        self._offsets: Optional[torch.Tensor] = None
        self._make(group)
        self._register()

    def _make(self, group: GroupLike) -> None:
        """The C++ layer on the group's communicator (collective)."""
        require_gpu("weave.MoeLayer")
        self.comm = _comm.communicator(group)
        self._h = lib().MoeLayer(self.comm._c, self.num_experts, self.hidden, self.ffn, self.topk, self.max_tokens,
                                 self.capacity, self.fused, self.output_buffer)
        self._rows = self._view(self._h.expert_input, (self.capacity, self.hidden), _BF)
        if self._h.expert_output:
            self._out = self._view(self._h.expert_output, (self.capacity, self.hidden), _BF)

    # ---- properties and helpers

    @property
    def expert_input(self) -> torch.Tensor:
        """The grouped buffer (capacity x H bf16, symmetric): what dispatch fills."""
        self._live("MoeLayer.expert_input")
        return self._rows

    @property
    def expert_output(self) -> Optional[torch.Tensor]:
        """The exchange's symmetric output buffer (capacity x H bf16) that combine reads from the
        peers, or None (a fused layer made without output_buffer=True)."""
        self._live("MoeLayer.expert_output")
        return self._out

    def capacity_for(self, tokens: Optional[int] = None, topk: Optional[int] = None,
                     slack: float = DEFAULT_SLACK) -> int:
        """moe_capacity for this layer's experts and world (tokens default max_tokens, topk the layer's)."""
        return moe_capacity(self.max_tokens if tokens is None else tokens, self.topk if topk is None else topk,
                            self.num_experts, slack, world=self.world)

    def worst_case_rows(self, tokens: Optional[int] = None, topk: Optional[int] = None) -> int:
        """moe_worst_case_rows for this layer's experts and world (defaults as capacity_for)."""
        return moe_worst_case_rows(self.max_tokens if tokens is None else tokens, self.topk if topk is None else topk,
                                   self.num_experts, world=self.world)

    # ---- the calls

    def forward(self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor, w_up: torch.Tensor,
                w_down: torch.Tensor) -> torch.Tensor:
        """out[t] = sum_j topk_weights[t, j] * down_e(silu(gate_e(x_t)) * up_e(x_t)), e = topk_idx[t, j],
        over every rank's experts (collective).

        x: (T, H) bf16, this rank's tokens, T <= max_tokens; topk_idx: (T, k) int32 in 0..E-1;
        topk_weights: (T, k) fp32; w_up: (L, 2F, H) bf16, this rank's experts (local expert l is
        expert rank * L + l), nn.Linear's layout: rows 0..F-1 the gate projection, F..2F-1 the up
        projection; w_down: (L, H, F) bf16. All contiguous, on the layer's GPU. Returns out (T, H)
        bf16, a new tensor from the caching allocator, on torch's current stream.
        Numerics: the gate and up outputs are rounded to bf16, SwiGLU computed in fp32 and rounded to
        bf16, each expert's output row rounded to bf16, the weighted sum over the k slots in fp32 (slot
        order), rounded to bf16. A routing the layer cannot take (an expert id out of range on any
        rank, rows past the capacity on any rank) fails the call on every rank: out is NaN and
        check() raises why. No autograd."""
        return torch.ops.weave.moe_layer(x, topk_idx, topk_weights, w_up, w_down, self._id)

    __call__ = forward

    def dispatch(self, x: torch.Tensor, topk_idx: torch.Tensor):
        """The exchange's dispatch alone (collective): each token goes once to every rank holding one of
        its experts; (rows, counts, offsets) on this rank:

        - rows: the grouped buffer (capacity x H bf16, a view of `expert_input`): local expert l's
          rows are rows[offsets[l]:offsets[l + 1]], one per (token, slot) routed to it, ordered by
          source rank, then (token, slot); rows at or past offsets[L] are unspecified. A view, valid
          until the layer's next dispatch or forward (in stream order), which overwrite it.
        - counts: (L,) int32, rows per local expert; offsets: (L + 1,) int32, their exclusive
          prefix (new tensors: copies of the exchange's, made on the stream; no host synchronisation).

        weave.grouped_mm(rows, w, counts) runs an expert projection over them. A failed call (bad
        id, capacity) leaves counts zero; check() says why."""
        op = "MoeLayer.dispatch"
        with self._rules(op):
            T = self._plan_tokens(op, x, topk_idx)
            s = self._enter(op, x, topk_idx)
            _aligned(op, x=x)
        _, counts, offsets = self._h.dispatch(_ptr(x), _ptr(topk_idx), T, s.cuda_stream)
        self._last_T = T
        if self._counts is None or self._counts.data_ptr() != counts:
            self._counts = self._view(counts, (self.local_experts,), _I32)
            self._offsets = self._view(offsets, (self.local_experts + 1,), _I32)
        return self._rows, self._counts.clone(), self._offsets.clone()

    def combine(self, y: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        """The exchange's combine (collective), after dispatch: out[t] = sum_j topk_weights[t, j] *
        Y_r[row(t, j)], the experts' output rows read from the ranks that hold them, fp32 sum in slot
        order, bf16 out (T, H), a new tensor.

        y: this rank's experts' output rows in the grouped layout of the last dispatch (row i is
        the output of rows[i]); it must be symmetric, capacity x H bf16: `expert_output` (write the
        rows there, e.g. expert_output[:n].copy_(...)) or a weave.empty((capacity, H)) tensor of the
        layer's group. Peers read it: do not overwrite it before the call (it returns, in stream
        order, once every peer has read it). topk_weights: (T, k) fp32, T the last dispatch's."""
        op = "MoeLayer.combine"
        self._live(op)
        with self._rules(op):
            lib().plan_moe_expert_rows(op, self._sizes, _ops._spec(y))
            if self._last_T is None:
                _ops._fail(op, "no dispatch on this layer yet (combine reads the last dispatch's routing)")
            T = self._last_T
            self._check_weights(op, topk_weights, T)
            if y.device.type == "cuda" and not (self._out is not None and y.data_ptr() == self._out.data_ptr()) \
                    and not self.comm.is_symmetric(y):
                _ops._fail(op, "y is not symmetric memory of the layer's group: write the rows into "
                               "layer.expert_output (make the layer with output_buffer=True if fused) or a "
                               "weave.empty((capacity, H)) tensor")
            s = self._enter(op, y, topk_weights)
            _aligned(op, y=y)
        out = _ops._empty((T, self.hidden), _BF, y.device)
        self._h.combine(_ptr(y), _ptr(topk_weights), _ptr(out), T, s.cuda_stream)
        return out

    def check(self) -> None:
        """Synchronises torch's current stream, then raises RuntimeError with the first failed
        dispatch's reason since the last check (the same on every rank), e.g. "moe dispatch: receive
        capacity 64 rows exceeded on rank 0 at expert 3 (100 rows; 100 rows for the rank in all);
        nothing was dispatched" or "moe dispatch: expert id 13 on rank 1 (token 7, slot 1) is
        outside 0..E-1; ...". The layer stays usable. Off the hot path (it waits for the GPU).
        Not collective, but every rank reaches the same verdict."""
        super().check()

    def _drop_views(self) -> None:
        # close(): expert_input, expert_output and dispatch's rows view the freed buffers
        self._rows = self._out = self._counts = self._offsets = None

    # ---- argument checks (ValueError before anything is enqueued; the rules: python/src/plan.cpp)

    def _plan_tokens(self, op: str, x: torch.Tensor, topk_idx: torch.Tensor) -> int:
        self._live(op)
        return lib().plan_moe_tokens(op, self._sizes, _ops._spec(x), _ops._spec(topk_idx))

    def _check_weights(self, op: str, w: torch.Tensor, T: int) -> None:
        lib().plan_moe_weights(op, self._sizes, _ops._spec(w), T)

    def _plan_forward(self, x, topk_idx, topk_weights, w_up, w_down) -> int:
        self._live("MoeLayer.forward")
        return lib().plan_moe_forward(self._sizes, *(_ops._spec(t) for t in (x, topk_idx, topk_weights, w_up, w_down)))


def _ptr(t: torch.Tensor) -> int:
    return t.data_ptr() if t.numel() else 0


def _aligned(op: str, **tensors: torch.Tensor) -> None:
    """16-byte alignment of the bf16 operands the kernels load as vectors (real CUDA tensors: the
    CUDA paths check it, the fake implementation has no addresses)."""
    for name, t in tensors.items():
        if t.numel() and t.data_ptr() % 16:
            _ops._fail(op, f"{name} must start at a 16-byte aligned address (storage offset {t.storage_offset()}); "
                           f"pass {name}.clone()")


class MoeLowLatency(_MoeObject):
    """The low-latency (decode) mode of expert parallelism over a process group, on weave's kernels
    (kernels/moe/low_latency.hpp, moe::MoeLowLatency): dispatch and combine of at most 256 tokens per
    rank and call in one kernel each, with no count exchange before the rows move, and the decode
    forward (dispatch -> grouped GEMM (gate and up) -> SwiGLU -> grouped GEMM (down) -> combine, the
    GEMMs on the fixed-stride receive layout). Everything runs on torch's current stream with no
    host synchronisation, except check().

        ll = weave.MoeLowLatency(num_experts=64, hidden=7168, topk=8, max_tokens=128, ffn=2048, group=ep)
        out = ll(x, topk_idx, topk_weights, w_up, w_down)    # torch.ops.weave.moe_low_latency
        rows, counts = ll.dispatch(x, topk_idx)              # or the two exchanges alone ...
        out = ll.combine(y, topk_weights)                    # ... around the caller's expert math
        ll.check()                                           # off the hot path

    Collective, as MoeLayer: every rank makes it with the same arguments, in the same order as its
    other weave allocations; every call is collective. num_experts (E, a multiple of the group's
    size W, at most 1024), hidden (H, a multiple of 8), topk (k, 1..16), max_tokens (1..256: the most
    tokens any rank passes to one call; T may differ across ranks and calls), ffn (F, a multiple of
    8: the experts' intermediate size; None: no decode forward, only dispatch and combine). Expert e
    lives on rank e // L as local expert e % L (L = E / W).

    Receive layout: this rank's receive buffer is (L, S, H) bf16, S = row_stride = W x max_tokens;
    local expert l's rows are receive_buffer[l, :counts[l]], packed, the sources in rotated order
    (this rank's own rows first, then ranks rank + 1, rank + 2, ... mod W), each source's rows in
    (token, slot) order. dispatch and combine alternate: a dispatch must be combined (combine or
    the forward, which does both) before the next one.

    Memory per rank: symmetric (the communicator's heap): about (W + k) x max_tokens x H x 2 bytes
    (staging and landing rows) plus small parts; local (cudaMalloc, outside torch's allocator): the
    receive buffer, L x S x H x 2 bytes, and with ffn the decode forward's scratch, L x S x (3F + H) x
    2 bytes. close() (collective) frees it; dropped without close() it is kept until its
    communicator goes (as MoeLayer)."""
    _op = "moe_low_latency"
    _shown = ("num_experts", "hidden", "topk", "max_tokens", "ffn")

    def __init__(self, num_experts: int, hidden: int, topk: int, max_tokens: int, *, ffn: Optional[int] = None,
                 group: GroupLike = None):
        name = _comm.group_name(group)
        rank, world = _comm.group_rank_world(name)
        _check_ints("MoeLowLatency", num_experts=num_experts, hidden=hidden, topk=topk, max_tokens=max_tokens)
        if ffn is not None:
            _check_ints("MoeLowLatency", ffn=ffn)
        _check_config("MoeLowLatency", "the low-latency mode", world, num_experts, hidden, ffn, topk)
        if max_tokens > MAX_LOW_LATENCY_TOKENS:
            raise ValueError(f"weave.MoeLowLatency: max_tokens = {max_tokens}; the low-latency mode takes at most "
                             f"{MAX_LOW_LATENCY_TOKENS} tokens per rank and call (use weave.MoeLayer for more)")
        self.num_experts, self.hidden, self.topk, self.max_tokens, self.ffn = num_experts, hidden, topk, max_tokens, ffn
        self.rank, self.world, self.group_name = rank, world, name
        self.local_experts = num_experts // world
        self.row_stride = world * max_tokens
        # The argument rules' view (python/src/plan.hpp, MoeSizes; capacity: the receive buffer's rows).
        self._sizes = lib().MoeSizes(hidden, ffn or 0, topk, self.local_experts, max_tokens,
                                     self.local_experts * self.row_stride)
        self._pending: Optional[int] = None  # T of the dispatch that waits for its combine
        self._rows: Optional[torch.Tensor] = None
        self._counts: Optional[torch.Tensor] = None
        self._make(group)
        self._register()

    def _make(self, group: GroupLike) -> None:
        """The C++ object on the group's communicator (collective)."""
        require_gpu("weave.MoeLowLatency")
        self.comm = _comm.communicator(group)
        self._h = lib().MoeLayer.low_latency(self.comm._c, self.num_experts, self.hidden, self.ffn or 0, self.topk,
                                             self.max_tokens)
        self._rows = self._view(self._h.expert_input, (self.local_experts, self.row_stride, self.hidden), _BF)

    @property
    def receive_buffer(self) -> torch.Tensor:
        """(L, S, H) bf16: what dispatch fills (local expert l's rows at [l, :counts[l]])."""
        self._live("MoeLowLatency.receive_buffer")
        return self._rows

    # ---- the calls

    def forward(self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor, w_up: torch.Tensor,
                w_down: torch.Tensor) -> torch.Tensor:
        """The decode forward (collective; needs ffn): MoeLayer.forward's math, arguments and
        numerics (gate and up rounded to bf16, SwiGLU in fp32 rounded to bf16, each expert row
        rounded to bf16, the weighted sum in fp32 in slot order, bf16 out), for T <= max_tokens:
        x (T, H) bf16, topk_idx (T, k) int32, topk_weights (T, k) fp32, w_up (L, 2F, H) and w_down
        (L, H, F) bf16 of this rank's experts (gate rows first). Returns out (T, H) bf16, a new
        tensor, on torch's current stream. A routing the mode cannot take (an expert id outside
        0..E-1 on any rank, or a rank putting more than max_tokens rows on one expert: a token
        naming an expert twice) fails the call on every rank: out is NaN and check() raises why.
        No autograd."""
        return torch.ops.weave.moe_low_latency(x, topk_idx, topk_weights, w_up, w_down, self._id)

    __call__ = forward

    def dispatch(self, x: torch.Tensor, topk_idx: torch.Tensor):
        """The low-latency dispatch alone (collective): every (token, slot) row lands in its
        expert's region on the expert's rank. Returns (rows, counts) on this rank: rows, the receive
        buffer (L, S, H) bf16 (`receive_buffer`; a view, overwritten by the next dispatch or forward),
        local expert l's rows at rows[l, :counts[l]] (the rest unspecified); counts (L,) int32, a new
        tensor (a copy made on the stream; no host synchronisation; zero after a failed call).
        x (T, H) bf16 and topk_idx (T, k) int32 as for forward. Combine it (combine) before the next
        dispatch."""
        op = "MoeLowLatency.dispatch"
        self._live(op)
        with self._rules(op):
            T = lib().plan_moe_tokens(op, self._sizes, _ops._spec(x), _ops._spec(topk_idx))
            self._ready_to_dispatch(op)
            s = self._enter(op, x, topk_idx)
            _aligned(op, x=x)
        _, counts, _ = self._h.dispatch(_ptr(x), _ptr(topk_idx), T, s.cuda_stream)
        self._pending = T
        if self._counts is None or self._counts.data_ptr() != counts:
            self._counts = self._view(counts, (self.local_experts,), _I32)
        return self._rows, self._counts.clone()

    def combine(self, y: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        """The low-latency combine (collective), after dispatch: out[t] = sum_j topk_weights[t, j] *
        y_r[row(t, j)], each expert output row read where the dispatch put its input (y of the rank
        holding the expert), fp32 fma in slot order, bf16 out (T, H), a new tensor; T is the
        dispatch's. y: this rank's expert outputs in the receive layout, (L, S, H) bf16, contiguous,
        16-byte aligned, any device memory of this rank (not symmetric: it is pushed to the home
        ranks, never read remotely); it may be overwritten once combine returns (in stream order).
        topk_weights: (T, k) fp32."""
        op = "MoeLowLatency.combine"
        self._live(op)
        with self._rules(op):
            if self._pending is None:
                _ops._fail(op, "no dispatch to combine (dispatch and combine alternate: every dispatch is combined "
                               "once)")
            T = self._pending
            want = (self.local_experts, self.row_stride, self.hidden)
            if y.dtype != _BF:
                _ops._fail(op, f"y has dtype {y.dtype}, expected torch.bfloat16")
            if tuple(y.shape) != want:
                _ops._fail(op, f"y must be (L, row_stride, H) = {want}, got {tuple(y.shape)}")
            if not y.is_contiguous():
                _ops._fail(op, "y is not contiguous")
            lib().plan_moe_weights(op, self._sizes, _ops._spec(topk_weights), T)
            s = self._enter(op, y, topk_weights)
            _aligned(op, y=y)
        out = _ops._empty((T, self.hidden), _BF, y.device)
        self._h.combine(_ptr(y), _ptr(topk_weights), _ptr(out), T, s.cuda_stream)
        self._pending = None
        return out

    def check(self) -> None:
        """Synchronises torch's current stream, then raises RuntimeError with the first failed
        dispatch's reason since the last check (the same on every rank), e.g. "moe low-latency
        dispatch: expert id 70 on rank 1 (token 7, slot 1) is outside 0..E-1; nothing was dispatched"
        or "... rank 0 routes 100 rows to expert 3, more than max_tokens (50; a token names that
        expert more than once); ...". The object stays usable. Off the hot path."""
        super().check()

    def _drop_views(self) -> None:
        self._rows = self._counts = None
        self._pending = None

    # ---- argument checks (ValueError before anything is enqueued)

    def _ready_to_dispatch(self, op: str) -> None:
        """A dispatch must not start while the previous one waits for its combine (the C++ object
        refuses it too, after the other checks)."""
        if self._pending is not None:
            _ops._fail(op, "the last dispatch has not been combined yet (dispatch and combine alternate: call "
                           "combine first)")

    def _plan_forward(self, x, topk_idx, topk_weights, w_up, w_down) -> int:
        op = "MoeLowLatency.forward"
        self._live(op)
        if self.ffn is None:
            _ops._fail(op, "made without ffn: pass ffn= to MoeLowLatency for the decode forward")
        try:  # the layer's rules (python/src/plan.cpp), which name the layer's operator
            return lib().plan_moe_forward(self._sizes, *(_ops._spec(t) for t in (x, topk_idx, topk_weights, w_up,
                                                                                  w_down)))
        except ValueError as e:
            raise ValueError(str(e).replace("weave.MoeLayer.forward:", f"weave.{op}:", 1)) from None


# ---- torch.ops.weave.moe_layer and moe_low_latency: the forward of each kind, with a fake


def _forward_fake(cls):
    def fake(x, topk_idx, topk_weights, w_up, w_down, layer):
        m = _layer_of(layer, cls)
        T = m._plan_forward(x, topk_idx, topk_weights, w_up, w_down)
        return x.new_empty((T, m.hidden))
    return fake


def _forward_cuda(cls):
    op = f"{cls.__name__}.forward"

    def run(x, topk_idx, topk_weights, w_up, w_down, layer):
        m = _layer_of(layer, cls)
        with m._rules(op):
            T = m._plan_forward(x, topk_idx, topk_weights, w_up, w_down)
            m._ready_to_dispatch(op)
            s = m._enter(op, x, topk_idx, topk_weights, w_up, w_down)
            _aligned(op, x=x, w_up=w_up, w_down=w_down)
        out = _ops._empty((T, m.hidden), _BF, x.device)
        m._h.forward(_ptr(x), _ptr(topk_idx), _ptr(topk_weights), T, _ptr(w_up), _ptr(w_down), _ptr(out),
                     s.cuda_stream)
        return out
    return run


for _cls in (MoeLayer, MoeLowLatency):
    _ops._define(f"{_cls._op}(Tensor x, Tensor topk_idx, Tensor topk_weights, Tensor w_up, Tensor w_down, int layer) "
                 "-> Tensor", _forward_fake(_cls), _forward_cuda(_cls))
    # Collective: a traced graph must keep the call even where its output is unused (every rank calls it).
    torch.fx.node.has_side_effect(getattr(torch.ops.weave, _cls._op).default)
del _cls
