"""The exact origin on a real Hugging Face Llama, whose decoder layer calls its attention by
keyword (``self.self_attn(hidden_states=..., attention_mask=..., position_embeddings=...)``).

A tiny ``LlamaForCausalLM`` from a config (eager attention, FP32, AdamW), called
``model(input_ids=..., labels=...)``. Truth, recorded at the injection without ampdiag: an
autograd op wrapped around the attention's input (inside the attention's own forward, before
its q/k/v projections) returns a NaN gradient at step 3 and records the step (the
sentinel localizes by replaying that step on a copy of the model, whose attention of the same
layer fires again, at the same step). The gradient
with respect to the attention's keyword input is made by the attention's own backward code,
before its children's: the origin is the attention, not the decoder layer's code after its
``input_layernorm`` (what a sentinel blind to keywords names). A healthy run of the same
model, keyword calls and a causal mask included, holds no non-finite step at all.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import ampdiag
from tests.frameworks.conftest import SETTINGS

transformers = pytest.importorskip("transformers")
modeling_llama = pytest.importorskip("transformers.models.llama.modeling_llama")
pytestmark = pytest.mark.slow

AT, STEPS, VOCAB = 3, 6, 100


class _NaNGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, h: torch.Tensor, fired: dict[str, Any]) -> torch.Tensor:
        ctx.fired = fired
        return h.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        fired = ctx.fired
        if fired["now"] == AT:
            out = grad * float("nan")
            if bool(torch.isfinite(grad).all()) and not bool(torch.isfinite(out).all()):
                fired["steps"].append(fired["now"])
            return out, None
        return grad, None


def _train(out: Path, inject: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, dict[str, Any]]:
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    cfg._attn_implementation = "eager"
    model = transformers.LlamaForCausalLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    attn = model.model.layers[1].self_attn
    fired: dict[str, Any] = {"now": -1, "steps": []}
    forward = modeling_llama.LlamaAttention.forward

    def wrapped(self: Any, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        # the attention's own code, before its projections (a replay's copy of it too)
        if inject and self.layer_idx == attn.layer_idx:
            hidden_states = _NaNGrad.apply(hidden_states, fired)
        return forward(self, hidden_states, *args, **kwargs)

    monkeypatch.setattr(modeling_llama.LlamaAttention, "forward", wrapped)
    g = torch.Generator().manual_seed(1)
    with ampdiag.diagnose(out=out, **SETTINGS) as d:
        for step in range(STEPS):
            fired["now"] = step
            ids = torch.randint(0, VOCAB, (2, 16), generator=g)
            opt.zero_grad(set_to_none=True)
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
    names = {m: n for n, m in model.named_modules()}
    assert d.session is not None
    return d.session, {"fired": fired["steps"], "attn": names[attn]}


def test_backward_origin_through_a_keyword_input(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    session, truth = _train(tmp_path, True, monkeypatch)
    # first in the training step itself; again only where ampdiag replays that step
    assert truth["fired"] and set(truth["fired"]) == {AT}, truth
    origin = session.section("sentinel")["backward_origin"]
    assert origin["step"] == AT and origin["module"] == truth["attn"], origin
    assert origin["phase"] == "backward" and origin["parent_code"] is True, origin
    assert origin["between"][0] is None, origin  # before its children's backward


def test_healthy_llama_has_no_nonfinite_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    session, _ = _train(tmp_path, False, monkeypatch)
    sentinel = session.section("sentinel")
    assert sentinel["steps_watched"] == STEPS
    assert sentinel["nonfinite_steps"] == [] and sentinel["errors"] == [], sentinel
