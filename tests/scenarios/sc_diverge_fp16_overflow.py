"""An FP16 overflow FP32 holds: a module multiplies by 40000 (|x| ~ 9e4 > 65504) before a
LayerNorm; FP16 autocast + GradScaler. Every step is inf in FP16 and finite in FP32 (measured).

diverged (high) with cause precision (forward overflow) at step 0, naming the module.
"""

from pathlib import Path

from ampdiag.session import Session
from tests.scenarios.divergence import run_fp16_overflow
from tests.scenarios.harness import Scenario, Truth


def run(out: Path) -> tuple[Session, Truth]:
    return run_fp16_overflow(out)


SCENARIO = Scenario(
    "diverge-fp16-overflow",
    "x * 40000 before a LayerNorm overflows FP16 every step (finite in FP32): precision-caused.",
    run,
)
