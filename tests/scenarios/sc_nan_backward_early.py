"""A NaN made in the backward at step 2 of 6 (none0), inside the profiler's recorded steps (never sampled by default).

nonfinite-origin must name that step and the module (or the loss), and the phase."""

from pathlib import Path

import torch

from ampdiag.session import Session
from tests.scenarios.harness import Scenario, Truth
from tests.scenarios.nan import run_nan


def run(out: Path) -> tuple[Session, Truth]:
    return run_nan(out, "backward", 2, 6, None, scaler=bool(0))


SCENARIO = Scenario(
    "nan-backward-early",
    "A NaN made in the backward at step 2 of 6 (none0), inside the profiler's recorded steps (never sampled by default).",
    run,
    forbid=frozenset({"prefer-bf16", "tune-grad-scaler", "fp16-grad-underflow"}),
)
