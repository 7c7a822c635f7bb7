"""Inputs, poisoning and float32 references shared by the GPU tests (one process and multi-rank)."""
import math
import os
import subprocess
import sys
import zlib

import torch

import weave
from weave import _ops


def graph_replays() -> int:
    """How many times the capture-and-replay tests replay each graph: $WEAVE_GRAPH_REPLAYS, default
    1000 (issue 19's count). One place, so that the one-process and multi-rank tests agree and a
    quick run can lower it for all of them."""
    n = int(os.environ.get("WEAVE_GRAPH_REPLAYS", "") or 1000)
    if n < 1:
        raise ValueError(f"WEAVE_GRAPH_REPLAYS={n}: at least one replay")
    return n


def cuda_generator(seed: int, *tags) -> torch.Generator:
    """A device generator seeded from (seed, tags). Replay tests at a world of 1 draw each replay's
    inputs with it (Tensor.normal_): a host draw and copy per replay would cost more than the
    replay and its check, and nobody else needs to regenerate them."""
    g = torch.Generator(device="cuda")
    g.manual_seed(zlib.crc32(repr((seed,) + tags).encode()))
    return g


def refill(gen: torch.Generator, *tensors: torch.Tensor) -> None:
    """Fresh normal data into captured input tensors, in place (the graph reads their memory)."""
    for t in tensors:
        t.normal_(generator=gen)


def rand(shape, dtype, seed: int, *tags, device="cuda") -> torch.Tensor:
    """Random normal data that every rank can regenerate from (seed, tags) alone."""
    g = torch.Generator().manual_seed(zlib.crc32(repr((seed,) + tags).encode()))
    return torch.randn(shape, generator=g).to(dtype).to(device)


class _CppPoison:
    """The C++ operator kernels' poisoning switch as an attribute, so that monkeypatch undoes it."""

    @property
    def on(self) -> bool:
        return weave._lib.lib()._poison()

    @on.setter
    def on(self, value: bool) -> None:
        weave._lib.lib()._set_poison(bool(value))


def poison(monkeypatch) -> None:
    """Outputs and staging buffers start as NaN (all-ones bytes), so unwritten elements fail the
    checks: the C++ kernels' (weave._C._set_poison) and the Python kernels' (the MoE layer's)."""
    monkeypatch.setattr(_CppPoison(), "on", True)
    monkeypatch.setattr(_ops, "_empty", lambda shape, dtype, device: torch.full(
        tuple(shape), float("nan"), dtype=dtype, device=device))


def check_close(out: torch.Tensor, ref: torch.Tensor, bound, what: str) -> None:
    """Every element within its bound (a tensor or a number) of the float32 reference; names the worst."""
    assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    err = (out.float() - ref.float()).abs()
    bad = ~(err <= bound)  # NaN fails
    if bad.any():
        i = int(bad.flatten().nonzero()[0])
        b = bound if isinstance(bound, (int, float)) else float(torch.as_tensor(bound).expand_as(err).flatten()[i])
        raise AssertionError(f"{what}: {int(bad.sum())} of {out.numel()} elements off, first at flat index {i}: "
                             f"{float(out.flatten()[i])} vs {float(ref.flatten()[i])} (bound {b})")


def check_gemm(out: torch.Tensor, A: torch.Tensor, B: torch.Tensor, what: str, partials: int = 1) -> None:
    """out vs A @ B in float32, each element within a bf16 rounding per partial sum of its dot-product
    scale (|A| @ |B|)."""
    ref = A.float() @ B.float()
    scale = A.float().abs() @ B.float().abs()
    check_close(out, ref, 2.0 ** -7 * partials * scale + 1e-6, what)


def fp8(shape, dtype, seed: int, *tags) -> torch.Tensor:
    """Random fp8 values (normal, times 2: e4m3's and e5m2's normal range), exactly representable."""
    return rand(shape, torch.float32, seed, *tags).mul_(2).to(dtype)


def check_fp8_partials(out: torch.Tensor, parts, K: int, what: str, roundings: int = 0) -> None:
    """out (bf16) vs the sum of per-tensor-scaled fp8 GEMMs, parts = [(a_deq, b_deq), ...] (the
    dequantized, scaled operands of each rank's partial). Each partial within the fp8 GEMM's bound
    (kernels/gemm_fp8/README.md, "Numerics", check/gemm_fp8_ref.hpp's fp8_tensor_core_bound: rel
    2^-8 + 2^-14 K/32 of its |r|, scale 2^-10 + 2^-12 K/32 of its s = sqrt(sum_k (a' b')^2)), plus
    one bf16 rounding of the running sum per
    addition of the bf16 reduction (len(parts) - 1) and per `roundings` more (an avg's division)."""
    T = K / 32
    rel, sc = 2.0 ** -8 + 2.0 ** -14 * T, 2.0 ** -10 + 2.0 ** -12 * T
    ref = torch.zeros(out.shape, dtype=torch.float32, device=out.device)
    bound = torch.zeros_like(ref)
    mag = torch.zeros_like(ref)
    for a, b in parts:
        r = a @ b
        ref += r
        mag += r.abs()
        bound += rel * r.abs() + sc * ((a * a) @ (b * b)).sqrt()
    bound += 2.0 ** -8 * (len(parts) - 1 + roundings) * mag
    assert out.dtype == torch.bfloat16, f"{what}: dtype {out.dtype}"
    check_close(out, ref, bound + 1e-30, what)


def attention_ref(q, k, v, causal: bool, scale=None):
    """(o, lse) in float32: q (B, S, Hq, D), k and v (B, S, Hkv, D); o (B, S, Hq, D), lse (B, Hq, S)."""
    B, S, Hq, D = q.shape
    group = Hq // k.shape[2]
    qf = q.float().transpose(1, 2)
    kf = k.float().transpose(1, 2).repeat_interleave(group, dim=1)
    vf = v.float().transpose(1, 2).repeat_interleave(group, dim=1)
    s = (qf @ kf.transpose(-1, -2)) * (scale if scale else 1 / math.sqrt(D))
    if causal:
        s = s.masked_fill(torch.ones(S, S, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    o = torch.softmax(s, dim=-1) @ vf
    return o.transpose(1, 2), lse


def check_attention(o, lse, ref_o, ref_lse, what: str) -> None:
    check_close(o, ref_o, 2e-2 + 2e-2 * ref_o.abs(), what + " o")
    if lse is not None:
        check_close(lse, ref_lse, 1e-2 + 1e-3 * ref_lse.abs(), what + " lse")


def qkv(B, S, Hq, Hkv, D, seed, *tags):
    return (rand((B, S, Hq, D), torch.bfloat16, seed, "q", *tags), rand((B, S, Hkv, D), torch.bfloat16, seed, "k", *tags),
            rand((B, S, Hkv, D), torch.bfloat16, seed, "v", *tags))


__all__ = ["graph_replays", "cuda_generator", "refill", "rand", "poison", "check_close", "check_gemm", "fp8",
           "check_fp8_partials", "attention_ref", "check_attention", "qkv", "weave"]


def expect_no_gpu_errors(code: str) -> None:
    """Runs `code` (which imports weave and defines `calls`, a dict of name -> callable) in a Python
    with no visible GPU: every call must raise RuntimeError saying there is no CUDA GPU."""
    code += """
for name, call in calls.items():
    try:
        call()
    except RuntimeError as e:
        assert "no CUDA GPU" in str(e), (name, str(e))
    else:
        raise AssertionError(name + " raised nothing")
print("ok")
"""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr
