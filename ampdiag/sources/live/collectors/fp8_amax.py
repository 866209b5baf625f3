"""The amax of every ``nn.Linear``'s FP8 operands on each sampled step: how far it moves.

The FP8 readiness (`ampdiag.sources.live.fp8`) measures each Linear on one batch; whether a
delayed-scaling recipe (this step's scale from earlier steps' amax) survives training depends
on how the amax moves from step to step, which one batch cannot show (docs/how-it-works.md,
FP8 readiness). On sampled steps only, where the FP8 readiness runs: a forward hook on every
Linear reduces its input and weight to one amax each and hooks its output, whose gradient is
reduced likewise; one transfer per step (`_host.Deferred`). Hooks return None.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch

from ampdiag.compat.fp8 import device_has_fp8
from ampdiag.config import DiagnoseConfig
from ampdiag.schema import Fp8AmaxSection
from ampdiag.sources.live import global_hooks
from ampdiag.sources.live.collectors import COLLECTORS
from ampdiag.sources.live.collectors._host import Deferred, absorb_ready
from ampdiag.sources.live.collectors.base import Collector, RunContext, internal_work

#: The operands of a Linear's three FP8 matmuls, in the section's order.
OPERANDS = ("input", "weight", "grad_output")
#: Sampled steps kept (the first ones: the amax a delayed recipe starts its history with).
MAX_STEPS = 64
#: Linear layers watched (the model's first ones, in ``named_modules`` order).
MAX_LAYERS = 512


@COLLECTORS.register
class Fp8AmaxCollector(Collector):
    """Per Linear and sampled step: the amax of its input, weight and output gradient."""

    name = "fp8_amax"
    enabled_by = None  # decided per model: fp8=True, or None on an FP8 GPU

    def __init__(self, config: DiagnoseConfig | None = None) -> None:
        self._wanted = None if config is None else config.fp8
        self._run: RunContext | None = None
        self._names: list[str] = []
        self._hooks = global_hooks.SampledHooks(self._forward)
        self._active = False
        self._tokens: dict[tuple[int, int], torch.Tensor] = {}
        self._pending: list[tuple[int, list[tuple[int, int]], Deferred]] = []
        self._steps: list[int] = []
        self._amax: list[dict[tuple[int, int], float]] = []
        self._errors: list[str] = []

    @classmethod
    def from_config(cls, config: DiagnoseConfig) -> Collector:
        """Knows whether FP8 was asked for (``fp8``: True, False, or None: on an FP8 GPU)."""
        return cls(config)

    def start(self, run: RunContext) -> None:
        """Arms the hooks for the first step when it is sampled."""
        self._run = run
        self._active = run.is_sampled(run.step)

    def on_model(self, run: RunContext, model: torch.nn.Module) -> None:
        """Learns the model's Linear layers, when this run measures FP8 at all."""
        if self._wanted is False:
            return
        if self._wanted is None:
            param = next(model.parameters(), None)
            if param is None or not device_has_fp8(param.device):
                return
        prefix = "" if len(run.models) <= 1 else f"model{len(run.models) - 1}."
        known = {id(m) for m in self._hooks.modules}
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear) and id(module) not in known:
                if len(self._hooks.modules) >= MAX_LAYERS:
                    break
                self._names.append(prefix + name)
                self._hooks.add(module, hook_now=self._active)

    def stop(self, run: RunContext) -> None:
        """Removes every hook; reads what is still on its way to the host."""
        self._hooks.arm(False)
        self._active = False
        self._pending = absorb_ready(self._pending, self._absorb, True)

    # --- hooks ------------------------------------------------------------------------------

    def _forward(self, idx: int, module: torch.nn.Module, args: Any, output: Any) -> None:
        if not self._active or (self._run is not None and not self._run.on_block_thread()):
            return
        try:
            with internal_work():
                x = args[0] if args else None
                if isinstance(x, torch.Tensor) and x.is_floating_point() and x.numel():
                    self._keep(idx, 0, x)
                weight = getattr(module, "weight", None)
                if isinstance(weight, torch.Tensor) and weight.numel():
                    self._keep(idx, 1, weight)
                if (
                    torch.is_grad_enabled()
                    and isinstance(output, torch.Tensor)
                    and output.requires_grad
                ):
                    output.register_hook(partial(self._grad, idx))  # type: ignore[no-untyped-call]
        except Exception as exc:  # observing must never break the user's step
            self._error(exc)

    def _grad(self, idx: int, grad: torch.Tensor) -> None:
        try:
            with internal_work():
                if grad is not None and grad.numel():
                    self._keep(idx, 2, grad)
        except Exception as exc:  # observing must never break the user's backward
            self._error(exc)

    def _keep(self, idx: int, operand: int, t: torch.Tensor) -> None:
        """The operand's amax this step (the largest over the step's calls and micro-batches)."""
        amax = t.detach().abs().amax().float()
        key = (idx, operand)
        seen = self._tokens.get(key)
        self._tokens[key] = amax if seen is None else torch.maximum(seen, amax.to(seen.device))

    def _error(self, exc: Exception) -> None:
        if len(self._errors) < 10:
            self._errors.append(repr(exc))

    # --- steps ------------------------------------------------------------------------------

    def on_step_end(self, run: RunContext, step: int) -> None:
        """Sends the step's amaxes to the host; hooks or unhooks for the next step."""
        if self._tokens and len(self._steps) + len(self._pending) < MAX_STEPS:
            with internal_work():
                keys = list(self._tokens)
                parts = [self._tokens[k] for k in keys]
                device = parts[0].device
                parts = [p if p.device == device else p.to(device) for p in parts]
                self._pending.append((step, keys, Deferred(torch.stack(parts), copy=False)))
        self._tokens = {}
        active = (
            bool(self._hooks.modules)
            and len(self._steps) + len(self._pending) < MAX_STEPS
            and run.is_sampled(step + 1)
        )
        self._hooks.arm(active)
        self._active = active
        if self._pending:
            self._pending = absorb_ready(self._pending, self._absorb, False)

    def _absorb(self, step: int, keys: list[tuple[int, int]], d: Deferred) -> None:
        values = d.arrays()[0].tolist()
        self._steps.append(step)
        self._amax.append({k: float(v) for k, v in zip(keys, values, strict=True)})

    def section(self) -> Fp8AmaxSection | None:
        """Per Linear: each operand's amax on every sampled step (None where not seen)."""
        self._pending = absorb_ready(self._pending, self._absorb, True)
        if not self._steps:
            return None
        layers: dict[str, dict[str, list[float | None]]] = {}
        for idx, name in enumerate(self._names):
            layers[name] = {
                op: [step.get((idx, k)) for step in self._amax] for k, op in enumerate(OPERANDS)
            }
        return {"steps": list(self._steps), "layers": layers, "errors": self._errors}
