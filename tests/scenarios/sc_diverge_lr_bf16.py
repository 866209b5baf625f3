"""A learning rate too high in a BF16 run: it diverges in FP32 too (measured), so not precision.

diverged (high) with cause not-precision, at the step the run itself first went non-finite;
no precision advice (prefer-*, tune-grad-scaler).
"""

from pathlib import Path

import torch

from ampdiag.session import Session
from tests.scenarios.divergence import run_lr
from tests.scenarios.harness import Scenario, Truth


def run(out: Path) -> tuple[Session, Truth]:
    return run_lr(out, torch.bfloat16)


SCENARIO = Scenario(
    "diverge-lr-bf16",
    "A learning rate too high in a BF16 run: it diverges in FP32 too (measured), so not precision.",
    run,
)
