"""A training script in the style of timm's ``train.py``, written from scratch for the tests.

What matters from timm's script: the precision is chosen on the command line (``--amp
--amp-dtype float16|bfloat16``), gradients are accumulated over ``--grad-accum-steps``
micro-batches, FP16 gets a GradScaler (timm's ``NativeScaler``), and ``--model-ema`` keeps a
frozen EMA copy of the weights -- here held inside the module the loop calls, as a wrapper
does, so that the called module has twice the parameters the optimizer updates.
"""

from __future__ import annotations

import argparse
import copy
import sys
from typing import Any

import torch
from torch import nn

import ampdiag


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser("train.py")
    p.add_argument("--amp", action="store_true")
    p.add_argument("--amp-dtype", default="float16")
    p.add_argument("--grad-accum-steps", type=int, default=1)
    p.add_argument("--model-ema", action="store_true")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--loss-mult", type=float, default=1.0)
    return p.parse_args(argv)


class Net(nn.Module):
    """A small conv net (timm-sized models are not needed: the loop is what is tested)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.block = nn.Sequential(nn.Conv2d(16, 32, 3, padding=1), nn.ReLU())
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.block(torch.relu(self.stem(x)))
        return self.head(x.mean((2, 3)))


class WithEma(nn.Module):
    """The model and its frozen EMA copy in one module; calling it runs the model."""

    def __init__(self, model: nn.Module, decay: float = 0.9) -> None:
        super().__init__()
        self.model = model
        self.ema = copy.deepcopy(model).requires_grad_(False)
        self.decay = decay

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)  # type: ignore[no-any-return]

    @torch.no_grad()
    def update_ema(self) -> None:
        for e, p in zip(self.ema.parameters(), self.model.parameters(), strict=True):
            e.lerp_(p, 1 - self.decay)


def train(argv: list[str], out: Any, **settings: Any) -> dict[str, Any]:
    """Runs the script with ``argv`` (as ``sys.argv[1:]``) under diagnose(); returns its record.

    The record is the script's own truth: micro-batches per optimizer step, the parameters its
    optimizer updates, and whether any FP16 gradient came out all zero.
    """
    saved = sys.argv
    sys.argv = ["train.py", *argv]
    try:
        args = parse(argv)
        torch.manual_seed(0)
        net = Net()
        model: nn.Module = WithEma(net) if args.model_ema else net
        opt = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=0.9)
        dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16}[args.amp_dtype]
        scaler = torch.amp.GradScaler("cpu") if args.amp and dtype == torch.float16 else None
        g = torch.Generator().manual_seed(1)
        micro_per_step: list[int] = []
        with ampdiag.diagnose(out=out, **settings) as d:
            for _ in range(args.steps):
                for _ in range(args.grad_accum_steps):
                    x = torch.randn(8, 3, 8, 8, generator=g)
                    y = torch.randint(0, 10, (8,), generator=g)
                    with torch.autocast("cpu", dtype=dtype, enabled=args.amp):
                        loss = nn.functional.cross_entropy(model(x), y) * args.loss_mult
                    loss = loss / args.grad_accum_steps
                    (scaler.scale(loss) if scaler else loss).backward()
                micro_per_step.append(args.grad_accum_steps)
                if scaler is not None:
                    scaler.step(opt)
                    scaler.update()
                else:
                    opt.step()
                opt.zero_grad(set_to_none=True)
                if isinstance(model, WithEma):
                    model.update_ema()
    finally:
        sys.argv = saved
    return {
        "session": d.session,
        "micro_per_step": micro_per_step,
        "updated_parameters": sum(p.numel() for g in opt.param_groups for p in g["params"]),
        "held_parameters": sum(p.numel() for p in model.parameters()),
    }
