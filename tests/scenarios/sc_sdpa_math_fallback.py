"""SDPA's math fallback is not autocast's policy: attention dropout on a CPU, BF16 autocast.

A model already on ``F.scaled_dot_product_attention`` trains with attention dropout on a CPU:
no fused CPU kernel takes dropout, so SDPA runs its math path, which casts the BF16 inputs to
FP32 itself and runs its ``bmm``s in FP32. Truth, measured without ampdiag (a dispatch mode of
the scenario's own over one forward of a copy, before the diagnosed run): with dropout the
``bmm``s run in FP32 and no fused kernel runs; with dropout 0 the fused BF16 kernel runs.

The finding must name the fallback and why it ran (dropout on the CPU), never tell the model to
use SDPA, and the report's CUDA table must not list those ``bmm``s as ops CUDA would run in
low precision (on a GPU the call runs a fused kernel). The control (dropout 0): nothing about
SDPA at all.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from ampdiag.analysis.precision import device_differences
from ampdiag.session import Session
from tests.scenarios.harness import HEALTHY_FORBID, Scenario, Truth, diagnose, seeded, session_of

STEPS = 4
SEQ, DIM, HEADS = 128, 32, 2


class Attention(nn.Module):
    def __init__(self, dropout: float) -> None:
        super().__init__()
        self.qkv = nn.Linear(DIM, 3 * DIM)
        self.out = nn.Linear(DIM, DIM)
        self.dropout = dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, DIM))  # type: ignore[no-any-return]


class Model(nn.Module):
    def __init__(self, dropout: float) -> None:
        super().__init__()
        self.attn = Attention(dropout)
        self.head = nn.Linear(DIM, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.attn(x).mean(1))  # type: ignore[no-any-return]


class _Ops(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.seen: set[tuple[str, str]] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kw: Any = None) -> Any:
        out = func(*args, **(kw or {}))
        first = out[0] if isinstance(out, (tuple, list)) and out else out
        dtype = str(first.dtype).removeprefix("torch.") if isinstance(first, torch.Tensor) else ""
        self.seen.add((func.__name__.split(".")[0], dtype))
        return out


def _truth(model: nn.Module, x: torch.Tensor) -> dict[str, bool]:
    """Which path SDPA took, seen by a dispatch mode of our own over one forward of a copy."""
    twin = copy.deepcopy(model).train()
    mode = _Ops()
    with torch.autocast("cpu", dtype=torch.bfloat16), mode:
        twin(x)
    return {
        "fp32_bmm": ("bmm", "float32") in mode.seen,
        "fused": any(op.startswith("_scaled_dot_product_flash") for op, _ in mode.seen),
    }


def _train(out: Path, dropout: float) -> tuple[Session, dict[str, bool]]:
    with seeded(0):
        model = Model(dropout)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        g = torch.Generator().manual_seed(0)
        data = [(torch.randn(4, SEQ, DIM, generator=g), torch.randint(0, 4, (4,), generator=g))
                for _ in range(STEPS)]  # fmt: skip
        measured = _truth(model, data[0][0])
        with diagnose(out, speed_probe=False) as d:
            for x, y in data:
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = F.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
    return session_of(d), measured


def _named(session: Session) -> str | None:
    sec = session.section("precision")
    rows = [r for r in sec.get("ops", []) if r.get("op") == "bmm" and r.get("precision") == "fp32"]
    if not rows or any(r.get("reason") != "sdpa-math-fallback" for r in rows):
        return f"FP32 bmm's not all labelled sdpa-math-fallback: {[r.get('reason') for r in rows]}"
    texts = [f.fix for f in session.all_findings()] + list(
        (session.section("derived").get("precision") or {}).get("reason_fixes", {}).values()
    )
    if any("use F.scaled_dot_product_attention" in t or "instead of a hand-written" in t
           for t in texts):  # fmt: skip
        return "a model already on SDPA was told to use it"
    f = next((f for f in session.findings if f.id == "fp32-ops-in-autocast"), None)
    if f is None or "math path (dropout_p=0.1 on the CPU" not in f.fix:
        return f"the fallback and its cause are not named: {f.fix if f else None}"
    if any(r["op"] == "bmm" for r in device_differences(sec)):
        return "the CUDA table lists SDPA's bmm's as ops CUDA runs in low precision"
    return None


def run(out: Path) -> tuple[Session, Truth]:
    session, measured = _train(out, 0.1)
    assert measured == {"fp32_bmm": True, "fused": False}, measured
    return session, Truth(checks={"fp32-ops-in-autocast": _named}, measured=measured)


def _silent(session: Session) -> str | None:
    rows = session.section("precision").get("ops", [])
    if any(r.get("reason") == "sdpa-math-fallback" for r in rows):
        return "a fused SDPA call was read as its math fallback"
    return None


def run_healthy(out: Path) -> tuple[Session, Truth]:
    session, measured = _train(out, 0.0)
    assert measured == {"fp32_bmm": False, "fused": True}, measured
    return session, Truth(
        forbid=set(HEALTHY_FORBID), checks={"sdpa-silent": _silent}, measured=measured
    )


SCENARIOS = [
    Scenario(
        "sdpa-math-fallback",
        "Attention dropout on a CPU: SDPA's math path in FP32, named as such (not autocast's).",
        run,
    ),
    Scenario(
        "sdpa-fused-healthy",
        "The same model with dropout 0: SDPA's fused BF16 kernel, nothing about SDPA.",
        run_healthy,
        forbid=HEALTHY_FORBID,
    ),
]
