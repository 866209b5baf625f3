"""A learning rate too high (SGD lr 20): the MLP diverges in FP32 (NaN from step 7), as in BF16.

diverged (high) with cause not-precision, at the step the run itself first went non-finite;
no precision advice (prefer-*, tune-grad-scaler).
"""

from pathlib import Path

from ampdiag.session import Session
from tests.scenarios.divergence import run_lr
from tests.scenarios.harness import Scenario, Truth


def run(out: Path) -> tuple[Session, Truth]:
    return run_lr(out, None)


SCENARIO = Scenario(
    "diverge-lr-fp32",
    "A learning rate too high (SGD lr 20): the MLP diverges in FP32 (NaN from step 7), as in BF16.",
    run,
)
