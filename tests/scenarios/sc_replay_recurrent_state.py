"""A recurrent LM that keeps its hidden state on the module between steps (TBPTT), in FP16.

``self.h = h.detach()`` at the end of each forward: the next step starts from it. The
recurrence multiplies the state by 1.5 per token (8 tokens a step), so it passes FP16's 65504
at step ``BAD_STEP`` while FP32 holds it. By the time the step is replayed, the model holds
the state the step *ended* with (1.5^8 = 25.6x larger): a replay from it repeats another
computation. The replay must start from the state the step began with.

Truth, measured without ampdiag: before each step the scenario copies the model (weights and
state); for the first step whose FP16 loss is non-finite it runs that copy's forward in FP32
and takes the largest |output| of its modules -- the number the FP32 replay must report --
and, to show the difference, the same from the state the step ended with. A second model
writes its state in place (``self.h.copy_(...)``): the state the step began with is gone, and
the cause must be "unknown", saying so.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ampdiag.session import Session
from tests.scenarios import models
from tests.scenarios.harness import Expect, Scenario, Truth, diagnose, seeded, session_of

D, H, T, STEPS = 8, 16, 8, 6


class RecurrentLM(nn.Module):
    def __init__(self, in_place: bool) -> None:
        super().__init__()
        self.inp = nn.Linear(D, H)
        self.cell = nn.Linear(H, H, bias=False)
        with torch.no_grad():
            self.cell.weight.copy_(torch.eye(H) * 1.5)
        self.head = nn.Linear(H, 10)
        self.in_place = in_place
        self.h: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.h.clone() if self.h is not None else torch.zeros(x.shape[0], H)
        for t in range(T):
            h = self.cell(h) + self.inp(x[:, t])
        if self.in_place and self.h is not None:
            self.h.copy_(h.detach())
        else:
            self.h = h.detach()
        out: torch.Tensor = self.head(h)
        return out


def _max_output(model: nn.Module, x: torch.Tensor) -> float:
    """The largest |output| of the model's modules in an FP32 forward (the replay's max_abs)."""
    peak = [0.0]

    def hook(m: nn.Module, args: Any, out: torch.Tensor) -> None:
        peak[0] = max(peak[0], float(out.detach().abs().max()))

    handles = [m.register_forward_hook(hook) for m in model.modules()]
    with torch.no_grad():
        model(x)
    for h in handles:
        h.remove()
    return peak[0]


def _run(out: Path, in_place: bool) -> tuple[Session, dict[str, Any]]:
    with seeded(0):
        model = RecurrentLM(in_place)
        g = torch.Generator().manual_seed(1)
        data = [
            (torch.randn(4, T, D, generator=g), torch.randint(0, 10, (4,), generator=g))
            for _ in range(STEPS)
        ]
        copies: list[nn.Module] = []

        def step_hook(step: int) -> None:
            copies.append(copy.deepcopy(model))  # weights and state as the step begins

        with diagnose(out) as d:
            losses = models.train(
                model,
                data,
                dtype=torch.float16,
                scaler=torch.amp.GradScaler("cpu"),
                lr=1e-6,
                step_hook=step_hook,
            )
    bad = next(i for i, v in enumerate(losses) if not math.isfinite(v))
    began = copy.deepcopy(copies[bad]).float()
    began.h = began.h.float() if began.h is not None else None  # the FP16 state, in FP32
    ended = copy.deepcopy(began)
    x = data[bad][0]
    measured = {"first_nonfinite_step": bad, "fp32_max_from_start": _max_output(began, x)}
    ended.h = began.h  # the state the step began with ...
    ended(x)  # ... run once: the state it ended with
    measured["fp32_max_from_end"] = _max_output(ended, x)
    return session_of(d), measured


def _replayed_max(session: Session) -> float | None:
    found = [f for f in session.all_findings() if f.id == "diverged"]
    fp32 = ((found[0].evidence.get("replay") or {}).get("fp32") or {}) if found else {}
    peak = fp32.get("max_abs")
    return float(peak) if isinstance(peak, (int, float)) else None


def run(out: Path) -> tuple[Session, Truth]:
    session, measured = _run(out, in_place=False)
    want = measured["fp32_max_from_start"]
    assert 65504 < want < 1e30 and measured["fp32_max_from_end"] > 10 * want, measured

    def from_start(session: Session) -> str | None:
        got = _replayed_max(session)
        if got is None or abs(got - want) > 1e-4 * want:
            return f"the FP32 replay's max |x| is {got}, the step as it began gives {want}"
        return None

    return session, Truth(
        expect=[
            Expect(
                "diverged",
                step=measured["first_nonfinite_step"],
                evidence={"cause": ("precision", 0), "state_restored": (["(RecurrentLM).h"], 0)},
            )
        ],
        checks={"diverged": from_start},
        measured=measured,
    )


def run_in_place(out: Path) -> tuple[Session, Truth]:
    session, measured = _run(out, in_place=True)

    def says_why(session: Session) -> str | None:
        found = [f for f in session.all_findings() if f.id == "diverged"]
        why = str(found[0].evidence.get("why")) if found else ""
        return None if "written in place" in why else f"the cause does not say why: {why!r}"

    return session, Truth(
        expect=[
            Expect(
                "diverged",
                step=measured["first_nonfinite_step"],
                evidence={"cause": ("unknown", 0)},
            )
        ],
        checks={"diverged": says_why},
        measured=measured,
    )


SCENARIOS = [
    Scenario(
        "replay-recurrent-state",
        "An RNN LM keeps its hidden state on the module (TBPTT): replayed from the step's start.",
        run,
    ),
    Scenario(
        "replay-recurrent-state-in-place",
        "The hidden state written in place: the replay cannot start from it, and says so.",
        run_in_place,
    ),
]
