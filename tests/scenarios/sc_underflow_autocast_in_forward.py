"""FP16 underflow in a model that enters autocast inside its own forward, so that no replay
through the model's forward is FP32 by itself.

* ``underflow-accelerate-fp16``: what ``Accelerator(mixed_precision="fp16").prepare(model)``
  does to the model on a GPU (accelerate 1.15, ``Accelerator.prepare_model``): the instance's
  ``forward`` becomes the class's forward wrapped in ``torch.autocast(float16)`` and in
  ``convert_outputs_to_fp32``, the original kept as ``model._original_forward``. Accelerate
  enters no autocast for fp16 on a CPU (it refuses the GradScaler there and trains in FP32),
  so the CPU's FP16 autocast stands in for the GPU's. A GradScaler at 1.0 and the loss
  multiplied by 1e-12: only a scale beyond 2^24 keeps the gradients inside the model.
* ``underflow-forward-autocast``: a user's model whose class ``forward`` enters
  ``torch.autocast(float16)`` itself, without a GradScaler, the loss multiplied by 1e-6.

In both every gradient flushes to zero where it enters FP16 (the model's output), so the
FP16 gradients inside the model are all zero: only an FP32 replay tells the scale they need.

Truth as in every underflow scenario (`underflow.run_underflow`): the FP32 gradients from a
plain MLP, loaded with each sampled step's weights, whose forward enters no autocast.
"""

from __future__ import annotations

from pathlib import Path
from types import MethodType

import torch

from ampdiag.session import Session
from tests.scenarios import models
from tests.scenarios.harness import Expect, Scenario, Truth
from tests.scenarios.underflow import run_underflow, truth


def accelerate_fp16(model: torch.nn.Module) -> torch.nn.Module:
    """``Accelerator.prepare_model``'s mixed-precision lines, with the CPU's FP16 autocast."""
    from accelerate.utils import convert_outputs_to_fp32

    model._original_forward = model.forward
    autocast_context = torch.autocast(device_type="cpu", dtype=torch.float16)
    model_forward_func = model.forward.__func__  # type: ignore[attr-defined]
    new_forward = autocast_context(model_forward_func)
    model.forward = MethodType(new_forward, model)  # type: ignore[method-assign]
    model.forward = MethodType(  # type: ignore[method-assign]
        convert_outputs_to_fp32(model.forward.__func__), model
    )
    return model


class AutocastMLP(models.MLP):
    """The MLP, its forward entering FP16 autocast itself."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.float16):
            return super().forward(x)


def autocast_mlp(model: torch.nn.Module) -> torch.nn.Module:
    own = AutocastMLP()
    own.load_state_dict(model.state_dict())
    return own


def run_accelerate(out: Path) -> tuple[Session, Truth]:
    session, measured = run_underflow(out, 1e-12, 1.0, prepare=accelerate_fp16)
    k = measured["needed_scale_log2"]
    assert measured["boundary_lost_fraction"] > 0.99 and k is not None and k > 24, measured
    return session, truth(measured, forbid={"grad-scaler-missing"})


def run_forward_autocast(out: Path) -> tuple[Session, Truth]:
    session, measured = run_underflow(out, 1e-6, None, prepare=autocast_mlp)
    frac = measured["underflow_fraction"]
    k = measured["needed_scale_log2"]
    assert measured["boundary_lost_fraction"] > 0.99 and k is not None and k > 16, measured
    return session, truth(
        measured, Expect("grad-scaler-missing", evidence={"underflow_fraction": (frac, 0.03)})
    )


SCENARIOS = [
    Scenario(
        "underflow-accelerate-fp16",
        "Accelerate's fp16 forward (autocast inside), loss x 1e-12: the needed init_scale "
        "is beyond 2^24.",
        run_accelerate,
    ),
    Scenario(
        "underflow-forward-autocast",
        "A forward that enters FP16 autocast itself, no GradScaler, loss x 1e-6.",
        run_forward_autocast,
    ),
]


class CastingMLP(models.MLP):
    """The MLP under its own FP16 autocast, casting the head's input to FP16 itself (as code
    that feeds an FP16-only kernel does): no replay of this forward computes in FP32."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.float16):
            return self.head(self.body(x).half())


def casting_mlp(model: torch.nn.Module) -> torch.nn.Module:
    own = CastingMLP()
    own.load_state_dict(model.state_dict())
    return own


def names_the_cast(session: Session) -> str | None:
    found = [f for f in session.all_findings() if f.id == "fp16-grad-underflow"]
    why = found[0].evidence.get("unmeasured", {}) if found else {}
    reason = str(why.get("recommended_init_scale"))
    return None if "half returned torch.float16" in reason else f"unmeasured: {why!r}"


def run_cast_in_forward(out: Path) -> tuple[Session, Truth]:
    session, measured = run_underflow(out, 1e-6, None, prepare=casting_mlp)
    k = measured["needed_scale_log2"]
    assert measured["boundary_lost_fraction"] > 0.99 and k is not None and k > 16, measured
    # What a replay through FP16 would say (the scale the output's gradient needs) is far
    # below the truth: ampdiag must say it measured neither, and why.
    ev = {
        key: (measured[key], 0.03)
        for key in ("underflow_fraction", "boundary_lost_fraction", "param_grad_subnormal_fraction")
    }
    ev |= {
        "activation_grad_subnormal_fraction": (None, 0.0),
        "recommended_init_scale": (None, 0.0),
    }
    return session, Truth(
        expect=[Expect("fp16-grad-underflow", evidence=ev)],
        checks={"fp16-grad-underflow": names_the_cast},
        measured=measured,
    )


SCENARIOS.append(
    Scenario(
        "underflow-cast-in-forward",
        "A forward under its own FP16 autocast that casts to FP16 itself, loss x 1e-6: no FP32 "
        "replay, so the needed scale is unmeasured.",
        run_cast_in_forward,
    )
)
