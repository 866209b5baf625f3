"""What a diagnose() block costs at its exit, one source tree against another.

The exit is where the speed probe runs the precision A/B (every precision, `ampdiag.compare`;
the probe's FP32 and autocast figures are its two rows), after the hooks' removal and before
the analysis and the session. Each measurement is a fresh process (a user's run is one: a
precision's first pass there pays its kernels' start-up), importing ampdiag from one of the
two trees, training the workload under ``diagnose()`` and timing the block's exit with
``time.perf_counter``; the two trees alternate process by process (which goes first
alternates from round to round), so the machine's drift lands on both alike. Printed per
tree: the median exit time, the A/B's own ``spent_s`` and budget, the probe's rounds and the
A/B's timed samples, and the ratio of the medians.

    flock /tmp/bench.lock python -m benchmarks.bench_exit --before REV [--after PATH]
        [--rounds 8] [--workload mlp-bf16,cnn-bf16]

``--before`` is a git revision (checked out in a temporary worktree, removed afterwards);
``--after`` a source tree (default: this one).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent


def _child(workload: str) -> dict[str, Any]:
    """One diagnosed run of ``workload`` in this process; its exit time and what it spent."""
    import time

    import torch
    from torch import nn
    from torch.nn import functional as F

    import ampdiag

    torch.set_num_threads(1)
    torch.manual_seed(0)
    if workload.startswith("mlp"):
        model: nn.Module = nn.Sequential(
            nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
        )
        x = torch.randn(64, 256)
    else:
        model = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 64, 3, padding=1),
            nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10),
        )  # fmt: skip
        x = torch.randn(16, 3, 16, 16)
    y = torch.randint(0, 10, (x.shape[0],))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    steps = 150
    with tempfile.TemporaryDirectory() as out:
        block = ampdiag.diagnose(out=out, console=False, tensorboard=False, report=False)
        with block as d:
            began = time.perf_counter()
            for _ in range(steps):
                opt.zero_grad(set_to_none=True)
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = F.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
            left = time.perf_counter()
        exit_s = time.perf_counter() - left
    assert d.session is not None
    probe = d.session.section("speed_probe")
    ab = probe.get("precisions") or {}
    rows = {r["precision"]: r for r in ab.get("results") or []}
    return {
        "exit_s": exit_s,
        "block_s": left - began,
        "pairs": probe.get("repeats"),
        "ab_spent_s": ab.get("spent_s"),
        "ab_budget_s": ab.get("budget_s"),
        "ab_skipped": ab.get("skipped"),
        "samples": {p: r.get("samples") for p, r in rows.items()},
    }


def _run(tree: Path, workload: str) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    done = subprocess.run(
        [sys.executable, str(HERE), "--child", workload],
        env=env,
        cwd=tempfile.gettempdir(),
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"{tree} {workload} failed:\n{done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child")
    ap.add_argument("--before")
    ap.add_argument("--after", default=str(ROOT))
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--workload", default="mlp-bf16,cnn-bf16")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(_child(args.child)))
        return
    if not args.before:
        raise SystemExit("--before REV is required")
    with tempfile.TemporaryDirectory() as tmp:
        before = Path(tmp) / "before"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach",
                        str(before), args.before], check=True)  # fmt: skip
        try:
            trees = {"before": before, "after": Path(args.after)}
            for workload in args.workload.split(","):
                got: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
                for r in range(args.rounds):
                    for name in ("before", "after") if r % 2 == 0 else ("after", "before"):
                        got[name].append(_run(trees[name], workload))
                print(f"{workload}: {args.rounds} fresh processes per tree, interleaved")
                med: dict[str, float] = {}
                for name, runs in got.items():
                    med[name] = statistics.median(x["exit_s"] for x in runs)
                    spent = [x["ab_spent_s"] for x in runs if x["ab_spent_s"] is not None]
                    print(
                        f"  {name:6} exit median {med[name] * 1e3:7.0f} ms "
                        f"(min {min(x['exit_s'] for x in runs) * 1e3:.0f}, "
                        f"max {max(x['exit_s'] for x in runs) * 1e3:.0f}); "
                        f"block {statistics.median(x['block_s'] for x in runs):.2f} s; "
                        f"A/B ran {len(spent)}/{len(runs)}, spent median "
                        f"{statistics.median(spent) * 1e3 if spent else 0:.0f} ms of "
                        f"{statistics.median(x['ab_budget_s'] or 0 for x in runs) * 1e3:.0f} ms; "
                        f"probe pairs median {statistics.median(x['pairs'] or 0 for x in runs)}; "
                        f"samples {runs[len(runs) // 2]['samples']}"
                    )
                print(f"  after / before exit: {med['after'] / med['before']:.3f}")
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                            str(before)], check=False)  # fmt: skip


if __name__ == "__main__":
    main()
