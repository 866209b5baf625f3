"""A NaN made in the loss at step 33 of 50, FP32, between sampled steps.

nonfinite-origin must name that step, the module (or the loss) and the phase.

No FP16 advice: the run does not compute in FP16 (the NaN is not the dtype's fault).
"""

from pathlib import Path

from ampdiag.session import Session
from tests.scenarios.harness import Scenario, Truth
from tests.scenarios.nan import run_nan


def run(out: Path) -> tuple[Session, Truth]:
    return run_nan(out, "loss", 33, 50, None, scaler=False)


SCENARIO = Scenario(
    "nan-loss-late",
    "NaN in the loss at step 33 of 50 (FP32), between sampled steps.",
    run,
    forbid=frozenset({"prefer-bf16", "tune-grad-scaler", "fp16-grad-underflow"}),
)
