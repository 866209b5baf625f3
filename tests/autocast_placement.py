"""One FP16 fault trained with autocast entered in three places, for the placement tests.

A small ResNet-like CNN is trained a few steps in FP16 autocast without a GradScaler, with a
tiny loss, so that many gradient values fall below FP16's normal range. Autocast is entered

- ``loop``: around the forward and the loss in the training loop (the usual way);
- ``wrapped``: the way Accelerate (and so HF Trainer with ``fp16=True``) applies it, by
  replacing ``model.forward`` with the forward wrapped in ``torch.autocast`` and its outputs
  converted back to FP32: autocast is entered *after* the model's forward pre-hooks;
- ``inside``: inside the model's own ``forward``.

The three compute the same numbers (the loss is FP32 either way: cross-entropy runs in FP32
under autocast), so the diagnosis must be the same. The truth is counted here, from the
gradients themselves: the share of nonzero parameter-gradient values below FP16's normal
range (2^-14, the loss scale being 1) over every step, of the parameters autocast casts to
FP16 (`harness.fp16_cast_params`; the BatchNorms' gradients are computed in FP32).
"""

from __future__ import annotations

import functools
import types
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

import ampdiag
from ampdiag.session import Session
from tests.scenarios.harness import fp16_cast_params

PLACEMENTS = ("loop", "wrapped", "inside")
STEPS = 4
LOSS_SCALE_DOWN = 2.0**-6
FP16_NORMAL_MIN = 2.0**-14
SETTINGS: dict[str, Any] = {
    "report": False,
    "tensorboard": False,
    "console": False,
    "sample_every": 1,
    "numerics_sample_elements": 0,
    "speed_probe": False,
    "profile": False,  # the trace and the memory timeline change no numerics finding
    "memory": False,
}


class ResBlock(nn.Module):
    def __init__(self, ch: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(ch, ch, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(ch)
        self.conv2 = nn.Conv2d(ch, ch, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(ch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.bn1(self.conv1(x)))
        return F.relu(x + self.bn2(self.conv2(h)))


class SmallResNet(nn.Module):
    def __init__(self, classes: int = 10, inside: bool = False) -> None:
        super().__init__()
        self.inside = inside
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16))
        self.layer1 = ResBlock(16)
        self.layer2 = ResBlock(16)
        self.fc = nn.Linear(16, classes)

    def body(self, x: torch.Tensor) -> torch.Tensor:
        h = self.layer2(self.layer1(F.relu(self.stem(x))))
        return self.fc(h.mean(dim=(2, 3)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.inside:
            with torch.autocast("cpu", dtype=torch.float16):
                return self.body(x).float()
        return self.body(x)


def wrap_forward_like_accelerate(model: nn.Module, dtype: torch.dtype) -> None:
    """What ``Accelerator.prepare_model`` does for mixed precision (accelerate 1.x)."""
    forward = model.forward.__func__  # type: ignore[union-attr]
    amp = torch.autocast("cpu", dtype=dtype)(forward)

    @functools.wraps(forward)
    def to_fp32(*args: Any, **kwargs: Any) -> Any:
        out = amp(*args, **kwargs)
        return out.float() if isinstance(out, torch.Tensor) else out

    model._original_forward = model.forward  # type: ignore[assignment]
    model.forward = types.MethodType(to_fp32, model)  # type: ignore[method-assign]


def train(placement: str, out: Path) -> tuple[Session, dict[str, Any]]:
    """Trains under diagnose(out=out); returns the Session and the truth counted here."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = SmallResNet(inside=placement == "inside")
        if placement == "wrapped":
            wrap_forward_like_accelerate(model, torch.float16)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        data = [(torch.randn(8, 3, 12, 12), torch.randint(0, 10, (8,))) for _ in range(STEPS)]
        cast = fp16_cast_params(model, data[0][0])
        assert cast and len(cast) < len(list(model.parameters()))
        subnormal = nonzero = 0
        losses = []
        with ampdiag.diagnose(out=out, **SETTINGS) as d:
            for x, y in data:
                opt.zero_grad()
                if placement == "loop":
                    with torch.autocast("cpu", dtype=torch.float16):
                        loss = F.cross_entropy(model(x), y) * LOSS_SCALE_DOWN
                else:
                    loss = F.cross_entropy(model(x), y) * LOSS_SCALE_DOWN
                loss.backward()
                for name, p in model.named_parameters():
                    g = p.grad
                    assert g is not None
                    if name not in cast:
                        continue
                    nz = g != 0
                    nonzero += int(nz.sum())
                    subnormal += int((nz & (g.abs() < FP16_NORMAL_MIN)).sum())
                losses.append(float(loss.detach()))
                opt.step()
    assert d.session is not None
    truth = {
        "param_grad_subnormal_fraction": subnormal / nonzero if nonzero else 0.0,
        "losses": losses,
        "steps": STEPS,
    }
    return d.session, truth
