"""The control of `sc_lowprec_bf16_weights`: FP32 weights under BF16 autocast lose no update.

The same GPT, data, AdamW and learning rate, the weights kept in FP32 and the forward under
BF16 autocast: the loop counts, itself, around every optimizer step, the elements whose
gradient was nonzero and whose value the step left unchanged -- under one in 10^3. No
``low-precision-params`` and no numerics or misuse finding may appear.
"""

from __future__ import annotations

from pathlib import Path

from ampdiag.session import Session
from tests.scenarios import lowprec
from tests.scenarios.harness import HEALTHY_FORBID, Scenario, Truth, session_of


def run(out: Path) -> tuple[Session, Truth]:
    d, m = lowprec.run(out, bf16_weights=False)
    # the control is healthy: FP32 weights, and at most one update in 10^3 lost on any step.
    # A lost one is an element whose gradient is tiny against Adam's eps, so that its step is
    # below half of FP32's spacing at its value; how many depends on the CPU's BF16 kernels:
    # measured at most 1.6e-4 (Xeon, AMX) and 1.9e-4 (AMD EPYC, AVX2) on a step. The limit is
    # 5x over those and 500x under the BF16-weights run's floor (0.5, sc_lowprec_bf16_weights).
    assert m.param_dtypes == {"torch.float32"}, m.param_dtypes
    assert max(m.share(i) for i in range(len(m.steps))) < 1e-3, m.steps
    return session_of(d), Truth(
        forbid={"low-precision-params"},
        measured={"unchanged_per_step": [u for _, u in m.steps]},
    )


SCENARIO = Scenario(
    "lowprec-fp32-master",
    "FP32 weights under BF16 autocast, AdamW lr 1e-4: the updates land (control).",
    run,
    forbid=HEALTHY_FORBID,
)
