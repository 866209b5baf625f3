"""A NaN made in the forward at step 33 of 50 (none0), between the sampled steps (10, 30, 50).

nonfinite-origin must name that step and the module (or the loss), and the phase."""

from pathlib import Path

import torch

from ampdiag.session import Session
from tests.scenarios.harness import Scenario, Truth
from tests.scenarios.nan import run_nan


def run(out: Path) -> tuple[Session, Truth]:
    return run_nan(out, "forward", 33, 50, None, scaler=bool(0))


SCENARIO = Scenario(
    "nan-forward-late",
    "A NaN made in the forward at step 33 of 50 (none0), between the sampled steps (10, 30, 50).",
    run,
    forbid=frozenset({"prefer-bf16", "tune-grad-scaler", "fp16-grad-underflow"}),
)
