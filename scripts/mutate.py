#!/usr/bin/env python3
"""Injected-fault (mutation) check: do weave's tests and benchmark checks catch realistic bugs?

For each fault of tests/mutation/faults.py (a small source edit: file, a snippet that must occur
exactly once, its replacement, and the CTest tests / weave-bench commands expected to catch it)
this script, in a copy of the tree
(never the repo itself):
  applies the fault, rebuilds only the targets the checks need (one shared build dir, built
  incrementally), runs each listed test (ctest -R '^name$') and bench command (build/bin/weave-run
  -n N -- build/bin/weave-bench ARGS --json F), restores the file,
and records per check: failed (caught it) / passed (missed it) / skipped (could not run here, e.g.
a gpu2 test on a one-GPU machine) / error, and per fault: caught / MISSED / skipped / build-error.
It first runs every listed check on the unfaulted tree (the baseline; a check failing there
cannot catch anything), and at the end rebuilds the restored tree. Output: a Markdown table on
stdout and JSON lines (--json, default WORK/mutate.jsonl). Exit status: 0 when every fault that
could run was caught, 1 when one was missed or failed to build (or a check failed at baseline),
2 for a fault whose snippet does not occur exactly once in the repo (checked for every selected
fault before anything else) or bad usage.

  python3 scripts/mutate.py --list
  python3 scripts/mutate.py --dry-run [--skip-build]   # every fault applies (and compiles)
  python3 scripts/mutate.py [--only a,b] [--jobs 16]    # the real run, on a GPU machine
  WEAVE_SHARE_GPUS=1 python3 scripts/mutate.py ...      # one GPU: multi-rank checks with ranks sharing it
                                                        # (races left out; tp / collectives benches
                                                        # without their NCCL rows)

Two-phase use, where GPU time is short: build every faulted binary on any machine with
--stash DIR (no tests run), then on the GPU machine run the tests from those binaries with
--from-stash DIR (nothing is compiled there; the build dir is only configured; a check whose
binaries the stash did not build with the fault is not run). --checks bench|tests keeps one kind
of check (a stash of weave-bench alone is a fraction of one with the tests). --pack-stash DIR packs
a stash into DIR.tar.xz, its copies of each binary deduplicated (a tenth of the size or less), which
--from-stash DIR unpacks where DIR is missing. The copy lives
in --work-dir (default REPO/build-mutate, git-ignored): its sources in WORK/tree (tracked and
untracked-but-not-ignored files of the repo, or --rev REV's committed tree; re-synced each run),
its build in --build-dir (default WORK/build). Python 3 standard library only; no network.
Adding faults: tests/mutation/README.md.
"""

import argparse
import atexit
import fcntl
import hashlib
import importlib.util
import io
import json
import lzma
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time

REPO_DEFAULT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAME_RE = re.compile(r"^[a-z0-9_]+$")


def die(msg, code=2):
    print(f"mutate: {msg}", file=sys.stderr)
    sys.exit(code)


def log(msg):
    print(f"mutate: {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# The fault list


def load_faults(path):
    sys.dont_write_bytecode = True  # no __pycache__ beside the fault list
    spec = importlib.util.spec_from_file_location("weave_mutation_faults", path)
    if spec is None:
        die(f"cannot load {path}")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    faults = getattr(mod, "FAULTS", None)
    if not isinstance(faults, list) or not faults:
        die(f"{path}: no FAULTS list")
    seen = set()
    for f in faults:
        name = f.get("name", "")
        if not NAME_RE.match(name) or name in seen:
            die(f"{path}: bad or duplicate fault name {name!r}")
        seen.add(name)
        if not f.get("what"):
            die(f"{name}: no 'what'")
        if not f.get("edits"):
            die(f"{name}: no 'edits'")
        for e in f["edits"]:
            if not e.get("file") or not e.get("find") or "replace" not in e or e["find"] == e["replace"]:
                die(f"{name}: an edit needs 'file', a non-empty 'find' and a different 'replace'")
        if not f.get("tests") and not f.get("bench"):
            die(f"{name}: no test or bench expected to catch it")
        f.setdefault("tests", [])
        f.setdefault("bench", [])
        f.setdefault("repeat", 1)
        f.setdefault("targets", [])
        for b in f["bench"]:
            if not isinstance(b.get("ranks"), int) or b["ranks"] < 1 or not b.get("args"):
                die(f"{name}: a bench entry needs 'ranks' >= 1 and 'args'")
    return faults


def select_checks(faults, which):
    """Only the tests (`tests`) or only the bench rows (`bench`) of each fault: a call that can
    afford one kind (the bench rows that need two GPUs, from a stash that holds weave-bench alone).
    Faults left with no check are dropped."""
    if which == "all":
        return faults
    out = []
    for f in faults:
        g = dict(f, tests=f["tests"] if which == "tests" else [], bench=f["bench"] if which == "bench" else [])
        if g["tests"] or g["bench"]:
            out.append(g)
        else:
            log(f"no {which} check: {f['name']} left out")
    return out


# Ranks that share one GPU (WEAVE_SHARE_GPUS=1, weave-run --share-gpus) take turns on it: they
# never run side by side, so a race between them cannot show. NCCL refuses two ranks on one GPU:
# the tests that compare with NCCL recompute their reference then (tests/collectives/common.hpp,
# `reference`), and the tp and collectives benchmarks leave their NCCL rows out and check weave's
# (tools/weave-bench/shared_gpu.hpp), so every test and bench row runs.


def gpus_shared():
    return os.environ.get("WEAVE_SHARE_GPUS") == "1"


def not_run_record(f, why):
    return {"fault": f["name"], "what": f["what"], "edits": [{"file": e["file"]} for e in f["edits"]],
            "expected": f["tests"] + [bench_key(b) for b in f["bench"]], "checks": {}, "verdict": "not run",
            "why": why}


def for_shared_gpus(faults):
    """(faults whose checks can run with ranks sharing a GPU; records for the faults that cannot:
    the races)."""
    runnable, not_run = [], []
    for f in faults:
        if f.get("race"):
            not_run.append(not_run_record(f, "a race: ranks sharing one GPU take turns, so they cannot race"))
        else:
            runnable.append(f)
    return runnable, not_run


def apply_edits(root, fault):
    """Applies the fault under root; returns {path: original bytes}. Raises ValueError if a
    snippet does not occur exactly once (nothing is left changed then)."""
    originals, texts = {}, {}
    for e in fault["edits"]:
        p = os.path.join(root, e["file"])
        if p not in texts:
            if not os.path.isfile(p):
                raise ValueError(f"{e['file']}: no such file")
            with open(p, "rb") as fh:
                originals[p] = (fh.read(), os.stat(p))
            texts[p] = originals[p][0].decode("utf-8")
        n = texts[p].count(e["find"])
        if n != 1:
            first = e["find"].strip().splitlines()[0][:70]
            raise ValueError(f"{e['file']}: snippet occurs {n} times, must be once: {first!r}")
        texts[p] = texts[p].replace(e["find"], e["replace"])
    for p, t in texts.items():
        with open(p, "wb") as fh:
            fh.write(t.encode("utf-8"))
    return originals


def restore(originals, keep_mtime=False):
    """Writes the faulted files back. keep_mtime (nothing was built from the faulted files) also
    puts back their times, so that the next build rebuilds nothing for them; after a build it must
    not: the objects are the fault's, newer than the file."""
    for p, (data, st) in originals.items():
        with open(p, "wb") as fh:
            fh.write(data)
        if keep_mtime:
            os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))


