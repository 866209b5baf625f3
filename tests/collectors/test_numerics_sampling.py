"""Which steps the numerics sample, and what a sample of a large tensor counts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

import ampdiag
from ampdiag.analysis import fp16range
from ampdiag.config import DiagnoseConfig, is_sampled_step
from ampdiag.sources.live.collectors._exponents import (
    host_signed_histograms,
    sample_view,
    sampled_signed_histograms,
    signed_histograms_of,
)
from ampdiag.sources.live.collectors.gradients import device_stats
from tests.collectors.helpers import histograms, module_callbacks, raw_histogram
from tests.collectors.test_numerics_collectors import QUIET, direct_fp16, mlp, train, wide_values


def sampled(cfg: DiagnoseConfig, n: int = 60) -> list[int]:
    return [s for s in range(n) if is_sampled_step(cfg, s)]


def test_default_schedule_is_dense_then_sparse_and_skips_the_profiled_steps() -> None:
    cfg = DiagnoseConfig()
    assert cfg.sample_every == 0  # automatic by default
    first = cfg.profile_skip + cfg.profile_warmup
    profiled = set(range(first, first + cfg.profile_active))
    assert profiled == {2, 3, 4}
    dense = [s for s in range(cfg.sample_first) if s not in profiled]
    sparse = list(range(cfg.sample_first, 60, cfg.sample_period))
    assert sampled(cfg) == dense + sparse
    assert not profiled & set(sampled(cfg))
    # without the profiler nothing is skipped
    assert sampled(DiagnoseConfig(profile=False), 12) == [*range(10), 10]


def test_an_explicit_period_is_exactly_every_nth_step_profiled_or_not() -> None:
    assert sampled(DiagnoseConfig(sample_every=3), 12) == [0, 3, 6, 9]
    assert sampled(DiagnoseConfig(sample_every=1), 6) == list(range(6))


def test_activation_hooks_exist_only_on_sampled_steps(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = mlp()
    hooked: list[int] = []

    def count_hooks(i: int, m: nn.Module, opt: Any, scaler: Any) -> None:
        # ampdiag's callbacks for the model's modules are held by ampdiag, none on the modules
        hooked.append(sum(module_callbacks(mod) for mod in m.modules()))
        assert all(not (mod._forward_hooks or mod._forward_pre_hooks) for mod in m.modules())

    # The sentinel's hooks are on every step by design (tests/collectors/test_sentinel.py).
    settings = QUIET | {"sample_first": 2, "sample_period": 3, "sentinel": False}
    with ampdiag.diagnose(out=tmp_path, **settings) as d:
        train(model, 7, dtype=torch.float16, hook=count_hooks)
    assert d.session is not None
    expected = [0, 1, 2, 5]
    # The root keeps its callbacks on every step (discovery's autocast watch and the
    # collectors' input watches): the activation statistics add theirs on sampled steps only.
    assert [i for i, n in enumerate(hooked) if n > min(hooked)] == expected
    assert [s["index"] for s in d.session.steps if s["sampled"]] == expected
    assert [s["step"] for s in d.session.section("gradients")["steps"]] == expected
    assert d.session.section("activations")["sampled_steps"] == len(expected)
    assert all(module_callbacks(mod) == 0 for mod in model.modules())


def test_the_profiled_steps_carry_no_numerics_probes(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = mlp()
    with ampdiag.diagnose(
        out=tmp_path,
        report=False,
        tensorboard=False,
        console=False,
        memory=False,
        precision=False,
        speed_probe=False,
        profile_skip=0,
        profile_warmup=1,
        profile_active=1,
    ) as d:
        train(model, 3, dtype=torch.float16)
    assert d.session is not None
    steps = {s["index"]: s for s in d.session.steps}
    assert steps[1]["profiled"] and not steps[1]["sampled"]
    assert [s["step"] for s in d.session.section("gradients")["steps"]] == [0, 2]


def test_a_sample_of_a_large_tensor_counts_exactly_its_values_and_spans_every_column() -> None:
    values = wide_values(300 * 257, 4, avoid=(-25, -37)).view(300, 257)
    view = sample_view(values, 1024)
    assert view.numel() == 1024
    # every column offset is visited by some run of the sample
    base = values.data_ptr()
    starts = {(view[r].data_ptr() - base) // 4 for r in range(view.shape[0])}
    cols = {(s + j) % 257 for s in starts for j in range(view.shape[1])}
    assert cols == set(range(257))
    # the histogram of the sample counts exactly the sampled values (against an fp16 cast)
    hist = raw_histogram(values, 1024).tolist()
    sample = view.reshape(-1)
    for scale_log2 in (0, 12):
        counts = fp16range.range_counts(hist, scale_log2)
        direct = direct_fp16(sample, scale_log2)
        for key in ("zero", "flush", "subnormal", "overflow"):
            assert counts[key] == direct[key], (scale_log2, key)


def test_gradient_fast_path_equals_histograms_of_the_copied_samples() -> None:
    torch.manual_seed(0)
    tensors = [
        torch.randn(512, 128) * 1e-5,
        torch.randn(384),
        torch.randn(64, 48) * 1e3,
        torch.randn(7) * 1e-30,  # no multiple of 16: taken whole
        torch.randn(3, 5000),
    ]
    tensors[0][3, 3] = float("inf")
    for _ in range(2):  # the second call reuses the cached plan and buffer
        fast = sampled_signed_histograms(tensors, 1024, {}).sum(dim=1)
        copies = [sample_view(t, 1024).clone() for t in tensors]
        assert torch.equal(fast, histograms(copies))
    assert [int(r.sum()) for r in fast] == [1024, 384, 1024, 7, 1024]


def _mixed_tensors() -> list[torch.Tensor]:
    torch.manual_seed(1)
    odd = torch.randn(300, 70) * 1e-6
    odd[0, :4] = torch.tensor([float("nan"), float("-inf"), -0.0, 1e-40])  # and a subnormal
    return [
        odd,
        torch.randn(128) * 1e-3,
        torch.randn(96, 40).half(),
        (torch.randn(200) * 1e-8).bfloat16(),
        torch.randn(64, 64, dtype=torch.float64) * 1e-30,
        torch.randn(80, 48).t(),  # not contiguous
        torch.randn(5000).requires_grad_(),
    ]


def test_host_histograms_equal_the_counts_of_the_copied_samples() -> None:
    mixed = _mixed_tensors()
    narrow = [torch.randn(7) * 1e-20, torch.randn(3, 5000) * 1e3]  # 7: taken whole, no cat
    cache: dict[Any, Any] = {}
    # alternate between shape sets: the plans and buffers are reused, never mixed up
    for tensors in (mixed, narrow, mixed, mixed, narrow):
        host = host_signed_histograms(tensors, 1024, cache)
        copies = [sample_view(t.detach(), 1024).float().clone() for t in tensors]
        expect = signed_histograms_of(copies)
        assert host.tolist() == expect.tolist()
        detached = [t.detach() for t in tensors]
        assert host.tolist() == sampled_signed_histograms(detached, 1024, {}).tolist()
    assert [int(r.sum()) for r in host] == [7, 1024]
    # the NaN, -inf, -0 and the float32 subnormal land in their bins: sign 0 negative
    first = host_signed_histograms(mixed, 0, {})[0]
    assert first[1, 255] >= 1 and first[0, 255] >= 1 and first[0, 0] >= 1 and first[1, 0] >= 1


def test_cpu_device_stats_reads_norms_and_scale_exactly() -> None:
    tensors = [t.detach() for t in _mixed_tensors()]
    scale = torch.tensor(2.0**12)
    for s, expect_scale in ((scale, 4096.0), (None, 1.0)):
        signed, tail = device_stats(tensors, 1024, {}, s).arrays()
        # as the device path sends them: stacked, as float32
        norms = torch.stack([n.float() for n in torch._foreach_norm(tensors)]).numpy()
        assert np.isnan(norms[0]) and np.array_equal(tail[:-1], norms, equal_nan=True)
        assert float(tail[-1]) == expect_scale
        assert signed.tolist() == sampled_signed_histograms(tensors, 1024, {}).tolist()


def test_sampled_fractions_are_close_to_the_full_tensor() -> None:
    gen = torch.Generator().manual_seed(5)
    # rows of very different magnitudes, as a weight gradient has
    rows = torch.logspace(-12, -2, 400).view(-1, 1)
    g = torch.randn(400, 300, generator=gen) * rows
    full = fp16range.range_counts(raw_histogram(g, 0).tolist())
    part = fp16range.range_counts(raw_histogram(g, 1024).tolist())
    for key in ("flush", "subnormal"):
        assert abs(part[key] / part["n"] - full[key] / full["n"]) < 0.05, key
