"""A NaN made in the forward at step 33 of 50 (fp16 + GradScaler1), between the sampled steps (10, 30, 50).

nonfinite-origin must name that step and the module (or the loss), and the phase."""

from pathlib import Path

import torch

from ampdiag.session import Session
from tests.scenarios.harness import Scenario, Truth
from tests.scenarios.nan import run_nan


def run(out: Path) -> tuple[Session, Truth]:
    return run_nan(out, "forward", 33, 50, torch.float16, scaler=bool(1))


SCENARIO = Scenario(
    "nan-forward-fp16-scaler",
    "A NaN made in the forward at step 33 of 50 (fp16 + GradScaler1), between the sampled steps (10, 30, 50).",
    run,
)
