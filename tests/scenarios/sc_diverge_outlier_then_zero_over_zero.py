"""One outlier batch makes a huge but finite loss, and the next step holds a 0/0 (FP32, a sane
learning rate, gradients clipped): the run diverges from the 0/0, not from the learning rate.

A regression MLP (features normalized by ``RowNorm``, named ``norm``; MSE) trains with SGD
at lr 0.05 and ``clip_grad_norm_(1.0)``. The batch of step 4 has its targets in the wrong
unit (x1000): the loss jumps about 10^6x, finite, and the clipped update is an ordinary one.
The batch of step 5 holds a row of zeros: ``RowNorm`` makes 0/0 there, and the NaN spreads
into the weights. The losses alone (0.6, 0.6, 1.1, 0.6, 1.3e6, NaN) read like a learning
rate too high; the weights step 5 ran with (1.01x the first step's, measured by the replay)
say otherwise.

Truth, measured without ampdiag: the NaN of step 5 is RowNorm's (its output on that batch,
computed in FP64, is NaN), and the same run without the zero row -- the outlier batch, the
same learning rate -- ends finite, so the learning rate is not the cause. The diagnosed
run's losses equal the unwatched run's.

diverged (high) at step 5, cause not-precision, its fix finds the batch and guards the op in
RowNorm, never the learning rate; nonfinite-origin names RowNorm at step 5.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from pathlib import Path

import torch
from torch import nn

from ampdiag.session import Session
from tests.scenarios.divergence import NO_PRECISION_ADVICE, RowNorm, cause_is
from tests.scenarios.harness import Expect, Scenario, Truth, diagnose, seeded, session_of

OUTLIER, ZERO, STEPS, DIM = 4, 5, 8, 32

Batch = tuple[torch.Tensor, torch.Tensor]


def _data(zero_row: bool) -> list[Batch]:
    g = torch.Generator().manual_seed(1)
    w = torch.randn(DIM, 1, generator=g)
    data = []
    for _ in range(STEPS):
        x = torch.randn(16, DIM, generator=g)
        data.append((x, x @ w / math.sqrt(DIM)))
    data[OUTLIER] = (data[OUTLIER][0], data[OUTLIER][1] * 1000.0)  # targets in the wrong unit
    if zero_row:
        data[ZERO][0][3].zero_()  # the injection: RowNorm divides 0 by 0
    return data


def _loop(
    data: list[Batch], out: Path | None, weights: dict[int, tuple[float, float]] | None = None
) -> tuple[list[float], nn.Module, Session | None]:
    """Trains on ``data`` (under diagnose() when ``out``); ``weights`` gets the max |w| and L2
    norm of the weights steps 0 and ZERO ran with (before their update)."""
    with seeded(0):
        layers = {"norm": RowNorm(), "fc": nn.Linear(DIM, 64), "act": nn.ReLU()}
        model = nn.Sequential(OrderedDict({**layers, "head": nn.Linear(64, 1)}))
        opt = torch.optim.SGD(model.parameters(), lr=0.05)

        def train() -> list[float]:
            losses = []
            for step, (x, y) in enumerate(data):
                if weights is not None and step in (0, ZERO):
                    with torch.no_grad():
                        ws = [p.detach().flatten() for p in model.parameters()]
                        flat = torch.cat(ws).double()
                    weights[step] = (float(flat.abs().max()), float(flat.norm()))
                opt.zero_grad(set_to_none=True)
                loss = nn.functional.mse_loss(model(x), y)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                losses.append(float(loss.detach()))
            return losses

        if out is None:
            return train(), model, None
        with diagnose(out) as d:
            losses = train()
    return losses, model, session_of(d)


def run(out: Path) -> tuple[Session, Truth]:
    data = _data(zero_row=True)
    control, _, _ = _loop(_data(zero_row=False), None)
    unwatched, _, _ = _loop(data, None)
    weights: dict[int, tuple[float, float]] = {}
    losses, model, session = _loop(data, out, weights)
    assert session is not None
    nan_at_rownorm = not bool(torch.isfinite(RowNorm()(data[ZERO][0].double())).all())
    first_bad = next(i for i, v in enumerate(losses) if not math.isfinite(v))
    measured = {
        "losses": [round(v, 3) if math.isfinite(v) else str(v) for v in losses],
        "control_losses_without_zero_row": [round(v, 3) for v in control],
        "nan_at_rownorm": nan_at_rownorm,
        "first_nonfinite_loss": first_bad,
        "weights_max_abs_norm": weights,
    }
    # the fault is the 0/0, and the learning rate is sane: without it the same run ends finite
    assert nan_at_rownorm and first_bad == ZERO, measured
    assert all(math.isfinite(v) for v in control), measured
    assert losses[OUTLIER] > 1000 * losses[0], measured  # the one huge, finite loss
    same = all(
        a == b or (math.isnan(a) and math.isnan(b)) for a, b in zip(losses, unwatched, strict=True)
    )
    assert same, "diagnose() changed the training"
    name = next(n for n, m in model.named_modules() if isinstance(m, RowNorm))

    def finds_the_batch(s: Session) -> str | None:
        f = next((f for f in s.all_findings() if f.id == "diverged"), None)
        if f is None:
            return "diverged absent"
        if "learning rate" in f.fix or "Find the batch" not in f.fix or name not in f.fix:
            return f"the fix is not the batch's 0/0 in {name}: {f.fix!r}"
        return None

    def replay_weights(s: Session) -> str | None:
        # the replay's weights are the ones steps 0 and ZERO ran with, as counted here
        w = (s.section("sentinel").get("replay") or {}).get("weights") or {}
        got = {0: w.get("start") or {}, ZERO: w}
        for step, (max_abs, norm) in weights.items():
            seen = (got[step].get("max_abs"), got[step].get("norm"))
            if not all(
                isinstance(v, float) and math.isclose(v, ref, rel_tol=1e-5)
                for v, ref in zip(seen, (max_abs, norm), strict=True)
            ):
                return f"step {step}: replay {seen} != counted {(max_abs, norm)}"
        return None

    return session, Truth(
        expect=[
            Expect(
                "diverged",
                step=ZERO,
                evidence={"cause": ("not-precision", 0.0)},
                severities=frozenset({"high"}),
            ),
            Expect("nonfinite-origin", module=name, step=ZERO),
        ],
        forbid=set(NO_PRECISION_ADVICE),
        measured=measured,
        checks={
            "divergence-cause": cause_is("not-precision"),
            "divergence-fix-batch": finds_the_batch,
            "replay-weights": replay_weights,
        },
    )


SCENARIO = Scenario(
    "diverge-outlier-then-zero-over-zero",
    "One outlier batch makes a 10^6x but finite loss, the next step a 0/0 (FP32, SGD lr 0.05, "
    "clipped): the 0/0 diverges the run, not the learning rate.",
    run,
)
