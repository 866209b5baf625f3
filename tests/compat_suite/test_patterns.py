"""What training scripts do to their model, optimizer and scaler, with and without diagnose().

Each test is one pattern (most seen in public training code: timm's EMA, SWA, whole-model
``torch.save``, checkpointing, sparse embeddings, eval and generation inside the loop); each
must run without an exception and give bit-identical results under every setting in `CONFIGS`.
"""

from __future__ import annotations

import contextlib
import copy
import io
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from tests.compat_suite.harness import CONFIGS, same_under_diagnose

STEPS = 4


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 4))


def amp_loop(
    block: contextlib.AbstractContextManager[Any],
    model: nn.Module,
    after_step: Any = None,
    steps: int = STEPS,
    scaler: bool = True,
    batch: Any = lambda: torch.randn(6, 8),
    optimizer: Any = None,
) -> dict[str, Any]:
    """A bf16-autocast loop with a (CPU) GradScaler; ``after_step(i, model, opt, scaler)``.

    ``batch()`` draws one input; ``optimizer(params)`` makes the optimizer (AdamW by default).
    """
    opt = (optimizer or (lambda p: torch.optim.AdamW(p, lr=1e-2)))(model.parameters())
    gs = torch.amp.GradScaler("cpu", enabled=scaler)
    data = [batch() for _ in range(steps)]
    made: list[Any] = []
    losses = []
    with block:
        for i, x in enumerate(data):
            with torch.autocast("cpu", torch.bfloat16):
                loss = model(x).float().square().mean()
            gs.scale(loss).backward()
            gs.step(opt)
            gs.update()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.detach())
            if after_step is not None:
                made.append(after_step(i, model, opt, gs))
    return {"model": model, "opt": opt.state_dict(), "losses": losses, "made": made}


params = pytest.mark.parametrize("settings", list(CONFIGS.values()), ids=list(CONFIGS))


@params
def test_deepcopy_of_model_optimizer_and_scaler(settings: dict[str, Any], tmp_path: Path) -> None:
    def copies(i: int, model: nn.Module, opt: Any, gs: Any) -> Any:
        twin = copy.deepcopy(model)
        copy.deepcopy(opt)
        copy.deepcopy(gs)
        return twin(torch.ones(2, 8))

    same_under_diagnose(lambda b: amp_loop(b, mlp(), copies), settings, tmp_path)


@params
def test_pickling_and_torch_save_of_whole_objects(settings: dict[str, Any], tmp_path: Path) -> None:
    def save(i: int, model: nn.Module, opt: Any, gs: Any) -> Any:
        buf = io.BytesIO()
        torch.save(model, buf)  # whole-object save, as word_language_model does
        buf.seek(0)
        loaded = torch.load(buf, weights_only=False)
        pickle.loads(pickle.dumps(opt))
        restored = pickle.loads(pickle.dumps(gs))
        return loaded(torch.ones(2, 8)), restored.state_dict()

    same_under_diagnose(lambda b: amp_loop(b, mlp(), save), settings, tmp_path)


@params
def test_swa_averaged_model(settings: dict[str, Any], tmp_path: Path) -> None:
    def scenario(block: Any) -> Any:
        model = mlp()
        holder: list[Any] = []

        def average(i: int, m: nn.Module, o: Any, s: Any) -> None:
            if not holder:  # made inside the block, as a script's SWA phase starts mid-run
                holder.append(torch.optim.swa_utils.AveragedModel(m))
            holder[0].update_parameters(m)

        out = amp_loop(block, model, average)
        return out, holder[0].module

    same_under_diagnose(scenario, settings, tmp_path)


class ModelEma(nn.Module):
    """timm's ModelEmaV2/V3 in short: a deep copy, updated by lerp of the state_dict."""

    def __init__(self, model: nn.Module, decay: float = 0.9, foreach: bool = False) -> None:
        super().__init__()
        self.module = copy.deepcopy(model)
        self.module.eval()
        self.decay, self.foreach = decay, foreach

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        ema = [v for v in self.module.state_dict().values() if v.is_floating_point()]
        new = [v for v in model.state_dict().values() if v.is_floating_point()]
        if self.foreach:
            torch._foreach_lerp_(ema, new, 1.0 - self.decay)
        else:
            for e, m in zip(ema, new, strict=True):
                e.lerp_(m.detach(), 1.0 - self.decay)


@params
@pytest.mark.parametrize("foreach", [False, True], ids=["v2", "v3"])
def test_timm_style_ema(settings: dict[str, Any], foreach: bool, tmp_path: Path) -> None:
    def scenario(block: Any) -> Any:
        model = mlp()
        holder: list[ModelEma] = []

        def update(i: int, m: nn.Module, o: Any, s: Any) -> Any:
            if not holder:  # timm creates the EMA after the model is on its device
                holder.append(ModelEma(m, foreach=foreach))
            holder[0].update(m)
            return holder[0].module(torch.ones(2, 8))

        return amp_loop(block, model, update), holder[0]

    same_under_diagnose(scenario, settings, tmp_path)


