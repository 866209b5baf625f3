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


#: The A/B's budget where FP8's verdicts are under test: far above what they take (~1 s here),
#: so that load does not skip FP8 for its budget (with 5 s, two failures at load 6 were seen)
BUDGET_S = 60.0


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
    # the verdicts are under test, not the budget (`test_fp8_stays_within_the_budget`): a
    # budget of wall time that a loaded machine's time slices cannot spend before FP8's turn
    r = ampdiag.compare(model, x, precisions=["fp32", "bf16", "fp8"], budget_s=BUDGET_S)
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
    r = ampdiag.compare(model, x, precisions=["fp32", "fp8"], budget_s=BUDGET_S)
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


def growing_input_model() -> torch.nn.Module:
    """Layer "0" sees the batch as it comes; the LayerNorm gives layer "3" a steady input."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(64, 128),
        torch.nn.LayerNorm(128),
        torch.nn.GELU(),
        torch.nn.Linear(128, 64),
    )


def _stale_scale_sqnr_db(x: torch.Tensor, history_amax: float) -> float:
    """SQNR of an E4M3 cast of ``x`` at the scale of an earlier amax (delayed scaling)."""
    x = x.float()
    scale = 448.0 / history_amax
    back = (x * scale).clamp(-448, 448).to(E4M3).float() / scale
    return float(10 * torch.log10(x.pow(2).sum() / (back - x).pow(2).sum()))


def test_amax_growth_between_sampled_steps_keeps_that_layer_out_of_delayed_fp8(
    tmp_path: Path,
) -> None:
    """The batch grows 4x a step: layer "0"'s input amax outruns its history, "3"'s does not.

    Truth from the test's own tensors: each step's input amax per layer (plain forward hooks
    outside ampdiag's), the growth over the steps before it, and the SQNR of an E4M3 cast of
    that step's input at the scale the delayed recipe takes from the earlier steps' amax.
    """
    from ampdiag.analysis import analyze

    model = growing_input_model()
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(1)
    batches = [torch.randn(64, 64, generator=gen) * 4.0**k for k in range(6)]
    seen: dict[str, list[torch.Tensor]] = {"0": [], "3": []}
    hooks = [
        model[int(n)].register_forward_hook(
            lambda _m, a, _o, n=n: seen[n].append(a[0].detach().clone())
        )
        for n in seen
    ]
    with (
        one_thread(),
        ampdiag.diagnose(
            out=tmp_path, report=False, console=False, tensorboard=False, fp8=True,
            sample_every=1, precision_ab_budget_s=0,
        ) as d,
    ):  # fmt: skip
        for x in batches:
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()
    for h in hooks:
        h.remove()
    assert d.session is not None
    truth: dict[str, tuple[float, int, float]] = {}  # growth, its step, the stale-scale SQNR
    for name, inputs in seen.items():
        amax = [float(t.abs().amax()) for t in inputs]
        growth, at = max((amax[k] / max(amax[:k]), k) for k in range(1, len(amax)))
        truth[name] = (growth, at, _stale_scale_sqnr_db(inputs[at], max(amax[:at])))
    # the test's own casts: the stale scale wrecks layer "0" at 4x growth, not layer "3"
    assert truth["0"][0] > 3.0 and truth["0"][2] < 20.0, truth
    assert truth["3"][0] < 1.5 and truth["3"][2] > 25.0, truth

    r = ampdiag.compare(model, batches[-1], precisions=["fp32", "fp8"], budget_s=5,
                        fp8_recipe="delayed")  # fmt: skip
    assert r.fp8 is not None and r.fp8.get("layers"), r.fp8
    # one batch alone cannot see the movement: the A/B calls both layers safe
    assert r.fp8["keep"] == []
    session = d.session
    session.sections["speed_probe"] = {"precisions": {"fp8": r.fp8}}
    findings = analyze(session)
    derived = session.section("derived")["fp8"]
    by_name = {la["name"]: la for la in derived["layers"]}
    for name in ("0", "3"):
        growth = by_name[name]["amax_drift"]["input"]
        assert abs(growth["growth"] - truth[name][0]) <= 1e-5 * truth[name][0], (name, growth)
        assert growth["growth_step"] == truth[name][1]
    assert by_name["0"]["verdict"] == "keep-bf16" and by_name["3"]["verdict"] == "fp8-safe"
    assert derived["keep"] == ["0"] and "KEEP_IN_BF16 = {'0'}" in derived["filter"]
    (found,) = [f for f in findings if f.id == "fp8-readiness"]
    assert list(found.evidence["keep"]) == ["0"]
    assert "amax grew" in found.evidence["keep"]["0"][-1]


def test_amax_growth_is_shown_not_judged_under_current_scaling(tmp_path: Path) -> None:
    """Tensorwise scaling takes each step's own amax: the same growth keeps every layer."""
    from ampdiag.analysis import fp8 as afp8

    amax = {"steps": [0, 1, 2], "layers": {"0": {"input": [1.0, 4.0, 16.0]}}}
    row = {"recipe": "tensorwise", "layers": [{"name": "0", "reasons": []}], "convert": ["0"]}
    out = afp8.readiness(row, amax)
    assert out["layers"][0]["verdict"] == "fp8-safe"
    assert out["layers"][0]["amax_drift"]["input"]["growth"] == 4.0
    assert afp8.readiness({**row, "recipe": "delayed"}, amax)["keep"] == ["0"]


def test_an_explicit_fp8_request_runs_whatever_the_budget(tmp_path: Path) -> None:
    """``diagnose(fp8=True)`` with an A/B budget of a millisecond, which the FP8 readiness's
    per-module forwards alone exceed: the readiness the user asked for runs all the same, with
    every Linear's verdict, and the report says what the budget decided.

    The budget is set, not left to the block's 5%: on a slow machine a 12-step block's 5% can
    pay for the whole A/B, and the test would assert nothing about the budget."""
    model, x = outlier_model(), torch.randn(32, 64)
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    with (
        one_thread(),
        ampdiag.diagnose(
            out=tmp_path,
            console=False,
            tensorboard=False,
            fp8=True,
            precision_ab_budget_s=0.001,
        ) as d,
    ):
        for _ in range(12):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(x).float().pow(2).mean()
            loss.backward()
            opt.step()
    assert d.session is not None
    ab = d.session.section("speed_probe")["precisions"]
    linears = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    assert "layers" in ab["fp8"], ab["fp8"]
    assert sorted(la["name"] for la in ab["fp8"]["layers"]) == sorted(linears)
    # the millisecond could not pay for the A/B: it ran all the same, and the page says so
    assert ab["spent_s"] > ab["budget_s"] and "ran all the same" in ab["budget_note"]
    assert "Budget: " in (tmp_path / "report.html").read_text()
