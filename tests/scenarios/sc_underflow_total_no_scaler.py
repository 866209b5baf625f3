"""FP16 autocast, no GradScaler, the loss multiplied by 1e-7: every gradient entering FP16
flushes to zero, so every parameter gradient is exactly zero and the model cannot learn."""

from pathlib import Path

from ampdiag.session import Session
from tests.scenarios.harness import Expect, Scenario, Truth
from tests.scenarios.underflow import run_underflow, truth


def run(out: Path) -> tuple[Session, Truth]:
    session, measured = run_underflow(out, 1e-7, None)
    assert measured["boundary_lost_fraction"] > 0.99 and measured["param_grad_zero_fraction"] == 1
    return session, truth(
        measured,
        Expect("grad-scaler-missing", evidence={"underflow_fraction": (1.0, 0.03)}),
    )


SCENARIO = Scenario(
    "underflow-total-no-scaler",
    "FP16 without a GradScaler, loss x 1e-7: 100% of gradients flush to zero.",
    run,
)
