"""A stall: one module's backward overflows FP16 at every loss scale the GradScaler reaches
(65536 down to 4 in 14 steps), so every step is skipped while the loss stays finite. FP32
holds the gradient (measured).

stalled (high) from step 0, naming the module, with cause precision.
"""

from pathlib import Path

from ampdiag.session import Session
from tests.scenarios.divergence import run_stall
from tests.scenarios.harness import Scenario, Truth


def run(out: Path) -> tuple[Session, Truth]:
    return run_stall(out)


SCENARIO = Scenario(
    "diverge-stall-fp16-grad-overflow",
    "A module's backward overflows FP16 at every scale: all 14 steps skipped, finite in FP32.",
    run,
)
