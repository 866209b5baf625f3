"""The accumulation scenarios' shared loop: four micro-batches per optimizer step, done right
(losses averaged), with the gradients zeroed between micro-batches, or with the losses summed.

Truth, measured by the training loop itself, without ampdiag: how many backward passes each
optimizer step had; each micro-batch's own gradient, replayed with ``torch.autograd.grad``
on its unweighted loss (this accumulates nothing); which of them the gradient the optimizer
finally sees is the sum of (the micro-batches that survived), and the ratio of that gradient
to the mean of the micro-batches' own gradients (1 when averaged, N when summed).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from ampdiag.session import Session
from tests.scenarios.harness import diagnose

STEPS = 6
N = 4


def model() -> nn.Module:
    return nn.Sequential(
        nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10)
    )


def data(micro: int | list[int]) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    g = torch.Generator().manual_seed(1)
    sizes = micro if isinstance(micro, list) else [micro] * STEPS
    return [
        [
            (torch.randn(b, 32, generator=g), torch.randint(0, 10, (b,), generator=g))
            for _ in range(N)
        ]
        for b in sizes
    ]


def train(
    mode: str,
    *,
    out: Path | None,
    accum: int = N,
    dtype: torch.dtype = torch.bfloat16,
    scaler: bool = False,
    micro: int | list[int] = 8,
    measure: bool = True,
    **settings: Any,
) -> tuple[nn.Module, Session | None, dict[str, Any]]:
    """``mode``: "average" (loss / N), "sum" (no division), "zero_none" / "zero_inplace"
    (optimizer.zero_grad between micro-batches, set_to_none True / False). The speed probe is
    off and the profiler records one step unless asked otherwise: no accumulation fault needs
    more, and torch's memory profiler over three steps of four micro-batches is most of a
    run's time."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        m = model()
        opt = torch.optim.SGD(m.parameters(), lr=0.05)
        sc = torch.amp.GradScaler("cpu", init_scale=2.0**8) if scaler else None
        batches = [step[:accum] for step in data(micro)]
        measured: dict[str, Any] = {
            "backward_passes": [],
            "surviving": [],
            "ratio": [],
            "mean_loss": [],
        }
        params = list(m.parameters())

        def loop() -> None:
            for step in batches:
                opt.zero_grad(set_to_none=True)
                own: list[list[torch.Tensor]] = []
                losses: list[float] = []
                for x, y in step:
                    if mode.startswith("zero"):
                        opt.zero_grad(set_to_none=mode == "zero_none")
                    with torch.autocast("cpu", dtype=dtype):
                        out_ = m(x)
                    loss = F.cross_entropy(out_.float(), y)
                    if measure:
                        own.append(
                            [
                                g.detach()
                                for g in torch.autograd.grad(loss, params, retain_graph=True)
                            ]
                        )
                    losses.append(float(loss.detach()))
                    backprop = loss / len(step) if mode != "sum" else loss
                    (sc.scale(backprop) if sc is not None else backprop).backward()
                measured["backward_passes"].append(len(step))
                measured["mean_loss"].append(sum(losses) / len(losses))
                if measure:
                    measured["surviving"].append(_surviving(params, own, sc, mode))
                    measured["ratio"].append(_ratio(params, own, sc))
                if sc is not None:
                    sc.step(opt)
                    sc.update()
                else:
                    opt.step()

        if out is None:
            loop()
            return m, None, measured
        quick = {"speed_probe": False, "profile_active": 1}
        with diagnose(out, **(quick | settings)) as d:
            loop()
    assert d.session is not None
    return m, d.session, measured


def _final(params: list[nn.Parameter], sc: torch.amp.GradScaler | None) -> list[torch.Tensor]:
    scale = sc.get_scale() if sc is not None else 1.0
    return [p.grad.detach() / scale for p in params]  # type: ignore[union-attr]


def _flat(ts: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1).double() for t in ts])


def _surviving(
    params: list[nn.Parameter], own: list[list[torch.Tensor]], sc: Any, mode: str
) -> int:
    """How many trailing micro-batches the final gradient is the (weighted) sum of."""
    final = _flat(_final(params, sc))
    n = len(own)
    weight = 1.0 if mode == "sum" else 1.0 / n
    for j in range(n):
        suffix = sum(_flat(g) for g in own[j:]) * weight
        if torch.allclose(final, suffix, rtol=2e-2, atol=1e-6):
            return n - j
    raise AssertionError("the final gradient is no suffix sum of the micro-batch gradients")


def _ratio(params: list[nn.Parameter], own: list[list[torch.Tensor]], sc: Any) -> float:
    """|final gradient| / |mean of the micro-batches' own gradients|."""
    mean = sum(_flat(g) for g in own) / len(own)
    return float(_flat(_final(params, sc)).norm() / mean.norm())