@params
def test_state_dict_round_trips(settings: dict[str, Any], tmp_path: Path) -> None:
    def round_trip(i: int, model: nn.Module, opt: Any, gs: Any) -> Any:
        model.load_state_dict(copy.deepcopy(model.state_dict()))
        opt.load_state_dict(copy.deepcopy(opt.state_dict()))
        gs.load_state_dict(gs.state_dict())
        return None

    same_under_diagnose(lambda b: amp_loop(b, mlp(), round_trip), settings, tmp_path)


@params
def test_moving_and_casting_the_model_mid_run(settings: dict[str, Any], tmp_path: Path) -> None:
    def scenario(block: Any) -> Any:
        model = mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        outs = []
        with block:
            for dtype in (torch.float32, torch.float64, torch.float32, torch.bfloat16):
                model.to("cpu", dtype)
                loss = model(torch.randn(4, 8, dtype=dtype)).float().square().mean()
                loss.backward()
                opt.step()
                opt.zero_grad()
                outs.append(loss.detach())
        return model, outs

    same_under_diagnose(scenario, settings, tmp_path)


class Blocks(nn.Module):
    def __init__(self, reentrant: bool | None) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(16, 16), nn.GELU(), nn.Linear(16, 16)) for _ in range(3)
        )
        self.head = nn.Linear(16, 4)
        self.reentrant = reentrant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            if self.reentrant is None:
                h = h + block(h)
            else:
                h = h + checkpoint(block, h, use_reentrant=self.reentrant)
        return self.head(h)


@params
@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_activation_checkpointing(
    settings: dict[str, Any], reentrant: bool, tmp_path: Path
) -> None:
    session = same_under_diagnose(lambda b: amp_loop(b, Blocks(reentrant)), settings, tmp_path)
    # One model, one backward per step: the recomputed blocks are neither models nor
    # micro-batches (counted here: the loop runs one backward per step).
    assert [m["class"] for m in session["run"]["models"]] == ["Blocks"]
    micro = [s.get("micro_batches") for s in session["steps"]]
    assert set(micro) <= {1, None} and 1 in micro


class SparseBag(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(50, 8, sparse=True)
        self.out = nn.Linear(8, 4)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.out(self.emb(idx).mean(1))


@params
def test_sparse_embedding_gradients(settings: dict[str, Any], tmp_path: Path) -> None:
    def scenario(block: Any) -> Any:
        return amp_loop(
            block,
            SparseBag(),
            scaler=False,
            batch=lambda: torch.randint(0, 50, (6, 5)),  # repeated indices: uncoalesced grads
            optimizer=lambda p: torch.optim.SGD(p, lr=0.1),
        )

    same_under_diagnose(scenario, settings, tmp_path)


@params
def test_channels_last_convolution(settings: dict[str, Any], tmp_path: Path) -> None:
    def scenario(block: Any) -> Any:
        model = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(8 * 36, 4),
        ).to(memory_format=torch.channels_last)
        return amp_loop(
            block,
            model,
            scaler=False,
            batch=lambda: torch.randn(4, 3, 6, 6).to(memory_format=torch.channels_last),
            optimizer=lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
        )

    same_under_diagnose(scenario, settings, tmp_path)


@params
def test_data_parallel_wrapper(settings: dict[str, Any], tmp_path: Path) -> None:
    same_under_diagnose(lambda b: amp_loop(b, nn.DataParallel(mlp())), settings, tmp_path)


@params
def test_eval_no_grad_and_inference_mode_inside_the_block(
    settings: dict[str, Any], tmp_path: Path
) -> None:
    def evaluate(i: int, model: nn.Module, opt: Any, gs: Any) -> Any:
        model.eval()
        with torch.no_grad():
            a = model(torch.ones(3, 8))
        with torch.inference_mode():
            b = model(torch.ones(3, 8))
        model.train()
        return a, b.clone()

    same_under_diagnose(lambda b: amp_loop(b, mlp(), evaluate), settings, tmp_path)


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Linear(8, 16)
        layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.enc(self.emb(x)))


def _hooked(model: nn.Module) -> list[str]:
    """The modules with a hook of their own: what turns the encoder's fast path off.

    PyTorch's own condition (``TransformerEncoderLayer.forward``: any forward or forward
    pre-hook on the layer or a submodule); read here rather than inferred from the output,
    since on some CPUs both paths give the same bits.
    """
    return [
        name
        for name, m in model.named_modules()
        if len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks)
    ]


@params
def test_transformer_encoder_eval_fast_path(settings: dict[str, Any], tmp_path: Path) -> None:
    def evaluate(i: int, model: nn.Module, opt: Any, gs: Any) -> Any:
        model.eval()
        with torch.no_grad():
            out = model(torch.linspace(-1, 1, 3 * 7 * 8).reshape(3, 7, 8))
        model.train()
        return out

    def scenario(block: Any) -> Any:
        model = Encoder()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        made = []
        with block:
            for _ in range(3):
                loss = model(torch.randn(3, 7, 8)).square().mean()
                loss.backward()
                opt.step()
                opt.zero_grad()
                made.append(evaluate(0, model, opt, None))
                assert _hooked(model) == []
        return model, made

    same_under_diagnose(scenario, settings, tmp_path)
