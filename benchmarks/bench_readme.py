"""Re-runs every cost benchmark the README names and prints each figure beside the README's.

The benchmark table rows (README.md's and docs/benchmarks.md's, where the figures live) read
``| `command` | what | figure | target |``: this parses them (read-only here), runs each
command (``python -m benchmarks.X`` or ``python benchmarks/X.py``, through this interpreter; a
``flock ...`` prefix kept off) and prints the figure (its bold parts), the target and the fresh
output's last lines.
Timing is the benchmarks' own (CPU time, paired interleaved rounds); say the machine's load.

    python -m benchmarks.bench_readme [--list] [--only bench_sentinel,bench_window]
        [--timeout 1800]
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
DOCS = (README, README.parent / "docs" / "benchmarks.md")
_ROW = re.compile(
    r"^\| `(?P<cmd>[^`]*benchmarks[^`]*)` \|(?P<what>[^|]*)\|(?P<fig>.*)\|(?P<goal>[^|]*)\|$"
)


def rows(text: str) -> list[tuple[str, list[str], str, str]]:
    """(name, argv, README figure, target) of every benchmark row of the README's table."""
    found = []
    for line in text.splitlines():
        m = _ROW.match(line.strip())
        if not m:
            continue
        argv = shlex.split(m["cmd"])
        while argv and argv[0] != "python":  # flock /tmp/bench.lock python ...
            argv = argv[1:]
        argv = [a for a in argv if not (a.startswith("[") or a.endswith("]"))]
        if not argv:
            continue
        name = next(
            (a.rsplit("/", 1)[-1].removesuffix(".py").split(".")[-1] for a in argv if "bench" in a),
            argv[-1],
        )
        bold = re.findall(r"\*\*(.+?)\*\*", m["fig"])
        found.append(
            (
                name,
                [sys.executable, *argv[1:]],
                "; ".join(bold) or m["fig"].strip()[:300],
                m["goal"].strip(),
            )
        )
    return found


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--list", action="store_true", help="only list the benchmarks")
    ap.add_argument("--only", default="", help="comma-separated benchmark names")
    ap.add_argument("--timeout", type=float, default=1800)
    args = ap.parse_args()
    only = {n for n in args.only.split(",") if n}
    print(f"load average: {os.getloadavg()}")
    for name, argv, figure, goal in rows("\n".join(d.read_text() for d in DOCS)):
        if only and name not in only:
            continue
        print(f"== {name}: {' '.join(argv[1:])}\n   README: {figure}\n   target: {goal}")
        if args.list:
            continue
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=args.timeout, cwd=README.parent
            )
            tail = (done.stdout + done.stderr).strip().splitlines()[-8:]
        except subprocess.TimeoutExpired:
            tail = [f"(timed out after {args.timeout:.0f} s)"]
        for line in tail:
            print(f"   now: {line}")


if __name__ == "__main__":
    main()
