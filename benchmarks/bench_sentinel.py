"""Cost of the divergence sentinel (collectors/sentinel.py) on a training step.

Plain FP16-autocast + GradScaler training steps of the demo model (TinyGPT) against the same
steps inside ``ampdiag.diagnose()`` with only the sentinel attached (the collector every step
pays for; the sampled collectors are measured by bench_numerics.py), interleaved block by
block in one process with the order rotated each round. Prints per-step medians (wall and this
thread's CPU time), the ratio of the medians and the median (and quartiles) of per-round
paired ratios.
``anomaly`` is torch's own answer to "where did the NaN come from",
``torch.autograd.detect_anomaly(check_nan=True)``: the anchor. A third variant, ``window``,
is the same steps outside a window of steps that never opens (``diagnose(steps=...)`` with
every default collector): what a long run pays between its windows, the run-wide sentinel's
block and the step watch. ``--model mlp``: bench_window's small MLP instead of TinyGPT.

Two anchors say what part of the cost any sentinel pays: ``empty``, a ``diagnose()`` block with
no collector (finding the steps, the loss and the optimizer's step), and ``floor``, that block
with `Floor`, the least an every-step check can read to name the step a gradient first turns
non-finite: the loss and one sum per parameter gradient, as floats, and nothing else (no
origin, no replay). The sentinel's own cost is what it adds to ``floor``.

``--origins``: the corpus's NaN scenarios (``tests/scenarios/sc_nan_*``), each run under
ampdiag and again under the anchor, with the step and module each names beside the truth the
scenario measured itself. The anchor's step is the step whose backward raised; it names a
backward op and the forward line that made its input, never a module.

    python -m benchmarks.bench_sentinel [--device cpu|cuda] [--blocks 12] [--steps 20]
        [--dtype float16|bfloat16|float32] [--model tinygpt|mlp] [--variants sentinel,...]
    python -m benchmarks.bench_sentinel --origins
"""

from __future__ import annotations

import argparse
import gc
import math
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch.nn import functional as F

import ampdiag
from ampdiag.demo import GPTConfig, TinyGPT, synthetic_batches
from ampdiag.sources.live.collectors.base import Collector, RunContext
from ampdiag.sources.live.collectors.sentinel import Sentinel


