"""A 0/0 in one micro-batch of an FP16 + GradScaler run (a row of zeros normalized by its norm).

NaN in FP32 too (measured): not precision. The scaler skips that step and the run recovers:
nonfinite-origin names the module and step; no diverged, no precision advice that lists it.
"""

from pathlib import Path

from ampdiag.session import Session
from tests.scenarios.divergence import run_zero_over_zero
from tests.scenarios.harness import Scenario, Truth


def run(out: Path) -> tuple[Session, Truth]:
    return run_zero_over_zero(out)


SCENARIO = Scenario(
    "diverge-zero-over-zero-fp16",
    "0/0 in micro-batch 1 of step 5 (FP16 + GradScaler, 2 micro-batches): NaN in FP32 too.",
    run,
)
