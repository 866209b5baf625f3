"""A NaN made in the loss at step 3 of 6, FP32, in the profiled steps.

nonfinite-origin must name that step, the module (or the loss) and the phase.

No FP16 advice: the run does not compute in FP16 (the NaN is not the dtype's fault).
"""

from pathlib import Path

from ampdiag.session import Session
from tests.scenarios.harness import Scenario, Truth
from tests.scenarios.nan import run_nan


def run(out: Path) -> tuple[Session, Truth]:
    return run_nan(out, "loss", 3, 6, None, scaler=False)


SCENARIO = Scenario(
    "nan-loss-early",
    "NaN in the loss at step 3 of 6 (FP32), in the profiled steps.",
    run,
    forbid=frozenset({"prefer-bf16", "tune-grad-scaler", "fp16-grad-underflow"}),
)
