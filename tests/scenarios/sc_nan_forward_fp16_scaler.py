"""A NaN made in the forward at step 33 of 50, FP16 autocast + GradScaler, between sampled steps.

nonfinite-origin must name that step, the module (or the loss) and the phase.
"""

from pathlib import Path

import torch

from ampdiag.session import Session
from tests.scenarios.harness import Scenario, Truth
from tests.scenarios.nan import run_nan


def run(out: Path) -> tuple[Session, Truth]:
    return run_nan(out, "forward", 33, 50, torch.float16, scaler=True)


SCENARIO = Scenario(
    "nan-forward-fp16-scaler",
    "NaN in the forward at step 33 of 50 (FP16 autocast + GradScaler), between sampled steps.",
    run,
)
