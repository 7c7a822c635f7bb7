#!/usr/bin/env python3
"""Which kernels a change recompiled differently: per-function SASS of two builds, side by side.

"No kernel may get slower" needs a GPU to measure, but a change whose kernels compile to the same
machine code cannot change their speed. This compares, for every CUDA object file (`*.cu.o`) of
a build, the SASS of each function before and after, and prints per object the functions that
are new, gone or different (with the first differing lines). Names are compared after removing
what differs between any two compilations of the same source (nvcc's per-compilation module ids
in internal names), instructions after removing addresses and encodings.

  python3 scripts/sass_compare.py snapshot BUILD SNAP     # save BUILD's device code into SNAP
  (change the sources, rebuild BUILD)
  python3 scripts/sass_compare.py compare SNAP BUILD      # SNAP's functions against BUILD's now

A function whose instructions are the same but whose jump and call targets moved (code before it
or a callee changed size) is listed as MOVED, still counted as changed. Exit status 0 when every
function present on both sides is identical (new functions are listed, not counted as changes), 1
when one differs, 2 for bad usage. Needs `cuobjdump`: the
toolkit's where it has one, else the PyPI wheel `nvidia-cuda-cuobjdump` (installed into
~/.cache/weave-cuobjdump on first use; the CI and build machines' toolkit lacks the binary).
"""
import difflib
import os
import re
import shutil
import subprocess
import sys
import zipfile

CACHE = os.path.expanduser("~/.cache/weave-cuobjdump")
MODULE_ID = re.compile(r"_cu_[0-9a-f]{8}_[0-9]+")
# Internal names carry their length: a module id of another length changes the prefix too.
ANON = re.compile(r"\d+_GLOBAL__N__[0-9a-f]+_")


def cuobjdump():
    for c in (shutil.which("cuobjdump"), "/usr/local/cuda/bin/cuobjdump"):
        if c and os.access(c, os.X_OK):
            return c
    # cuobjdump runs nvdisasm, which it looks for beside itself.
    bindir = os.path.join(CACHE, "nvidia", "cu13", "bin")
    for tool in ("cuobjdump", "nvdisasm"):
        exe = os.path.join(bindir, tool)
        if os.access(exe, os.X_OK):
            continue
        os.makedirs(CACHE, exist_ok=True)
        pkg = "nvidia-cuda-" + tool
        print(f"sass_compare: fetching {tool} (pip download {pkg})", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", CACHE, pkg], check=True)
        wheels = [w for w in os.listdir(CACHE) if w.startswith(pkg.replace("-", "_")) and w.endswith(".whl")]
        if not wheels:
            sys.exit(f"sass_compare: no {pkg} wheel downloaded")
        with zipfile.ZipFile(os.path.join(CACHE, sorted(wheels)[-1])) as z:
            z.extractall(CACHE)
        os.chmod(exe, 0o755)
    return os.path.join(bindir, "cuobjdump")


def objects(build):
    for root, dirs, files in os.walk(build):
        dirs[:] = [d for d in dirs if d != "_deps"]
        for f in files:
            if f.endswith(".cu.o"):
                p = os.path.join(root, f)
                yield os.path.relpath(p, build), p


def functions(exe, path):
    r = subprocess.run([exe, "-sass", path], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"sass_compare: {exe} -sass {path} failed: {r.stderr.strip()}")
    out = r.stdout
    funcs, cur = {}, None
    for line in out.splitlines():
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            cur = ANON.sub("_GLOBAL__N__", MODULE_ID.sub("_cu_", m.group(1)))
            funcs[cur] = []
            continue
        if cur is None:
            continue
        line = MODULE_ID.sub("_cu_", re.sub(r"/\*[0-9a-fx]+\*/", "", line))
        line = " ".join(line.split())
        if line:
            funcs[cur].append(line)
    return funcs


ENCODING = re.compile(r"/\* 0x[0-9a-f]+ \*/")
JUMP = re.compile(r"\b(BRA|BRX|JMP|JMX|CALL|BSSY|SSY|PBK|PCNT)\b")
HEX = re.compile(r"0x[0-9a-f]+")


def moved_only(a, b):
    """The same instructions, with only the targets of jumps and calls (and so their encodings)
    moved: code before the function or a callee grew or shrank. Every other instruction's
    encoding, with its scheduling bits (stalls, barriers), must be equal."""
    def shape(lines):
        out, jump = [], False
        for l in lines:
            if JUMP.search(l):
                out.append(HEX.sub("X", l))
                jump = True
            elif jump and ENCODING.fullmatch(l):
                out.append("X")  # the jump's second encoding word
                jump = False
            else:
                out.append(l)
                jump = False
        return out
    return shape(a) == shape(b)


def snapshot(build, snap):
    os.makedirs(snap, exist_ok=True)
    n = 0
    for rel, path in objects(build):
        dst = os.path.join(snap, rel)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copy2(path, dst)
        n += 1
    print(f"sass_compare: {n} objects of {build} saved in {snap}")
    return 0


def compare(snap, build):
    exe = cuobjdump()
    changed = same = new = moved = 0
    for rel, path in sorted(objects(build)):
        old = os.path.join(snap, rel)
        if not os.path.exists(old):
            print(f"new object {rel}")
            continue
        a, b = functions(exe, old), functions(exe, path)
        for f in sorted(set(a) | set(b)):
            if f not in a:
                new += 1
                print(f"{rel}: new {f} ({len(b[f])} lines)")
            elif f not in b:
                changed += 1
                print(f"{rel}: gone {f}")
            elif a[f] != b[f]:
                changed += 1
                if moved_only(a[f], b[f]):
                    moved += 1
                    print(f"{rel}: MOVED {f} (the same instructions; only jump and call targets differ)")
                    continue
                d = [l for l in difflib.unified_diff(a[f], b[f], lineterm="", n=0)
                     if l[:1] in "+-" and l[:3] not in ("+++", "---")]
                print(f"{rel}: CHANGED {f} ({len(d)} lines differ)")
                for l in d[:6]:
                    print("    " + l)
            else:
                same += 1
    print(f"sass_compare: {same} functions identical, {changed} changed or gone ({moved} of them moved only), {new} new")
    return 1 if changed else 0


def main(argv):
    if len(argv) != 4 or argv[1] not in ("snapshot", "compare"):
        print(__doc__, file=sys.stderr)
        return 2
    return snapshot(argv[2], argv[3]) if argv[1] == "snapshot" else compare(argv[2], argv[3])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
