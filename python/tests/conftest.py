"""Shared fixtures. GPU tests are marked `gpu` and skip (with the reason) where torch sees no Hopper
GPU; multi-rank tests (test_multirank.py) skip unless started by torchrun."""
import os

import pytest
import torch
import torch.distributed as dist


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


@pytest.fixture(scope="module")
def world():
    """Multi-rank tests (under torchrun): (rank, world size, shared seed), with torch.distributed
    (gloo) up and this rank's GPU current."""
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    seed = [int(os.environ.get("WEAVE_TEST_SEED", "0") or 0) or int.from_bytes(os.urandom(4), "little")]
    dist.broadcast_object_list(seed, src=0)
    print(f"WEAVE_TEST_SEED={seed[0]}")
    yield dist.get_rank(), dist.get_world_size(), seed[0]
    dist.barrier()


@pytest.fixture
def moe_layers(monkeypatch):
    """moe_layers(...) -> a weave.MoeLayer, closed at the end of the test (collectively where its group
    has several ranks); the outputs of weave's ops poisoned (refs.poison)."""
    import weave
    from refs import poison

    poison(monkeypatch)
    weave.init()
    made = []

    def make(*args, **kw):
        layer = weave.MoeLayer(*args, **kw)
        made.append(layer)
        return layer

    yield make
    for layer in made:
        layer.close()
