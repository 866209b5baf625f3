"""FP16 underflow with autocast entered around the loop, in a wrapped forward, or inside forward.

The same computation three ways (`tests.autocast_placement`): a small ResNet-like CNN in
FP16 autocast without a GradScaler and a tiny loss. Autocast wraps the loop's forward and
loss; or ``model.forward`` the way Accelerate (and HF Trainer) wraps it, entered after the
model's forward pre-hooks; or it is entered inside ``forward``. The diagnosis must be the
same: FP16 underflow at the share of parameter-gradient values the scenario counts itself,
and the missing GradScaler; autocast must never be called inactive.
"""

from __future__ import annotations

from pathlib import Path

from ampdiag.session import Session
from tests.autocast_placement import PLACEMENTS, train
from tests.scenarios.harness import Expect, Scenario, Truth


def _runner(placement: str):  # type: ignore[no-untyped-def]
    def run(out: Path) -> tuple[Session, Truth]:
        session, measured = train(placement, out)
        fraction = measured["param_grad_subnormal_fraction"]
        assert fraction > 0.2, measured  # the fault is there
        return session, Truth(
            expect=[
                Expect(
                    "fp16-grad-underflow",
                    evidence={"param_grad_subnormal_fraction": (fraction, 1e-6)},
                ),
                Expect("grad-scaler-missing"),
            ],
            measured=measured,
        )

    return run


SCENARIOS = [
    Scenario(
        name=f"fp16-underflow-autocast-{placement}",
        description=f"FP16 underflow, no GradScaler; autocast entered: {placement}.",
        run=_runner(placement),
        forbid=frozenset({"low-precision-inactive", "amp-off"}),
    )
    for placement in PLACEMENTS
]
