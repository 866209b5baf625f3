"""nanoGPT's ``train.py`` on a CPU, in its own shape, under diagnose().

Written from scratch in that script's shape: ``dtype`` defaults to ``'float16'`` where CUDA is
missing, ``ctx = nullcontext() if device_type == 'cpu' else torch.amp.autocast(...)`` (no
autocast at all on a CPU), ``scaler = torch.cuda.amp.GradScaler(enabled=(dtype ==
'float16'))`` (which torch disables on a CPU), gradient accumulation with the loss divided,
``scaler.unscale_`` before clipping, AdamW. The run trains in FP32 with a scaler that does
nothing; it never called ``torch.cuda.amp.autocast``.

Truth from the loop itself: a forward hook on every Linear sees FP32 outputs only, CPU autocast
is off inside ``ctx``, and the scaler says it is disabled. ampdiag must name what the script did
(a CUDA GradScaler on a CPU, no autocast) and not claim a ``torch.cuda.amp.autocast()`` the
script never entered.
"""

from __future__ import annotations

import warnings
from contextlib import nullcontext
from pathlib import Path

import pytest
import torch
from torch import nn

import ampdiag
from tests.advice_scan import advised
from tests.frameworks.conftest import SETTINGS

pytestmark = pytest.mark.slow

BLOCK, VOCAB, ACCUM, ITERS = 16, 32, 2, 4


class TinyGPT(nn.Module):
    """Embeddings, one pre-norm MLP block, a tied head: nanoGPT's GPT in miniature."""

    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(VOCAB, 32)
        self.wpe = nn.Embedding(BLOCK, 32)
        self.ln = nn.LayerNorm(32)
        self.mlp = nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 32))
        self.lm_head = nn.Linear(32, VOCAB, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        x = x + self.mlp(self.ln(x))
        logits = self.lm_head(x)
        return nn.functional.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))


def test_nanogpt_on_a_cpu_is_told_its_cuda_scaler_is_off_without_an_autocast_it_never_used(
    tmp_path: Path,
) -> None:
    torch.manual_seed(1337)
    data = torch.randint(0, VOCAB, (2000,))
    model = TinyGPT()
    dtype = "bfloat16" if torch.cuda.is_available() else "float16"  # nanoGPT's default
    device_type = "cpu"
    ctx = nullcontext() if device_type == "cpu" else torch.amp.autocast(device_type)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.cuda.amp is deprecated, and off on a CPU
        scaler = torch.cuda.amp.GradScaler(enabled=(dtype == "float16"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    seen: set[torch.dtype] = set()
    for m in model.modules():
        if isinstance(m, nn.Linear):
            m.register_forward_hook(lambda _m, _i, out: seen.add(out.dtype))
    autocast_on: set[bool] = set()

    def get_batch() -> tuple[torch.Tensor, torch.Tensor]:
        ix = torch.randint(len(data) - BLOCK - 1, (4,))
        x = torch.stack([data[i : i + BLOCK] for i in ix])
        return x, torch.stack([data[i + 1 : i + 1 + BLOCK] for i in ix])

    with ampdiag.diagnose(out=tmp_path, **SETTINGS) as d:
        for _ in range(ITERS):
            for _micro in range(ACCUM):
                x, y = get_batch()
                with ctx:
                    autocast_on.add(torch.is_autocast_enabled("cpu"))
                    loss = model(x, y) / ACCUM
                scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
    # the loop's own record: FP32 throughout, no CPU autocast, the scaler off
    assert seen == {torch.float32} and autocast_on == {False} and not scaler.is_enabled()
    found = {f.id: f for f in d.session.findings}
    assert "low-precision-inactive" in found, sorted(found)
    title = found["low-precision-inactive"].title
    assert "GradScaler" in title and "FP32" in title, title
    assert "autocast()" not in title, title  # the script never called torch.cuda.amp.autocast
    # what to do about it, by this CPU's own flags: BF16 autocast where it runs natively; on a
    # CPU that emulates BF16 and FP16 (slower than FP32), FP32 is the fast precision to keep
    native = any(
        f in Path("/proc/cpuinfo").read_text().split() for f in ("avx512_bf16", "amx_bf16")
    )
    lpi = found["low-precision-inactive"]
    assert advised(lpi.fix or "") == ({"bf16"} if native else {"fp32"}), lpi.fix
    assert lpi.severity == ("high" if native else "low")
