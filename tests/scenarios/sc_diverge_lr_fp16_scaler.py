"""A learning rate too high in FP16 + GradScaler: FP16 overflows first (step 8), at weights
that diverge in FP32 and BF16 too (step 7).

diverged (high) with cause not-precision, at the step the run itself first went non-finite;
no precision advice (prefer-*, tune-grad-scaler).
"""

from pathlib import Path

import torch

from ampdiag.session import Session
from tests.scenarios.divergence import run_lr
from tests.scenarios.harness import Scenario, Truth


def run(out: Path) -> tuple[Session, Truth]:
    return run_lr(out, torch.float16)


SCENARIO = Scenario(
    "diverge-lr-fp16-scaler",
    (
        "A learning rate too high in FP16 + GradScaler: FP16 overflows first (step 8), at "
        "weights that diverge in FP32 and BF16 too (step 7)."
    ),
    run,
)
