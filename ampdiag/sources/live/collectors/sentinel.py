"""The divergence sentinel: on every step, where the first inf/NaN came from.

Sampled statistics can miss the step a run diverges on (a NaN at step 33 of 50 falls between
sampled steps, and the profiler's window is never sampled). The sentinel watches every step,
cheaply enough to leave on:

* forward: a forward hook on every module reduces its first floating output to one sum
  (`finite_token`: inf/NaN propagate into it), in execution order;
* loss: every loss given to backward (or to ``GradScaler.scale``), as a 0-dim tensor;
* backward: the same forward hook puts a tensor hook on the module's floating inputs that
  require grad; in the backward it reduces the gradient with respect to that input -- what
  the module's backward produced -- to one sum, in backward order. A hook on the root
  module's output sees the gradient arriving from the loss;
* gradients: at the step's end, the largest |g| over all parameter gradients
  (``torch.nn.utils.get_total_norm(grads, inf)``): non-finite, or zero (all gradients zero).

The values stay on the device; at the step's end they are stacked and copied to the host in
one transfer (`_host.Deferred`, read at a later step on CUDA). The first non-finite entry in
that order is the origin: the module whose output (forward) or input gradient (backward) first
held inf/NaN, or the loss. Hooks never change a tensor (they return None), and every hook is
removed on exit.

The first non-finite step is also replayed in FP32 (and BF16), before its weights change, by
`divergence_replay.ReplayKeeper` (the section's ``replay``): whether precision caused it.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import torch

from ampdiag.compat.dtensor import local_tensor
from ampdiag.schema import SentinelSection
from ampdiag.sources.live import global_hooks
from ampdiag.sources.live.collectors._host import Deferred, absorb_ready
from ampdiag.sources.live.collectors.base import Collector, RunContext, internal_work, tensors_in
from ampdiag.sources.live.collectors.divergence_replay import ReplayKeeper

#: The pseudo-module named when the loss (forward) or its backward holds the first inf/NaN.
LOSS = "(loss)"
#: Steps listed in full in the section.
MAX_LISTED = 100


def finite_token(t: torch.Tensor) -> torch.Tensor:
    """A 0-dim float32 tensor that is finite exactly when every value of ``t`` is.

    A sum: inf/NaN propagate into it (inf - inf is NaN). FP32, FP64 and BF16 are summed in
    their own dtype (BF16 has FP32's range, so a sum of finite BF16 values overflows only where
    FP32's would): ``torch.sum(t, dtype=float32)`` of a BF16 tensor first makes a full FP32 copy
    on the CPU, which would show in the run's memory peak as the user's. FP16 is summed in
    FP16 (float32 inside, rounded once at the end) and, only when that is not finite -- a real
    inf/NaN, or a sum beyond 65504 -- in float32, which decides: on the CPU that sum is read at
    once (no device to wait for); on a GPU the float32 sum is cheap and needs no read.
    """
    if t.dtype == torch.float16:
        if t.device.type == "cpu":
            quick = t.sum()
            if math.isfinite(float(quick)):
                return quick.float()
        return torch.sum(t, dtype=torch.float32)
    return t.sum().float()


class Sentinel(Collector):
    """First inf/NaN per step: module outputs, the loss, input gradients, parameter grads."""

    name = "sentinel"
    enabled_by = "sentinel"

    def __init__(self) -> None:
        self._names: list[str] = []
        self._index: dict[int, int] = {}
        self._roots: set[int] = set()
        self._handles: list[Any] = []
        self._params: list[tuple[str, torch.nn.Parameter]] = []
        self._fwd_idx: list[int] = []
        self._fwd: list[torch.Tensor] = []
        self._bwd_idx: list[int] = []
        self._bwd: list[torch.Tensor] = []
        self._loss: list[torch.Tensor] = []
        self._last_out: torch.Tensor | None = None
        self._pending: list[tuple[int, list[int], list[int], int, bool, Deferred]] = []
        self._steps = 0
        self._forward_origin: dict[str, Any] | None = None
        self._backward_origin: dict[str, Any] | None = None
        self._nonfinite: list[int] = []
        self._backward_only: list[int] = []
        self._loss_bad: list[int] = []
        self._zero_grads: list[int] = []
        self._errors: list[str] = []
        self._replay = ReplayKeeper(finite_token)  # the first non-finite step, replayed

    # --- lifecycle --------------------------------------------------------------------------

    def on_model(self, run: RunContext, model: torch.nn.Module) -> None:
        """Hooks every module of the model, for the whole run."""
        prefix = "" if len(run.models) <= 1 else f"model{len(run.models) - 1}."
        self._roots.add(id(model))
        for name, module in model.named_modules():
            if id(module) in self._index:
                continue
            idx = len(self._names)
            self._index[id(module)] = idx
            self._names.append(prefix + name if name else prefix + f"({type(module).__name__})")
            hook = partial(self._forward, idx)
            self._handles.append(global_hooks.on_module(module, global_hooks.MODULE_POST, hook))
        known = {id(p) for _, p in self._params}
        for name, p in model.named_parameters():
            if p.requires_grad and id(p) not in known:
                self._params.append((prefix + name, p))
                known.add(id(p))
        self._replay.on_model(run, model)

    def stop(self, run: RunContext) -> None:
        """Removes every hook; reads what is still on its way to the host."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._replay.stop()
        self._resolve(wait=True)

    # --- hooks ------------------------------------------------------------------------------

    def _forward(self, idx: int, module: torch.nn.Module, args: Any, output: Any) -> None:
        try:
            self._watch_forward(idx, module, args, output)
        except Exception as exc:  # observing must never break the user's step
            self._error(exc)

    def _error(self, exc: Exception) -> None:
        if len(self._errors) < 10:
            self._errors.append(repr(exc))

    def _watch_forward(self, idx: int, module: torch.nn.Module, args: Any, output: Any) -> None:
        t = next(tensors_in(output), None)
        with internal_work():
            if t is not None and t.is_floating_point() and t is not self._last_out:
                self._last_out = t
                self._fwd.append(finite_token(t.detach()))
                self._fwd_idx.append(idx)
            if not torch.is_grad_enabled():
                return
            for a in tensors_in(args, max_depth=2):
                # Not leaves: a parameter or input kept across steps would collect a hook per step.
                if a.requires_grad and a.grad_fn is not None and a.is_floating_point():
                    a.register_hook(partial(self._grad, idx))  # type: ignore[no-untyped-call]
            if id(module) in self._roots and t is not None and t.requires_grad:
                t.register_hook(partial(self._grad, -1))  # type: ignore[no-untyped-call]

    def _grad(self, idx: int, grad: torch.Tensor) -> None:
        if grad is None:
            return
        try:
            with internal_work():
                token = finite_token(grad.detach())
        except Exception as exc:  # observing must never break the user's backward
            self._error(exc)
            return
        self._bwd.append(token)
        self._bwd_idx.append(idx)

    def on_loss(self, run: RunContext, loss: torch.Tensor, from_scaler: bool) -> None:
        """Keeps the loss (one value) for the step's check."""
        self._last_out = None  # the forward is over: hold no activation until the step ends
        if loss.is_floating_point():
            self._loss.append(loss.detach().reshape(()).float())
        self._replay.on_loss(loss)

    def before_optimizer_step(self, run: RunContext, optimizer: torch.optim.Optimizer) -> None:
        """Replays the step in FP32 when it is the first non-finite one (weights unchanged)."""
        self._replay.before_optimizer_step(run)

    # --- steps ------------------------------------------------------------------------------

    def on_step_end(self, run: RunContext, step: int) -> None:
        """Stacks the step's values with the gradients' max |g| and sends them to the host."""
        self._replay.on_step_end(run, step)
        with internal_work():
            # DTensor gradients (FSDP2): this rank's shard is what this rank can see
            grads = [local_tensor(p.grad) for _, p in self._params if p.grad is not None]
            parts = [*self._fwd, *self._loss, *self._bwd]
            if grads:
                parts.append(torch.nn.utils.get_total_norm(grads, math.inf).float())
            if parts:
                device = parts[0].device
                if any(p.device != device for p in parts):
                    parts = [p.to(device) for p in parts]
                deferred = Deferred(torch.stack(parts), copy=False)
                self._pending.append(
                    (step, self._fwd_idx, self._bwd_idx, len(self._loss), bool(grads), deferred)
                )
        self._steps += 1
        self._fwd, self._fwd_idx, self._bwd, self._bwd_idx, self._loss = [], [], [], [], []
        self._last_out = None
        if self._pending:
            self._resolve(wait=False)

    def _resolve(self, wait: bool) -> None:
        self._pending = absorb_ready(self._pending, self._absorb, wait)

    def _absorb(
        self, step: int, fwd: list[int], bwd: list[int], nloss: int, grads: bool, d: Deferred
    ) -> None:
        import numpy as np

        values = d.arrays()[0].astype(np.float64)
        finite = np.isfinite(values)
        k, n = len(fwd), len(fwd) + nloss
        bad_fwd = np.flatnonzero(~finite[:k])
        bad_loss = not finite[k:n].all()
        bad_bwd = np.flatnonzero(~finite[n : n + len(bwd)])
        bad_grads = grads and not finite[-1]
        if grads and finite[-1] and values[-1] == 0:
            self._zero_grads.append(step)
        if bad_loss:
            self._loss_bad.append(step)
        if not (len(bad_fwd) or bad_loss or len(bad_bwd) or bad_grads):
            return
        self._nonfinite.append(step)
        if len(bad_fwd) or bad_loss:
            if self._forward_origin is None:
                if len(bad_fwd):
                    where, phase, kind = self._names[fwd[bad_fwd[0]]], "forward", "output"
                else:
                    where, phase, kind = LOSS, "loss", "value"
                self._forward_origin = {"step": step, "phase": phase, "module": where, "kind": kind}
            return
        self._backward_only.append(step)
        if self._backward_origin is None:
            if len(bad_bwd):
                i = bwd[bad_bwd[0]]
                where = LOSS if i < 0 else self._names[i]
                kind = "gradient from the loss" if i < 0 else "input gradient"
            else:
                where, kind = self._grad_owner(), "parameter gradient"
            self._backward_origin = {
                "step": step,
                "phase": "backward",
                "module": where,
                "kind": kind,
            }

    def _grad_owner(self) -> str:
        """The module of the first parameter whose gradient is non-finite now (or "?")."""
        for name, p in self._params:
            if p.grad is not None and not bool(torch.isfinite(p.grad).all()):
                return name.rpartition(".")[0] or name
        return "?"

    def section(self) -> SentinelSection | None:
        """The first inf/NaN by phase, and the steps that held any."""
        self._resolve(wait=True)
        if not self._steps:
            return None
        return {
            "steps_watched": self._steps,
            "forward_origin": self._forward_origin,
            "backward_origin": self._backward_origin,
            "nonfinite_steps": self._nonfinite[:MAX_LISTED],
            "nonfinite_step_count": len(self._nonfinite),
            "backward_only_steps": self._backward_only[:MAX_LISTED],
            "loss_nonfinite_steps": self._loss_bad[:MAX_LISTED],
            "zero_grad_steps": self._zero_grads[:MAX_LISTED],
            "errors": self._errors,
            "replay": self._replay.section(),
        }
