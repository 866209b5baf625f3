"""The memory collector on real CPU runs: exact model state, categorized peak, OOM handling."""

import gc
import json
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from ampdiag.compat import memory as compat_memory
from ampdiag.sources.live.diagnosis import diagnose
from tests.conftest import QUIET

BATCHES = [8, 8, 16, 32, 8]  # profiled steps (skip 1, warm-up 1, active 3): 16, 32, 8


def train(out: Path | None, batches: list[int] = BATCHES, **settings: object):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    data = [
        (torch.randn(b, 64, generator=gen), torch.randint(0, 10, (b,), generator=gen))
        for b in batches
    ]

    def loop() -> None:
        for x, y in data:
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()

    if out is None:
        loop()
        return model, opt, None
    gc.collect()  # no earlier test's tensors freed inside the profiled window
    with diagnose(out=out, **{**QUIET, **settings}) as d:
        loop()
    return model, opt, d


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory):
    return train(tmp_path_factory.mktemp("mem") / "run")


def test_model_state_is_exact(run) -> None:
    model, opt, d = run
    ms = d.session.section("memory")["model_state"]
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert ms["parameters"] == param_bytes
    assert ms["gradients"] == param_bytes
    # Adam keeps two FP32 moments per parameter (plus a 4-byte step counter per tensor)
    by_key = ms["optimizer_state_by_key"]
    assert by_key["exp_avg"] + by_key["exp_avg_sq"] == 2 * param_bytes
    direct = sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values())
    assert ms["optimizer_state"] == direct


def test_peak_split_by_category(run) -> None:
    model, _opt, d = run
    mem = d.session.section("memory")
    assert mem["timeline"]["source"] == "torch-memory-profiler"
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    by_cat = mem["peak"]["by_category"]
    assert by_cat["parameters"] == param_bytes
    assert by_cat["optimizer_state"] == mem["model_state"]["optimizer_state"]
    assert mem["peak"]["bytes"] == sum(by_cat.values())
    assert len(mem["timeline"]["t_ms"]) <= 400
    # session.json stays small
    assert len(json.dumps(mem)) < 200_000


def test_activations_grow_with_the_batch_as_measured(run) -> None:
    _, _, d = run
    mem = d.session.section("memory")
    # measured before each backward of the sampled and profiled steps (step 0's batch is not
    # known: the model is found during its forward)
    points = dict(sorted(mem["live_activation_points"]))
    assert sorted(points) == [8, 16, 32]
    values = [points[b] for b in sorted(points)]
    assert values[0] < values[1] < values[2]
    from ampdiag.analysis.memory_estimates import activation_fit

    fit = activation_fit(mem)
    assert fit is not None and fit["source"] == "live run" and fit["per_sample_bytes"] > 0


def test_training_is_bit_identical(run) -> None:
    model, _, _ = run
    plain, _, _ = train(None)
    for a, b in zip(model.parameters(), plain.parameters(), strict=True):
        assert torch.equal(a, b)


def test_fallback_categorizer_agrees_on_model_state(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(compat_memory, "categorized_timeline", lambda *a, **k: None)
    model, _, d = train(tmp_path / "fb")
    mem = d.session.section("memory")
    assert mem["timeline"]["source"] == "ampdiag-known-tensors"
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    by_cat = mem["peak"]["by_category"]
    assert by_cat["parameters"] == param_bytes
    assert by_cat["optimizer_state"] == mem["model_state"]["optimizer_state"]
    assert max(v for _, v in mem["live_activation_points"]) > 0


def test_oom_still_writes_session_and_finding(tmp_path: Path, quiet_diagnose) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    model = nn.Linear(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    err = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    with pytest.raises(torch.OutOfMemoryError) as info, quiet_diagnose():
        model(torch.randn(2, 16)).sum().backward()
        opt.step()
        raise err
    assert info.value is err
    doc = json.loads((tmp_path / "session.json").read_text())
    assert doc["status"] == "error"
    (oom,) = [f for f in doc["findings"] if f["id"] == "out-of-memory"]
    assert oom["severity"] == "high"
    held = oom["evidence"]["held_by_category"]
    assert held["parameters"] == sum(p.numel() * 4 for p in model.parameters())


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_demo_writes_snapshot(tmp_path: Path) -> None:
    from ampdiag.demo import run_demo
    from ampdiag.sources.safe_pickle import load_plain

    out = run_demo(tmp_path, scenario="amp", device="cuda", steps=5)
    mem = json.loads((out / "session.json").read_text())["memory"]
    cuda = mem["cuda"]
    assert (out / cuda["snapshot_file"]).is_file()
    load_plain(out / cuda["snapshot_file"])  # plain data only
    assert cuda["stats"]["allocated_peak_bytes"] >= cuda["peak"]["allocated_bytes"] > 0


def test_user_saved_tensor_hooks_are_never_unpacked(tmp_path: Path, quiet_diagnose) -> None:  # type: ignore[no-untyped-def]
    # Non-reentrant checkpointing recomputes its segment when a saved tensor is unpacked:
    # counting the activations of such a step would run the recomputation early. ampdiag
    # skips the steps whose forward ran under the user's saved-tensor hooks.
    from torch.utils.checkpoint import checkpoint

    def loop(model: nn.Module, opt: torch.optim.Optimizer, calls: list[int]) -> None:
        gen = torch.Generator().manual_seed(0)
        for step in range(4):
            x = torch.randn(8, 16, generator=gen)
            opt.zero_grad(set_to_none=True)
            out = checkpoint(model, x, use_reentrant=False) if step % 2 else model(x)
            out.square().mean().backward()
            opt.step()

    def build() -> tuple[nn.Module, torch.optim.Optimizer, list[int]]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
        calls: list[int] = []
        model[1].register_forward_hook(lambda m, a, o: calls.append(1))
        return model, torch.optim.SGD(model.parameters(), lr=0.1), calls

    hooks = torch.autograd.graph.saved_tensors_hooks
    original = (hooks.__dict__["__enter__"], hooks.__dict__["__exit__"])
    model, opt, calls = build()
    with quiet_diagnose(profile=False) as d:
        loop(model, opt, calls)
    plain, plain_opt, plain_calls = build()
    loop(plain, plain_opt, plain_calls)
    assert len(calls) == len(plain_calls) == 6  # 4 forwards + 2 recomputations
    for a, b in zip(model.parameters(), plain.parameters(), strict=True):
        assert torch.equal(a, b)
    saved = d.session.section("memory")["saved_activations"]
    assert sorted(saved) == ["0", "2"]  # the checkpointed steps 1 and 3 are not counted
    assert (hooks.__dict__["__enter__"], hooks.__dict__["__exit__"]) == original  # restored
