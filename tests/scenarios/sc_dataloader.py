"""A data loader whose delay the scenario controls: slow on every batch, or stalled once.

- ``dataloader-slow``: every batch takes ``SLOW_S`` to load (a ``time.sleep`` in the dataset,
  as an input pipeline waiting on disk or a decoder would): the model waits for its input most
  of each step. ``dataloader-bound`` must be a claim (not an uncertain remark) and
  ``tune-input-pipeline`` must advise worker processes.
- ``dataloader-one-stall``: the loader is instant except one batch that stalls ``STALL_S``,
  at a step the profiler records (by default). The typical step is not data bound, so neither
  finding may appear -- though the mean share over the profiled steps is well above 10%, which
  is what fired ``tune-input-pipeline`` on HF BERT when one step among three stalled.

Truth, without ampdiag: the loop times ``next(loader)`` and the whole step itself
(``time.perf_counter``), per step, and the scenario checks that its fault happened (the slow
loader's median share is at least 30%, 3x the 10% threshold; the stalled batch waited its
``STALL_S`` while the other steps' median share stays under 3%). Timing is never asserted
against ampdiag's numbers: only which findings appear, with margins of 3x and more. FP32
training (the loader is the fault; no autocast, so no speed probe).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

from ampdiag.config import DiagnoseConfig
from ampdiag.session import Session
from tests.scenarios import models
from tests.scenarios.harness import (
    ACTIONABLE,
    Expect,
    Scenario,
    Truth,
    diagnose,
    premise,
    seeded,
    session_of,
)

STEPS = 8
SLOW_S = 0.2
STALL_S = 0.4
STALL_STEP = 3
DATA_IDS = frozenset({"dataloader-bound", "tune-input-pipeline"})


class DelayedBatches(Dataset[models.Batch]):
    """Ready-made batches; ``delay(i)`` seconds of waiting before batch ``i`` is handed out."""

    def __init__(self, batches: list[models.Batch], delay: Callable[[int], float]) -> None:
        self.batches = batches
        self.delay = delay

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i: int) -> models.Batch:
        wait = self.delay(i)
        if wait > 0:
            time.sleep(wait)
        return self.batches[i]


def profiled_steps() -> list[int]:
    """The steps the profiler records with the default settings."""
    c = DiagnoseConfig()
    first = c.profile_skip + c.profile_warmup
    return list(range(first, first + c.profile_active))


def train_from(
    out: Path, delay: Callable[[int], float]
) -> tuple[Session, list[float], list[float]]:
    """Trains the MLP from a DataLoader over `DelayedBatches`: each step's data wait (s) and
    its share of the step."""
    with seeded(0):
        setup = models.make("mlp")
        loader = DataLoader(DelayedBatches(models.batches(setup, STEPS), delay), batch_size=None)
        opt = torch.optim.SGD(setup.model.parameters(), lr=0.05)
        shares: list[float] = []
        waits: list[float] = []
        with diagnose(out) as d:
            it = iter(loader)
            for _ in range(STEPS):
                t0 = time.perf_counter()
                x, y = next(it)
                t1 = time.perf_counter()
                opt.zero_grad(set_to_none=True)
                models.loss_of(setup.model(x), y).backward()
                opt.step()
                waits.append(t1 - t0)
                shares.append((t1 - t0) / (time.perf_counter() - t0))
    return session_of(d), waits, shares


def run_slow(out: Path) -> tuple[Session, Truth]:
    session, _, shares = train_from(out, lambda i: SLOW_S)
    median = statistics.median(shares)
    measured = {"data_share_per_step": [round(s, 3) for s in shares], "median": median}
    premise(median >= 0.3, "the loader slow enough to dominate the step", measured)
    return session, Truth(
        expect=[
            Expect("dataloader-bound", severities=ACTIONABLE),
            Expect("tune-input-pipeline", severities=ACTIONABLE),
        ],
        measured=measured,
    )


def one_stall(stall_step: int = STALL_STEP) -> Callable[[Path], tuple[Session, Truth]]:
    """The control: one batch (at ``stall_step``) stalls, every other one is instant."""

    def run(out: Path) -> tuple[Session, Truth]:
        session, waits, shares = train_from(out, lambda i: STALL_S if i == stall_step else 0.0)
        others = [s for i, s in enumerate(shares) if i != stall_step]
        measured = {
            "data_wait_ms": [round(w * 1000, 2) for w in waits],
            "data_share_per_step": [round(s, 3) for s in shares],
            "stall_step": stall_step,
            "profiled_mean": statistics.fmean(shares[i] for i in profiled_steps()),
            "median_without_stall": statistics.median(others),
        }
        assert waits[stall_step] >= STALL_S, f"the stall did not happen: {measured}"
        premise(statistics.median(others) < 0.03, "the other steps wait for no data", measured)
        return session, Truth(forbid=set(DATA_IDS), measured=measured)

    return run


SCENARIOS = [
    Scenario(
        "dataloader-slow",
        f"Every batch takes {SLOW_S * 1000:.0f} ms to load: the model waits most of each step.",
        run_slow,
    ),
    Scenario(
        "dataloader-one-stall",
        f"An instant loader except one batch that stalls {STALL_S * 1000:.0f} ms, at a "
        "profiled step: the typical step is not data bound.",
        one_stall(),
    ),
]
