"""The merge of a thousand ranks: ``ampdiag report FOLDER`` on copies of a real 2-rank run.

The source is a real torchrun job (2 ranks over gloo on the CPU: the straggler scenario of
``tests/distributed/worker.py``, one rank sleeping each step), run here unless ``--source``
names its folder; ``--ranks`` (default 1024) ranks are made of copies of its two ranks
(`tests.distributed.copies`, rank and world size rewritten in session and trace). The report
runs as the user runs it, in a fresh process (``python -m ampdiag report FOLDER``: the merged
session and the HTML report written into the folder), ``--repeat`` times; printed: wall time,
the merged session.json's size, and the peak memory of the report process and its workers
together (the sum of their resident sets, sampled every 10 ms from /proc: shared pages of
forked workers counted once per process, so an upper bound) and the CPU time of them all
(wall time on a shared machine is CPU time over the cores it is given). Targets: <= 10 s,
<= 20 MB, <= 1 GB.

    python benchmarks/bench_ranks.py [--ranks 1024] [--repeat 1] [--source DIR]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.distributed.copies import copy_ranks  # noqa: E402


def _tree_rss(root: int) -> int:
    """The resident bytes of process ``root`` and its descendants, now (Linux /proc)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(entry)
        children.setdefault(int(fields[1]), []).append(pid)
        rss[pid] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo += children.get(pid, [])
    return total


def measure(folder: Path) -> tuple[float, float, int, int]:
    """(wall s, CPU s of the report and its workers, merged session bytes, peak tree bytes)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    for stale in ("session.json", "report.html"):
        (folder / stale).unlink(missing_ok=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ampdiag", "report", str(folder)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    peak = 0

    def sample() -> None:
        nonlocal peak
        while proc.poll() is None:
            peak = max(peak, _tree_rss(proc.pid))
            time.sleep(0.01)

    sampler = threading.Thread(target=sample)
    sampler.start()
    _, err = proc.communicate()
    wall = time.perf_counter() - start
    sampler.join()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = sum(getattr(after, k) - getattr(before, k) for k in ("ru_utime", "ru_stime"))
    if proc.returncode != 0:
        raise SystemExit(f"report failed: {err.decode()[-2000:]}")
    return wall, cpu, (folder / "session.json").stat().st_size, peak


def real_run(out: Path) -> Path:
    """A real 2-rank torchrun job (the straggler scenario), as tests/distributed runs it."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    worker = REPO / "tests" / "distributed" / "worker.py"
    subprocess.run([*cmd, str(worker), str(out), "straggler"], env=env, check=True, timeout=900)
    return out / "straggler"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--source", type=Path, help="a 2-rank run's folder (default: run one)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench_ranks-"))
    try:
        source = args.source or real_run(tmp / "run")
        folder = tmp / "ranks"
        copy_ranks(source, folder, args.ranks)
        print(f"{args.ranks} ranks (copies of {source}), {os.cpu_count()} cores")
        for i in range(args.repeat):
            wall, cpu, size, peak = measure(folder)
            print(
                f"run {i + 1}: {wall:.2f} s ({cpu:.2f} s CPU, load {os.getloadavg()[0]:.1f}), "
                f"merged session {size / 1e6:.1f} MB, "
                f"peak memory {peak / 2**20:.0f} MiB (report + workers)"
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
