#!/usr/bin/env python3
"""Every result file the tree keeps is cited by a document (issue 18: `bench/results/`,
`tests/mutation/results/` and `kernels/*/results/` hold the runs the docs cite, the rest lives in
git history).

A file counts as cited when a tracked `*.md` other than docs/perf-notes.md (the experiment log,
which also names runs that only git history holds) names it: by its file name, or by a pattern
that matches it, with `{a,b}` alternatives, `*` or a leading `…` (`…-core-run2.jsonl`). Exit 0
when every file is cited; 1 with the list of uncited ones (cite each from the README whose table
or claim it backs, or drop it from the tree); 77 (CTest: skipped) where REPO is not a git
checkout, whose tracked files are what the rule is about.

  python3 scripts/results_cited.py [REPO]
"""
import fnmatch
import os
import re
import subprocess
import sys

RESULT_DIRS = ("bench/results", "tests/mutation/results")
EXCLUDED_DOCS = {"docs/perf-notes.md"}
# A path-like token, brace groups included: `bench/results/x-{a,b}.jsonl`, `…-run2.jsonl`, `*c6-*`.
TOKEN = re.compile(r"[A-Za-z0-9_./\-*…]*(?:\{[^{}\s`]*\}[A-Za-z0-9_./\-*…]*)+|[A-Za-z0-9_./\-*…]+")
# A wildcard pattern must say this much literally, so that a bare `*` or `*.jsonl` cites nothing.
MIN_LITERAL = 10


def tracked(repo, *specs):
    out = subprocess.run(["git", "-C", repo, "ls-files", "--", *specs], capture_output=True, text=True, check=True)
    return [line for line in out.stdout.splitlines() if line]


def expand(token):
    """`a{b,c}d{e,f}` -> abde, abdf, acde, acdf."""
    m = re.search(r"\{([^{}]*)\}", token)
    if not m:
        return [token]
    return [x for alt in m.group(1).split(",") for x in expand(token[:m.start()] + alt + token[m.end():])]


def patterns(text):
    names, wild = set(), set()
    for tok in TOKEN.findall(text):
        for e in expand(tok):
            base = e.rstrip(".,;:)").split("/")[-1]
            if not base:
                continue
            if "*" in base or "…" in base:
                pat = base.replace("…", "*")
                if len(pat.replace("*", "")) >= MIN_LITERAL:
                    wild.add(pat)
            else:
                names.add(base)
    return names, wild


def main():
    repo = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    try:
        files = tracked(repo, *RESULT_DIRS, "kernels/*/results/*")
        docs = [d for d in tracked(repo, "*.md") if d not in EXCLUDED_DOCS]
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"results_cited: skipped, cannot list the tracked files of {repo}: {e}", file=sys.stderr)
        return 77
    text = []
    for d in docs:
        with open(os.path.join(repo, d), encoding="utf-8") as f:
            text.append(f.read())
    names, wild = patterns("\n".join(text))
    uncited = []
    for f in files:
        b = os.path.basename(f)
        if b in names or any(fnmatch.fnmatchcase(b, p) for p in wild):
            continue
        uncited.append(f)
    print(f"results_cited: {len(files)} result files, {len(docs)} documents (perf-notes aside): "
          f"{len(files) - len(uncited)} cited, {len(uncited)} not")
    for f in uncited:
        print(f"  not cited by any document: {f}")
    return 1 if uncited else 0


if __name__ == "__main__":
    sys.exit(main())
