"""weave.tune: the tuner's search for the shapes a training run will call, ahead of the run.

The TP and sequence-parallel operators pick their kernel variant and communicator SMs per shape
with weave's tuner (runtime/tuner.hpp): by default the first call of a new shape takes the cost
model's pick (no launch timed, kept in memory only); a searched choice, cached in memory and in the
tuner's file (WEAVE_TUNER_CACHE), wins over it. tune() runs those first calls before training, on
random inputs of the given shapes, searching (whatever WEAVE_TUNER says) with the budget of its
choice (default: the full search, which a first call in a training step cannot afford), so that
the steps find every shape measured and cached. It is collective: every rank of the group calls it
with the same list."""
from __future__ import annotations

import sys
import time
from typing import Iterable, Mapping, Optional

import torch

from . import _comm
from . import functional as F
from ._comm import GroupLike, group_name

# Every call kind and the keys its spec takes (required, then optional with defaults).
_KINDS = {
    "all_gather_matmul": (("M", "N", "K"), {"weight": "nk", "dtype": "bf16"}),
    "matmul_reduce_scatter": (("M", "N", "K"), {"weight": "nk", "dtype": "bf16"}),
    "matmul_all_reduce": (("M", "N", "K"), {"weight": "nk"}),
    "ring_attention": (("B", "S", "Hq", "Hkv", "D"), {"causal": True, "sharding": "zigzag"}),
    "ulysses_attention": (("B", "S", "Hq", "Hkv", "D"), {"causal": True}),
}


def _fail(msg: str):
    raise ValueError(f"weave.tune: {msg}")


def _spec(i: int, call: Mapping) -> dict:
    """The call's kind and full spec, checked: unknown kinds and keys, missing or non-positive sizes."""
    if not isinstance(call, Mapping) or "op" not in call:
        _fail(f"calls[{i}] must be a dict with 'op' (one of {', '.join(_KINDS)}) and the op's sizes, got {call!r}")
    op = call["op"]
    if op not in _KINDS:
        _fail(f"calls[{i}]: op {op!r} is not tuned; tuned ops: {', '.join(_KINDS)}")
    required, optional = _KINDS[op]
    spec = dict(optional)
    for k, v in call.items():
        if k != "op" and k not in required and k not in optional:
            _fail(f"calls[{i}] ({op}): unknown key {k!r}; it takes {', '.join(required + tuple(optional))}")
        spec[k] = v
    for k in required:
        if k not in call:
            _fail(f"calls[{i}] ({op}): {k} is missing")
        if not isinstance(call[k], int) or call[k] < 1:
            _fail(f"calls[{i}] ({op}): {k} must be a positive int, got {call[k]!r}")
    if spec.get("weight", "nk") not in ("nk", "kn"):
        _fail(f"calls[{i}] ({op}): weight must be 'nk' (an nn.Linear weight, passed as w.t()) or 'kn', "
              f"got {spec['weight']!r}")
    if spec.get("dtype", "bf16") not in ("bf16", "fp8"):
        _fail(f"calls[{i}] ({op}): dtype must be 'bf16' or 'fp8', got {spec['dtype']!r}")
    if spec.get("sharding", "zigzag") not in ("zigzag", "contiguous"):
        _fail(f"calls[{i}] ({op}): sharding must be 'zigzag' or 'contiguous', got {spec['sharding']!r}")
    spec["op"] = op
    return spec


def _check_for_world(i: int, s: dict, world: int) -> None:
    """The rules that need the world size or combine keys, checked for the whole list before any call runs."""
    op = s["op"]
    if s.get("dtype") == "fp8":
        if s["weight"] != "nk":
            _fail(f"calls[{i}] ({op}): fp8 takes the weight as w.t() only (weight='nk')")
        if s["K"] % 16 or s["N"] % 8:
            _fail(f"calls[{i}] ({op}): fp8 needs K a multiple of 16 and N of 8, got K = {s['K']}, N = {s['N']}")
    if op == "all_gather_matmul" and s["M"] % world:
        _fail(f"calls[{i}] (all_gather_matmul): M = {s['M']} (the gathered rows) is not a multiple of the {world} ranks")


def _rand(shape, dtype, device) -> torch.Tensor:
    # Random values, not zeros: a tensor core fed zeros draws less power and clocks higher, which
    # would time the candidates under other conditions than the run's.
    x = torch.randn(shape, device=device)
    return x.to(dtype)


def _scale(device) -> torch.Tensor:
    return torch.ones((), device=device)


def _sync(device) -> None:
    torch.cuda.current_stream(device).synchronize()


def _weight(N: int, K: int, layout: str, dtype, device) -> torch.Tensor:
    """B (K x N): w.t() of an N x K nn.Linear weight ('nk'), or a contiguous K x N matrix ('kn')."""
    return _rand((N, K), dtype, device).t() if layout == "nk" else _rand((K, N), dtype, device)


