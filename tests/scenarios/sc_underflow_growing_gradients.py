"""FP16 autocast, no GradScaler, and gradients that grow 2^20-fold over 10 steps (the loss
weight ramps up from 1e-6, as a KL or auxiliary loss weight warming up would): the first steps
need a far larger loss scale than the last. The recommended init_scale must cover the worst
sampled step -- the first -- not the end of the run.

Truth from the loop's own FP32 replay of every step (`underflow_steps`): per step the scale
that keeps FP16's loss under 1%, and the share of true gradient values lost per module.
"""

from pathlib import Path

from ampdiag.session import Session
from tests.scenarios.harness import Expect, Scenario, Truth
from tests.scenarios.underflow_steps import run_schedule, underflow_expect

STEPS = 10


def loss_weight(step: int) -> float:
    return 1e-6 * 10 ** (step / 2)


def run(out: Path) -> tuple[Session, Truth]:
    session, measured = run_schedule(out, "mlp", STEPS, loss_weight, None)
    needed = [s["needed_scale_log2"] for s in measured["per_step"] if s["sampled"]]
    assert needed[0] - needed[-1] >= 8, measured  # the first step needs far more than the last
    k = measured["needed_scale_log2"]
    return session, Truth(
        expect=[
            underflow_expect(measured),
            Expect("grad-scaler-missing", evidence={"recommended_init_scale": (2.0**k, 0.0)}),
        ],
        measured=measured,
    )


SCENARIO = Scenario(
    "underflow-growing-gradients",
    "FP16 without a scaler, gradients growing over the run: the first step needs 2^21.",
    run,
)