def check_faults_apply(src, faults):
    """Every selected fault's snippets occur exactly once in the source files (read only)."""
    bad = []
    for f in faults:
        texts = {}
        for e in f["edits"]:
            try:
                if e["file"] not in texts:
                    texts[e["file"]] = src.text(e["file"])
            except (OSError, UnicodeDecodeError) as err:
                bad.append(f"{f['name']}: {e['file']}: cannot read ({err})")
                continue
            n = texts[e["file"]].count(e["find"])
            if n != 1:
                first = e["find"].strip().splitlines()[0][:70]
                bad.append(f"{f['name']}: {e['file']}: snippet occurs {n} times, must be once: {first!r}")
            else:
                texts[e["file"]] = texts[e["file"]].replace(e["find"], e["replace"])
    return bad


# ---------------------------------------------------------------------------------------------
# The copy of the tree


class Source:
    """The files the copy is made of: the repo's working tree (tracked files and untracked ones
    git does not ignore; every file but build dirs where there is no git), or with `rev` a
    committed tree (git archive), as {relative path: (bytes, mode)} read on demand."""

    def __init__(self, repo, rev=None, exclude=None):
        self.repo, self.rev = repo, rev
        self.blobs = {}
        if rev:
            p = subprocess.run(["git", "-C", repo, "archive", "--format=tar", rev], capture_output=True)
            if p.returncode != 0:
                die(f"git archive {rev} failed: {p.stderr.decode(errors='replace').strip()}")
            with tarfile.open(fileobj=io.BytesIO(p.stdout)) as tf:
                for m in tf.getmembers():
                    if m.isfile():
                        self.blobs[os.path.normpath(m.name)] = (tf.extractfile(m).read(), m.mode)
            self.files = sorted(self.blobs)
        else:
            self.files = self._worktree_files()
        if exclude:
            self.files = [f for f in self.files if not (f == exclude or f.startswith(exclude + os.sep))]

    def _worktree_files(self):
        repo = self.repo
        if os.path.exists(os.path.join(repo, ".git")):
            out = subprocess.run(["git", "-C", repo, "ls-files", "-z", "-co", "--exclude-standard"],
                                 capture_output=True, check=False)
            if out.returncode == 0:
                files = [x for x in out.stdout.decode("utf-8", "surrogateescape").split("\0") if x]
                return sorted({os.path.normpath(f) for f in files if os.path.isfile(os.path.join(repo, f))})
        files = []
        for d, dirs, names in os.walk(repo):
            rel = os.path.relpath(d, repo)
            dirs[:] = [x for x in dirs if not (x.startswith(".") or (rel == "." and (x == "build" or x.startswith("build-"))))]
            files += [os.path.normpath(os.path.join(rel, n)) for n in names]
        return sorted(files)

    def read(self, rel):
        rel = os.path.normpath(rel)
        if self.rev:
            if rel not in self.blobs:
                raise FileNotFoundError(rel)
            return self.blobs[rel]
        p = os.path.join(self.repo, rel)
        with open(p, "rb") as fh:
            return fh.read(), os.stat(p).st_mode

    def text(self, rel):
        return self.read(rel)[0].decode("utf-8")


def sync_tree(src, tree):
    """Mirrors the sources into tree: changed files get a new mtime (so the build sees them),
    unchanged ones keep theirs (so it rebuilds nothing)."""
    keep = set(src.files)
    changed = 0
    for f in src.files:
        data, mode = src.read(f)
        dst = os.path.join(tree, f)
        if os.path.isfile(dst) and not os.path.islink(dst):
            with open(dst, "rb") as fh:
                if fh.read() == data:
                    continue
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        with open(dst, "wb") as fh:
            fh.write(data)
        os.chmod(dst, mode & 0o777)
        changed += 1
    removed = 0
    for d, _, names in os.walk(tree):
        for n in names:
            rel = os.path.relpath(os.path.join(d, n), tree)
            if rel not in keep:
                os.remove(os.path.join(d, n))
                removed += 1
    return len(src.files), changed, removed


# ---------------------------------------------------------------------------------------------
# Building


