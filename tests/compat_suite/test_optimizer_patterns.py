"""Optimizer patterns of public training code, with and without diagnose().

* ``optimizer.step(closure)`` with LBFGS (pytorch/examples time_sequence_prediction): the
  optimizer calls the closure, which zeroes the gradients, runs forward and backward, many times
  in one step (its iterations and line search). Those are re-evaluations of one step, not
  micro-batches: a diagnosis that counted them as accumulation reported "gradient accumulation
  is broken" and a step loss that was the sum of every evaluation.

* Two models, two optimizers (pytorch/examples dcgan): the discriminator steps on a real and
  a detached fake batch (two backward passes, their losses summed by design), then the
  generator on the discriminator's verdict of the fake (a backward through both models). Not
  gradient accumulation, whichever optimizer the diagnosis takes for the step.

Each scenario runs bit-identically under every setting in `CONFIGS`; what the report says of
it is checked against what the script itself counted.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from tests.compat_suite.harness import CONFIGS, same_under_diagnose

params = pytest.mark.parametrize("settings", list(CONFIGS.values()), ids=list(CONFIGS))


class Sequence(nn.Module):
    """Two LSTM cells unrolled over time in float64, as time_sequence_prediction's model."""

    def __init__(self, hidden: int = 6) -> None:
        super().__init__()
        self.hidden = hidden
        self.lstm1 = nn.LSTMCell(1, hidden)
        self.lstm2 = nn.LSTMCell(hidden, hidden)
        self.linear = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h1 = c1 = h2 = c2 = torch.zeros(x.size(0), self.hidden, dtype=x.dtype)
        outputs = []
        for x_t in x.split(1, dim=1):
            h1, c1 = self.lstm1(x_t, (h1, c1))
            h2, c2 = self.lstm2(h1, (h2, c2))
            outputs.append(self.linear(h2))
        return torch.cat(outputs, dim=1)


def lbfgs_loop(block: contextlib.AbstractContextManager[Any], steps: int = 4) -> dict[str, Any]:
    """LBFGS on sine waves; every closure evaluation's loss, per step, as the script sees them."""
    t = torch.arange(12, dtype=torch.float64) + torch.randint(-8, 8, (5, 1))
    data = torch.sin(t / 4.0)
    x, y = data[:, :-1], data[:, 1:]
    model = Sequence().double()
    opt = torch.optim.LBFGS(model.parameters(), lr=0.8, max_iter=6)
    evaluations: list[list[torch.Tensor]] = []
    with block:
        for _ in range(steps):
            evaluations.append([])

            def closure() -> torch.Tensor:
                opt.zero_grad()
                loss = nn.functional.mse_loss(model(x), y)
                loss.backward()
                evaluations[-1].append(loss.detach())
                return loss

            returned = opt.step(closure)
            assert returned is not None
            with torch.no_grad():
                evaluations[-1].append(model(x[:2]))  # the script's eval between steps
    return {"model": model, "opt": opt.state_dict(), "evaluations": evaluations}


@params
def test_lbfgs_closure(settings: dict[str, Any], tmp_path: Path) -> None:
    same_under_diagnose(lbfgs_loop, settings, tmp_path)


def test_lbfgs_closure_re_evaluations_are_not_micro_batches(tmp_path: Path) -> None:
    session = same_under_diagnose(lbfgs_loop, {}, tmp_path)
    torch.manual_seed(0)
    truth = lbfgs_loop(contextlib.nullcontext())["evaluations"]
    # the pattern is exercised: LBFGS evaluated the closure several times in each step
    assert all(len(step) - 1 > 1 for step in truth)
    steps = session["steps"]
    assert [s["index"] for s in steps] == list(range(len(truth)))
    for record, evaluated in zip(steps, truth, strict=True):
        assert record["micro_batches"] == 1  # one forward-backward of a batch, re-evaluated
        # the step's loss is the loss at the step's starting point: the closure's first
        assert record["loss"] == pytest.approx(float(evaluated[0]), rel=1e-6)
    ids = {f["id"] for f in session["findings"]}
    assert "grad-accumulation-broken" not in ids
    assert "accumulation-loss-not-averaged" not in ids
    assert session["run"]["optimizer_steps"] == len(truth)


class Generator(nn.Module):
    def __init__(self, nz: int = 4) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.ConvTranspose2d(nz, 8, 4, 1, 0, bias=False),
            nn.BatchNorm2d(8),
            nn.ReLU(True),
            nn.ConvTranspose2d(8, 3, 4, 2, 1, bias=False),
            nn.Tanh(),
        )

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(z)
        return out


class Discriminator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, 8, 4, 2, 1, bias=False),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(8, 1, 4, 1, 0, bias=False),
            nn.Sigmoid(),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(x)
        return out.view(-1, 1).squeeze(1)


GAN_ITERATIONS = 6


def gan_loop(block: contextlib.AbstractContextManager[Any]) -> dict[str, Any]:
    """dcgan's loop: D on real + detached fake, then G through D; both losses per iteration."""
    net_g, net_d = Generator(), Discriminator()
    opt_d = torch.optim.Adam(net_d.parameters(), lr=2e-4, betas=(0.5, 0.999))
    opt_g = torch.optim.Adam(net_g.parameters(), lr=2e-4, betas=(0.5, 0.999))
    criterion = nn.BCELoss()
    reals = [torch.rand(4, 3, 8, 8) * 2 - 1 for _ in range(GAN_ITERATIONS)]
    fixed_noise = torch.randn(2, 4, 1, 1)
    logged: list[Any] = []
    with block:
        for i, real in enumerate(reals):
            net_d.zero_grad()
            label = torch.full((real.size(0),), 1.0)
            err_real = criterion(net_d(real), label)
            err_real.backward()
            fake = net_g(torch.randn(real.size(0), 4, 1, 1))
            label.fill_(0.0)
            err_fake = criterion(net_d(fake.detach()), label)
            err_fake.backward()
            opt_d.step()
            net_g.zero_grad()
            label.fill_(1.0)
            err_g = criterion(net_d(fake), label)
            err_g.backward()
            opt_g.step()
            logged.append((err_real + err_fake).detach())
            logged.append(err_g.detach())
            if i % 3 == 0:  # the script's sample of the fixed noise
                with torch.no_grad():
                    logged.append(net_g(fixed_noise))
    return {"G": net_g, "D": net_d, "opts": [opt_d.state_dict(), opt_g.state_dict()],
            "logged": logged}  # fmt: skip


@params
def test_gan_two_models_two_optimizers(settings: dict[str, Any], tmp_path: Path) -> None:
    session = same_under_diagnose(gan_loop, settings, tmp_path)
    # the script has no gradient accumulation: no finding may say it is broken or unaveraged
    ids = {f["id"] for f in session["findings"]}
    assert "grad-accumulation-broken" not in ids
    assert "accumulation-loss-not-averaged" not in ids
    assert session["run"]["optimizer_steps"] == 2 * GAN_ITERATIONS
    assert len(session["run"]["models"]) == 2
