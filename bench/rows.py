"""The JSON-lines files weave-bench and the bench/ scripts write (`--json`), read into a list of
rows: the one reader bench/plot.py and bench/gemm_report.py share."""
import json
import os
import sys


def read_rows(paths):
    """Every row of every file, in order. A line that is not JSON, or a file that cannot be read,
    ends the program with a message naming it (exit status 1, or 2 for the file)."""
    me = os.path.basename(sys.argv[0])
    rows = []
    for path in paths:
        try:
            with open(path) as f:
                for n, line in enumerate(f, 1):
                    line = line.strip()
                    if not line:
                        continue
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as e:
                        sys.exit(f"{me}: {path}:{n}: not JSON ({e})")
        except OSError as e:
            print(f"{me}: {e}", file=sys.stderr)
            sys.exit(2)
    return rows
