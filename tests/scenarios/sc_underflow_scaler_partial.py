"""FP16 autocast with a GradScaler at scale 2^-7 (fixed within the run), loss as usual: part
of the gradients entering FP16 become subnormal or zero; a larger scale fixes it."""

from pathlib import Path

from ampdiag.session import Session
from tests.scenarios.harness import Scenario, Truth
from tests.scenarios.underflow import run_underflow, truth


def run(out: Path) -> tuple[Session, Truth]:
    session, measured = run_underflow(out, 1.0, 2.0**-7)
    assert 0.1 < measured["boundary_lost_fraction"] < 0.9, measured
    return session, truth(measured, forbid={"grad-scaler-missing"})


SCENARIO = Scenario(
    "underflow-scaler-partial",
    "FP16 with GradScaler(init_scale=2^-7): part of the gradients underflow.",
    run,
)