def _run_one(s: dict, group: GroupLike, rank: int, world: int, device) -> None:
    op = s["op"]
    bf16, e4m3 = torch.bfloat16, torch.float8_e4m3fn
    if op in ("all_gather_matmul", "matmul_reduce_scatter", "matmul_all_reduce"):
        M, N, K = s["M"], s["N"], s["K"]
        fp8 = s.get("dtype") == "fp8"
        dt = e4m3 if fp8 else bf16
        B = _weight(N, K, s["weight"], dt, device)
        one = _scale(device)
        if op == "all_gather_matmul":
            A = _rand((M // world, K), dt, device)
            if fp8:
                F.all_gather_scaled_matmul(A, [B], one, [one], 0, group, return_A=False)
            else:
                F.all_gather_matmul(A, [B], 0, group, return_A=False)
        elif op == "matmul_reduce_scatter":
            A = _rand((M, K), dt, device)
            if fp8:
                F.scaled_matmul_reduce_scatter(A, B, one, one, "sum", 0, group)
            else:
                F.matmul_reduce_scatter(A, B, "sum", 0, group)
        else:
            F.matmul_all_reduce(_rand((M, K), bf16, device), B, group)
        return
    B_, S, Hq, Hkv, D = s["B"], s["S"], s["Hq"], s["Hkv"], s["D"]
    if op == "ring_attention":
        rows = sum(n for _, n in F.ring_chunks(S, s["sharding"], group))
        q, k, v = (_rand((B_, rows, h, D), bf16, device) for h in (Hq, Hkv, Hkv))
        F.ring_attention(q, k, v, s["causal"], None, sharding=s["sharding"], seq_len=S, group=group)
    else:
        _, rows = F.shard(S, group)
        q, k, v = (_rand((B_, rows, h, D), bf16, device) for h in (Hq, Hkv, Hkv))
        F.ulysses_attention(q, k, v, s["causal"], None, seq_len=S, group=group)


def tune(calls: Iterable[Mapping], group: GroupLike = None, *, budget_s: Optional[float] = 0.0,
         verbose: bool = True) -> list[dict]:
    """Searches the tuner's choice for every call in `calls` that the cache does not hold yet, on
    random inputs of its shapes (the group's device, torch's current stream). Collective: every
    rank of `group` passes the same calls in the same order.

    Each call is a dict: {"op": kind, sizes...}, sizes as the operator's whole problem:
      all_gather_matmul     M (the gathered rows, a multiple of the world size), N, K;
                            weight "nk" (default: B = w.t() of an nn.Linear weight) or "kn";
                            dtype "bf16" (default) or "fp8" (all_gather_scaled_matmul)
      matmul_reduce_scatter M (all rows, before the scatter), N, K; weight; dtype
      matmul_all_reduce     M, N, K; weight
      ring_attention        B, S (the whole sequence), Hq, Hkv, D; causal (True), sharding ("zigzag")
      ulysses_attention     B, S, Hq, Hkv, D; causal (True)
    budget_s: seconds one search may take (0, the default: the full search, about 10 s for a large
    TP shape; None: the tuner's current budget, WEAVE_TUNER_BUDGET_S). A shape the cost model
    answered earlier in the process is searched too. Progress goes to stderr on rank 0. Returns one
    dict per call: {"op", "spec", "seconds", "searched"} (searched: the tuner ran a search for it;
    False when a measured choice was cached, in memory or in the tuner's file).
    Call it once the run's symmetric buffers (weave.empty, the modules' weights) are allocated: some
    kernels offer candidates only where the symmetric heap has room for them, and a cached choice
    answers only the candidate set it was chosen from (a call with less free heap searches again)."""
    from ._lib import lib

    specs = [_spec(i, c) for i, c in enumerate(calls)]
    rank, world = _comm.group_rank_world(group_name(group))
    for i, s in enumerate(specs):
        _check_for_world(i, s, world)
    comm = _comm.communicator(group)
    device = torch.device("cuda", comm.device)
    C = lib()
    before, mode = C.tuner_budget_s(), C.tuner_mode()
    if budget_s is not None:
        if budget_s < 0:
            _fail(f"budget_s must be >= 0 (0: the full search) or None, got {budget_s}")
        C.set_tuner_budget_s(float(budget_s))
    C.set_tuner_mode("search")
    out = []
    try:
        with torch.no_grad():
            for i, s in enumerate(specs):
                known = C.tuner_searches()
                t0 = time.perf_counter()
                _run_one(s, group, rank, world, device)
                _sync(device)
                dt = time.perf_counter() - t0
                searched = C.tuner_searches() > known
                out.append({"op": s["op"], "spec": {k: v for k, v in s.items() if k != "op"}, "seconds": dt,
                            "searched": searched})
                if verbose and rank == 0:
                    sizes = ", ".join(f"{k} {v}" for k, v in s.items() if k != "op")
                    print(f"weave.tune: [{i + 1}/{len(specs)}] {s['op']} ({sizes}): "
                          f"{'searched' if searched else 'cached'} in {dt:.2f} s", file=sys.stderr, flush=True)
    finally:
        C.set_tuner_budget_s(before)
        C.set_tuner_mode(mode)
    if verbose and rank == 0 and specs:
        path = C.tuner_path()
        print(f"weave.tune: choices kept in {path if path != 'off' else 'memory only (WEAVE_TUNER_CACHE=off)'}",
              file=sys.stderr, flush=True)
    return out
