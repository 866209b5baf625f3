"""FP8 readiness scenarios, with the truth measured by the test's own plain casts.

An outlier channel (one feature 10^4 times the rest) in one Linear's input: under per-tensor
scaling its amax sets the scale, and the test's own E4M3 cast of that input loses the other
channels (their error measured directly); the other layers, and a healthy transformer block,
cast cleanly. The product must name exactly the lossy layer unsafe.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

import ampdiag
from tests.scenarios.harness import one_thread

E4M3 = torch.float8_e4m3fn


class Gain(torch.nn.Module):
    """A fixed per-channel gain: channel ``k`` times ``gain`` (an LLM-style outlier feature)."""

    def __init__(self, n: int, k: int, gain: float) -> None:
        super().__init__()
        g = torch.ones(n)
        g[k] = gain
        self.register_buffer("g", g)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.g


def outlier_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(64, 128),
        torch.nn.GELU(),
        Gain(128, 5, 1e4),
        torch.nn.Linear(128, 64),  # "3": its input carries the outlier channel
        torch.nn.GELU(),
        torch.nn.Linear(64, 32),
    )


class Block(torch.nn.Module):
    """A pre-norm transformer block (attention + MLP), as nanoGPT writes one."""

    def __init__(self, d: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.fc, self.out = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.out(torch.nn.functional.gelu(self.fc(self.ln2(x))))


def _inputs_of_linears(model: torch.nn.Module, x: torch.Tensor) -> dict[str, torch.Tensor]:
    seen: dict[str, torch.Tensor] = {}

    def keep(name: str):  # type: ignore[no-untyped-def]
        def hook(_m: object, args: tuple[torch.Tensor, ...], _o: object) -> None:
            seen.setdefault(name, args[0].detach())

        return hook

    hs = [
        m.register_forward_hook(keep(n))
        for n, m in model.named_modules()
        if isinstance(m, torch.nn.Linear)
    ]
    with torch.no_grad():
        model(x)
    for h in hs:
        h.remove()
    return seen


def _lost_share(x: torch.Tensor) -> float:
    """Share of the nonzero values a per-tensor E4M3 cast gets wrong by more than 2^-4.

    A value the cast keeps as a normal number is within half of E4M3's 2^-3 resolution, 2^-4;
    beyond that it lost mantissa bits (or became zero): plain quantize/dequantize, counted.
    """
    x = x.reshape(-1, x.shape[-1]).float()
    scale = 448.0 / x.abs().max()
    back = (x * scale).clamp(-448, 448).to(E4M3).float() / scale
    nonzero = x != 0
    wrong = ((back - x).abs() > 2.0**-4 * x.abs()) & nonzero
    return int(wrong.sum()) / int(nonzero.sum())


def test_outlier_layer_alone_is_unsafe() -> None:
    model, x = outlier_model(), torch.randn(256, 64)
    truth = {n: _lost_share(t) for n, t in _inputs_of_linears(model, x).items()}
    # the test's own casts: the outlier layer loses its other channels, the others do not
    assert truth["3"] > 0.3, truth
    assert truth["0"] < 0.05 and truth["5"] < 0.05, truth
    r = ampdiag.compare(model, x, precisions=["fp32", "bf16", "fp8"], budget_s=5)
    assert r.fp8 is not None and "layers" in r.fp8, r.fp8
    verdicts = {la["name"]: la["verdict"] for la in r.fp8["layers"]}
    assert verdicts == {"0": "fp8-safe", "3": "keep-bf16", "5": "fp8-safe"}
    assert r.fp8["keep"] == ["3"] and r.fp8["convert"] == ["0", "5"]
    assert "KEEP_IN_BF16 = {'3'}" in r.fp8["filter"]
    assert r.fp8["loss_rel_diff_vs_bf16"] is not None
    assert r.fp8["speed"].startswith("speed not measured: needs an FP8 GPU")
    # the user's model is untouched: its Linears keep their class forward
    assert all("forward" not in vars(m) for m in model.modules())


def test_healthy_transformer_block_all_safe() -> None:
    torch.manual_seed(0)
    model, x = Block(), torch.randn(8, 32, 64)
    truth = {n: _lost_share(t) for n, t in _inputs_of_linears(model, x).items()}
    assert all(e < 0.05 for e in truth.values()), truth
    r = ampdiag.compare(model, x, precisions=["fp32", "fp8"], budget_s=5)
    assert r.fp8 is not None
    assert {la["name"]: la["verdict"] for la in r.fp8["layers"]} == dict.fromkeys(
        ["qkv", "proj", "fc", "out"], "fp8-safe"
    )
    assert r.fp8["keep"] == []


@pytest.mark.parametrize("budget_s", [1.5, 4.0])
def test_fp8_stays_within_the_budget(budget_s: float) -> None:
    model, x = outlier_model(), torch.randn(256, 64)
    ampdiag.compare(model, x, precisions=["fp32", "bf16"], budget_s=0.5)  # warm-up
    # one plain FP32 forward + backward, on the test's own clock: the A/B may finish the pass
    # it is in
    t0 = time.perf_counter()
    model(x).sum().backward()
    one_pass = time.perf_counter() - t0
    t0 = time.perf_counter()
    r = ampdiag.compare(model, x, precisions=["fp32", "bf16", "fp8"], budget_s=budget_s)
    took = time.perf_counter() - t0
    assert r.fp8 is not None
    assert took <= budget_s + 4 * one_pass + 0.25, (took, budget_s, one_pass, r.fp8.get("skipped"))


def test_tiny_budget_skips_fp8_with_the_reason() -> None:
    model, x = outlier_model(), torch.randn(256, 64)
    r = ampdiag.compare(model, x, precisions=["fp32", "bf16", "fp8"], budget_s=1e-3)
    assert r.fp8 is not None and "overrun the A/B's budget" in r.fp8["skipped"]


def test_fp8_off_by_default_on_a_cpu() -> None:
    model, x = outlier_model(), torch.randn(64, 64)
    assert ampdiag.compare(model, x, precisions=["fp32", "bf16"], budget_s=0.5).fp8 is None


@pytest.mark.slow
def test_diagnose_fp8_reports_the_layers_the_finding_and_the_filter(tmp_path: Path) -> None:
    model, x = outlier_model(), torch.randn(32, 64)
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    with (
        one_thread(),
        ampdiag.diagnose(out=tmp_path, console=False, tensorboard=False, fp8=True) as d,
    ):
        # a block whose 10% (the A/B's budget) pays for FP16's slow CPU passes and FP8 too
        for _ in range(1500):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(x).float().pow(2).mean()
            loss.backward()
            opt.step()
    assert d.session is not None
    fp8 = d.session.section("speed_probe")["precisions"]["fp8"]
    assert "layers" in fp8, fp8
    assert {la["name"]: la["verdict"] for la in fp8["layers"]}["3"] == "keep-bf16", fp8
    found = [f for f in d.session.findings if f.id == "fp8-readiness"]
    assert len(found) == 1 and "3" in found[0].evidence["keep"]
    assert "module_filter_fn" in found[0].fix
    page = (tmp_path / "report.html").read_text()
    assert "FP8 readiness (tensorwise recipe)" in page and "keep in BF16" in page


def test_fp8_is_off_in_diagnose_on_a_cpu_by_default(tmp_path: Path) -> None:
    model, x = outlier_model(), torch.randn(64, 64)
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    with one_thread(), ampdiag.diagnose(out=tmp_path, console=False, tensorboard=False) as d:
        for _ in range(40):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(x).float().pow(2).mean()
            loss.backward()
            opt.step()
    assert d.session is not None
    ab = d.session.section("speed_probe").get("precisions", {})
    assert ab.get("fp8") is None
