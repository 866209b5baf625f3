"""A NaN made in the backward at step 2 of 6, FP32, in the profiled steps.

nonfinite-origin must name that step, the module (or the loss) and the phase.

No FP16 advice: the run does not compute in FP16 (the NaN is not the dtype's fault).
"""

from pathlib import Path

from ampdiag.session import Session
from tests.scenarios.harness import Scenario, Truth
from tests.scenarios.nan import run_nan


def run(out: Path) -> tuple[Session, Truth]:
    return run_nan(out, "backward", 2, 6, None, scaler=False)


SCENARIO = Scenario(
    "nan-backward-early",
    "NaN in the backward at step 2 of 6 (FP32), in the profiled steps.",
    run,
    forbid=frozenset({"prefer-bf16", "tune-grad-scaler", "fp16-grad-underflow"}),
)
