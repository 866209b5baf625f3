"""Pure BF16 weights with a small learning rate: most of AdamW's updates round away.

``model.to(torch.bfloat16)`` and AdamW at lr 1e-4 (a small GPT, 12 steps, BF16 autocast): the
loop counts, itself, around every optimizer step, the elements whose gradient was nonzero and
whose BF16 value the step left unchanged (`tests.scenarios.lowprec`) -- about nine in ten.

What must hold: ``low-precision-params`` (high) names every BF16 parameter (count and
elements counted here), its overall share of lost updates within 0.05 of the loop's mean
over every step (ampdiag measures sampled steps and sampled values), and the worst step it
names with that step's share as the loop counted it (within 0.02); the fix keeps FP32
weights (under ``torch.autocast(device_type='cpu', dtype=torch.bfloat16)``, this run's
device, or in FP32 where the precision A/B measured FP32 the fastest).
"""

from __future__ import annotations

from pathlib import Path

from ampdiag.session import Session
from tests.scenarios import lowprec
from tests.scenarios.harness import Expect, Scenario, Truth, session_of


def run(out: Path) -> tuple[Session, Truth]:
    d, m = lowprec.run(out, bf16_weights=True)
    session = session_of(d)
    params, numel = m.params, m.numel
    # the fault is real: most updates are lost, on every step
    assert m.param_dtypes == {"torch.bfloat16"}, m.param_dtypes
    assert min(m.share(i) for i in range(len(m.steps))) > 0.5, m.steps

    def worst_step(s: Session) -> str | None:
        f = next((f for f in s.all_findings() if f.id == "low-precision-params"), None)
        if f is None:
            return "low-precision-params absent"
        step, share = f.evidence.get("worst_step"), f.evidence.get("worst_step_unchanged_share")
        if not isinstance(step, int) or not 0 <= step < len(m.steps):
            return f"worst_step {step!r} is not a step of the run"
        if not isinstance(share, float) or abs(share - m.share(step)) > 0.02:
            return f"step {step}: share {share!r}, the loop counted {m.share(step):.4f}"
        code = f.fix or ""
        # FP32 weights, under BF16 autocast or in FP32 (the precision A/B's timing picks one)
        if "model = model.float()" not in code:
            return f"the fix keeps no FP32 weights: {code!r}"
        autocast = f"torch.autocast(device_type={m.device!r}, dtype=torch.bfloat16)"
        if "torch.autocast(" in code and autocast not in code:
            return f"the fix's autocast is not BF16 on this run's device ({m.device}): {code!r}"
        if "cuda" in code:
            return f"the fix of a {m.device} run names CUDA: {code!r}"
        return None

    return session, Truth(
        expect=[
            Expect(
                "low-precision-params",
                evidence={
                    "low_precision_params": (params, 0),
                    "low_precision_numel": (numel, 0),
                    "dtypes": ({"bfloat16": params}, 0),
                    "unchanged_share": (m.mean_share, 0.05),
                },
                severities=frozenset({"high"}),
            )
        ],
        forbid={"fp16-grad-underflow", "grad-scaler-missing"},
        measured={
            "unchanged_share_per_step": [round(m.share(i), 4) for i in range(len(m.steps))],
            "mean": m.mean_share,
            "params": params,
            "numel": numel,
        },
        checks={"low-precision-params-worst-step": worst_step},
    )


SCENARIO = Scenario(
    "lowprec-bf16-weights",
    "model.to(torch.bfloat16) + AdamW lr 1e-4: most updates round away in BF16.",
    run,
)
