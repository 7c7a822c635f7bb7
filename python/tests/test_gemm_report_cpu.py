"""bench/gemm_report.py without a GPU: the figures kernels/gemm/README.md quotes from the committed
runs come out of it, and its ratios, repeats, variants and failures on made-up rows."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "bench", "gemm_report.py")
RESULTS = os.path.join(ROOT, "bench", "results")


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=120)


def first_lines(r, prefix):
    return [l for l in r.stdout.splitlines() if l.startswith(prefix)]


def test_the_readme_figures():
    r = run(os.path.join(RESULTS, "2026-12-06g-h200-gemm-drawn-777.jsonl"), "--lowest", "0")
    assert r.returncode == 0, r.stderr
    assert "96 rows, geomean 0.971, 19 below 0.95, lowest 0.659" in r.stdout
    r = run(os.path.join(RESULTS, "2026-12-06f-h100-gemm-wide-rounds-planners.jsonl"), "--by", "planner",
            "--dtype", "bf16", "--lowest", "0")
    lines = first_lines(r, "planner = ")
    assert "23 rows, geomean 0.923" in lines[0] and "23 rows, geomean 0.960" in lines[1], r.stdout
    r = run(os.path.join(RESULTS, "2026-12-06f-h100-gemm-km-cluster-ab.jsonl"), "--by", "tile", "--lowest", "0")
    lines = first_lines(r, "tile = ")
    assert "geomean 0.732" in lines[0] and "geomean 0.881" in lines[1], r.stdout


def write(tmp_path, rows):
    p = tmp_path / "rows.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return str(p)


def row(impl, t, M=256, N=4096, K=4096, correct=True, **kw):
    r = {"kernel": "gemm", "impl": impl, "M": M, "N": N, "K": K, "dtype": "bf16", "layout": "nk", "time_us": t,
         "correct": correct}
    r.update(kw)
    return r


def test_ratios_use_the_best_repeat_and_kinds(tmp_path):
    rows = [row("cublas", 10.0), row("cublas", 12.0), row("weave", 20.0, tile="a"), row("weave", 12.5, tile="a"),
            row("cublas", 30.0, M=4096, N=4104), row("weave", 25.0, M=4096, N=4104, tile="b")]
    r = run(write(tmp_path, rows), "--lowest", "5")
    assert r.returncode == 0, r.stderr
    assert "2 rows, geomean 0.980, 1 below 0.95, lowest 0.800" in r.stdout  # sqrt(0.8 * 1.2)
    kinds = [l.split() for l in r.stdout.splitlines() if l.startswith("  bf16")]
    assert ["bf16", "fwd", "no", "17-256", "1", "0.800", "0.800"] in kinds
    assert ["bf16", "fwd", "yes", ">=2048", "1", "1.200", "1.200"] in kinds
    r = run(write(tmp_path, rows), "--stat", "median", "--lowest", "0")
    assert "geomean 0.901, 1 below 0.95, lowest 0.677" in r.stdout  # median 11 / 16.25 = 0.677, and 1.2


def test_variants_compared_on_common_shapes(tmp_path):
    rows = [row("cublas", 10.0), row("weave", 20.0, variant="old"), row("weave", 10.0, variant="new"),
            row("cublas", 10.0, M=512), row("weave", 10.0, M=512, variant="new")]  # only "new" ran M = 512
    r = run(write(tmp_path, rows), "--by", "variant", "--lowest", "0")
    assert r.returncode == 0, r.stderr
    lines = first_lines(r, "variant = ")
    assert lines[0].startswith("variant = old: 1 rows, geomean 0.500"), r.stdout
    assert lines[1].startswith("variant = new: 1 rows, geomean 1.000"), r.stdout
    assert "  0.500  256x4096x4096 nk" in r.stdout and r.stdout.rstrip().endswith("0.500"), r.stdout


def test_an_incorrect_row_fails_the_report(tmp_path):
    r = run(write(tmp_path, [row("cublas", 10.0), row("weave", 9.0, correct=False, seed="7")]))
    assert r.returncode == 1 and "1 incorrect row(s)" in r.stderr and "seed 7" in r.stderr, r.stderr


def test_bad_input_is_a_clear_error(tmp_path):
    r = run(str(tmp_path / "missing.jsonl"))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    r = run(write(tmp_path, [row("cublas", 10.0)]))
    assert r.returncode == 2 and "no weave rows" in r.stderr, r.stderr
    p = tmp_path / "bad.jsonl"
    p.write_text('{"impl": \n')
    r = run(str(p))
    assert r.returncode != 0 and "not JSON" in r.stderr and "Traceback" not in r.stderr, r.stderr