def cuda_env():
    env = dict(os.environ)
    if os.path.isdir("/usr/local/cuda/bin"):
        env["PATH"] = "/usr/local/cuda/bin" + os.pathsep + env.get("PATH", "")
    return env


def run_group(cmd, timeout=None, **kw):
    """subprocess.run in a session of its own: past `timeout` the whole process group (ctest, the
    test, weave-run's ranks) is ended, not only `cmd`. Returns (returncode or 124, stdout, stderr)."""
    p = subprocess.Popen(cmd, start_new_session=True, **kw)

    def end_group():
        out = err = None
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                break
            try:
                out, err = p.communicate(timeout=5)
                break
            except subprocess.TimeoutExpired:
                pass
        return out, err

    try:
        out, err = p.communicate(timeout=timeout)
        return p.returncode, out, err
    except subprocess.TimeoutExpired:
        out, err = end_group()
        return 124, out, err
    except BaseException:  # this run ended (a TERM, ^C): its session would outlive it, holding the GPU
        end_group()
        raise


def run_logged(cmd, logf, env=None, cwd=None, timeout=None):
    logf.write(f"$ {' '.join(cmd)}\n")
    logf.flush()
    rc, _, _ = run_group(cmd, timeout, stdout=logf, stderr=subprocess.STDOUT, env=env, cwd=cwd)
    if rc == 124 and timeout is not None:
        logf.write(f"mutate: timed out after {timeout} s (its process group ended)\n")
    return rc


def configure(tree, build, args, logf):
    cache = os.path.join(build, "CMakeCache.txt")
    if os.path.isfile(cache):
        with open(cache, encoding="utf-8", errors="replace") as fh:
            m = re.search(r"^CMAKE_HOME_DIRECTORY:INTERNAL=(.*)$", fh.read(), re.M)
        if m and os.path.realpath(m.group(1)) != os.path.realpath(tree):
            die(f"{build} is configured for {m.group(1)}, not the copy {tree}: pick another --build-dir")
        # Regenerate: tests added to the tree since the first run must be in the CTest files, which
        # are read before anything is built (a build would regenerate them only afterwards).
        log(f"regenerating {build}")
        if run_logged(["cmake", "-S", tree, "-B", build], logf, env=cuda_env()) != 0:
            die(f"cmake regenerate failed (log: {logf.name})", 1)
        return
    env = cuda_env()
    cmd = ["cmake", "-S", tree, "-B", build, "-DCMAKE_BUILD_TYPE=Release"]
    nvcc = shutil.which("nvcc", path=env["PATH"])
    if nvcc:
        cmd.append(f"-DCMAKE_CUDA_COMPILER={nvcc}")
    if shutil.which("ninja", path=env["PATH"]):
        cmd += ["-G", "Ninja"]
    cmd += args.cmake_arg
    log(f"configuring {build}")
    if run_logged(cmd, logf, env=env) != 0:
        die(f"cmake configure failed (log: {logf.name})", 1)


def build_targets(build, targets, jobs, logf):
    if not targets:
        return 0
    cmd = ["cmake", "--build", build, "-j", str(jobs), "--target"] + sorted(targets)
    return run_logged(cmd, logf, env=cuda_env())


def ctest_commands(build):
    """{test name: [argv]} from the CTestTestfile.cmake files (CTest's own JSON leaves out the
    command of a test whose executable is not built yet)."""
    out = {}
    add = re.compile(r'^\s*add_test\((?:\[=*\[(.+?)\]=*\]|"([^"]+)"|(\S+))\s+(.*)\)\s*$')
    for d, _, names in os.walk(build):
        if "CTestTestfile.cmake" not in names:
            continue
        with open(os.path.join(d, "CTestTestfile.cmake"), encoding="utf-8", errors="replace") as fh:
            for line in fh:
                m = add.match(line)
                if m:
                    name = m.group(1) or m.group(2) or m.group(3)
                    argv = [a if a else b for a, b in re.findall(r'"((?:[^"\\]|\\.)*)"|(\S+)', m.group(4))]
                    out[name] = argv
    if not out:
        die(f"no CTest tests found in {build}", 1)
    return out


def targets_of(fault, tests_cmd, build):
    """CMake targets the fault's checks run: the executables in build/bin named by the tests'
    commands (a target's binary there has the target's name), weave-run and weave-bench for
    benches, plus the fault's extra targets."""
    bindir = os.path.realpath(os.path.join(build, "bin"))
    t = set(fault["targets"])
    for spec in fault["tests"]:
        for arg in tests_cmd.get(spec.partition(":")[0], []):
            if os.path.dirname(os.path.realpath(arg)) == bindir:
                t.add(os.path.basename(arg))
    if fault["bench"]:
        t |= {"weave-run", "weave-bench"}
    return t


# ---------------------------------------------------------------------------------------------
# Running checks

CTEST_LINE = re.compile(r"Test\s+#\d+:\s+(\S+)\s+\.*\s*(\*\*\*)?([A-Za-z][A-Za-z ()]*?)\s+[0-9.]+\s+sec")


def run_test(build, spec, logf, timeout=None):
    """passed / failed / skipped / error (not found, not run). `spec` is a CTest name, optionally
    followed by ':' and a GoogleTest filter (GTEST_FILTER) that narrows the run to the tests that
    exercise the fault (a multi-rank suite with ranks sharing one GPU runs minutes otherwise)."""
    name, _, gfilter = spec.partition(":")
    cmd = ["ctest", "--test-dir", build, "-R", f"^{re.escape(name)}$", "--output-on-failure"]
    env = dict(os.environ)
    if gfilter:
        env["GTEST_FILTER"] = gfilter
    logf.write(f"$ {'GTEST_FILTER=' + gfilter + ' ' if gfilter else ''}{' '.join(cmd)}\n")
    logf.flush()
    rc, out, err = run_group(cmd, timeout, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace",
                             env=env)
    out, err = out or "", err or ""
    logf.write(out + err)
    if rc == 124 and timeout is not None:
        logf.write(f"mutate: {spec} stopped after {timeout} s (--test-timeout; its process group ended)\n")
        logf.flush()
        return "failed"  # a check that hangs under the fault has caught it (unfaulted, the baseline says)
    logf.flush()
    for m in CTEST_LINE.finditer(out):
        if m.group(1) != name:
            continue
        s = m.group(3).strip()
        if s == "Passed":
            return "passed"
        if s.startswith("Skipped"):
            return "skipped"
        if s.startswith("Not Run"):
            return "error"
        return "failed"  # Failed, Timeout, Exception: ..., SegFault, ...
    if "No tests were found" in out + err:
        return "error"
    return "failed" if rc != 0 else "error"


