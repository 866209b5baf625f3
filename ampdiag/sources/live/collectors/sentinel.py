"""The divergence sentinel: on every step, where the first inf/NaN came from.

Sampled statistics can miss the step a run diverges on (a NaN at step 33 of 50 falls between
sampled steps, and the profiler's window is never sampled). The sentinel watches every step,
cheaply enough to leave on:

* forward: a pre-hook on every module reduces its first floating input to one sum
  (`finite_token`: inf/NaN propagate into it) before the module runs, and a forward hook its
  first floating output after, in execution order, with the call running when it started (its
  parent). One token per distinct tensor: a tensor already reduced (the previous module's
  output is the next one's input) is looked up by identity (a weak reference, so nothing is
  kept alive) and its version counter (changed in place since: reduced again). torch's global
  pre-hook gets no keyword arguments: a call with no floating positional input has the
  tensors it got by keyword (``attn(hidden_states=h)``; not a mask) read after the forward
  and ordered where the call began, where they provably did not change in between, and not
  counted where the call absorbed them (its output finite) (`Sentinel._keyword_input`);
* loss: every loss given to backward (or to ``GradScaler.scale``), as a 0-dim tensor;
* backward: the forward hook puts one tensor hook on each distinct floating tensor that is a
  module's input or output and requires grad, with the roles it played (input or output of
  which calls); in the backward it reduces the gradient with respect to that tensor to one
  sum, in backward order. A root module's output gradient is the one arriving from the loss;
* gradients: at the step's end, one value over all parameter gradients (`_finite.max_abs_token`):
  non-finite, or zero (all gradients zero).

The values stay on the device; at the step's end they are stacked and copied to the host in
one transfer (`_host.Deferred`, read at a later step on CUDA). The first non-finite entry in
that order is the origin (`origin.py`): the deepest module whose input was finite and whose
output is not (forward), or whose output gradient was finite and input gradient is not
(backward); a parent's own code between two children when the value was already non-finite
where a child began (or its gradient where a child's backward began); or the loss. Hooks
never change a tensor (they return None), and every hook is removed on exit.

The first non-finite step is also replayed in FP32 (and BF16), before its weights change, by
`divergence_replay.ReplayKeeper` (the section's ``replay``): whether precision caused it.
"""

from __future__ import annotations

import math
import weakref
from collections import deque
from functools import partial
from itertools import chain
from typing import Any

import torch

from ampdiag.compat.autograd import version
from ampdiag.compat.dtensor import local_tensor
from ampdiag.schema import SentinelSection
from ampdiag.sources.live import global_hooks
from ampdiag.sources.live.collectors import COLLECTORS, origin
from ampdiag.sources.live.collectors._finite import max_abs_token
from ampdiag.sources.live.collectors._host import Deferred, absorb_ready
from ampdiag.sources.live.collectors.base import Collector, RunContext, internal_work, tensors_in
from ampdiag.sources.live.collectors.divergence_replay import ReplayKeeper

#: The pseudo-module named when the loss (forward) or its backward holds the first inf/NaN.
LOSS = origin.LOSS
#: Steps listed in full in the section.
MAX_LISTED = 100
#: Finite step losses kept before the first non-finite one: the run's first, and its last.
LOSS_HEAD, LOSS_TAIL = 8, 56


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


def _first_tensor(value: Any, max_depth: int = 2) -> torch.Tensor | None:
    """The first tensor of a module's inputs or outputs (a bare tensor or ``args[0]``: fast)."""
    if isinstance(value, torch.Tensor):
        return value
    if type(value) is tuple and value and isinstance(value[0], torch.Tensor):
        return value[0]
    return next(tensors_in(value, max_depth=max_depth), None)


