"""Issue 19's scripts (bench/torch_ops.py, examples/torch/tp_block.py) without a GPU: --help works,
and a run ends with a clear message (exit status 2, no traceback). Each runs in a subprocess that
sees no GPU (CUDA_VISIBLE_DEVICES=) and no torchrun variables."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = [os.path.join(ROOT, "bench", "torch_ops.py"), os.path.join(ROOT, "examples", "torch", "tp_block.py")]
LAUNCH = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")


def run(script, *args):
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH}
    env["CUDA_VISIBLE_DEVICES"] = ""
    return subprocess.run([sys.executable, script, *args], env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("script", SCRIPTS, ids=os.path.basename)
def test_help(script):
    r = run(script, "--help")
    assert r.returncode == 0 and "usage:" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("script", SCRIPTS, ids=os.path.basename)
def test_without_gpu_a_clear_error(script):
    r = run(script)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "no CUDA GPU" in r.stderr and "Traceback" not in r.stderr, r.stderr
