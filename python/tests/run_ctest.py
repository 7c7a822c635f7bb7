"""CTest's `python` entry: pytest over python/tests, or exit 77 (CTest: skipped) where python3
cannot import torch, pytest or the weave module this build made (WEAVE_PYTHON off, or a build
for another Python). Never reports passed without running the tests."""
import os
import subprocess
import sys

SKIP = 77
here = os.path.dirname(os.path.abspath(__file__))
for mod in ("torch", "pytest", "weave._C"):
    probe = subprocess.run([sys.executable, "-c", f"import {mod}"], capture_output=True, text=True)
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["?"])[-1]
        print(f"weave python tests: skipped, {sys.executable} cannot import {mod}: {last}")
        sys.exit(SKIP)
sys.exit(subprocess.run([sys.executable, "-m", "pytest", here, "-q", "-rs", "-p", "no:cacheprovider"]).returncode)
