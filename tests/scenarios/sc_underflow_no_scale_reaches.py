"""FP16 autocast, no GradScaler, and output gradients spread over 2^40 (half the classes'
logits weighted by 1e-12): no loss scale keeps the small ones without overflowing the large
ones. The finding must say plainly that no scale reaches the target (BF16 is the fix)."""

from pathlib import Path

from ampdiag.session import Session
from tests.scenarios.harness import Scenario, Truth
from tests.scenarios.underflow import run_underflow, truth


def run(out: Path) -> tuple[Session, Truth]:
    session, measured = run_underflow(out, 1.0, None, spread=1e-12)
    assert measured["needed_scale_log2"] is None, measured
    return session, truth(measured)


SCENARIO = Scenario(
    "underflow-no-scale-reaches",
    "FP16 gradients spanning more than FP16's range: no init_scale works.",
    run,
)