_gpu_count = None


def gpu_count(build):
    global _gpu_count
    if _gpu_count is None:
        wr = os.path.join(build, "bin", "weave-run")
        try:
            p = subprocess.run([wr, "--count-gpus"], capture_output=True, text=True, timeout=60)
            _gpu_count = int(p.stdout.strip().split()[-1]) if p.returncode == 0 and p.stdout.strip() else 0
        except (OSError, ValueError, subprocess.TimeoutExpired, IndexError):
            _gpu_count = 0
    return _gpu_count


def run_bench(build, b, logf, timeout):
    """passed / failed / skipped / error, and the number of rows with "correct": false. With fewer
    GPUs than ranks and WEAVE_SHARE_GPUS=1 the ranks share them (the rows' times mean nothing
    then, their `correct` field does; the tp and collectives suites then leave their NCCL rows out)."""
    share = []
    if gpu_count(build) < b["ranks"]:
        why = ("no GPU" if gpu_count(build) < 1
               else "WEAVE_SHARE_GPUS=1 would let its ranks share them" if not gpus_shared() else None)
        if why:
            logf.write(f"mutate: bench '{b['args']}' needs {b['ranks']} GPU(s), {gpu_count(build)} here ({why}): "
                       "skipped\n")
            return "skipped", 0
        share = ["--share-gpus"]
    fd, jpath = tempfile.mkstemp(prefix="mutate-bench-", suffix=".json")
    os.close(fd)
    os.remove(jpath)
    try:
        cmd = [os.path.join(build, "bin", "weave-run"), "-n", str(b["ranks"])] + share + ["--",
               os.path.join(build, "bin", "weave-bench")] + b["args"].split() + ["--json", jpath]
        rc = run_logged(cmd, logf, timeout=timeout)
        wrong = 0
        rows = 0
        if os.path.isfile(jpath):
            with open(jpath, encoding="utf-8", errors="replace") as fh:
                for line in fh:
                    line = line.strip()
                    if not line:
                        continue
                    try:
                        row = json.loads(line)
                    except json.JSONDecodeError:
                        continue
                    rows += 1
                    if row.get("correct") is False:
                        wrong += 1
        logf.write(f"mutate: bench exit {rc}, {rows} JSON rows, {wrong} with correct=false\n")
        if rc != 0 or wrong:
            return "failed", wrong
        return ("passed" if rows else "error"), 0
    finally:
        if os.path.exists(jpath):
            os.remove(jpath)


def bench_key(b):
    return f"bench[{b['ranks']}]: {b['args']}"


def run_checks(fault, build, logf, timeout, baseline=None, test_timeout=None):
    """{check: status}. With `repeat` > 1 the checks that passed run again, until one fails."""
    res = {}
    checks = [(t, None) for t in fault["tests"]] + [(bench_key(b), b) for b in fault["bench"]]
    for attempt in range(max(1, fault["repeat"])):
        for key, b in checks:
            if attempt > 0 and res.get(key) != "passed":
                continue
            b0 = baseline.get(key) if baseline is not None else None
            if b0 not in ("passed", None):
                res[key] = "skipped" if b0 == "skipped" else "baseline-" + b0
                continue
            res[key] = run_test(build, key, logf, test_timeout) if b is None else run_bench(build, b, logf, timeout)[0]
        if any(v == "failed" for v in res.values()) or not any(v == "passed" for v in res.values()):
            break
        if attempt + 1 < fault["repeat"]:
            logf.write(f"mutate: not caught on attempt {attempt + 1}, repeating\n")
    return res


def verdict(res):
    vals = list(res.values())
    if any(v == "failed" for v in vals):
        return "caught"
    if any(v == "passed" for v in vals):
        return "MISSED"
    if vals and all(v == "skipped" for v in vals):
        return "skipped"
    if any(v.startswith("baseline-") for v in vals) and not any(v == "error" for v in vals):
        return "invalid"  # every check that could run already fails without the fault
    return "error"


# ---------------------------------------------------------------------------------------------
# Stash (two-phase use): faulted binaries built here, tests run elsewhere


