"""FP16 autocast, no GradScaler, the loss multiplied by 0.008: part of the gradient entering
FP16 falls below its normal range (zero or subnormal)."""

from pathlib import Path

from ampdiag.session import Session
from tests.scenarios.harness import Expect, Scenario, Truth
from tests.scenarios.underflow import run_underflow, truth


def run(out: Path) -> tuple[Session, Truth]:
    session, measured = run_underflow(out, 0.008, None)
    frac = measured["underflow_fraction"]
    assert 0.1 < measured["boundary_lost_fraction"] < 0.9, measured
    return session, truth(
        measured, Expect("grad-scaler-missing", evidence={"underflow_fraction": (frac, 0.03)})
    )


SCENARIO = Scenario(
    "underflow-partial-no-scaler",
    "FP16 without a GradScaler, loss x 0.008: part of the gradients underflow.",
    run,
)