class Floor(Collector):
    """The anchor ``floor``: the loss and one sum per gradient read on every step, nothing else.

    A sum is the cheapest read of a gradient on a CPU that still catches any inf/NaN in it
    (see the sentinel's `_check`); without it, a gradient non-finite in the backward alone
    (a ``torch.where`` over a ``sqrt``) is seen only steps later, through the weights.
    """

    name = "floor"
    run_wide = True

    def __init__(self) -> None:
        self.params: list[torch.nn.Parameter] = []
        self.losses: list[torch.Tensor] = []

    def on_model(self, run: RunContext, model: torch.nn.Module) -> None:
        self.params = [p for p in model.parameters() if p.requires_grad]

    def on_loss(self, run: RunContext, loss: torch.Tensor, from_scaler: bool) -> None:
        self.losses.append(loss.detach())

    def before_optimizer_step(self, run: RunContext, optimizer: torch.optim.Optimizer) -> None:
        values = [float(g.sum()) for p in self.params if (g := p.grad) is not None]
        values += map(float, self.losses)
        self.losses = []
        self.finite = math.isfinite(sum(values))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--blocks", type=int, default=12)
    ap.add_argument("--steps", type=int, default=20, help="timed steps per block")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: default)")
    ap.add_argument(
        "--model",
        default="tinygpt",
        choices=["tinygpt", "mlp"],
        help="mlp: bench_window's 0.7 ms MLP (256-512-10, batch 64), SGD, no scaler",
    )
    ap.add_argument(
        "--dtype",
        default="float16",
        choices=["float16", "bfloat16", "float32"],
        help="autocast dtype (float32: no autocast; a CPU without fast FP16 takes ~25x longer "
        "on an FP16 step, which hides the sentinel's cost)",
    )
    ap.add_argument(
        "--variants",
        default="sentinel,window,anomaly",
        help="what is timed against plain steps (comma-separated: sentinel, window, anomaly, "
        "empty, floor)",
    )
    ap.add_argument("--origins", action="store_true", help="the origin table (see the doc)")
    args = ap.parse_args()
    if args.origins:
        origins()
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    torch.manual_seed(0)
    cfg = GPTConfig()
    model: torch.nn.Module = TinyGPT(cfg).to(dev)
    if args.model == "mlp":
        model = torch.nn.Sequential(
            torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)
        ).to(dev)
    opt: torch.optim.Optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    if args.model == "mlp":
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    dtype = getattr(torch, args.dtype)
    scaler = torch.amp.GradScaler(dev.type, init_scale=2.0**12, enabled=dtype == torch.float16)
    data = synthetic_batches(cfg, args.batch, 4, dev)
    if args.model == "mlp":
        data = [(torch.randn(64, 256, device=dev), torch.randint(0, 10, (64,), device=dev))]

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=dtype, enabled=dtype != torch.float32):
            out = model(x)
            loss = F.cross_entropy(out.view(-1, out.shape[-1]), y.reshape(-1))
        scaler.scale(loss).backward()  # type: ignore[no-untyped-call]
        scaler.step(opt)
        scaler.update()

    def run(n: int) -> tuple[float, float]:
        if dev.type == "cuda":
            torch.cuda.synchronize()
        w0, c0 = time.perf_counter(), time.thread_time()
        for i in range(n):
            step(*data[i % len(data)])
        if dev.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - w0, time.thread_time() - c0

    for x, y in data:
        step(x, y)
    modules = sum(1 for _ in model.modules())
    print(
        f"device {dev}, {args.model} ({args.dtype}) "
        f"{sum(p.numel() for p in model.parameters())} params, "
        f"{modules} modules, batch {args.batch}, threads {torch.get_num_threads()}"
    )
    watched = [v for v in args.variants.split(",") if v]
    times: dict[str, list[tuple[float, float]]] = {v: [] for v in ["plain", *watched]}
    quiet = {"report": False, "tensorboard": False, "console": False}
    names = list(times)
    with tempfile.TemporaryDirectory() as tmp:
        for b in range(args.blocks):
            k = b % len(names)
            for name in names[k:] + names[:k]:  # the order rotated each round
                gc.collect()
                if name == "plain":
                    run(2)
                    gc.collect()
                    times[name].append(run(args.steps))
                    continue
                if name == "anomaly":  # torch's own answer: the anchor
                    with torch.autograd.detect_anomaly(check_nan=True):
                        run(2)
                        gc.collect()
                        times[name].append(run(args.steps))
                    continue
                out = Path(tmp) / f"{name}{b}"
                watch = {"sentinel": [Sentinel()], "floor": [Floor()], "empty": []}.get(name)
                block = (
                    ampdiag.diagnose(out=out, collectors=watch, **quiet)  # type: ignore[arg-type]
                    if watch is not None
                    else ampdiag.diagnose(out=out, steps=(10**9, 10**9 + 1), **quiet)  # type: ignore[arg-type]
                )
                with block:
                    run(2)
                    gc.collect()
                    times[name].append(run(args.steps))
    plain = times["plain"]
    for name in watched:
        for label, i in (("wall", 0), ("CPU", 1)):
            p = statistics.median(t[i] for t in plain) / args.steps
            w = statistics.median(t[i] for t in times[name]) / args.steps
            pairs = [a[i] / b[i] for a, b in zip(times[name], plain, strict=True)]
            pair = statistics.median(pairs)
            q = statistics.quantiles(pairs, n=4) if len(pairs) > 1 else [pair, pair, pair]
            print(
                f"{name:8s} {label:4s}: plain {p * 1e3:.3f} ms/step, {name} {w * 1e3:.3f} "
                f"ms/step ({(w - p) * 1e3:+.3f} ms): ratio {w / p:.3f}x (median of paired "
                f"rounds {pair:.3f}x, IQR {q[0]:.3f}-{q[2]:.3f}x, n={args.blocks})"
            )
    if "sentinel" in times and "floor" in times:  # what the sentinel adds to the least check
        rounds = zip(times["sentinel"], times["floor"], strict=True)
        over = statistics.median((a[1] - b[1]) / args.steps for a, b in rounds)
        print(f"sentinel over floor: {over * 1e6:+.1f} us a step (CPU, paired median)")


