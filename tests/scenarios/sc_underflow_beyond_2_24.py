"""FP16 autocast, GradScaler at 1.0, the loss multiplied by 1e-12: the gradients are so small
that only a scale beyond 2^24 keeps them in FP16's range; the recommendation must say which."""

from pathlib import Path

from ampdiag.session import Session
from tests.scenarios.harness import Scenario, Truth
from tests.scenarios.underflow import run_underflow, truth


def run(out: Path) -> tuple[Session, Truth]:
    session, measured = run_underflow(out, 1e-12, 1.0)
    k = measured["needed_scale_log2"]
    assert k is not None and k > 24, measured
    return session, truth(measured, forbid={"grad-scaler-missing"})


SCENARIO = Scenario(
    "underflow-beyond-2-24",
    "FP16 with loss x 1e-12: the needed init_scale is beyond 2^24.",
    run,
)
