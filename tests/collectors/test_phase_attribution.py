"""Ops belong to the phase and module that ran them, and gradients are read when complete.

Truths measured here without ampdiag: the matmuls one Linear's backward runs (a dispatch mode
around a lone Linear), the ops Adam's update runs (a dispatch mode around a lone step), and
the gradient norm of each step (read inside the closure, after its backward).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import ampdiag

QUIET: dict[str, Any] = {
    "report": False,
    "tensorboard": False,
    "console": False,
    "profile": False,
    "memory": False,
    "speed_probe": False,
}


class OpNames(TorchDispatchMode):
    """Counts the ATen ops run inside it by name (the test's own truth)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[str, int] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = func._schema.name.split("::", 1)[-1]
        self.counts[name] = self.counts.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


class Block(nn.Module):
    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.fc = nn.Linear(dim, dim)
        self.proj = nn.Linear(dim, dim)
        self.drop = nn.Dropout(0.0)  # an identity: returns its input tensor itself

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop(self.proj(torch.relu(self.fc(x))))


def _backward_mm_of_a_linear() -> int:
    lin = nn.Linear(16, 16)
    x = torch.randn(4, 16, requires_grad=True)
    y = lin(x).sum()
    with OpNames() as names:
        y.backward()
    return names.counts.get("mm", 0)


def test_identity_module_does_not_take_the_projections_backward(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(Block(), Block())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with ampdiag.diagnose(out=tmp_path, **QUIET) as d:
        for _ in range(2):
            opt.zero_grad()
            x = torch.randn(4, 16, requires_grad=True)  # every Linear gets a grad_input matmul
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(x).float().pow(2).mean()
            loss.backward()
            opt.step()
    assert d.session is not None
    ops = d.session.sections["precision"]["ops"]
    backward = [r for r in ops if r["phase"] == "backward"]
    per_linear = _backward_mm_of_a_linear()
    assert per_linear == 2
    for block in ("0", "1"):
        for linear in ("fc", "proj"):
            mm = sum(
                r["count"]
                for r in backward
                if r["module"] == f"{block}.{linear}" and r["op"] == "mm"
            )
            assert mm == per_linear, (block, linear)
        assert not [r for r in backward if r["module"] == f"{block}.drop"]


def _adam_ops() -> set[str]:
    p = nn.Parameter(torch.randn(4))
    p.grad = torch.randn(4)
    opt = torch.optim.Adam([p], foreach=False)
    with OpNames() as names:
        opt.step()
    return set(names.counts)


def test_closure_optimizer_ops_and_gradients(tmp_path: Path) -> None:
    # Lightning's automatic optimisation: forward and backward run inside optimizer.step.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.Adam(model.parameters(), foreach=False)
    norms: list[float] = []
    steps = 3
    with ampdiag.diagnose(out=tmp_path, sample_every=1, numerics_sample_elements=0, **QUIET) as d:
        for _ in range(steps):
            x = torch.randn(8, 16)

            def closure(x: torch.Tensor = x) -> torch.Tensor:
                opt.zero_grad()
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = model(x).float().pow(2).mean()
                loss.backward()
                grads = [p.grad for p in model.parameters() if p.grad is not None]
                norms.append(
                    float(torch.linalg.vector_norm(torch.cat([g.flatten() for g in grads])))
                )
                return loss

            opt.step(closure)
    session = d.session
    assert session is not None and session.status == "ok"
    assert len(session.steps) == steps
    # Gradient statistics are the step's own (read after the closure, before the update).
    got = [s["norm"] for s in session.sections["gradients"]["steps"]]
    assert got == pytest.approx(norms, rel=1e-5), (got, norms)
    # The audit saw the closure's forward and backward, and none of Adam's update.
    ops = session.sections["precision"]["ops"]
    assert {r["phase"] for r in ops} == {"forward", "backward"}
    assert any(r["op"] == "addmm" and r["module"] == "0" for r in ops)
    with OpNames() as closure_ops:  # the same forward and backward, outside any optimizer
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(torch.randn(8, 16)).float().pow(2).mean()
        loss.backward()
    adam_only = _adam_ops() - set(closure_ops.counts)
    assert {"addcdiv_", "addcmul_", "sqrt"} <= adam_only  # the truth has teeth
    assert not adam_only & {r["op"] for r in ops}, adam_only & {r["op"] for r in ops}
    assert "low-precision-inactive" not in {f.id for f in session.findings}
    for f in session.findings:  # a timing finding may come (the loss's FP32 ops): never Adam's
        if f.id == "fp32-ops-in-autocast":
            assert not {o["op"] for o in f.evidence["top_ops"]} & adam_only