def origins() -> None:
    """Prints, per NaN scenario: the truth, ampdiag's origin, and the anchor's."""
    from tests.scenarios import harness

    scenarios = [s for s in harness.all_scenarios() if s.name.startswith("nan-")]
    print(f"{'scenario':36s} {'truth (step, module)':28s} {'ampdiag':30s} anomaly mode")
    with tempfile.TemporaryDirectory() as tmp:
        for sc in scenarios:
            session, truth = sc.run(Path(tmp, sc.name))
            want = next((e for e in truth.expect if e.id == "nonfinite-origin"), None)
            if want is None:
                continue
            got = next((f for f in session.all_findings() if f.id == "nonfinite-origin"), None)
            ours = (got.evidence.get("step"), got.evidence.get("module")) if got else None
            ok = ours == (want.step, want.module) if want.module else ours and ours[0] == want.step
            caught = _under_anomaly(sc, Path(tmp, sc.name + "-anomaly"))
            theirs = "no error raised"
            if caught:
                right = "right step" if caught["step"] == want.step else "wrong step"
                theirs = f"step {caught['step']} ({right}): {caught['op']} at {caught['line']}"
            mark = "right" if ok else "WRONG"
            print(
                f"{sc.name:36s} {(want.step, want.module)!s:28s} "
                f"{mark + ' ' + str(ours):30s} {theirs}"
            )


def _under_anomaly(sc: Any, out: Path) -> dict[str, Any] | None:
    """The scenario's run with ``detect_anomaly(check_nan=True)`` in place of ``diagnose``."""
    from tests.scenarios import harness

    caught: dict[str, Any] = {}
    backwards = [0]
    plain_backward = torch.autograd.backward

    def counted(*a: Any, **k: Any) -> Any:
        backwards[0] += 1
        return plain_backward(*a, **k)

    @contextmanager
    def anchor(out: Path, **settings: Any) -> Iterator[Any]:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            try:
                with torch.autograd.detect_anomaly(check_nan=True):
                    yield SimpleNamespace(session=None)
            except RuntimeError as exc:
                trace = "\n".join(str(w.message) for w in seen)
                lines = [  # the innermost frame of the user's code (not torch's)
                    ln.strip()
                    for ln in trace.splitlines()
                    if ln.strip().startswith("File") and "/torch/" not in ln
                ]
                caught["step"] = backwards[0] - 1
                caught["op"] = str(exc).split("'")[1] if "'" in str(exc) else str(exc)[:40]
                where = lines[-1].split('"')[1].rsplit("/", 1)[-1] if lines else "?"
                line = lines[-1].split("line ")[1].split(",")[0] if lines else "?"
                caught["line"] = f"{where}:{line}"

    plain = harness.diagnose
    patched = [m for m in list(sys.modules.values()) if getattr(m, "diagnose", None) is plain]
    for m in patched:
        m.diagnose = anchor  # type: ignore[attr-defined]
    torch.autograd.backward = counted
    try:
        sc.run(out)
    except Exception:  # the run stopped where the anchor raised: what it said is kept
        pass
    finally:
        torch.autograd.backward = plain_backward
        for m in patched:
            m.diagnose = plain  # type: ignore[attr-defined]
    return caught or None


if __name__ == "__main__":
    main()
