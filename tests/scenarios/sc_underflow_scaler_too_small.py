"""FP16 autocast with a GradScaler whose init_scale (2^-20) is far too small and never
grows within the run: (almost) every gradient entering FP16 flushes to zero."""

from pathlib import Path

from ampdiag.session import Session
from tests.scenarios.harness import Scenario, Truth
from tests.scenarios.underflow import run_underflow, truth


def run(out: Path) -> tuple[Session, Truth]:
    session, measured = run_underflow(out, 1.0, 2.0**-20)
    assert measured["boundary_lost_fraction"] > 0.9, measured
    return session, truth(measured, forbid={"grad-scaler-missing"})


SCENARIO = Scenario(
    "underflow-scaler-too-small",
    "FP16 with GradScaler(init_scale=2^-20): gradients flush although a scaler is there.",
    run,
)
