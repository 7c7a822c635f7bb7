"""Shared fixtures. GPU tests are marked `gpu` and skip (with the reason) where torch sees no Hopper
GPU; multi-rank tests (test_multirank.py) skip unless started by torchrun."""
import os

import pytest
import torch


def hopper_gpu() -> str:
    """'' where a Hopper GPU is usable, else why not."""
    if not torch.cuda.is_available():
        return "no CUDA GPU (torch.cuda.is_available() is False)"
    major, minor = torch.cuda.get_device_capability()
    if major != 9:
        return f"GPU 0 has compute capability {major}.{minor}, weave needs Hopper (9.0)"
    return ""


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a Hopper GPU")


def pytest_collection_modifyitems(config, items):
    why = hopper_gpu()
    if not why:
        return
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=why))


@pytest.fixture
def seed():
    """A fresh seed per test, printed for replays (WEAVE_TEST_SEED=<n> replays one)."""
    s = int(os.environ.get("WEAVE_TEST_SEED", "0") or 0) or int.from_bytes(os.urandom(4), "little")
    print(f"WEAVE_TEST_SEED={s}")
    return s
