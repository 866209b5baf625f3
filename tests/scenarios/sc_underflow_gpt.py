"""A nanoGPT-style model (causal self-attention with q/k/v and output projections, GELU MLP,
tied-free LM head) in FP16 autocast without a GradScaler, plain cross-entropy loss: the
gradient reaching the LM head is ~1/(tokens x vocab), and FP16 loses most of what enters the
attention's input projection and the first MLP layer.

Truth from the loop's own FP32 replay of every step (`underflow_steps`): per module the share
of nonzero true gradient values FP16 holds as zero or subnormal, and the loss scale the worst
sampled step needs.
"""

from pathlib import Path

from ampdiag.session import Session
from tests.scenarios.harness import Scenario, Truth
from tests.scenarios.underflow_steps import no_scaler_truth, run_schedule


def run(out: Path) -> tuple[Session, Truth]:
    session, measured = run_schedule(out, "gpt", 3, lambda step: 1.0, None)
    assert measured["module_lost_fraction"]["h.0.attn.c_attn"] > 0.5, measured
    return session, no_scaler_truth(measured)


SCENARIO = Scenario(
    "underflow-gpt",
    "nanoGPT-style model in FP16 without a scaler: attention projections lose most values.",
    run,
)