@COLLECTORS.register
class Sentinel(Collector):
    """First inf/NaN per step: module outputs, the loss, input gradients, parameter grads."""

    name = "sentinel"
    enabled_by = "sentinel"
    run_wide = True  # a divergence at step 5 000 comes before the window it opens

    def __init__(self) -> None:
        self._names: list[str] = []
        self._index: dict[int, int] = {}
        self._handles: list[Any] = []
        self._params: list[tuple[str, torch.nn.Parameter]] = []
        # This step's calls ([module, parent call, input token, output token, tokens before
        # it started or -1]), the role that computed each forward token, the calls running
        # now, and the tensors seen by id: [weak reference, version, token or -1, roles of its
        # gradient hook or None]. Keyword input tokens, read after their call: token ->
        # (tokens before the call started, call) -- where they belong in the order.
        self._calls: list[list[int]] = []
        self._fwd_idx: list[int] = []
        self._early: dict[int, tuple[int, int]] = {}
        self._stack: list[int] = []
        self._seen: dict[int, list[Any]] = {}
        self._fwd: list[torch.Tensor] = []
        self._bwd_idx: list[list[int]] = []
        self._bwd: list[torch.Tensor] = []
        self._loss: list[torch.Tensor] = []
        self._loss_scaled: list[bool] = []  # each loss: given to GradScaler.scale (unscaled)
        self._pending: list[
            tuple[
                int, tuple[list[list[int]], list[int]], list[list[int]], list[bool], bool, Deferred
            ]
        ] = []
        self._steps = 0
        self._forward_origin: dict[str, Any] | None = None
        self._backward_origin: dict[str, Any] | None = None
        self._nonfinite: list[int] = []
        self._backward_only: list[int] = []
        self._loss_bad: list[int] = []
        self._zero_grads: list[int] = []
        # The last step checked, and whether its loss was non-finite: a long run's listed
        # steps stop at MAX_LISTED, and a run watched past its window ends after its steps.
        self._last_step: int | None = None
        self._last_loss_bad = False
        # The finite step losses up to the first non-finite forward or loss: the first ones
        # and the last ones before it, so that the loss's trend into a divergence is known
        # where the session's steps are not those steps (a window's).
        self._loss_head: list[tuple[int, float]] = []
        self._loss_tail: deque[tuple[int, float]] = deque(maxlen=LOSS_TAIL)
        self._errors: list[str] = []
        self._replay = ReplayKeeper(finite_token)  # the first non-finite step, replayed

    # --- lifecycle --------------------------------------------------------------------------

    def on_model(self, run: RunContext, model: torch.nn.Module) -> None:
        """Hooks every module of the model, for the whole run."""
        prefix = "" if len(run.models) <= 1 else f"model{len(run.models) - 1}."
        for name, module in model.named_modules():
            if id(module) in self._index:
                continue
            idx = len(self._names)
            self._index[id(module)] = idx
            self._names.append(prefix + name if name else prefix + f"({type(module).__name__})")
            pre = partial(self._pre, idx)
            self._handles.append(global_hooks.on_module(module, global_hooks.MODULE_PRE, pre))
            hook = partial(self._forward, idx)
            self._handles.append(
                global_hooks.on_module(module, global_hooks.MODULE_POST_KWARGS, hook)
            )
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

    def _pre(self, idx: int, module: torch.nn.Module, args: Any) -> None:
        try:
            call, stack = len(self._calls), self._stack
            record = [idx, stack[-1] if stack else -1, -1, -1, len(self._fwd)]
            self._calls.append(record)
            stack.append(call)
            a = _first_tensor(args)
            if a is not None and a.is_floating_point():
                record[2] = self._token(a, call * 2 + origin.INPUT)
        except Exception as exc:  # observing must never break the user's step
            self._error(exc)

    def _entry(self, t: torch.Tensor) -> list[Any]:
        """What is known of ``t`` this step (a new entry when it is new or changed in place)."""
        entry = self._seen.get(id(t))
        v = version(t)
        if entry is None or entry[0]() is not t or entry[1] != v:
            entry = self._seen[id(t)] = [weakref.ref(t), v, -1, None]
        return entry

    def _token(self, t: torch.Tensor, role: int) -> int:
        """The position of ``t``'s finiteness token, reduced now unless it already was."""
        entry = self._entry(t)
        if entry[2] < 0:
            with internal_work():
                token = finite_token(t.detach())
            entry[2] = len(self._fwd)
            self._fwd.append(token)
            self._fwd_idx.append(role)
        return int(entry[2])

    def _role(self, t: torch.Tensor, role: int) -> None:
        """Adds a role to ``t``'s gradient hook (registered with its first role)."""
        entry = self._entry(t)
        roles: list[int] | None = entry[3]
        if roles is None:
            roles = entry[3] = []
            t.register_hook(partial(self._grad, roles))  # type: ignore[no-untyped-call]
        roles.append(role)

    def _close(self, idx: int) -> int:
        """The call of module ``idx`` that ends now (popped from the running calls)."""
        stack = self._stack
        for i in range(len(stack) - 1, -1, -1):
            if self._calls[stack[i]][0] == idx:
                call = stack[i]
                del stack[i:]
                return call
        # no pre-hook seen (hooked while it ran): a call with no input token
        self._calls.append([idx, stack[-1] if stack else -1, -1, -1, -1])
        return len(self._calls) - 1

    def _forward(
        self, idx: int, module: torch.nn.Module, args: Any, kwargs: Any, output: Any
    ) -> None:
        try:
            self._watch_forward(idx, module, args, kwargs, output)
        except Exception as exc:  # observing must never break the user's step
            self._error(exc)

    def _error(self, exc: Exception) -> None:
        if len(self._errors) < 10:
            self._errors.append(repr(exc))

    def _watch_forward(
        self, idx: int, module: torch.nn.Module, args: Any, kwargs: Any, output: Any
    ) -> None:
        call = self._close(idx)
        if kwargs and self._calls[call][2] < 0:
            self._keyword_input(call, kwargs)
        t = _first_tensor(output, 4)
        floating = t is not None and t.is_floating_point()
        if t is not None and floating:
            self._calls[call][3] = self._token(t, call * 2 + origin.OUTPUT)
        if not torch.is_grad_enabled():
            return
        inputs = tensors_in(args, max_depth=2)
        if kwargs:  # by keyword: a module's own input too (its backward's input gradient)
            inputs = chain(inputs, tensors_in(kwargs, max_depth=1))
        for a in inputs:
            # Not leaves: a parameter or input kept across steps would collect a hook per step.
            if a.requires_grad and a.grad_fn is not None and a.is_floating_point():
                self._role(a, call * 2 + origin.INPUT)
        if t is not None and floating and t.requires_grad and t.grad_fn is not None:
            self._role(t, call * 2 + origin.OUTPUT)

    def _keyword_input(self, call: int, kwargs: dict[str, Any]) -> None:
        """The input tokens of a call whose floating input came by keyword (none positional).

        torch's global pre-hook gets no keyword arguments, so each floating tensor given by
        keyword is read after the forward, from the same objects, and its token is ordered
        where the call began (`_in_start_order`): a keyword's position says nothing of its
        role, so every one counts. That is its value at the start only where it provably did
        not change in the forward: it was reduced before the call began and its version is
        the same now, or its version is 0 (never changed in place); otherwise it stays unread,
        as before. An argument named like a mask is skipped: an additive mask holds -inf by
        design (and a non-finite keyword input the call absorbed is not one, `_absorbed`).
        """
        record = self._calls[call]
        start = record[4]
        if start < 0:
            return
        for key, t in kwargs.items():
            if not isinstance(t, torch.Tensor) or not t.is_floating_point() or "mask" in key:
                continue
            entry = self._seen.get(id(t))
            v = version(t)
            known = entry is not None and entry[0]() is t and entry[1] == v and entry[2] >= 0
            if known and self._key(entry[2]) < (start, 0, call):  # type: ignore[index]
                record[2] = int(entry[2])  # type: ignore[index]
                continue
            if v != 0:
                continue
            if known:
                token = self._fwd[entry[2]]  # type: ignore[index]
            else:
                with internal_work():
                    token = finite_token(t.detach())
                entry = self._entry(t)
                entry[2] = len(self._fwd)
            record[2] = len(self._fwd)
            self._early[len(self._fwd)] = (start, call)
            self._fwd.append(token)
            self._fwd_idx.append(call * 2 + origin.INPUT)

    def _key(self, token: int) -> tuple[int, int, int]:
        """Where a forward token belongs in the step's order.

        A keyword input at its call's start: before anything the call computed, outer calls
        first.
        """
        early = self._early.get(token)
        return (early[0], 0, early[1]) if early else (token, 1, 0)

    def _absorbed(self) -> None:
        """A keyword input's token, finite where its call's output is (on the device).

        A non-finite value a module was given and absorbed (its output finite: a -inf bias
        added before a softmax) is the module's design, not a divergence; positional inputs
        are read as before.
        """
        with internal_work():
            for token, (_, call) in self._early.items():
                out = self._calls[call][3]
                if out >= 0:
                    t = self._fwd[token]
                    self._fwd[token] = torch.where(
                        torch.isfinite(self._fwd[out]), torch.zeros_like(t), t
                    )

    def _in_start_order(self) -> None:
        """Reorders the step's forward tokens so that keyword inputs come where read."""
        self._absorbed()
        order = sorted(range(len(self._fwd)), key=self._key)
        self._fwd = [self._fwd[i] for i in order]
        self._fwd_idx = [self._fwd_idx[i] for i in order]
        self._early = {}

    def _grad(self, roles: list[int], grad: torch.Tensor) -> None:
        if grad is None:
            return
        try:
            with internal_work():
                token = finite_token(grad.detach())
        except Exception as exc:  # observing must never break the user's backward
            self._error(exc)
            return
        self._bwd.append(token)
        self._bwd_idx.append(roles)

    def on_loss(self, run: RunContext, loss: torch.Tensor, from_scaler: bool) -> None:
        """Keeps the loss (one value) for the step's check."""
        self._seen = {}  # the forward is over: what it saw is not looked up again
        if loss.is_floating_point():
            self._loss.append(loss.detach().reshape(()).float())
            self._loss_scaled.append(from_scaler)
        self._replay.on_loss(loss)

    def before_optimizer_step(self, run: RunContext, optimizer: torch.optim.Optimizer) -> None:
        """Replays the step in FP32 when it is the first non-finite one (weights unchanged)."""
        self._replay.before_optimizer_step(run)

    # --- steps ------------------------------------------------------------------------------

    def on_step_end(self, run: RunContext, step: int) -> None:
        """Stacks the step's values with the gradients' max |g| and sends them to the host."""
        self._replay.on_step_end(run, step)
        if self._early:
            self._in_start_order()
        with internal_work():
            # DTensor gradients (FSDP2): this rank's shard is what this rank can see
            grads = [local_tensor(p.grad) for _, p in self._params if p.grad is not None]
            parts = [*self._fwd, *self._loss, *self._bwd]
            if grads:
                parts.append(max_abs_token(grads))
            if parts:
                device = parts[0].device
                if any(p.device != device for p in parts):
                    parts = [p.to(device) for p in parts]
                deferred = Deferred(torch.stack(parts), copy=False)
                fwd = (self._calls, self._fwd_idx)
                self._pending.append(
                    (step, fwd, self._bwd_idx, self._loss_scaled, bool(grads), deferred)
                )
        self._steps += 1
        self._fwd, self._fwd_idx, self._bwd, self._bwd_idx, self._loss = [], [], [], [], []
        self._loss_scaled = []
        self._calls, self._stack, self._seen = [], [], {}
        if self._pending:
            self._resolve(wait=False)

    def _resolve(self, wait: bool) -> None:
        self._pending = absorb_ready(self._pending, self._absorb, wait)

    def _absorb(
        self,
        step: int,
        fwd: tuple[list[list[int]], list[int]],
        bwd: list[list[int]],
        scaled: list[bool],
        grads: bool,
        d: Deferred,
    ) -> None:
        import numpy as np

        values = d.arrays()[0].astype(np.float64)
        finite = np.isfinite(values)
        calls, owners = fwd
        k, n = len(owners), len(owners) + len(scaled)
        if scaled and self._forward_origin is None:
            self._keep_loss(step, values[k:n].tolist(), scaled)
        bad_fwd = np.flatnonzero(~finite[:k])
        bad_loss = not finite[k:n].all()
        bad_bwd = np.flatnonzero(~finite[n : n + len(bwd)])
        bad_grads = grads and not finite[-1]
        if grads and finite[-1] and values[-1] == 0:
            self._zero_grads.append(step)
        if bad_loss:
            self._loss_bad.append(step)
        self._last_step, self._last_loss_bad = step, bool(bad_loss)
        if not (len(bad_fwd) or bad_loss or len(bad_bwd) or bad_grads):
            return
        self._nonfinite.append(step)
        if len(bad_fwd) or bad_loss:
            if self._forward_origin is None:
                found = None
                if len(bad_fwd):
                    found = origin.forward(calls, owners, finite[:k].tolist(), self._names)
                if found is None:
                    found = {"phase": "loss", "module": LOSS, "kind": "value", "parent_code": False}
                self._forward_origin = {"step": step, **found}
            return
        self._backward_only.append(step)
        if self._backward_origin is None:
            found = None
            if len(bad_bwd):
                found = origin.backward(calls, bwd, finite[n : n + len(bwd)].tolist(), self._names)
            if found is None:
                found = {
                    "phase": "backward",
                    "module": self._grad_owner(),
                    "kind": "parameter gradient",
                    "parent_code": False,
                }
            self._backward_origin = {"step": step, **found}

    def _keep_loss(self, step: int, values: list[float], scaled: list[bool]) -> None:
        """Keeps the step's loss (as `steps.StepLog` sums it) when it is finite."""
        unscaled = [v for v, s in zip(values, scaled, strict=True) if s]
        loss = sum(unscaled) if unscaled else sum(values)
        if not math.isfinite(loss):
            return
        if len(self._loss_head) < LOSS_HEAD:
            self._loss_head.append((step, loss))
        else:
            self._loss_tail.append((step, loss))

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
            "last_step": self._last_step,
            "last_loss_nonfinite": self._last_loss_bad,
            "loss_history": [[s, v] for s, v in [*self._loss_head, *self._loss_tail]],
            "errors": self._errors,
            "replay": self._replay.section(),
        }
