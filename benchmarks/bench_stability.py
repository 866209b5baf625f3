"""Does the verdict hold still? N identical runs per workload, with another process on one core.

Three workloads, each run N times in a fresh process (one intra-op thread; ``--threads 0``:
torch's default, as a user runs) while a CPU-bound process of this benchmark keeps one core
busy the whole time:

- ``demo``: ``ampdiag demo`` (TinyGPT, FP16 autocast without a GradScaler, 100 steps): the
  lead must be the gradients lost to underflow, every run;
- ``bf16``: ``ampdiag demo --scenario amp --dtype bfloat16 --steps 30``, a healthy BF16 run
  whose BF16-vs-FP32 speed on a CPU without native BF16 sits near the thresholds;
- ``diffusion``: a short script in the style of denoising-diffusion-pytorch's Trainer: a small
  conv denoiser trained on a noise-prediction loss under BF16 autocast (as Accelerate's
  ``mixed_precision="bf16"`` wraps it), AdamW, an EMA copy updated every step.

``--scenario NAME`` (repeatable) adds a corpus scenario of ``tests/scenarios`` as a workload
(``scenario:NAME``), run by its own ``run(out)`` as ``test_corpus`` runs it: the ones whose
advice rests on a timed comparison (``activation-near-fp16-max``: an FP16 run whose A/B picks
between FP32 and BF16, which measure alike on a small model) are the ones that can flip.

For each it prints how many distinct (verdict word, top finding and severity, recommended
precision, the precision the top precision advice's fix names) it saw, and each one with its
count; the figure the issue holds is 1 per workload.

Usage: ``python -m benchmarks.bench_stability [--runs 8] [--only demo,bf16,diffusion]
[--scenario activation-near-fp16-max] [--keep DIR] [--threads N]`` (``--only ''`` runs the
scenarios alone; ``--keep`` keeps every run's session, its A/B's samples included, to replay a
decision on).
About 2 minutes per round of the three on a shared 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

WORKLOADS = ("demo", "bf16", "diffusion")
#: A corpus scenario's workload name is this prefix and the scenario's name.
SCENARIO = "scenario:"


def _diffusion(out: str) -> None:
    """A diffusion Trainer's loop in miniature: BF16 autocast, AdamW, EMA, noise prediction."""
    import copy

    import torch
    from torch import nn

    import ampdiag

    torch.manual_seed(0)

    class Denoiser(nn.Module):
        def __init__(self, ch: int = 32) -> None:
            super().__init__()
            self.down = nn.Sequential(
                nn.Conv2d(3, ch, 3, padding=1), nn.GroupNorm(8, ch), nn.SiLU(),
                nn.Conv2d(ch, 2 * ch, 3, stride=2, padding=1), nn.GroupNorm(8, 2 * ch), nn.SiLU(),
            )  # fmt: skip
            self.time = nn.Sequential(nn.Linear(1, 2 * ch), nn.SiLU(), nn.Linear(2 * ch, 2 * ch))
            self.up = nn.Sequential(
                nn.ConvTranspose2d(2 * ch, ch, 4, stride=2, padding=1), nn.GroupNorm(8, ch),
                nn.SiLU(), nn.Conv2d(ch, 3, 3, padding=1),
            )  # fmt: skip

        def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            h = self.down(x) + self.time(t[:, None])[:, :, None, None]
            return self.up(h)  # type: ignore[no-any-return]

    model = Denoiser()
    ema = copy.deepcopy(model).requires_grad_(False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(1)
    images = torch.rand(16, 3, 16, 16, generator=gen) * 2 - 1
    with ampdiag.diagnose(out=out, console=False, tensorboard=False):
        for _ in range(24):
            t = torch.rand(16, generator=gen)
            noise = torch.randn(images.shape, generator=gen)
            noisy = (1 - t)[:, None, None, None].sqrt() * images + t[
                :, None, None, None
            ].sqrt() * noise
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = nn.functional.mse_loss(model(noisy, t).float(), noise)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            with torch.no_grad():
                for pe, pm in zip(ema.parameters(), model.parameters(), strict=True):
                    pe.lerp_(pm, 0.005)


#: The child's intra-op threads (``--threads``; 0: torch's default, as a user runs).
THREADS = "AMPDIAG_BENCH_THREADS"


def one_run(workload: str, out: str) -> None:
    """One run of a workload, in this process, writing its session to ``out``."""
    import torch

    threads = int(os.environ.get(THREADS, "1"))
    if threads > 0:
        torch.set_num_threads(threads)
    if workload.startswith(SCENARIO):
        from tests.scenarios.harness import all_scenarios

        name = workload.removeprefix(SCENARIO)
        next(s for s in all_scenarios() if s.name == name).run(Path(out))
        return
    if workload == "diffusion":
        _diffusion(out)
        return
    from ampdiag.demo import run_demo

    if workload == "demo":
        run_demo(out)
    else:
        run_demo(out, scenario="amp", dtype="bfloat16", steps=30)


Outcome = tuple[str, str, str, str]


def outcome(out: str) -> Outcome:
    """(verdict word, top finding id and severity, recommended precision, the precision the
    first precision advice (``prefer-*``) names: its ``evidence.precision``) of a saved run."""
    doc = json.loads((Path(out) / "session.json").read_text())
    verdict = str(doc.get("derived", {}).get("verdict"))
    findings = [f for f in doc.get("findings", []) if f.get("severity") in ("high", "medium")]
    top = f"{findings[0]['id']} ({findings[0]['severity']})" if findings else "none"
    ab = doc.get("speed_probe", {}).get("precisions") or {}
    advice = [f for f in doc.get("findings", []) if str(f.get("id")).startswith("prefer-")]
    fix = str(advice[0].get("evidence", {}).get("precision")) if advice else "none"
    return verdict, top, str(ab.get("recommended") or ab.get("skipped") or ab.get("error")), fix


def times(out: str) -> str:
    """The A/B's rows of a saved run as ``name time±spread ms``, ``!`` after an unsafe one."""
    from ampdiag.analysis.precision_choice import is_safe

    doc = json.loads((Path(out) / "session.json").read_text())
    rows = (doc.get("speed_probe", {}).get("precisions") or {}).get("results") or []
    return " ".join(
        f"{r.get('precision')} {r.get('time_ms') or 0:.2f}±{r.get('time_spread_ms') or 0:.2f}"
        + ("!" if is_safe(r) is False else "")
        for r in rows
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--only", default=",".join(WORKLOADS))
    parser.add_argument("--scenario", action="append", default=[], metavar="NAME")
    parser.add_argument("--keep", metavar="DIR", help="keep each run's session under DIR")
    parser.add_argument(
        "--threads", type=int, default=1, help="intra-op threads per run (0: torch's default)"
    )
    parser.add_argument("--one", nargs=2, metavar=("WORKLOAD", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        one_run(*args.one)
        return
    workloads = [w for w in args.only.split(",") if w] + [SCENARIO + n for n in args.scenario]
    env = {**os.environ, THREADS: str(args.threads)}
    if args.threads > 0:
        env["OMP_NUM_THREADS"] = str(args.threads)
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    each = f"{args.threads} thread(s)" if args.threads > 0 else "torch's default threads"
    print(f"one core kept busy by pid {busy.pid}; {args.runs} runs per workload, {each} each")
    seen: dict[str, Counter[Outcome]] = {w: Counter() for w in workloads}
    took: dict[str, list[float]] = {w: [] for w in workloads}
    try:
        with tempfile.TemporaryDirectory() as scratch:
            tmp = args.keep or scratch
            for i in range(args.runs):  # interleaved: each round runs every workload once
                for w in workloads:
                    out = str(Path(tmp) / f"{w}-{i}")
                    t0 = time.perf_counter()
                    subprocess.run(
                        [sys.executable, "-m", "benchmarks.bench_stability", "--one", w, out],
                        check=True, env=env, stdout=subprocess.DEVNULL,
                    )  # fmt: skip
                    took[w].append(time.perf_counter() - t0)
                    seen[w][outcome(out)] += 1
                    print(f"  run {i + 1} {w}: {outcome(out)} {times(out)}", flush=True)
    finally:
        busy.kill()
        busy.wait()
    width = max(map(len, ["workload", *workloads]))
    print(f"\n{'workload':<{width}} distinct  (verdict, top finding, recommended, advice) x runs")
    for w in workloads:
        n = len(seen[w])
        first = True
        for key, count in seen[w].most_common():
            print(f"{w if first else '':<{width}} {n if first else '':<9} {key} x{count}")
            first = False
        print(f"{'':<{width}} median wall time per run {sorted(took[w])[len(took[w]) // 2]:.0f} s")


if __name__ == "__main__":
    main()
