"""Gradient accumulation scenarios: correct (averaged), gradients zeroed between micro-batches,
micro-batch losses summed, with and without a GradScaler, and a plain run without
accumulation.

Truth, measured by the training loop itself, without ampdiag: how many backward passes each
optimizer step had; each micro-batch's own gradient, replayed with ``torch.autograd.grad``
on its unweighted loss (this accumulates nothing); which of them the gradient the optimizer
finally sees is the sum of (the micro-batches that survived), and the ratio of that gradient
to the mean of the micro-batches' own gradients (1 when averaged, N when summed).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import ampdiag
from ampdiag.analysis import analyze
from ampdiag.session import Session

QUIET: dict[str, Any] = {"report": False, "tensorboard": False, "console": False}
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
    (optimizer.zero_grad between micro-batches, set_to_none True / False)."""
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
        with ampdiag.diagnose(out=out, **(QUIET | settings)) as d:
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


def ids(session: Session) -> set[str]:
    return {f.id for f in session.all_findings()}


def one(session: Session, fid: str) -> Any:
    (f,) = [f for f in session.all_findings() if f.id == fid]
    return f


ACCUMULATION_IDS = {"grad-accumulation-broken", "accumulation-loss-not-averaged"}


@pytest.mark.parametrize("scaler", [False, True], ids=["bf16", "fp16-scaler"])
def test_correct_accumulation_is_silent(scaler: bool, tmp_path: Path) -> None:
    dtype = torch.float16 if scaler else torch.bfloat16
    _, session, truth = train("average", out=tmp_path, dtype=dtype, scaler=scaler)
    assert session is not None
    assert truth["surviving"] == [N] * STEPS
    assert all(abs(r - 1.0) < 0.05 for r in truth["ratio"]), truth["ratio"]
    assert [s["micro_batches"] for s in session.steps] == truth["backward_passes"]
    # the step loss is the mean of the micro-batches' losses
    for rec, want in zip(session.steps, truth["mean_loss"], strict=True):
        assert rec["loss"] == pytest.approx(want, rel=1e-4)
    assert not ids(session) & ACCUMULATION_IDS
    # the measurement ran (a scenario that cannot fail is a defect)
    assert session.section("accumulation")["steps"]  # non-empty


@pytest.mark.parametrize("how", ["zero_none", "zero_inplace"])
def test_zero_grad_between_micro_batches(how: str, tmp_path: Path) -> None:
    # micro-batch sizes alternate between steps, so the memory fit has two batch sizes
    _, session, truth = train(
        how,
        out=tmp_path,
        micro=[8, 16] * (STEPS // 2),
        memory_target_batch=10**6,
        memory_limit_bytes=64 * 2**20,
    )
    assert session is not None
    assert truth["surviving"] == [1] * STEPS  # only the last micro-batch reaches the optimizer
    f = one(session, "grad-accumulation-broken")
    assert f.evidence["micro_batches"] == N
    assert f.evidence["surviving_micro_batches"] == truth["surviving"][0]
    assert f.evidence["how"] == ("set_to_none" if how == "zero_none" else "zeroed")
    assert [s["micro_batches"] for s in session.steps] == truth["backward_passes"]
    # no accumulation advice to a run whose accumulation is broken ...
    assert "use-grad-accumulation" not in ids(session)
    # ... although without the broken accumulation the same memory figures would advise it
    session.sections.pop("accumulation")
    assert "use-grad-accumulation" in {f.id for f in analyze(session)}


@pytest.mark.parametrize("scaler", [False, True], ids=["bf16", "fp16-scaler"])
def test_summed_micro_batch_losses(scaler: bool, tmp_path: Path) -> None:
    dtype = torch.float16 if scaler else torch.bfloat16
    _, session, truth = train("sum", out=tmp_path, dtype=dtype, scaler=scaler)
    assert session is not None
    assert truth["surviving"] == [N] * STEPS
    ratio = sum(truth["ratio"]) / len(truth["ratio"])
    assert abs(ratio - N) < 0.1  # the accumulated gradient is N times the averaged one
    f = one(session, "accumulation-loss-not-averaged")
    assert f.evidence["micro_batches"] == N
    assert f.evidence["loss_weight_sum"] == pytest.approx(ratio, rel=0.05)
    assert "grad-accumulation-broken" not in ids(session)
    # the step loss: what the optimizer follows, N times the mean micro-batch loss
    for rec, want in zip(session.steps, truth["mean_loss"], strict=True):
        assert rec["loss"] == pytest.approx(N * want, rel=1e-4)


def test_plain_run_has_one_micro_batch_and_is_silent(tmp_path: Path) -> None:
    _, session, truth = train("average", out=tmp_path, accum=1)
    assert session is not None
    assert truth["backward_passes"] == [1] * STEPS
    assert [s["micro_batches"] for s in session.steps] == [1] * STEPS
    for rec, want in zip(session.steps, truth["mean_loss"], strict=True):
        assert rec["loss"] == pytest.approx(want, rel=1e-4)
    assert not ids(session) & ACCUMULATION_IDS


@pytest.mark.parametrize("mode", ["average", "zero_none"])
def test_training_is_bit_identical(mode: str, tmp_path: Path) -> None:
    watched, _, _ = train(mode, out=tmp_path, measure=False, scaler=True, dtype=torch.float16)
    plain, _, _ = train(mode, out=None, measure=False, scaler=True, dtype=torch.float16)
    for a, b in zip(watched.parameters(), plain.parameters(), strict=True):
        assert torch.equal(a, b)


def test_two_losses_of_one_forward_are_not_micro_batches(tmp_path: Path) -> None:
    # Two backward passes per step, each of an undivided loss, but one forward: not
    # accumulation, so neither finding (truth: the loop counts its forwards itself).
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        m = model()
        opt = torch.optim.SGD(m.parameters(), lr=0.05)
        forwards = []
        with ampdiag.diagnose(out=tmp_path, **QUIET) as d:
            for step in data(8):
                x, y = step[0]
                opt.zero_grad(set_to_none=True)
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    out_ = m(x)
                forwards.append(1)
                F.cross_entropy(out_.float(), y).backward(retain_graph=True)
                out_.float().square().mean().backward()
                opt.step()
    assert d.session is not None
    assert [s["micro_batches"] for s in d.session.steps] == [2] * STEPS
    assert len(forwards) == STEPS
    assert not ids(d.session) & ACCUMULATION_IDS