def file_hash(p):
    h = hashlib.sha256()
    with open(p, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def stash_bins(build, targets, dest, base_hashes=None):
    """xz copies of build/bin/<target> into dest; with base_hashes, only those that differ."""
    os.makedirs(dest, exist_ok=True)
    stored = {}
    for t in sorted(targets):
        p = os.path.join(build, "bin", t)
        if not os.path.isfile(p):
            continue
        h = file_hash(p)
        if base_hashes is not None and base_hashes.get(t) == h:
            continue
        with open(p, "rb") as src, lzma.open(os.path.join(dest, t + ".xz"), "wb", preset=6) as dst:
            shutil.copyfileobj(src, dst)
        stored[t] = h
    return stored


def unstash_bins(src, build, names):
    """The stashed binaries into build/bin: each as stash_bins wrote it (.xz), or as an unpacked
    packed stash holds it (plain)."""
    for t in names:
        dst = os.path.join(build, "bin", t)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        tmp = dst + ".mutate-tmp"
        plain = os.path.join(src, t)
        with (open(plain, "rb") if os.path.isfile(plain) else lzma.open(plain + ".xz", "rb")) as fh, \
                open(tmp, "wb") as out:
            shutil.copyfileobj(fh, out)
        os.chmod(tmp, 0o755)
        os.replace(tmp, dst)


def keep_build_bins(build, names, backup):
    """Copies build/bin/<name> (those there) into backup and returns a function that puts them back
    and removes the names that were not there: a --from-stash run leaves the build's binaries as it
    found them, not the stash's (which a later run of the build's own tests would take for its own)."""
    if os.path.isdir(backup) and os.listdir(backup):
        # A run before this one was killed (KILL) with the stash's binaries in place: these are the
        # build's own; put them back before saving anything.
        for t in os.listdir(backup):
            shutil.copy2(os.path.join(backup, t), os.path.join(build, "bin", t + ".mutate-tmp"))
            os.replace(os.path.join(build, "bin", t + ".mutate-tmp"), os.path.join(build, "bin", t))
        log(f"put back the build's binaries that a killed run left in {backup}")
    shutil.rmtree(backup, ignore_errors=True)
    os.makedirs(backup)
    had = []
    for t in names:
        p = os.path.join(build, "bin", t)
        if os.path.isfile(p):
            shutil.copy2(p, os.path.join(backup, t))
            had.append(t)

    def put_back():
        for t in names:
            p = os.path.join(build, "bin", t)
            if t in had:
                shutil.copy2(os.path.join(backup, t), p + ".mutate-tmp")
                os.replace(p + ".mutate-tmp", p)
            elif os.path.isfile(p):
                os.remove(p)
        shutil.rmtree(backup, ignore_errors=True)
    return put_back


# A packed stash (--pack-stash): one .tar.xz whose binaries are stored uncompressed inside one xz
# stream with a dictionary larger than a binary. The faults' copies of a binary differ in a few
# objects, so each copy after the first costs little more than its differences (eleven weave-bench
# copies: 31 MB as the stash's separate .xz files, 3.2 MB packed): several stashes then fit in what
# the device tool carries (64 MiB with the repository). Unpacking needs about the dictionary's size
# of memory.
PACK_FILTERS = [{"id": lzma.FILTER_LZMA2, "preset": 6, "dict_size": 768 << 20}]


def pack_stash(sdir):
    """DIR -> DIR.tar.xz (members under DIR's name); returns its path."""
    sdir = os.path.realpath(sdir)
    if not os.path.isfile(os.path.join(sdir, "manifest.json")):
        die(f"{sdir} is not a stash (no manifest.json; mutate.py --stash builds one)")
    name, out = os.path.basename(sdir), sdir + ".tar.xz"
    tmp = out + ".mutate-tmp"
    with lzma.open(tmp, "wb", format=lzma.FORMAT_XZ, filters=PACK_FILTERS) as xz, \
            tarfile.open(fileobj=xz, mode="w|") as tar:
        for d, dirs, files in os.walk(sdir):
            dirs.sort()  # _baseline first: every fault's copy follows the copy it differs from least
            for f in sorted(files):
                p = os.path.join(d, f)
                arc = os.path.join(name, os.path.relpath(p, sdir))
                if not f.endswith(".xz"):
                    tar.add(p, arc)
                    continue
                with lzma.open(p, "rb") as fh:
                    data = fh.read()
                info = tarfile.TarInfo(arc[:-len(".xz")])
                info.size, info.mode, info.mtime = len(data), 0o755, int(os.path.getmtime(p))
                tar.addfile(info, io.BytesIO(data))
    os.replace(tmp, out)
    return out


def unpack_stash(arg):
    """--from-stash's directory: ARG (or ARG without .tar.xz), unpacked from ARG.tar.xz when that
    is there and newer than the directory's manifest (a stash packed again under the same name on
    a machine that kept the old one). Unpacked into a temporary directory, then renamed: a killed
    unpack leaves no stash that looks whole."""
    sdir = os.path.realpath(arg[:-len(".tar.xz")] if arg.endswith(".tar.xz") else arg)
    packed, manifest = sdir + ".tar.xz", os.path.join(sdir, "manifest.json")
    if not os.path.isfile(packed) or (os.path.isfile(manifest)
                                      and os.path.getmtime(manifest) >= os.path.getmtime(packed)):
        return sdir
    name, parent = os.path.basename(sdir), os.path.dirname(sdir)
    tmp = os.path.join(parent, f".{name}.unpacking")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    with tarfile.open(packed, "r:xz") as tar:
        members = tar.getmembers()
        bad = [m.name for m in members if m.name.split("/")[0] != name or ".." in m.name.split("/")
               or not (m.isfile() or m.isdir())]
        if bad:
            die(f"{packed}: members outside {name}/ or not plain files: {', '.join(bad[:3])}")
        tar.extractall(tmp, members)
    os.utime(os.path.join(tmp, name, "manifest.json"))  # newer than the packed file from now on
    shutil.rmtree(sdir, ignore_errors=True)
    os.replace(os.path.join(tmp, name), sdir)
    shutil.rmtree(tmp, ignore_errors=True)
    log(f"unpacked {packed}")
    return sdir


def fault_digest(f):
    return hashlib.sha256(json.dumps(f["edits"], sort_keys=True).encode()).hexdigest()[:16]


def stash_checks(f, entry, tests_cmd, build):
    """The fault with only the checks whose binaries its stash entry was built with ("targets");
    the others, in "dropped": run on the carried, unfaulted binaries they would pass and read as a
    miss. A stash from before entries named their targets was built for the checks faults.py had
    then: its tests are taken as built, its bench rows only where the entry holds a faulted
    weave-bench (a row added to faults.py since found none built)."""
    built = entry.get("targets")
    gone = " (not in the stash: rebuild it with this check)"
    tests, bench, dropped = [], [], list(f.get("dropped", []))
    for t in f["tests"]:
        need = targets_of({"tests": [t], "bench": [], "targets": []}, tests_cmd, build)
        if built is None or need <= set(built):
            tests.append(t)
        else:
            dropped.append(t + gone)
    for b in f["bench"]:
        if ("weave-bench" in entry.get("bins", [])) if built is None else {"weave-run", "weave-bench"} <= set(built):
            bench.append(b)
        else:
            dropped.append(bench_key(b) + gone)
    return dict(f, tests=tests, bench=bench, dropped=dropped)


# ---------------------------------------------------------------------------------------------
# Reporting


def md_table(rows):
    out = ["| fault | file | caught by | missed by | skipped / not run | verdict |", "|---|---|---|---|---|---|"]
    for r in rows:
        res = r.get("checks", {})
        caught = [k for k, v in res.items() if v == "failed"]
        missed = [k for k, v in res.items() if v == "passed"]
        other = [f"{k} ({v})" for k, v in res.items() if v not in ("failed", "passed")]
        other += [f"{d}: not run" for d in r.get("not_run", [])]
        if r.get("why"):
            other.append(r["why"])
        files = ", ".join(sorted({e["file"] for e in r["edits"]}))
        out.append(f"| {r['fault']} | {files} | {', '.join(caught) or '-'} | {', '.join(missed) or '-'} | "
                   f"{', '.join(other) or '-'} | {r['verdict']} |")
    return "\n".join(out)


def check_readme(repo, faults, bad):
    """The catalogue and its README agree: every fault's edits apply exactly once, every fault has
    one row in the results table (`| name |`), no row names a fault that is gone, and the
    "All N faults" count is len(faults). Prints each disagreement; 0 when there is none."""
    readme = os.path.join(repo, "tests", "mutation", "README.md")
    with open(readme, encoding="utf-8") as fh:
        text = fh.read()
    rows = re.findall(r"^\| ([a-z0-9_]+) \|", text, flags=re.M)
    names = [f["name"] for f in faults]
    problems = [f"edit does not apply exactly once: {b}" for b in bad]
    problems += [f"no row in the README's table: {n}" for n in names if rows.count(n) == 0]
    problems += [f"{rows.count(n)} rows in the README's table: {n}" for n in names if rows.count(n) > 1]
    problems += [f"a README row names no fault of faults.py: {r}" for r in sorted(set(rows) - set(names))
                 if r != "fault"]
    counts = re.findall(r"All (\d+) faults of `faults.py`", text)
    if counts != [str(len(names))]:
        problems.append(f"the README says All {counts or '?'} faults, faults.py has {len(names)}")
    for p in problems:
        print(f"mutate: {p}", file=sys.stderr)
    print(f"mutate: {len(names)} faults, {len(problems)} disagreement(s) with {os.path.relpath(readme, repo)}")
    return 1 if problems else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo", default=REPO_DEFAULT, help="the weave checkout (default: this script's repo)")
    ap.add_argument("--faults", help="fault list (default REPO/tests/mutation/faults.py)")
    ap.add_argument("--work-dir", help="where the copy lives (default REPO/build-mutate)")
    ap.add_argument("--build-dir", help="the copy's build dir (default WORK/build)")
    ap.add_argument("--jobs", "-j", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--only", help="comma-separated fault names (default: every fault; with --from-stash, the "
                    "stash's)")
    ap.add_argument("--rev", help="copy this git revision (e.g. HEAD) instead of the working tree with its "
                    "uncommitted changes")
    ap.add_argument("--list", action="store_true", help="list the faults and whether each applies, then exit")
    ap.add_argument("--check-readme", action="store_true",
                    help="check that every fault applies exactly once and has exactly one row in "
                         "tests/mutation/README.md's table, whose fault count is right; then exit (CTest)")
    ap.add_argument("--dry-run", action="store_true",
                    help="apply each fault to the copy and compile its targets; run nothing")
    ap.add_argument("--skip-build", action="store_true",
                    help="with --dry-run: only check that every fault applies exactly once (no compile)")
    ap.add_argument("--no-baseline", action="store_true", help="do not run the checks on the unfaulted tree first")
    ap.add_argument("--stash", metavar="DIR", help="build every fault's binaries into DIR; run no check")
    ap.add_argument("--checks", choices=("all", "tests", "bench"), default="all",
                    help="run (or, with --stash, build for) only the CTest checks or only the bench rows "
                         "(default all); faults with none of that kind are left out")
    ap.add_argument("--from-stash", metavar="DIR", help="run the checks with the binaries in DIR (or DIR.tar.xz, "
                    "unpacked next to it); compile nothing")
    ap.add_argument("--pack-stash", metavar="DIR", help="pack the stash DIR into DIR.tar.xz (its copies of a binary "
                    "deduplicated by one large xz dictionary), then exit")
    ap.add_argument("--json", help="JSON lines output (default WORK/mutate.jsonl)")
    ap.add_argument("--bench-timeout", type=int, default=900, help="seconds per bench command (default 900)")
    ap.add_argument("--test-timeout", type=int, default=None,
                    help="seconds per CTest check, its process group ended past it and the check counted "
                         "failed (default: the tests' own CTest TIMEOUT)")
    ap.add_argument("--cmake-arg", action="append", default=[], help="extra configure argument (repeatable)")
    args = ap.parse_args()
    if args.pack_stash:
        out = pack_stash(args.pack_stash)
        log(f"packed {out}: {os.path.getsize(out) / 1e6:.1f} MB")
        return 0

    repo = os.path.realpath(args.repo)
    faults_path = args.faults or os.path.join(repo, "tests", "mutation", "faults.py")
    faults = load_faults(faults_path)
    if args.only:
        want = [x.strip() for x in args.only.split(",") if x.strip()]
        names = {f["name"] for f in faults}
        unknown = [w for w in want if w not in names]
        if unknown:
            die(f"unknown fault(s): {', '.join(unknown)} (--list shows them)")
        faults = [f for f in faults if f["name"] in want]
    elif args.from_stash:  # the stash's faults, not every fault of the list
        args.from_stash = unpack_stash(args.from_stash)
        with open(os.path.join(args.from_stash, "manifest.json"), encoding="utf-8") as fh:
            stashed = json.load(fh)["faults"]
        faults = [f for f in faults if f["name"] in stashed]
    if args.skip_build and not args.dry_run:
        die("--skip-build only goes with --dry-run (a real run must build each fault)")
    if args.stash and args.from_stash:
        die("--stash builds, --from-stash runs: one at a time")
    if args.dry_run and (args.stash or args.from_stash):
        die("--dry-run goes with neither --stash nor --from-stash")

    if not args.check_readme:
        faults = select_checks(faults, args.checks)
        if not faults:
            die(f"no selected fault has a {args.checks} check")
    not_run = []
    if gpus_shared() and not (args.stash or args.dry_run or args.list or args.check_readme):
        faults, not_run = for_shared_gpus(faults)
        for r in not_run:
            log(f"not run with ranks sharing a GPU: {r['fault']} ({r['why']})")

    work = os.path.realpath(args.work_dir or os.path.join(repo, "build-mutate"))
    work_rel = os.path.relpath(work, repo)
    src = Source(repo, args.rev, None if work_rel.startswith("..") else work_rel)
    bad = check_faults_apply(src, faults)
    if args.check_readme:
        return check_readme(repo, faults, bad)
    if args.list:
        badset = {b.split(":")[0] for b in bad}
        for f in faults:
            files = ", ".join(sorted({e["file"] for e in f["edits"]}))
            checks = f["tests"] + [bench_key(b) for b in f["bench"]]
            print(f"{f['name']:48s} {'BROKEN' if f['name'] in badset else 'applies':8s} {files}\n"
                  f"    {f['what']}\n    expected catchers: {', '.join(checks)}"
                  + (f"\n    repeat: {f['repeat']}" if f["repeat"] > 1 else ""))
        for b in bad:
            print(f"BROKEN {b}", file=sys.stderr)
        return 2 if bad else 0
    if bad:
        for b in bad:
            print(f"mutate: BROKEN FAULT {b}", file=sys.stderr)
        die(f"{len(bad)} fault edit(s) do not apply exactly once to {repo}{' at ' + args.rev if args.rev else ''}: "
            "update tests/mutation/faults.py")

    tree = os.path.join(work, "tree")
    build = os.path.realpath(args.build_dir or os.path.join(work, "build"))
    logdir = os.path.join(work, "logs")
    os.makedirs(tree, exist_ok=True)
    os.makedirs(logdir, exist_ok=True)
    # One run per work dir: a second one would copy the tree over the first one's applied fault
    # while it builds or runs (held until this process exits).
    lock = open(os.path.join(work, ".lock"), "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        die(f"another mutate.py is using {work} (its tree and build); wait for it, or pass --work-dir")
    nfiles, changed, removed = sync_tree(src, tree)
    log(f"copy {tree}: {nfiles} files ({changed} updated, {removed} removed)")
    jsonl = args.json or os.path.join(work, "mutate.jsonl")
    need_build = not (args.dry_run and args.skip_build)
    mainlog = open(os.path.join(logdir, "mutate.log"), "a", encoding="utf-8")
    mainlog.write(f"\n==== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(sys.argv)}\n")

    tests_cmd, fault_targets = {}, {}
    if need_build or args.from_stash:
        if args.from_stash and os.path.exists(os.path.join(build, "CTestTestfile.cmake")):
            # A build carried to a GPU machine (scripts/pack-build.sh) may have no CMake or
            # GoogleTest to configure with there; its CTest files are all the checks need.
            log(f"using the configured build {build}")
        else:
            configure(tree, build, args, mainlog)
        tests_cmd = ctest_commands(build)
        missing = sorted({t.partition(":")[0] for f in faults for t in f["tests"]} - set(tests_cmd))
        if missing:
            die(f"no CTest test named {', '.join(missing)} in {build} (tests/*/CMakeLists.txt): update faults.py")
        for f in faults:
            fault_targets[f["name"]] = targets_of(f, tests_cmd, build)
    all_targets = set().union(*fault_targets.values()) if fault_targets else set()

    stash_manifest = None
    if args.from_stash:
        args.from_stash = sdir = unpack_stash(args.from_stash)
        with open(os.path.join(sdir, "manifest.json"), encoding="utf-8") as fh:
            stash_manifest = json.load(fh)
        for f in faults:
            m = stash_manifest["faults"].get(f["name"])
            if m is None:
                die(f"{f['name']} is not in the stash {sdir}")
            if m["digest"] != fault_digest(f):
                die(f"{f['name']}: the stash was built from a different version of this fault")
        kept = []
        for f in faults:
            g = stash_checks(f, stash_manifest["faults"][f["name"]], tests_cmd, build)
            if g["tests"] or g["bench"]:
                kept.append(g)
            else:
                not_run.append(not_run_record(f, "none of its checks' binaries is in the stash built with the fault: "
                                                 + "; ".join(g["dropped"])))
            for d in g["dropped"][len(f.get("dropped", [])):]:
                log(f"{f['name']}: not run: {d}")
        faults = kept
        names = sorted(set(stash_manifest["baseline"]).union(*(m["bins"] for m in stash_manifest["faults"].values())))
        atexit.register(keep_build_bins(build, names, os.path.join(work, "bin-before-stash")))
        # A run ended by a signal (timeout's TERM) still puts them back, and restores an applied fault.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
        unstash_bins(os.path.join(sdir, "_baseline"), build, sorted(stash_manifest["baseline"]))
        log(f"baseline binaries from {sdir}")
    elif need_build:
        log(f"building the unfaulted targets: {' '.join(sorted(all_targets))}")
        t0 = time.time()
        if build_targets(build, all_targets, args.jobs, mainlog) != 0:
            die(f"the unfaulted tree does not build (log: {mainlog.name})", 1)
        log(f"built in {time.time() - t0:.0f} s")

    base_hashes = None
    manifest = None
    if args.stash:
        sdir = os.path.realpath(args.stash)
        if os.path.isdir(sdir):
            shutil.rmtree(sdir)
        base_hashes = stash_bins(build, all_targets, os.path.join(sdir, "_baseline"))
        manifest = {"repo": repo, "built": time.strftime("%Y-%m-%d %H:%M:%S"), "baseline": sorted(base_hashes),
                    "faults": {}}

    running = not args.dry_run and not args.stash
    baseline = None
    if running and not args.no_baseline:
        log("baseline: every listed check on the unfaulted tree")
        baseline = {}
        with open(os.path.join(logdir, "_baseline.log"), "w", encoding="utf-8") as blog:
            for t in sorted({t for f in faults for t in f["tests"]}):
                baseline[t] = run_test(build, t, blog, args.test_timeout)
                log(f"  {t}: {baseline[t]}")
            seen = set()
            for f in faults:
                for b in f["bench"]:
                    k = bench_key(b)
                    if k not in seen:
                        seen.add(k)
                        baseline[k] = run_bench(build, b, blog, args.bench_timeout)[0]
                        log(f"  {k}: {baseline[k]}")

    rows = []
    out = open(jsonl, "w", encoding="utf-8")
    try:
        for i, f in enumerate(faults):
            name = f["name"]
            log(f"[{i + 1}/{len(faults)}] {name}")
            rec = {"fault": name, "what": f["what"], "edits": [{"file": e["file"]} for e in f["edits"]],
                   "expected": f["tests"] + [bench_key(b) for b in f["bench"]], "checks": {},
                   "time": time.strftime("%Y-%m-%d %H:%M:%S")}
            if f.get("dropped"):
                rec["not_run"] = f["dropped"]
            flog = open(os.path.join(logdir, f"{name}.log"), "w", encoding="utf-8")
            t0 = time.time()
            originals = {}
            try:
                rc = 0
                if args.from_stash:
                    unstash_bins(os.path.join(os.path.realpath(args.from_stash), name), build,
                                 stash_manifest["faults"][name]["bins"])
                else:
                    try:
                        originals = apply_edits(tree, f)
                    except ValueError as err:  # the repo changed under us since the check above
                        rec["verdict"], rec["error"] = "error", str(err)
                    if "verdict" not in rec and need_build:
                        rc = build_targets(build, fault_targets.get(name, set()), args.jobs, flog)
                rec["build_s"] = round(time.time() - t0, 1)
                if "verdict" in rec:
                    pass
                elif rc != 0:
                    rec["verdict"] = "build-error"
                    rec["log"] = flog.name
                elif args.dry_run:
                    rec["verdict"] = "compiles" if need_build else "applies"
                elif args.stash:
                    bins = stash_bins(build, fault_targets[name], os.path.join(os.path.realpath(args.stash), name),
                                      base_hashes)
                    manifest["faults"][name] = {"digest": fault_digest(f), "bins": sorted(bins),
                                                "targets": sorted(fault_targets[name])}
                    rec["verdict"] = "stashed"
                    rec["bins"] = sorted(bins)
                else:
                    t1 = time.time()
                    rec["checks"] = run_checks(f, build, flog, args.bench_timeout, baseline, args.test_timeout)
                    rec["run_s"] = round(time.time() - t1, 1)
                    rec["verdict"] = verdict(rec["checks"])
                    rec["log"] = flog.name
            finally:
                restore(originals, keep_mtime=not need_build)
                if args.from_stash:  # the next fault starts from the baseline binaries
                    unstash_bins(os.path.join(os.path.realpath(args.from_stash), "_baseline"), build,
                                 stash_manifest["faults"][name]["bins"])
                flog.close()
            rows.append(rec)
            out.write(json.dumps(rec) + "\n")
            out.flush()
            log(f"    -> {rec['verdict']}" + (f" (log: {rec['log']})" if "log" in rec else "")
                + (f": {rec['error']}" if "error" in rec else ""))
    finally:
        out.close()
        if manifest is not None:  # before the rebuild below: the stash is whole without it
            with open(os.path.join(os.path.realpath(args.stash), "manifest.json"), "w", encoding="utf-8") as fh:
                json.dump(manifest, fh, indent=1)
        if need_build and not args.from_stash and all_targets:
            log("rebuilding the restored tree")
            if build_targets(build, all_targets, args.jobs, mainlog) != 0:
                log(f"WARNING: the restored tree did not rebuild (log: {mainlog.name})")
        mainlog.close()

    for r in not_run:
        r["time"] = time.strftime("%Y-%m-%d %H:%M:%S")
        with open(jsonl, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(r) + "\n")
    rows += not_run
    print(md_table(rows))
    print(f"\nJSON lines: {jsonl}; logs: {logdir}")
    verdicts = [r["verdict"] for r in rows]
    if baseline is not None:
        broken = sorted(k for k, v in baseline.items() if v not in ("passed", "skipped"))
        if broken:
            print(f"\nchecks failing WITHOUT any fault (they cannot catch anything): {', '.join(broken)}")
    summary = {v: verdicts.count(v) for v in sorted(set(verdicts))}
    print("summary: " + ", ".join(f"{k} {n}" for k, n in summary.items()))
    failed = [r["fault"] for r in rows if r["verdict"] in ("MISSED", "build-error", "error", "invalid")]
    if baseline is not None and any(v not in ("passed", "skipped") for v in baseline.values()):
        return 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
