"""A denoising-diffusion Trainer in the style of denoising-diffusion-pytorch, under diagnose().

Written from scratch in that script's shape: a ``Trainer`` owns an ``Accelerator`` made with
``mixed_precision="fp16" if amp else "no"``, accumulates ``gradient_accumulate_every``
micro-batches per step (each forward under ``accelerator.autocast()``, each loss divided and
sent through ``accelerator.backward``), clips with ``accelerator.clip_grad_norm_``, steps the
optimizer and updates an EMA copy of the model kept beside it (ema_pytorch's ``EMA``: a frozen
deep copy, lerped each step). Run on a CPU with ``amp=True`` -- the user's lever for speed --
Accelerate enters no autocast at all and the run trains in FP32.

Truth from the framework itself: Accelerate's ``native_amp`` is False and a hook on the
denoiser's first layer sees no autocast in any forward; the script counts its micro-batches.
ampdiag must say so (``low-precision-inactive``, naming Accelerate's FP16 on a CPU) with the
fix in Accelerate's terms first (``Accelerator(mixed_precision="bf16")``), count the
micro-batches per step, and keep the EMA copy out of the trained parameters.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn

import ampdiag
from tests.advice_scan import native_bf16_cpu
from tests.frameworks.conftest import SETTINGS, AutocastRecorder

pytestmark = pytest.mark.slow

PLAIN = "# In a plain training loop:"
T_STEPS, ACCUM, TRAIN_STEPS = 100, 2, 4


class Denoiser(nn.Module):
    """A small conv net predicting the noise of an 8x8 image at timestep t."""

    def __init__(self) -> None:
        super().__init__()
        self.init_conv = nn.Conv2d(4, 16, 3, padding=1)
        self.mid = nn.Sequential(nn.GroupNorm(4, 16), nn.SiLU(), nn.Conv2d(16, 16, 3, padding=1))
        self.final_conv = nn.Conv2d(16, 3, 1)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        time = (t.float() / T_STEPS)[:, None, None, None].expand(-1, 1, *x.shape[2:])
        h = self.init_conv(torch.cat([x, time], 1))
        out: torch.Tensor = self.final_conv(h + self.mid(h))
        return out


class GaussianDiffusion(nn.Module):
    """q(x_t | x_0) with a linear beta schedule; the loss is the MSE of the predicted noise."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        alphas = 1.0 - torch.linspace(1e-4, 0.02, T_STEPS)
        self.register_buffer("alphas_cumprod", torch.cumprod(alphas, 0))

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        t = torch.randint(0, T_STEPS, (img.shape[0],))
        noise = torch.randn_like(img)
        a = self.alphas_cumprod[t][:, None, None, None]
        x_t = a.sqrt() * img + (1 - a).sqrt() * noise
        return nn.functional.mse_loss(self.model(x_t, t), noise)


class EMA:
    """ema_pytorch-style: a frozen deep copy of the model, lerped toward it each update."""

    def __init__(self, model: nn.Module, beta: float = 0.995) -> None:
        self.online, self.beta = model, beta
        self.ema_model = copy.deepcopy(model).requires_grad_(False)

    @torch.no_grad()
    def update(self) -> None:
        for e, p in zip(self.ema_model.parameters(), self.online.parameters(), strict=True):
            e.lerp_(p, 1 - self.beta)


class Trainer:
    def __init__(
        self,
        accelerate: Any,
        diffusion: GaussianDiffusion,
        data: torch.Tensor,
        *,
        gradient_accumulate_every: int,
        amp: bool,
        mixed_precision_type: str = "fp16",
    ) -> None:
        self.accelerator = accelerate.Accelerator(
            mixed_precision=mixed_precision_type if amp else "no", cpu=True
        )
        self.model, self.data = diffusion, data
        self.gradient_accumulate_every = gradient_accumulate_every
        self.ema = EMA(diffusion)
        self.opt = torch.optim.Adam(diffusion.parameters(), lr=1e-4, betas=(0.9, 0.99))
        self.model, self.opt = self.accelerator.prepare(self.model, self.opt)
        self.micro_per_step: list[int] = []

    def train(self, steps: int) -> None:
        g = torch.Generator().manual_seed(1)
        for _ in range(steps):
            micro = 0
            for _ in range(self.gradient_accumulate_every):
                batch = self.data[torch.randint(0, len(self.data), (8,), generator=g)]
                with self.accelerator.autocast():
                    loss = self.model(batch) / self.gradient_accumulate_every
                self.accelerator.backward(loss)
                micro += 1
            self.accelerator.clip_grad_norm_(self.model.parameters(), 1.0)
            self.opt.step()
            self.opt.zero_grad()
            self.ema.update()
            self.micro_per_step.append(micro)


def test_diffusion_trainer_amp_on_a_cpu_is_told_mixed_precision_bf16(
    tmp_path: Any, accelerate_state: Any
) -> None:
    denoiser = Denoiser()
    diffusion = GaussianDiffusion(denoiser)
    data = torch.rand(32, 3, 8, 8, generator=torch.Generator().manual_seed(0)) * 2 - 1
    trainer = Trainer(accelerate_state, diffusion, data, gradient_accumulate_every=ACCUM, amp=True)
    truth = AutocastRecorder(denoiser.init_conv)
    with ampdiag.diagnose(out=tmp_path / "diag", **(SETTINGS | {"speed_probe": False})) as d:
        trainer.train(TRAIN_STEPS)
    truth.close()
    session = d.session
    assert session is not None
    # the framework's truth: Accelerate asked for fp16, and no forward ran under autocast
    assert not trainer.accelerator.native_amp
    assert truth.counts() == {"none": ACCUM * TRAIN_STEPS}
    assert session.environment["framework"]["name"] == "accelerate"
    found = [f for f in session.all_findings() if f.id == "low-precision-inactive"]
    assert len(found) == 1, [f.id for f in session.all_findings()]
    f = found[0]
    assert f.title.startswith("Accelerate was asked for FP16, which on a CPU enters no autocast")
    # BF16 where this CPU runs it natively; FP32 kept where it emulates BF16 (slower)
    setting = f'Accelerator(mixed_precision="{"bf16" if native_bf16_cpu() else "no"}")'
    assert setting in f.fix and PLAIN in f.fix, f.fix
    assert f.fix.index(setting) < f.fix.index(PLAIN) < f.fix.index("torch.autocast"), f.fix
    # the micro-batches the script counted, per step; the EMA copy is not trained
    steps = session.sections["accumulation"]["steps"]
    assert [s["forwards"] for s in steps] == [trainer.micro_per_step[s["step"]] for s in steps]
    trained = sum(p.numel() for p in diffusion.parameters())
    (model,) = session.sections["run"]["models"]
    assert model["parameters"] == trained
