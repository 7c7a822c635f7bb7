"""The extension module and the environment checks every entry point shares."""
from __future__ import annotations

import torch

try:
    from . import _C  # type: ignore[attr-defined]

    _C_ERROR: Exception | None = None
except ImportError as e:  # a source checkout without the build, or a wheel for another Python
    _C = None
    _C_ERROR = e


def lib():
    """weave._C, or a RuntimeError saying how to build it."""
    if _C is None:
        raise RuntimeError(
            f"weave: the extension module weave._C is not importable ({_C_ERROR}); build it with "
            "`pip install --no-build-isolation .` at the root of the weave repository"
        )
    return _C


_gpu_ok = False


def require_gpu(who: str) -> None:
    """Raises RuntimeError unless a Hopper GPU is visible to torch and to weave (checked once)."""
    global _gpu_ok
    if _gpu_ok:
        return
    if not torch.cuda.is_available():
        raise RuntimeError(
            f"{who}: no CUDA GPU is available (torch.cuda.is_available() is False); weave's operators "
            "run on NVIDIA Hopper GPUs (sm_90a)"
        )
    major, minor = torch.cuda.get_device_capability()
    if major != 9:
        raise RuntimeError(
            f"{who}: GPU {torch.cuda.current_device()} ({torch.cuda.get_device_name()}) has compute "
            f"capability {major}.{minor}; weave is built for Hopper (sm_90a) only"
        )
    count, failed, why = lib().gpu_count()
    if count == 0:
        raise RuntimeError(f"{who}: torch sees a GPU but weave's CUDA runtime does not ({why or 'no device'})")
    if failed:
        raise RuntimeError(f"{who}: weave's CUDA runtime failed to count GPUs: {why}")
    _gpu_ok = True


def lib_available() -> bool:
    """Whether weave._C imported."""
    return _C is not None
