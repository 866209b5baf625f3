"""A NaN made in the forward at step 2 of 6, BF16 autocast, in the profiled steps.

nonfinite-origin must name that step, the module (or the loss) and the phase.

No FP16 advice: the run does not compute in FP16 (the NaN is not the dtype's fault).
"""

from pathlib import Path

import torch

from ampdiag.session import Session
from tests.scenarios.harness import Scenario, Truth
from tests.scenarios.nan import run_nan


def run(out: Path) -> tuple[Session, Truth]:
    return run_nan(out, "forward", 2, 6, torch.bfloat16, scaler=False)


SCENARIO = Scenario(
    "nan-forward-early",
    "NaN in the forward at step 2 of 6 (BF16 autocast), in the profiled steps.",
    run,
    forbid=frozenset({"prefer-bf16", "tune-grad-scaler", "fp16-grad-underflow"}),
)
