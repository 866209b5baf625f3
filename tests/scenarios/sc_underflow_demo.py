"""The model `ampdiag demo` trains by default (TinyGPT, FP16 autocast, no GradScaler): the
gradients of its language-model loss are about 1/(tokens x vocabulary) at the head, and FP16
holds most of them as zero or subnormal.

Truth from the loop's own FP32 replay of every step (`underflow_steps`), as for the other
underflow scenarios: per module the share of nonzero true gradient values FP16 loses, and the
loss scale the worst sampled step needs. The demo's console and report show these figures.
"""

from pathlib import Path

from ampdiag.session import Session
from tests.scenarios.harness import Scenario, Truth
from tests.scenarios.underflow_steps import no_scaler_truth, run_schedule


def run(out: Path) -> tuple[Session, Truth]:
    session, measured = run_schedule(out, "demo", 3, lambda step: 1.0, None, batch_size=8)
    assert measured["activation_lost_fraction"] > 0.2, measured
    return session, no_scaler_truth(measured)


SCENARIO = Scenario(
    "underflow-demo",
    "ampdiag demo's model in FP16 without a scaler: most of its gradients underflow.",
    run,
)
