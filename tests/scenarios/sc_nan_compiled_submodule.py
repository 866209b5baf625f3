"""A NaN made by a submodule of a ``torch.compile``d model is named by that submodule.

The sentinel sees a compiled model as one module (its submodules run inside the compiled
graph: "(OptimizedModule)"). The replay of the first non-finite step runs the wrapped module
eagerly, in the run's own precision, with each submodule watched, and names the one that made
the value. The model (BF16 autocast, compiled with the ``eager`` backend: no C compiler
needed) takes the square root of a feature that is negative only in step 3's batch, in its
submodule ``root``. The truth is measured without ampdiag: the uncompiled model, run on each
batch with a forward hook on every module, records the first step and the module whose input
was finite and output not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from ampdiag.session import Session
from tests.scenarios.harness import Expect, Scenario, Truth, diagnose, seeded, session_of

STEPS, BAD_STEP = 6, 3


class Sqrt(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sqrt(x)


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.act = nn.ReLU()
        self.root = Sqrt()
        self.out = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.root(self.act(self.inp(x)) + x[:, :1]))


def _data() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    data = [torch.rand(4, 8, generator=g) + 5 for _ in range(STEPS)]
    data[BAD_STEP][0, 0] = -100.0
    return data


def _origin(model: nn.Module, data: list[torch.Tensor]) -> tuple[int, str] | None:
    """The first (step, module) whose input is finite and output not, hooks on the eager model."""
    names = {m: n for n, m in model.named_modules() if n}
    found: list[tuple[int, str]] = []
    step = 0

    def hook(m: nn.Module, inputs: Any, output: torch.Tensor) -> None:
        finite_in = bool(torch.isfinite(inputs[0]).all())
        if not found and finite_in and not bool(torch.isfinite(output).all()):
            found.append((step, names[m]))

    handles = [m.register_forward_hook(hook) for m in names]
    with torch.no_grad():
        for step, x in enumerate(data):  # noqa: B007 (read by the hook)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                model(x)
    for h in handles:
        h.remove()
    return found[0] if found else None


def run(out: Path) -> tuple[Session, Truth]:
    data = _data()
    with seeded(0):
        model = Model()
        truth = _origin(model, data)
        compiled = torch.compile(model, backend="eager")
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        with diagnose(out) as d:
            for x in data:
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = compiled(x).float().pow(2).mean()
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
    assert truth is not None and truth[0] == BAD_STEP, truth
    step, module = truth
    return session_of(d), Truth(
        expect=[
            Expect("nonfinite-origin", module=module, step=step),
            Expect("diverged", module=module, step=step),
        ],
        measured={"first_nonfinite": truth},
    )


SCENARIO = Scenario(
    "nan-compiled-submodule",
    "sqrt of a negative in submodule `root` of a torch.compile'd model at step 3.",
    run,
)
